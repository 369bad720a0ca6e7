//! The allocators behind the C ABI: devalloc's process-wide registry, filled on demand (one
//! allocator per device type, opened once and kept for the life of the process), and the
//! controls that need an allocator's concrete type (the memory limit).

use devalloc::{DeviceAllocator, DeviceAllocatorRegistry, DeviceType, Error, HostAllocator};

use crate::status::{DevallocStatus, Failure, Outcome};

/// A device type as C names it (the values are devalloc's `DeviceType` discriminants; CPU and
/// CUDA are ExecuTorch's `etensor::DeviceType` values too).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevallocDeviceType {
    /// Host memory (`HostAllocator`; its addresses are devalloc's, reached through copies).
    Cpu = 0,
    /// CUDA device memory (`CudaAllocator`, feature `cuda`).
    Cuda = 1,
    /// Vulkan through wgpu (feature `wgpu`).
    Vulkan = 2,
    /// Metal through wgpu (Apple platforms).
    Metal = 3,
    /// Direct3D 12 through wgpu (Windows).
    Dx12 = 4,
    /// OpenGL / GLES through wgpu.
    Gl = 5,
    /// The browser's WebGPU (never available from C).
    Webgpu = 6,
}

/// The devalloc device type a C caller named, or an invalid argument.
pub fn device_type(raw: i32) -> Outcome<DeviceType> {
    usize::try_from(raw).ok().and_then(|i| DeviceType::ALL.get(i).copied()).ok_or_else(|| {
        Failure::invalid(format!(
            "unknown device type {raw}: expected 0 (cpu) to {} ({})",
            DeviceType::ALL.len() - 1,
            DeviceType::ALL[DeviceType::ALL.len() - 1]
        ))
    })
}

fn registry() -> &'static DeviceAllocatorRegistry {
    DeviceAllocatorRegistry::instance()
}

/// The allocator open for `device_type`, or [`DevallocStatus::NotFound`] saying to open it.
pub fn allocator(device_type: DeviceType) -> Outcome<&'static dyn DeviceAllocator> {
    registry().get_allocator(device_type).ok_or_else(|| {
        Failure::new(
            DevallocStatus::NotFound,
            format!("no {device_type} allocator is open: call devalloc_open({}) first", device_type as u8),
        )
    })
}

/// Opens the allocator of `device_type` unless one is open already (by this library or by
/// Rust code in the same process through the same registry), and returns it.
pub fn open(device_type: DeviceType) -> Outcome<&'static dyn DeviceAllocator> {
    let made = registry().get_or_register(device_type, || make(device_type))?;
    Ok(made)
}

/// Opens every allocator this machine offers (`devalloc::register_available`); returns a bit
/// mask of the device types open afterwards (bit `t` for device type `t`).
pub fn open_available() -> u32 {
    for r in devalloc::register_available(registry()) {
        log::info!("devalloc: {r}");
    }
    registry().allocators().fold(0, |mask, a| mask | 1 << (a.device_type() as u32))
}

fn make(device_type: DeviceType) -> devalloc::Result<&'static dyn DeviceAllocator> {
    match device_type {
        DeviceType::Cpu => Ok(Box::leak(Box::new(HostAllocator::new()))),
        DeviceType::Cuda => make_cuda(),
        other => make_wgpu(other),
    }
}

#[cfg(feature = "cuda")]
fn make_cuda() -> devalloc::Result<&'static dyn DeviceAllocator> {
    Ok(Box::leak(Box::new(devalloc::cuda::CudaAllocator::new()?)))
}

#[cfg(not(feature = "cuda"))]
fn make_cuda() -> devalloc::Result<&'static dyn DeviceAllocator> {
    Err(Error::not_found("cuda: this library was built without its `cuda` feature"))
}

#[cfg(feature = "wgpu")]
fn make_wgpu(device_type: DeviceType) -> devalloc::Result<&'static dyn DeviceAllocator> {
    use devalloc::wgpu::api::Backend;
    let backend = match device_type {
        DeviceType::Vulkan => Backend::Vulkan,
        DeviceType::Metal => Backend::Metal,
        DeviceType::Dx12 => Backend::Dx12,
        DeviceType::Gl => Backend::Gl,
        other => return Err(not_native(other)),
    };
    Ok(Box::leak(Box::new(devalloc::wgpu::WgpuAllocator::new(backend)?)))
}

#[cfg(not(feature = "wgpu"))]
fn make_wgpu(device_type: DeviceType) -> devalloc::Result<&'static dyn DeviceAllocator> {
    match device_type {
        DeviceType::WebGpu => Err(not_native(device_type)),
        other => Err(Error::not_found(format!("{other}: this library was built without its `wgpu` feature"))),
    }
}

fn not_native(device_type: DeviceType) -> Error {
    Error::NotSupported {
        operation: "devalloc_open",
        device_type,
        reason: "it exists only in the browser".into(),
    }
}

/// Sets (`Some`) or lifts (`None`) the memory limit of `device_type:index`.
pub fn set_memory_limit(device_type: DeviceType, index: u32, limit: Option<u64>) -> Outcome {
    let alloc = allocator(device_type)?;
    let any = alloc.as_any();
    let set = any
        .and_then(|a| a.downcast_ref::<HostAllocator>().map(|h| h.set_memory_limit(limit, index)))
        .or_else(|| any.and_then(|a| limit_cuda(a, limit, index)))
        .or_else(|| any.and_then(|a| limit_wgpu(a, limit, index)));
    match set {
        Some(result) => Ok(result?),
        None => Err(Failure::new(
            DevallocStatus::NotSupported,
            format!("the {device_type} allocator is not one of devalloc's: it has no memory limit to set"),
        )),
    }
}

#[cfg(feature = "cuda")]
fn limit_cuda(any: &dyn std::any::Any, limit: Option<u64>, index: u32) -> Option<devalloc::Result<()>> {
    any.downcast_ref::<devalloc::cuda::CudaAllocator>().map(|c| c.set_memory_limit(limit, index))
}

#[cfg(not(feature = "cuda"))]
fn limit_cuda(_: &dyn std::any::Any, _: Option<u64>, _: u32) -> Option<devalloc::Result<()>> {
    None
}

#[cfg(feature = "wgpu")]
fn limit_wgpu(any: &dyn std::any::Any, limit: Option<u64>, index: u32) -> Option<devalloc::Result<()>> {
    any.downcast_ref::<devalloc::wgpu::WgpuAllocator>().map(|w| w.set_memory_limit(limit, index))
}

#[cfg(not(feature = "wgpu"))]
fn limit_wgpu(_: &dyn std::any::Any, _: Option<u64>, _: u32) -> Option<devalloc::Result<()>> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_device_types_are_devallocs() {
        let c = [
            DevallocDeviceType::Cpu,
            DevallocDeviceType::Cuda,
            DevallocDeviceType::Vulkan,
            DevallocDeviceType::Metal,
            DevallocDeviceType::Dx12,
            DevallocDeviceType::Gl,
            DevallocDeviceType::Webgpu,
        ];
        assert_eq!(c.len(), DeviceType::ALL.len());
        for (c, rust) in c.iter().zip(DeviceType::ALL) {
            assert_eq!(*c as i32, *rust as i32);
            assert_eq!(device_type(*c as i32).unwrap(), *rust);
        }
        for junk in [-1, 7, i32::MAX, i32::MIN] {
            assert!(device_type(junk).is_err(), "{junk}");
        }
    }
}
