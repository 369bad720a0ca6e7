//! The boundary, part one: opening and closing, allocation and the copies. Each `extern "C"`
//! function checks its arguments, calls the Rust API, and turns the result into a status inside
//! [`guard`] (which also catches panics and names the call in the message); the work lives in
//! `open` and in devalloc itself. Every call takes its arguments in the header's one order:
//! the device (type, then index), the destination, the source, the size, options, then
//! out-parameters.
#![allow(unsafe_code)] // the C boundary: every unsafe block has a SAFETY note

use std::ffi::{c_char, c_void, CStr};

use devalloc::{Device, DevicePtr, HostAllocator};

use crate::open::{self, allocator, device_type, Open};
use crate::raw::RawDeviceType;
use crate::status::{guard, DevallocStatus, Failure, Outcome};

/// Writes `value` through `out`, which must be non-null.
///
/// # Safety
/// `out` is null or valid for a write of a `T`.
pub(crate) unsafe fn put<T>(out: *mut T, value: T, name: &str) -> Outcome {
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
pub(crate) unsafe fn put_if<T>(out: *mut T, value: T) {
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
pub(crate) unsafe fn text<'a>(text: *const c_char, name: &str) -> Outcome<&'a str> {
    if text.is_null() {
        return Err(Failure::invalid(format!("{name} is null")));
    }
    // SAFETY: non-null, and the caller promises a NUL-terminated string.
    let text = unsafe { CStr::from_ptr(text) };
    text.to_str().map_err(|_| Failure::invalid(format!("{name} is not UTF-8")))
}

/// The device's allocator, and `index` as one of its devices.
fn device(raw: RawDeviceType, index: u32) -> Outcome<(Open, Device)> {
    let t = device_type(raw)?;
    Ok((allocator(t)?, Device::new(t, index)))
}

/// `failure` about `ptr` on `device`, which did not know it: when another open allocator has
/// a live allocation there, the message says which, and what to pass instead.
fn whose(failure: Failure, ptr: u64, device: Device) -> Failure {
    if failure.status() != DevallocStatus::InvalidPointer || ptr == 0 {
        return failure;
    }
    for (t, other) in open::all_open().into_iter().filter(|(t, _)| *t != device.device_type) {
        let indices = 0..u32::try_from(other.device_count()).unwrap_or(u32::MAX);
        if let Some(i) = indices.into_iter().find(|&i| other.check_range(DevicePtr::new(ptr), 1, i).is_ok()) {
            return failure.and(&format!(
                " ({ptr:#x} is inside a live allocation of {t}:{i}: pass DEVALLOC_DEVICE_TYPE_{} and index {i})",
                t.name().to_uppercase()
            ));
        }
    }
    failure
}

/// Runs `body` on an address of `device`, adding [`whose`] to an invalid-pointer failure.
fn on(ptr: u64, device: Device, body: impl FnOnce() -> devalloc::Result<()>) -> Outcome {
    body().map_err(|e| whose(e.into(), ptr, device))
}

/// Opens devalloc's allocator for `device_type` unless it is open already. CPU always opens;
/// CUDA needs a driver and a device (`NOT_FOUND` says which is missing); Vulkan, GL, Metal and
/// DX12 need an adapter of that API. Opening an open type is `OK`. It stays open until
/// `devalloc_shutdown`.
#[no_mangle]
pub extern "C" fn devalloc_open(device_type: RawDeviceType) -> DevallocStatus {
    guard("devalloc_open", || open::open(open::device_type(device_type)?).map(drop))
}

/// Opens every allocator this machine offers (CPU, CUDA, each wgpu API with an adapter) and
/// writes to `*out_mask` (which may be null) the device types now open, bit `t` for type `t`.
///
/// # Safety
/// `out_mask` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn devalloc_open_available(out_mask: *mut u32) -> DevallocStatus {
    guard("devalloc_open_available", || {
        let mask = open::open_available();
        // SAFETY: the caller's promise.
        unsafe { put_if(out_mask, mask) };
        Ok(())
    })
}

/// Closes devalloc: frees every allocation still live (each is logged as a leak, at WARN, as
/// devalloc does when a Rust program drops an allocator that still holds memory), then releases
/// every open allocator and its devices. Every address from before is invalid afterwards, as
/// after a free: an allocator opened again most likely refuses one as foreign, but may hand the
/// same address out again, and then a stale one reaches the new allocation. Later calls on a
/// device type are `NOT_FOUND` until `devalloc_open` opens it again (which works). A call running on another thread meanwhile finishes on the allocator it began
/// with, which is released when it returns. Calling it with nothing open is `OK`.
#[no_mangle]
pub extern "C" fn devalloc_shutdown() -> DevallocStatus {
    guard("devalloc_shutdown", || {
        let closed = open::shutdown();
        log::info!("devalloc: shut down, {closed} allocator(s) closed");
        Ok(())
    })
}

/// Writes to `*out_count` how many devices of `device_type` the open allocator serves (indices
/// `0 .. count-1`). `NOT_FOUND` when none is open.
///
/// # Safety
/// `out_count` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn devalloc_device_count(
    device_type: RawDeviceType,
    out_count: *mut u32,
) -> DevallocStatus {
    guard("devalloc_device_count", || {
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
    device_type: RawDeviceType,
    index: u32,
    nbytes: usize,
    alignment: usize,
    out_ptr: *mut u64,
) -> DevallocStatus {
    guard("devalloc_allocate", || {
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
    device_type: RawDeviceType,
    index: u32,
    nbytes: usize,
    alignment: usize,
    label: *const c_char,
    out_ptr: *mut u64,
) -> DevallocStatus {
    guard("devalloc_allocate_labeled", || {
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
pub extern "C" fn devalloc_deallocate(device_type: RawDeviceType, index: u32, ptr: u64) -> DevallocStatus {
    guard("devalloc_deallocate", || {
        let (alloc, at) = device(device_type, index)?;
        on(ptr, at, || alloc.deallocate(DevicePtr::new(ptr), index))
    })
}

/// Copies `nbytes` from host memory at `src` to device memory at `dst` (any address inside a
/// live allocation, as long as the range stays inside it). 0 bytes: `OK`, nothing read. `src`
/// is not used after the call returns.
///
/// # Safety
/// `src` is valid for reads of `nbytes` bytes (or `nbytes` is 0).
#[no_mangle]
pub unsafe extern "C" fn devalloc_copy_host_to_device(
    device_type: RawDeviceType,
    index: u32,
    dst: u64,
    src: *const c_void,
    nbytes: usize,
) -> DevallocStatus {
    guard("devalloc_copy_host_to_device", || {
        let (alloc, at) = device(device_type, index)?;
        let len = host_len(src, nbytes, "src (the host memory to read)")?;
        let src: &[u8] = match len {
            0 => &[],
            // SAFETY: non-null (host_len), at most isize::MAX bytes, readable by the caller's promise.
            _ => unsafe { std::slice::from_raw_parts(src.cast::<u8>(), len) },
        };
        on(dst, at, || alloc.copy_host_to_device(DevicePtr::new(dst), src, index))
    })
}

/// Copies `nbytes` from device memory at `src` (inside one live allocation) to host memory at
/// `dst`. 0 bytes: `OK`, nothing written. The bytes are in `dst` when the call returns.
///
/// # Safety
/// `dst` is valid for writes of `nbytes` bytes (or `nbytes` is 0) and not read or written by
/// anything else during the call.
#[no_mangle]
pub unsafe extern "C" fn devalloc_copy_device_to_host(
    device_type: RawDeviceType,
    index: u32,
    dst: *mut c_void,
    src: u64,
    nbytes: usize,
) -> DevallocStatus {
    guard("devalloc_copy_device_to_host", || {
        let (alloc, at) = device(device_type, index)?;
        let len = host_len(dst, nbytes, "dst (the host memory to write)")?;
        let dst: &mut [u8] = match len {
            0 => &mut [],
            // SAFETY: non-null (host_len), at most isize::MAX bytes, writable and unaliased by
            // the caller's promise.
            _ => unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), len) },
        };
        on(src, at, || alloc.copy_device_to_host(dst, DevicePtr::new(src), index))
    })
}

/// Copies `nbytes` from `src` on `src_type:src_index` to `dst` on `dst_type:dst_index`: one
/// allocator's own device-to-device copy when both types are the same, else through a host
/// bounce buffer. Both ranges are checked before a byte moves (the message names the end at
/// fault); ranges within one allocation may overlap (as `memmove`).
#[no_mangle]
pub extern "C" fn devalloc_copy_device_to_device(
    dst_type: RawDeviceType,
    dst_index: u32,
    dst: u64,
    src_type: RawDeviceType,
    src_index: u32,
    src: u64,
    nbytes: usize,
) -> DevallocStatus {
    guard("devalloc_copy_device_to_device", || {
        let (d, to) = device(dst_type, dst_index)?;
        let (s, from) = device(src_type, src_index)?;
        let ends = ((&*d, dst_index, DevicePtr::new(dst)), (&*s, src_index, DevicePtr::new(src)));
        // Both ends are checked before a byte moves; only a refused copy pays for finding out
        // which end was at fault, to name it.
        devalloc::copy_between(ends.0, ends.1, nbytes).map_err(|e| {
            let at_fault = |alloc: &Open, ptr: u64, device: Device, end: &str| {
                let e = alloc.check_range(DevicePtr::new(ptr), nbytes, device.index).err()?;
                let f = Failure::from(e);
                let f =
                    Failure::new(f.status(), format!("the {end} ({ptr:#x} on {device}): {}", f.message()));
                Some(whose(f, ptr, device))
            };
            at_fault(&s, src, from, "source")
                .or_else(|| at_fault(&d, dst, to, "destination"))
                .unwrap_or_else(|| e.into())
        })
    })
}

/// Writes to `*out` the host address of the `nbytes` at `ptr` on `device_type:index`, for an
/// allocator whose memory is host memory (CPU; any other is `NOT_SUPPORTED`: reach its bytes
/// through the copies). `ptr` may be any address inside a live allocation, and the range must
/// stay inside it, as for a copy. An allocation's first byte is at a 64-byte aligned host
/// address (a larger alignment asked for holds for the device address alone). The address
/// stays valid until that allocation is freed (or
/// `devalloc_shutdown`); it is not tracked, so a use after the free is not caught, and what is
/// done through it is not ordered with devalloc's own copies into the same bytes. Passed back
/// as the host side of a copy of those same bytes it is `INVALID_ARGUMENT` (copy between
/// device addresses instead).
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn devalloc_host_pointer(
    device_type: RawDeviceType,
    index: u32,
    ptr: u64,
    nbytes: usize,
    out: *mut *mut c_void,
) -> DevallocStatus {
    guard("devalloc_host_pointer", || {
        let (alloc, at) = device(device_type, index)?;
        let Some(host) = alloc.as_any().and_then(|a| a.downcast_ref::<HostAllocator>()) else {
            return Err(Failure::new(
                DevallocStatus::NotSupported,
                format!("{} memory is not host memory: reach it through the copies", at.device_type),
            ));
        };
        let address =
            host.host_address(DevicePtr::new(ptr), nbytes, index).map_err(|e| whose(e.into(), ptr, at))?;
        // SAFETY: the caller's promise.
        unsafe { put(out, address.as_ptr().cast::<c_void>(), "out") }
    })
}

/// The allocator `raw` names, or with `DEVALLOC_DEVICE_TYPE_ALL` every open one (those open
/// now: a shutdown meanwhile cannot fail the call halfway).
pub(crate) fn targets(raw: RawDeviceType) -> Outcome<Vec<Open>> {
    if raw.0 == open::DevallocDeviceType::All as i32 {
        return Ok(open::all_open().into_iter().map(|(_, a)| a).collect());
    }
    Ok(vec![allocator(device_type(raw)?)?])
}
