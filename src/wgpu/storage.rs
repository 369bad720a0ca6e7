//! [`WgpuStorage`]: wgpu buffers under the generic pool, with staged buffer mapping.
//!
//! # Staging protocol
//!
//! A GPU buffer is never mapped while the GPU may use it, so host<->device copies go through
//! staging buffers kept in a belt and reused:
//!
//! - **upload**: take a *mapped* `MAP_WRITE` staging buffer from the belt (or create one mapped
//!   at creation), write the bytes into it, unmap, encode `copy_buffer_to_buffer`, submit, and
//!   ask for it to be mapped again; its map callback puts it back in the belt once the GPU has
//!   read it. The call returns as soon as the copy is submitted (queue order makes every later
//!   operation see the data).
//! - **download**: copy a chunk into an idle `MAP_READ` staging buffer, submit, `map_async`; up
//!   to [`PIPELINE_DEPTH`] chunks are in flight, so the GPU copies chunk i+1 while the host reads
//!   chunk i; then unmap and put the buffer back.
//!
//! wgpu wants copies of 4-byte multiples at 4-byte offsets and maps at 8-byte offsets. Reads of
//! any range copy the enclosing aligned range and keep the wanted part. Writes with ragged edges
//! read the (at most two) edge words first and write them back merged, so neighbouring bytes are
//! untouched; the block's lock keeps two ragged writes to one word apart.
//!
//! On adapters with unified memory (CPU or integrated) that offer `MAPPABLE_PRIMARY_BUFFERS`,
//! the *direct* route maps the primary buffer itself and skips staging.
//!
//! Every wgpu call that can fail runs inside validation and out-of-memory error scopes; a lost
//! device turns every later call into [`Error::DeviceLost`].

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
#[cfg(web)]
use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use crate::allocator::BoxFuture;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::pool::Storage;

/// Chunks of a download in flight at once.
pub const PIPELINE_DEPTH: usize = 3;
/// wgpu's copy alignment.
const COPY_ALIGN: u64 = wgpu::COPY_BUFFER_ALIGNMENT;
/// Uploads up to this size go through `queue.write_buffer_with` (measured faster below it).
const SMALL_UPLOAD: u64 = 1 << 20;
/// Reads up to this size use small staging buffers of this size.
const SMALL_DOWNLOAD: u64 = 64 << 10;
/// Bytes of small uploads after which the queue is flushed.
const FLUSH_PENDING: u64 = 8 << 20;
/// Upload staging buffers kept at most (more are made when all are in flight, then dropped).
const MAX_IDLE_STAGING: usize = 4;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn floor4(v: u64) -> u64 {
    v & !(COPY_ALIGN - 1)
}

fn ceil4(v: u64) -> u64 {
    (v + COPY_ALIGN - 1) & !(COPY_ALIGN - 1)
}

/// A lock that can be held across `.await` without blocking a thread: waiters park their
/// wakers and are woken when the holder lets go (in the browser there is only one thread).
#[derive(Default)]
struct AsyncLock {
    state: Mutex<(bool, Vec<Waker>)>,
}

struct AsyncGuard<'a>(&'a AsyncLock);

impl AsyncLock {
    fn lock(&self) -> impl std::future::Future<Output = AsyncGuard<'_>> + '_ {
        std::future::poll_fn(move |cx| {
            let mut s = lock(&self.state);
            if s.0 {
                s.1.push(cx.waker().clone());
                std::task::Poll::Pending
            } else {
                s.0 = true;
                std::task::Poll::Ready(AsyncGuard(self))
            }
        })
    }
}

impl Drop for AsyncGuard<'_> {
    fn drop(&mut self) {
        let waiters = {
            let mut s = lock(&self.0.state);
            s.0 = false;
            std::mem::take(&mut s.1)
        };
        waiters.into_iter().for_each(Waker::wake);
    }
}

/// One wgpu buffer, the lock that keeps direct mapping away from queued copies, and the one
/// that keeps two ragged writes to a shared word apart.
pub struct WgpuBlock {
    buffer: wgpu::Buffer,
    io: Mutex<()>,
    ragged: AsyncLock,
}

