//! [`WgpuStorage`]: wgpu buffers of one device as a [`Storage`] for the generic pool.
//!
//! The copies themselves live in `belt.rs` (staged), `direct.rs` (mapped buffers) and
//! `copy.rs` (between blocks); every wait goes through the platform seam, and every wgpu call
//! through `scope.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_channel::oneshot;

use super::belt::Belt;
use super::lost::Loss;
use super::options::{staging_chunk, Route, WgpuOptions};
use super::platform::{self, MustWait, Waiter};
use super::scope::Raises;
use crate::allocator::BoxFuture;
use crate::bounce::{run_blocking, Mode};
use crate::device::Device;
use crate::error::Result;
use crate::storage::Storage;

/// wgpu's copy alignment.
pub(crate) const COPY_ALIGN: u64 = wgpu::COPY_BUFFER_ALIGNMENT;

pub(crate) fn floor4(v: u64) -> u64 {
    v & !(COPY_ALIGN - 1)
}

pub(crate) fn ceil4(v: u64) -> u64 {
    (v + COPY_ALIGN - 1) & !(COPY_ALIGN - 1)
}

/// Whether `offset..offset + len` is whole 4-byte words.
pub(crate) fn aligned(offset: u64, len: u64) -> bool {
    (offset | len).is_multiple_of(COPY_ALIGN)
}

/// The result a map callback reports.
pub(crate) type MapResult = std::result::Result<(), wgpu::BufferAsyncError>;

/// One wgpu buffer, and the lock that keeps apart what must not overlap on it: mapping it
/// (direct route) and GPU copies queued on it, and two ragged writes that share a word.
pub struct WgpuBlock {
    pub(crate) buffer: wgpu::Buffer,
    pub(crate) lock: async_lock::Mutex<()>,
    /// The buffer has been handed to the app (`WgpuAllocator::buffer` / `buffer_range`), which
    /// may then map or destroy it itself: from then on devalloc's maps of it run in an error
    /// scope (see `WgpuStorage::map_block`). Never cleared: the app may keep its handle.
    pub(crate) exposed: std::sync::atomic::AtomicBool,
    /// A copy on this exposed buffer failed while the device was fine: the app has destroyed
    /// or mapped it. Freed, it is dropped rather than cached for the next allocation.
    pub(crate) spoiled: std::sync::atomic::AtomicBool,
}

/// Per-allocation choices of a wgpu buffer: its usage (bits of `wgpu::BufferUsages`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct WgpuParams {
    usage: u32,
}

impl WgpuParams {
    /// Params for a buffer of this usage (empty: the allocator's default usage).
    pub(crate) fn with_usage(usage: wgpu::BufferUsages) -> Self {
        WgpuParams { usage: usage.bits() }
    }
}

