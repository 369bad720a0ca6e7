//! The page's benchmark: devalloc against the peers a careful wgpu user would pick in the
//! browser, interleaved round by round, every result verified: each upload writes the other of
//! two patterns and is read back, each download lands in a cleared buffer and is compared.
//!
//! Upload, until the data are on the device: `queue.write_buffer`, a `StagingBelt` kept across
//! calls, devalloc. Download, into host memory: a fresh `MAP_READ` buffer, one reused
//! `MAP_READ` buffer (not on WebGL2: see [`peers::reuse_read_buffers`]), `DownloadBuffer`,
//! devalloc. Each waits the way the browser allows (awaiting `on_submitted_work_done` / the
//! map callback).
//!
//! One sample times `repeat` operations back to back and divides: a 4-byte read takes less
//! than the browser's timer resolution, so the latency is measured over many reads at once.
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use futures_channel::oneshot;
use serde::Serialize;

use crate::peers::{self, callback, mapped, now_ms, read_buffer};
use crate::wgpu;
use devalloc::wgpu::WgpuAllocator;
use devalloc::{DeviceAllocator, DEFAULT_ALIGNMENT};

/// One method's median.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MethodResult {
    name: &'static str,
    ours: bool,
    gbps: f64,
    /// Milliseconds per operation (a sample's time over its `repeat` operations).
    ms: f64,
}

/// A peer not measured here, and why.
#[derive(Serialize)]
pub struct Skipped {
    name: &'static str,
    why: &'static str,
}

/// One size: every method's median, and devalloc / the best peer.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BenchResult {
    size: usize,
    verified: bool,
    /// Samples per method (after one warm-up each), and operations timed together per sample.
    samples: usize,
    repeat: usize,
    up: Vec<MethodResult>,
    down: Vec<MethodResult>,
    skipped: Vec<Skipped>,
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
/// a sample is `repeat` ops back to back, each checked (untimed, after the sample); `verified`
/// turns false on the first wrong one.
async fn interleave(
    ops: &mut [Method<'_>],
    reps: usize,
    repeat: usize,
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
            for _ in 0..repeat {
                (ops[i].2)().await?;
            }
            times[i].push((now_ms() - t) / repeat as f64);
            *verified &= (ops[i].3)().await;
        }
    }
    Ok(ops
        .iter()
        .zip(times)
        .map(|((name, ours, ..), mut v)| {
            v.sort_by(f64::total_cmp);
            // The clock has 0.1 ms steps: a median of 0 (a sample faster than one step) counts as
            // one step's worth over the sample.
            let ms = v[v.len() / 2].max(0.1 / repeat as f64);
            MethodResult { name, ours: *ours, gbps: size as f64 / (ms * 1e6), ms }
        })
        .collect())
}

/// The error of a peer's mapped range that could not be viewed.
fn view_err(_: wgpu::MapRangeError) -> devalloc::Error {
    devalloc::Error::invalid_argument("a peer's mapped range could not be viewed")
}

fn ratio(results: &[MethodResult]) -> (f64, &'static str) {
    let ours = results.iter().find(|m| m.ours).map_or(f64::NAN, |m| m.ms);
    let best = results.iter().filter(|m| !m.ours).min_by(|a, b| a.ms.total_cmp(&b.ms));
    best.map_or((f64::NAN, ""), |b| (b.ms / ours, b.name))
}

/// What to measure.
#[derive(Clone, Copy)]
pub struct Plan {
    /// Samples per method.
    pub reps: usize,
    /// Operations timed together per sample.
    pub repeat: usize,
    /// Whether to measure uploads (the latency measures downloads only).
    pub uploads: bool,
}

pub async fn run(a: &'static WgpuAllocator, size: usize, plan: Plan) -> devalloc::Result<BenchResult> {
    let device = a.device(0)?.clone();
    let queue = a.queue(0)?.clone();
    let reuse = peers::reuse_read_buffers(&device);
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
    let result = measure(a, &device, &queue, (&wb, &bb), ours, &data, plan, reuse).await;
    a.deallocate(ours, 0)?;
    let (up, down, verified) = result?;
    let skipped = if reuse {
        Vec::new()
    } else {
        vec![Skipped {
            name: "reused MAP_READ",
            why: "on WebGL2 Chromium warns every time a read buffer is written again after a read, and drops the copy it keeps to speed up reading",
        }]
    };
    let (up_ratio, up_best_peer) = ratio(&up);
    let (down_ratio, down_best_peer) = ratio(&down);
    Ok(BenchResult {
        size,
        verified,
        samples: plan.reps,
        repeat: plan.repeat,
        up,
        down,
        skipped,
        up_ratio,
        up_best_peer,
        down_ratio,
        down_best_peer,
    })
}

type Measured = (Vec<MethodResult>, Vec<MethodResult>, bool);

