//! The browser side of the platform seam (see the parent module).
//!
//! # When the browser takes the device away
//!
//! wgpu hears of a loss late or never here: on WebGPU through the device's `lost` promise,
//! which settles a few tasks after `GPUDevice.destroy()`; on WebGL2 not at all (wgpu's GL
//! backend does not watch for a lost context, and its fences then never signal, so a wait
//! would poll forever). So each device's entry in [`RECORDS`] keeps a [`Watch`] that tells at
//! once, and [`Web::taken_away`] asks it whenever devalloc asks whether the device is lost:
//!
//! - WebGPU: a 4-byte buffer of devalloc's, mapped at creation and never unmapped.
//!   `destroy()` unmaps every mapped buffer of its device before it returns (the WebGPU spec,
//!   and Chromium), so once the sentinel reads `unmapped` the device was destroyed.
//! - WebGL2: the context itself: `isContextLost()` is true from the moment the context is
//!   lost; and a `webglcontextlost` listener on its canvas records the loss (and so calls the
//!   app's `on_device_lost`) even if devalloc is not called again.

use std::any::Any;
use std::cell::RefCell;
use std::future::Future;
use std::sync::{Arc, Weak};

use futures_channel::oneshot;
use wasm_bindgen::closure::Closure;
use wasm_bindgen::JsCast;

use super::watch::Watch;
use super::{LossSignal, On, Platform, Record};
use crate::bounce::Mode;
use crate::device::{Device, DeviceType};
use crate::error::{Error, Result};

/// The platform of a browser build.
pub(crate) struct Web;

/// How waits go in the browser: WebGPU's event loop fires callbacks, wgpu's WebGL2 backend
/// fires them only from `device.poll`.
pub(crate) struct Waiter {
    polls: bool,
}

/// One device's entry: its lost record and what tells at once that the browser took it away.
struct Entry {
    device: wgpu::Device,
    /// The address of its hal device, where wgpu-core runs it (WebGL2): wgpu-core devices
    /// compare equal by id alone, and two instances number their devices alike, so two WebGL2
    /// devices opened apart would otherwise be taken for one (as `DeviceKey` does natively).
    hal: Option<usize>,
    serial: u64,
    /// A `Weak<R>` of the record type `R` that `record_of` was asked for.
    record: Box<dyn Any>,
    watch: Watch,
}

thread_local! {
    static RECORDS: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
    static SERIAL: std::cell::Cell<u64> = const { std::cell::Cell::new(1) };
}

impl Platform for Web {
    const CAN_BLOCK: bool = false;
    const IN_BROWSER: bool = true;
    const SCOPE_CHECKED_WORK: bool = false;

    type Waiter = Waiter;

    fn waiter(device: &wgpu::Device, _lost: Arc<dyn LossSignal>) -> Waiter {
        Waiter { polls: device.adapter_info().backend == wgpu::Backend::Gl }
    }

    /// Runs ready callbacks without waiting (WebGL2 needs it; on WebGPU it does nothing).
    fn poll_now(device: &wgpu::Device) -> bool {
        let _ = device.poll(wgpu::PollType::Poll);
        true
    }

    /// Nothing can wait in the browser: one poll (the device's `lost` promise reports a loss).
    fn poll_until_idle(device: &wgpu::Device) -> bool {
        Self::poll_now(device)
    }

    /// Nothing to wait for: the browser's callbacks run on this thread, between tasks.
    fn finish_polls() {}

    /// The verdict arrives later, and nothing may wait for it: what it catches is logged.
    fn settle(
        verdict: impl Future<Output = Option<wgpu::Error>> + 'static,
        id: Device,
        what: &str,
    ) -> Option<wgpu::Error> {
        let what = what.to_string();
        wasm_bindgen_futures::spawn_local(async move {
            if let Some(e) = verdict.await {
                log::error!("devalloc: {id}: {what}: {e}");
            }
        });
        None
    }

    fn settle_buffer(
        verdict: impl Future<Output = Option<wgpu::Error>> + 'static,
        id: Device,
        what: &str,
        refused: Box<dyn FnOnce() + 'static>,
    ) -> Option<wgpu::Error> {
        let what = what.to_string();
        wasm_bindgen_futures::spawn_local(async move {
            match verdict.await {
                Some(wgpu::Error::OutOfMemory { .. }) => {
                    refused();
                    log::warn!(
                        "devalloc: {id}: the browser ran out of memory for {what}, after the allocation was returned: it is refused from its next use (allocate_async waits for this verdict)"
                    );
                }
                Some(e) => log::error!("devalloc: {id}: {what}: {e}"),
                None => {}
            }
        });
        None
    }