/// wgpu buffers on one device, as a [`Storage`] for the generic pool.
pub struct WgpuStorage {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) id: Device,
    pub(crate) info: wgpu::AdapterInfo,
    pub(crate) limits: wgpu::Limits,
    /// Usage of a buffer allocated without one of its own, copy (and map) flags included.
    pub(crate) default_usage: wgpu::BufferUsages,
    pub(crate) route: Route,
    pub(crate) belt: Belt,
    pub(crate) lost: Arc<Loss>,
    pub(crate) waiter: Waiter,
    max_buffer: u64,
    /// Small uploads written into the queue's staging so far; they reach the GPU with the next
    /// submission (anyone's).
    queued_writes: AtomicU64,
    /// How many of those a submission of devalloc's has carried at least.
    flushed_writes: AtomicU64,
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
        let lost = Loss::of(&device, &queue, id, options.on_device_lost.clone())?;
        let info = device.adapter_info();
        let limits = device.limits();
        let max_buffer = floor4(limits.max_buffer_size);
        let chunk = staging_chunk(options, &info, max_buffer);
        let belt = Belt::new(&info, chunk, options.staging_budget, max_buffer);
        let waiter = Waiter::new(&device, &lost);
        let default_usage = Self::full_usage(route, options.usage);
        Ok(WgpuStorage {
            device,
            queue,
            id,
            info,
            limits,
            default_usage,
            route,
            belt,
            lost,
            waiter,
            max_buffer,
            queued_writes: AtomicU64::new(0),
            flushed_writes: AtomicU64::new(0),
        })
    }

    /// `usage` plus what devalloc needs: copies both ways, and mapping on the direct route.
    pub(crate) fn full_usage(route: Route, usage: wgpu::BufferUsages) -> wgpu::BufferUsages {
        let mut usage = usage | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        if route == Route::Direct {
            usage |= wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::MAP_WRITE;
        }
        usage
    }

    /// The route host<->device copies take.
    pub fn route(&self) -> Route {
        self.route
    }

    /// [`crate::Error::DeviceLost`] once the device is lost (polls first, without blocking).
    pub(crate) fn check_lost(&self) -> Result<()> {
        self.lost.check()
    }

    /// A buffer made inside error scopes.
    pub(crate) fn create(
        &self,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
        mapped: bool,
    ) -> Result<wgpu::Buffer> {
        self.scoped(label, size, Raises::ValidationOrOom, || {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage,
                mapped_at_creation: mapped,
            })
        })
    }

    /// Encodes with `encode` and submits, inside error scopes.
    pub(crate) fn submit(
        &self,
        what: &str,
        encode: impl FnOnce(&mut wgpu::CommandEncoder),
    ) -> Result<wgpu::SubmissionIndex> {
        self.scoped(what, 0, Raises::Validation, || {
            let mut enc =
                self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(what) });
            encode(&mut enc);
            self.submit_flushing(enc.finish())
        })
    }

    /// Submits `commands`, which carries every small upload queued before it.
    pub(crate) fn submit_flushing(&self, commands: wgpu::CommandBuffer) -> wgpu::SubmissionIndex {
        let queued = self.queued_writes.load(Ordering::Acquire);
        let index = self.queue.submit([commands]);
        self.flushed_writes.fetch_max(queued, Ordering::AcqRel);
        index
    }

    /// Notes a small upload written into the queue's staging.
    pub(crate) fn note_queued_write(&self) {
        self.queued_writes.fetch_add(1, Ordering::AcqRel);
    }

    /// Submits nothing but the queue's pending writes, if devalloc queued any since its last
    /// submission (otherwise there is nothing of devalloc's to flush: on GL an empty submission
    /// costs a fence, a few microseconds).
    pub(crate) fn flush_queued_writes(&self) {
        let queued = self.queued_writes.load(Ordering::Acquire);
        if queued > self.flushed_writes.load(Ordering::Acquire) {
            self.queue.submit([]);
            self.flushed_writes.fetch_max(queued, Ordering::AcqRel);
        }
    }

    /// Asks for `buffer[range]` to be mapped (inside an error scope: a destroyed buffer is an
    /// error, not a panic); the receiver gets the callback's result.
    pub(crate) fn map(
        &self,
        buffer: &wgpu::Buffer,
        mode: wgpu::MapMode,
        range: std::ops::Range<u64>,
    ) -> Result<oneshot::Receiver<MapResult>> {
        let (tx, rx) = oneshot::channel();
        self.map_with(buffer, mode, range, move |r| {
            let _ = tx.send(r);
        })?;
        Ok(rx)
    }

    /// [`WgpuStorage::map`] with a callback of the caller's.
    pub(crate) fn map_with(
        &self,
        buffer: &wgpu::Buffer,
        mode: wgpu::MapMode,
        range: std::ops::Range<u64>,
        callback: impl FnOnce(MapResult) + wgpu::WasmNotSend + 'static,
    ) -> Result<()> {
        self.scoped("mapping a buffer", 0, Raises::Validation, || buffer.map_async(mode, range, callback))
    }

    /// Asks for `block[range]` to be mapped, for the direct route. Only a buffer the app holds
    /// (`exposed`) gets an error scope: wgpu-core checks the device before anything else and
    /// keeps a lost device's refusal out of every error handler, devalloc's maps of a block are
    /// serialized by its lock and the range and usage are right by construction, so a map of a
    /// buffer no one else holds cannot raise an error (wgpu hands the callback the refusal of a
    /// lost device). The one gap is a race of a few instructions inside wgpu: the app destroys
    /// the device, and another thread's poll releases its buffers, between wgpu's validity check
    /// and its destroyed check; the error would then reach the app's handler. A scope costs
    /// ~40-60 ns (wgpu locks its error sink and looks up the thread's scope stack, twice).
    pub(crate) fn map_block(
        &self,
        block: &WgpuBlock,
        mode: wgpu::MapMode,
        range: std::ops::Range<u64>,
        callback: impl FnOnce(MapResult) + wgpu::WasmNotSend + 'static,
    ) -> Result<()> {
        if block.exposed.load(std::sync::atomic::Ordering::Acquire) || !platform::SCOPE_CHECKED_WORK {
            return self.map_with(&block.buffer, mode, range, callback);
        }
        if self.lost.is_lost() {
            return Err(self.lost.error());
        }
        block.buffer.map_async(mode, range, callback);
        Ok(())
    }

    /// Unmaps `buffer` inside an error scope (after a loss, unmapping a destroyed buffer is a
    /// validation error that must not reach the app's handler); what it catches is logged.
    pub(crate) fn unmap(&self, buffer: &wgpu::Buffer) {
        if self.lost.is_lost() {
            return;
        }
        if let Err(e) = self.scoped("unmapping a buffer", 0, Raises::Validation, || buffer.unmap()) {
            log::debug!("devalloc: {e}");
        }
    }

    /// Waits for a map callback and turns a failed map into an error.
    pub(crate) async fn wait_mapped(
        &self,
        rx: oneshot::Receiver<MapResult>,
        index: Option<wgpu::SubmissionIndex>,
        mode: Mode,
    ) -> Result<()> {
        let mapped = platform::wait(self, rx, index, mode, false).await?;
        mapped.map_err(|e| self.backend_error("mapping a buffer", e))
    }

    /// Flushes queued work and returns once the GPU has finished it.
    pub(crate) async fn sync_with(&self, mode: Mode) -> Result<()> {
        // The wait polls, which reports a loss (see `read_with`): no poll up front.
        if self.lost.is_lost() {
            return Err(self.lost.error());
        }
        let (tx, rx) = oneshot::channel();
        self.flush_queued_writes();
        self.queue.on_submitted_work_done(move || {
            let _ = tx.send(());
        });
        let r = platform::wait(self, rx, None, mode, false).await;
        self.or_lost(r)?;
        // One poll can run the work-done callback before the lost one (wgpu fires them in that
        // order): a device destroyed before this call has finished "its" work, and is lost.
        if self.lost.is_lost() {
            return Err(self.lost.error());
        }
        Ok(())
    }

    /// `r`, or [`crate::Error::DeviceLost`] when it failed because the device is lost (the
    /// decision is `lost.rs`'s).
    pub(crate) fn or_lost<T>(&self, r: Result<T>) -> Result<T> {
        self.lost.or_lost(r)
    }

    /// Waits for all submitted work (blocking; in the browser: `NotSupported`, use the async).
    pub(crate) fn synchronize(&self) -> Result<()> {
        platform::blocking_allowed(self, MustWait::Synchronize)?;
        run_blocking(self.sync_with(Mode::Blocking))
    }

    /// Writes `src` at `offset` of `block` by the device's route. (The direct route's map
    /// polls anyway, and reports a loss through it; the staged route's uploads notice a loss
    /// as `upload_aligned` says.)
    pub(crate) async fn write_with(
        &self,
        block: &WgpuBlock,
        offset: u64,
        src: &[u8],
        mode: Mode,
    ) -> Result<()> {
        let r = match self.route {
            Route::Direct => self.write_direct(block, offset, src, mode).await,
            Route::Staged => {
                let r = self.write_staged(block, offset, src, mode).await;
                self.or_lost(r)
            }
        };
        self.spoil_on(block, r)
    }

    /// After wgpu refused work because the device is no longer valid: the loss, once wgpu has
    /// reported it (see `Loss::settle`).
    pub(crate) fn settle_loss(&self) -> crate::Error {
        self.lost.settle()
    }

    /// `r`; a wgpu failure (`Backend`) on a buffer the app holds, on a device that is fine,
    /// spoils the block (see [`WgpuBlock::spoiled`]).
    pub(crate) fn spoil_on<T>(&self, block: &WgpuBlock, r: Result<T>) -> Result<T> {
        if matches!(r, Err(crate::Error::Backend { .. }))
            && block.exposed.load(Ordering::Acquire)
            && !self.lost.is_lost()
        {
            block.spoiled.store(true, Ordering::Release);
        }
        r
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
        let r = match self.route {
            Route::Direct => self.read_direct(block, offset, dst, mode).await,
            Route::Staged => self.read_staged(block, offset, dst, mode).await,
        };
        let r = self.or_lost(r);
        self.spoil_on(block, r)
    }
}

