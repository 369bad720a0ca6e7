//! [`HostAllocator`]: host memory behind the [`crate::DeviceAllocator`] contract (`DeviceType::Cpu`).
//!
//! Real host memory handed out at virtual addresses (which carry any power-of-two alignment)
//! through the generic [`Pool`], so the host allocator keeps exactly the rules the GPU
//! allocators keep: bounds-checked copies, use-after-free and double-free detection, stats,
//! planned pools. It is also the reference the conformance suite and the benchmarks compare to.
#![allow(unsafe_code)] // at the edge: every unsafe block has a SAFETY note

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::RwLock;

use crate::device::{Device, DeviceIndex, DeviceType};
use crate::error::{Error, Result};
use crate::pool::{Pool, PoolOptions};
use crate::pooled_allocator::PooledAllocator;
use crate::ptr::DevicePtr;
use crate::storage::Storage;
use crate::sync::Unpoisoned;

/// Alignment of every host block (a cache line). The address a caller sees is virtual and
/// carries the alignment asked for; the memory behind it only needs to be fast to copy.
const HOST_BLOCK_ALIGNMENT: u64 = 64;

/// One block of host memory. Reads take the lock shared, writes exclusive, so concurrent
/// copies into one block never race.
pub struct HostBlock {
    /// The block's first byte, aligned to what was asked for.
    ptr: NonNull<u8>,
    /// Its size in bytes.
    size: usize,
    /// What the system allocator returned, and the layout it was asked for (`ptr` lies in it).
    base: NonNull<u8>,
    layout: Layout,
    lock: RwLock<()>,
}

// SAFETY: a HostBlock owns its memory exclusively (like a Box<[u8]>) and every access to that
// memory goes through `lock`, so it may move to and be shared between threads.
unsafe impl Send for HostBlock {}
// SAFETY: see `Send` above: shared access is serialised by `lock`.
unsafe impl Sync for HostBlock {}

impl HostBlock {
    fn check(&self, offset: u64, len: usize) -> Result<usize> {
        let offset = usize::try_from(offset).map_err(|_| Error::invalid_argument("offset exceeds usize"))?;
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(offset),
            _ => Err(Error::OutOfBounds {
                device: Device::new(DeviceType::Cpu, 0),
                what: "a host block".into(),
                offset: offset as u64,
                len: len as u64,
                size: self.size as u64,
            }),
        }
    }

    /// [`HostBlock::check`], and that the caller's buffer at `host` is not the block's own
    /// `len` bytes at `offset` (a host address from [`HostAllocator::host_address`] handed back
    /// to a copy of the same bytes: copying them would alias its own borrow).
    fn check_apart(&self, offset: u64, len: usize, host: *const u8) -> Result<usize> {
        let offset = self.check(offset, len)?;
        let (here, there) = (self.ptr.as_ptr() as usize + offset, host as usize);
        if len > 0 && here < there.saturating_add(len) && there < here + len {
            return Err(Error::invalid_argument(
                "the host buffer is the allocation's own memory (an address from host_address or \
                 devalloc_host_pointer): copy between device addresses instead",
            ));
        }
        Ok(offset)
    }
}

impl Drop for HostBlock {
    fn drop(&mut self) {
        // SAFETY: `base` was returned by `alloc_zeroed(self.layout)` and is freed only here.
        unsafe { std::alloc::dealloc(self.base.as_ptr(), self.layout) }
    }
}

/// The [`Storage`] of host memory.
pub struct HostStorage;

impl Storage for HostStorage {
    type Block = HostBlock;
    type Params = ();

    fn device(&self) -> Device {
        Device::new(DeviceType::Cpu, 0)
    }

    fn name(&self) -> String {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        format!("host memory ({cores} cores)")
    }

    fn max_block_size(&self) -> u64 {
        // No 64-bit machine devalloc runs on maps more than 2^47 bytes for a process, so a
        // larger block can never be made: say so (TooLarge), rather than "out of memory now".
        (isize::MAX as u64 - (1 << 20)).min(1 << 47)
    }

    fn block_alignment(&self, _alignment: u64) -> u64 {
        HOST_BLOCK_ALIGNMENT
    }

    fn splits(&self) -> bool {
        true
    }

    fn alloc(&self, capacity: u64, alignment: u64, _params: &(), _name: &str) -> Result<HostBlock> {
        let size = usize::try_from(capacity).map_err(|_| Error::invalid_argument("size exceeds usize"))?;
        let align = usize::try_from(alignment.max(HOST_BLOCK_ALIGNMENT))
            .map_err(|_| Error::invalid_argument("alignment exceeds usize"))?;
        // The system allocator's own alignment, with room to align within: zeroed memory of an
        // alignment past the system's (16 bytes) is `posix_memalign` and a `memset` of every
        // byte, where `calloc` gets a large block as fresh pages, zero already (a 1 GiB block
        // in microseconds, not a tenth of a second).
        let layout = size
            .checked_add(align - 1)
            .and_then(|n| Layout::from_size_align(n, 1).ok())
            .ok_or_else(|| Error::invalid_argument(format!("{size} bytes aligned to {align}: too large")))?;
        // SAFETY: `layout` has a non-zero size (the pool never asks for 0 bytes).
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        let base = NonNull::new(base).ok_or_else(|| Error::OutOfMemory {
            requested: capacity,
            device: self.device(),
            detail: "the system allocator returned null".into(),
        })?;
        // (`align_offset` may say "never" (usize::MAX); the address's own remainder cannot.)
        let offset = (align - base.as_ptr().addr() % align) % align;
        // SAFETY: `offset` < `align`, so `ptr..ptr + size` lies in the allocation's
        // `size + align - 1` bytes.
        let ptr = unsafe { base.add(offset) };
        Ok(HostBlock { ptr, size, base, layout, lock: RwLock::new(()) })
    }

