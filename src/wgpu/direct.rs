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
//! settle what the wait said (`MapGuard::settle`), copy [`Mapping::pieces`], unmap (the guard,
//! on drop: a copy dropped half-way never leaves the buffer mapped, see `mapping.rs`).

use std::ops::Range;

use super::block::ceil4;
use super::block::WgpuBlock;
use super::gpu::Gpu;
use super::mapping::MapGuard;
use crate::bounce::{yield_now, Mode};
use crate::error::Result;

/// One map of the words around `offset..offset + len` of a block, unmapped when dropped.
struct Mapping<'a> {
    guard: MapGuard<'a>,
    buffer: &'a wgpu::Buffer,
    gpu: &'a Gpu,
    range: Range<u64>,
    offset: u64,
    len: u64,
}

impl<'a> Mapping<'a> {
    /// Asks for the map (the caller holds the block's lock). Only a buffer the app holds (`exposed`) is mapped inside an error scope:
    /// see `Gpu::map_unscoped`.
    fn request(
        gpu: &'a Gpu,
        block: &'a WgpuBlock,
        mode: wgpu::MapMode,
        offset: u64,
        len: usize,
    ) -> Result<Self> {
        let range = offset & !(wgpu::MAP_ALIGNMENT - 1)..ceil4(offset + len as u64);
        let exposed = block.exposed.load(std::sync::atomic::Ordering::Acquire);
        let guard = MapGuard::request(gpu, &block.buffer, mode, range.clone(), exposed)?;
        Ok(Mapping { guard, buffer: &block.buffer, gpu, range, offset, len: len as u64 })
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
        let r = f(self.buffer, piece.0, piece.1, piece.2)
            .map_err(|e| self.gpu.backend_error("mapping a device buffer", e));
        self.gpu.or_lost(r)
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
    let held = block.lock_async().await;
    let mut mapping = Mapping::request(gpu, block, map_mode, offset, len)?;
    let waited = mapping.guard.waited(mode, false).await;
    held.here();
    mapping.guard.settle(waited)?;
    let mut pieces = mapping.pieces(chunk).peekable();
    while let Some(piece) = pieces.next() {
        mapping.copy(piece, &mut f)?;
        if pieces.peek().is_some() && mode == Mode::Async {
            yield_now().await;
            held.here();
        }
    }
    Ok(())
}

/// The blocking twin of [`with_mapped`], without futures (the wait reads the map's outcome
/// directly), one piece.
fn with_mapped_blocking(
    gpu: &Gpu,
    block: &WgpuBlock,
    map_mode: wgpu::MapMode,
    offset: u64,
    len: usize,
    mut f: impl FnMut(&wgpu::Buffer, Range<u64>, usize, Range<usize>) -> MapCopy,
) -> Result<()> {
    let _held = block.lock_blocking(gpu)?;
    let mut mapping = Mapping::request(gpu, block, map_mode, offset, len)?;
    let waited = mapping.guard.waited_blocking();
    mapping.guard.settle(waited)?;
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
