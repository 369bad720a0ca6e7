//! The boundary, part two: what an allocator holds and its controls (stats, memory limit,
//! cache, history, snapshots), the last error, the log, and the self-tests.
#![allow(unsafe_code)] // the C boundary: every unsafe block has a SAFETY note

use std::ffi::c_char;
use std::time::Instant;

use crate::ffi::{put, put_if, targets, text};
use crate::open::{self, allocator};
use crate::raw::{RawDeviceType, RawLogLevel, RawStatus};
use crate::status::{self, guard, DevallocStatus, Failure};
use crate::DevallocStats;

/// The memory limit that lifts the limit (`devalloc_set_memory_limit`).
pub const DEVALLOC_NO_LIMIT: u64 = u64::MAX;

/// Writes what the allocator holds on `device_type:index` to `*out`.
///
/// # Safety
/// `out` is valid for a write of a `DevallocStats`.
#[no_mangle]
pub unsafe extern "C" fn devalloc_stats(
    device_type: RawDeviceType,
    index: u32,
    out: *mut DevallocStats,
) -> DevallocStatus {
    guard("devalloc_stats", || {
        let stats = allocator(open::device_type(device_type)?)?.stats(index)?;
        // SAFETY: the caller's promise.
        unsafe { put(out, DevallocStats::from(stats), "out") }
    })
}

/// Sets the memory limit of `device_type:index` in bytes (`DEVALLOC_NO_LIMIT` lifts it): past
/// it an allocation is `OUT_OF_MEMORY` (after the cache is given back). Held memory stays.
#[no_mangle]
pub extern "C" fn devalloc_set_memory_limit(
    device_type: RawDeviceType,
    index: u32,
    limit: u64,
) -> DevallocStatus {
    guard("devalloc_set_memory_limit", || {
        let limit = (limit != DEVALLOC_NO_LIMIT).then_some(limit);
        open::set_memory_limit(open::device_type(device_type)?, index, limit)
    })
}

/// Gives every cached (freed, kept for reuse) block of `device_type` (or of every open type,
/// with `DEVALLOC_DEVICE_TYPE_ALL`) back to the device; writes the bytes given back to
/// `*out_bytes` unless it is null.
///
/// # Safety
/// `out_bytes` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn devalloc_empty_cache(
    device_type: RawDeviceType,
    out_bytes: *mut u64,
) -> DevallocStatus {
    guard("devalloc_empty_cache", || {
        let mut freed = 0;
        for a in targets(device_type)? {
            freed += a.empty_cache();
        }
        // SAFETY: the caller's promise.
        unsafe { put_if(out_bytes, freed) };
        Ok(())
    })
}

/// Records the newest `events` allocation events of `device_type` (or of every open type,
/// with `DEVALLOC_DEVICE_TYPE_ALL`) for snapshots; 0 stops. Off until called.
#[no_mangle]
pub extern "C" fn devalloc_record_history(device_type: RawDeviceType, events: usize) -> DevallocStatus {
    guard("devalloc_record_history", || {
        for a in targets(device_type)? {
            a.record_history(events)?;
        }
        Ok(())
    })
}

/// Writes a snapshot (devalloc's JSON: live allocations, cache, stats, recorded history) of
/// `device_type` (or of every open type, with `DEVALLOC_DEVICE_TYPE_ALL`) to the file at
/// `path` (UTF-8), replacing it. The page's memory viewer and `examples/replay` read it.
///
/// # Safety
/// `path` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn devalloc_snapshot_to_file(
    device_type: RawDeviceType,
    path: *const c_char,
) -> DevallocStatus {
    guard("devalloc_snapshot_to_file", || {
        // SAFETY: the caller's promise.
        let path = unsafe { text(path, "path") }?;
        let mut devices = Vec::new();
        for a in targets(device_type)? {
            devices.extend(a.snapshot()?.devices);
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
pub extern "C" fn devalloc_status_name(status: RawStatus) -> *const c_char {
    crate::status_from(status.0).map_or(c"UNKNOWN", DevallocStatus::name).as_ptr()
}

/// Sends devalloc's log (`DevallocLogLevel`: 0 off, 1 errors ... 5 trace) to stderr; call again
/// to change the level. `NOT_SUPPORTED` when the process has another Rust logger already.
#[no_mangle]
pub extern "C" fn devalloc_log_to_stderr(level: RawLogLevel) -> DevallocStatus {
    guard("devalloc_log_to_stderr", || crate::logger::to_stderr(level))
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
    guard("devalloc_selftest_panic", || panic!("a panic on purpose, behind the C boundary"))
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
    device_type: RawDeviceType,
    index: u32,
    nbytes: usize,
    alignment: usize,
    iterations: u64,
    out_ns: *mut u64,
) -> DevallocStatus {
    guard("devalloc_selftest_cycle", || {
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
