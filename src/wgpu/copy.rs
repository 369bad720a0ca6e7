//! Copies between blocks of one device: on the GPU when both ranges are whole words (through
//! a temporary within one buffer, which wgpu refuses to copy onto itself), else through the
//! host in chunks; and clearing. Each takes the blocks' locks, which keep mapped copies (the
//! direct route) and ragged writes (read, merge, write back) from interleaving with them.

use super::block::Held;
use super::block::{aligned, WgpuBlock};
use super::storage::WgpuStorage;
use crate::bounce::{yield_now, Mode, BOUNCE_CHUNK};
use crate::error::Result;

impl WgpuStorage {
    /// Copies `len` bytes between blocks: on the GPU when the ranges are whole words, else
    /// through the host.
    pub(crate) async fn copy_with(
        &self,
        src: &WgpuBlock,
        so: u64,
        dst: &WgpuBlock,
        d_o: u64,
        len: u64,
        mode: Mode,
    ) -> Result<()> {
        src.made(self.gpu.id, len, mode).await?;
        dst.made(self.gpu.id, len, mode).await?;
        if aligned(so, len) && aligned(d_o, 0) {
            let r = self.copy_aligned(src, so, dst, d_o, len, mode).await;
            let r = self.spoil_on(src, r);
            return self.spoil_on(dst, r);
        }
        // Through the host in chunks of at most BOUNCE_CHUNK bytes; back to front when the
        // destination overlaps the source from above, so that no chunk reads what an earlier
        // one wrote.
        let chunk = (BOUNCE_CHUNK as u64).min(len);
        let mut tmp = vec![0u8; chunk as usize];
        let backwards = std::ptr::eq(src, dst) && d_o > so && d_o < so + len;
        let mut done = 0;
        while done < len {
            let n = chunk.min(len - done);
            let at = if backwards { len - done - n } else { done };
            let piece = &mut tmp[..n as usize];
            self.read_with(src, so + at, piece, mode).await?;
            self.write_with(dst, d_o + at, piece, mode).await?;
            done += n;
            if done < len && mode == Mode::Async {
                yield_now().await;
            }
        }
        Ok(())
    }

    /// A GPU copy of whole words between blocks (through a temporary within one buffer, which
    /// wgpu refuses), ordered before every later operation.
    pub(crate) async fn copy_aligned(
        &self,
        src: &WgpuBlock,
        so: u64,
        dst: &WgpuBlock,
        d_o: u64,
        len: u64,
        mode: Mode,
    ) -> Result<()> {
        self.gpu.check_lost()?;
        let same = std::ptr::eq(src, dst);
        // Keep the buffers from being mapped while the copy is queued; lock in address order
        // so that two opposite copies cannot deadlock.
        let (first, second) =
            if (src as *const WgpuBlock) < (dst as *const WgpuBlock) { (src, dst) } else { (dst, src) };
        let _g1 = self.lock_block(first, mode).await?;
        let _g2 = if same { None } else { Some(self.lock_block(second, mode).await?) };
        if same {
            let usage = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
            let tmp = self.gpu.create("devalloc d2d temporary", len, usage, false)?;
            self.gpu.submit("devalloc d2d", |enc| {
                enc.copy_buffer_to_buffer(&src.buffer, so, &tmp, 0, len);
                enc.copy_buffer_to_buffer(&tmp, 0, &dst.buffer, d_o, len);
            })?;
        } else {
            self.gpu.submit("devalloc d2d", |enc| {
                enc.copy_buffer_to_buffer(&src.buffer, so, &dst.buffer, d_o, len)
            })?;
        }
        Ok(())
    }

    /// The block's lock, blocking or not as `mode` says (see `block.rs`).
    pub(crate) async fn lock_block<'a>(&self, block: &'a WgpuBlock, mode: Mode) -> Result<Held<'a>> {
        match mode {
            Mode::Blocking => block.lock_blocking(&self.gpu),
            Mode::Async => Ok(block.lock_async().await),
        }
    }

    /// Clears `len` bytes at `offset` (both multiples of 4) to zero on the GPU.
    pub(crate) async fn clear(&self, block: &WgpuBlock, offset: u64, len: u64, mode: Mode) -> Result<()> {
        self.gpu.check_lost()?;
        let _guard = self.lock_block(block, mode).await?;
        self.gpu.submit("devalloc clear", |enc| enc.clear_buffer(&block.buffer, offset, Some(len))).map(drop)
    }
}
