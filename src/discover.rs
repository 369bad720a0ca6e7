//! [`register_available`]: registers every allocator this machine can offer.

use crate::device::DeviceType;
use crate::host::HostAllocator;
use crate::registration::{Registration, RegistrationOutcome};
use crate::registry::DeviceAllocatorRegistry;

/// Registers into `registry` every allocator this machine offers (host memory always; the
/// enabled GPU backends that find a device), and says for each what happened. Types that
/// already have an allocator are left as they are.
pub fn register_available(registry: &DeviceAllocatorRegistry) -> Vec<Registration> {
    let mut report = host_only(registry);
    report.extend(wgpu_backends(registry));
    report.push(cuda(registry));
    report
}

/// [`register_available`] for the browser (and everywhere async): host memory, then the
/// browser's WebGPU, falling back to WebGL2 where WebGPU has no adapter and devalloc was built
/// with `webgl` (see `devalloc::wgpu::register_browser_backends`); natively it is
/// [`register_available`]. Says for each what happened.
pub async fn register_available_async(registry: &DeviceAllocatorRegistry) -> Vec<Registration> {
    #[cfg(all(feature = "wgpu", web))]
    {
        let mut report = host_only(registry);
        let options = crate::wgpu::WgpuOptions::default();
        report.extend(crate::wgpu::register_browser_backends(registry, &options).await);
        report
    }
    #[cfg(not(all(feature = "wgpu", web)))]
    {
        register_available(registry)
    }
}

/// Registers host memory (once).
fn host_only(registry: &DeviceAllocatorRegistry) -> Vec<Registration> {
    let _making = registry.making();
    if registry.get_allocator(DeviceType::Cpu).is_some() {
        return vec![Registration {
            device_type: DeviceType::Cpu,
            outcome: RegistrationOutcome::AlreadyRegistered,
        }];
    }
    let host: &'static HostAllocator = Box::leak(Box::new(HostAllocator::new()));
    vec![Registration::made(registry, DeviceType::Cpu, Ok(host))]
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
