//! Large host<->device copies through pinned staging buffers, with the host side of each chunk
//! split across a small thread pool.
//!
//! One thread copying each chunk is capped by a single core's memcpy (~8-15 GB/s), below a
//! PCIe Gen5 link (~50 GB/s pinned). So each chunk's host copy runs on [`CopyTuning::threads`]
//! threads, into one of [`CopyTuning::buffers`] pinned buffers, while the DMA engine moves the
//! chunks before it: upload = fill buffer i, DMA it, fill buffer i+1 (after the DMA that last
//! read it); download = DMA several chunks ahead, copy each out once its event has fired.
//! Copies from 1 MiB (the threshold) take this path; a copy is split into at least as many
//! chunks as there are buffers (of at least 1 MiB), so 1-8 MiB copies overlap too.
//!
//! Every copy returns once its data are where they were sent (the stream is synchronised):
//! the trait's promise, so that a kernel on another stream right after never sees stale data.
#![allow(unsafe_code)] // at the edge: every unsafe block has a SAFETY note

use std::sync::{Arc, Mutex};

use cudarc::driver::sys;
use cudarc::driver::{result, CudaEvent, PinnedHostSlice};
use rayon::prelude::*;

use super::context::Opened;
use super::storage::{CudaStorage, SyncOnDrop};
use crate::error::Result;
use crate::sync::lock;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).filter(|&v| v > 0).unwrap_or(default)
}

/// How large copies are staged; every field can be set by environment variable, so that one
/// short GPU run can sweep them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyTuning {
    /// Copies of at least this many bytes go through pinned staging (`DEVALLOC_CUDA_THRESHOLD`,
    /// default 1 MiB); smaller ones copy from pageable memory directly.
    pub pinned_threshold: usize,
    /// Bytes of one pinned buffer, the largest chunk (`DEVALLOC_CUDA_CHUNK`, default 8 MiB).
    pub chunk: usize,
    /// Pinned buffers per direction (`DEVALLOC_CUDA_BUFFERS`, default 4).
    pub buffers: usize,
    /// Threads that copy each chunk on the host (`DEVALLOC_CUDA_THREADS`, default 4).
    pub threads: usize,
}

impl CopyTuning {
    /// The defaults, overridden by the `DEVALLOC_CUDA_*` variables that are set.
    pub fn from_env() -> Self {
        CopyTuning {
            pinned_threshold: env("DEVALLOC_CUDA_THRESHOLD", 1 << 20),
            chunk: env("DEVALLOC_CUDA_CHUNK", 8 << 20),
            buffers: env("DEVALLOC_CUDA_BUFFERS", 4),
            threads: env("DEVALLOC_CUDA_THREADS", 4),
        }
        .checked()
    }

    /// The same, within what works: 2 buffers at least, chunks of 64 KiB at least (4 KiB
    /// multiples), 1 thread at least, a threshold of 1 byte at least.
    pub fn checked(self) -> Self {
        CopyTuning {
            pinned_threshold: self.pinned_threshold.max(1),
            chunk: self.chunk.max(64 << 10).next_multiple_of(4096),
            buffers: self.buffers.max(2),
            threads: self.threads.max(1),
        }
    }

    /// The chunk of a copy of `len` bytes: at least as many chunks as buffers, of 1 MiB at
    /// least (or the whole chunk, if smaller), of `chunk` at most.
    fn chunk_for(&self, len: usize) -> usize {
        len.div_ceil(self.buffers.max(1)).max(1 << 20).min(self.chunk.max(4096))
    }
}

impl Default for CopyTuning {
    fn default() -> Self {
        Self::from_env()
    }
}

/// Pinned buffers of one direction and the events that say when the DMA using each is done.
#[derive(Default)]
pub(crate) struct Staging {
    bufs: Vec<(PinnedHostSlice<u8>, CudaEvent)>,
}

/// The pinned buffers of both directions, and the pool that copies on the host.
pub(crate) struct Pinned {
    pub upload: Mutex<Staging>,
    pub download: Mutex<Staging>,
    pub pool: Arc<rayon::ThreadPool>,
}

impl Pinned {
    pub(crate) fn new(pool: Arc<rayon::ThreadPool>) -> Self {
        Pinned { upload: Mutex::default(), download: Mutex::default(), pool }
    }

    /// Bytes of pinned host memory held.
    pub(crate) fn bytes(&self) -> u64 {
        let held = |m: &Mutex<Staging>| lock(m).bufs.iter().map(|(b, _)| b.num_bytes() as u64).sum::<u64>();
        held(&self.upload) + held(&self.download)
    }
}

/// Copies `src` into `dst` (same length) on the pool's threads. A caller that is itself a
/// rayon worker copies alone: `install` from a worker would run other jobs of its pool while
/// waiting, and one of them could call back into devalloc and wait for a lock this thread holds.
fn parallel_copy(pool: &rayon::ThreadPool, threads: usize, dst: &mut [u8], src: &[u8]) {
    let piece = dst.len().div_ceil(threads.max(1)).next_multiple_of(4096).max(256 << 10);
    if threads <= 1 || dst.len() <= piece || rayon::current_thread_index().is_some() {
        dst.copy_from_slice(src);
        return;
    }
    pool.install(|| {
        dst.par_chunks_mut(piece).zip(src.par_chunks(piece)).for_each(|(d, s)| d.copy_from_slice(s))
    });
}

