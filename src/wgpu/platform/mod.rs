//! Everything in the wgpu backend that differs between native and the browser, behind one
//! seam: the [`Platform`] trait, which `Native` and `Web` implement and the compiler checks
//! on each target; the rest of the backend names only [`Current`]. Backend tuning (chunk
//! sizes, which uploads take the queue's staging) is not the platform's: see `options.rs`.
//!
//! | | native | browser |
//! |---|---|---|
//! | blocking wait | polls the device inline (`device.poll(Wait)`) | refused: [`crate::Error::NotSupported`] naming the async twin |
//! | async wait | a polling thread per device (non-blocking polls, `catch_unwind`) wakes the task | WebGPU: the browser's event loop; WebGL2: poll, and yield a browser task (`MessageChannel`) in a loop |
//! | error scope verdict | ready at once: an error is returned | arrives later: logged |
//! | adapters | `enumerate_adapters` | `request_adapter` (WebGL2 with a 1x1 offscreen canvas) |

use std::future::Future;
use std::sync::Arc;

use futures_channel::oneshot;

use crate::allocator::WasmNotSendSync;
use crate::bounce::Mode;
use crate::device::{Device, DeviceType};
use crate::error::{Error, Result};

#[cfg(native)]
mod native;
#[cfg(native)]
pub(crate) use native::Native as Current;
#[cfg(web)]
mod watch;
#[cfg(web)]
mod web;
#[cfg(web)]
pub(crate) use web::Web as Current;

/// What the platform's waits ask of a device's loss: `lost.rs`'s `Loss` answers. (The platform
/// sits below the loss policy, which polls through it: it names the loss only by this trait.)
pub(crate) trait LossSignal: WasmNotSendSync + 'static {
    /// Whether the loss is recorded.
    fn is_lost(&self) -> bool;
    /// Records the loss (the first time) and calls the app's handler once. (The browser's
    /// waits neither poll on a thread of their own nor catch panics.)
    #[cfg_attr(web, allow(dead_code))]
    fn mark(&self, message: &str);
    /// A panic came out of wgpu during `what`: a loss only if the device is no longer valid.
    #[cfg_attr(web, allow(dead_code))]
    fn after_panic(&self, what: &str);
    /// The [`Error::DeviceLost`] of this device.
    fn error(&self) -> Error;
}

/// A device's lost record as the platform's table keeps it: found again by its type, and
/// marked lost when the platform learns of a loss first (the browser's `webglcontextlost`).
pub(crate) trait Record: WasmNotSendSync + 'static {
    /// Records the loss (the first time) and calls the app's handler once. (Only the
    /// browser's watch learns of a loss before wgpu does.)
    #[cfg_attr(any(native, not(feature = "webgl")), allow(dead_code))]
    fn mark_lost(&self, reason: Option<wgpu::DeviceLostReason>, message: &str);
}

/// What a wait needs of a device: the device, its waiter, its loss and its name.
pub(crate) struct On<'a, W> {
    /// The device polled.
    pub device: &'a wgpu::Device,
    /// Its waiter ([`Platform::waiter`]).
    pub waiter: &'a W,
    /// Its loss.
    pub lost: &'a dyn LossSignal,
    /// The device, as errors name it.
    pub id: Device,
}

/// What the wgpu backend needs of the platform it runs on.
pub(crate) trait Platform {
    /// Whether a blocking call may wait for the GPU here.
    const CAN_BLOCK: bool;
    /// Whether devalloc runs inside a browser (the backend's tuning differs there).
    const IN_BROWSER: bool;
    /// Whether work devalloc checked up front (copies) still runs inside an error scope: on
    /// native a scope costs ~60 ns and its verdict is there at once; in the browser it is a
    /// round trip into JS.
    const SCOPE_CHECKED_WORK: bool;

    /// What lets async waits be woken.
    type Waiter;

    /// The waiter of one device.
    fn waiter(device: &wgpu::Device, lost: Arc<dyn LossSignal>) -> Self::Waiter;

    /// Polls without blocking (runs ready callbacks); false when wgpu panicked.
    fn poll_now(device: &wgpu::Device) -> bool;

    /// Polls until the queue is empty, at most a second where waiting is allowed (one poll in
    /// the browser); false when wgpu panicked.
    fn poll_until_idle(device: &wgpu::Device) -> bool;

    /// Returns once no poll of devalloc's on another thread is half-way (its callbacks, a lost
    /// callback included, have run).
    fn finish_polls();

