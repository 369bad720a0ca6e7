//! [`CudaStorage`]: CUDA device memory of one device as a [`Storage`] for the generic pool.
//!
//! One thing split for length (ARCHITECTURE.md's table): this file, `copy.rs` (device-to-device
//! copies) and `staging.rs` (large host copies) are the CUDA storage's methods, and import each
//! other.
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
//!
//! Copies: small ones, and those from or to memory already pinned, go straight through the
//! driver on a stream of their own (`open.rs`); large ones through pinned staging
//! (`staging.rs`); device-to-device and peer copies in `copy.rs`.
#![allow(unsafe_code)] // at the edge: every unsafe block has a SAFETY note

use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext};

use super::context::{keeping_current, CtxGuard};
use super::copy::{Peers, Temp};
use super::errors::{copy_error, driver_error};
use super::open::{Lazy, Opened};
use super::policy;
use super::staging::{range_is_pinned, Pinned};
use super::tuning::Tuning;
use crate::device::{Device, DeviceIndex, DeviceType};
use crate::error::{Error, Result};
use crate::storage::Storage;

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

impl CudaBlock {
    /// The block's (aligned) device address.
    pub(crate) fn addr(&self) -> u64 {
        self.addr
    }
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

/// CUDA memory of one device, as a [`Storage`] for the generic pool. The context is opened
/// on first use, so an unused GPU costs nothing and a busy one fails alone.
pub struct CudaStorage {
    id: Device,
    ordinal: usize,
    name: String,
    total: u64,
    opened: Lazy<Opened>,
    pub(crate) tuning: Tuning,
    pub(crate) pinned: Pinned,
    pub(crate) peers: Peers,
    pub(crate) temp: Temp,
}

impl CudaStorage {
    /// Device `ordinal`, described without opening a context (the driver is initialised); it
    /// copies as `tuning` says (checked: see [`Tuning`]).
    pub(crate) fn new(ordinal: usize, tuning: Tuning, pool: Arc<rayon::ThreadPool>) -> Result<Self> {
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
            opened: Lazy::default(),
            tuning,
            pinned: Pinned::new(pool),
            peers: Peers::default(),
            temp: Temp::default(),
        })
    }

    /// The CUDA ordinal.
    pub(crate) fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's context and streams, opened on first use. Only code 46 (busy or
    /// exclusive) makes the device unavailable for good; other failures are returned as they
    /// are and the next call tries again (`open.rs`).
    pub(crate) fn opened(&self) -> Result<&Opened> {
        self.opened.get_or_open(|| Opened::open(self.ordinal, self.id))
    }

    /// Free and total bytes of the device, as the driver counts them (`cuMemGetInfo`).
    pub fn mem_info(&self) -> Result<(u64, u64)> {
        let o = self.opened()?;
        let _g = CtxGuard::bind(&o.ctx, self.id)?;
        let (free, total) =
            result::mem_get_info().map_err(|e| driver_error(self.id, "reading free memory", e, 0))?;
        Ok((free as u64, total as u64))
    }

    /// Waits for every copy in flight on devalloc's streams of this device (each copy waits
    /// for itself already).
    pub(crate) fn synchronize(&self) -> Result<()> {
        let o = self.opened()?;
        let _g = CtxGuard::bind(&o.ctx, self.id)?;
        o.streams.synchronize_idle()
    }
}

impl Drop for CudaStorage {
    fn drop(&mut self) {
        let Some(o) = self.opened.take() else { return };
        let id = self.id;
        // cudarc's context binds itself when dropped: keep the caller's.
        keeping_current(|| match CtxGuard::bind(&o.ctx, id) {
            Ok(_g) => {
                // Every copy waited for itself before returning, so no DMA uses the pinned
                // buffers; streams, events and buffers go with the context current.
                self.pinned.free();
                drop(o);
            }
            Err(e) => {
                // Without the context current its objects cannot be freed: leak them rather
                // than free them into whatever context is current.
                log::error!("devalloc: dropping {id}: {e}; its streams and pinned buffers are leaked");
                std::mem::forget(o);
                std::mem::forget(std::mem::take(&mut *crate::sync::lock(&self.pinned.upload)));
                std::mem::forget(std::mem::take(&mut *crate::sync::lock(&self.pinned.download)));
            }
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

    fn splits(&self) -> bool {
        true
    }

    fn size_class(&self, size: u64) -> Option<u64> {
        policy::size_class(size)
    }

    fn check_usable(&self) -> Result<()> {
        self.opened().map(drop)
    }

    fn staging_bytes(&self) -> u64 {
        // Pinned host buffers, and the device temporary of close overlapping copies.
        self.pinned.bytes() + self.temp.bytes()
    }

    fn async_chunk(&self) -> u64 {
        // Each blocking copy synchronizes its stream (~10-20 us): 16 MiB pieces (~0.6 ms at
        // 25 GB/s) keep that under a few percent and one poll's work still short.
        16 << 20
    }

    fn device_memory(&self) -> Option<crate::snapshot::MemoryReport> {
        // The size is known without a context; free memory only once the device is open.
        let free = self.opened.get().and_then(|_| self.mem_info().ok()).map(|(f, _)| f);
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
        if src.is_empty() {
            return Ok(());
        }
        let o = self.opened()?;
        let _g = CtxGuard::bind(&o.ctx, self.id)?;
        let dst = block.addr + offset;
        if src.len() >= self.tuning.get().pinned_threshold && !range_is_pinned(src) {
            if let Some(done) = self.write_staged(o, dst, src) {
                return done;
            }
        }
        let lease = o.streams.lease()?;
        // SAFETY: in bounds (the pool checked it, the block is alive); the stream is
        // synchronised before returning (on every path: the lease), so `src` outlives the copy.
        unsafe { result::memcpy_htod_async(dst, src, lease.stream()) }
            .map_err(|e| copy_error(self.id, "copying to the device", e))?;
        lease.finish("copying to the device")
    }

    fn read(&self, block: &CudaBlock, offset: u64, dst: &mut [u8]) -> Result<()> {
        debug_assert!(offset + dst.len() as u64 <= block.len);
        if dst.is_empty() {
            return Ok(());
        }
        let o = self.opened()?;
        let _g = CtxGuard::bind(&o.ctx, self.id)?;
        let src = block.addr + offset;
        if dst.len() >= self.tuning.get().pinned_threshold && !range_is_pinned(dst) {
            if let Some(done) = self.read_staged(o, dst, src) {
                return done;
            }
        }
        let lease = o.streams.lease()?;
        // SAFETY: in bounds (checked by the pool); `dst` is an exclusive borrow that outlives
        // the copy because the stream is synchronised before returning, on every path.
        unsafe { result::memcpy_dtoh_async(dst, src, lease.stream()) }
            .map_err(|e| copy_error(self.id, "copying to the host", e))?;
        lease.finish("copying to the host")
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
        self.copy_on_device(o, src.addr + src_offset, dst.addr + dst_offset, len)
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
        Some(self.copy_to_peer(src, src_offset, dst_storage, dst, dst_offset, len))
    }
}