impl Storage for WgpuStorage {
    type Block = WgpuBlock;
    type Params = WgpuParams;
    const FIXED_LABELS: bool = true;

    fn device(&self) -> Device {
        self.id
    }

    fn name(&self) -> String {
        format!("{} ({:?}, {:?})", self.info.name, self.info.device_type, self.route)
    }

    fn granularity(&self) -> u64 {
        COPY_ALIGN
    }

    fn max_block_size(&self) -> u64 {
        self.max_buffer
    }

    fn block_alignment(&self, _alignment: u64) -> u64 {
        // A buffer starts at offset 0 of its own allocation; the virtual address carries the
        // alignment.
        1
    }

    fn check_usable(&self) -> Result<()> {
        self.check_lost()
    }

    fn staging_bytes(&self) -> u64 {
        self.belt.bytes()
    }

    fn device_memory(&self) -> Option<crate::snapshot::MemoryReport> {
        // wgpu 30 has no query for a device's memory size or budget; its allocator report
        // (where the backend keeps one) says what wgpu itself has allocated.
        self.device.generate_allocator_report().map(|r| crate::snapshot::MemoryReport {
            backend_allocated_bytes: Some(r.total_allocated_bytes),
            backend_reserved_bytes: Some(r.total_reserved_bytes),
            ..Default::default()
        })
    }