impl WgpuBlock {
    /// The wgpu buffer.
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }
}

/// How host<->device copies reach the buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Through reusable staging buffers (every adapter).
    Staged,
    /// By mapping the primary buffer itself (unified memory with `MAPPABLE_PRIMARY_BUFFERS`).
    Direct,
}

type MapResult = std::result::Result<(), wgpu::BufferAsyncError>;

/// A one-shot slot a map callback fills; a future on the web, polled through on native.
#[derive(Default)]
struct Slot {
    state: Mutex<(Option<MapResult>, Option<Waker>)>,
}

impl Slot {
    fn fill(&self, r: MapResult) {
        let mut s = lock(&self.state);
        s.0 = Some(r);
        if let Some(w) = s.1.take() {
            w.wake();
        }
    }

    fn try_take(&self) -> Option<MapResult> {
        lock(&self.state).0.take()
    }
}

#[cfg(web)]
struct SlotFuture(Arc<Slot>);

#[cfg(web)]
impl Future for SlotFuture {
    type Output = MapResult;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = lock(&self.0.state);
        match s.0.take() {
            Some(r) => Poll::Ready(r),
            None => {
                s.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Reusable staging buffers.
#[derive(Default)]
struct Belt {
    /// Mapped `MAP_WRITE` buffers ready to be written.
    upload_ready: Vec<wgpu::Buffer>,
    /// Unmapped `MAP_READ` buffers of a chunk.
    download_idle: Vec<wgpu::Buffer>,
    /// Unmapped `MAP_READ` buffers for small reads.
    download_small: Vec<wgpu::Buffer>,
}

/// wgpu buffers on one device, as a [`Storage`] for the generic pool.
pub struct WgpuStorage {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) id: Device,
    pub(crate) info: wgpu::AdapterInfo,
    pub(crate) usage: wgpu::BufferUsages,
    pub(crate) route: Route,
    chunk: u64,
    max_buffer: u64,
    belt: Arc<Mutex<Belt>>,
    lost: Arc<Mutex<Option<String>>>,
    pending: std::sync::atomic::AtomicU64,
}

impl WgpuStorage {
    pub(crate) fn new(
        device: wgpu::Device,
        queue: wgpu::Queue,
        id: Device,
        usage: wgpu::BufferUsages,
        route: Route,
        chunk: u64,
    ) -> Self {
        let lost = Arc::new(Mutex::new(None));
        let lost_cb = Arc::clone(&lost);
        device.set_device_lost_callback(move |reason, message| {
            log::error!("devalloc: {id} lost ({reason:?}): {message}");
            *lock(&lost_cb) = Some(format!("{reason:?}: {message}"));
        });
        // wgpu's default handler panics; everything devalloc does is scoped, so whatever
        // reaches this handler came from outside devalloc or from a callback: log it.
        device.on_uncaptured_error(Arc::new(move |e| {
            log::error!("devalloc: uncaptured wgpu error on {id}: {e}")
        }));
        let info = device.adapter_info();
        let max_buffer = floor4(device.limits().max_buffer_size);
        let chunk = ceil4(chunk.clamp(64 << 10, max_buffer.max(64 << 10)));
        WgpuStorage {
            device,
            queue,
            id,
            info,
            usage,
            route,
            chunk,
            max_buffer,
            belt: Arc::default(),
            lost,
            pending: Default::default(),
        }
    }

    /// The route host<->device copies take.
    pub fn route(&self) -> Route {
        self.route
    }

    fn check_lost(&self) -> Result<()> {
        match lock(&self.lost).as_ref() {
            Some(reason) => Err(Error::DeviceLost { device: self.id, reason: reason.clone() }),
            None => Ok(()),
        }
    }

    fn backend_error(&self, what: &str, e: impl std::fmt::Display) -> Error {
        Error::backend(self.id, format!("{what}: {e}"))
    }

    /// Turns what an error scope caught into a devalloc error.
    #[cfg(native)]
    fn caught(&self, what: &str, requested: u64, caught: Option<wgpu::Error>) -> Result<()> {
        match caught {
            None => Ok(()),
            Some(wgpu::Error::OutOfMemory { .. }) => Err(Error::OutOfMemory {
                requested,
                device: self.id,
                detail: format!("wgpu reported out of memory during {what}"),
            }),
            Some(e) => {
                self.check_lost()?;
                Err(Error::Backend {
                    device: self.id,
                    message: format!("{what}: {e}"),
                    source: Some(Box::new(e)),
                })
            }
        }
    }

    /// Pushes a validation scope and, inside it, an out-of-memory scope.
    fn push_scopes(&self) -> (wgpu::ErrorScopeGuard, wgpu::ErrorScopeGuard) {
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        (oom, validation)
    }

    /// Pops the two scopes (innermost first); the future says what either caught.
    fn pop_scopes(
        oom: wgpu::ErrorScopeGuard,
        validation: wgpu::ErrorScopeGuard,
    ) -> impl std::future::Future<Output = Option<wgpu::Error>> {
        let oom = oom.pop();
        let validation = validation.pop();
        async move { oom.await.or(validation.await) }
    }

    /// Runs `f` inside error scopes and turns what they caught into devalloc errors.
    #[cfg(native)]
    fn scoped<T>(&self, what: &str, requested: u64, f: impl FnOnce() -> T) -> Result<T> {
        self.check_lost()?;
        let (oom, validation) = self.push_scopes();
        let value = f();
        self.caught(what, requested, resolve(Self::pop_scopes(oom, validation)))?;
        Ok(value)
    }

    /// Runs `f` inside error scopes. In the browser a scope's verdict arrives later and nothing
    /// may wait for it, so what it catches is logged; the sizes and ranges devalloc checks up
    /// front keep wgpu from refusing in the first place.
    #[cfg(web)]
    fn scoped<T>(&self, what: &str, requested: u64, f: impl FnOnce() -> T) -> Result<T> {
        self.check_lost()?;
        let (oom, validation) = self.push_scopes();
        let value = f();
        let caught = Self::pop_scopes(oom, validation);
        let (id, what) = (self.id, what.to_string());
        wasm_bindgen_futures::spawn_local(async move {
            if let Some(e) = caught.await {
                log::error!("devalloc: {id}: {what} ({requested} bytes): {e}");
            }
        });
        Ok(value)
    }

    fn create(
        &self,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
        mapped: bool,
    ) -> Result<wgpu::Buffer> {
        self.scoped(label, size, || {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage,
                mapped_at_creation: mapped,
            })
        })
    }

