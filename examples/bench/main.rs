//! Bandwidth and latency of devalloc against the baselines a user would otherwise write, in
//! one run, per device:
//!
//! - H2D: devalloc (staged, direct) vs `queue.write_buffer`; D2H: devalloc (staged, direct)
//!   vs a fresh `MAP_READ` staging buffer per download; `memcpy` as the ceiling;
//! - the latency of a 4-byte download;
//! - alloc -> 4-byte upload -> free cycles per second, devalloc's cache vs `create_buffer`.
//!
//! - CUDA (feature `cuda`, where a device is present): devalloc vs cudarc's copies from
//!   pageable memory, with pinned memory as the ceiling; alloc+free, cached vs the driver.
//!
//!     cargo run --release --example bench [--features cuda] [-- --quick] [-- --chunk-mib=N] [-- vulkan|gl|cuda]
//!
//! Every figure is a median over repetitions. Each copy counts as done when the data are on
//! the device (uploads: followed by a device wait) or in host memory (downloads).
#[cfg(feature = "cuda")]
mod cuda;

use std::hint::black_box;
use std::time::{Duration, Instant};

use devalloc::{DeviceAllocator, DEFAULT_ALIGNMENT};
use devalloc::{PoolConfig, Route, WgpuAllocator, WgpuOptions};

pub(crate) const KIB: usize = 1 << 10;
pub(crate) const MIB: usize = 1 << 20;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Median time of `f` over enough repetitions for `bytes` per call.
pub(crate) fn time(bytes: usize, quick: bool, mut f: impl FnMut()) -> Duration {
    f(); // warm up: staging buffers, caches, first-use zeroing
    let budget = if quick { 64 * MIB } else { 768 * MIB };
    let reps = (budget / bytes.max(1)).clamp(5, if quick { 50 } else { 400 });
    median(
        (0..reps)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect(),
    )
}

pub(crate) fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

fn wait(device: &wgpu::Device) {
    device.poll(wgpu::PollType::wait_indefinitely()).expect("poll");
}

/// Plain wgpu download: a fresh MAP_READ buffer per call.
fn plain_download(device: &wgpu::Device, queue: &wgpu::Queue, src: &wgpu::Buffer, dst: &mut [u8]) {
    let n = (dst.len() as u64).next_multiple_of(4);
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("baseline staging"),
        size: n,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(src, 0, &staging, 0, n);
    queue.submit([enc.finish()]);
    staging.map_async(wgpu::MapMode::Read, .., |r| r.expect("map"));
    wait(device);
    let view = staging.get_mapped_range(..).expect("mapped");
    dst.copy_from_slice(&view[..dst.len()]);
}

struct Dev {
    staged: WgpuAllocator,
    direct: Option<WgpuAllocator>,
}

fn open(backend: wgpu::Backend, chunk: Option<u64>) -> Option<Dev> {
    let mut staged_opts = WgpuOptions { route: Some(Route::Staged), ..Default::default() };
    if let Some(c) = chunk {
        staged_opts.staging_chunk = Some(c);
    }
    let staged = WgpuAllocator::new_with(backend, staged_opts).ok()?;
    let direct =
        WgpuAllocator::new_with(backend, WgpuOptions { route: Some(Route::Direct), ..Default::default() })
            .ok();
    Some(Dev { staged, direct })
}