    fn alloc(
        &self,
        capacity: u64,
        _alignment: u64,
        params: &WgpuParams,
        label: Option<&str>,
    ) -> Result<WgpuBlock> {
        let usage = match wgpu::BufferUsages::from_bits_truncate(params.usage) {
            u if u.is_empty() => self.default_usage,
            u => Self::full_usage(self.route, u),
        };
        let buffer = self.create(label.unwrap_or("devalloc buffer"), capacity, usage, false)?;
        Ok(WgpuBlock {
            buffer,
            lock: async_lock::Mutex::new(()),
            exposed: Default::default(),
            spoiled: Default::default(),
        })
    }

    fn reusable(&self, block: &WgpuBlock) -> bool {
        !block.spoiled.load(Ordering::Acquire)
    }

    fn write(&self, block: &WgpuBlock, offset: u64, src: &[u8]) -> Result<()> {
        if self.route == Route::Direct && platform::CAN_BLOCK {
            let r = self.write_direct_blocking(block, offset, src);
            return self.spoil_on(block, r);
        }
        if !aligned(offset, src.len() as u64) && self.route == Route::Staged {
            platform::blocking_allowed(self, MustWait::RaggedWrite)?;
        }
        run_blocking(self.write_with(block, offset, src, Mode::Blocking))
    }

    fn read(&self, block: &WgpuBlock, offset: u64, dst: &mut [u8]) -> Result<()> {
        platform::blocking_allowed(self, MustWait::Read)?;
        if self.route == Route::Direct && platform::CAN_BLOCK {
            let r = self.read_direct_blocking(block, offset, dst);
            return self.spoil_on(block, r);
        }
        run_blocking(self.read_with(block, offset, dst, Mode::Blocking))
    }

    fn copy(&self, src: &WgpuBlock, so: u64, dst: &WgpuBlock, d_o: u64, len: u64) -> Result<()> {
        if !(aligned(so, len) && aligned(d_o, 0)) {
            platform::blocking_allowed(self, MustWait::RaggedCopy)?;
        }
        run_blocking(self.copy_with(src, so, dst, d_o, len, Mode::Blocking))
    }

    fn write_async<'a>(
        &'a self,
        block: &'a WgpuBlock,
        offset: u64,
        src: &'a [u8],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.write_with(block, offset, src, Mode::Async))
    }

    fn read_async<'a>(
        &'a self,
        block: &'a WgpuBlock,
        offset: u64,
        dst: &'a mut [u8],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.read_with(block, offset, dst, Mode::Async))
    }

    fn copy_async<'a>(
        &'a self,
        src: &'a WgpuBlock,
        so: u64,
        dst: &'a WgpuBlock,
        d_o: u64,
        len: u64,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.copy_with(src, so, dst, d_o, len, Mode::Async))
    }
}
