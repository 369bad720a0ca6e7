//! The allocators behind the C ABI: one per device type, opened on demand and owned here
//! until `devalloc_shutdown` drops them (which frees what they still hold, reporting each
//! allocation left as a leak). Every call clones the allocator's `Arc` for its own duration, so
//! a shutdown on one thread never pulls an allocator from under a call on another: that call
//! finishes on it, and the last one out drops it. They are devalloc's allocators but not in its
//! process-wide registry (whose allocators live for the process, and so could never close).

use std::sync::{Arc, Mutex, RwLock};

use devalloc::{DeviceAllocator, DeviceType, Error, HostAllocator};

use crate::raw::RawDeviceType;
use crate::status::{DevallocStatus, Failure, Outcome};

/// A device type as C names it (the values are devalloc's `DeviceType` discriminants; CPU and
/// CUDA are ExecuTorch's `etensor::DeviceType` values too).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevallocDeviceType {
    /// Every open device type at once, where a call says it takes it (`devalloc_empty_cache`,
    /// `devalloc_record_history`, `devalloc_snapshot_to_file`); elsewhere an invalid argument.
    All = -1,
    /// Host memory (`HostAllocator`; its addresses are devalloc's, reached through copies or
    /// `devalloc_host_pointer`).
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
pub fn device_type(raw: RawDeviceType) -> Outcome<DeviceType> {
    let raw = raw.0;
    usize::try_from(raw).ok().and_then(|i| DeviceType::ALL.get(i).copied()).ok_or_else(|| {
        let all = if raw == DevallocDeviceType::All as i32 {
            " (DEVALLOC_DEVICE_TYPE_ALL is not one here)"
        } else {
            ""
        };
        Failure::invalid(format!(
            "unknown device type {raw}{all}: expected 0 (cpu) to {} ({})",
            DeviceType::ALL.len() - 1,
            DeviceType::ALL[DeviceType::ALL.len() - 1]
        ))
    })
}

/// An open allocator, shared by the calls using it.
pub type Open = Arc<dyn DeviceAllocator>;

/// One slot per device type.
static OPEN: RwLock<[Option<Open>; DeviceType::ALL.len()]> =
    RwLock::new([const { None }; DeviceType::ALL.len()]);
/// Serialises opening and closing: no two threads make an allocator of one type, and a
/// shutdown never runs beside an open.
static MAKING: Mutex<()> = Mutex::new(());

fn slots() -> std::sync::RwLockReadGuard<'static, [Option<Open>; DeviceType::ALL.len()]> {
    OPEN.read().unwrap_or_else(|e| e.into_inner())
}

/// The allocator open for `device_type`, or [`DevallocStatus::NotFound`] saying to open it.
pub fn allocator(device_type: DeviceType) -> Outcome<Open> {
    slots()[device_type as usize].clone().ok_or_else(|| {
        Failure::new(
            DevallocStatus::NotFound,
            format!(
                "no {device_type} allocator is open: call devalloc_open(DEVALLOC_DEVICE_TYPE_{}) first",
                device_type.name().to_uppercase()
            ),
        )
    })
}

/// Every open allocator with its type, in type order.
pub fn all_open() -> Vec<(DeviceType, Open)> {
    let slots = slots();
    DeviceType::ALL.iter().filter_map(|&t| slots[t as usize].clone().map(|a| (t, a))).collect()
}

/// Opens the allocator of `device_type` unless it is open already, and returns it.
pub fn open(device_type: DeviceType) -> Outcome<Open> {
    if let Ok(open) = allocator(device_type) {
        return Ok(open);
    }
    let _making = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    if let Ok(open) = allocator(device_type) {
        return Ok(open);
    }
    // Made outside the slots' lock: opening a GPU takes a while, and calls on other types go on.
    let made: Open = make(device_type)?;
    OPEN.write().unwrap_or_else(|e| e.into_inner())[device_type as usize] = Some(Arc::clone(&made));
    log::info!("devalloc: opened {device_type}: {}", made.device_name(0));
    Ok(made)
}

/// Opens every allocator this machine offers (CPU, each wgpu API with an adapter, CUDA with a
/// driver and a device); returns a bit mask of the device types open afterwards (bit `t` for
/// device type `t`).
pub fn open_available() -> u32 {
    let native = DeviceType::ALL.iter().copied().filter(|&t| t != DeviceType::WebGpu);
    for t in native {
        if let Err(e) = open(t) {
            log::info!("devalloc: {t} not opened: {}", e.message());
        }
    }
    all_open().iter().fold(0, |mask, (t, _)| mask | 1 << (*t as u32))
}

/// Closes every open allocator: each is dropped once the last call using it returns, which
/// frees what it still holds (logging each live allocation as a leak, at WARN) and releases
/// its devices. Returns how many were open.
pub fn shutdown() -> usize {
    let _making = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    let closing: Vec<Open> =
        OPEN.write().unwrap_or_else(|e| e.into_inner()).iter_mut().filter_map(Option::take).collect();
    let n = closing.len();
    drop(closing); // outside the slots' lock: a leak report or a device's release takes a while
    n
}

fn make(device_type: DeviceType) -> devalloc::Result<Open> {
    match device_type {
        DeviceType::Cpu => Ok(Arc::new(HostAllocator::new())),
        DeviceType::Cuda => make_cuda(),
        other => make_wgpu(other),
    }
}

#[cfg(feature = "cuda")]
fn make_cuda() -> devalloc::Result<Open> {
    Ok(Arc::new(devalloc::cuda::CudaAllocator::new()?))
}

#[cfg(not(feature = "cuda"))]
fn make_cuda() -> devalloc::Result<Open> {
    Err(Error::not_found("cuda: this library was built without its `cuda` feature"))
}

#[cfg(feature = "wgpu")]
fn make_wgpu(device_type: DeviceType) -> devalloc::Result<Open> {
    use devalloc::wgpu::api::Backend;
    let backend = match device_type {
        DeviceType::Vulkan => Backend::Vulkan,
        DeviceType::Metal => Backend::Metal,
        DeviceType::Dx12 => Backend::Dx12,
        DeviceType::Gl => Backend::Gl,
        other => return Err(not_native(other)),
    };
    Ok(Arc::new(devalloc::wgpu::WgpuAllocator::new(backend)?))
}

#[cfg(not(feature = "wgpu"))]
fn make_wgpu(device_type: DeviceType) -> devalloc::Result<Open> {
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
            assert_eq!(device_type((*c).into()).unwrap(), *rust);
        }
        for junk in [DevallocDeviceType::All as i32, -2, 7, i32::MAX, i32::MIN] {
            assert!(device_type(RawDeviceType(junk)).is_err(), "{junk}");
        }
    }
}
