//! [`Gpu`]: one wgpu device and devalloc's careful calls on it. Every wgpu call devalloc makes
//! goes through here: inside error scopes (never the app's handler), with waits through the
//! platform seam and every failure judged by [`Loss`] (is it a device loss?).
//!
//! devalloc never takes an app's uncaptured-error handler: every wgpu call it makes that could
//! raise an error runs inside a validation scope (and, when it makes a buffer, an
//! out-of-memory scope), pushed and popped around that call alone: never left open across an
//! `.await`, which in the browser would swallow the app's own errors. The one call without: a
//! direct-route map of a buffer the app was never given, which cannot raise one
//! ([`Gpu::map_unscoped`] says why). A scope costs ~60 ns on native, and its verdict is there at
//! once. In the browser it arrives later and each scope is a round trip into JS, so there
//! devalloc's copies, whose sizes and ranges it checks up front so that wgpu has nothing to
//! refuse, run without scopes: an unexpected error from one would reach the app's
//! uncaptured-error handler. Buffer creation keeps its scopes there, and what they catch is
//! logged.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_channel::oneshot;

use super::lost::Loss;
use super::platform::{Current, On, Platform};
use crate::bounce::Mode;
use crate::device::Device;
use crate::error::{Error, Result};

/// The result a map callback reports.
pub(crate) type MapResult = std::result::Result<(), wgpu::BufferAsyncError>;

/// Which errors a wgpu call can raise, and so which scopes it runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Raises {
    /// Making a buffer: validation errors and out of memory.
    ValidationOrOom,
    /// Encoding and submitting copies devalloc checked up front: validation errors only.
    Validation,
}

/// One wgpu device, its queue, and what devalloc keeps about it.
pub(crate) struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    /// The device, as errors name it.
    pub id: Device,
    pub info: wgpu::AdapterInfo,
    /// Is a failure a device loss? (`lost.rs`)
    pub lost: Arc<Loss>,
    /// What wakes async waits (the platform's).
    pub waiter: <Current as Platform>::Waiter,
    /// wgpu-core runs the device (native, WebGL2): it refuses work on a device that is no
    /// longer valid at once, which is how uploads notice a loss without a poll.
    pub core: bool,
    /// Small uploads written into the queue's staging so far; they reach the GPU with the next
    /// submission (anyone's).
    queued_writes: AtomicU64,
    /// How many of those a submission of devalloc's has carried at least.
    flushed_writes: AtomicU64,
}

impl Gpu {
    /// devalloc's view of `device`; `Err` when the device already has an `on_device_lost`
    /// handler from another allocator and `on_lost` is a second one.
    pub fn new(
        device: wgpu::Device,
        queue: wgpu::Queue,
        id: Device,
        on_lost: Option<super::DeviceLostHandler>,
    ) -> Result<Self> {
        let lost = Loss::of(&device, &queue, id, on_lost)?;
        let info = device.adapter_info();
        let waiter = Current::waiter(&device, lost.clone());
        let core = Current::wgpu_core_inside(&info);
        Ok(Gpu {
            device,
            queue,
            id,
            info,
            lost,
            waiter,
            core,
            queued_writes: AtomicU64::new(0),
            flushed_writes: AtomicU64::new(0),
        })
    }

    /// [`Error::DeviceLost`] once the device is lost (polls first, without blocking).
    pub fn check_lost(&self) -> Result<()> {
        self.lost.check()
    }

    /// `r`, or [`Error::DeviceLost`] when it failed because the device is lost.
    pub fn or_lost<T>(&self, r: Result<T>) -> Result<T> {
        self.lost.or_lost(r)
    }

    /// After wgpu refused work because the device is no longer valid: the loss, once wgpu has
    /// reported it (see `Loss::settle`).
    pub fn settle_loss(&self) -> Error {
        self.lost.settle()
    }

