//! The [`DeviceAllocator`] contract every allocator keeps, and its [`AllocatorStats`].
#![deny(unsafe_code)]

use std::future::Future;
use std::pin::Pin;

use crate::device::{Device, DeviceIndex, DeviceType};
use crate::error::{Error, Result};
use crate::ptr::DevicePtr;
use crate::WasmNotSendSync;

/// Alignment of an allocation when the caller has no stronger need: 256 bytes, the base
/// alignment of CUDA allocations and wgpu's minimum storage-buffer offset alignment.
pub const DEFAULT_ALIGNMENT: usize = 256;

/// A boxed future, `Send` on native so async copies can cross threads; on wasm, where wgpu's
/// futures are not `Send`, the bound is dropped.
#[cfg(native)]
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
/// A boxed future, `Send` on native so async copies can cross threads; on wasm, where wgpu's
/// futures are not `Send`, the bound is dropped.
#[cfg(web)]
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// What an allocator holds on one device, in bytes and counts.
///
/// `allocated` counts the bytes callers asked for and still hold; `reserved` counts what the
/// allocator holds from the device for them, rounding and cached free blocks included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorStats {
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
}

/// The contract of a device memory allocator, after ExecuTorch's `DeviceAllocator`.
///
/// One allocator serves one [`DeviceType`] and every device of that type, told apart by a
/// [`DeviceIndex`]. An outside implementation writes the five required methods; the rest have
/// defaults. The trait is object-safe and meant to be used as `&'static dyn DeviceAllocator`
/// from a [`crate::DeviceAllocatorRegistry`]; it is `Send + Sync` on native.
///
/// Rules every implementation keeps (the conformance suite checks them):
/// - a zero-size allocation is an [`Error::InvalidArgument`]; an alignment must be a non-zero
///   power of two, and the returned address is a multiple of it;
/// - a copy of 0 bytes succeeds and does nothing (the pointer is not looked at);
/// - copies are bounds-checked against the allocation a pointer lies in (offset pointers into
///   the middle of an allocation are fine) and are either done whole or not at all;
/// - a bad pointer, index or size is an error that leaves every other allocation intact.
///
/// Ordering: a copy returns once its data are where they were sent (host copies) or ordered
/// before every later operation through the same allocator (device copies).
pub trait DeviceAllocator: WasmNotSendSync {
    /// The kind of device memory this allocator hands out.
    fn device_type(&self) -> DeviceType;

    /// Allocates `nbytes` bytes on device `index`, aligned to `alignment` (a power of two).
    fn allocate(&self, nbytes: usize, index: DeviceIndex, alignment: usize) -> Result<DevicePtr>;

    /// Frees an allocation made by [`DeviceAllocator::allocate`] on device `index`.
    fn deallocate(&self, ptr: DevicePtr, index: DeviceIndex) -> Result<()>;

    /// Copies `src` from the host to device memory at `dst`.
    fn copy_host_to_device(&self, dst: DevicePtr, src: &[u8], index: DeviceIndex) -> Result<()>;

    /// Copies `dst.len()` bytes of device memory at `src` to the host.
    fn copy_device_to_host(&self, dst: &mut [u8], src: DevicePtr, index: DeviceIndex) -> Result<()>;

