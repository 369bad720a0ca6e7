//! # devalloc's C ABI
//!
//! `devalloc.h` (generated from this crate by cbindgen, in `capi/include/`) gives C and C++
//! programs devalloc's allocators by device type and index: open them, allocate and free,
//! copy host to device, device to host and device to device, read stats, set a memory limit,
//! write a snapshot. `devalloc_executorch.hpp` beside it puts them behind ExecuTorch's
//! `DeviceAllocator`. `scripts/build-c` builds the static and shared library and
//! `target/c/devalloc.pc` for pkg-config.
//!
//! Every function returns a [`DevallocStatus`] (`DEVALLOC_STATUS_OK` is 0) and, on failure,
//! leaves a message that `devalloc_last_error()` returns on the same thread. Device addresses
//! cross as `uint64_t` (devalloc's `DevicePtr`); host and wgpu addresses are devalloc's own
//! virtual addresses, reached through the copies, CUDA's are the driver's. Null, foreign,
//! interior (for a free) and freed addresses, bad device types and indices, and double frees
//! are errors that change nothing; no panic crosses the boundary (`devalloc_selftest_panic`
//! shows it).
//!
//! ```c
//! #include <devalloc.h>
//! uint64_t p;
//! if (devalloc_open(DEVALLOC_DEVICE_TYPE_CPU) != DEVALLOC_STATUS_OK ||
//!     devalloc_allocate(DEVALLOC_DEVICE_TYPE_CPU, 0, 1024, 256, &p) != DEVALLOC_STATUS_OK)
//!   fprintf(stderr, "devalloc: %s\n", devalloc_last_error());
//! ```
//!
//! The layout follows cudarc's split: [`status`] turns results and panics into statuses,
//! [`raw`] is how enum arguments cross (as checked integers), `open` holds the allocators (the
//! C ABI's own, which `devalloc_shutdown` closes), and `ffi` and `ffi_controls` are the
//! boundary itself, one thin function per C call.
#![deny(unsafe_code)]

mod ffi;
mod ffi_controls;
mod logger;
mod open;
pub mod raw;
pub mod status;

pub use ffi::*;
pub use ffi_controls::*;
pub use logger::DevallocLogLevel;
pub use open::DevallocDeviceType;
pub use status::DevallocStatus;

/// devalloc's version, as `devalloc_version()` returns it.
const VERSION: &std::ffi::CStr = c"0.1.0";

/// What an allocator holds on one device (devalloc's `AllocatorStats`), in bytes and counts.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevallocStats {
    /// Bytes of live allocations, as requested.
    pub allocated_bytes: u64,
    /// Highest `allocated_bytes` seen.
    pub peak_allocated_bytes: u64,
    /// Bytes held from the device: live allocations after rounding, plus the cache.
    pub reserved_bytes: u64,
    /// Highest `reserved_bytes` seen.
    pub peak_reserved_bytes: u64,
    /// Bytes in freed blocks kept for reuse (part of `reserved_bytes`).
    pub cached_bytes: u64,
    /// Number of live allocations.
    pub live_allocations: u64,
    /// Successful allocations so far.
    pub allocations: u64,
    /// Successful deallocations so far.
    pub deallocations: u64,
    /// Allocations served from the cache.
    pub cache_hits: u64,
    /// Allocations that had to ask the device.
    pub cache_misses: u64,
    /// Bytes of staging buffers held for copies right now (not part of `reserved_bytes`).
    pub staging_bytes: u64,
}

impl From<devalloc::AllocatorStats> for DevallocStats {
    fn from(s: devalloc::AllocatorStats) -> Self {
        DevallocStats {
            allocated_bytes: s.allocated_bytes,
            peak_allocated_bytes: s.peak_allocated_bytes,
            reserved_bytes: s.reserved_bytes,
            peak_reserved_bytes: s.peak_reserved_bytes,
            cached_bytes: s.cached_bytes,
            live_allocations: s.live_allocations,
            allocations: s.allocations,
            deallocations: s.deallocations,
            cache_hits: s.cache_hits,
            cache_misses: s.cache_misses,
            staging_bytes: s.staging_bytes,
        }
    }
}

/// The status a C caller passed back as a number, if it is one.
fn status_from(raw: i32) -> Option<DevallocStatus> {
    use DevallocStatus::*;
    [
        Ok,
        InvalidArgument,
        OutOfMemory,
        TooLarge,
        NotFound,
        NoSuchDevice,
        InvalidPointer,
        OutOfBounds,
        NotSupported,
        DeviceLost,
        Backend,
        Io,
        Internal,
    ]
    .into_iter()
    .find(|s| *s as i32 == raw)
}
