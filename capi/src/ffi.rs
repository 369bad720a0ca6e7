//! The boundary: every `extern "C"` function of `devalloc.h`, and nothing else. Each one
//! checks its arguments, calls the Rust API, and turns the result into a status inside
//! [`guard`] (which also catches panics); the work lives in `open` and in devalloc itself.
#![allow(unsafe_code)] // the C boundary: every unsafe block has a SAFETY note

use std::ffi::{c_char, c_void, CStr};
use std::time::Instant;

use devalloc::{Device, DevicePtr, DeviceType};

use crate::open::{self, allocator, device_type};
use crate::status::{self, guard, DevallocStatus, Failure, Outcome};
use crate::DevallocStats;

/// Every device type at once, where a call takes one (`devalloc_snapshot_to_file`,
/// `devalloc_record_history`, `devalloc_empty_cache`).
pub const DEVALLOC_ALL_DEVICE_TYPES: i32 = -1;

/// The memory limit that lifts the limit (`devalloc_set_memory_limit`).
pub const DEVALLOC_NO_LIMIT: u64 = u64::MAX;

/// Writes `value` through `out`, which must be non-null.
///
/// # Safety
/// `out` is null or valid for a write of a `T`.
unsafe fn put<T>(out: *mut T, value: T, name: &str) -> Outcome {
    if out.is_null() {
        return Err(Failure::invalid(format!("{name} is null")));
    }
    // SAFETY: non-null, and the caller promises it is valid for writes.
    unsafe { out.write(value) };
    Ok(())
}

/// Writes `value` through `out` unless it is null (an optional out-parameter).
///
/// # Safety
/// `out` is null or valid for a write of a `T`.
unsafe fn put_if<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: non-null, and the caller promises it is valid for writes.
        unsafe { out.write(value) };
    }
}

/// `nbytes` as a Rust slice length: at most `isize::MAX`, and a non-null pointer unless 0.
fn host_len(ptr: *const c_void, nbytes: usize, name: &str) -> Outcome<usize> {
    if nbytes > isize::MAX as usize {
        return Err(Failure::invalid(format!("{nbytes} bytes is more than any host buffer can hold")));
    }
    if ptr.is_null() && nbytes > 0 {
        return Err(Failure::invalid(format!("{name} is null")));
    }
    Ok(nbytes)
}

/// A C string argument as UTF-8.
///
/// # Safety
/// `text` is null or a NUL-terminated string.
unsafe fn text<'a>(text: *const c_char, name: &str) -> Outcome<&'a str> {
    if text.is_null() {
        return Err(Failure::invalid(format!("{name} is null")));
    }
    // SAFETY: non-null, and the caller promises a NUL-terminated string.
    let text = unsafe { CStr::from_ptr(text) };
    text.to_str().map_err(|_| Failure::invalid(format!("{name} is not UTF-8")))
}

/// Every device type, or the one `raw` names.
fn types(raw: i32) -> Outcome<Vec<DeviceType>> {
    if raw == DEVALLOC_ALL_DEVICE_TYPES {
        let open = DeviceType::ALL.iter().copied();
        return Ok(open.filter(|&t| allocator(t).is_ok()).collect());
    }
    Ok(vec![device_type(raw)?])
}

/// Opens devalloc's allocator for `device_type` (a `DevallocDeviceType`) unless it is open
/// already. CPU always opens; CUDA needs a driver and a device (`NOT_FOUND` says which is
/// missing); Vulkan, GL, Metal and DX12 need an adapter of that API. Thread-safe; opening an
/// open type is `OK`. Allocators stay open until the process ends.
#[no_mangle]
pub extern "C" fn devalloc_open(device_type: i32) -> DevallocStatus {
    guard(|| open::open(open::device_type(device_type)?).map(drop))
}