    /// The browser's adapter (one, through `request_adapter`); WebGL2 offers one only for a
    /// surface, so the GL backend gets a 1x1 offscreen canvas.
    async fn adapters(instance: &wgpu::Instance, backend: wgpu::Backend) -> Vec<wgpu::Adapter> {
        let surface = if backend == wgpu::Backend::Gl {
            web_sys::OffscreenCanvas::new(1, 1)
                .ok()
                .and_then(|c| instance.create_surface(wgpu::SurfaceTarget::OffscreenCanvas(c)).ok())
        } else {
            None
        };
        let opts = wgpu::RequestAdapterOptions { compatible_surface: surface.as_ref(), ..Default::default() };
        instance.request_adapter(&opts).await.into_iter().collect()
    }

    fn record_of<R: Record>(device: &wgpu::Device, make: impl FnOnce(u64) -> Arc<R>) -> Arc<R> {
        let hal = hal_address(device);
        let same = |e: &Entry| &e.device == device && e.hal == hal;
        let found = RECORDS.with_borrow(|t| {
            t.iter().find(|e| same(e)).and_then(|e| e.record.downcast_ref::<Weak<R>>()?.upgrade())
        });
        if let Some(r) = found {
            return r;
        }
        let serial = SERIAL.replace(SERIAL.get() + 1);
        let record = make(serial);
        let marks: Arc<dyn Record> = record.clone();
        let watch = Watch::of(device, Arc::downgrade(&marks));
        // The entry a dropped record left is dropped outside the borrow (its listener goes).
        let old = RECORDS.with_borrow_mut(|t| {
            let old: Vec<Entry> = t.extract_if(.., |e| same(e)).collect();
            let record = Box::new(Arc::downgrade(&record));
            t.push(Entry { device: device.clone(), hal, serial, record, watch });
            old
        });
        drop(old);
        record
    }

    fn forget_record(serial: u64) {
        let gone =
            RECORDS.try_with(|t| t.borrow_mut().extract_if(.., |e| e.serial == serial).collect::<Vec<_>>());
        drop(gone);
    }

    /// WebGPU fires callbacks from the browser's event loop; wgpu's WebGL2 backend fires them
    /// only from `device.poll`, so there it polls and yields to the browser (a `MessageChannel`
    /// task) until the value is there.
    async fn wait<T>(
        gpu: On<'_, Waiter>,
        mut rx: oneshot::Receiver<T>,
        _index: Option<wgpu::SubmissionIndex>,
        mode: Mode,
        idle_gives_up: bool,
    ) -> Result<T> {
        if mode == Mode::Blocking {
            return Err(Error::backend(gpu.id, "a blocking wait was attempted in the browser"));
        }
        let got = if !gpu.waiter.polls {
            rx.await.ok()
        } else {
            // As on native: a callback of another device's buffer never comes from this
            // device's polls, so with `idle_gives_up` the wait ends once it has been idle twice.
            let mut idle = 0;
            loop {
                let empty = matches!(gpu.device.poll(wgpu::PollType::Poll), Ok(wgpu::PollStatus::QueueEmpty));
                match rx.try_recv() {
                    Ok(Some(v)) => break Some(v),
                    Err(oneshot::Canceled) => break None,
                    Ok(None) if gpu.lost.is_lost() => break None,
                    Ok(None) if idle_gives_up && idle >= 2 => {
                        return Err(Error::invalid_argument(format!(
                            "the buffer never mapped although {} is idle: it belongs to another device (or the app keeps it mapped)",
                            gpu.id
                        )))
                    }
                    Ok(None) => {
                        idle += usize::from(empty);
                        yield_to_browser().await
                    }
                }
            }
        };
        got.ok_or_else(|| match gpu.lost.is_lost() {
            true => gpu.lost.error(),
            false => Error::backend(gpu.id, "wgpu dropped a callback devalloc was waiting for"),
        })
    }

    /// Nothing can block in the browser: a blocking wait is an error (the blocking calls that
    /// would need one are refused before they get here).
    fn wait_blocking<T>(
        gpu: On<'_, Waiter>,
        _take: impl FnMut() -> std::result::Result<Option<T>, ()>,
    ) -> Result<T> {
        Err(Error::backend(gpu.id, "a blocking wait was attempted in the browser"))
    }

    /// Opening a device cannot be waited for in the browser.
    fn open_blocking<T>(
        device_type: DeviceType,
        backend: wgpu::Backend,
        _open: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        Err(Error::NotSupported {
            operation: "WgpuAllocator::new / with_options",
            device_type,
            reason: format!(
                "in the browser an adapter can only be opened asynchronously: use WgpuAllocator::new_async(wgpu::Backend::{backend:?}).await (or with_options_async)"
            ),
        })
    }

