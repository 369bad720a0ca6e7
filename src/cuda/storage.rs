//! [`CudaStorage`]: CUDA device memory of one device as a [`Storage`] for the generic pool.
//!
//! Memory comes from `cuMemAlloc` / `cuMemFree`, synchronous and outside any stream-ordered
//! pool, on purpose: devalloc's pool is the cache, so the driver's pool would only add a second
//! one (the default pool is process-wide and, with its release threshold of 0, gives memory
//! back at every synchronisation anyway), and a stream-ordered allocation would be usable by
//! another stream only once devalloc's stream reached it. Here a pointer is usable by every
//! stream as soon as `allocate` returns, and `empty_cache` gives memory back to the driver at
//! once, so out of memory -> empty cache -> retry really frees. Fresh memory is uninitialised,
//! as `cudaMalloc`'s (devalloc does not zero it behind the caller's back).
//!
//! Freeing is not stream-ordered either: like `cudaFree`, freeing memory that queued work
//! (a kernel on the caller's stream) still uses is the caller's bug. Finish that work first,
//! as PyTorch asks with `record_stream`; with caching on, a freed block can also be handed to
//! the next allocation while such work runs.
#![allow(unsafe_code)] // at the edge: every unsafe block has a SAFETY note

use std::mem::ManuallyDrop;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{result, sys, CudaContext, DriverError};

use super::context::{keeping_current, CtxGuard, Opened};
use super::errors::driver_error;
use super::policy;
use super::staging::{CopyTuning, Pinned};
use crate::device::{Device, DeviceIndex, DeviceType};
use crate::error::{Error, Result};
use crate::storage::Storage;
use crate::sync::Unpoisoned;

/// One allocation: the raw `cuMemAlloc` pointer, its aligned start and its length; freed (with
/// its context current) on drop.
pub struct CudaBlock {
    raw: sys::CUdeviceptr,
    addr: u64,
    len: u64,
    /// Dropped inside the block's own `Drop`, with the caller's context kept: the last
    /// reference releases the primary context, and cudarc binds it to do so.
    ctx: ManuallyDrop<Arc<CudaContext>>,
    device: Device,
}

impl Drop for CudaBlock {
    fn drop(&mut self) {
        keeping_current(|| {
            let freed = CtxGuard::bind(&self.ctx, self.device).and_then(|_guard| {
                // SAFETY: `raw` came from `cuMemAlloc` in this context and is freed only here;
                // the pool hands out no pointer into it any more (the block is dropped).
                unsafe { result::free_sync(self.raw) }.map_err(|e| driver_error(self.device, "freeing", e, 0))
            });
            if let Err(e) = freed {
                log::error!("devalloc: freeing {} bytes on {}: {e}", self.len, self.device);
            }
            // SAFETY: dropped once, here; the field is not used after.
            unsafe { ManuallyDrop::drop(&mut self.ctx) };
        });
    }
}

/// Waits for devalloc's stream when dropped, so that an early return (an error half-way) never
/// leaves a copy running on memory the caller gets back. Raw `cuStreamSynchronize`: cudarc's
/// own first reports errors stored by earlier drops, and would skip the wait.
pub(crate) struct SyncOnDrop(pub sys::CUstream);

impl Drop for SyncOnDrop {
    fn drop(&mut self) {
        // SAFETY: the stream is devalloc's, alive for as long as the storage (which outlives
        // every copy call), and its context is current (the caller's guard is still held).
        if let Err(e) = unsafe { result::stream::synchronize(self.0) } {
            log::error!("devalloc: waiting for copies after an error: {e:?}");
        }
    }
}

/// CUDA memory of one device, as a [`Storage`] for the generic pool. The context is opened
/// on first use, so an unused GPU costs nothing and a busy one fails alone.
pub struct CudaStorage {
    id: Device,
    ordinal: usize,
    name: String,
    total: u64,
    opened: OnceLock<std::result::Result<Opened, String>>,
    pub(crate) tuning: CopyTuning,
    pub(crate) pinned: Pinned,
}

impl CudaStorage {
    /// Device `ordinal`, described without opening a context (the driver is initialised).
    pub(crate) fn new(ordinal: usize, tuning: CopyTuning, pool: Arc<rayon::ThreadPool>) -> Result<Self> {
        let id = Device::new(DeviceType::Cuda, ordinal as DeviceIndex);
        let err = |what: &str, e| driver_error(id, what, e, 0);
        let dev = result::device::get(ordinal as i32).map_err(|e| err("finding the device", e))?;
        let name = result::device::get_name(dev).map_err(|e| err("reading the device name", e))?;
        // SAFETY: `dev` is a valid device handle returned just above.
        let total =
            unsafe { result::device::total_mem(dev) }.map_err(|e| err("reading the memory size", e))? as u64;
        Ok(CudaStorage {
            id,
            ordinal,
            name,
            total,
            opened: OnceLock::new(),
            tuning,
            pinned: Pinned::new(pool),
        })
    }

