//! The page's benchmark: devalloc against the peers a careful wgpu user would pick in the
//! browser, interleaved round by round, every result verified: each upload writes the other of
//! two patterns and is read back, each download lands in a cleared buffer and is compared.
//!
//! Upload, until the data are on the device: `queue.write_buffer`, a `StagingBelt` kept across
//! calls, devalloc. Download, into host memory: a fresh `MAP_READ` buffer, one reused
//! `MAP_READ` buffer, `DownloadBuffer`, devalloc. Each waits the way the browser allows
//! (awaiting `on_submitted_work_done` / the map callback).
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use futures_channel::oneshot;
use serde::Serialize;

use crate::wgpu;
use devalloc::wgpu::WgpuAllocator;
use devalloc::{DeviceAllocator, DEFAULT_ALIGNMENT};

fn now_ms() -> f64 {
    use wasm_bindgen::JsCast;
    js_sys::Reflect::get(&js_sys::global(), &"performance".into())
        .ok()
        .and_then(|p| js_sys::Reflect::get(&p, &"now".into()).ok().map(|f| (p, f)))
        .and_then(|(p, f)| f.dyn_into::<js_sys::Function>().ok().and_then(|f| f.call0(&p).ok()))
        .and_then(|v| v.as_f64())
        .unwrap_or_else(js_sys::Date::now)
}

/// One method's median.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MethodResult {
    name: &'static str,
    ours: bool,
    gbps: f64,
    ms: f64,
}

/// One size: every method's median, and devalloc / the best peer.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BenchResult {
    size: usize,
    verified: bool,
    up: Vec<MethodResult>,
    down: Vec<MethodResult>,
    up_ratio: f64,
    up_best_peer: &'static str,
    down_ratio: f64,
    down_best_peer: &'static str,
}

type Op<'a> = Box<dyn FnMut() -> Pin<Box<dyn Future<Output = devalloc::Result<()>> + 'a>> + 'a>;
/// The untimed check after an op (async: checking an upload reads the device back).
type Check<'a> = Box<dyn FnMut() -> Pin<Box<dyn Future<Output = bool> + 'a>> + 'a>;

/// A method: its name, whether it is devalloc, the timed op, and the untimed check after it.
type Method<'a> = (&'static str, bool, Op<'a>, Check<'a>);

/// A check that needs no waiting.
fn now<'a>(mut f: impl FnMut() -> bool + 'a) -> Check<'a> {
    Box::new(move || {
        let good = f();
        Box::pin(async move { good })
    })
}

