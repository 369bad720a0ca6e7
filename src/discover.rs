//! [`register_available`]: registers every allocator this machine can offer.

use crate::device::DeviceType;
use crate::host::HostAllocator;
use crate::registration::{Registration, RegistrationOutcome};
use crate::registry::DeviceAllocatorRegistry;

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
        .map(|a| Box::leak(Box::new(a)) as &'static dyn crate::allocator::DeviceAllocator);
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
