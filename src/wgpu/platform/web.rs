//! The browser side of the platform seam (see the parent module).

use std::cell::RefCell;
use std::future::Future;
use std::sync::{Arc, Weak};

use futures_channel::oneshot;
use wasm_bindgen::JsCast;

use super::MustWait;
use crate::bounce::Mode;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::wgpu::lost::{Loss, LostRecord};
use crate::wgpu::storage::WgpuStorage;

/// In the browser nothing may block: a call that would have to wait is refused with an error
/// that names its async twin.
pub(crate) fn blocking_allowed(s: &WgpuStorage, what: MustWait) -> Result<()> {
    let (operation, twin) = what.names();
    Err(Error::NotSupported {
        operation,
        device_type: s.id.device_type,
        reason: format!(
            "in the browser this has to wait for the GPU and nothing may block: use {twin} (e.g. {twin}(...).await)"
        ),
    })
}

/// Runs ready callbacks without waiting (WebGL2 needs it; on WebGPU it does nothing).
pub(crate) fn poll_now(device: &wgpu::Device) -> bool {
    let _ = device.poll(wgpu::PollType::Poll);
    true
}

/// Nothing can wait in the browser: one poll (the device's `lost` promise reports a loss).
pub(crate) fn poll_until_idle(device: &wgpu::Device) -> bool {
    poll_now(device)
}

/// Nothing to wait for: the browser's callbacks run on this thread, between tasks.
pub(crate) fn finish_polls() {}