    /// The verdict of error scopes, where it can be had now; in the browser it arrives later,
    /// is logged, and this says `None`.
    fn settle(
        verdict: impl Future<Output = Option<wgpu::Error>> + 'static,
        id: Device,
        what: &str,
    ) -> Option<wgpu::Error>;

    /// [`Platform::settle`] for making a buffer: in the browser, an out-of-memory verdict that
    /// arrives later runs `refused` and is logged as a warning (the allocation it made is then
    /// refused at its next use), anything else as an error.
    fn settle_buffer(
        verdict: impl Future<Output = Option<wgpu::Error>> + 'static,
        id: Device,
        what: &str,
        refused: Box<dyn FnOnce() + 'static>,
    ) -> Option<wgpu::Error>;

    /// Every adapter of `backend`.
    fn adapters(
        instance: &wgpu::Instance,
        backend: wgpu::Backend,
    ) -> impl Future<Output = Vec<wgpu::Adapter>>;

    /// The lost record of `device`, made by `make(serial)` if it has none yet (or the one it
    /// has is not an `R`).
    fn record_of<R: Record>(device: &wgpu::Device, make: impl FnOnce(u64) -> Arc<R>) -> Arc<R>;

    /// Drops the table's entry of a record that is going away.
    fn forget_record(serial: u64);

    /// Waits until `rx` has its value (blocking or not, as `mode` says). `index`: the
    /// submission the value waits for, if known. `idle_gives_up`: fail once the device has gone
    /// idle twice without the value (a map of another device's buffer never completes here).
    fn wait<T>(
        on: On<'_, Self::Waiter>,
        rx: oneshot::Receiver<T>,
        index: Option<wgpu::SubmissionIndex>,
        mode: Mode,
        idle_gives_up: bool,
    ) -> impl Future<Output = Result<T>>;

    /// Waits, blocking, until `take` has the value (`Err`: it never will): for a caller with a
    /// callback slot of its own.
    fn wait_blocking<T>(
        on: On<'_, Self::Waiter>,
        take: impl FnMut() -> std::result::Result<Option<T>, ()>,
    ) -> Result<T>;

    /// Opens devices of `backend` (of `device_type`), blocking where that is allowed.
    fn open_blocking<T>(
        device_type: DeviceType,
        backend: wgpu::Backend,
        open: impl Future<Output = Result<T>>,
    ) -> Result<T>;

    /// Why no adapter of `backend` was found, and what to do: the end of the `NotFound` error.
    fn no_adapter(backend: wgpu::Backend) -> String;

    /// Whether wgpu-core runs the device here (it then refuses work on a device that is no
    /// longer valid at once, without reporting it to any error handler).
    fn wgpu_core_inside(info: &wgpu::AdapterInfo) -> bool;

    /// Whether the platform took the device of lost record `serial` away without wgpu knowing
    /// yet (the browser: `GPUDevice.destroy()`, a lost WebGL2 context): the reason and message
    /// to record, else `None`.
    fn taken_away(serial: u64) -> Option<(wgpu::DeviceLostReason, &'static str)>;
}

/// A call that on native waits for the GPU, and so in the browser must be made async.
#[derive(Clone, Copy, Debug)]
pub(crate) enum MustWait {
    /// A read of device memory.
    Read,
    /// A write whose range is not 4-byte aligned (the edge words are read first).
    RaggedWrite,
    /// A device-to-device copy whose range is not 4-byte aligned.
    RaggedCopy,
    /// Waiting for all submitted work.
    Synchronize,
}

impl MustWait {
    /// The operation and its async twin, for the error message.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            MustWait::Read => ("copy_device_to_host", "copy_device_to_host_async"),
            MustWait::RaggedWrite => {
                ("copy_host_to_device of a range not aligned to 4 bytes", "copy_host_to_device_async")
            }
            MustWait::RaggedCopy => {
                ("copy_device_to_device of a range not aligned to 4 bytes", "copy_device_to_device_async")
            }
            MustWait::Synchronize => ("synchronize", "synchronize_async"),
        }
    }
}

/// `Ok` where a blocking call may wait ([`Platform::CAN_BLOCK`]); in the browser, an error that
/// names the async twin of `what`.
pub(crate) fn blocking_allowed(id: Device, what: MustWait) -> Result<()> {
    if Current::CAN_BLOCK {
        return Ok(());
    }
    let (operation, twin) = what.names();
    Err(Error::NotSupported {
        operation,
        device_type: id.device_type,
        reason: format!(
            "in the browser this has to wait for the GPU and nothing may block: use {twin} (e.g. {twin}(...).await)"
        ),
    })
}
