//! Small uploads through the queue's own staging (`queue.write_buffer`), which is wgpu's, not
//! the belt's: the belt (`belt.rs`) sends an upload here up to `Tuning::small_upload` bytes.
//! And [`Pieces`], the walk over an upload's parts that both use.

use std::sync::atomic::{AtomicU64, Ordering};

use super::gpu::{Gpu, Raises};
use crate::error::Result;

/// Bytes of small uploads after which the queue is flushed (wgpu's staging stays bounded).
const FLUSH_PENDING: u64 = 8 << 20;

/// The queue's staging as the belt uses it: the largest upload it takes, and the bytes sent
/// since the queue was last flushed.
pub(crate) struct QueueUploads {
    /// Uploads up to this many bytes come here.
    pub max: u64,
    pending: AtomicU64,
}

impl QueueUploads {
    /// Small uploads up to `max` bytes.
    pub(crate) fn new(max: u64) -> Self {
        QueueUploads { max, pending: AtomicU64::new(0) }
    }

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
    pub(crate) fn upload(
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
        let before = self.pending.fetch_add(total, Ordering::Relaxed);
        if before + total >= FLUSH_PENDING {
            self.pending.store(0, Ordering::Relaxed);
            gpu.flush_queued_writes()?;
        }
        Ok(())
    }
}

/// Walks a list of byte slices as one stream.
pub(crate) struct Pieces<'a> {
    parts: &'a [&'a [u8]],
    part: usize,
    at: usize,
}

impl<'a> Pieces<'a> {
    pub(crate) fn new(parts: &'a [&'a [u8]]) -> Self {
        Pieces { parts, part: 0, at: 0 }
    }

    /// The next contiguous piece, at most `max` bytes.
    pub(crate) fn next_piece(&mut self, max: usize) -> &'a [u8] {
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
