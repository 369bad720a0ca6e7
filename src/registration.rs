//! [`Registration`]: what opening one allocator into a registry did. Below the backends, which
//! report their own (`wgpu::register_backends`), and discovery, which reports every one.

use std::fmt;

use crate::allocator::DeviceAllocator;
use crate::device::{DeviceIndex, DeviceType};
use crate::error::{Error, Result};
use crate::registry::DeviceAllocatorRegistry;

/// What [`crate::register_available`] did for one allocator.
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
    /// Not tried, and why: a fallback whose first choice opened (WebGL2 once WebGPU did).
    NotTried {
        /// Why it was not tried.
        because: String,
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
        made: Result<&'static dyn DeviceAllocator>,
    ) -> Self {
        let outcome = match made {
            Ok(a) => {
                let devices = (0..a.device_count() as DeviceIndex).map(|i| a.device_name(i)).collect();
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
            RegistrationOutcome::NotTried { because } => write!(f, "{t}: not tried: {because}"),
        }
    }
}