#[allow(clippy::too_many_arguments)]
async fn measure(
    a: &'static WgpuAllocator,
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    (wb, bb): (&wgpu::Buffer, &wgpu::Buffer),
    ours: devalloc::DevicePtr,
    data: &[u8],
    plan: Plan,
    reuse: bool,
) -> devalloc::Result<Measured> {
    let n = data.len() as u64;
    let size = data.len();
    let mut verified = true;
    let up = if plan.uploads {
        let belt = RefCell::new(wgpu::util::StagingBelt::new(device.clone(), n.max(1 << 20)));
        // Each upload writes one of two patterns, the other than its last, and is read back
        // (untimed): an upload that did not happen shows.
        let alt: Vec<u8> = data.iter().map(|b| !b).collect();
        let pats = [data, &alt[..]];
        let kept_checker = reuse.then(|| read_buffer(device, "upload check", n));
        let holds = |src: &wgpu::Buffer, want: &[u8]| {
            let checker = kept_checker.clone().unwrap_or_else(|| read_buffer(device, "upload check", n));
            let mut enc = device.create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(src, 0, &checker, 0, n);
            queue.submit([enc.finish()]);
            let want = want.to_vec();
            async move {
                let good = mapped(device, &checker, n).await.is_ok()
                    && checker.get_mapped_range(..).is_ok_and(|view| view[..] == want[..]);
                checker.unmap();
                good
            }
        };
        let turns = [Cell::new(0usize), Cell::new(0usize), Cell::new(0usize)];
        let next = |k: usize| {
            turns[k].set(turns[k].get() + 1);
            pats[turns[k].get() % 2]
        };
        let last = |k: usize| pats[turns[k].get() % 2];
        let mut up: Vec<Method<'_>> = vec![
            (
                "write_buffer",
                false,
                Box::new(|| {
                    Box::pin(async {
                        queue.write_buffer(wb, 0, next(0));
                        queue.submit([]);
                        a.synchronize_async(0).await
                    })
                }),
                Box::new(|| Box::pin(holds(wb, last(0)))),
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
                            belt.write_buffer(&mut enc, bb, 0, wgpu::BufferSize::new(n).expect("non-empty"))
                                .copy_from_slice(src);
                            belt.finish();
                        }
                        queue.submit([enc.finish()]);
                        belt.borrow_mut().recall();
                        a.synchronize_async(0).await
                    })
                }),
                Box::new(|| Box::pin(holds(bb, last(1)))),
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
                        a.copy_device_to_host_async(&mut back, ours, 0).await.is_ok()
                            && back[..] == last(2)[..]
                    })
                }),
            ),
        ];
        interleave(&mut up, plan.reps, plan.repeat, size, &mut verified).await?
    } else {
        Vec::new()
    };

    // The downloads read `data` from the buffers (written here, untimed); each copies into
    // host memory, and every result is compared with `data`, untimed.
    let reused = reuse.then(|| read_buffer(device, "reused staging", n));
    let copy_to = |dst: &wgpu::Buffer, src: &wgpu::Buffer| {
        let mut enc = device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(src, 0, dst, 0, n);
        queue.submit([enc.finish()]);
    };
    queue.write_buffer(wb, 0, data);
    queue.write_buffer(bb, 0, data);
    a.copy_host_to_device_async(ours, data, 0).await?;
    a.synchronize_async(0).await?;
    let outs: Vec<Rc<RefCell<Vec<u8>>>> = (0..3).map(|_| Rc::new(RefCell::new(vec![0u8; size]))).collect();
    let shared = std::sync::Arc::new(std::sync::Mutex::new(vec![0u8; size]));
    let ok = |k: usize| {
        let out = Rc::clone(&outs[k]);
        now(move || {
            let good = out.borrow()[..] == data[..];
            out.borrow_mut().fill(0);
            good
        })
    };
    let shared_ok = {
        let shared = std::sync::Arc::clone(&shared);
        now(move || {
            let mut v = shared.lock().unwrap_or_else(|p| p.into_inner());
            let good = v[..] == data[..];
            v.fill(0);
            good
        })
    };
    let mut down: Vec<Method<'_>> = vec![(
        "fresh MAP_READ",
        false,
        Box::new(|| {
            Box::pin(async {
                let staging = read_buffer(device, "fresh staging", n);
                copy_to(&staging, wb);
                mapped(device, &staging, n).await?;
                outs[0].borrow_mut().copy_from_slice(&staging.get_mapped_range(..).map_err(view_err)?);
                Ok(())
            })
        }),
        ok(0),
    )];
    if let Some(reused) = &reused {
        let outs = &outs;
        down.push((
            "reused MAP_READ",
            false,
            Box::new(move || {
                Box::pin(async move {
                    copy_to(reused, bb);
                    mapped(device, reused, n).await?;
                    outs[1].borrow_mut().copy_from_slice(&reused.get_mapped_range(..).map_err(view_err)?);
                    reused.unmap();
                    Ok(())
                })
            }),
            ok(1),
        ));
    }
    down.push((
        "DownloadBuffer",
        false,
        Box::new(|| {
            Box::pin(async {
                let (tx, rx) = oneshot::channel();
                let into = std::sync::Arc::clone(&shared);
                wgpu::util::DownloadBuffer::read_buffer(device, queue, &wb.slice(..), move |r| {
                    let copied = r
                        .map(|view| into.lock().unwrap_or_else(|p| p.into_inner()).copy_from_slice(&view))
                        .is_ok();
                    let _ = tx.send(copied);
                });
                match callback(device, rx).await {
                    Some(true) => Ok(()),
                    _ => Err(devalloc::Error::invalid_argument("DownloadBuffer failed")),
                }
            })
        }),
        shared_ok,
    ));
    down.push((
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
    ));
    let down = interleave(&mut down, plan.reps, plan.repeat, size, &mut verified).await?;
    Ok((up, down, verified))
}