    fn submit(
        &self,
        what: &str,
        encode: impl FnOnce(&mut wgpu::CommandEncoder),
    ) -> Result<wgpu::SubmissionIndex> {
        self.scoped(what, 0, || {
            let mut enc =
                self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(what) });
            encode(&mut enc);
            self.queue.submit([enc.finish()])
        })
    }

    /// Asks for `buffer[range]` to be mapped; the returned slot is filled by the callback.
    fn map(&self, buffer: &wgpu::Buffer, mode: wgpu::MapMode, range: Range<u64>) -> Arc<Slot> {
        let slot = Arc::new(Slot::default());
        let s = Arc::clone(&slot);
        buffer.map_async(mode, range, move |r| s.fill(r));
        slot
    }

    /// Waits until a map callback has filled `slot`.
    async fn wait(&self, slot: Arc<Slot>, index: Option<wgpu::SubmissionIndex>) -> Result<()> {
        let r = self.wait_inner(slot, index).await;
        self.check_lost()?;
        r.map_err(|e| self.backend_error("mapping a buffer", e))
    }

    #[cfg(native)]
    async fn wait_inner(&self, slot: Arc<Slot>, index: Option<wgpu::SubmissionIndex>) -> MapResult {
        loop {
            if let Some(r) = slot.try_take() {
                return r;
            }
            self.check_lost().map_err(|_| wgpu::BufferAsyncError)?;
            let wait = wgpu::PollType::Wait { submission_index: index.clone(), timeout: None };
            if let Err(e) = self.device.poll(wait) {
                log::error!("devalloc: polling {}: {e}", self.id);
                return slot.try_take().unwrap_or(Err(wgpu::BufferAsyncError));
            }
        }
    }

    /// In the browser: WebGPU fires map callbacks from the event loop, so await the slot;
    /// wgpu's WebGL2 backend fires them only from `device.poll`, so poll and yield to the
    /// browser (setTimeout 0) until it is filled.
    #[cfg(web)]
    async fn wait_inner(&self, slot: Arc<Slot>, _index: Option<wgpu::SubmissionIndex>) -> MapResult {
        if self.info.backend != wgpu::Backend::Gl {
            return SlotFuture(slot).await;
        }
        loop {
            self.poll_now();
            if let Some(r) = slot.try_take() {
                return r;
            }
            yield_to_browser().await;
        }
    }

    // ---- uploads ----

    fn take_upload_staging(&self) -> Result<wgpu::Buffer> {
        if let Some(b) = lock(&self.belt).upload_ready.pop() {
            return Ok(b);
        }
        // Give map callbacks of earlier uploads a chance to hand their buffers back.
        self.poll_now();
        if let Some(b) = lock(&self.belt).upload_ready.pop() {
            return Ok(b);
        }
        self.create(
            "devalloc upload staging",
            self.chunk,
            wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
            true,
        )
    }

    /// Maps an upload staging buffer again after use; the callback returns it to the belt.
    fn recycle_upload_staging(&self, staging: wgpu::Buffer) {
        let belt = Arc::clone(&self.belt);
        let b = staging.clone();
        staging.map_async(wgpu::MapMode::Write, .., move |r| {
            let mut belt = lock(&belt);
            if r.is_ok() && belt.upload_ready.len() < MAX_IDLE_STAGING {
                belt.upload_ready.push(b);
            }
        });
    }

    /// Uploads the bytes of `parts` (concatenated, 4-byte multiple in all) to `dst[at..]`:
    /// small ones through the queue (wgpu batches them into the next submit), large ones
    /// through the belt.
    fn upload_aligned(&self, dst: &wgpu::Buffer, at: u64, parts: &[&[u8]]) -> Result<()> {
        let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
        debug_assert!(at % COPY_ALIGN == 0 && total % COPY_ALIGN == 0);
        let Some(size) = wgpu::BufferSize::new(total) else { return Ok(()) };
        if total <= SMALL_UPLOAD {
            if let [whole] = parts {
                // One slice: hand it to the queue as it is (on the web this skips a copy).
                self.scoped("devalloc small upload", total, || self.queue.write_buffer(dst, at, whole))?;
                self.count_pending(total);
                return Ok(());
            }
            return self
                .scoped("devalloc small upload", total, || {
                    let Some(mut view) = self.queue.write_buffer_with(dst, at, size) else { return false };
                    let mut filled = 0;
                    for p in parts {
                        view.slice(filled..filled + p.len()).copy_from_slice(p);
                        filled += p.len();
                    }
                    true
                })?
                .then(|| self.count_pending(total))
                .ok_or_else(|| self.backend_error("small upload", "wgpu refused the write"));
        }
        let mut src = Cursor::new(parts);
        let mut done = 0;
        while done < total {
            let n = (total - done).min(self.chunk);
            let staging = self.take_upload_staging()?;
            {
                let mut view = staging
                    .get_mapped_range_mut(0..n)
                    .map_err(|e| self.backend_error("upload staging", e))?;
                let mut filled = 0usize;
                while (filled as u64) < n {
                    let piece = src.next_piece((n as usize) - filled);
                    view.slice(filled..filled + piece.len()).copy_from_slice(piece);
                    filled += piece.len();
                }
            }
            staging.unmap();
            self.submit("devalloc upload", |enc| enc.copy_buffer_to_buffer(&staging, 0, dst, at + done, n))?;
            self.recycle_upload_staging(staging);
            done += n;
        }
        Ok(())
    }

    /// Writes `src` at `offset`, keeping the bytes around a ragged range.
    async fn write_staged(&self, block: &WgpuBlock, offset: u64, src: &[u8]) -> Result<()> {
        let end = offset + src.len() as u64;
        let (a0, a1) = (floor4(offset), ceil4(end));
        if a0 == offset && a1 == end {
            return self.upload_aligned(&block.buffer, offset, &[src]);
        }
        // Ragged: read the edge words, merge, write the aligned range. The lock keeps two
        // ragged writes that share a word from undoing each other.
        let _guard = block.ragged.lock().await;
        let mut head = [0u8; 4];
        let mut tail = [0u8; 4];
        let head_len = (offset - a0) as usize;
        let tail_len = (a1 - end) as usize;
        if a1 - a0 == 4 {
            // One word holds the whole range.
            self.read_staged(block, a0, &mut head).await?;
            let mut word = head;
            word[head_len..head_len + src.len()].copy_from_slice(src);
            return self.upload_aligned(&block.buffer, a0, &[&word]);
        }
        if head_len > 0 {
            self.read_staged(block, a0, &mut head).await?;
        }
        if tail_len > 0 {
            self.read_staged(block, a1 - 4, &mut tail).await?;
        }
        let head_keep = &head[..head_len];
        let tail_keep = &tail[4 - tail_len..];
        self.upload_aligned(&block.buffer, a0, &[head_keep, src, tail_keep])
    }

    /// Writes `src` at `offset` by whichever route the device takes.
    async fn write_any(&self, block: &WgpuBlock, offset: u64, src: &[u8]) -> Result<()> {
        self.check_lost()?;
        match self.route {
            Route::Direct => self.write_direct(block, offset, src),
            Route::Staged => self.write_staged(block, offset, src).await,
        }
    }

    /// Copies `len` bytes between blocks, through the host where wgpu cannot (ragged ranges).
    async fn copy_any(
        &self,
        src: &WgpuBlock,
        src_offset: u64,
        dst: &WgpuBlock,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        if (src_offset | dst_offset | len) % COPY_ALIGN == 0 {
            return self.copy_aligned(src, src_offset, dst, dst_offset, len);
        }
        let mut tmp = vec![0u8; len as usize];
        self.read_any(src, src_offset, &mut tmp).await?;
        self.write_any(dst, dst_offset, &tmp).await
    }

    /// The error a blocking call gets in the browser, naming its async twin.
    #[cfg(web)]
    fn must_not_block(&self, operation: &'static str, twin: &str) -> Error {
        Error::NotSupported {
            operation,
            device_type: self.id.device_type,
            reason: format!(
                "in the browser this has to wait for the GPU and nothing may block: use {twin} (e.g. DeviceAllocator::{twin}(...).await)"
            ),
        }
    }

    /// Small uploads wait in wgpu's queue until the next submit; flush them once enough have
    /// piled up, so staging memory stays bounded when nothing else submits.
    fn count_pending(&self, bytes: u64) {
        let before = self.pending.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        if before + bytes >= FLUSH_PENDING {
            self.pending.store(0, std::sync::atomic::Ordering::Relaxed);
            self.queue.submit([]);
        }
    }

    // ---- downloads ----

    /// An idle download staging buffer for `n` bytes: a small one for small reads (mapping a
    /// few bytes of a chunk-sized buffer measured slower on lavapipe), else a chunk.
    fn take_download_staging(&self, n: u64) -> Result<wgpu::Buffer> {
        let small = n <= SMALL_DOWNLOAD;
        {
            let mut belt = lock(&self.belt);
            let idle = if small { &mut belt.download_small } else { &mut belt.download_idle };
            if let Some(b) = idle.pop() {
                return Ok(b);
            }
        }
        self.create(
            "devalloc download staging",
            if small { SMALL_DOWNLOAD } else { self.chunk },
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            false,
        )
    }

    fn return_download_staging(&self, b: wgpu::Buffer) {
        let mut belt = lock(&self.belt);
        let idle =
            if b.size() <= SMALL_DOWNLOAD { &mut belt.download_small } else { &mut belt.download_idle };
        if idle.len() < MAX_IDLE_STAGING {
            idle.push(b);
        }
    }

    /// Reads `dst.len()` bytes at `offset` through staging, chunked and pipelined.
    pub(crate) async fn read_staged(&self, block: &WgpuBlock, offset: u64, dst: &mut [u8]) -> Result<()> {
        let end = offset + dst.len() as u64;
        let (a0, a1) = (floor4(offset), ceil4(end));
        let total = a1 - a0;
        let mut inflight: VecDeque<(wgpu::Buffer, u64, u64, Arc<Slot>, wgpu::SubmissionIndex)> =
            VecDeque::new();
        let mut pos = 0;
        while pos < total || !inflight.is_empty() {
            while pos < total && inflight.len() < PIPELINE_DEPTH {
                let n = (total - pos).min(self.chunk);
                let staging = self.take_download_staging(n)?;
                let idx = self.submit("devalloc download", |enc| {
                    enc.copy_buffer_to_buffer(&block.buffer, a0 + pos, &staging, 0, n)
                })?;
                let slot = self.map(&staging, wgpu::MapMode::Read, 0..n);
                inflight.push_back((staging, pos, n, slot, idx));
                pos += n;
            }
            let Some((staging, cpos, n, slot, idx)) = inflight.pop_front() else { break };
            self.wait(slot, Some(idx)).await?;
            {
                let view =
                    staging.get_mapped_range(0..n).map_err(|e| self.backend_error("download staging", e))?;
                // The chunk covers [a0 + cpos, a0 + cpos + n); keep its part inside [offset, end).
                let lo = (a0 + cpos).max(offset);
                let hi = (a0 + cpos + n).min(end);
                dst[(lo - offset) as usize..(hi - offset) as usize]
                    .copy_from_slice(&view[(lo - a0 - cpos) as usize..(hi - a0 - cpos) as usize]);
            }
            staging.unmap();
            self.return_download_staging(staging);
        }
        Ok(())
    }

    // ---- the direct route ----

    /// Maps the aligned range around `offset..offset + len` of the block itself, runs `f` on
    /// the buffer, that range and the offset of `offset` in it, and unmaps.
    fn with_mapped(
        &self,
        block: &WgpuBlock,
        mode: wgpu::MapMode,
        offset: u64,
        len: usize,
        f: impl FnOnce(&wgpu::Buffer, Range<u64>, usize) -> std::result::Result<(), wgpu::MapRangeError>,
    ) -> Result<()> {
        let range = offset & !(wgpu::MAP_ALIGNMENT - 1)..ceil4(offset + len as u64);
        let _guard = lock(&block.io);
        self.check_lost()?;
        let slot = self.map(&block.buffer, mode, range.clone());
        pollster::block_on(self.wait(slot, None))?;
        let at = (offset - range.start) as usize;
        let r = f(&block.buffer, range, at).map_err(|e| self.backend_error("mapping a device buffer", e));
        block.buffer.unmap();
        r
    }

    fn write_direct(&self, block: &WgpuBlock, offset: u64, src: &[u8]) -> Result<()> {
        self.with_mapped(block, wgpu::MapMode::Write, offset, src.len(), |buffer, range, at| {
            buffer
                .get_mapped_range_mut(range)
                .map(|mut view| view.slice(at..at + src.len()).copy_from_slice(src))
        })
    }

    fn read_direct(&self, block: &WgpuBlock, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.with_mapped(block, wgpu::MapMode::Read, offset, dst.len(), |buffer, range, at| {
            buffer.get_mapped_range(range).map(|view| dst.copy_from_slice(&view[at..at + dst.len()]))
        })
    }

    /// Reads `dst.len()` bytes at `offset` without blocking the thread where that matters.
    async fn read_any(&self, block: &WgpuBlock, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.check_lost()?;
        match self.route {
            Route::Direct => self.read_direct(block, offset, dst),
            Route::Staged => self.read_staged(block, offset, dst).await,
        }
    }

    /// Clears `len` bytes at `offset` (both multiples of 4) to zero on the GPU.
    pub(crate) fn clear(&self, block: &WgpuBlock, offset: u64, len: u64) -> Result<()> {
        let _guard = lock(&block.io);
        self.submit("devalloc clear", |enc| enc.clear_buffer(&block.buffer, offset, Some(len))).map(drop)
    }

    /// Flushes queued work and resolves once the GPU has finished it, without blocking the
    /// thread (on every backend, WebGL2 included).
    pub(crate) async fn idle(&self) -> Result<()> {
        self.check_lost()?;
        let slot = Arc::new(Slot::default());
        let s = Arc::clone(&slot);
        self.queue.submit([]);
        self.queue.on_submitted_work_done(move || s.fill(Ok(())));
        self.wait(slot, None).await
    }

    /// Maps `buffer[range]` (any buffer of this device) and resolves once it is mapped.
    pub(crate) async fn map_buffer(
        &self,
        buffer: &wgpu::Buffer,
        mode: wgpu::MapMode,
        range: Range<u64>,
    ) -> Result<()> {
        self.check_lost()?;
        let slot = self.map(buffer, mode, range);
        self.wait(slot, None).await
    }

    /// Runs ready callbacks without waiting (in the browser only WebGL2 needs it; for WebGPU
    /// it does nothing and the event loop runs them).
    fn poll_now(&self) {
        let _ = self.device.poll(wgpu::PollType::Poll);
    }

    /// Flushes queued uploads and waits for all submitted work (native); in the browser it
    /// only flushes.
    #[cfg(native)]
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.check_lost()?;
        self.queue.submit([]);
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(drop)
            .map_err(|e| self.backend_error("waiting for the device", e))
    }

    /// Flushes queued uploads and waits for all submitted work (native); in the browser it
    /// only flushes.
    #[cfg(web)]
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.check_lost()?;
        self.queue.submit([]);
        Ok(())
    }
}

