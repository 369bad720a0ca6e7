//! Allocations past one buffer's limit: one block of several wgpu buffers, its *segments*.
//!
//! A wgpu buffer has a ceiling (the device's `max_buffer_size`, or the lower
//! [`super::WgpuOptions::max_buffer_size`]). A block whose capacity passes it is made of
//! `ceil(capacity / segment)` buffers, each `segment` bytes but the last (`segment` is the limit
//! rounded down to the device's binding alignment, so every segment starts where a binding may),
//! and one virtual address range stands for all of them: byte `i` of the allocation is byte
//! `i % segment` of segment `i / segment`. The pool sees one block of the whole capacity (it
//! caches, budgets and frees it like any other); every copy is cut at the seams into pieces
//! of one buffer each, done in order, and a piece that fails stops the copy with the pieces
//! before it landed and nothing after it written, and says so. A block within the limit is one
//! buffer and takes none of this.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::block::WgpuBlock;
use super::storage::{WgpuParams, WgpuStorage};
use crate::bounce::Mode;
use crate::error::{Error, Result};

/// One piece of a range: its segment, the offset in the segment, its bytes, and where it starts
/// within the range.
pub(crate) type Piece<'a> = (&'a WgpuBlock, u64, u64, u64);

impl WgpuBlock {
    /// Whether the block is several buffers.
    pub(crate) fn is_segmented(&self) -> bool {
        !self.rest.is_empty()
    }

    /// The block's buffers in address order: this one, then the rest.
    pub(crate) fn segments(&self) -> impl Iterator<Item = &WgpuBlock> {
        std::iter::once(self).chain(self.rest.iter())
    }

    /// The sizes of its buffers where it has several; empty for one.
    pub(crate) fn segment_sizes(&self) -> Vec<u64> {
        match self.is_segmented() {
            true => self.segments().map(|s| s.buffer.size()).collect(),
            false => Vec::new(),
        }
    }

    /// Bytes of the whole block, every segment.
    pub(crate) fn size(&self) -> u64 {
        self.segments().map(|s| s.buffer.size()).sum()
    }

    /// The pieces of `offset..offset + len`, one per segment it touches, in order; none for
    /// an empty range.
    pub(crate) fn pieces(&self, offset: u64, len: u64) -> Vec<Piece<'_>> {
        let segment = self.buffer.size();
        let mut out = Vec::new();
        let mut at = 0;
        while at < len {
            let pos = offset + at;
            let i = (pos / segment) as usize;
            let within = pos - i as u64 * segment;
            let Some(seg) = (if i == 0 { Some(self) } else { self.rest.get(i - 1) }) else { break };
            let n = (seg.buffer.size() - within).min(len - at);
            out.push((seg, within, n, at));
            at += n;
        }
        out
    }
}

/// `e`, saying that the copy stopped with `done` of its `len` bytes landed (the pieces before
/// piece `piece`, counted from 0), where the error has room to say it.
pub(crate) fn stopped_at(e: Error, what: &str, done: u64, len: u64, piece: usize) -> Error {
    let note = format!(
        " ({what} across buffer segments, a piece per buffer: {done} of {len} bytes landed, then piece {} failed; no later piece was written)",
        piece + 1
    );
    match e {
        Error::Backend { device, message, source } => {
            Error::Backend { device, message: message + &note, source }
        }
        Error::DeviceLost { device, reason } => Error::DeviceLost { device, reason: reason + &note },
        Error::OutOfMemory { requested, device, detail } => {
            Error::OutOfMemory { requested, device, detail: detail + &note }
        }
        Error::NotSupported { operation, device_type, reason } => {
            Error::NotSupported { operation, device_type, reason: reason + &note }
        }
        other => other,
    }
}

/// The pieces of a copy of `len` bytes from `src` at `so` to `dst` at `d_o`, each within one
/// buffer of each block: (source segment, offset in it, destination segment, offset in it,
/// bytes). Back to front when the destination overlaps the source from above within one block,
/// so that no piece reads what an earlier one wrote.
#[allow(clippy::type_complexity)]
fn pairs<'a>(
    src: &'a WgpuBlock,
    so: u64,
    dst: &'a WgpuBlock,
    d_o: u64,
    len: u64,
) -> Vec<(&'a WgpuBlock, u64, &'a WgpuBlock, u64, u64)> {
    let mut out = Vec::new();
    for (s_seg, s_in, n, at) in src.pieces(so, len) {
        for (d_seg, d_in, m, at2) in dst.pieces(d_o + at, n) {
            out.push((s_seg, s_in + at2, d_seg, d_in, m));
        }
    }
    if std::ptr::eq(src, dst) && d_o > so && d_o < so + len {
        out.reverse();
    }
    out
}

impl WgpuStorage {
    /// Writes `src` at `offset` of `block`, a piece per segment.
    pub(crate) async fn write_pieces(
        &self,
        block: &WgpuBlock,
        offset: u64,
        src: &[u8],
        mode: Mode,
    ) -> Result<()> {
        if !block.is_segmented() {
            return self.write_with(block, offset, src, mode).await;
        }
        let len = src.len() as u64;
        for (i, (seg, within, n, at)) in block.pieces(offset, len).into_iter().enumerate() {
            let part = &src[at as usize..(at + n) as usize];
            if let Err(e) = self.write_with(seg, within, part, mode).await {
                return Err(stopped_at(e, "a write", at, len, i));
            }
        }
        Ok(())
    }