    /// The device's context and stream, opened on first use; a device that could not be
    /// opened stays unavailable (the error is kept).
    pub(crate) fn opened(&self) -> Result<&Opened> {
        let opened =
            self.opened.get_or_init(|| Opened::open(self.ordinal, self.id).map_err(|e| e.to_string()));
        opened.as_ref().map_err(|why| Error::not_found(why.clone()))
    }

    pub(crate) fn err(&self, what: &str, e: DriverError) -> Error {
        driver_error(self.id, what, e, 0)
    }

    /// Free and total bytes of the device, as the driver counts them (`cuMemGetInfo`).
    pub fn mem_info(&self) -> Result<(u64, u64)> {
        let o = self.opened()?;
        let _g = CtxGuard::bind(&o.ctx, self.id)?;
        let (free, total) = result::mem_get_info().map_err(|e| self.err("reading free memory", e))?;
        Ok((free as u64, total as u64))
    }

    /// Waits for every copy queued on devalloc's stream.
    pub(crate) fn synchronize(&self) -> Result<()> {
        let o = self.opened()?;
        let _g = CtxGuard::bind(&o.ctx, self.id)?;
        self.sync(o)
    }

    /// Waits for devalloc's stream (raw: see [`SyncOnDrop`]); the context must be current.
    pub(crate) fn sync(&self, o: &Opened) -> Result<()> {
        // SAFETY: the stream is alive (held by `o`) and its context is current.
        unsafe { result::stream::synchronize(o.stream.cu_stream()) }
            .map_err(|e| self.err("waiting for the copy", e))
    }
}

impl Drop for CudaStorage {
    fn drop(&mut self) {
        let Some(Ok(o)) = self.opened.take() else { return };
        let id = self.id;
        // cudarc's pinned buffers, events and stream bind their context when dropped: keep the
        // caller's.
        keeping_current(|| {
            // Copies in flight read or write the pinned buffers: finish them before those go.
            let finished = CtxGuard::bind(&o.ctx, id).and_then(|_g| {
                o.stream.synchronize().map_err(|e| driver_error(id, "finishing copies", e, 0))
            });
            if let Err(e) = finished {
                log::error!("devalloc: dropping {id}: {e}");
            }
            drop(std::mem::take(&mut *self.pinned.upload.lock().unpoisoned()));
            drop(std::mem::take(&mut *self.pinned.download.lock().unpoisoned()));
            drop(o);
        });
    }
}

impl Storage for CudaStorage {
    type Block = CudaBlock;
    type Params = ();

    fn device(&self) -> Device {
        self.id
    }

    fn name(&self) -> String {
        format!("{} ({} GiB)", self.name, self.total >> 30)
    }

    fn max_block_size(&self) -> u64 {
        self.total
    }

    fn has_real_addresses(&self) -> bool {
        true
    }

    fn size_class(&self, size: u64) -> Option<u64> {
        policy::size_class(size)
    }

    fn check_usable(&self) -> Result<()> {
        self.opened().map(drop)
    }

    fn staging_bytes(&self) -> u64 {
        self.pinned.bytes()
    }

    fn async_chunk(&self) -> u64 {
        // Each blocking copy synchronizes its stream (~10-20 us): 16 MiB pieces (~0.6 ms at
        // 25 GB/s) keep that under a few percent and one poll's work still short.
        16 << 20
    }

    fn device_memory(&self) -> Option<crate::snapshot::MemoryReport> {
        // The size is known without a context; free memory only once the device is open.
        let free = self
            .opened
            .get()
            .and_then(|o| o.as_ref().ok())
            .and_then(|_| self.mem_info().ok())
            .map(|(f, _)| f);
        Some(crate::snapshot::MemoryReport {
            total_bytes: Some(self.total),
            free_bytes: free,
            ..Default::default()
        })
    }

    /// Asks the driver for `capacity` bytes, and for room to align within only if its pointer
    /// does not honour `alignment` (see `policy.rs`).
    fn alloc(&self, capacity: u64, alignment: u64, _params: &(), _name: &str) -> Result<CudaBlock> {
        if capacity > self.total {
            return Err(Error::TooLarge { requested: capacity, max: self.total, device: self.id });
        }
        let o = self.opened()?;
        let _g = CtxGuard::bind(&o.ctx, self.id)?;
        let malloc = |bytes: u64| {
            if bytes > self.total {
                let room = bytes - capacity;
                return Err(Error::TooLarge { requested: capacity, max: self.total - room, device: self.id });
            }
            // SAFETY: a plain device allocation in the current (devalloc's) context; freed once,
            // by the block's Drop (or at once below, when it does not honour the alignment).
            unsafe { result::malloc_sync(bytes as usize) }
                .map_err(|e| driver_error(self.id, "allocating device memory", e, capacity))
        };
        let free = |raw: u64| {
            // SAFETY: `raw` came from `cuMemAlloc` just now, in this context, and nothing refers to it.
            if let Err(e) = unsafe { result::free_sync(raw) } {
                log::warn!("devalloc: freeing a misaligned block on {}: {e}", self.id);
            }
        };
        let policy::Raw { raw, addr, .. } = policy::aligned_alloc(capacity, alignment, malloc, free)?;
        Ok(CudaBlock {
            raw,
            addr,
            len: capacity,
            ctx: ManuallyDrop::new(Arc::clone(&o.ctx)),
            device: self.id,
        })
    }

