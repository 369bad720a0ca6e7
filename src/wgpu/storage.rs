//! [`WgpuStorage`]: wgpu buffers of one device as a [`Storage`] for the generic pool.
//!
//! It holds the device ([`Gpu`], `gpu.rs`), the staging belt (`belt.rs`) and the
//! route, and sends each copy the route's way: staged through the belt, or by mapping the
//! block itself (`direct.rs`); copies between blocks are in `copy.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::belt::Belt;
use super::block::{aligned, ceil4, floor4, WgpuBlock, COPY_ALIGN};
use super::gpu::Gpu;
use super::options::{Route, Tuning, WgpuOptions};
use super::platform::{blocking_allowed, Current, MustWait, Platform};
use crate::allocator::BoxFuture;
use crate::bounce::{run_blocking, Mode};
use crate::device::Device;
use crate::error::Result;
use crate::storage::Storage;

/// Per-allocation choices of a wgpu buffer: its usage (bits of `wgpu::BufferUsages`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct WgpuParams {
    pub(super) usage: u32,
}

impl WgpuParams {
    /// Params for a buffer of this usage (empty: the allocator's default usage).
    pub(crate) fn with_usage(usage: wgpu::BufferUsages) -> Self {
        WgpuParams { usage: usage.bits() }
    }
}

/// wgpu buffers on one device, as a [`Storage`] for the generic pool.
pub struct WgpuStorage {
    pub(super) gpu: Gpu,
    pub(super) belt: Belt,
    pub(super) route: Route,
    pub(super) limits: wgpu::Limits,
    /// Usage of a buffer allocated without one of its own, copy (and map) flags included.
    pub(super) default_usage: wgpu::BufferUsages,
    /// The largest block made of one buffer: the device's `max_buffer_size` or
    /// [`WgpuOptions::max_buffer_size`], whichever is less, rounded down to the device's binding
    /// alignment. A block past it is several buffers (see `segments.rs`).
    pub(super) limit: u64,
    /// Bytes of each segment of such a block but the last (`limit`); 0 where the device's
    /// limit is under its binding alignment, and nothing is segmented.
    pub(super) segment: u64,
    /// Buffers the browser refused after `alloc` returned them (out of memory), so far.
    pub(super) refusals: Arc<AtomicU64>,
}

impl WgpuStorage {
    /// Storage over `device`, which takes `route`; `Err` when the device already has an
    /// `on_device_lost` handler from another allocator and `options` gives a second one.
    pub(crate) fn new(
        device: wgpu::Device,
        queue: wgpu::Queue,
        id: Device,
        route: Route,
        options: &WgpuOptions,
    ) -> Result<Self> {
        let limits = device.limits();
        let max_buffer = floor4(limits.max_buffer_size);
        let gpu = Gpu::new(device, queue, id, options.on_device_lost.clone())?;
        let belt = Belt::new(&Tuning::of(options, &gpu.info, max_buffer), options.staging_budget, max_buffer);
        let default_usage = Self::full_usage(route, options.usage);
        let refusals = Arc::new(AtomicU64::new(0));
        let limit = floor4(options.max_buffer_size.map_or(max_buffer, |m| m.min(max_buffer)));
        let align = u64::from(
            limits.min_storage_buffer_offset_alignment.max(limits.min_uniform_buffer_offset_alignment),
        );
        // One buffer up to the limit rounded down to the binding alignment, segments of that
        // size past it: so that a request within it always lies in one buffer, even on a
        // segmented block the cache hands it. A device whose limit is under the alignment
        // segments nothing (its segments could not be bound).
        let (limit, segment) =
            if limit >= align { (limit / align * align, limit / align * align) } else { (limit, 0) };
        Ok(WgpuStorage { gpu, belt, route, limits, default_usage, limit, segment, refusals })
    }

    /// `usage` plus what devalloc needs: copies both ways, and mapping on the direct route.
    pub(crate) fn full_usage(route: Route, usage: wgpu::BufferUsages) -> wgpu::BufferUsages {
        let mut usage = usage | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        if route == Route::Direct {
            usage |= wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::MAP_WRITE;
        }
        usage
    }