/// The value of a future that is ready at once (wgpu-core's error scopes, aligned uploads,
/// direct-mapped copies; staged reads wait inside their first poll on native), without the
/// cost of setting up an executor; blocks on it otherwise.
#[cfg(native)]
fn resolve<T>(fut: impl std::future::Future<Output = T>) -> T {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => pollster::block_on(fut),
    }
}

/// Lets the browser run its event loop once (a `setTimeout(0)` promise).
#[cfg(web)]
async fn yield_to_browser() {
    use wasm_bindgen::JsCast;
    let promise = js_sys::Promise::new(&mut |resolve, _reject| {
        let global = js_sys::global();
        let set_timeout = js_sys::Reflect::get(&global, &"setTimeout".into())
            .ok()
            .and_then(|f| f.dyn_into::<js_sys::Function>().ok());
        let fired = match set_timeout {
            Some(f) => f.call2(&global, &resolve, &0.into()).is_ok(),
            None => false,
        };
        if !fired {
            let _ = resolve.call0(&wasm_bindgen::JsValue::NULL);
        }
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}

/// Walks a list of byte slices as one stream.
struct Cursor<'a> {
    parts: &'a [&'a [u8]],
    part: usize,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn new(parts: &'a [&'a [u8]]) -> Self {
        Cursor { parts, part: 0, at: 0 }
    }

    /// The next contiguous piece, at most `max` bytes.
    fn next_piece(&mut self, max: usize) -> &'a [u8] {
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

