//! [`register_available`]: registers every allocator this machine can offer.
#![deny(unsafe_code)]

use crate::allocator::DeviceAllocator;
use crate::device::DeviceIndex;
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
    report
}

/// A short human description of device `index` of `allocator` (adapter name and backend).
pub fn describe_device(allocator: &dyn DeviceAllocator, index: DeviceIndex) -> String {
    match allocator.device_type() {
        crate::DeviceType::Cpu => {
            format!("host memory ({} cores)", std::thread::available_parallelism().map_or(1, |n| n.get()))
        }
        t => format!("{t} device {index}"),
    }
}
