//! The [`DeviceAllocator`] contract every allocator keeps (its [`AllocatorStats`] are in
//! `stats.rs`, below the snapshot format that records them).

use std::any::Any;
use std::future::Future;
use std::pin::Pin;

use crate::device::{Device, DeviceIndex, DeviceType};
use crate::error::{Error, Result};
use crate::ptr::DevicePtr;
use crate::stats::AllocatorStats;

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

/// `Send + Sync` on native; nothing on wasm, where wgpu's web types are neither (as wgpu's own
/// `WasmNotSendSync`). Every allocator and storage implements it.
#[cfg(native)]
pub trait WasmNotSendSync: Send + Sync {}
#[cfg(native)]
impl<T: Send + Sync + ?Sized> WasmNotSendSync for T {}
/// `Send + Sync` on native; nothing on wasm, where wgpu's web types are neither (as wgpu's own
/// `WasmNotSendSync`). Every allocator and storage implements it.
#[cfg(web)]
pub trait WasmNotSendSync {}
#[cfg(web)]
impl<T: ?Sized> WasmNotSendSync for T {}

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
/// - a bad pointer, index or size is an error that leaves every other allocation, the data and
///   the stats as they were.
///
/// Ordering: a copy returns once its data are where they were sent (host copies) or ordered
/// before every later operation through the same allocator (device copies).
pub trait DeviceAllocator: WasmNotSendSync {
    /// The kind of device memory this allocator hands out.
    fn device_type(&self) -> DeviceType;

    /// Allocates `nbytes` bytes on device `index`, aligned to `alignment` (a power of two).
    fn allocate(&self, nbytes: usize, index: DeviceIndex, alignment: usize) -> Result<DevicePtr>;