impl Storage for WgpuStorage {
    type Block = WgpuBlock;

    fn device(&self) -> Device {
        self.id
    }

    fn name(&self) -> String {
        format!("{} ({:?}, {:?})", self.info.name, self.info.device_type, self.route)
    }

    fn read_async<'a>(
        &'a self,
        block: &'a WgpuBlock,
        offset: u64,
        dst: &'a mut [u8],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.read_any(block, offset, dst))
    }

    fn granularity(&self) -> u64 {
        COPY_ALIGN
    }

    fn max_block_size(&self) -> u64 {
        self.max_buffer
    }

    fn alloc(&self, capacity: u64, _alignment: u64) -> Result<WgpuBlock> {
        // A buffer starts at offset 0 of its own allocation, which is aligned beyond any
        // power of two devalloc hands out; the pool's virtual address carries the alignment.
        let buffer = self.create("devalloc buffer", capacity, self.usage, false)?;
        Ok(WgpuBlock { buffer, io: Mutex::new(()), ragged: AsyncLock::default() })
    }

    fn write(&self, block: &WgpuBlock, offset: u64, src: &[u8]) -> Result<()> {
        self.write_blocking(block, offset, src)
    }

    fn read(&self, block: &WgpuBlock, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.read_blocking(block, offset, dst)
    }

    fn copy(
        &self,
        src: &WgpuBlock,
        src_offset: u64,
        dst: &WgpuBlock,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        self.copy_blocking(src, src_offset, dst, dst_offset, len)
    }

    fn write_async<'a>(
        &'a self,
        block: &'a WgpuBlock,
        offset: u64,
        src: &'a [u8],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.write_any(block, offset, src))
    }

    fn copy_async<'a>(
        &'a self,
        src: &'a WgpuBlock,
        src_offset: u64,
        dst: &'a WgpuBlock,
        dst_offset: u64,
        len: u64,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.copy_any(src, src_offset, dst, dst_offset, len))
    }
}

