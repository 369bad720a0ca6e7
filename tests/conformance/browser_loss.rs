//! The browser takes the device away (shared by the WebGPU and WebGL2 suites): the page calls
//! `GPUDevice.destroy()` from JS behind wgpu's back, or the WebGL2 context is lost
//! (`WEBGL_lose_context.loseContext()`). As natively, every later call must be
//! `Error::DeviceLost`, a copy in flight must end (with the right data or DeviceLost, never
//! wrong data), the app's `on_device_lost` must fire once (a second loss changes nothing), and
//! nothing may hang: every await here gives up after a few seconds and fails the test.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use devalloc::wgpu::{BufferRequest, DeviceLostHandler, WgpuAllocator, WgpuOptions};
use devalloc::{DeviceAllocator, DevicePtr, Error, DEFAULT_ALIGNMENT};
use futures_util::future::{select, Either, LocalBoxFuture};
use wasm_bindgen::JsCast;

/// Takes the device of an allocator away, the way the browser would (a JS call, not wgpu's), at
/// once; the future it returns resolves once the browser has delivered the loss to every
/// listener of it (WebGPU: the device's `lost` promise has resolved; WebGL2: the canvas's
/// `webglcontextlost` event has fired, or the context was lost already), after which no report
/// of that loss can still be on its way.
pub type TakeAway = fn(&WgpuAllocator) -> Delivered;

/// See [`TakeAway`].
pub type Delivered = LocalBoxFuture<'static, ()>;

/// Opens a fresh allocator of `backend` (a device of its own) with `options`.
pub type Open = fn(WgpuOptions) -> devalloc::BoxFuture<'static, WgpuAllocator>;

/// What the app hears: how often its `on_device_lost` fired, and with what.
#[derive(Clone, Default)]
pub struct Heard {
    fired: Arc<AtomicUsize>,
    said: Arc<Mutex<Vec<String>>>,
}

impl Heard {
    /// The app's handler, counting.
    pub fn handler(&self) -> DeviceLostHandler {
        let (fired, said) = (Arc::clone(&self.fired), Arc::clone(&self.said));
        Arc::new(move |reason, message: &str| {
            fired.fetch_add(1, Ordering::SeqCst);
            said.lock().unwrap().push(format!("{reason:?}: {message}"));
        })
    }

    /// How often it fired.
    pub fn count(&self) -> usize {
        self.fired.load(Ordering::SeqCst)
    }

    /// What it was told.
    pub fn said(&self) -> Vec<String> {
        self.said.lock().unwrap().clone()
    }
}

/// Lets the browser run a task (timers, promises of the GPU process, events).
pub async fn next_task() {
    sleep(0).await
}

/// Waits `ms` milliseconds.
async fn sleep(ms: i32) {
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        let global = js_sys::global();
        let set_timeout = js_sys::Reflect::get(&global, &"setTimeout".into())
            .ok()
            .and_then(|f| f.dyn_into::<js_sys::Function>().ok())
            .expect("setTimeout");
        set_timeout.call2(&global, &resolve, &ms.into()).expect("setTimeout(resolve, ms)");
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}

/// `fut`'s output, or a failure naming `what` if it has not finished within 10 s: a hang.
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    let fut = std::pin::pin!(fut);
    let timer = std::pin::pin!(sleep(10_000));
    match select(fut, timer).await {
        Either::Left((v, _)) => v,
        Either::Right(_) => panic!("{what}: still waiting after 10 s (a hang)"),
    }
}

/// Panics unless `r` is `DeviceLost`.
fn lost<T: std::fmt::Debug>(what: &str, r: devalloc::Result<T>) {
    assert!(matches!(r, Err(Error::DeviceLost { .. })), "{what}: {r:?}");
}

/// Two buffers of the app's own on `a`'s device (made before the loss): one to map for
/// reading, one to copy to and from.
pub struct AppBuffers {
    read: wgpu::Buffer,
    copy: wgpu::Buffer,
}

impl AppBuffers {
    /// Made on `a`'s device.
    pub fn new(a: &WgpuAllocator) -> AppBuffers {
        let device = a.device(0).unwrap();
        let make = |label, usage| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: 4096,
                usage,
                mapped_at_creation: false,
            })
        };
        AppBuffers {
            read: make("the app's read buffer", wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
            copy: make("the app's buffer", wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST),
        }
    }
}

