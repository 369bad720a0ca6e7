//! The staged route's two protocols on a [`Belt`]: uploads (small ones through the queue's own
//! staging, large ones chunk by chunk through mapped upload buffers) and downloads (chunked
//! and pipelined through `MAP_READ` buffers). See `belt.rs` for the protocol and the budget.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use super::belt::{Belt, PIPELINE_DEPTH};
use super::block::WgpuBlock;
use super::block::{ceil4, floor4, COPY_ALIGN};
use super::gpu::{Gpu, Raises};
use crate::bounce::{yield_now, Mode};
use crate::error::{Error, Result};

/// Bytes of small uploads after which the queue is flushed.
const FLUSH_PENDING: u64 = 8 << 20;

impl Belt {
    /// An upload through the queue's own staging (`queue.write_buffer`), which the next
    /// submission carries.
    ///
    /// Where wgpu-core runs (native, and WebGL2 in the browser) it goes through
    /// `write_buffer_with`, which returns `None` on a destroyed or lost device (wgpu checks the
    /// device first, and keeps device-lost errors out of its error handlers): that is how a
    /// small upload notices a loss without the poll every other call makes up front, which on
    /// GL takes the context lock and costs more than a 4 KiB upload's own work. On browser
    /// WebGPU `write_buffer` copies straight out of wasm memory, and the device's `lost`
    /// promise reports a loss: it polls first as every call does.
    fn upload_small(
        &self,
        gpu: &Gpu,
        dst: &wgpu::Buffer,
        at: u64,
        parts: &[&[u8]],
        size: wgpu::BufferSize,
    ) -> Result<()> {
        let total = size.get();
        if !gpu.core {
            gpu.check_lost()?;
        }
        // Where wgpu-core runs, out of memory for the queue's staging is caught here, so `None`
        // below is a device that is no longer valid. (On browser WebGPU a scope is a round trip
        // into JS, and `write_buffer` is checked up front: no scope, as for every copy there.)
        let raises = if gpu.core { Raises::ValidationOrOom } else { Raises::Validation };
        let written = gpu.scoped("devalloc small upload", total, raises, || match parts {
            [whole] if !gpu.core => {
                gpu.queue.write_buffer(dst, at, whole);
                true
            }
            _ => {
                let Some(mut view) = gpu.queue.write_buffer_with(dst, at, size) else {
                    return false;
                };
                let mut filled = 0;
                for p in parts {
                    view.slice(filled..filled + p.len()).copy_from_slice(p);
                    filled += p.len();
                }
                true
            }
        })?;
        if !written {
            // Where wgpu-core runs, every other refusal was caught by the scope: the device is
            // no longer valid, and reports its loss once its queue is done. (On browser WebGPU
            // nothing was scoped: say only that wgpu refused.)
            if !gpu.core {
                return Err(gpu.backend_error("small upload", "wgpu refused the write"));
            }
            return Err(gpu.settle_loss());
        }
        gpu.note_queued_write();
        let before = self.pending_small.fetch_add(total, Ordering::Relaxed);
        if before + total >= FLUSH_PENDING {
            self.pending_small.store(0, Ordering::Relaxed);
            gpu.flush_queued_writes()?;
        }
        Ok(())
    }

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
        if total <= self.small_upload {
            return self.upload_small(gpu, dst, at, parts, size);
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
                let mapped = gpu.map(&staging.buffer, wgpu::MapMode::Read, 0..n)?;
                inflight.push_back((staging, pos, n, mapped, index));
                pos += n;
                // Async: one step per poll, a submission (which a software device may run
                // inline) or a chunk's copy-out, so the pipeline fills over a few polls.
                if mode == Mode::Async && inflight.len() < PIPELINE_DEPTH && pos < total {
                    yield_now().await;
                }
            }
            let Some((staging, cpos, n, mapped, index)) = inflight.pop_front() else { break };
            gpu.wait_mapped(mapped, index, mode).await?;
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
}

/// Walks a list of byte slices as one stream.
struct Pieces<'a> {
    parts: &'a [&'a [u8]],
    part: usize,
    at: usize,
}

impl<'a> Pieces<'a> {
    fn new(parts: &'a [&'a [u8]]) -> Self {
        Pieces { parts, part: 0, at: 0 }
    }

    /// The next contiguous piece, at most `max` bytes.
    fn next_piece(&mut self, max: usize) -> &'a [u8] {
        while self.part < self.parts.len() && self.at == self.parts[self.part].len() {
            self.part += 1;
            self.at = 0;
        }
        let Some(p) = self.parts.get(self.part) else { return &[] };
        let n = (p.len() - self.at).min(max);
        let piece = &p[self.at..self.at + n];
        self.at += n;
        piece
    }
}
