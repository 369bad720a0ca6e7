//! [`Storage`]: raw device memory of one backend, under the generic [`crate::backend::Pool`].

use std::fmt::Debug;

use crate::allocator::BoxFuture;
use crate::allocator::WasmNotSendSync;
use crate::bounce::yield_now;
use crate::checks::round_up;
use crate::device::Device;
use crate::error::Result;

/// Raw device storage: how one backend allocates, reads, writes and copies a block.
///
/// The [`crate::backend::Pool`] above it checks every pointer, offset and length before calling
/// in, so a storage sees only in-bounds requests on blocks it made. The blocking methods are
/// required; their `_async` twins default to them (a backend that must not block, the browser,
/// overrides them).
pub trait Storage: WasmNotSendSync {
    /// One block of device memory; dropping it frees it.
    type Block: WasmNotSendSync;

    /// What a caller may choose per allocation beyond size and alignment (wgpu: buffer usage);
    /// `()` for none. Part of the cache key: a cached block is reused only for equal params.
    type Params: Clone + Ord + Default + Debug + WasmNotSendSync;

    /// The device this storage allocates on.
    fn device(&self) -> Device;

    /// Block sizes are multiples of this (wgpu: 4).
    fn granularity(&self) -> u64 {
        1
    }

    /// The largest block the device allows.
    fn max_block_size(&self) -> u64;

    /// The capacity a block gets for a request of `size` bytes when the pool caches (a cached
    /// block serves a request whose capacity it exceeds by at most an eighth); `None` on
    /// overflow.
    /// Default: the size rounded up to 512 bytes.
    fn size_class(&self, size: u64) -> Option<u64> {
        default_size_class(size)
    }

    /// Whether one block may hold several allocations (a cached block split for smaller
    /// requests; see the pool's policy). Not where a block is bound whole and its users are
    /// tracked per block (wgpu). Default: `false`.
    fn splits(&self) -> bool {
        false
    }

    /// Whether blocks have real device addresses ([`Storage::address`]); if not (the default),
    /// the pool hands out virtual ones.
    fn has_real_addresses(&self) -> bool {
        false
    }

    /// The alignment a block itself needs for an allocation aligned to `alignment`; blocks are
    /// cached by it. Default: `alignment`. With virtual addresses the address carries the
    /// alignment, so a storage whose blocks need none (wgpu) returns 1.
    fn block_alignment(&self, alignment: u64) -> u64 {
        alignment
    }

    /// Allocates a block of `capacity` bytes whose start honours `alignment` (as returned by
    /// [`Storage::block_alignment`]), made with `params`. `name` is the block's, true for as
    /// long as it lives (cached and reused by other allocations too: `devalloc block 17, 1 MiB`),
    /// for backends that name their memory (wgpu); the label of each allocation is the pool's
    /// to keep. Running out of device memory must be [`crate::Error::OutOfMemory`] (the pool
    /// then empties its cache and tries once more); a request that can never fit is
    /// [`crate::Error::TooLarge`].
    fn alloc(&self, capacity: u64, alignment: u64, params: &Self::Params, name: &str) -> Result<Self::Block>;