    fn address(&self, block: &CudaBlock) -> Option<u64> {
        Some(block.addr)
    }

    fn write(&self, block: &CudaBlock, offset: u64, src: &[u8]) -> Result<()> {
        debug_assert!(offset + src.len() as u64 <= block.len);
        let o = self.opened()?;
        let _g = CtxGuard::bind(&o.ctx, self.id)?;
        let dst = block.addr + offset;
        if src.len() >= self.tuning.pinned_threshold {
            return self.write_pinned(o, dst, src);
        }
        let _finished = SyncOnDrop(o.stream.cu_stream());
        // SAFETY: in bounds (the pool checked it, the block is alive); the stream is
        // synchronised before returning (on every path: `_finished`), so `src` outlives the copy.
        unsafe { result::memcpy_htod_async(dst, src, o.stream.cu_stream()) }
            .map_err(|e| self.err("copying to the device", e))?;
        self.sync(o)
    }

    fn read(&self, block: &CudaBlock, offset: u64, dst: &mut [u8]) -> Result<()> {
        debug_assert!(offset + dst.len() as u64 <= block.len);
        let o = self.opened()?;
        let _g = CtxGuard::bind(&o.ctx, self.id)?;
        let src = block.addr + offset;
        if dst.len() >= self.tuning.pinned_threshold {
            return self.read_pinned(o, dst, src);
        }
        let _finished = SyncOnDrop(o.stream.cu_stream());
        // SAFETY: in bounds (checked by the pool); `dst` is an exclusive borrow that outlives
        // the copy because the stream is synchronised before returning, on every path.
        unsafe { result::memcpy_dtoh_async(dst, src, o.stream.cu_stream()) }
            .map_err(|e| self.err("copying to the host", e))?;
        self.sync(o)
    }

    fn copy(
        &self,
        src: &CudaBlock,
        src_offset: u64,
        dst: &CudaBlock,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        let o = self.opened()?;
        let _g = CtxGuard::bind(&o.ctx, self.id)?;
        let (s, d) = (src.addr + src_offset, dst.addr + dst_offset);
        if s == d {
            return Ok(());
        }
        let overlap = s < d + len && d < s + len;
        let stream = o.stream.cu_stream();
        let _finished = SyncOnDrop(stream);
        if overlap {
            // cuMemcpy does not handle overlapping ranges: go through a temporary.
            let tmp = self.alloc(len, policy::DRIVER_ALIGNMENT, &(), "devalloc peer-copy temporary")?;
            // Declared after `tmp`, so dropped (the stream waited for) before `tmp` is freed,
            // on an error path too.
            let _tmp_finished = SyncOnDrop(stream);
            // SAFETY: all three ranges are in bounds of live allocations; the copies are
            // ordered on the stream, which is synchronised before `tmp` is freed.
            unsafe {
                result::memcpy_dtod_async(tmp.addr, s, len as usize, stream)
                    .and_then(|()| result::memcpy_dtod_async(d, tmp.addr, len as usize, stream))
            }
            .map_err(|e| self.err("copying on the device", e))?;
            // Finished before `tmp` is freed.
            return self.sync(o);
        } else {
            // SAFETY: both ranges are in bounds of live allocations (checked by the pool) and do
            // not overlap.
            unsafe { result::memcpy_dtod_async(d, s, len as usize, stream) }
                .map_err(|e| self.err("copying on the device", e))?;
        }
        self.sync(o)
    }

    fn copy_to(
        &self,
        src: &CudaBlock,
        src_offset: u64,
        dst_storage: &Self,
        dst: &CudaBlock,
        dst_offset: u64,
        len: u64,
    ) -> Option<Result<()>> {
        // A peer copy between two GPUs (untested where one GPU is lent: it needs two).
        let run = || -> Result<()> {
            let (so, dst_o) = (self.opened()?, dst_storage.opened()?);
            let _g = CtxGuard::bind(&so.ctx, self.id)?;
            let _finished = SyncOnDrop(so.stream.cu_stream());
            // SAFETY: both ranges are in bounds of live allocations of their devices (checked
            // by their pools); the stream is synchronised before returning.
            unsafe {
                result::memcpy_peer_async(
                    dst_o.ctx.cu_ctx(),
                    dst.addr + dst_offset,
                    so.ctx.cu_ctx(),
                    src.addr + src_offset,
                    len as usize,
                    so.stream.cu_stream(),
                )
            }
            .map_err(|e| self.err("copying between GPUs", e))?;
            self.sync(so)
        };
        Some(run())
    }
}