    /// Copies `nbytes` bytes between two allocations of this allocator, on the same device or
    /// two devices of its type. Default: [`Error::NotSupported`].
    fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        dst_index: DeviceIndex,
        src: DevicePtr,
        src_index: DeviceIndex,
        nbytes: usize,
    ) -> Result<()> {
        let _ = (dst, dst_index, src, src_index, nbytes);
        Err(self.not_supported("copy_device_to_device"))
    }

    /// Async twin of [`DeviceAllocator::copy_device_to_device`], for copies that must wait on
    /// the device in the browser (ragged ranges). Default: the blocking copy.
    fn copy_device_to_device_async<'a>(
        &'a self,
        dst: DevicePtr,
        dst_index: DeviceIndex,
        src: DevicePtr,
        src_index: DeviceIndex,
        nbytes: usize,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(std::future::ready(self.copy_device_to_device(dst, dst_index, src, src_index, nbytes)))
    }

    /// How many devices of its type this allocator serves (indices `0..device_count()`).
    fn device_count(&self) -> usize {
        1
    }

    /// A short human name of device `index` (the adapter's name for wgpu, the GPU's for CUDA).
    fn device_name(&self, index: DeviceIndex) -> String {
        Device::new(self.device_type(), index).to_string()
    }

    /// Allocates the pool of memory id `memory_id` of a memory plan, `nbytes` long, on device
    /// `index`: the seed's `init_buffer`. Default: [`Error::NotSupported`].
    fn init_buffer(&self, memory_id: u32, nbytes: usize, index: DeviceIndex) -> Result<DevicePtr> {
        let _ = (memory_id, nbytes, index);
        Err(self.not_supported("init_buffer"))
    }

    /// The address `offset` bytes into planned pool `memory_id`, checked so that `nbytes`
    /// bytes from there stay inside the pool. Default: [`Error::NotSupported`].
    fn get_offset_address(
        &self,
        memory_id: u32,
        offset: usize,
        nbytes: usize,
        index: DeviceIndex,
    ) -> Result<DevicePtr> {
        let _ = (memory_id, offset, nbytes, index);
        Err(self.not_supported("get_offset_address"))
    }

    /// Frees every planned pool of device `index` (when a model is unloaded). Default: Ok, as
    /// there are none.
    fn release_buffers(&self, index: DeviceIndex) -> Result<()> {
        let _ = index;
        Ok(())
    }

    /// What the allocator holds on device `index`. Default: [`Error::NotSupported`].
    fn stats(&self, index: DeviceIndex) -> Result<AllocatorStats> {
        let _ = index;
        Err(self.not_supported("stats"))
    }

    /// Async twin of [`DeviceAllocator::copy_host_to_device`], for backends that must not block
    /// (the browser). Default: runs the blocking copy.
    fn copy_host_to_device_async<'a>(
        &'a self,
        dst: DevicePtr,
        src: &'a [u8],
        index: DeviceIndex,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(std::future::ready(self.copy_host_to_device(dst, src, index)))
    }

    /// Async twin of [`DeviceAllocator::copy_device_to_host`]: in the browser the only way to
    /// read device memory. Default: runs the blocking copy.
    fn copy_device_to_host_async<'a>(
        &'a self,
        dst: &'a mut [u8],
        src: DevicePtr,
        index: DeviceIndex,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(std::future::ready(self.copy_device_to_host(dst, src, index)))
    }

    /// The [`Error::NotSupported`] this allocator returns for `operation`.
    #[doc(hidden)]
    fn not_supported(&self, operation: &'static str) -> Error {
        Error::NotSupported {
            operation,
            device_type: self.device_type(),
            reason: "this allocator does not implement it".into(),
        }
    }
}

/// Checks that `alignment` is a non-zero power of two.
pub fn check_alignment(alignment: usize) -> Result<()> {
    if alignment.is_power_of_two() {
        Ok(())
    } else {
        Err(Error::invalid_argument(format!(
            "alignment {alignment} is not a power of two (use {DEFAULT_ALIGNMENT} if unsure)"
        )))
    }
}

/// Checks an allocation request: non-zero size, power-of-two alignment, and a size whose
/// rounding up to the alignment does not overflow. Returns the rounded size.
pub fn check_request(nbytes: usize, alignment: usize, device: Device) -> Result<u64> {
    check_alignment(alignment)?;
    if nbytes == 0 {
        return Err(Error::invalid_argument(format!(
            "zero-size allocation on {device}: devalloc refuses allocations of 0 bytes"
        )));
    }
    // Rounded in `usize`, so that the same request overflows on 32-bit (wasm) and 64-bit hosts.
    nbytes.checked_next_multiple_of(alignment).map(|n| n as u64).ok_or_else(|| {
        Error::invalid_argument(format!(
            "{nbytes} bytes rounded up to alignment {alignment} overflows on {device}"
        ))
    })
}

