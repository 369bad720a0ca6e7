//! How CUDA driver errors become devalloc [`Error`]s, and the probes that run before any
//! cudarc call (cudarc's loader panics when `libcuda` is missing).
#![allow(unsafe_code)] // at the edge: every unsafe block has a SAFETY note

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::DriverError;

use crate::device::Device;
use crate::error::Error;

/// Whether the CUDA driver library can be loaded here; never panics.
pub fn driver_present() -> bool {
    // SAFETY: `is_culib_present` only tries to dlopen the driver's library names and closes
    // what it opened; it touches no CUDA state.
    unsafe { sys::is_culib_present() }
}

/// The `libcuda` this process loaded, as the dynamic loader mapped it (Linux; `None` elsewhere
/// or before it is loaded). A toolkit's stub library on the library path is the usual
/// surprise: its path says so.
pub fn loaded_library() -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("libcuda.so"))
        .map(String::from)
}

/// The driver's message for `e`, or its code where there is no driver to ask (cudarc's
/// `Display` and `Debug` call the driver, whose loader panics when it is missing).
pub(crate) fn describe(e: &DriverError) -> String {
    if driver_present() {
        e.to_string()
    } else {
        format!("{:?}", e.0)
    }
}

/// The numeric code of a driver error (codes are matched by number, so that one table reads
/// whatever bindings cudarc was built with).
pub(crate) fn code(e: &DriverError) -> i64 {
    e.0 as i64
}

/// Codes at start-up that mean "there is no usable CUDA driver here": a toolkit's stub
/// library (34), no CUDA device (100), a driver older than the library (803), a
/// forward-compatibility package on a GPU that does not support it (804), an unknown failure
/// to initialise (999).
pub(crate) fn means_no_driver(e: &DriverError) -> bool {
    matches!(code(e), 34 | 803 | 804 | 999 | 100)
}

/// Code 46: the device is busy or in exclusive-process mode (another process has it).
pub(crate) fn means_device_unavailable(e: &DriverError) -> bool {
    code(e) == 46
}

/// Sticky errors: the context is unusable from here on; the device is lost to this process.
fn sticky(e: &DriverError) -> bool {
    // 700 illegal address, 702 launch timeout, 709 context destroyed, 710 assert, 714
    // hardware stack, 715 illegal instruction, 716 misaligned address, 717 invalid address
    // space, 718 invalid pc, 719 launch failed, 214 ECC uncorrectable, 220 NVLink
    // uncorrectable, 226 contained (Hopper's error containment).
    matches!(code(e), 700 | 702 | 709 | 710 | 714 | 715 | 716 | 717 | 718 | 719 | 214 | 220 | 226)
}

/// Maps a driver error to devalloc's enum, keeping the driver's message.
pub(crate) fn driver_error(device: Device, what: &str, e: DriverError, requested: u64) -> Error {
    let msg = format!("{what}: {}", describe(&e));
    if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return Error::OutOfMemory { requested, device, detail: msg };
    }
    if sticky(&e) {
        return Error::DeviceLost { device, reason: msg };
    }
    Error::Backend {
        device,
        message: msg,
        // The driver's error is kept as the source only where it can describe itself.
        source: driver_present().then(|| Box::new(e) as crate::error::BackendSource),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceType;

    #[test]
    fn driver_errors_map_to_the_enum() {
        let d = Device::new(DeviceType::Cuda, 0);
        let oom = driver_error(d, "alloc", DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY), 64);
        assert!(matches!(oom, Error::OutOfMemory { requested: 64, .. }));
        for sticky in [
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
            CUresult::CUDA_ERROR_LAUNCH_TIMEOUT,
            CUresult::CUDA_ERROR_ASSERT,
            CUresult::CUDA_ERROR_INVALID_ADDRESS_SPACE,
            CUresult::CUDA_ERROR_INVALID_PC,
            CUresult::CUDA_ERROR_NVLINK_UNCORRECTABLE,
            CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED,
        ] {
            let lost = driver_error(d, "copy", DriverError(sticky), 0);
            assert!(matches!(lost, Error::DeviceLost { .. }), "{sticky:?}");
        }
        let other = driver_error(d, "copy", DriverError(CUresult::CUDA_ERROR_INVALID_VALUE), 0);
        let Error::Backend { message, source, .. } = &other else { panic!("not a backend error") };
        assert_eq!(source.is_some(), driver_present());
        assert!(message.starts_with("copy: "), "{message}");
        if !driver_present() {
            assert!(message.contains("CUDA_ERROR_INVALID_VALUE"), "{message}");
        }
        for none in [
            CUresult::CUDA_ERROR_STUB_LIBRARY,
            CUresult::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
            CUresult::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
            CUresult::CUDA_ERROR_UNKNOWN,
        ] {
            assert!(means_no_driver(&DriverError(none)), "{none:?}");
        }
    }
}