    /// Reads `dst.len()` bytes at `offset` of `block`, a piece per segment.
    pub(crate) async fn read_pieces(
        &self,
        block: &WgpuBlock,
        offset: u64,
        dst: &mut [u8],
        mode: Mode,
    ) -> Result<()> {
        if !block.is_segmented() {
            return self.read_with(block, offset, dst, mode).await;
        }
        let len = dst.len() as u64;
        for (i, (seg, within, n, at)) in block.pieces(offset, len).into_iter().enumerate() {
            let part = &mut dst[at as usize..(at + n) as usize];
            if let Err(e) = self.read_with(seg, within, part, mode).await {
                return Err(stopped_at(e, "a read", at, len, i));
            }
        }
        Ok(())
    }

    /// Copies `len` bytes between blocks, a piece per pair of segments (see [`pairs`]).
    pub(crate) async fn copy_pieces(
        &self,
        src: &WgpuBlock,
        so: u64,
        dst: &WgpuBlock,
        d_o: u64,
        len: u64,
        mode: Mode,
    ) -> Result<()> {
        if !src.is_segmented() && !dst.is_segmented() {
            return self.copy_with(src, so, dst, d_o, len, mode).await;
        }
        let mut done = 0;
        for (i, (s_seg, s_in, d_seg, d_in, n)) in pairs(src, so, dst, d_o, len).into_iter().enumerate() {
            if let Err(e) = self.copy_with(s_seg, s_in, d_seg, d_in, n, mode).await {
                return Err(stopped_at(e, "a device copy", done, len, i));
            }
            done += n;
        }
        Ok(())
    }

    /// [`WgpuStorage::write_pieces`], blocking: each piece by the storage's blocking write.
    pub(crate) fn write_pieces_blocking(&self, block: &WgpuBlock, offset: u64, src: &[u8]) -> Result<()> {
        let len = src.len() as u64;
        for (i, (seg, within, n, at)) in block.pieces(offset, len).into_iter().enumerate() {
            let part = &src[at as usize..(at + n) as usize];
            self.write_one(seg, within, part).map_err(|e| stopped_at(e, "a write", at, len, i))?;
        }
        Ok(())
    }

    /// [`WgpuStorage::read_pieces`], blocking.
    pub(crate) fn read_pieces_blocking(&self, block: &WgpuBlock, offset: u64, dst: &mut [u8]) -> Result<()> {
        let len = dst.len() as u64;
        for (i, (seg, within, n, at)) in block.pieces(offset, len).into_iter().enumerate() {
            let part = &mut dst[at as usize..(at + n) as usize];
            self.read_one(seg, within, part).map_err(|e| stopped_at(e, "a read", at, len, i))?;
        }
        Ok(())
    }

    /// [`WgpuStorage::copy_pieces`], blocking.
    pub(crate) fn copy_pieces_blocking(
        &self,
        src: &WgpuBlock,
        so: u64,
        dst: &WgpuBlock,
        d_o: u64,
        len: u64,
    ) -> Result<()> {
        let mut done = 0;
        for (i, (s_seg, s_in, d_seg, d_in, n)) in pairs(src, so, dst, d_o, len).into_iter().enumerate() {
            self.copy_one(s_seg, s_in, d_seg, d_in, n)
                .map_err(|e| stopped_at(e, "a device copy", done, len, i))?;
            done += n;
        }
        Ok(())
    }

    /// Clears `len` bytes at `offset` (multiples of 4) of `block` to zero, a piece per segment.
    pub(crate) async fn clear_pieces(
        &self,
        block: &WgpuBlock,
        offset: u64,
        len: u64,
        mode: Mode,
    ) -> Result<()> {
        if !block.is_segmented() {
            return self.clear(block, offset, len, mode).await;
        }
        for (i, (seg, within, n, at)) in block.pieces(offset, len).into_iter().enumerate() {
            if let Err(e) = self.clear(seg, within, n, mode).await {
                return Err(stopped_at(e, "clearing", at, len, i));
            }
        }
        Ok(())
    }

    /// The usage of a buffer with `params`.
    pub(super) fn usage_of(&self, params: &WgpuParams) -> wgpu::BufferUsages {
        match wgpu::BufferUsages::from_bits_truncate(params.usage) {
            u if u.is_empty() => self.default_usage,
            u => Self::full_usage(self.route, u),
        }
    }

    /// One buffer of `capacity` bytes, refused (see [`WgpuBlock::refused`]) if the browser
    /// turns it down later.
    pub(super) fn alloc_one(
        &self,
        capacity: u64,
        usage: wgpu::BufferUsages,
        name: &str,
    ) -> Result<WgpuBlock> {
        let refused = Arc::new(AtomicBool::new(false));
        let verdict = Arc::new(async_lock::RwLock::new(()));
        let (flag, count) = (Arc::clone(&refused), Arc::clone(&self.refusals));
        // Held until `mark` runs or is dropped: when the browser's verdict is in.
        let pending = verdict.try_write_arc();
        let mark = move || {
            flag.store(true, Ordering::Release);
            count.fetch_add(1, Ordering::AcqRel);
            drop(pending);
        };
        let buffer = self.gpu.create_marked(name, capacity, usage, Box::new(mark))?;
        Ok(WgpuBlock::with_flag(buffer, refused, verdict))
    }

    /// A block of `capacity` bytes made of segments (`capacity` past the segment size): each
    /// made by `one`; if one fails, those made are dropped and its error returned.
    pub(crate) fn segmented(
        &self,
        capacity: u64,
        name: &str,
        mut one: impl FnMut(u64, &str) -> Result<WgpuBlock>,
    ) -> Result<WgpuBlock> {
        let seg = self.segment;
        let count = capacity.div_ceil(seg);
        let mut made = Vec::with_capacity(count as usize);
        for i in 0..count {
            let size = seg.min(capacity - i * seg);
            made.push(one(size, &format!("{name}, segment {} of {count}", i + 1))?);
        }
        let mut first = made.remove(0);
        first.rest = made.into_boxed_slice();
        Ok(first)
    }
}