/// `value` rounded up to a multiple of the power of two `align`, or `None` on overflow.
pub fn round_up(value: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    value.checked_add(align - 1).map(|v| v & !(align - 1))
}

/// Checks `index < count` for an allocator of `device_type`.
pub fn check_index(device_type: DeviceType, index: DeviceIndex, count: usize) -> Result<()> {
    if (index as usize) < count {
        Ok(())
    } else {
        Err(Error::NoSuchDevice { device: Device::new(device_type, index), count })
    }
}

/// Size of the host bounce buffer used for copies that cross devices through the host.
pub const BOUNCE_CHUNK: usize = 4 << 20;

/// Copies `nbytes` from one allocator's device to another's through a host buffer of at most
/// [`BOUNCE_CHUNK`] bytes, so that a copy of a few GiB never needs a few GiB of host memory.
pub fn bounce_copy(
    dst_alloc: &dyn DeviceAllocator,
    dst_index: DeviceIndex,
    dst: DevicePtr,
    src_alloc: &dyn DeviceAllocator,
    src_index: DeviceIndex,
    src: DevicePtr,
    nbytes: usize,
) -> Result<()> {
    if nbytes == 0 {
        return Ok(());
    }
    // Check both ends before moving a byte, so that a bad range leaves `dst` untouched.
    src.offset(nbytes)?;
    dst.offset(nbytes)?;
    let mut buf = vec![0u8; nbytes.min(BOUNCE_CHUNK)];
    let mut done = 0;
    while done < nbytes {
        let n = (nbytes - done).min(buf.len());
        src_alloc.copy_device_to_host(&mut buf[..n], src.offset(done)?, src_index)?;
        dst_alloc.copy_host_to_device(dst.offset(done)?, &buf[..n], dst_index)?;
        done += n;
    }
    Ok(())
}

/// Async twin of [`bounce_copy`]: the same chunked host bounce through the async copies, so
/// it works in the browser.
pub async fn bounce_copy_async(
    dst_alloc: &dyn DeviceAllocator,
    dst_index: DeviceIndex,
    dst: DevicePtr,
    src_alloc: &dyn DeviceAllocator,
    src_index: DeviceIndex,
    src: DevicePtr,
    nbytes: usize,
) -> Result<()> {
    if nbytes == 0 {
        return Ok(());
    }
    src.offset(nbytes)?;
    dst.offset(nbytes)?;
    let mut buf = vec![0u8; nbytes.min(BOUNCE_CHUNK)];
    let mut done = 0;
    while done < nbytes {
        let n = (nbytes - done).min(buf.len());
        src_alloc.copy_device_to_host_async(&mut buf[..n], src.offset(done)?, src_index).await?;
        dst_alloc.copy_host_to_device_async(dst.offset(done)?, &buf[..n], dst_index).await?;
        done += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked() {
        let d = Device::new(DeviceType::Cpu, 0);
        assert_eq!(check_request(1, 256, d).unwrap(), 256);
        assert_eq!(check_request(257, 256, d).unwrap(), 512);
        for bad_align in [0, 3, 6, 100] {
            assert!(matches!(check_request(8, bad_align, d), Err(Error::InvalidArgument { .. })));
        }
        assert!(check_request(0, 8, d).unwrap_err().to_string().contains("zero-size"));
        let e = check_request(usize::MAX - 2, 1 << 12, d).unwrap_err();
        assert!(e.to_string().contains("overflows"), "{e}");
    }

    #[test]
    fn index_is_checked() {
        assert!(check_index(DeviceType::Cuda, 0, 1).is_ok());
        let e = check_index(DeviceType::Cuda, 1, 1).unwrap_err();
        assert_eq!(e.to_string(), "no device cuda:1: this allocator has 1 cuda device(s)");
    }
}