/// Every call on `a` is DeviceLost (`p`: a live 64 KiB allocation; `app`: the app's own
/// buffers); frees still work.
pub async fn every_call_is_device_lost(a: &WgpuAllocator, p: DevicePtr, app: &AppBuffers, what: &str) {
    let at = |call: &str| format!("{what}: {call}");
    lost(&at("allocate"), a.allocate(64, 0, DEFAULT_ALIGNMENT));
    lost(&at("allocate_zeroed"), a.allocate_zeroed(64, 0, DEFAULT_ALIGNMENT));
    lost(&at("allocate_request"), a.allocate_request(&BufferRequest::new(64).label("after"), 0));
    lost(&at("init_buffer"), a.init_buffer(7, 64, 0));
    lost(&at("an aligned write"), a.copy_host_to_device(p, &[1u8; 64], 0));
    lost(
        &at("an async write"),
        within(&at("an async write"), a.copy_host_to_device_async(p, &[1u8; 4096], 0)).await,
    );
    let big = vec![2u8; 64 << 10];
    lost(&at("a whole write"), within(&at("a whole write"), a.copy_host_to_device_async(p, &big, 0)).await);
    let ragged = a.copy_host_to_device_async(p.offset(3).unwrap(), &[1u8; 5], 0);
    lost(&at("a ragged write"), within(&at("a ragged write"), ragged).await);
    let mut back = vec![0u8; 4096];
    lost(&at("a read"), within(&at("a read"), a.copy_device_to_host_async(&mut back, p, 0)).await);
    let d2d = a.copy_device_to_device_async(p.offset(4096).unwrap(), 0, p, 0, 4096);
    lost(&at("a device-to-device copy"), within(&at("a device-to-device copy"), d2d).await);
    lost(&at("synchronize_async"), within(&at("synchronize_async"), a.synchronize_async(0)).await);
    lost(&at("buffer"), a.buffer(p, 0).map(drop));
    lost(&at("buffer_range"), a.buffer_range(p, 64, 0).map(drop));
    lost(&at("copy_to_buffer"), a.copy_to_buffer(p, &app.copy, 0, 64, 0));
    lost(&at("copy_from_buffer"), a.copy_from_buffer(p, &app.copy, 0, 64, 0));
    let map = a.map_buffer_async(&app.read, wgpu::MapMode::Read, 0..64, 0);
    lost(&at("map_buffer_async"), within(&at("map_buffer_async"), map).await);
    // What needs no device still works: stats, and freeing.
    assert!(a.stats(0).is_ok(), "{what}: stats after the loss");
    a.deallocate(p, 0).unwrap_or_else(|e| panic!("{what}: freeing after the loss: {e}"));
}

/// Waits until the browser has delivered the loss (`delivered`: a second report would come from
/// it) and the app has heard `n` times (a few seconds at most each), then checks that it heard
/// exactly `n` times.
async fn heard(h: &Heard, n: usize, what: &str, delivered: Delivered) {
    within(&format!("{what}: the browser delivering the loss"), delivered).await;
    // The tasks the delivery queued (wgpu's and devalloc's handlers) run before this one.
    next_task().await;
    for _ in 0..200 {
        if h.count() >= n {
            break;
        }
        sleep(10).await;
    }
    assert_eq!(h.count(), n, "{what}: the app's on_device_lost fired {} times: {:?}", h.count(), h.said());
}

/// The device is taken away between two calls of the same task: the very next call must
/// already be DeviceLost, then every call; the app hears once, even after a second loss.
pub async fn taken_away_between_two_calls(open: Open, take_away: TakeAway, what: &str) {
    let h = Heard::default();
    let a = open(WgpuOptions { on_device_lost: Some(h.handler()), ..WgpuOptions::default() }).await;
    let p = a.allocate(64 << 10, 0, DEFAULT_ALIGNMENT).unwrap();
    within(what, a.copy_host_to_device_async(p, &[9u8; 64 << 10], 0)).await.unwrap();
    let app = AppBuffers::new(&a);
    let delivered = take_away(&a);
    // No await in between: the browser has not run a single task since.
    lost(&format!("{what}: the first call after"), a.allocate(64, 0, DEFAULT_ALIGNMENT));
    every_call_is_device_lost(&a, p, &app, what).await;
    heard(&h, 1, what, delivered).await;
    let delivered = take_away(&a); // a second loss
    next_task().await;
    lost(&format!("{what}: after a second loss"), a.allocate(64, 0, DEFAULT_ALIGNMENT));
    heard(&h, 1, &format!("{what}, after a second loss"), delivered).await;
}

/// The device is taken away while copies are in flight (a chunked download and a ragged write,
/// each of which waits on the GPU): each ends, with the right data or DeviceLost; every later
/// call is DeviceLost; the app hears once.
pub async fn taken_away_during_copies(open: Open, take_away: TakeAway, what: &str) {
    let h = Heard::default();
    // 64 KiB chunks: the 1 MiB download below waits many times.
    let options = WgpuOptions {
        on_device_lost: Some(h.handler()),
        staging_chunk: Some(64 << 10),
        ..WgpuOptions::default()
    };
    let a = open(options).await;
    let n = 1 << 20;
    let data: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
    let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
    within(what, a.copy_host_to_device_async(p, &data, 0)).await.unwrap();
    within(what, a.synchronize_async(0)).await.unwrap();
    let app = AppBuffers::new(&a);
    let mut back = vec![0u8; n];
    let mut delivered = None;
    let (read, write) = {
        let read = a.copy_device_to_host_async(&mut back, p, 0);
        let write = a.copy_host_to_device_async(p.offset(n - 7).unwrap(), &[5u8; 3], 0);
        let loss = async {
            next_task().await;
            delivered = Some(take_away(&a));
        };
        let ((read, write), ()) =
            within(what, futures_util::future::join(futures_util::future::join(read, write), loss)).await;
        (read, write)
    };
    match read {
        Ok(()) => assert!(back == data, "{what}: a download that finished across the loss read wrong data"),
        r => lost(&format!("{what}: the download in flight"), r),
    }
    if write.is_err() {
        lost(&format!("{what}: the ragged write in flight"), write);
    }
    let q = a.allocate(64, 0, DEFAULT_ALIGNMENT);
    lost(&format!("{what}: a call after the copies"), q);
    every_call_is_device_lost(&a, p, &app, what).await;
    heard(&h, 1, what, delivered.expect("taken away")).await;
}