    fn write(&self, block: &HostBlock, offset: u64, src: &[u8]) -> Result<()> {
        let offset = block.check_apart(offset, src.len(), src.as_ptr())?;
        let _guard = block.lock.write().unpoisoned();
        // SAFETY: `check_apart` keeps `offset..offset + src.len()` inside the block's allocation
        // and apart from `src`; the write lock excludes every other access to the block.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), block.ptr.as_ptr().add(offset), src.len()) }
        Ok(())
    }

    fn read(&self, block: &HostBlock, offset: u64, dst: &mut [u8]) -> Result<()> {
        let offset = block.check_apart(offset, dst.len(), dst.as_ptr())?;
        let _guard = block.lock.read().unpoisoned();
        // SAFETY: in bounds and apart from `dst` by `check_apart`; the read lock excludes
        // writers.
        unsafe { std::ptr::copy_nonoverlapping(block.ptr.as_ptr().add(offset), dst.as_mut_ptr(), dst.len()) }
        Ok(())
    }

    fn copy(
        &self,
        src: &HostBlock,
        src_offset: u64,
        dst: &HostBlock,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        let len = usize::try_from(len).map_err(|_| Error::invalid_argument("length exceeds usize"))?;
        let so = src.check(src_offset, len)?;
        let d_o = dst.check(dst_offset, len)?;
        if std::ptr::eq(src, dst) {
            let _guard = dst.lock.write().unpoisoned();
            // SAFETY: both ranges are in bounds of the one block (checked above) and the
            // write lock is held; `copy` handles overlapping ranges.
            unsafe { std::ptr::copy(dst.ptr.as_ptr().add(so), dst.ptr.as_ptr().add(d_o), len) }
            return Ok(());
        }
        // Take the two locks in address order so that two opposite copies cannot deadlock.
        let (_a, _b);
        if (src as *const HostBlock) < (dst as *const HostBlock) {
            _a = Some(src.lock.read().unpoisoned());
            _b = dst.lock.write().unpoisoned();
        } else {
            _b = dst.lock.write().unpoisoned();
            _a = Some(src.lock.read().unpoisoned());
        }
        // SAFETY: both ranges are in bounds (checked above), the blocks are distinct
        // allocations, and we hold src's read lock and dst's write lock.
        unsafe { std::ptr::copy_nonoverlapping(src.ptr.as_ptr().add(so), dst.ptr.as_ptr().add(d_o), len) }
        Ok(())
    }
}

/// Host memory as a [`crate::DeviceAllocator`] for [`DeviceType::Cpu`], with one device
/// (index 0).
///
/// By default freed blocks are kept by capacity and reused (as by every built-in allocator;
/// `empty_cache` gives them back); with [`PoolOptions::caching`] off, freed memory goes
/// straight back to the system allocator. Fresh memory is zeroed; reused cached memory holds its
/// old bytes.
pub struct HostAllocator(PooledAllocator<HostStorage>);

crate::pooled_allocator::pool_controls!(HostAllocator, HostStorage);

impl Default for HostAllocator {
    fn default() -> Self {
        Self::with_options(PoolOptions::default()).expect("the default pool settings are valid")
    }
}

impl HostAllocator {
    /// A host allocator with a cache and no limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// A host allocator with these pool settings; an error when they are invalid (see
    /// [`PoolOptions`]).
    pub fn with_options(options: PoolOptions) -> Result<Self> {
        let pools = vec![Pool::new(HostStorage, options)?];
        Ok(HostAllocator(PooledAllocator::from_pools(DeviceType::Cpu, pools)?))
    }

    /// The host address of the `nbytes` at `ptr`, which must lie inside one live allocation of
    /// device `index` (checked as a copy checks its range: a null, foreign, freed or
    /// out-of-range pointer is an error), for code that hands host buffers to kernels. It stays
    /// valid until that allocation is freed (or this allocator dropped). An allocation's first
    /// byte is at a 64-byte aligned host address (a larger alignment asked for holds for the
    /// device address alone). What is done through it is not
    /// ordered with devalloc's own copies into the same bytes, which take the block's lock (a
    /// race there is the caller's, as with any shared memory); it is not tracked, so a use after
    /// the free is not caught. A copy whose host slice is the very bytes it copies (this address
    /// handed back) is [`Error::InvalidArgument`].
    pub fn host_address(&self, ptr: DevicePtr, nbytes: usize, index: DeviceIndex) -> Result<NonNull<u8>> {
        let pool = self.0.pool(index)?;
        let len = u64::try_from(nbytes).map_err(|_| Error::invalid_argument("length exceeds u64"))?;
        let at = pool.block_at(ptr, len).map_err(|e| self.0.foreign(index, ptr, e))?;
        let offset =
            usize::try_from(at.offset).map_err(|_| Error::invalid_argument("offset exceeds usize"))?;
        // SAFETY: `block_at` checked `offset + nbytes` against the live allocation, which lies
        // inside its block's `size` bytes starting at `ptr`.
        Ok(unsafe { at.block.ptr.add(offset) })
    }
}