    /// Waits for all submitted work (blocking; in the browser: `NotSupported`, use the async).
    pub(crate) fn synchronize(&self) -> Result<()> {
        blocking_allowed(self.gpu.id, MustWait::Synchronize)?;
        run_blocking(self.gpu.synchronize(Mode::Blocking))
    }

    /// Writes `src` at `offset` of `block` by the device's route. (The direct route's map
    /// polls anyway, and reports a loss through it; the staged route's uploads notice a loss
    /// as `Belt::upload` says.)
    pub(crate) async fn write_with(
        &self,
        block: &WgpuBlock,
        offset: u64,
        src: &[u8],
        mode: Mode,
    ) -> Result<()> {
        block.made(self.gpu.id, src.len() as u64, mode).await?;
        let r = match self.route {
            Route::Direct => super::direct::write(&self.gpu, self.belt.chunk, block, offset, src, mode).await,
            Route::Staged => {
                let r = self.write_staged(block, offset, src, mode).await;
                self.gpu.or_lost(r)
            }
        };
        self.spoil_on(block, r)
    }

    /// Reads `dst.len()` bytes at `offset` of `block` by the device's route.
    pub(crate) async fn read_with(
        &self,
        block: &WgpuBlock,
        offset: u64,
        dst: &mut [u8],
        mode: Mode,
    ) -> Result<()> {
        // Both routes wait for a map, and that wait polls the device, which fires the lost
        // callback of a lost device (and a copy or map on one fails): so no poll up front; a
        // failure is named a loss where it is one.
        block.made(self.gpu.id, dst.len() as u64, mode).await?;
        let r = match self.route {
            Route::Direct => super::direct::read(&self.gpu, self.belt.chunk, block, offset, dst, mode).await,
            Route::Staged => self.belt.download(&self.gpu, block, offset, dst, mode).await,
        };
        let r = self.gpu.or_lost(r);
        self.spoil_on(block, r)
    }

    /// Writes `src` at `offset` through the belt, keeping the bytes around a ragged range.
    async fn write_staged(&self, block: &WgpuBlock, offset: u64, src: &[u8], mode: Mode) -> Result<()> {
        let (gpu, belt) = (&self.gpu, &self.belt);
        let end = offset + src.len() as u64;
        let (a0, a1) = (floor4(offset), ceil4(end));
        if a0 == offset && a1 == end {
            return belt.upload(gpu, &block.buffer, offset, &[src], mode).await;
        }
        // Ragged: read the edge words, merge, write the whole words. The lock keeps two
        // ragged writes that share a word from undoing each other.
        let _held = match mode {
            Mode::Blocking => block.lock_blocking(gpu)?,
            Mode::Async => block.lock_async().await,
        };
        let (head_len, tail_len) = ((offset - a0) as usize, (a1 - end) as usize);
        let mut head = [0u8; 4];
        let mut tail = [0u8; 4];
        if a1 - a0 == 4 {
            // One word holds the whole range.
            belt.download(gpu, block, a0, &mut head, mode).await?;
            head[head_len..head_len + src.len()].copy_from_slice(src);
            return belt.upload(gpu, &block.buffer, a0, &[&head], mode).await;
        }
        if head_len > 0 {
            belt.download(gpu, block, a0, &mut head, mode).await?;
        }
        if tail_len > 0 {
            belt.download(gpu, block, a1 - 4, &mut tail, mode).await?;
        }
        belt.upload(gpu, &block.buffer, a0, &[&head[..head_len], src, &tail[4 - tail_len..]], mode).await
    }

    /// [`Storage::write`] on one buffer.
    pub(crate) fn write_one(&self, block: &WgpuBlock, offset: u64, src: &[u8]) -> Result<()> {
        if self.route == Route::Direct && Current::CAN_BLOCK {
            let r = super::direct::write_blocking(&self.gpu, block, offset, src);
            return self.spoil_on(block, r);
        }
        if !aligned(offset, src.len() as u64) && self.route == Route::Staged {
            blocking_allowed(self.gpu.id, MustWait::RaggedWrite)?;
        }
        run_blocking(self.write_with(block, offset, src, Mode::Blocking))
    }