/// Runs every op `reps` times, interleaved (rotated order each round), after one warm-up each;
/// each result is checked (untimed); `verified` turns false on the first wrong one.
async fn interleave(
    ops: &mut [Method<'_>],
    reps: usize,
    size: usize,
    verified: &mut bool,
) -> devalloc::Result<Vec<MethodResult>> {
    let n = ops.len();
    let mut times = vec![Vec::new(); n];
    for (_, _, op, check) in ops.iter_mut() {
        op().await?;
        *verified &= check().await;
    }
    for round in 0..reps {
        for k in 0..n {
            let i = (k + round) % n;
            let t = now_ms();
            (ops[i].2)().await?;
            times[i].push(now_ms() - t);
            *verified &= (ops[i].3)().await;
        }
    }
    Ok(ops
        .iter()
        .zip(times)
        .map(|((name, ours, ..), mut v)| {
            v.sort_by(f64::total_cmp);
            // The browser's clock is coarse (0.1 ms or worse): a median of 0 counts as 1 us.
            let ms = v[v.len() / 2].max(1e-3);
            MethodResult { name, ours: *ours, gbps: size as f64 / (ms * 1e6), ms }
        })
        .collect())
}

fn ratio(results: &[MethodResult]) -> (f64, &'static str) {
    let ours = results.iter().find(|m| m.ours).map_or(f64::NAN, |m| m.ms);
    let best = results.iter().filter(|m| !m.ours).min_by(|a, b| a.ms.total_cmp(&b.ms));
    best.map_or((f64::NAN, ""), |b| (b.ms / ours, b.name))
}

/// Lets the browser run its event loop once, the way devalloc's own WebGL2 waits do (a task
/// posted through a `MessageChannel`: `setTimeout(0)` is clamped to 4 ms once nested), so the
/// peers wait no longer than devalloc between polls.
async fn yield_to_browser() {
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
/// backend fires callbacks only from `device.poll`, so there the wait polls, letting the
/// browser run between polls (a WebGL2 fence is only signalled between tasks).
async fn callback<T>(device: &wgpu::Device, mut rx: oneshot::Receiver<T>) -> Option<T> {
    if device.adapter_info().backend != wgpu::Backend::Gl {
        return rx.await.ok();
    }
    loop {
        let _ = device.poll(wgpu::PollType::Poll);
        match rx.try_recv() {
            Ok(Some(v)) => return Some(v),
            Ok(None) => yield_to_browser().await,
            Err(oneshot::Canceled) => return None,
        }
    }
}

async fn mapped(device: &wgpu::Device, buffer: &wgpu::Buffer, n: u64) -> devalloc::Result<()> {
    let (tx, rx) = oneshot::channel();
    buffer.map_async(wgpu::MapMode::Read, 0..n, move |r| {
        let _ = tx.send(r);
    });
    match callback(device, rx).await {
        Some(Ok(())) => Ok(()),
        _ => Err(devalloc::Error::invalid_argument("a peer's map failed")),
    }
}

pub async fn run(a: &'static WgpuAllocator, size: usize, reps: usize) -> devalloc::Result<BenchResult> {
    let device = a.device(0)?.clone();
    let queue = a.queue(0)?.clone();
    let n = size.next_multiple_of(4) as u64;
    let data: Vec<u8> = (0..n as usize).map(|i| (i * 7 + i / 4096) as u8).collect();
    let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let plain = |label| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: n,
            usage,
            mapped_at_creation: false,
        })
    };
    let (wb, bb) = (plain("write_buffer peer"), plain("belt peer"));
    let ours = a.allocate(n as usize, 0, DEFAULT_ALIGNMENT)?;
    let belt = RefCell::new(wgpu::util::StagingBelt::new(device.clone(), n.max(1 << 20)));

    // Each upload writes one of two patterns, the other than its last, and is read back
    // (untimed): an upload that did not happen shows.
    let alt: Vec<u8> = data.iter().map(|b| !b).collect();
    let pats = [&data, &alt];
    let checker = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("upload check"),
        size: n,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let holds = |src: &wgpu::Buffer, want: &[u8]| {
        let mut enc = device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(src, 0, &checker, 0, n);
        queue.submit([enc.finish()]);
        let (checker, device) = (&checker, &device);
        let want = want.to_vec();
        async move {
            let good = mapped(device, checker, n).await.is_ok()
                && checker.get_mapped_range(..).is_ok_and(|view| view[..] == want[..]);
            checker.unmap();
            good
        }
    };
    let turns = [std::cell::Cell::new(0usize), std::cell::Cell::new(0usize), std::cell::Cell::new(0usize)];
    let next = |k: usize| {
        turns[k].set(turns[k].get() + 1);
        pats[turns[k].get() % 2]
    };
    let last = |k: usize| pats[turns[k].get() % 2];
    let mut verified = true;
    let mut up: Vec<Method<'_>> = vec![
        (
            "write_buffer",
            false,
            Box::new(|| {
                Box::pin(async {
                    queue.write_buffer(&wb, 0, next(0));
                    queue.submit([]);
                    a.synchronize_async(0).await
                })
            }),
            Box::new(|| Box::pin(holds(&wb, last(0)))),
        ),
        (
            "StagingBelt",
            false,
            Box::new(|| {
                Box::pin(async {
                    let src = next(1);
                    let mut enc = device.create_command_encoder(&Default::default());
                    {
                        let mut belt = belt.borrow_mut();
                        belt.write_buffer(&mut enc, &bb, 0, wgpu::BufferSize::new(n).expect("non-empty"))
                            .copy_from_slice(src);
                        belt.finish();
                    }
                    queue.submit([enc.finish()]);
                    belt.borrow_mut().recall();
                    a.synchronize_async(0).await
                })
            }),
            Box::new(|| Box::pin(holds(&bb, last(1)))),
        ),
        (
            "devalloc",
            true,
            Box::new(|| {
                Box::pin(async {
                    a.copy_host_to_device_async(ours, next(2), 0).await?;
                    a.synchronize_async(0).await
                })
            }),
            Box::new(|| {
                Box::pin(async {
                    let mut back = vec![0u8; n as usize];
                    a.copy_device_to_host_async(&mut back, ours, 0).await.is_ok() && back[..] == last(2)[..]
                })
            }),
        ),
    ];
    let up = interleave(&mut up, reps, size, &mut verified).await?;

    // The downloads read `data` from the buffers (written here, untimed); each copies into
    // host memory, and every result is compared with `data`, untimed.
    let reused = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("reused staging"),
        size: n,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let copy_to = |dst: &wgpu::Buffer, src: &wgpu::Buffer| {
        let mut enc = device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(src, 0, dst, 0, n);
        queue.submit([enc.finish()]);
    };
    queue.write_buffer(&wb, 0, &data);
    queue.write_buffer(&bb, 0, &data);
    a.copy_host_to_device_async(ours, &data, 0).await?;
    a.synchronize_async(0).await?;
    let outs: Vec<Rc<RefCell<Vec<u8>>>> =
        (0..3).map(|_| Rc::new(RefCell::new(vec![0u8; n as usize]))).collect();
    let shared = std::sync::Arc::new(std::sync::Mutex::new(vec![0u8; n as usize]));
    let ok = |k: usize| {
        let out = Rc::clone(&outs[k]);
        let data = &data;
        now(move || {
            let good = out.borrow()[..] == data[..];
            out.borrow_mut().fill(0);
            good
        })
    };
    let shared_ok = {
        let shared = std::sync::Arc::clone(&shared);
        let data = &data;
        now(move || {
            let mut v = shared.lock().unwrap();
            let good = v[..] == data[..];
            v.fill(0);
            good
        })
    };
    let mut down_ops: Vec<Method<'_>> = vec![
        (
            "fresh MAP_READ",
            false,
            Box::new(|| {
                Box::pin(async {
                    let staging = device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("fresh staging"),
                        size: n,
                        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    });
                    copy_to(&staging, &wb);
                    mapped(&device, &staging, n).await?;
                    outs[0].borrow_mut().copy_from_slice(
                        &staging
                            .get_mapped_range(..)
                            .map_err(|_| devalloc::Error::invalid_argument("view"))?,
                    );
                    Ok(())
                })
            }),
            ok(0),
        ),
        (
            "reused MAP_READ",
            false,
            Box::new(|| {
                Box::pin(async {
                    copy_to(&reused, &bb);
                    mapped(&device, &reused, n).await?;
                    outs[1].borrow_mut().copy_from_slice(
                        &reused
                            .get_mapped_range(..)
                            .map_err(|_| devalloc::Error::invalid_argument("view"))?,
                    );
                    reused.unmap();
                    Ok(())
                })
            }),
            ok(1),
        ),
        (
            "DownloadBuffer",
            false,
            Box::new(|| {
                Box::pin(async {
                    let (tx, rx) = oneshot::channel();
                    let into = std::sync::Arc::clone(&shared);
                    wgpu::util::DownloadBuffer::read_buffer(&device, &queue, &wb.slice(..), move |r| {
                        let copied = r.map(|view| into.lock().unwrap().copy_from_slice(&view)).is_ok();
                        let _ = tx.send(copied);
                    });
                    match callback(&device, rx).await {
                        Some(true) => Ok(()),
                        _ => Err(devalloc::Error::invalid_argument("DownloadBuffer failed")),
                    }
                })
            }),
            shared_ok,
        ),
        (
            "devalloc",
            true,
            Box::new(|| {
                Box::pin(async {
                    // Out of its cell while the copy is awaited, back in afterwards.
                    let mut out = std::mem::take(&mut *outs[2].borrow_mut());
                    let r = a.copy_device_to_host_async(&mut out, ours, 0).await;
                    *outs[2].borrow_mut() = out;
                    r
                })
            }),
            ok(2),
        ),
    ];
    let down = interleave(&mut down_ops, reps, size, &mut verified).await?;
    drop(down_ops);
    a.deallocate(ours, 0)?;
    let (up_ratio, up_best_peer) = ratio(&up);
    let (down_ratio, down_best_peer) = ratio(&down);
    Ok(BenchResult { size, verified, up, down, up_ratio, up_best_peer, down_ratio, down_best_peer })
}