    /// Async twin of [`DeviceAllocator::allocate`]: where the device says only later whether it
    /// could make the memory (the browser's WebGPU reports out of memory asynchronously), waits
    /// for that, so that running out is [`Error::OutOfMemory`] here, after the cache was given
    /// back and the exact size tried once more, as on native; `allocate` there returns at once,
    /// and an allocation the browser then refuses is `OutOfMemory` at its next use. Use this one
    /// in the browser wherever the memory may not be there. Default: `allocate`.
    fn allocate_async<'a>(
        &'a self,
        nbytes: usize,
        index: DeviceIndex,
        alignment: usize,
    ) -> BoxFuture<'a, Result<DevicePtr>> {
        Box::pin(async move { self.allocate(nbytes, index, alignment) })
    }

    /// [`DeviceAllocator::allocate`] with a label for people: reports, snapshots, histories and
    /// out-of-memory errors name the allocation by it. A label never changes which memory is
    /// reused. Default: the label is dropped.
    fn allocate_labeled(
        &self,
        nbytes: usize,
        index: DeviceIndex,
        alignment: usize,
        label: &str,
    ) -> Result<DevicePtr> {
        let _ = label;
        self.allocate(nbytes, index, alignment)
    }

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
        Err(not_implemented(self.device_type(), "copy_device_to_device"))
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

    /// Checks, without moving a byte, that `nbytes` bytes from `ptr` lie in one live allocation
    /// of device `index`: the same answer a copy of that range would get before it starts.
    /// Copies that move data in several steps (the registry's host bounce) call it on both ends
    /// first, so that a bad range changes nothing. Default: Ok for every range (an allocator
    /// that cannot tell), and then such copies find a bad range only when they reach it.
    fn check_range(&self, ptr: DevicePtr, nbytes: usize, index: DeviceIndex) -> Result<()> {
        let _ = (ptr, nbytes, index);
        Ok(())
    }

    /// Bytes from `ptr` to the end of the live allocation it lies in on device `index` (0 at
    /// its very end): how far a copy that starts at `ptr` may run, for a caller that has an
    /// address but not its allocation's size (the browser's `writeFromStream`). A pointer in no
    /// live allocation is the error a copy from it would get. Default: [`Error::NotSupported`].
    fn bytes_after(&self, ptr: DevicePtr, index: DeviceIndex) -> Result<usize> {
        let _ = (ptr, index);
        Err(not_implemented(self.device_type(), "bytes_after"))
    }

    /// How many devices of its type this allocator serves (indices `0..device_count()`).
    fn device_count(&self) -> usize {
        1
    }

    /// A short human name of device `index` (the adapter's name for wgpu, the GPU's for CUDA).
    fn device_name(&self, index: DeviceIndex) -> String {
        Device::new(self.device_type(), index).to_string()
    }

    /// Allocates a planned buffer that the caller keeps (as [`crate::PlannedMemory`] does): an
    /// allocation like any other, freed with `deallocate`, that histories and snapshots show as
    /// planned buffer `memory_id`. Default: [`DeviceAllocator::allocate_labeled`] with the label
    /// `planned buffer <memory_id>`.
    fn allocate_planned(
        &self,
        memory_id: u32,
        nbytes: usize,
        index: DeviceIndex,
        alignment: usize,
    ) -> Result<DevicePtr> {
        self.allocate_labeled(nbytes, index, alignment, &format!("planned buffer {memory_id}"))
    }

    /// Names the tensors inside the allocation that starts at `ptr` on device `index` (label,
    /// offset from its start, bytes: each inside it), for its snapshots and the viewer; names
    /// given earlier are replaced. [`crate::PlannedMemory::from_plan_labeled`] calls it for its
    /// planned buffer. Default: [`Error::NotSupported`] (the built-in allocators keep them).
    fn label_tensors(
        &self,
        ptr: DevicePtr,
        index: DeviceIndex,
        tensors: &[crate::snapshot::TensorNote],
    ) -> Result<()> {
        let _ = (ptr, index, tensors);
        Err(not_implemented(self.device_type(), "label_tensors"))
    }

    /// Allocates the buffer of memory id `memory_id` of a memory plan, `nbytes` long, on device
    /// `index`, which the allocator keeps: the seed's `init_buffer`. Default:
    /// [`Error::NotSupported`].
    fn init_buffer(&self, memory_id: u32, nbytes: usize, index: DeviceIndex) -> Result<DevicePtr> {
        let _ = (memory_id, nbytes, index);
        Err(not_implemented(self.device_type(), "init_buffer"))
    }

    /// The address `offset` bytes into planned buffer `memory_id`, checked so that `nbytes`
    /// bytes from there stay inside the buffer. Default: [`Error::NotSupported`].
    fn get_offset_address(
        &self,
        memory_id: u32,
        offset: usize,
        nbytes: usize,
        index: DeviceIndex,
    ) -> Result<DevicePtr> {
        let _ = (memory_id, offset, nbytes, index);
        Err(not_implemented(self.device_type(), "get_offset_address"))
    }

    /// Frees every planned buffer of device `index` (when a model is unloaded): all of them,
    /// even when one fails, reporting the first failure. Default: Ok, as there are none.
    fn release_buffers(&self, index: DeviceIndex) -> Result<()> {
        let _ = index;
        Ok(())
    }

    /// What the allocator holds on device `index`. Default: [`Error::NotSupported`].
    fn stats(&self, index: DeviceIndex) -> Result<AllocatorStats> {
        let _ = index;
        Err(not_implemented(self.device_type(), "stats"))
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

    /// Fills `nbytes` at `dst` in place, for streamed copies ([`crate::stream`]): hands `fill`
    /// host memory of the backend's own whose bytes become the range's (wgpu's staged route:
    /// a mapped staging buffer, copied to the range on the GPU), one piece of at most `piece`
    /// bytes at a time, in order, so that a reader reads straight into it and no copy of the
    /// caller's stands between. `fill` returns how many bytes at the piece's start it wrote
    /// (a count past the piece counts as the piece); fewer than the piece holds ends the fill
    /// once they have landed, and what it wrote past its count never reaches the range. It is
    /// handed the next piece only once the one before has landed, holding no lock of the
    /// allocator's, so it may call the allocator. Returns the bytes landed and, if a copy
    /// failed or the range was freed meanwhile, that error (what landed before it stays). The
    /// range is checked first, as a copy checks it, and again before each piece.
    ///
    /// `None` (the default) where the backend has no such route for this range: the caller
    /// copies from memory of its own instead, with [`DeviceAllocator::copy_host_to_device`].
    fn fill_in_place(
        &self,
        dst: DevicePtr,
        nbytes: usize,
        index: DeviceIndex,
        piece: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Option<(u64, Result<()>)> {
        let _ = (dst, nbytes, index, piece, fill);
        None
    }

    /// Gives every cached block of every device back to the device (as PyTorch's
    /// `empty_cache`); returns the bytes given back. Live allocations are untouched. Default:
    /// nothing is cached, 0.
    fn empty_cache(&self) -> u64 {
        0
    }

    /// Starts recording the newest `events` events of every device (allocations, frees, cache
    /// hits and misses, evictions, out of memory, planned buffers, copy counts), or with 0
    /// stops. Off by default; off, it costs nothing measurable. Default: [`Error::NotSupported`].
    fn record_history(&self, events: usize) -> Result<()> {
        let _ = events;
        Err(not_implemented(self.device_type(), "record_history"))
    }

    /// Every device's live allocations, cache, planned buffers, stats and recorded history,
    /// as a [`crate::snapshot::Snapshot`] (JSON with `to_json`). Default: [`Error::NotSupported`].
    fn snapshot(&self) -> Result<crate::snapshot::Snapshot> {
        Err(not_implemented(self.device_type(), "snapshot"))
    }

    /// The allocator as [`Any`], so that a registry user can get back to its concrete type
    /// (see [`crate::DeviceAllocatorRegistry::get`]). Default: `None` (not downcastable);
    /// every built-in allocator returns `Some(self)`.
    fn as_any(&self) -> Option<&dyn Any> {
        None
    }
}

/// The error of a trait method an allocator does not implement.
fn not_implemented(device_type: DeviceType, operation: &'static str) -> Error {
    Error::NotSupported { operation, device_type, reason: "this allocator does not implement it".into() }
}