    /// [`Storage::read`] on one buffer.
    pub(crate) fn read_one(&self, block: &WgpuBlock, offset: u64, dst: &mut [u8]) -> Result<()> {
        blocking_allowed(self.gpu.id, MustWait::Read)?;
        if self.route == Route::Direct && Current::CAN_BLOCK {
            let r = super::direct::read_blocking(&self.gpu, block, offset, dst);
            return self.spoil_on(block, r);
        }
        run_blocking(self.read_with(block, offset, dst, Mode::Blocking))
    }

    /// [`Storage::copy`] between single buffers.
    pub(crate) fn copy_one(
        &self,
        src: &WgpuBlock,
        so: u64,
        dst: &WgpuBlock,
        d_o: u64,
        len: u64,
    ) -> Result<()> {
        if !(aligned(so, len) && aligned(d_o, 0)) {
            blocking_allowed(self.gpu.id, MustWait::RaggedCopy)?;
        }
        run_blocking(self.copy_with(src, so, dst, d_o, len, Mode::Blocking))
    }

    /// `r`; a wgpu failure (`Backend`) on a buffer the app holds, on a device that is fine,
    /// spoils the block (see [`WgpuBlock::spoiled`]).
    pub(crate) fn spoil_on<T>(&self, block: &WgpuBlock, r: Result<T>) -> Result<T> {
        if matches!(r, Err(crate::error::Error::Backend { .. }))
            && block.exposed.load(Ordering::Acquire)
            && !self.gpu.lost.is_lost()
        {
            block.spoiled.store(true, Ordering::Release);
        }
        r
    }
}

impl Storage for WgpuStorage {
    type Block = WgpuBlock;
    type Params = WgpuParams;

    fn device(&self) -> Device {
        self.gpu.id
    }

    fn name(&self) -> String {
        let info = &self.gpu.info;
        format!("{} ({:?}, {:?})", adapter_name(info), info.device_type, self.route)
    }

    fn granularity(&self) -> u64 {
        COPY_ALIGN
    }

    /// The pool's class (512-byte rounding, as `Storage::size_class` says), but never past one
    /// buffer for a request that fits in one: such a tensor stays one buffer, bound as one.
    fn size_class(&self, size: u64) -> Option<u64> {
        let class = crate::storage::default_size_class(size)?;
        Some(if size <= self.limit && class > self.limit { size } else { class })
    }

    fn max_block_size(&self) -> u64 {
        max_block(self.limit, self.segment)
    }

    fn block_alignment(&self, _alignment: u64) -> u64 {
        // A buffer starts at offset 0 of its own allocation; the virtual address carries the
        // alignment.
        1
    }

    fn check_usable(&self) -> Result<()> {
        self.gpu.check_lost()
    }

    fn staging_bytes(&self) -> u64 {
        self.belt.bytes()
    }

    fn device_memory(&self) -> Option<crate::snapshot::MemoryReport> {
        // wgpu 30 has no query for a device's memory size or budget; its allocator report
        // (where the backend keeps one) says what wgpu itself has allocated.
        self.gpu.device.generate_allocator_report().map(|r| crate::snapshot::MemoryReport {
            backend_allocated_bytes: Some(r.total_allocated_bytes),
            backend_reserved_bytes: Some(r.total_reserved_bytes),
            ..Default::default()
        })
    }

    fn segment_sizes(&self, block: &WgpuBlock) -> Vec<u64> {
        block.segment_sizes()
    }

    /// The wgpu buffer is named after the block (`name`: its id and capacity), which stays true
    /// while the block is cached and reused by other allocations; devalloc keeps each
    /// allocation's own label in its records, reports and snapshots (with the block id).
    fn alloc(&self, capacity: u64, _alignment: u64, params: &WgpuParams, name: &str) -> Result<WgpuBlock> {
        let usage = self.usage_of(params);
        if capacity > self.limit {
            return self.segmented(capacity, name, |size, name| self.alloc_one(size, usage, name));
        }
        self.alloc_one(capacity, usage, name)
    }

