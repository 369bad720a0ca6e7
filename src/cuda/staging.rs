//! Large host<->device copies through pinned staging buffers, in the order `pipeline.rs` sets.
//!
//! One thing split for length with `storage.rs` (ARCHITECTURE.md's table): these are
//! `CudaStorage`'s staged copies, and the two files import each other.
//!
//! One thread copying on the host is capped by a single core's memcpy (~8-15 GB/s), below a
//! PCIe Gen5 link (~50 GB/s pinned): so the host side runs on [`CopyTuning::threads`] copy
//! threads, each filling (or emptying) a whole chunk of its own, into [`CopyTuning::buffers`]
//! pinned buffers per direction, while the DMA engine moves the chunks before it. Chunks ramp
//! at both ends (`tuning.rs`).
//!
//! - A caller's buffer that is already pinned (`cuMemHostAlloc`'s, as PyTorch's `pin_memory`;
//!   seen by `cuMemHostGetFlags`) is copied straight from, or into, by the driver.
//! - Pinned memory is the host's, and it can run short: then the copy goes through the driver
//!   from pageable memory (slower, still right), with one warning; it is never reported as the
//!   device being out of memory (emptying the device cache would not help).
//! - The bytes held are counted in an atomic, so `stats()` never waits for a copy in flight.
//!
//! Every copy returns once its data are where they were sent (its stream is synchronised).
#![allow(unsafe_code)] // at the edge: every unsafe block has a SAFETY note

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{self, CUevent, CUstream};
use cudarc::driver::{result, CudaContext};

use super::context::CtxGuard;
use super::errors::copy_error;
use super::open::Opened;
use super::pipeline::{self, Stages, Way};
use super::storage::CudaStorage;
use super::tuning::CopyTuning;
use crate::device::Device;
use crate::error::Result;
use crate::sync::lock;

/// One pinned buffer (`cuMemHostAlloc`) and the event recorded after the last DMA that used it.
/// Freed when dropped, which must be with its context current (the storage's `Drop`).
pub(crate) struct Slot {
    ptr: *mut u8,
    len: usize,
    event: CUevent,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // SAFETY: both were created by `Pinned::ensure` in this context, which is current (the
        // storage drops its staging under its guard), and no DMA uses them (the storage waited).
        unsafe {
            if let Err(e) = result::event::destroy(self.event) {
                log::warn!("devalloc: destroying a staging event: {e:?}");
            }
            if let Err(e) = result::free_host(self.ptr.cast()) {
                log::warn!("devalloc: freeing {} bytes of pinned staging: {e:?}", self.len);
            }
        }
    }
}

/// The pinned buffers of one direction.
#[derive(Default)]
pub(crate) struct Staging {
    slots: Vec<Slot>,
    /// Set when pinned memory ran short: the most buffers there are, tried no further.
    short_at: Option<usize>,
}

// SAFETY: the raw pointers are a pinned host allocation and an event handle, owned by the
// staging and used by one copy at a time (the one holding the staging's lock).
unsafe impl Send for Staging {}

/// The pinned buffers of both directions, the copy threads, and the bytes held.
pub(crate) struct Pinned {
    pub upload: Mutex<Staging>,
    pub download: Mutex<Staging>,
    pub pool: Arc<rayon::ThreadPool>,
    bytes: AtomicU64,
    warned: AtomicBool,
}

impl Pinned {
    pub(crate) fn new(pool: Arc<rayon::ThreadPool>) -> Self {
        Pinned {
            upload: Mutex::default(),
            download: Mutex::default(),
            pool,
            bytes: AtomicU64::new(0),
            warned: AtomicBool::new(false),
        }
    }

    /// Bytes of pinned host memory held; never waits for a copy.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Frees both directions' buffers; the context must be current and no DMA running.
    pub(crate) fn free(&self) {
        for staging in [&self.upload, &self.download] {
            let slots = std::mem::take(&mut lock(staging).slots);
            let held: usize = slots.iter().map(|s| s.len).sum();
            drop(slots);
            self.bytes.fetch_sub(held as u64, Ordering::Relaxed);
        }
    }

