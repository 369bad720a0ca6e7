//! The staging belt: how host<->device copies reach a GPU buffer that the host cannot map.
//! One type, [`Belt`], in one file: its state, then its protocols (uploads, downloads), then
//! how it takes and gives back staging buffers, top to bottom (as wgpu's own `StagingBelt`).
//! Small uploads go through the queue's own staging instead, in `queue_upload.rs`.
//!
//! # Protocol
//!
//! A GPU buffer is never mapped while the GPU may use it, so copies go through *staging*
//! buffers, which the belt keeps and reuses:
//!
//! - **Small uploads** (up to 64 KiB natively but none on GL, up to 4 MiB on WebGL2; every upload on
//!   browser WebGPU, where `writeBuffer` copies straight out of wasm memory) go through the
//!   queue's own staging (`write_buffer_with`, or `write_buffer` on WebGPU), which is wgpu's;
//!   they travel with the next submit, and after 8 MiB of them the queue is flushed so that
//!   wgpu's staging stays bounded.
//! - **Large uploads**, chunk by chunk: take a *mapped* `MAP_WRITE` buffer (one whose re-map
//!   has completed, or a new one mapped at creation), write the chunk into it, unmap, encode
//!   `copy_buffer_to_buffer`, submit, and ask for it to be mapped again; it waits in the
//!   in-flight queue until its map callback (fired by whoever polls next) says the GPU is done
//!   with it; one not back yet is passed over for a new buffer while within the budget. The
//!   call returns once everything is submitted: queue order makes every later operation see
//!   the data.
//! - **Downloads**: copy a chunk into an idle `MAP_READ` buffer, submit, `map_async`; up to
//!   [`PIPELINE_DEPTH`] chunks are in flight, so the GPU copies chunk i+1 while the host reads
//!   chunk i; then unmap and put the buffer back. Download buffers come in power-of-two sizes
//!   from 64 KiB (or the device's largest buffer, if smaller) to a chunk, and a read takes an
//!   idle one of its own size class (the smallest that holds it), or makes one: mapping a few
//!   bytes of a chunk-sized buffer measured slower. On WebGL2 a read up to 1 MiB takes a
//!   buffer of its own instead (see `options::Tuning`).
//! - **Ragged ranges**: wgpu copies 4-byte words at 4-byte offsets. A read copies the
//!   enclosing words and keeps the wanted bytes; a write reads the (at most two) edge words
//!   first and writes them back merged, under the block's lock, so neighbouring bytes are kept.
//!
//! # Budget
//!
//! The belt counts the bytes of every staging buffer it holds ([`Belt::bytes`], reported as
//! `AllocatorStats::staging_bytes`). A buffer coming back while the belt holds more than its
//! budget is released instead of kept, and a large upload that would take a new buffer past
//! the budget waits for its oldest in-flight chunk instead (where waiting is allowed: not in a
//! blocking call in the browser). Downloads in flight can pass the budget by at most
//! [`PIPELINE_DEPTH`] chunks per concurrent download, and an upload that finds every kept
//! buffer in another thread's hands takes a new one: so with concurrent copies the belt can
//! hold up to one chunk per upload and [`PIPELINE_DEPTH`] per download in flight beyond the
//! budget; once they are done it holds again. The count is a gauge of what is held: a call
//! that fails (say, on a lost device) can release staging, never take more.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::block::{ceil4, floor4, WgpuBlock, COPY_ALIGN};
use super::gpu::Gpu;
use super::mapping::{Map, Outcome};
use super::options::Tuning;
use super::platform::{Current, Platform};
use super::queue_upload::{Pieces, QueueUploads};
use crate::bounce::{yield_now, Mode};
use crate::error::{Error, Result};
use crate::sync::lock;

/// Chunks of a download in flight at once.
pub(crate) const PIPELINE_DEPTH: usize = 3;
/// Size of the staging buffers of small reads.
const SMALL_DOWNLOAD: u64 = 64 << 10;

/// A staging buffer, counted in its belt's bytes while it exists.
pub(crate) struct Staging {
    pub(super) buffer: wgpu::Buffer,
    bytes: Arc<AtomicU64>,
}

impl Drop for Staging {
    fn drop(&mut self) {
        self.bytes.fetch_sub(self.buffer.size(), Ordering::Relaxed);
    }
}

/// An upload buffer being mapped again after its copy: its map's callback says when the GPU
/// is done with it.
struct Remapping {
    staging: Staging,
    map: Map,
    /// The submission of the copy out of it.
    index: Option<wgpu::SubmissionIndex>,
}

#[derive(Default)]
struct Kept {
    uploads: VecDeque<Remapping>,
    /// Idle download buffers, of power-of-two sizes from `small` to the chunk.
    downloads: Vec<Staging>,
}