    fn alloc_async<'a>(
        &'a self,
        capacity: u64,
        _alignment: u64,
        params: &'a WgpuParams,
        name: &'a str,
    ) -> BoxFuture<'a, Result<WgpuBlock>> {
        Box::pin(async move {
            let usage = self.usage_of(params);
            if capacity <= self.limit {
                return Ok(WgpuBlock::new(self.gpu.create_async(name, capacity, usage).await?));
            }
            let (seg, count) = (self.segment, capacity.div_ceil(self.segment));
            let mut made = Vec::new();
            for i in 0..count {
                let label = format!("{name}, segment {} of {count}", i + 1);
                made.push(WgpuBlock::new(
                    self.gpu.create_async(&label, seg.min(capacity - i * seg), usage).await?,
                ));
            }
            let mut first = made.remove(0);
            first.rest = made.into_boxed_slice();
            Ok(first)
        })
    }

    fn refused(&self, block: &WgpuBlock) -> bool {
        block.segments().any(|s| s.refused.load(Ordering::Acquire))
    }

    fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::Acquire)
    }

    /// Destroys the buffer (with `reuse_freed` off): a bind group the app kept past the free
    /// then makes its submit a validation error naming the block, instead of running on the
    /// old bytes. Work already submitted on it completes first (wgpu defers the destruction).
    fn retire(&self, block: &WgpuBlock) {
        block.segments().for_each(|s| s.buffer.destroy());
    }

    fn reusable(&self, block: &WgpuBlock) -> bool {
        !block.segments().any(|s| s.spoiled.load(Ordering::Acquire))
    }

    fn write(&self, block: &WgpuBlock, offset: u64, src: &[u8]) -> Result<()> {
        if block.is_segmented() {
            return self.write_pieces_blocking(block, offset, src);
        }
        self.write_one(block, offset, src)
    }

    fn fill_in_place(
        &self,
        block: &WgpuBlock,
        offset: u64,
        len: u64,
        piece: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Option<(u64, Result<()>)> {
        self.fill_one(block, offset, len, piece, fill)
    }

    fn read(&self, block: &WgpuBlock, offset: u64, dst: &mut [u8]) -> Result<()> {
        if block.is_segmented() {
            return self.read_pieces_blocking(block, offset, dst);
        }
        self.read_one(block, offset, dst)
    }

    fn copy(&self, src: &WgpuBlock, so: u64, dst: &WgpuBlock, d_o: u64, len: u64) -> Result<()> {
        if src.is_segmented() || dst.is_segmented() {
            return self.copy_pieces_blocking(src, so, dst, d_o, len);
        }
        self.copy_one(src, so, dst, d_o, len)
    }

    fn write_async<'a>(
        &'a self,
        block: &'a WgpuBlock,
        offset: u64,
        src: &'a [u8],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.write_pieces(block, offset, src, Mode::Async))
    }

    fn read_async<'a>(
        &'a self,
        block: &'a WgpuBlock,
        offset: u64,
        dst: &'a mut [u8],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.read_pieces(block, offset, dst, Mode::Async))
    }

    fn copy_async<'a>(
        &'a self,
        src: &'a WgpuBlock,
        so: u64,
        dst: &'a WgpuBlock,
        d_o: u64,
        len: u64,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.copy_pieces(src, so, dst, d_o, len, Mode::Async))
    }
}

/// The most segments one block may have: past it a request is `TooLarge` (wgpu cannot tell a
/// device's memory; a request this many buffers long is past any device's).
const MAX_SEGMENTS: u64 = 1 << 16;

/// The most bytes one segmented block may have in the browser, where sizes are 32-bit and a
/// page's GPU memory is a small share of the device's: 1 GiB, four of WebGPU's default
/// 256 MiB buffers (one buffer past it is still served whole where the device allows it).
const MAX_SEGMENTED_WASM: u64 = 1 << 30;

/// The largest block of a storage whose one-buffer limit is `limit` and segment `segment`.
fn max_block(limit: u64, segment: u64) -> u64 {
    if segment == 0 {
        return limit;
    }
    let most = segment.saturating_mul(MAX_SEGMENTS);
    let most = if cfg!(target_arch = "wasm32") { most.min(MAX_SEGMENTED_WASM) } else { most };
    limit.max(most)
}

/// The adapter's name, or a placeholder where it gives none (browsers hide it).
pub(crate) fn adapter_name(info: &wgpu::AdapterInfo) -> &str {
    if info.name.trim().is_empty() {
        "an unnamed adapter"
    } else {
        &info.name
    }
}