/// Opens every allocator this machine offers (CPU, CUDA, each wgpu API with an adapter) and
/// writes to `*out_mask` (which may be null) the device types now open, bit `t` for type `t`.
///
/// # Safety
/// `out_mask` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn devalloc_open_available(out_mask: *mut u32) -> DevallocStatus {
    guard(|| {
        let mask = open::open_available();
        // SAFETY: the caller's promise.
        unsafe { put_if(out_mask, mask) };
        Ok(())
    })
}

/// Writes to `*out_count` how many devices of `device_type` the open allocator serves (indices
/// `0 .. count-1`). `NOT_FOUND` when none is open.
///
/// # Safety
/// `out_count` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn devalloc_device_count(device_type: i32, out_count: *mut u32) -> DevallocStatus {
    guard(|| {
        let alloc = allocator(open::device_type(device_type)?)?;
        let count = u32::try_from(alloc.device_count()).unwrap_or(u32::MAX);
        // SAFETY: the caller's promise.
        unsafe { put(out_count, count, "out_count") }
    })
}

/// Allocates `nbytes` (> 0) on `device_type:index`, aligned to `alignment` (a power of two),
/// and writes the device address to `*out_ptr` (left as it was on failure). Fresh memory is
/// zeroed; memory reused from the cache holds old bytes.
///
/// # Safety
/// `out_ptr` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn devalloc_allocate(
    device_type: i32,
    nbytes: usize,
    index: u32,
    alignment: usize,
    out_ptr: *mut u64,
) -> DevallocStatus {
    guard(|| {
        if out_ptr.is_null() {
            return Err(Failure::invalid("out_ptr is null"));
        }
        let ptr = allocator(open::device_type(device_type)?)?.allocate(nbytes, index, alignment)?;
        // SAFETY: the caller's promise.
        unsafe { put(out_ptr, ptr.addr(), "out_ptr") }
    })
}

/// `devalloc_allocate` with a label (UTF-8) that snapshots, histories and out-of-memory
/// messages name the allocation by.
///
/// # Safety
/// `label` is a NUL-terminated string; `out_ptr` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn devalloc_allocate_labeled(
    device_type: i32,
    nbytes: usize,
    index: u32,
    alignment: usize,
    label: *const c_char,
    out_ptr: *mut u64,
) -> DevallocStatus {
    guard(|| {
        // SAFETY: the caller's promise.
        let label = unsafe { text(label, "label") }?;
        if out_ptr.is_null() {
            return Err(Failure::invalid("out_ptr is null"));
        }
        let alloc = allocator(open::device_type(device_type)?)?;
        let ptr = alloc.allocate_labeled(nbytes, index, alignment, label)?;
        // SAFETY: the caller's promise.
        unsafe { put(out_ptr, ptr.addr(), "out_ptr") }
    })
}

/// Frees the allocation that starts at `ptr` on `device_type:index`. Null, foreign, interior
/// and already freed addresses are `INVALID_POINTER` and change nothing.
#[no_mangle]
pub extern "C" fn devalloc_deallocate(device_type: i32, ptr: u64, index: u32) -> DevallocStatus {
    guard(|| Ok(allocator(open::device_type(device_type)?)?.deallocate(DevicePtr::new(ptr), index)?))
}

/// Copies `nbytes` from host memory at `src` to device memory at `dst` (any address inside a
/// live allocation, as long as the range stays inside it). 0 bytes: `OK`, nothing read.
///
/// # Safety
/// `src` is valid for reads of `nbytes` bytes (or `nbytes` is 0).
#[no_mangle]
pub unsafe extern "C" fn devalloc_copy_host_to_device(
    device_type: i32,
    dst: u64,
    src: *const c_void,
    nbytes: usize,
    index: u32,
) -> DevallocStatus {
    guard(|| {
        let alloc = allocator(open::device_type(device_type)?)?;
        let len = host_len(src, nbytes, "src")?;
        let src: &[u8] = match len {
            0 => &[],
            // SAFETY: non-null (host_len), at most isize::MAX bytes, readable by the caller's promise.
            _ => unsafe { std::slice::from_raw_parts(src.cast::<u8>(), len) },
        };
        Ok(alloc.copy_host_to_device(DevicePtr::new(dst), src, index)?)
    })
}

