//! Filling a block in place on the staged route ([`crate::DeviceAllocator::fill_in_place`]):
//! the caller writes each piece straight into a mapped staging buffer of the belt, which is
//! then copied to the block as an upload's chunk is, so a streamed copy from a reader makes no
//! copy of its own (native only: a blocking map).

use super::belt::Belt;
use super::block::{floor4, WgpuBlock, COPY_ALIGN};
use super::gpu::Gpu;
use super::options::Route;
use super::platform::{Current, Platform};
use super::storage::WgpuStorage;
use crate::bounce::{run_blocking, Mode};
use crate::error::Result;

impl WgpuStorage {
    /// The staged route's in-place fill of `len` bytes at `offset` of `block`, or `None` where
    /// it has none: the direct route (which maps the block itself), the browser (no blocking
    /// map), a buffer of segments, a range starting inside a word, pieces under a word.
    pub(crate) fn fill_one(
        &self,
        block: &WgpuBlock,
        offset: u64,
        len: u64,
        piece: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Option<(u64, Result<()>)> {
        let staged =
            self.route == Route::Staged && self.gpu.core && Current::CAN_BLOCK && !Current::IN_BROWSER;
        // Pieces are whole words: a piece under a word cannot be honoured.
        if !staged
            || block.is_segmented()
            || !offset.is_multiple_of(COPY_ALIGN)
            || (piece as u64) < COPY_ALIGN
        {
            return None;
        }
        if let Err(e) = run_blocking(block.made(self.gpu.id, len, Mode::Blocking)) {
            return Some((0, Err(e)));
        }
        // Whole words per piece, at most a staging chunk.
        let piece = floor4((piece as u64).min(self.belt.chunk));
        let mut done = 0;
        while done < len {
            let n = piece.min(len - done);
            let at = offset + done;
            let r = self.belt.fill_piece(&self.gpu, &block.buffer, at, n, fill);
            let r = self.gpu.or_lost(r).and_then(|(wrote, tail)| {
                // A last piece that ends inside a word: its whole words were copied, the rest
                // is written as any ragged write is (merged with the bytes after it).
                let whole = floor4(wrote);
                let rest = (wrote - whole) as usize;
                if rest > 0 {
                    run_blocking(self.write_with(block, at + whole, &tail[..rest], Mode::Blocking))?;
                }
                Ok(wrote)
            });
            match self.spoil_on(block, r) {
                Ok(wrote) => {
                    done += wrote;
                    if wrote < n {
                        break;
                    }
                }
                Err(e) => return Some((done, Err(e))),
            }
        }
        Some((done, Ok(())))
    }
}

impl Belt {
    /// One piece of an in-place fill: `n` bytes of a mapped staging buffer handed to `fill`,
    /// then the whole words of what it wrote copied to `dst[at..]`. Returns the bytes it wrote
    /// and the bytes past its last whole word (for the caller to write).
    #[allow(unsafe_code)] // one slice over the mapped staging: see its SAFETY note
    fn fill_piece(
        &self,
        gpu: &Gpu,
        dst: &wgpu::Buffer,
        at: u64,
        n: u64,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<(u64, [u8; 4])> {
        let staging = run_blocking(self.take_upload(gpu, Mode::Blocking))?;
        let mut tail = [0u8; 4];
        let wrote = {
            let words = n.next_multiple_of(COPY_ALIGN);
            let mut view = staging.buffer.get_mapped_range_mut(0..words).map_err(|e| {
                log::debug!("devalloc: fill staging: {e}");
                gpu.settle_loss()
            })?;
            let mut slice = view.slice(..n as usize);
            let raw = slice.as_raw_ptr();
            // SAFETY: wgpu mapped these `n` bytes for writing and initialized them (wgpu-core's
            // `map_buffer` zeroes every byte of a mapping not written before, and this staging
            // buffer is only ever written through such mappings); `view` holds the mapping, and
            // nothing else reaches the buffer until it is unmapped below.
            let bytes = unsafe { std::slice::from_raw_parts_mut(raw.as_ptr() as *mut u8, n as usize) };
            let wrote = fill(bytes).min(n as usize);
            let whole = wrote & !(COPY_ALIGN as usize - 1);
            tail[..wrote - whole].copy_from_slice(&bytes[whole..wrote]);
            wrote as u64
        };
        gpu.unmap(&staging.buffer);
        let whole = floor4(wrote);
        let index = if whole > 0 {
            gpu.submit("devalloc upload", |enc| {
                enc.copy_buffer_to_buffer(&staging.buffer, 0, dst, at, whole)
            })?
        } else {
            None
        };
        match self.recycle_upload(gpu, staging, index) {
            Some(true) => Ok((wrote, tail)),
            // wgpu refused to map the staging again: the device is gone.
            Some(false) => Err(gpu.settle_loss()),
            None => gpu.check_lost().map(|()| (wrote, tail)),
        }
    }
}
