//! [`register_available`]: registers every allocator this machine can offer.
#![deny(unsafe_code)]

use crate::allocator::DeviceAllocator;
use crate::host::HostAllocator;
use crate::registry::DeviceAllocatorRegistry;

/// Registers into `registry` every allocator this machine offers (host memory always; the
/// enabled GPU backends that find a device), and returns one line per attempt saying what was
/// registered or why not. Types that already have an allocator are left as they are.
pub fn register_available(registry: &DeviceAllocatorRegistry) -> Vec<String> {
    let mut report = Vec::new();
    let mut offer = |name: &str, made: crate::Result<&'static dyn DeviceAllocator>| match made {
        Ok(a) => match registry.register_allocator(a) {
            Ok(()) => report.push(format!("{}: {name}, {} device(s)", a.device_type(), a.device_count())),
            Err(e) => report.push(format!("{}: {name} not registered: {e}", a.device_type())),
        },
        Err(e) => report.push(format!("{name}: not available: {e}")),
    };
    if registry.get_allocator(crate::DeviceType::Cpu).is_none() {
        offer("host memory", Ok(Box::leak(Box::new(HostAllocator::new()))));
    }
    report.extend(wgpu_backends(registry));
    report.extend(cuda(registry));
    report
}

#[cfg(feature = "cuda")]
fn cuda(registry: &DeviceAllocatorRegistry) -> Vec<String> {
    if registry.get_allocator(crate::DeviceType::Cuda).is_some() {
        return vec!["cuda: already registered".into()];
    }
    let line = match crate::cuda::CudaAllocator::new() {
        Ok(a) => {
            let names: Vec<String> =
                (0..a.device_count() as crate::DeviceIndex).map(|i| a.device_name(i)).collect();
            match registry.register_allocator(Box::leak(Box::new(a))) {
                Ok(()) => format!("cuda: {}", names.join(", ")),
                Err(e) => format!("cuda: {e}"),
            }
        }
        Err(e) => format!("cuda: not available: {e}"),
    };
    vec![line]
}

#[cfg(not(feature = "cuda"))]
fn cuda(_registry: &DeviceAllocatorRegistry) -> Vec<String> {
    vec!["cuda: not built (enable the `cuda` feature)".into()]
}

#[cfg(all(feature = "wgpu", native))]
fn wgpu_backends(registry: &DeviceAllocatorRegistry) -> Vec<String> {
    crate::wgpu::register_wgpu_backends(registry, &crate::wgpu::WgpuOptions::default())
}

#[cfg(not(all(feature = "wgpu", native)))]
fn wgpu_backends(_registry: &DeviceAllocatorRegistry) -> Vec<String> {
    Vec::new()
}