/// Reusable staging buffers of one device; see the module docs for the protocol. It holds
/// its buffers and takes the device ([`Gpu`]) per call, as wgpu's `StagingBelt` does.
pub(crate) struct Belt {
    /// Bytes of one staging buffer: one chunk of a large copy.
    pub chunk: u64,
    small: u64,
    /// Uploads up to its size go through the queue's own staging.
    small_uploads: QueueUploads,
    /// Downloads up to this size get a staging buffer of their own (see `options::Tuning`).
    fresh_downloads: u64,
    budget: u64,
    bytes: Arc<AtomicU64>,
    kept: Mutex<Kept>,
}

impl Belt {
    /// A belt tuned by `tuning`, holding at most `budget` bytes (8 chunks when `None`).
    pub(crate) fn new(tuning: &Tuning, budget: Option<u64>, max_buffer: u64) -> Self {
        Belt {
            chunk: tuning.chunk,
            small: SMALL_DOWNLOAD.min(max_buffer),
            small_uploads: QueueUploads::new(tuning.small_upload),
            fresh_downloads: tuning.fresh_downloads,
            budget: budget.unwrap_or(8 * tuning.chunk),
            bytes: Arc::default(),
            kept: Mutex::default(),
        }
    }

    /// Bytes of staging buffers held now.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    fn over_budget(&self) -> bool {
        self.bytes() > self.budget
    }

    fn make(
        &self,
        gpu: &Gpu,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
        mapped: bool,
    ) -> Result<Staging> {
        let buffer = gpu.create(label, size, usage, mapped)?;
        self.bytes.fetch_add(size, Ordering::Relaxed);
        Ok(Staging { buffer, bytes: Arc::clone(&self.bytes) })
    }

    // --- The protocols: uploads (small and large) and downloads. ---

    /// Uploads the bytes of `parts` (concatenated, whole words) to `dst[at..]`: small ones
    /// through the queue, large ones through the belt. The call returns once everything is
    /// submitted: queue order makes every later operation see the data.
    pub(crate) async fn upload(
        &self,
        gpu: &Gpu,
        dst: &wgpu::Buffer,
        at: u64,
        parts: &[&[u8]],
        mode: Mode,
    ) -> Result<()> {
        let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
        debug_assert!(at.is_multiple_of(COPY_ALIGN) && total.is_multiple_of(COPY_ALIGN));
        let Some(size) = wgpu::BufferSize::new(total) else { return Ok(()) };
        if total <= self.small_uploads.max {
            return self.small_uploads.upload(gpu, dst, at, parts, size);
        }
        // The chunks below do not wait, and on a destroyed device wgpu drops them silently. In
        // the browser's WebGPU a loss is known from the device's `lost` promise: look first.
        // Where wgpu-core runs, its refusal to map a staging buffer again says it (below).
        if !gpu.core {
            gpu.check_lost()?;
        }
        let mut src = Pieces::new(parts);
        let mut done = 0;
        let mut remapped = None;
        while done < total {
            let n = (total - done).min(self.chunk);
            let staging = self.take_upload(gpu, mode).await?;
            {
                let mut view = staging
                    .buffer
                    .get_mapped_range_mut(0..n)
                    // A buffer made on a device that is no longer valid is invalid itself.
                    .map_err(|e| {
                        log::debug!("devalloc: upload staging: {e}");
                        gpu.settle_loss()
                    })?;
                let mut filled = 0usize;
                while (filled as u64) < n {
                    let piece = src.next_piece((n as usize) - filled);
                    view.slice(filled..filled + piece.len()).copy_from_slice(piece);
                    filled += piece.len();
                }
            }
            gpu.unmap(&staging.buffer);
            let index = gpu.submit("devalloc upload", |enc| {
                enc.copy_buffer_to_buffer(&staging.buffer, 0, dst, at + done, n)
            })?;
            remapped = self.recycle_upload(gpu, staging, index);
            done += n;
            if done < total && mode == Mode::Async {
                yield_now().await;
            }
        }
        match remapped {
            Some(true) => Ok(()),
            // wgpu refused to map the staging again: the device is gone.
            Some(false) => Err(gpu.settle_loss()),
            // Not asked (past the budget), or the browser's WebGPU: poll for a loss.
            None => gpu.check_lost(),
        }
    }

    /// Reads `dst.len()` bytes at `offset` of `block` (any offset and length: the enclosing
    /// words are copied) through staging, chunked and pipelined; `OutOfMemory`, with nothing
    /// written to `dst`, once the browser has refused the block.
    pub(crate) async fn download(
        &self,
        gpu: &Gpu,
        block: &WgpuBlock,
        offset: u64,
        dst: &mut [u8],
        mode: Mode,
    ) -> Result<()> {
        let src = &block.buffer;
        let end = offset + dst.len() as u64;
        let (a0, a1) = (floor4(offset), ceil4(end));
        let total = a1 - a0;
        let mut inflight = VecDeque::new();
        let mut pos = 0;
        while pos < total || !inflight.is_empty() {
            while pos < total && inflight.len() < PIPELINE_DEPTH {
                let n = (total - pos).min(self.chunk);
                let staging = self.take_download(gpu, n)?;
                let index = gpu.submit("devalloc download", |enc| {
                    enc.copy_buffer_to_buffer(src, a0 + pos, &staging.buffer, 0, n)
                })?;
                let map = Map::request(gpu, &staging.buffer, wgpu::MapMode::Read, 0..n, true)?;
                inflight.push_back((staging, pos, n, map, index));
                pos += n;
                // Async: one step per poll, a submission (which a software device may run
                // inline) or a chunk's copy-out, so the pipeline fills over a few polls.
                if mode == Mode::Async && inflight.len() < PIPELINE_DEPTH && pos < total {
                    yield_now().await;
                }
            }
            let Some((staging, cpos, n, mut map, index)) = inflight.pop_front() else { break };
            map.wait(gpu, index, mode).await?;
            if block.refused.load(Ordering::Acquire) {
                // The browser could not make the block: the copy into staging did nothing, and
                // what staging holds is some earlier download's. Nothing reaches `dst`.
                gpu.unmap(&staging.buffer);
                self.return_download(staging);
                return Err(Error::OutOfMemory {
                    requested: dst.len() as u64,
                    device: gpu.id,
                    detail: "the browser could not make the buffer read from".into(),
                });
            }
            {
                let view = staging
                    .buffer
                    .get_mapped_range(0..n)
                    .map_err(|e| gpu.backend_error("download staging", e))?;
                // The chunk covers [a0 + cpos, a0 + cpos + n); keep its part inside [offset, end).
                let lo = (a0 + cpos).max(offset);
                let hi = (a0 + cpos + n).min(end);
                dst[(lo - offset) as usize..(hi - offset) as usize]
                    .copy_from_slice(&view[(lo - a0 - cpos) as usize..(hi - a0 - cpos) as usize]);
            }
            gpu.unmap(&staging.buffer);
            self.return_download(staging);
            if (pos < total || !inflight.is_empty()) && mode == Mode::Async {
                yield_now().await;
            }
        }
        Ok(())
    }

    // --- Taking and giving back staging buffers. ---

    /// A mapped upload buffer: a re-mapped one, a new one within the budget, or (past it) the
    /// oldest in flight once it is back.
    pub(super) async fn take_upload(&self, gpu: &Gpu, mode: Mode) -> Result<Staging> {
        loop {
            let front = lock(&self.kept).uploads.pop_front();
            let Some(mut r) = front else { break };
            match r.map.outcome() {
                Outcome::Mapped => return Ok(r.staging),
                Outcome::Refused => continue, // dropped: not reusable
                // Not back yet (the callback comes from a poll: the app's, the polling
                // thread's, or a wait's): a new buffer within the budget, else wait for it.
                Outcome::Pending => {
                    let within = self.bytes() + self.chunk <= self.budget;
                    if within || (mode == Mode::Blocking && !Current::CAN_BLOCK) {
                        lock(&self.kept).uploads.push_front(r);
                        break;
                    }
                    r.map.wait(gpu, r.index.take(), mode).await?;
                    return Ok(r.staging);
                }
            }
        }
        let usage = wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC;
        self.make(gpu, "devalloc upload staging", self.chunk, usage, true)
    }

    /// Maps an upload buffer again after its copy, or releases it past the budget. `Some(false)`
    /// when wgpu refused the map at once (wgpu-core does so on a device that is no longer
    /// valid), `None` when it was not asked for.
    pub(super) fn recycle_upload(
        &self,
        gpu: &Gpu,
        staging: Staging,
        index: Option<wgpu::SubmissionIndex>,
    ) -> Option<bool> {
        if self.over_budget() {
            return None;
        }
        let size = staging.buffer.size();
        let Ok(map) = Map::request(gpu, &staging.buffer, wgpu::MapMode::Write, 0..size, true) else {
            return Some(false);
        };
        if map.outcome() == Outcome::Refused {
            return Some(false);
        }
        lock(&self.kept).uploads.push_back(Remapping { staging, map, index });
        Some(true)
    }

    /// The size of the download buffer for `n` bytes: the power of two at or above it, within
    /// `small..=chunk`.
    fn download_size(&self, n: u64) -> u64 {
        n.max(self.small).checked_next_power_of_two().unwrap_or(self.chunk).min(self.chunk)
    }

    /// An idle download buffer that holds `n` bytes: the smallest kept one of the right size,
    /// or a new one.
    pub(super) fn take_download(&self, gpu: &Gpu, n: u64) -> Result<Staging> {
        let usage = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
        if n <= self.fresh_downloads {
            return self.make(gpu, "devalloc download staging", ceil4(n), usage, false);
        }
        let size = self.download_size(n);
        let kept = {
            let mut kept = lock(&self.kept);
            let at = kept.downloads.iter().position(|b| b.buffer.size() == size);
            at.map(|i| kept.downloads.swap_remove(i))
        };
        if let Some(b) = kept {
            return Ok(b);
        }
        self.make(gpu, "devalloc download staging", size, usage, false)
    }

    /// Puts a download buffer back, or releases it past the budget.
    pub(super) fn return_download(&self, b: Staging) {
        if self.over_budget() || b.buffer.size() <= self.fresh_downloads {
            return;
        }
        lock(&self.kept).downloads.push(b);
    }
}