fn bench_device(name: &str, dev: &Dev, quick: bool) {
    let a = &dev.staged;
    let device = a.device(0).unwrap();
    let queue = a.queue(0).unwrap();
    println!("\n## {name}: {}", a.device_name(0));
    let sizes: &[usize] =
        if quick { &[4 * KIB, MIB, 64 * MIB] } else { &[4 * KIB, MIB, 64 * MIB, 256 * MIB] };

    println!("\nH2D GB/s (upload, until on the device)");
    println!(
        "{:>8} {:>8} {:>13} {:>9} {:>9} {:>13} {:>13}",
        "size", "memcpy", "write_buffer", "staged", "direct", "staged/plain", "direct/memcpy"
    );
    let mut up = Vec::new();
    for &s in sizes {
        let host: Vec<u8> = (0..s).map(|i| i as u8).collect();
        let mut sink = vec![0u8; s];
        let memcpy = gbps(
            s,
            time(s, quick, || {
                sink.copy_from_slice(black_box(&host));
                black_box(&sink);
            }),
        );
        let plain_buf = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("baseline"),
            size: s as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let plain = gbps(
            s,
            time(s, quick, || {
                queue.write_buffer(&plain_buf, 0, &host);
                queue.submit([]);
                wait(device);
            }),
        );
        let p = a.allocate(s, 0, DEFAULT_ALIGNMENT).unwrap();
        let staged = gbps(
            s,
            time(s, quick, || {
                a.copy_host_to_device(p, &host, 0).unwrap();
                a.synchronize(0).unwrap();
            }),
        );
        a.deallocate(p, 0).unwrap();
        let direct = dev.direct.as_ref().map(|d| {
            let p = d.allocate(s, 0, DEFAULT_ALIGNMENT).unwrap();
            let g = gbps(s, time(s, quick, || d.copy_host_to_device(p, &host, 0).unwrap()));
            d.deallocate(p, 0).unwrap();
            g
        });
        println!(
            "{:>8} {:>8.2} {:>13.2} {:>9.2} {:>9} {:>12.2}x {:>12}",
            human(s),
            memcpy,
            plain,
            staged,
            opt(direct),
            staged / plain,
            direct.map_or("-".into(), |d| format!("{:.2}x", d / memcpy))
        );
        up.push((s, memcpy, plain, staged, direct));
    }

    println!("\nD2H GB/s (download, into host memory)");
    println!(
        "{:>8} {:>8} {:>13} {:>9} {:>9} {:>13} {:>13}",
        "size", "memcpy", "fresh-stage", "staged", "direct", "staged/plain", "direct/memcpy"
    );
    for &(s, memcpy, ..) in &up {
        let mut dst = vec![0u8; s];
        let src = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("baseline"),
            size: s as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let plain = gbps(s, time(s, quick, || plain_download(device, queue, &src, &mut dst)));
        let p = a.allocate(s, 0, DEFAULT_ALIGNMENT).unwrap();
        let staged = gbps(s, time(s, quick, || a.copy_device_to_host(&mut dst, p, 0).unwrap()));
        a.deallocate(p, 0).unwrap();
        let direct = dev.direct.as_ref().map(|d| {
            let p = d.allocate(s, 0, DEFAULT_ALIGNMENT).unwrap();
            let g = gbps(s, time(s, quick, || d.copy_device_to_host(&mut dst, p, 0).unwrap()));
            d.deallocate(p, 0).unwrap();
            g
        });
        println!(
            "{:>8} {:>8.2} {:>13.2} {:>9.2} {:>9} {:>12.2}x {:>12}",
            human(s),
            memcpy,
            plain,
            staged,
            opt(direct),
            staged / plain,
            direct.map_or("-".into(), |d| format!("{:.2}x", d / memcpy))
        );
    }

    println!("\n4-byte download latency (us)");
    let src = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("baseline"),
        size: 256,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let mut four = [0u8; 4];
    let plain = time(4, quick, || plain_download(device, queue, &src, &mut four));
    let p = a.allocate(4, 0, DEFAULT_ALIGNMENT).unwrap();
    let staged = time(4, quick, || a.copy_device_to_host(&mut four, p, 0).unwrap());
    a.deallocate(p, 0).unwrap();
    let direct = dev.direct.as_ref().map(|d| {
        let p = d.allocate(4, 0, DEFAULT_ALIGNMENT).unwrap();
        let t = time(4, quick, || d.copy_device_to_host(&mut four, p, 0).unwrap());
        d.deallocate(p, 0).unwrap();
        t
    });
    println!(
        "  fresh staging {:.1}, devalloc staged {:.1}, devalloc direct {}",
        us(plain),
        us(staged),
        direct.map_or("-".into(), |d| format!("{:.1}", us(d)))
    );

    println!("\nalloc -> 4-byte upload -> free, cycles/s");
    println!("{:>8} {:>14} {:>14} {:>14} {:>8}", "size", "create_buffer", "devalloc", "no cache", "ratio");
    let uncached = WgpuAllocator::from_device_with(
        device.clone(),
        queue.clone(),
        WgpuOptions { pool: PoolConfig::default(), route: Some(Route::Staged), ..Default::default() },
    )
    .unwrap();
    for s in [64 * KIB, MIB, 16 * MIB] {
        let n = if quick { 50 } else { 400 };
        let per = |d: Duration| 1.0 / d.as_secs_f64();
        let plain = per(time(n, quick, || {
            let b = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("baseline"),
                size: s as u64,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            queue.write_buffer(&b, 0, &[1, 2, 3, 4]);
            queue.submit([]);
            drop(b);
        }));
        let cycle = |alloc: &WgpuAllocator| {
            per(time(n, quick, || {
                let p = alloc.allocate(s, 0, DEFAULT_ALIGNMENT).unwrap();
                alloc.copy_host_to_device(p, &[1, 2, 3, 4], 0).unwrap();
                queue.submit([]); // as the baseline: the write reaches the device
                alloc.deallocate(p, 0).unwrap();
            }))
        };
        let cached = cycle(a);
        let nocache = cycle(&uncached);
        wait(device);
        println!(
            "{:>8} {:>14.0} {:>14.0} {:>14.0} {:>7.2}x",
            human(s),
            plain,
            cached,
            nocache,
            cached / plain
        );
    }
    let st = a.stats(0).unwrap();
    println!(
        "\ncache: {} hits / {} misses; routes: staged allocator {:?}, direct allocator {:?}",
        st.cache_hits,
        st.cache_misses,
        a.route(0).unwrap(),
        dev.direct.as_ref().map(|d| d.route(0).unwrap())
    );
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |g| format!("{g:.2}"))
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

pub(crate) fn human(b: usize) -> String {
    if b >= MIB {
        format!("{}M", b / MIB)
    } else {
        format!("{}K", b / KIB)
    }
}

#[cfg(feature = "cuda")]
fn run_cuda(quick: bool) {
    cuda::run(quick);
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(_quick: bool) {
    println!("\n## cuda: not built (run with --features cuda)");
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    // --chunk-mib=N: staging chunk of the staged allocator (default: WgpuOptions's).
    let chunk = args
        .iter()
        .find_map(|a| a.strip_prefix("--chunk-mib="))
        .and_then(|v| v.parse::<u64>().ok())
        .map(|m| m << 20);
    let only: Vec<&str> = args.iter().filter(|a| !a.starts_with("--")).map(String::as_str).collect();
    println!("# devalloc bench{}", if quick { " (quick)" } else { "" });
    for (name, backend) in [
        ("vulkan", wgpu::Backend::Vulkan),
        ("gl", wgpu::Backend::Gl),
        ("metal", wgpu::Backend::Metal),
        ("dx12", wgpu::Backend::Dx12),
    ] {
        if !only.is_empty() && !only.contains(&name) {
            continue;
        }
        if !wgpu::Instance::enabled_backend_features().contains(backend.into()) {
            continue;
        }
        match open(backend, chunk) {
            Some(dev) => bench_device(name, &dev, quick),
            None => println!("\n## {name}: no adapter"),
        }
    }
    if only.is_empty() || only.contains(&"cuda") {
        run_cuda(quick);
    }
}
