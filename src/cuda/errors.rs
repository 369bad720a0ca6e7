//! How CUDA driver errors become devalloc [`Error`]s, and the probe that runs before any
//! cudarc call (cudarc's loader panics when `libcuda` is missing).
#![allow(unsafe_code)] // at the edge: every unsafe block has a SAFETY note

use std::sync::OnceLock;

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::DriverError;

use crate::device::Device;
use crate::error::Error;

/// Whether the CUDA driver library can be loaded here; never panics. Probed once per process
/// (a `dlopen` of every candidate name is not free, and `describe` asks on every error).
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries to dlopen the driver's library names and closes
    // what it opened; it touches no CUDA state.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// The `libcuda` this process loaded, as the dynamic loader mapped it (Linux; `None` elsewhere
/// or before it is loaded). A toolkit's stub library on the library path is the usual
/// surprise (it fails with code 34): its path says so.
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

/// Codes at start-up (`cuInit`, `cuDeviceGetCount`) that mean "there is no usable CUDA driver
/// here": a toolkit's stub library (34), no CUDA device (100), a driver older than the library
/// (803), a forward-compatibility package on a GPU that does not support it (804), an unknown
/// failure to initialise (999). Only at start-up: later, 999 is an error like any other.
pub(crate) fn means_no_driver(e: &DriverError) -> bool {
    matches!(code(e), 34 | 100 | 803 | 804 | 999)
}

/// Code 46: the device is busy or in exclusive-process mode (another process has it). The one
/// failure to open a device that makes its index unavailable for good; any other is returned
/// as what it is and the next call tries again.
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

/// Maps a driver error to devalloc's enum, keeping the driver's message. Out of memory is the
/// device's ([`Error::OutOfMemory`], which makes the pool empty its cache and retry): use it
/// for device allocations only, and [`copy_error`] elsewhere.
pub(crate) fn driver_error(device: Device, what: &str, e: DriverError, requested: u64) -> Error {
    let msg = format!("{what}: {}", describe(&e));
    if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return Error::OutOfMemory { requested, device, detail: msg };
    }
    if sticky(&e) {
        return Error::DeviceLost { device, reason: msg };
    }
    backend(device, msg, e)
}

/// A driver error of a copy or a host-side call: out of memory here is not the device's (no
/// device memory is being allocated; the driver or devalloc ran short of host or staging
/// memory), so it is a backend error that says so, never [`Error::OutOfMemory`] (emptying the
/// device cache would not help). Used for host-side failures too (pinned staging).
pub(crate) fn copy_error(device: Device, what: &str, e: DriverError) -> Error {
    if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        let msg = format!("{what}: {} (host or staging memory ran short, not device memory)", describe(&e));
        return backend(device, msg, e);
    }
    driver_error(device, what, e, 0)
}

fn backend(device: Device, message: String, e: DriverError) -> Error {
    Error::Backend {
        device,
        message,
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
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,       // 700
            CUresult::CUDA_ERROR_LAUNCH_TIMEOUT,        // 702
            CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED,  // 709
            CUresult::CUDA_ERROR_ASSERT,                // 710
            CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR,  // 714
            CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION,   // 715
            CUresult::CUDA_ERROR_MISALIGNED_ADDRESS,    // 716
            CUresult::CUDA_ERROR_INVALID_ADDRESS_SPACE, // 717
            CUresult::CUDA_ERROR_INVALID_PC,            // 718
            CUresult::CUDA_ERROR_LAUNCH_FAILED,         // 719
            CUresult::CUDA_ERROR_ECC_UNCORRECTABLE,     // 214
            CUresult::CUDA_ERROR_NVLINK_UNCORRECTABLE,  // 220
            CUresult::CUDA_ERROR_CONTAINED,             // 226
        ] {
            let lost = driver_error(d, "copy", DriverError(sticky), 0);
            assert!(matches!(lost, Error::DeviceLost { .. }), "{sticky:?}");
            assert!(!means_device_unavailable(&DriverError(sticky)), "{sticky:?}");
            assert!(!means_no_driver(&DriverError(sticky)), "{sticky:?}");
        }
        let other = driver_error(d, "copy", DriverError(CUresult::CUDA_ERROR_INVALID_VALUE), 0);
        let Error::Backend { message, source, .. } = &other else { panic!("not a backend error") };
        assert_eq!(source.is_some(), driver_present());
        assert!(message.starts_with("copy: "), "{message}");
        if !driver_present() {
            assert!(message.contains("CUDA_ERROR_INVALID_VALUE"), "{message}");
        }
        // Not sticky: a busy device, a missing one, the driver's unknown error, a peer limit.
        for not_lost in [
            CUresult::CUDA_ERROR_DEVICE_UNAVAILABLE, // 46
            CUresult::CUDA_ERROR_NO_DEVICE,          // 100
            CUresult::CUDA_ERROR_UNKNOWN,            // 999
            CUresult::CUDA_ERROR_TOO_MANY_PEERS,     // 711
        ] {
            let e = driver_error(d, "open", DriverError(not_lost), 0);
            assert!(matches!(e, Error::Backend { .. }), "{not_lost:?}: {e}");
        }
    }

    #[test]
    fn start_up_codes_say_no_driver_and_only_46_says_unavailable() {
        for none in [
            CUresult::CUDA_ERROR_STUB_LIBRARY,                   // 34
            CUresult::CUDA_ERROR_NO_DEVICE,                      // 100
            CUresult::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,         // 803
            CUresult::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, // 804
            CUresult::CUDA_ERROR_UNKNOWN,                        // 999
        ] {
            assert!(means_no_driver(&DriverError(none)), "{none:?}");
            assert!(!means_device_unavailable(&DriverError(none)), "{none:?}");
        }
        let busy = DriverError(CUresult::CUDA_ERROR_DEVICE_UNAVAILABLE);
        assert_eq!(code(&busy), 46);
        assert!(means_device_unavailable(&busy));
        assert!(!means_no_driver(&busy), "46 is one device, not the driver");
        for other in [
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            CUresult::CUDA_ERROR_INVALID_DEVICE,
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
        ] {
            assert!(!means_device_unavailable(&DriverError(other)), "{other:?}");
            assert!(!means_no_driver(&DriverError(other)), "{other:?}");
        }
    }

    #[test]
    fn out_of_memory_in_a_copy_or_on_the_host_is_not_the_devices() {
        let d = Device::new(DeviceType::Cuda, 1);
        let oom = DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        for e in
            [copy_error(d, "copying to the device", oom), copy_error(d, "allocating pinned staging", oom)]
        {
            let Error::Backend { message, .. } = &e else { panic!("{e}: not a backend error") };
            assert!(message.contains("not device memory"), "{message}");
        }
        // Other codes map as everywhere else.
        let lost = copy_error(d, "copy", DriverError(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS));
        assert!(matches!(lost, Error::DeviceLost { .. }), "{lost}");
    }

    #[test]
    fn the_driver_probe_is_asked_once() {
        // Cached: the same answer, and the second call costs no dlopen (well under the ~50 us a
        // dlopen of every candidate name takes).
        let first = driver_present();
        let t = std::time::Instant::now();
        for _ in 0..1000 {
            assert_eq!(driver_present(), first);
        }
        assert!(t.elapsed() < std::time::Duration::from_millis(20), "{:?} for 1000 probes", t.elapsed());
    }
}