    /// Async twin of [`Storage::alloc`]: where the device says only later whether it could
    /// make a block (the browser's WebGPU), waits for that. Default: [`Storage::alloc`].
    fn alloc_async<'a>(
        &'a self,
        capacity: u64,
        alignment: u64,
        params: &'a Self::Params,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Self::Block>> {
        Box::pin(async move { self.alloc(capacity, alignment, params, name) })
    }

    /// Whether the device refused `block` after [`Storage::alloc`] returned it (the browser's
    /// WebGPU reports an out-of-memory later): the pool then stops counting its allocation and
    /// refuses every use of it. Default: never.
    fn refused(&self, block: &Self::Block) -> bool {
        let _ = block;
        false
    }

    /// How many blocks the device has refused so far ([`Storage::refused`]); the pool looks for
    /// them when it changes. Default: 0.
    fn refusals(&self) -> u64 {
        0
    }

    /// The block's real device address, for storages that have them (CUDA).
    fn address(&self, block: &Self::Block) -> Option<u64> {
        let _ = block;
        None
    }

    /// A short human name of the device (adapter or GPU name).
    fn name(&self) -> String {
        self.device().to_string()
    }

    /// Checks, before each operation, that the device is still usable (wgpu: not lost). The
    /// pool calls it first in every allocation, so a lost device fails before any bookkeeping.
    fn check_usable(&self) -> Result<()> {
        Ok(())
    }

    /// What the device itself says about its memory, where the backend can say it (CUDA:
    /// `cuMemGetInfo`; wgpu: its allocator report). Default: `None`.
    fn device_memory(&self) -> Option<crate::snapshot::MemoryReport> {
        None
    }

    /// The sizes of the device buffers `block` is made of, in address order, where it is more
    /// than one (wgpu's segments, past one buffer's limit); empty (the default) for one.
    fn segment_sizes(&self, block: &Self::Block) -> Vec<u64> {
        let _ = block;
        Vec::new()
    }

    /// Bytes of staging memory the storage holds now (reported as
    /// [`crate::AllocatorStats::staging_bytes`]).
    fn staging_bytes(&self) -> u64 {
        0
    }

    /// Called with a freed block that nobody else holds, just before the pool drops it, when
    /// [`crate::PoolOptions::reuse_freed`] is off (the debug setting that makes a use of freed
    /// memory show): a backend whose memory others may still reference makes such a use fail
    /// loudly (wgpu destroys the buffer, so a submit that still uses it, through a bind group
    /// kept past the free, is a validation error). Default: nothing.
    fn retire(&self, block: &Self::Block) {
        let _ = block;
    }

    /// Whether a freed `block` may be cached and handed out again (`false`: it is dropped
    /// instead, say because someone else broke it).
    fn reusable(&self, block: &Self::Block) -> bool {
        let _ = block;
        true
    }

    /// Writes `src` at `offset` in `block`.
    fn write(&self, block: &Self::Block, offset: u64, src: &[u8]) -> Result<()>;

    /// Reads `dst.len()` bytes at `offset` in `block`.
    fn read(&self, block: &Self::Block, offset: u64, dst: &mut [u8]) -> Result<()>;

    /// Fills `len` bytes at `offset` in `block` in place, piece by piece, as
    /// [`crate::DeviceAllocator::fill_in_place`] says (the pool has checked the range). `None`
    /// (the default) where the storage has no such route for this range.
    fn fill_in_place(
        &self,
        block: &Self::Block,
        offset: u64,
        len: u64,
        piece: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Option<(u64, Result<()>)> {
        let _ = (block, offset, len, piece, fill);
        None
    }

    /// Copies `len` bytes between two blocks of this storage (possibly the same block, with
    /// ranges that may overlap: the result must be as if through a temporary).
    fn copy(
        &self,
        src: &Self::Block,
        src_offset: u64,
        dst: &Self::Block,
        dst_offset: u64,
        len: u64,
    ) -> Result<()>;

    /// Copies `len` bytes from a block of this storage to a block of another storage of the
    /// same kind (another device), if the backend can do so directly (CUDA: a peer copy).
    /// Default: `None`, and the pool copies through host memory instead.
    #[allow(clippy::too_many_arguments)]
    fn copy_to(
        &self,
        src: &Self::Block,
        src_offset: u64,
        dst_storage: &Self,
        dst: &Self::Block,
        dst_offset: u64,
        len: u64,
    ) -> Option<Result<()>> {
        let _ = (src, src_offset, dst_storage, dst, dst_offset, len);
        None
    }

    /// Most bytes the default `_async` twins move in one poll (default 4 MiB: about 0.4 ms of
    /// memcpy). They go in pieces of this size through the blocking methods and give the
    /// executor back between pieces, so that an async copy never holds its executor's thread
    /// for long however large it is.
    fn async_chunk(&self) -> u64 {
        4 << 20
    }

    /// Async twin of [`Storage::write`] for backends that must not block (the browser).
    /// Default: the blocking write, [`Storage::async_chunk`] bytes per poll.
    fn write_async<'a>(
        &'a self,
        block: &'a Self::Block,
        offset: u64,
        src: &'a [u8],
    ) -> BoxFuture<'a, Result<()>> {
        let chunk = piece_len(self.async_chunk());
        Box::pin(async move {
            for (i, piece) in src.chunks(chunk).enumerate() {
                if i > 0 {
                    yield_now().await;
                }
                self.write(block, offset + (i * chunk) as u64, piece)?;
            }
            Ok(())
        })
    }

    /// Async twin of [`Storage::read`]. Default: the blocking read, [`Storage::async_chunk`]
    /// bytes per poll.
    fn read_async<'a>(
        &'a self,
        block: &'a Self::Block,
        offset: u64,
        dst: &'a mut [u8],
    ) -> BoxFuture<'a, Result<()>> {
        let chunk = piece_len(self.async_chunk());
        Box::pin(async move {
            for (i, piece) in dst.chunks_mut(chunk).enumerate() {
                if i > 0 {
                    yield_now().await;
                }
                self.read(block, offset + (i * chunk) as u64, piece)?;
            }
            Ok(())
        })
    }

    /// Async twin of [`Storage::copy`]. Default: the blocking copy, [`Storage::async_chunk`]
    /// bytes per poll, back to front where the destination overlaps the source from above.
    fn copy_async<'a>(
        &'a self,
        src: &'a Self::Block,
        src_offset: u64,
        dst: &'a Self::Block,
        dst_offset: u64,
        len: u64,
    ) -> BoxFuture<'a, Result<()>> {
        let chunk = piece_len(self.async_chunk()) as u64;
        let backwards = std::ptr::eq(src, dst) && dst_offset > src_offset && dst_offset - src_offset < len;
        Box::pin(async move {
            let pieces = len.div_ceil(chunk);
            for k in 0..pieces {
                let i = if backwards { pieces - 1 - k } else { k };
                if k > 0 {
                    yield_now().await;
                }
                let at = i * chunk;
                self.copy(src, src_offset + at, dst, dst_offset + at, chunk.min(len - at))?;
            }
            Ok(())
        })
    }
}

/// A piece length for the default async twins: at least 4 KiB, at most what a `usize` holds.
fn piece_len(chunk: u64) -> usize {
    usize::try_from(chunk.max(4096)).unwrap_or(usize::MAX)
}

/// Capacity of a block for a request of `size` bytes: the size rounded up to 512 bytes; `None`
/// on overflow.
pub(crate) fn default_size_class(size: u64) -> Option<u64> {
    round_up(size.max(1), GRANULE)
}

/// What a block's capacity is a multiple of by default (as PyTorch rounds small requests).
pub(crate) const GRANULE: u64 = 512;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_round_to_512_bytes() {
        assert_eq!(default_size_class(1), Some(512));
        assert_eq!(default_size_class(512), Some(512));
        assert_eq!(default_size_class(513), Some(1024));
        assert_eq!(default_size_class(1 << 20), Some(1 << 20));
        assert_eq!(default_size_class((1 << 20) + 1), Some((1 << 20) + 512));
        for s in (1..5000u64).chain([12345, 1 << 30, (1 << 30) + 7, 3 << 40]) {
            let c = default_size_class(s).unwrap();
            assert!(c >= s && c.is_multiple_of(512) && c - s < 512, "{s} -> {c}");
        }
        assert_eq!(default_size_class(u64::MAX), None);
    }
}
