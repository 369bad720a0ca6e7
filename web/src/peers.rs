//! What the benchmark's peers (plain wgpu, as a careful user would write it) need in the
//! browser: the page's clock, waiting for a wgpu callback, and reading a buffer back.
use futures_channel::oneshot;

use crate::wgpu;

/// The page's clock, in milliseconds (`performance.now()`: 0.1 ms steps in Chromium without
/// cross-origin isolation).
pub fn now_ms() -> f64 {
    use wasm_bindgen::JsCast;
    js_sys::Reflect::get(&js_sys::global(), &"performance".into())
        .ok()
        .and_then(|p| js_sys::Reflect::get(&p, &"now".into()).ok().map(|f| (p, f)))
        .and_then(|(p, f)| f.dyn_into::<js_sys::Function>().ok().and_then(|f| f.call0(&p).ok()))
        .and_then(|v| v.as_f64())
        .unwrap_or_else(js_sys::Date::now)
}

/// Lets the browser run its event loop once, the way devalloc's own WebGL2 waits do (a task
/// posted through a `MessageChannel`: `setTimeout(0)` is clamped to 4 ms once nested), so the
/// peers wait no longer than devalloc between polls.
pub async fn yield_to_browser() {
    use js_sys::Reflect;
    use wasm_bindgen::JsCast;
    let channel = Reflect::get(&js_sys::global(), &"MessageChannel".into())
        .ok()
        .and_then(|c| c.dyn_into::<js_sys::Function>().ok())
        .and_then(|c| Reflect::construct(&c, &js_sys::Array::new()).ok());
    let promise = js_sys::Promise::new(&mut |resolve, _reject| {
        let posted = channel.as_ref().is_some_and(|ch| {
            let (p1, p2) = (Reflect::get(ch, &"port1".into()), Reflect::get(ch, &"port2".into()));
            let (Ok(p1), Ok(p2)) = (p1, p2) else { return false };
            let post = Reflect::get(&p2, &"postMessage".into())
                .ok()
                .and_then(|p| p.dyn_into::<js_sys::Function>().ok());
            Reflect::set(&p1, &"onmessage".into(), &resolve).is_ok()
                && post.is_some_and(|p| p.call1(&p2, &wasm_bindgen::JsValue::NULL).is_ok())
        });
        if !posted {
            let _ = resolve.call0(&wasm_bindgen::JsValue::NULL);
        }
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
    drop(channel);
}

/// A peer's wait for its callback. On WebGPU the browser's event loop fires it; wgpu's WebGL2
/// backend fires them only from `device.poll`, so there the wait polls, letting the browser
/// run between polls (a WebGL2 fence is only signalled between tasks). `None` once the
/// callback is dropped, or the device is lost (a lost WebGL2 context never signals again: a
/// peer that kept polling would hang the page).
pub async fn callback<T>(device: &wgpu::Device, mut rx: oneshot::Receiver<T>) -> Option<T> {
    if device.adapter_info().backend != wgpu::Backend::Gl {
        return rx.await.ok();
    }
    loop {
        let _ = device.poll(wgpu::PollType::Poll);
        match rx.try_recv() {
            Ok(Some(v)) => return Some(v),
            Ok(None) if crate::lost().is_some() => return None,
            Ok(None) => yield_to_browser().await,
            Err(oneshot::Canceled) => return None,
        }
    }
}

/// Maps `buffer[..n]` for reading and waits for it.
pub async fn mapped(device: &wgpu::Device, buffer: &wgpu::Buffer, n: u64) -> devalloc::Result<()> {
    let (tx, rx) = oneshot::channel();
    buffer.map_async(wgpu::MapMode::Read, 0..n, move |r| {
        let _ = tx.send(r);
    });
    match callback(device, rx).await {
        Some(Ok(())) => Ok(()),
        _ if crate::lost().is_some() => {
            Err(devalloc::Error::invalid_argument("a peer's map failed: the device is lost"))
        }
        _ => Err(devalloc::Error::invalid_argument("a peer's map failed")),
    }
}

/// A `MAP_READ` buffer of `n` bytes.
pub fn read_buffer(device: &wgpu::Device, label: &str, n: u64) -> wgpu::Buffer {
    device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: n,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

/// Whether a `MAP_READ` buffer may be written again after it was read: not on WebGL2, where
/// Chromium warns each time ("READ-usage buffer was written, then fenced, but written again
/// before being read back", measured with the read in between, whatever the order of the read
/// and the fence's deletion): it drops the shadow copy it keeps to speed up read-back. A fresh
/// buffer per read is clean.
pub fn reuse_read_buffers(device: &wgpu::Device) -> bool {
    device.adapter_info().backend != wgpu::Backend::Gl
}