    /// Makes sure `staging` holds `tuning.buffers` buffers, or as many as pinned memory allows;
    /// `Ok(false)` if that is fewer than two (the copy goes through pageable memory instead).
    fn ensure(
        &self,
        staging: &mut Staging,
        tuning: &CopyTuning,
        upload: bool,
        device: Device,
    ) -> Result<bool> {
        let want = staging.short_at.map_or(tuning.buffers, |s| s.min(tuning.buffers));
        let flags = if upload && tuning.write_combined { sys::CU_MEMHOSTALLOC_WRITECOMBINED } else { 0 };
        while staging.slots.len() < want {
            // SAFETY: a plain pinned allocation in the current context, freed once by `Slot`.
            let ptr = match unsafe { result::malloc_host(tuning.chunk, flags) } {
                Ok(p) => p.cast::<u8>(),
                Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                    staging.short_at = Some(staging.slots.len());
                    if !self.warned.swap(true, Ordering::Relaxed) {
                        log::warn!(
                            "devalloc: pinned host memory ran short on {device} after {} buffers of {} bytes; \
                             large copies go through pageable memory (slower)",
                            staging.slots.len(),
                            tuning.chunk
                        );
                    }
                    break;
                }
                Err(e) => return Err(copy_error(device, "allocating pinned staging", e)),
            };
            let event = match result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING) {
                Ok(ev) => ev,
                Err(e) => {
                    // SAFETY: allocated just above, used by nothing.
                    let _ = unsafe { result::free_host(ptr.cast()) };
                    return Err(copy_error(device, "creating a staging event", e));
                }
            };
            staging.slots.push(Slot { ptr, len: tuning.chunk, event });
            self.bytes.fetch_add(tuning.chunk as u64, Ordering::Relaxed);
        }
        Ok(staging.slots.len() >= 2)
    }
}

/// Whether the driver knows `ptr` as pinned memory (`cuMemHostAlloc`'s); the context must be
/// current. Memory pinned by `cuMemHostRegister` is not seen, and is staged (still right).
pub(crate) fn is_pinned(ptr: *const u8) -> bool {
    let mut flags = 0u32;
    // SAFETY: the driver only looks the address up; it reads and writes nothing but `flags`.
    unsafe { sys::cuMemHostGetFlags(&mut flags, ptr.cast_mut().cast()) }.result().is_ok()
}

/// Whether a whole host range is pinned (its first and last byte are).
pub(crate) fn range_is_pinned(bytes: &[u8]) -> bool {
    !bytes.is_empty() && is_pinned(bytes.as_ptr()) && is_pinned(bytes[bytes.len() - 1..].as_ptr())
}

/// What the steps of one staged copy share.
struct Copy<'a> {
    ctx: &'a CudaContext,
    device: Device,
    slots: &'a [Slot],
    chunks: &'a [Range<usize>],
    stream: CUstream,
    /// The device address of the copy's first byte.
    addr: u64,
    /// The host side: the source (upload) or the destination (download).
    host: *mut u8,
}

// SAFETY: the pipeline hands each buffer to one step at a time, in an order that the events
// and its own lock make happen-before (see `pipeline.rs`); the host ranges of chunks are
// disjoint; `queue` runs on the calling thread alone. The pointers outlive the copy (borrowed
// by `write_staged` / `read_staged`, which return after it).
unsafe impl Sync for Copy<'_> {}

impl Copy<'_> {
    fn buffer(&self, j: usize, b: usize) -> *mut u8 {
        debug_assert!(self.chunks[j].len() <= self.slots[b].len);
        self.slots[b].ptr
    }

    fn wait(&self, b: usize) -> Result<()> {
        // A copy thread has no context current: bind devalloc's for the call.
        let _g = CtxGuard::bind(self.ctx, self.device)?;
        // SAFETY: the event is live (owned by the slot, which outlives the copy).
        unsafe { result::event::synchronize(self.slots[b].event) }
            .map_err(|e| copy_error(self.device, "waiting for a staging buffer", e))
    }

    fn record(&self, b: usize) -> Result<()> {
        // SAFETY: event and stream are live and of this context, which is current (the
        // caller's guard: `queue` runs on the calling thread).
        unsafe { result::event::record(self.slots[b].event, self.stream) }
            .map_err(|e| copy_error(self.device, "recording a staging event", e))
    }
}

struct Upload<'a>(Copy<'a>);
struct Download<'a>(Copy<'a>);

