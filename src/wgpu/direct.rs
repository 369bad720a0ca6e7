//! The direct route: on adapters whose memory the host shares (CPU, integrated) and that offer
//! `MAPPABLE_PRIMARY_BUFFERS`, host<->device copies map the buffer itself, no staging.
//!
//! A mapped buffer cannot be used by the GPU, so the block's lock keeps a mapping and the GPU
//! copies devalloc queues on the block apart, and each copy maps only the words it touches
//! (from an 8-byte boundary, as wgpu asks) and unmaps before returning. Work the app itself
//! queues on a devalloc buffer must be finished (or not yet submitted) when it copies through
//! devalloc on this route: wgpu refuses to submit work on a mapped buffer.

use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use super::storage::{ceil4, WgpuBlock, WgpuStorage};
use crate::bounce::{yield_now, Mode};
use crate::error::Result;

/// Unmaps a buffer when dropped, unless the map it guards failed (then the mapping state is
/// not devalloc's: say, the app had mapped the buffer itself, and keeps its mapping).
pub(crate) struct Unmap<'a> {
    pub storage: &'a WgpuStorage,
    pub buffer: &'a wgpu::Buffer,
    pub armed: bool,
}

impl Drop for Unmap<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.storage.unmap(self.buffer);
        }
    }
}

impl WgpuStorage {
    /// Maps the words around `offset..offset + len` of the block itself, runs `f` on each piece
    /// of it (at most a staging chunk: the buffer, the piece's range in it, where the wanted
    /// bytes start in that piece, and which of the caller's bytes it holds), giving the
    /// executor back between pieces when async, and unmaps.
    async fn with_mapped(
        &self,
        block: &WgpuBlock,
        map_mode: wgpu::MapMode,
        offset: u64,
        len: usize,
        mode: Mode,
        mut f: impl FnMut(
            &wgpu::Buffer,
            Range<u64>,
            usize,
            Range<usize>,
        ) -> std::result::Result<(), wgpu::MapRangeError>,
    ) -> Result<()> {
        let range = offset & !(wgpu::MAP_ALIGNMENT - 1)..ceil4(offset + len as u64);
        let _guard = block.lock.lock().await;
        let (tx, mapped) = futures_channel::oneshot::channel();
        self.map_block(block, map_mode, range.clone(), move |r| {
            let _ = tx.send(r);
        })?;
        // Unmapped whatever happens, a future dropped half-way included: a buffer left mapped
        // could never be used by the GPU again.
        // (Armed while the map is pending too: unmapping cancels a pending map.)
        let mut unmap = Unmap { storage: self, buffer: &block.buffer, armed: true };
        // The wait polls the device, which fires the lost callback of a lost device; a map on
        // a lost device fails at once. So no poll up front: on failure, name the loss.
        let waited = match super::platform::wait(self, mapped, None, mode, false).await {
            Ok(Err(e)) => {
                // wgpu refused the map (say, the app had mapped the buffer): not ours to unmap.
                unmap.armed = false;
                Err(self.backend_error("mapping a buffer", e))
            }
            other => other.map(drop),
        };
        self.or_lost(waited)?;
        // Pieces start at multiples of 8 from the range's start, as wgpu's mapped views must.
        let piece = self.belt.chunk.max(wgpu::MAP_ALIGNMENT) & !(wgpu::MAP_ALIGNMENT - 1);
        let end = offset + len as u64;
        let mut at = range.start;
        while at < range.end {
            let next = (at + piece).min(range.end);
            let (lo, hi) = (at.max(offset), next.min(end));
            let r = f(
                &block.buffer,
                at..next,
                (lo - at) as usize,
                (lo - offset) as usize..(hi - offset) as usize,
            )
            .map_err(|e| self.backend_error("mapping a device buffer", e));
            self.or_lost(r)?;
            at = next;
            if at < range.end && mode == Mode::Async {
                yield_now().await;
            }
        }
        Ok(())
    }

    /// The blocking twin of `with_mapped`, without futures: a blocking copy on this route
    /// is a few hundred ns of work, and the async machinery (channel, nested state machines,
    /// the block's lock as a future) measured ~150 ns of it. The same steps, in the same order.
    fn with_mapped_blocking(
        &self,
        block: &WgpuBlock,
        map_mode: wgpu::MapMode,
        offset: u64,
        len: usize,
        f: impl FnOnce(&wgpu::Buffer, Range<u64>, usize) -> std::result::Result<(), wgpu::MapRangeError>,
    ) -> Result<()> {
        const PENDING: u8 = 0;
        const MAPPED: u8 = 1;
        const REFUSED: u8 = 2;
        let range = offset & !(wgpu::MAP_ALIGNMENT - 1)..ceil4(offset + len as u64);
        let _guard = crate::bounce::run_blocking(block.lock.lock());
        let state = Arc::new(AtomicU8::new(PENDING));
        let slot = Arc::clone(&state);
        self.map_block(block, map_mode, range.clone(), move |r| {
            slot.store(if r.is_ok() { MAPPED } else { REFUSED }, Ordering::Release)
        })?;
        let mut unmap = Unmap { storage: self, buffer: &block.buffer, armed: true };
        let waited = super::platform::wait_blocking(self, || match state.load(Ordering::Acquire) {
            PENDING => Ok(None),
            got => Ok(Some(got)),
        });
        let waited = match waited {
            Ok(REFUSED) => {
                unmap.armed = false;
                Err(self.backend_error("mapping a buffer", "wgpu refused the map"))
            }
            other => other.map(drop),
        };
        self.or_lost(waited)?;
        let at = (offset - range.start) as usize;
        let r = f(&block.buffer, range, at).map_err(|e| self.backend_error("mapping a device buffer", e));
        self.or_lost(r)
    }

    /// A blocking write on this route.
    pub(crate) fn write_direct_blocking(&self, block: &WgpuBlock, offset: u64, src: &[u8]) -> Result<()> {
        self.with_mapped_blocking(block, wgpu::MapMode::Write, offset, src.len(), |buffer, range, at| {
            buffer
                .get_mapped_range_mut(range)
                .map(|mut view| view.slice(at..at + src.len()).copy_from_slice(src))
        })
    }

    /// A blocking read on this route.
    pub(crate) fn read_direct_blocking(&self, block: &WgpuBlock, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.with_mapped_blocking(block, wgpu::MapMode::Read, offset, dst.len(), |buffer, range, at| {
            buffer.get_mapped_range(range).map(|view| dst.copy_from_slice(&view[at..at + dst.len()]))
        })
    }

    pub(crate) async fn write_direct(
        &self,
        block: &WgpuBlock,
        offset: u64,
        src: &[u8],
        mode: Mode,
    ) -> Result<()> {
        self.with_mapped(block, wgpu::MapMode::Write, offset, src.len(), mode, |buffer, piece, at, part| {
            buffer
                .get_mapped_range_mut(piece)
                .map(|mut view| view.slice(at..at + part.len()).copy_from_slice(&src[part]))
        })
        .await
    }

    pub(crate) async fn read_direct(
        &self,
        block: &WgpuBlock,
        offset: u64,
        dst: &mut [u8],
        mode: Mode,
    ) -> Result<()> {
        self.with_mapped(block, wgpu::MapMode::Read, offset, dst.len(), mode, |buffer, piece, at, part| {
            buffer.get_mapped_range(piece).map(|view| {
                let n = part.len();
                dst[part].copy_from_slice(&view[at..at + n])
            })
        })
        .await
    }
}