    /// Runs `f` inside error scopes and turns what they caught into a devalloc error (native),
    /// or logs it (browser). `requested`: the bytes an out-of-memory error is about. A loss
    /// recorded earlier is [`Error::DeviceLost`] at once; polling for one is the caller's
    /// (once per devalloc call, at its start).
    pub fn scoped<T>(&self, what: &str, requested: u64, raises: Raises, f: impl FnOnce() -> T) -> Result<T> {
        if self.lost.is_lost() {
            return Err(self.lost.error());
        }
        if raises == Raises::Validation && !Current::SCOPE_CHECKED_WORK {
            return Ok(f());
        }
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let oom = (raises == Raises::ValidationOrOom)
            .then(|| self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory));
        let value = f();
        let oom = oom.map(|g| g.pop());
        let validation = validation.pop();
        let verdict = async move {
            let caught = match oom {
                Some(oom) => oom.await,
                None => None,
            };
            caught.or(validation.await)
        };
        match Current::settle(verdict, self.id, what) {
            None => Ok(value),
            Some(e) => Err(self.caught(what, requested, e)),
        }
    }

    /// The devalloc error for what a scope caught.
    pub(super) fn caught(&self, what: &str, requested: u64, caught: wgpu::Error) -> Error {
        if self.lost.is_lost() {
            return self.lost.error();
        }
        match caught {
            wgpu::Error::OutOfMemory { .. } => Error::OutOfMemory {
                requested,
                device: self.id,
                detail: format!("wgpu reported out of memory during {what}"),
            },
            e => {
                Error::Backend { device: self.id, message: format!("{what}: {e}"), source: Some(Box::new(e)) }
            }
        }
    }

    /// A backend error without a wgpu error value (or the loss, if the device is lost).
    pub fn backend_error(&self, what: &str, e: impl std::fmt::Display) -> Error {
        if self.lost.is_lost() {
            return self.lost.error();
        }
        Error::backend(self.id, format!("{what}: {e}"))
    }

    /// A buffer made inside error scopes.
    pub fn create(
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

    /// Encodes with `encode` and submits, inside error scopes. The submission's index, or `None`
    /// when a callback that wgpu ran after the submission (the app's) panicked: the work was
    /// submitted (wgpu runs ready callbacks once it has), only its index is unknown; the panic
    /// is logged, and becomes a loss only if wgpu then says the device is invalid.
    pub fn submit(
        &self,
        what: &str,
        encode: impl FnOnce(&mut wgpu::CommandEncoder),
    ) -> Result<Option<wgpu::SubmissionIndex>> {
        self.scoped(what, 0, Raises::Validation, || {
            let mut enc =
                self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(what) });
            encode(&mut enc);
            let queued = self.queued_writes.load(Ordering::Acquire);
            let index =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.queue.submit([enc.finish()])));
            // That submission carried every small upload queued before it.
            self.flushed_writes.fetch_max(queued, Ordering::AcqRel);
            index.ok()
        })
        .and_then(|index| match index {
            Some(index) => Ok(Some(index)),
            None => {
                self.lost.after_panic(what);
                if self.lost.is_lost() {
                    return Err(self.lost.error());
                }
                log::warn!("devalloc: {}: a callback that wgpu ran after {what} panicked", self.id);
                Ok(None)
            }
        })
    }

    /// Runs `f`, a wgpu call that may run callbacks (a submission runs the map and work-done
    /// callbacks that have become ready, the app's too): a panic in one of them (the app's) is
    /// not devalloc's to pass on. It becomes an error (and a loss, if wgpu then says the device
    /// is invalid: see `Loss::after_panic`); the work may have been submitted.
    fn catching<T>(&self, what: &str, f: impl FnOnce() -> T) -> Result<T> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|_| {
            self.lost.after_panic(what);
            self.backend_error(
                what,
                "a callback that wgpu ran during it panicked (the work may have been submitted)",
            )
        })
    }

    /// Notes a small upload written into the queue's staging.
    pub fn note_queued_write(&self) {
        self.queued_writes.fetch_add(1, Ordering::AcqRel);
    }

    /// Submits nothing but the queue's pending writes, if devalloc queued any since its last
    /// submission (otherwise there is nothing of devalloc's to flush: on GL an empty submission
    /// costs a fence, a few microseconds).
    pub fn flush_queued_writes(&self) -> Result<()> {
        let queued = self.queued_writes.load(Ordering::Acquire);
        if queued > self.flushed_writes.load(Ordering::Acquire) {
            self.catching("flushing small uploads", || self.queue.submit([]))?;
            self.flushed_writes.fetch_max(queued, Ordering::AcqRel);
        }
        Ok(())
    }

    /// Asks for `buffer[range]` to be mapped, `then` called with the result; inside an error
    /// scope unless `scoped` is false (see [`Gpu::map_unscoped`]).
    pub fn map_then(
        &self,
        buffer: &wgpu::Buffer,
        mode: wgpu::MapMode,
        range: std::ops::Range<u64>,
        scoped: bool,
        then: impl FnOnce(MapResult) + wgpu::WasmNotSend + 'static,
    ) -> Result<()> {
        if scoped || !Current::SCOPE_CHECKED_WORK {
            return self
                .scoped("mapping a buffer", 0, Raises::Validation, || buffer.map_async(mode, range, then));
        }
        self.map_unscoped(buffer, mode, range, then)
    }

    /// A map without an error scope, for a buffer no one but devalloc holds (the direct route's
    /// blocks the app was never given): wgpu-core checks the device before anything else and
    /// keeps a lost device's refusal out of every error handler, devalloc's maps of a block are
    /// serialized by its lock and the range and usage are right by construction, so such a map
    /// cannot raise an error (wgpu hands the callback the refusal of a lost device). The one
    /// gap is a race of a few instructions inside wgpu: the app destroys the device, and
    /// another thread's poll releases its buffers, between wgpu's validity check and its
    /// destroyed check; the error would then reach the app's handler. It saves a scope
    /// (~60 ns: wgpu locks its error sink and looks up the thread's scope stack, twice).
    fn map_unscoped(
        &self,
        buffer: &wgpu::Buffer,
        mode: wgpu::MapMode,
        range: std::ops::Range<u64>,
        then: impl FnOnce(MapResult) + wgpu::WasmNotSend + 'static,
    ) -> Result<()> {
        if self.lost.is_lost() {
            return Err(self.lost.error());
        }
        buffer.map_async(mode, range, then);
        Ok(())
    }

    /// Unmaps `buffer` inside an error scope (after a loss, unmapping a destroyed buffer is a
    /// validation error that must not reach the app's handler); what it catches is logged.
    pub fn unmap(&self, buffer: &wgpu::Buffer) {
        if self.lost.is_lost() {
            return;
        }
        if let Err(e) = self.scoped("unmapping a buffer", 0, Raises::Validation, || buffer.unmap()) {
            log::debug!("devalloc: {e}");
        }
    }

    /// What the platform's waits need of this device.
    fn on(&self) -> On<'_, <Current as Platform>::Waiter> {
        On { device: &self.device, waiter: &self.waiter, lost: &*self.lost, id: self.id }
    }

    /// Waits until `rx` has its value (see [`Platform::wait`]).
    pub async fn wait<T>(
        &self,
        rx: oneshot::Receiver<T>,
        index: Option<wgpu::SubmissionIndex>,
        mode: Mode,
        idle_gives_up: bool,
    ) -> Result<T> {
        Current::wait(self.on(), rx, index, mode, idle_gives_up).await
    }

    /// Waits, blocking, until `take` has the value (see [`Platform::wait_blocking`]).
    pub fn wait_blocking<T>(&self, take: impl FnMut() -> std::result::Result<Option<T>, ()>) -> Result<T> {
        Current::wait_blocking(self.on(), take)
    }

    /// Flushes queued work and returns once the GPU has finished it.
    pub async fn synchronize(&self, mode: Mode) -> Result<()> {
        // The wait polls, which reports a loss: no poll up front.
        if self.lost.is_lost() {
            return Err(self.lost.error());
        }
        let (tx, rx) = oneshot::channel();
        self.flush_queued_writes()?;
        self.catching("waiting for the queue", || {
            self.queue.on_submitted_work_done(move || {
                let _ = tx.send(());
            })
        })?;
        let r = self.wait(rx, None, mode, false).await;
        self.or_lost(r)?;
        // One poll can run the work-done callback before the lost one (wgpu fires them in that
        // order): a device destroyed before this call has finished "its" work, and is lost.
        if self.lost.is_lost() {
            return Err(self.lost.error());
        }
        Ok(())
    }
}