/// Copies `nbytes` from device memory at `src` (inside one live allocation) to host memory at
/// `dst`. 0 bytes: `OK`, nothing written.
///
/// # Safety
/// `dst` is valid for writes of `nbytes` bytes (or `nbytes` is 0) and not read or written by
/// anything else during the call.
#[no_mangle]
pub unsafe extern "C" fn devalloc_copy_device_to_host(
    device_type: i32,
    dst: *mut c_void,
    src: u64,
    nbytes: usize,
    index: u32,
) -> DevallocStatus {
    guard(|| {
        let alloc = allocator(open::device_type(device_type)?)?;
        let len = host_len(dst, nbytes, "dst")?;
        let dst: &mut [u8] = match len {
            0 => &mut [],
            // SAFETY: non-null (host_len), at most isize::MAX bytes, writable and unaliased by
            // the caller's promise.
            _ => unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), len) },
        };
        Ok(alloc.copy_device_to_host(dst, DevicePtr::new(src), index)?)
    })
}

/// Copies `nbytes` from `src` on `src_type:src_index` to `dst` on `dst_type:dst_index`: one
/// allocator's own device-to-device copy when both types are the same, else through a host
/// bounce buffer. Both ranges are checked before a byte moves.
#[no_mangle]
pub extern "C" fn devalloc_copy_device_to_device(
    dst_type: i32,
    dst: u64,
    dst_index: u32,
    src_type: i32,
    src: u64,
    src_index: u32,
    nbytes: usize,
) -> DevallocStatus {
    guard(|| {
        let to = Device::new(open::device_type(dst_type)?, dst_index);
        let from = Device::new(open::device_type(src_type)?, src_index);
        let registry = devalloc::DeviceAllocatorRegistry::instance();
        Ok(registry.copy(to, DevicePtr::new(dst), from, DevicePtr::new(src), nbytes)?)
    })
}

/// Writes what the allocator holds on `device_type:index` to `*out`.
///
/// # Safety
/// `out` is valid for a write of a `DevallocStats`.
#[no_mangle]
pub unsafe extern "C" fn devalloc_stats(
    device_type: i32,
    index: u32,
    out: *mut DevallocStats,
) -> DevallocStatus {
    guard(|| {
        let stats = allocator(open::device_type(device_type)?)?.stats(index)?;
        // SAFETY: the caller's promise.
        unsafe { put(out, DevallocStats::from(stats), "out") }
    })
}

/// Sets the memory limit of `device_type:index` in bytes (`DEVALLOC_NO_LIMIT` lifts it): past
/// it an allocation is `OUT_OF_MEMORY` (after the cache is given back). Held memory stays.
#[no_mangle]
pub extern "C" fn devalloc_set_memory_limit(device_type: i32, index: u32, limit: u64) -> DevallocStatus {
    guard(|| {
        let limit = (limit != DEVALLOC_NO_LIMIT).then_some(limit);
        open::set_memory_limit(open::device_type(device_type)?, index, limit)
    })
}

/// Gives every cached (freed, kept for reuse) block of `device_type` (or of every open type,
/// with `DEVALLOC_ALL_DEVICE_TYPES`) back to the device; writes the bytes given back to
/// `*out_bytes` unless it is null.
///
/// # Safety
/// `out_bytes` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn devalloc_empty_cache(device_type: i32, out_bytes: *mut u64) -> DevallocStatus {
    guard(|| {
        let mut freed = 0;
        for t in types(device_type)? {
            freed += allocator(t)?.empty_cache();
        }
        // SAFETY: the caller's promise.
        unsafe { put_if(out_bytes, freed) };
        Ok(())
    })
}

