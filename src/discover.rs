//! [`register_available`]: registers every allocator this machine can offer.

use std::fmt;

use crate::device::DeviceType;
use crate::error::Error;
use crate::host::HostAllocator;
use crate::registry::DeviceAllocatorRegistry;

/// What [`register_available`] did for one allocator.
#[derive(Debug)]
pub struct Registration {
    /// The device type (for wgpu, that of the backend tried).
    pub device_type: DeviceType,
    /// What happened.
    pub outcome: RegistrationOutcome,
}

/// The outcome of one [`Registration`].
#[derive(Debug)]
#[non_exhaustive]
pub enum RegistrationOutcome {
    /// Registered, with these devices (their names).
    Registered {
        /// One name per device index.
        devices: Vec<String>,
    },
    /// The registry already had an allocator of this type; it was left as it was.
    AlreadyRegistered,
    /// The allocator could not be made here (no driver, no adapter), and why.
    Unavailable(Error),
    /// devalloc was built without the feature this allocator needs.
    NotBuilt {
        /// The cargo feature to enable.
        feature: &'static str,
    },
}

impl Registration {
    /// Whether an allocator was registered.
    pub fn is_registered(&self) -> bool {
        matches!(self.outcome, RegistrationOutcome::Registered { .. })
    }

    pub(crate) fn made(
        registry: &DeviceAllocatorRegistry,
        device_type: DeviceType,
        made: crate::Result<&'static dyn crate::DeviceAllocator>,
    ) -> Self {
        let outcome = match made {
            Ok(a) => {
                let devices = (0..a.device_count() as crate::DeviceIndex).map(|i| a.device_name(i)).collect();
                match registry.register_allocator(a) {
                    Ok(()) => RegistrationOutcome::Registered { devices },
                    Err(Error::AlreadyRegistered { .. }) => RegistrationOutcome::AlreadyRegistered,
                    Err(e) => RegistrationOutcome::Unavailable(e),
                }
            }
            Err(e) => RegistrationOutcome::Unavailable(e),
        };
        Registration { device_type, outcome }
    }
}

impl fmt::Display for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.device_type;
        match &self.outcome {
            RegistrationOutcome::Registered { devices } => write!(f, "{t}: {}", devices.join(", ")),
            RegistrationOutcome::AlreadyRegistered => write!(f, "{t}: already registered"),
            RegistrationOutcome::Unavailable(e) => write!(f, "{t}: not available: {e}"),
            RegistrationOutcome::NotBuilt { feature } => {
                write!(f, "{t}: not built (enable the `{feature}` feature)")
            }
        }
    }
}

/// Registers into `registry` every allocator this machine offers (host memory always; the
/// enabled GPU backends that find a device), and says for each what happened. Types that
/// already have an allocator are left as they are.
pub fn register_available(registry: &DeviceAllocatorRegistry) -> Vec<Registration> {
    let mut report = Vec::new();
    let making = registry.making();
    if registry.get_allocator(DeviceType::Cpu).is_some() {
        report.push(Registration {
            device_type: DeviceType::Cpu,
            outcome: RegistrationOutcome::AlreadyRegistered,
        });
    } else {
        let host: &'static HostAllocator = Box::leak(Box::new(HostAllocator::new()));
        report.push(Registration::made(registry, DeviceType::Cpu, Ok(host)));
    }
    drop(making);
    report.extend(wgpu_backends(registry));
    report.push(cuda(registry));
    report
}

#[cfg(all(feature = "cuda", native))]
fn cuda(registry: &DeviceAllocatorRegistry) -> Registration {
    let _making = registry.making();
    if registry.get_allocator(DeviceType::Cuda).is_some() {
        return Registration {
            device_type: DeviceType::Cuda,
            outcome: RegistrationOutcome::AlreadyRegistered,
        };
    }
    let made = crate::cuda::CudaAllocator::new()
        .map(|a| Box::leak(Box::new(a)) as &'static dyn crate::DeviceAllocator);
    Registration::made(registry, DeviceType::Cuda, made)
}

#[cfg(not(all(feature = "cuda", native)))]
fn cuda(_registry: &DeviceAllocatorRegistry) -> Registration {
    Registration { device_type: DeviceType::Cuda, outcome: RegistrationOutcome::NotBuilt { feature: "cuda" } }
}

#[cfg(all(feature = "wgpu", native))]
fn wgpu_backends(registry: &DeviceAllocatorRegistry) -> Vec<Registration> {
    crate::wgpu::register_backends(registry, &crate::wgpu::WgpuOptions::default())
}

#[cfg(not(all(feature = "wgpu", native)))]
fn wgpu_backends(_registry: &DeviceAllocatorRegistry) -> Vec<Registration> {
    Vec::new()
}