impl Stages for Upload<'_> {
    fn host(&self, j: usize, b: usize) -> Result<()> {
        let c = &self.0;
        let r = c.chunks[j].clone();
        // SAFETY: `r` lies in the source (the plan covers it exactly), which is only read; the
        // buffer holds at least `r.len()` bytes and is this step's alone (no DMA reads it: the
        // pipeline waited for its event; no other step has it).
        unsafe { std::ptr::copy_nonoverlapping(c.host.add(r.start), c.buffer(j, b), r.len()) };
        Ok(())
    }

    fn wait(&self, b: usize) -> Result<()> {
        self.0.wait(b)
    }

    fn queue(&self, j: usize, b: usize) -> Result<()> {
        let c = &self.0;
        let r = c.chunks[j].clone();
        // SAFETY: the buffer was filled for chunk j and is not written again before the event
        // recorded next completes; the device range lies in a live allocation (the pool
        // checked the whole copy and holds the block until it returns).
        let filled = unsafe { std::slice::from_raw_parts(c.buffer(j, b), r.len()) };
        // SAFETY: as above; the stream is this copy's.
        unsafe { result::memcpy_htod_async(c.addr + r.start as u64, filled, c.stream) }
            .map_err(|e| copy_error(c.device, "copying to the device", e))?;
        c.record(b)
    }
}

impl Stages for Download<'_> {
    fn host(&self, j: usize, b: usize) -> Result<()> {
        let c = &self.0;
        let r = c.chunks[j].clone();
        // SAFETY: the DMA of chunk j into this buffer is done (the pipeline waited for its
        // event) and no other DMA is queued on it before this step ends; `r` lies in the
        // destination and no other step writes it.
        unsafe { std::ptr::copy_nonoverlapping(c.buffer(j, b), c.host.add(r.start), r.len()) };
        Ok(())
    }

    fn wait(&self, b: usize) -> Result<()> {
        self.0.wait(b)
    }

    fn queue(&self, j: usize, b: usize) -> Result<()> {
        let c = &self.0;
        let r = c.chunks[j].clone();
        // SAFETY: the buffer holds `r.len()` bytes and nothing reads it until the event
        // recorded next completes (the previous chunk in it was copied out: the pipeline waited).
        let into = unsafe { std::slice::from_raw_parts_mut(c.buffer(j, b), r.len()) };
        // SAFETY: the device range lies in a live allocation (checked by the pool); the stream
        // is this copy's.
        unsafe { result::memcpy_dtoh_async(into, c.addr + r.start as u64, c.stream) }
            .map_err(|e| copy_error(c.device, "copying to the host", e))?;
        c.record(b)
    }
}

impl CudaStorage {
    /// Uploads `src` to device address `dst` through the pinned buffers; `None` if pinned
    /// memory is short (the caller copies from pageable memory instead). The context is current.
    pub(crate) fn write_staged(&self, o: &Opened, dst: u64, src: &[u8]) -> Option<Result<()>> {
        let device = crate::storage::Storage::device(self);
        let mut staging = lock(&self.pinned.upload);
        match self.pinned.ensure(&mut staging, self.tuning.get(), true, device) {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => return Some(Err(e)),
        }
        let chunks = self.tuning.plan(src.len());
        Some(self.staged(
            o,
            Way::Up,
            &staging,
            &chunks,
            dst,
            src.as_ptr().cast_mut(),
            "copying to the device",
        ))
    }

    /// Downloads `dst.len()` bytes at device address `src` through the pinned buffers; `None`
    /// if pinned memory is short. The context is current.
    pub(crate) fn read_staged(&self, o: &Opened, dst: &mut [u8], src: u64) -> Option<Result<()>> {
        let device = crate::storage::Storage::device(self);
        let mut staging = lock(&self.pinned.download);
        match self.pinned.ensure(&mut staging, self.tuning.get(), false, device) {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => return Some(Err(e)),
        }
        let chunks = self.tuning.plan(dst.len());
        Some(self.staged(o, Way::Down, &staging, &chunks, src, dst.as_mut_ptr(), "copying to the host"))
    }

    #[allow(clippy::too_many_arguments)]
    fn staged(
        &self,
        o: &Opened,
        way: Way,
        staging: &Staging,
        chunks: &[Range<usize>],
        addr: u64,
        host: *mut u8,
        what: &str,
    ) -> Result<()> {
        let device = crate::storage::Storage::device(self);
        // Whatever happens below, no DMA from or into these buffers is left running on return.
        let lease = o.streams.lease()?;
        let copy =
            Copy { ctx: &o.ctx, device, slots: &staging.slots, chunks, stream: lease.stream(), addr, host };
        let t = self.tuning.get();
        let n = staging.slots.len();
        let ran = match way {
            Way::Up => {
                pipeline::run(way, chunks.len(), n, &self.pinned.pool, t.threads, &Upload(copy), device)
            }
            Way::Down => {
                pipeline::run(way, chunks.len(), n, &self.pinned.pool, t.threads, &Download(copy), device)
            }
        };
        ran?;
        lease.finish(what)
    }
}