/// Records the newest `events` allocation events of `device_type` (or of every open type,
/// with `DEVALLOC_ALL_DEVICE_TYPES`) for snapshots; 0 stops. Off until called.
#[no_mangle]
pub extern "C" fn devalloc_record_history(device_type: i32, events: usize) -> DevallocStatus {
    guard(|| {
        for t in types(device_type)? {
            allocator(t)?.record_history(events)?;
        }
        Ok(())
    })
}

/// Writes a snapshot (devalloc's JSON: live allocations, cache, stats, recorded history) of
/// `device_type` (or of every open type, with `DEVALLOC_ALL_DEVICE_TYPES`) to the file at
/// `path` (UTF-8), replacing it. The page's memory viewer and `examples/replay` read it.
///
/// # Safety
/// `path` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn devalloc_snapshot_to_file(device_type: i32, path: *const c_char) -> DevallocStatus {
    guard(|| {
        // SAFETY: the caller's promise.
        let path = unsafe { text(path, "path") }?;
        let mut devices = Vec::new();
        for t in types(device_type)? {
            devices.extend(allocator(t)?.snapshot()?.devices);
        }
        let snapshot = devalloc::snapshot::Snapshot::new(devices);
        snapshot.write(path).map_err(|e| Failure::new(DevallocStatus::Io, format!("writing {path}: {e}")))
    })
}

/// The message of this thread's last failed call (`""` before any failure): NUL-terminated,
/// owned by devalloc, and the pointer stays valid for the life of the thread (a later failure
/// on the thread rewrites the text in place; messages past 4 KiB are cut). Never null.
#[no_mangle]
pub extern "C" fn devalloc_last_error() -> *const c_char {
    status::last_error()
}

/// The name of a status (`"OUT_OF_MEMORY"`), or `"UNKNOWN"`: a static string, never null.
#[no_mangle]
pub extern "C" fn devalloc_status_name(status: i32) -> *const c_char {
    crate::status_from(status).map_or(c"UNKNOWN", DevallocStatus::name).as_ptr()
}

/// Sends devalloc's log (`DevallocLogLevel`: 0 off, 1 errors ... 5 trace) to stderr; call again
/// to change the level. `NOT_SUPPORTED` when the process has another Rust logger already.
#[no_mangle]
pub extern "C" fn devalloc_log_to_stderr(level: i32) -> DevallocStatus {
    guard(|| crate::logger::to_stderr(level))
}

/// devalloc's version (`"0.1.0"`): a static string.
#[no_mangle]
pub extern "C" fn devalloc_version() -> *const c_char {
    crate::VERSION.as_ptr()
}

/// A self-test of the boundary: panics inside devalloc on purpose and returns what a caller
/// then sees, `INTERNAL` with the panic's message as the last error. Anything else (an abort)
/// means this build lets panics through: it must not be used.
#[no_mangle]
pub extern "C" fn devalloc_selftest_panic() -> DevallocStatus {
    guard(|| panic!("devalloc_selftest_panic: a panic on purpose, behind the C boundary"))
}

/// A measurement of the boundary's cost: `iterations` cycles of allocate + free of `nbytes` on
/// `device_type:index`, timed inside Rust (the allocator called directly, as a Rust runtime
/// would); writes the total nanoseconds to `*out_ns`. Time the same cycle through this ABI and
/// compare.
///
/// # Safety
/// `out_ns` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn devalloc_selftest_cycle(
    device_type: i32,
    index: u32,
    nbytes: usize,
    alignment: usize,
    iterations: u64,
    out_ns: *mut u64,
) -> DevallocStatus {
    guard(|| {
        if out_ns.is_null() {
            return Err(Failure::invalid("out_ns is null"));
        }
        let alloc = allocator(open::device_type(device_type)?)?;
        let start = Instant::now();
        for _ in 0..iterations {
            let ptr = alloc.allocate(nbytes, index, alignment)?;
            alloc.deallocate(ptr, index)?;
        }
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        // SAFETY: the caller's promise.
        unsafe { put(out_ns, ns, "out_ns") }
    })
}