/// The verdict of an error scope arrives later in the browser, and nothing may wait for it:
/// what it catches is logged.
pub(crate) fn settle(
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

/// The browser's adapter (one, through `request_adapter`); WebGL2 offers one only for a
/// surface, so the GL backend gets a 1x1 offscreen canvas.
pub(crate) async fn adapters(instance: &wgpu::Instance, backend: wgpu::Backend) -> Vec<wgpu::Adapter> {
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

thread_local! {
    static RECORDS: RefCell<Vec<(wgpu::Device, u64, Weak<LostRecord>)>> = const { RefCell::new(Vec::new()) };
    static SERIAL: std::cell::Cell<u64> = const { std::cell::Cell::new(1) };
}

/// The lost record of `device`, made by `make(serial)` if it has none yet.
pub(crate) fn record_of(device: &wgpu::Device, make: impl FnOnce(u64) -> Arc<LostRecord>) -> Arc<LostRecord> {
    let found =
        RECORDS.with_borrow(|t| t.iter().find(|(d, ..)| d == device).and_then(|(_, _, w)| w.upgrade()));
    if let Some(r) = found {
        return r;
    }
    let serial = SERIAL.replace(SERIAL.get() + 1);
    let record = make(serial);
    RECORDS.with_borrow_mut(|t| {
        t.retain(|(d, ..)| d != device);
        t.push((device.clone(), serial, Arc::downgrade(&record)));
    });
    record
}

/// Drops the table's entry of a record that is going away.
pub(crate) fn forget_record(serial: u64) {
    let _ = RECORDS.try_with(|t| t.borrow_mut().retain(|(_, s, _)| *s != serial));
}

/// How waits go in the browser: WebGPU's event loop fires callbacks, wgpu's WebGL2 backend
/// fires them only from `device.poll`.
pub(crate) struct Waiter {
    polls: bool,
}

impl Waiter {
    pub(crate) fn new(device: &wgpu::Device, _lost: &Arc<Loss>) -> Self {
        Waiter { polls: device.adapter_info().backend == wgpu::Backend::Gl }
    }
}

/// Waits until `rx` has its value. WebGPU fires callbacks from the browser's event loop; wgpu's
/// WebGL2 backend fires them only from `device.poll`, so there it polls and yields to the
/// browser (a `MessageChannel` task) until the value is there.
pub(crate) async fn wait<T>(
    s: &WgpuStorage,
    mut rx: oneshot::Receiver<T>,
    _index: Option<wgpu::SubmissionIndex>,
    mode: Mode,
    idle_gives_up: bool,
) -> Result<T> {
    if mode == Mode::Blocking {
        return Err(Error::backend(s.id, "a blocking wait was attempted in the browser"));
    }
    let got = if !s.waiter.polls {
        rx.await.ok()
    } else {
        // As on native: a callback of another device's buffer never comes from this device's
        // polls, so with `idle_gives_up` the wait ends once this device has been idle twice.
        let mut idle = 0;
        loop {
            let empty = matches!(s.device.poll(wgpu::PollType::Poll), Ok(wgpu::PollStatus::QueueEmpty));
            match rx.try_recv() {
                Ok(Some(v)) => break Some(v),
                Err(oneshot::Canceled) => break None,
                Ok(None) if s.lost.is_lost() => break None,
                Ok(None) if idle_gives_up && idle >= 2 => {
                    return Err(Error::invalid_argument(format!(
                        "the buffer never mapped although {} is idle: it belongs to another device (or the app keeps it mapped)",
                        s.id
                    )))
                }
                Ok(None) => {
                    idle += usize::from(empty);
                    yield_to_browser().await
                }
            }
        }
    };
    got.ok_or_else(|| match s.lost.is_lost() {
        true => s.lost.error(),
        false => Error::backend(s.id, "wgpu dropped a callback devalloc was waiting for"),
    })
}

/// Nothing can block in the browser: a blocking wait is an error (the blocking calls that would
/// need one are refused before they get here).
pub(crate) fn wait_blocking<T>(
    s: &WgpuStorage,
    _take: impl FnMut() -> std::result::Result<Option<T>, ()>,
) -> Result<T> {
    Err(Error::backend(s.id, "a blocking wait was attempted in the browser"))
}

/// Lets the browser run its event loop once: a task posted through a `MessageChannel`, which
/// (unlike `setTimeout(0)`, clamped to 4 ms once nested) runs as soon as the browser is free.
/// A WebGL2 fence is only signalled between tasks, so the waits of the GL backend need one; a
/// microtask would not do. Where there is no `MessageChannel`, `setTimeout(0)`.
async fn yield_to_browser() {
    // The channel is held until its message has arrived.
    let mut channel = None;
    let promise = js_sys::Promise::new(&mut |resolve, _reject| match post_task(&resolve) {
        Some(c) => channel = Some(c),
        None => drop(resolve.call0(&wasm_bindgen::JsValue::NULL)),
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
    drop(channel);
}

/// Schedules `f` as a task of its own: through a `MessageChannel` (returned, to be kept until
/// `f` has run), else `setTimeout(f, 0)`. `None` when neither could be had.
fn post_task(f: &js_sys::Function) -> Option<wasm_bindgen::JsValue> {
    use js_sys::Reflect;
    let global = js_sys::global();
    let channel = Reflect::get(&global, &"MessageChannel".into())
        .ok()
        .and_then(|c| c.dyn_into::<js_sys::Function>().ok())
        .and_then(|c| Reflect::construct(&c, &js_sys::Array::new()).ok());
    if let Some(channel) = channel {
        let ports = (Reflect::get(&channel, &"port1".into()), Reflect::get(&channel, &"port2".into()));
        if let (Ok(port1), Ok(port2)) = ports {
            let post = Reflect::get(&port2, &"postMessage".into())
                .ok()
                .and_then(|p| p.dyn_into::<js_sys::Function>().ok());
            if let Some(post) = post {
                if Reflect::set(&port1, &"onmessage".into(), f).is_ok()
                    && post.call1(&port2, &wasm_bindgen::JsValue::NULL).is_ok()
                {
                    return Some(channel);
                }
            }
        }
    }
    let set_timeout =
        Reflect::get(&global, &"setTimeout".into()).ok().and_then(|f| f.dyn_into::<js_sys::Function>().ok());
    set_timeout.and_then(|t| t.call2(&global, f, &0.into()).ok())
}

/// Whether a blocking call may wait here (never in the browser).
pub(crate) const CAN_BLOCK: bool = false;

/// Opening a device cannot be waited for in the browser.
pub(crate) fn open_blocking<T>(_open: impl Future<Output = Result<T>>) -> Result<T> {
    Err(Error::NotSupported {
        operation: "WgpuAllocator::new / with_options",
        device_type: crate::DeviceType::WebGpu,
        reason: "in the browser an adapter can only be opened asynchronously: use WgpuAllocator::new_async(...).await".into(),
    })
}

/// Whether wgpu-core runs the device here (it refuses work on a device that is no longer
/// valid at once, without reporting it to any error handler): on WebGL2, compiled into the
/// page. On WebGPU the browser runs it, and `queue.writeBuffer` copies straight out of wasm
/// memory, where a `write_buffer_with` view would be filled and copied again.
pub(crate) fn wgpu_core_inside(info: &wgpu::AdapterInfo) -> bool {
    info.backend == wgpu::Backend::Gl
}

/// Up to how many bytes a download gets a staging buffer of its own. On WebGL2 up to 1 MiB:
/// there a map for reading reads back the whole buffer (wgpu-hal emulates mapping with
/// `getBufferSubData`), and Chromium drops the shadow copy it keeps to speed that up once a
/// buffer is written again, so a small read through a kept (larger, reused) buffer is slower
/// than through a fresh one of its size (the page's bench: 4 KiB 0.002 vs 0.007 GB/s, 1 MiB 0.29 vs 0.44),
/// while from 16 MiB making the buffer costs more (0.59 fresh vs 1.13 reused).
pub(crate) fn fresh_download_staging(info: &wgpu::AdapterInfo) -> u64 {
    if info.backend == wgpu::Backend::Gl {
        1 << 20
    } else {
        0
    }
}

/// Whether work devalloc checked up front (copies) still runs inside an error scope. In the browser a scope is a round trip into JS: copies devalloc checked up front run without.
pub(crate) const SCOPE_CHECKED_WORK: bool = false;

/// The staging chunk when the options name none: 64 MiB in the browser, where every map is a
/// round trip to the GPU process, so fewer, larger maps win.
pub(crate) fn default_chunk(_info: &wgpu::AdapterInfo) -> u64 {
    64 << 20
}

/// On WebGPU `queue.writeBuffer` copies straight out of the wasm memory: the fastest upload at
/// every size (measured against a mapped staging belt), so every upload takes it. On WebGL2
/// the queue's staging is fastest up to 1 MiB and a mapped staging belt from 16 MiB (the
/// page's bench): the belt takes over past 4 MiB.
pub(crate) fn small_upload_limit(info: &wgpu::AdapterInfo) -> u64 {
    if info.backend == wgpu::Backend::Gl {
        4 << 20
    } else {
        u64::MAX
    }
}