/// The blocking calls: on native they wait by polling the device; in the browser the ones that
/// would have to wait are refused with an error that names their async twin.
impl WgpuStorage {
    #[cfg(native)]
    fn write_blocking(&self, block: &WgpuBlock, offset: u64, src: &[u8]) -> Result<()> {
        resolve(self.write_any(block, offset, src))
    }

    #[cfg(native)]
    fn read_blocking(&self, block: &WgpuBlock, offset: u64, dst: &mut [u8]) -> Result<()> {
        resolve(self.read_any(block, offset, dst))
    }

    #[cfg(native)]
    fn copy_blocking(&self, src: &WgpuBlock, so: u64, dst: &WgpuBlock, d_o: u64, len: u64) -> Result<()> {
        resolve(self.copy_any(src, so, dst, d_o, len))
    }

    #[cfg(web)]
    fn write_blocking(&self, block: &WgpuBlock, offset: u64, src: &[u8]) -> Result<()> {
        self.check_lost()?;
        let end = offset + src.len() as u64;
        if offset % COPY_ALIGN != 0 || end % COPY_ALIGN != 0 {
            return Err(self.must_not_block(
                "copy_host_to_device of a range not aligned to 4 bytes",
                "copy_host_to_device_async",
            ));
        }
        self.upload_aligned(&block.buffer, offset, &[src])
    }