    /// Which of the browser's steps failed, and the fix: WebGPU missing from the page
    /// (`navigator.gpu`), the browser offering no adapter (`requestAdapter()` gave null), or
    /// WebGL2 refused.
    fn no_adapter(backend: wgpu::Backend) -> String {
        match backend {
            wgpu::Backend::Gl => "the browser gave no WebGL2 context (WebGL is off, blocklisted for this GPU, or out of contexts): \
                 enable WebGL in the browser, or use WebGPU (wgpu::Backend::BrowserWebGpu)"
                .into(),
            _ if !has_webgpu() => "navigator.gpu is missing: this browser or page has WebGPU off (Chrome and Edge 113+ have it; \
                 headless Chromium needs --enable-unsafe-webgpu; Firefox needs dom.webgpu.enabled; Safari 26+; \
                 a page must be served over https or from localhost). Or build devalloc with the `webgl` feature \
                 and open wgpu::Backend::Gl (WebGL2) instead"
                .into(),
            _ => "navigator.gpu.requestAdapter() returned null: the browser has WebGPU but offers no adapter \
                 (the GPU or driver is blocklisted, or there is no GPU: headless Chromium can use SwiftShader with \
                 --enable-unsafe-webgpu --use-angle=swiftshader; chrome://gpu says why). Or build devalloc with the \
                 `webgl` feature and open wgpu::Backend::Gl (WebGL2) instead"
                .into(),
        }
    }

    /// On WebGL2, compiled into the page. On WebGPU the browser runs it.
    fn wgpu_core_inside(info: &wgpu::AdapterInfo) -> bool {
        info.backend == wgpu::Backend::Gl
    }

    /// The device's watch (see the module docs). Cheap: a JS property read.
    fn taken_away(serial: u64) -> Option<(wgpu::DeviceLostReason, &'static str)> {
        RECORDS.with_borrow(|t| t.iter().find(|e| e.serial == serial).and_then(|e| e.watch.gone()))
    }
}

/// The address of `device`'s hal device where wgpu-core runs it (WebGL2), else `None`.
#[allow(unsafe_code)]
fn hal_address(device: &wgpu::Device) -> Option<usize> {
    #[cfg(feature = "webgl")]
    {
        // SAFETY: only the address of the hal device is taken; nothing is called on it and the
        // guard is dropped at once.
        let hal = unsafe { device.as_hal::<wgpu::hal::api::Gles>() }?;
        Some(std::ptr::from_ref::<wgpu::hal::gles::Device>(&hal) as usize)
    }
    #[cfg(not(feature = "webgl"))]
    {
        let _ = device;
        None
    }
}

/// Lets the browser run its event loop once: a task posted through a `MessageChannel`, which
/// (unlike `setTimeout(0)`, clamped to 4 ms once nested) runs as soon as the browser is free.
/// A WebGL2 fence is only signalled between tasks, so the waits of the GL backend need one; a
/// microtask would not do. Where there is no `MessageChannel`, `setTimeout(0)`.
async fn yield_to_browser() {
    // The channel and its handler are kept until the message has arrived.
    let mut kept = None;
    let promise = js_sys::Promise::new(&mut |resolve, _reject| match post_task(&resolve) {
        Ok(posted) => kept = posted,
        Err(()) => drop(resolve.call0(&wasm_bindgen::JsValue::NULL)),
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
    drop(kept);
}

/// What keeps a task posted through a `MessageChannel` alive until it has run.
type Posted = (web_sys::MessageChannel, Closure<dyn FnMut(web_sys::MessageEvent)>);

/// Schedules `resolve` as a task of its own: through a `MessageChannel` (`Ok(Some)`: keep it
/// until it has run), else `setTimeout(resolve, 0)` (`Ok(None)`); `Err` when neither could.
fn post_task(resolve: &js_sys::Function) -> std::result::Result<Option<Posted>, ()> {
    if let Ok(channel) = web_sys::MessageChannel::new() {
        let call = resolve.clone();
        let handler = Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |_| {
            let _ = call.call0(&wasm_bindgen::JsValue::NULL);
        });
        channel.port1().set_onmessage(Some(handler.as_ref().unchecked_ref()));
        if channel.port2().post_message(&wasm_bindgen::JsValue::NULL).is_ok() {
            return Ok(Some((channel, handler)));
        }
    }
    let global = js_sys::global();
    let timed = if let Some(window) = global.dyn_ref::<web_sys::Window>() {
        window.set_timeout_with_callback_and_timeout_and_arguments_0(resolve, 0)
    } else if let Some(worker) = global.dyn_ref::<web_sys::WorkerGlobalScope>() {
        worker.set_timeout_with_callback_and_timeout_and_arguments_0(resolve, 0)
    } else {
        return Err(());
    };
    timed.map(|_| None).map_err(drop)
}

/// Whether the page has WebGPU at all: `navigator.gpu` is there (a window's or a worker's).
fn has_webgpu() -> bool {
    let navigator = js_sys::Reflect::get(&js_sys::global(), &"navigator".into()).unwrap_or_default();
    !navigator.is_undefined()
        && js_sys::Reflect::get(&navigator, &"gpu".into())
            .is_ok_and(|gpu| !gpu.is_undefined() && !gpu.is_null())
}
