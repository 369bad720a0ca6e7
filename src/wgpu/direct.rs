//! The direct route: on adapters whose memory the host shares (CPU, integrated) and that offer
//! `MAPPABLE_PRIMARY_BUFFERS`, host<->device copies map the buffer itself, no staging.
//!
//! A mapped buffer cannot be used by the GPU, so the block's lock keeps a mapping and the GPU
//! copies devalloc queues on the block apart, and each copy maps only the words it touches
//! (from an 8-byte boundary, as wgpu asks) and unmaps before returning. Work the app itself
//! queues on a devalloc buffer must be finished (or not yet submitted) when it copies through
//! devalloc on this route: wgpu refuses to submit work on a mapped buffer.
//!
//! One protocol, in steps that the async copies and the blocking ones (which skip the async
//! machinery: a blocking copy here is a few hundred ns of work, and futures measured ~150 ns of
//! it) both take, in this order: lock the block, [`Mapping::request`] the map, wait for it,
//! [`Mapping::settle`] what the wait said, copy [`Mapping::pieces`], unmap (on drop).

use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use super::gpu::{Gpu, MapResult};
use super::storage::{ceil4, WgpuBlock};
use crate::bounce::{run_blocking, yield_now, Mode};
use crate::error::Result;

/// Unmaps a buffer when dropped, unless disarmed (the map it guards failed: then the mapping
/// state is not devalloc's, say the app had mapped the buffer itself and keeps its mapping).
/// Armed while a map is pending too: unmapping cancels a pending map, so a future dropped
/// half-way never leaves a buffer mapped behind anyone's back.
pub(crate) struct Unmap<'a> {
    pub gpu: &'a Gpu,
    pub buffer: &'a wgpu::Buffer,
    pub armed: bool,
}

impl Drop for Unmap<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.gpu.unmap(self.buffer);
        }
    }
}

/// One map of the words around `offset..offset + len` of a block, unmapped when dropped.
struct Mapping<'a> {
    unmap: Unmap<'a>,
    range: Range<u64>,
    offset: u64,
    len: u64,
}

impl<'a> Mapping<'a> {
    /// Asks for the map (the caller holds the block's lock); `then` gets the callback's result.
    /// Only a buffer the app holds (`exposed`) is mapped inside an error scope: see
    /// `Gpu::map_unscoped`.
    fn request(
        gpu: &'a Gpu,
        block: &'a WgpuBlock,
        mode: wgpu::MapMode,
        offset: u64,
        len: usize,
        then: impl FnOnce(MapResult) + wgpu::WasmNotSend + 'static,
    ) -> Result<Self> {
        let range = offset & !(wgpu::MAP_ALIGNMENT - 1)..ceil4(offset + len as u64);
        let exposed = block.exposed.load(Ordering::Acquire);
        gpu.map_then(&block.buffer, mode, range.clone(), exposed, then)?;
        Ok(Mapping {
            unmap: Unmap { gpu, buffer: &block.buffer, armed: true },
            range,
            offset,
            len: len as u64,
        })
    }

    /// What the wait said: `Ok(true)` mapped, `Ok(false)` refused by wgpu (the app had mapped
    /// the buffer, say: not ours to unmap), `Err` the wait's own failure. The wait polls the
    /// device, which fires the lost callback of a lost device, and a map on a lost device fails
    /// at once: so no poll up front; a failure is named a loss where it is one.
    fn settle(&mut self, waited: Result<bool>) -> Result<()> {
        let gpu = self.unmap.gpu;
        let waited = match waited {
            Ok(false) => {
                self.unmap.armed = false;
                Err(gpu.backend_error("mapping a buffer", "wgpu refused the map"))
            }
            other => other.map(drop),
        };
        gpu.or_lost(waited)
    }

    /// The pieces to copy, at most `chunk` bytes each and starting at multiples of 8 from the
    /// mapped range's start (as wgpu's mapped views must): each piece's range in the buffer,
    /// where the wanted bytes start in it, and which of the caller's bytes it holds.
    fn pieces(&self, chunk: u64) -> impl Iterator<Item = (Range<u64>, usize, Range<usize>)> + '_ {
        let piece = chunk.max(wgpu::MAP_ALIGNMENT) & !(wgpu::MAP_ALIGNMENT - 1);
        let (offset, end) = (self.offset, self.offset + self.len);
        (self.range.start..self.range.end).step_by(piece as usize).map(move |at| {
            let next = at.saturating_add(piece).min(self.range.end);
            let (lo, hi) = (at.max(offset), next.min(end));
            (at..next, (lo - at) as usize, (lo - offset) as usize..(hi - offset) as usize)
        })
    }

    /// Copies one piece with `f`, naming a failure.
    fn copy(
        &self,
        piece: (Range<u64>, usize, Range<usize>),
        f: &mut impl FnMut(&wgpu::Buffer, Range<u64>, usize, Range<usize>) -> MapCopy,
    ) -> Result<()> {
        let gpu = self.unmap.gpu;
        let r = f(self.unmap.buffer, piece.0, piece.1, piece.2)
            .map_err(|e| gpu.backend_error("mapping a device buffer", e));
        gpu.or_lost(r)
    }
}