impl CudaStorage {
    /// Makes sure `staging` holds the pinned buffers. Upload buffers are write-combined (fast
    /// for the host to write and the DMA to read); download ones are not (the host reads them).
    fn ensure(&self, o: &Opened, staging: &mut Staging, write_combined: bool) -> Result<()> {
        let tuning = &self.tuning;
        while staging.bufs.len() < tuning.buffers {
            let flags = if write_combined { sys::CU_MEMHOSTALLOC_WRITECOMBINED } else { 0 };
            // SAFETY: the buffer is only read by the host after a DMA into it completed, or
            // written before a DMA from it: never read while uninitialised.
            let buf = unsafe { o.ctx.alloc_pinned_with_flags::<u8>(tuning.chunk, flags) }.map_err(|e| {
                super::errors::driver_error(
                    crate::storage::Storage::device(self),
                    "allocating pinned host staging",
                    e,
                    tuning.chunk as u64,
                )
            })?;
            let ev = o.ctx.new_event(None).map_err(|e| self.err("creating an event", e))?;
            staging.bufs.push((buf, ev));
        }
        Ok(())
    }

    /// Uploads `src` to device address `dst` through the pinned buffers; returns once the data
    /// are on the device.
    pub(crate) fn write_pinned(&self, o: &Opened, dst: u64, src: &[u8]) -> Result<()> {
        let pinned = &self.pinned;
        let mut staging = lock(&pinned.upload);
        self.ensure(o, &mut staging, true)?;
        // Whatever happens below, no DMA from these buffers is left running on return.
        let _finished = SyncOnDrop(o.stream.cu_stream());
        let n = staging.bufs.len();
        let chunk = self.tuning.chunk_for(src.len());
        for (i, piece) in src.chunks(chunk).enumerate() {
            let (buf, ev) = &mut staging.bufs[i % n];
            // The DMA that last read this buffer must be done before it is refilled (free when
            // the event has fired, or was never recorded).
            ev.synchronize().map_err(|e| self.err("waiting for staging", e))?;
            let host = buf.as_mut_slice().map_err(|e| self.err("pinned staging", e))?;
            parallel_copy(&pinned.pool, self.tuning.threads, &mut host[..piece.len()], piece);
            let at = dst + (i * chunk) as u64;
            // SAFETY: `at..at + piece.len()` lies in a live allocation (the pool checked the
            // range and holds the block); the source is pinned memory owned by `staging`, which
            // is not written again before `ev` (recorded right after) has completed.
            unsafe { result::memcpy_htod_async(at, &host[..piece.len()], o.stream.cu_stream()) }
                .map_err(|e| self.err("copying to the device", e))?;
            ev.record(&o.stream).map_err(|e| self.err("recording an event", e))?;
        }
        self.sync(o)
    }

    /// Downloads `dst.len()` bytes at device address `src` through the pinned buffers, DMA
    /// running ahead of the host copies.
    pub(crate) fn read_pinned(&self, o: &Opened, dst: &mut [u8], src: u64) -> Result<()> {
        let pinned = &self.pinned;
        let mut staging = lock(&pinned.download);
        self.ensure(o, &mut staging, false)?;
        let _finished = SyncOnDrop(o.stream.cu_stream());
        let n = staging.bufs.len();
        let total = dst.len();
        let chunk = self.tuning.chunk_for(total);
        let count = total.div_ceil(chunk);
        let issue = |staging: &mut Staging, i: usize| -> Result<()> {
            let len = (total - i * chunk).min(chunk);
            let (buf, ev) = &mut staging.bufs[i % n];
            let host = buf.as_mut_slice().map_err(|e| self.err("pinned staging", e))?;
            // SAFETY: the device range lies in a live allocation (checked by the pool); the
            // destination is pinned memory we own, read only after `ev` completes.
            unsafe {
                result::memcpy_dtoh_async(&mut host[..len], src + (i * chunk) as u64, o.stream.cu_stream())
            }
            .map_err(|e| self.err("copying to the host", e))?;
            ev.record(&o.stream).map_err(|e| self.err("recording an event", e))
        };
        for i in 0..n.min(count) {
            issue(&mut staging, i)?;
        }
        for i in 0..count {
            {
                let (buf, ev) = &staging.bufs[i % n];
                ev.synchronize().map_err(|e| self.err("waiting for the download", e))?;
                let host = buf.as_slice().map_err(|e| self.err("pinned staging", e))?;
                let part = &mut dst[i * chunk..((i + 1) * chunk).min(total)];
                let len = part.len();
                parallel_copy(&pinned.pool, self.tuning.threads, part, &host[..len]);
            }
            if i + n < count {
                issue(&mut staging, i + n)?;
            }
        }
        Ok(())
    }
}