    #[cfg(web)]
    fn read_blocking(&self, _block: &WgpuBlock, _offset: u64, _dst: &mut [u8]) -> Result<()> {
        Err(self.must_not_block("copy_device_to_host", "copy_device_to_host_async"))
    }

    #[cfg(web)]
    fn copy_blocking(&self, src: &WgpuBlock, so: u64, dst: &WgpuBlock, d_o: u64, len: u64) -> Result<()> {
        if (so | d_o | len) % COPY_ALIGN != 0 {
            return Err(self.must_not_block(
                "copy_device_to_device of a range not aligned to 4 bytes",
                "copy_device_to_device_async",
            ));
        }
        self.copy_aligned(src, so, dst, d_o, len)
    }

    fn copy_aligned(
        &self,
        src: &WgpuBlock,
        src_offset: u64,
        dst: &WgpuBlock,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        self.check_lost()?;
        let same = std::ptr::eq(src, dst);
        // Keep the buffers from being mapped by the direct route while the copy is queued;
        // lock in address order so that two opposite copies cannot deadlock.
        let (first, second) =
            if (src as *const WgpuBlock) < (dst as *const WgpuBlock) { (src, dst) } else { (dst, src) };
        let _g1 = lock(&first.io);
        let _g2 = if same { None } else { Some(lock(&second.io)) };
        if same {
            // wgpu refuses copies within one buffer (overlapping or not): go via a temporary.
            let tmp = self.create(
                "devalloc d2d temporary",
                len,
                wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                false,
            )?;
            self.submit("devalloc d2d", |enc| {
                enc.copy_buffer_to_buffer(&src.buffer, src_offset, &tmp, 0, len);
                enc.copy_buffer_to_buffer(&tmp, 0, &dst.buffer, dst_offset, len);
            })?;
        } else {
            self.submit("devalloc d2d", |enc| {
                enc.copy_buffer_to_buffer(&src.buffer, src_offset, &dst.buffer, dst_offset, len)
            })?;
        }
        Ok(())
    }
}