/// Maps the words around `offset..offset + len` (`span`), runs `f` on each piece (at most
/// `chunk` bytes), giving the executor back between pieces when async, and unmaps.
async fn with_mapped(
    gpu: &Gpu,
    chunk: u64,
    block: &WgpuBlock,
    map_mode: wgpu::MapMode,
    (offset, len): (u64, usize),
    mode: Mode,
    mut f: impl FnMut(&wgpu::Buffer, Range<u64>, usize, Range<usize>) -> MapCopy,
) -> Result<()> {
    let _guard = block.lock.lock().await;
    let (tx, mapped) = futures_channel::oneshot::channel();
    let mut mapping = Mapping::request(gpu, block, map_mode, offset, len, move |r| {
        let _ = tx.send(r);
    })?;
    let waited = gpu.wait(mapped, None, mode, false).await.map(|r| r.is_ok());
    mapping.settle(waited)?;
    let mut pieces = mapping.pieces(chunk).peekable();
    while let Some(piece) = pieces.next() {
        mapping.copy(piece, &mut f)?;
        if pieces.peek().is_some() && mode == Mode::Async {
            yield_now().await;
        }
    }
    Ok(())
}

/// The blocking twin of [`with_mapped`], without futures: a callback slot of its own instead of
/// a channel, one piece.
fn with_mapped_blocking(
    gpu: &Gpu,
    block: &WgpuBlock,
    map_mode: wgpu::MapMode,
    offset: u64,
    len: usize,
    mut f: impl FnMut(&wgpu::Buffer, Range<u64>, usize, Range<usize>) -> MapCopy,
) -> Result<()> {
    const PENDING: u8 = 0;
    const MAPPED: u8 = 1;
    const REFUSED: u8 = 2;
    let _guard = run_blocking(block.lock.lock());
    let state = Arc::new(AtomicU8::new(PENDING));
    let slot = Arc::clone(&state);
    let mut mapping = Mapping::request(gpu, block, map_mode, offset, len, move |r| {
        slot.store(if r.is_ok() { MAPPED } else { REFUSED }, Ordering::Release)
    })?;
    let waited = gpu.wait_blocking(|| match state.load(Ordering::Acquire) {
        PENDING => Ok(None),
        got => Ok(Some(got == MAPPED)),
    });
    mapping.settle(waited)?;
    let copied = mapping.pieces(u64::MAX).try_for_each(|piece| mapping.copy(piece, &mut f));
    copied
}

/// What a copy into or out of one mapped piece gives.
type MapCopy = std::result::Result<(), wgpu::MapRangeError>;

/// The copy into each mapped piece from `src`.
fn copy_from(src: &[u8]) -> impl FnMut(&wgpu::Buffer, Range<u64>, usize, Range<usize>) -> MapCopy + '_ {
    move |buffer, piece, at, part| {
        buffer
            .get_mapped_range_mut(piece)
            .map(|mut view| view.slice(at..at + part.len()).copy_from_slice(&src[part]))
    }
}

/// The copy out of each mapped piece into `dst`.
fn copy_into(dst: &mut [u8]) -> impl FnMut(&wgpu::Buffer, Range<u64>, usize, Range<usize>) -> MapCopy + '_ {
    move |buffer, piece, at, part| {
        buffer.get_mapped_range(piece).map(|view| {
            let n = part.len();
            dst[part].copy_from_slice(&view[at..at + n])
        })
    }
}

/// Writes `src` at `offset` of `block` (async, or blocking through the futures).
pub(crate) async fn write(
    gpu: &Gpu,
    chunk: u64,
    block: &WgpuBlock,
    offset: u64,
    src: &[u8],
    mode: Mode,
) -> Result<()> {
    with_mapped(gpu, chunk, block, wgpu::MapMode::Write, (offset, src.len()), mode, copy_from(src)).await
}

/// Reads `dst.len()` bytes at `offset` of `block`.
pub(crate) async fn read(
    gpu: &Gpu,
    chunk: u64,
    block: &WgpuBlock,
    offset: u64,
    dst: &mut [u8],
    mode: Mode,
) -> Result<()> {
    let len = dst.len();
    with_mapped(gpu, chunk, block, wgpu::MapMode::Read, (offset, len), mode, copy_into(dst)).await
}

/// A blocking write.
pub(crate) fn write_blocking(gpu: &Gpu, block: &WgpuBlock, offset: u64, src: &[u8]) -> Result<()> {
    with_mapped_blocking(gpu, block, wgpu::MapMode::Write, offset, src.len(), copy_from(src))
}

/// A blocking read.
pub(crate) fn read_blocking(gpu: &Gpu, block: &WgpuBlock, offset: u64, dst: &mut [u8]) -> Result<()> {
    let len = dst.len();
    with_mapped_blocking(gpu, block, wgpu::MapMode::Read, offset, len, copy_into(dst))
}
