//! The wgpu half of the benchmark: staged and direct routes against their peers.
use std::cell::RefCell;
use std::future::Future;
use std::hint::black_box;
use std::time::{Duration, Instant};

use devalloc::wgpu::{Route, WgpuAllocator, WgpuOptions};
use devalloc::{DeviceAllocator, DevicePtr, PoolOptions, DEFAULT_ALIGNMENT};

use crate::common::{cold_row, header, human, interleave, reps, row, Method, KIB, MIB};
use crate::peers;

pub const BACKENDS: [(&str, wgpu::Backend); 4] = [
    ("vulkan", wgpu::Backend::Vulkan),
    ("gl", wgpu::Backend::Gl),
    ("metal", wgpu::Backend::Metal),
    ("dx12", wgpu::Backend::Dx12),
];

fn sizes(max: u64, quick: bool) -> Vec<usize> {
    let all = [4 * KIB, 64 * KIB, MIB, 16 * MIB, 64 * MIB, 256 * MIB];
    all.into_iter().take(if quick { 4 } else { 6 }).filter(|&s| s as u64 <= max).collect()
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 12) as u8).collect()
}

/// Reads `n` bytes of a plain buffer (for verifying peers' uploads).
fn read_plain(device: &wgpu::Device, queue: &wgpu::Queue, b: &wgpu::Buffer, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    peers::fresh_download(device, queue, b, &mut out);
    out
}

fn read_ours(a: &WgpuAllocator, p: DevicePtr, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    a.copy_device_to_host(&mut out, p, 0).expect("readback");
    out
}

pub fn run(name: &str, backend: wgpu::Backend, quick: bool) {
    if !wgpu::Instance::enabled_backend_features().contains(backend.into()) {
        return;
    }
    let staged = match WgpuAllocator::with_options(
        backend,
        WgpuOptions { route: Some(Route::Staged), ..Default::default() },
    ) {
        Ok(a) => a,
        Err(e) => {
            println!("\n## {name}: not run: {e}");
            return;
        }
    };
    let direct = WgpuAllocator::with_options(
        backend,
        WgpuOptions { route: Some(Route::Direct), ..Default::default() },
    )
    .ok();
    println!("\n## {name}: {}", staged.device_name(0));
    let max = staged.max_allocation(0).unwrap();
    staged_uploads(&staged, max, quick);
    staged_downloads(&staged, max, quick);
    match &direct {
        Some(d) => direct_route(d, max, quick),
        None => println!("\n(no direct route: the adapter lacks unified memory or MAPPABLE_PRIMARY_BUFFERS)"),
    }
    crate::first_poll::run("staged route", &staged, max, quick);
    if let Some(d) = &direct {
        crate::first_poll::run("direct route", d, max, quick);
    }
    latency(&staged, direct.as_ref(), quick);
    alloc_cycle(&staged, quick);
    check_costs(&staged);
    let s = staged.stats(0).unwrap();
    println!(
        "\nstaging held by devalloc after the run: {} (its budget: 8 chunks)",
        human(s.staging_bytes as usize)
    );
}

fn staged_uploads(a: &WgpuAllocator, max: u64, quick: bool) {
    let (device, queue) = (a.device(0).unwrap(), a.queue(0).unwrap());
    println!("\nupload, staged route: until the data are on the device (GB/s)");
    let mut first = true;
    for size in sizes(max, quick) {
        let data = [pattern(size, 1), pattern(size, 2)];
        let last: RefCell<[usize; 4]> = RefCell::new([0; 4]);
        let pb = peers::storage(device, size);
        let bb = peers::storage(device, size);
        let ours = a.allocate(size, 0, DEFAULT_ALIGNMENT).unwrap();
        let mut sink = vec![0u8; size];
        let mut belt = peers::Belt::new(device, size);
        let mut turn = [0usize; 4];
        let next = |k: usize, turn: &mut [usize; 4]| {
            turn[k] ^= 1;
            last.borrow_mut()[k] = turn[k];
            turn[k]
        };
        let turn = RefCell::new(&mut turn);
        let check = |got: Vec<u8>, k: usize| got == data[last.borrow()[k]];
        let small = size <= MIB;
        let mut methods = vec![
            Method::new("memcpy", || {
                let i = next(0, &mut turn.borrow_mut());
                sink.copy_from_slice(black_box(&data[i]));
                black_box(&sink);
            })
            .ceiling(),
            Method::new("write_buffer", || {
                let i = next(1, &mut turn.borrow_mut());
                peers::write_buffer(device, queue, &pb, &data[i]);
            })
            .verify(|| !small || check(read_plain(device, queue, &pb, size), 1)),
            Method::new("StagingBelt", || {
                let i = next(2, &mut turn.borrow_mut());
                belt.upload(device, queue, &bb, &data[i]);
            })
            .verify(|| !small || check(read_plain(device, queue, &bb, size), 2)),
            Method::new("devalloc", || {
                let i = next(3, &mut turn.borrow_mut());
                a.copy_host_to_device(ours, &data[i], 0).unwrap();
                a.synchronize(0).unwrap();
            })
            .ours()
            .verify(|| !small || check(read_ours(a, ours, size), 3)),
        ];
        let t = interleave(&mut methods, reps(size, quick));
        drop(methods);
        // Large sizes are verified once, after the last round (each round alternates data).
        assert!(
            check(read_plain(device, queue, &pb, size), 1) && check(read_plain(device, queue, &bb, size), 2)
        );
        assert!(check(read_ours(a, ours, size), 3), "devalloc's upload differs");
        if first {
            println!("{}", header(&t));
            first = false;
        }
        println!("{}", row(size, &t));
        if size == MIB {
            println!("{}", cold_row(size, &t));
        }
        a.deallocate(ours, 0).unwrap();
    }
}

fn staged_downloads(a: &WgpuAllocator, max: u64, quick: bool) {
    let (device, queue) = (a.device(0).unwrap(), a.queue(0).unwrap());
    println!("\ndownload, staged route: into host memory (GB/s)");
    let mut first = true;
    for size in sizes(max, quick) {
        let data = pattern(size, 9);
        let src = peers::storage(device, size);
        peers::write_buffer(device, queue, &src, &data);
        let ours = a.allocate(size, 0, DEFAULT_ALIGNMENT).unwrap();
        a.copy_host_to_device(ours, &data, 0).unwrap();
        let reused = peers::Reused::new(device, size);
        let dsts: Vec<RefCell<Vec<u8>>> = (0..5).map(|_| RefCell::new(vec![0u8; size])).collect();
        let (dsts, data) = (&dsts, &data);
        let clear = |k: usize| move || dsts[k].borrow_mut()[..].fill(0);
        let ok = |k: usize| move || *dsts[k].borrow() == *data;
        let mut methods = vec![
            Method::new("memcpy", move || dsts[0].borrow_mut().copy_from_slice(black_box(data))).ceiling(),
            Method::new("fresh MAP_READ", || {
                peers::fresh_download(device, queue, &src, &mut dsts[1].borrow_mut())
            })
            .prepare(clear(1))
            .verify(ok(1)),
            Method::new("reused MAP_READ", || {
                reused.download(device, queue, &src, &mut dsts[2].borrow_mut())
            })
            .prepare(clear(2))
            .verify(ok(2)),
            Method::new("DownloadBuffer", || {
                peers::download_buffer(device, queue, &src, &mut dsts[3].borrow_mut())
            })
            .prepare(clear(3))
            .verify(ok(3)),
            Method::new("devalloc", || a.copy_device_to_host(&mut dsts[4].borrow_mut(), ours, 0).unwrap())
                .ours()
                .prepare(clear(4))
                .verify(ok(4)),
        ];
        let t = interleave(&mut methods, reps(size, quick));
        if first {
            println!("{}", header(&t));
            first = false;
        }
        println!("{}", row(size, &t));
        if size == MIB {
            println!("{}", cold_row(size, &t));
        }
        a.deallocate(ours, 0).unwrap();
    }
}

fn direct_route(a: &WgpuAllocator, max: u64, quick: bool) {
    let device = a.device(0).unwrap();
    println!("\ndirect route (unified memory, mapped buffers): upload | download (GB/s), per-call overhead");
    println!(
        "{:>6} {:>10} {:>10} {:>10} {:>8} | {:>10} {:>10} {:>10} {:>8} | overhead up/down (ns)",
        "size", "memcpy", "hand map", "devalloc", "ratio", "memcpy", "hand map", "devalloc", "ratio"
    );
    for size in sizes(max, quick) {
        let data = pattern(size, 5);
        let hand = peers::mappable(device, size);
        let ours = a.allocate(size, 0, DEFAULT_ALIGNMENT).unwrap();
        let sink = RefCell::new(vec![0u8; size]);
        let mut up = vec![
            Method::new("memcpy", || sink.borrow_mut().copy_from_slice(black_box(&data))).ceiling(),
            Method::new("hand map", || peers::map_write(device, &hand, &data)),
            Method::new("devalloc", || a.copy_host_to_device(ours, &data, 0).unwrap()).ours(),
        ];
        let tu = interleave(&mut up, reps(size, quick));
        drop(up);
        let mut check = vec![0u8; size];
        peers::map_read(device, &hand, &mut check);
        assert!(check == data, "hand-mapped upload differs");
        assert!(read_ours(a, ours, size) == data, "devalloc's direct upload differs");
        let dsts: Vec<RefCell<Vec<u8>>> = (0..3).map(|_| RefCell::new(vec![0u8; size])).collect();
        let (dsts, datar) = (&dsts, &data);
        let clear = |k: usize| move || dsts[k].borrow_mut()[..].fill(0);
        let ok = |k: usize| move || *dsts[k].borrow() == *datar;
        let mut down = vec![
            Method::new("memcpy", move || dsts[0].borrow_mut().copy_from_slice(black_box(datar))).ceiling(),
            Method::new("hand map", || peers::map_read(device, &hand, &mut dsts[1].borrow_mut()))
                .prepare(clear(1))
                .verify(ok(1)),
            Method::new("devalloc", || a.copy_device_to_host(&mut dsts[2].borrow_mut(), ours, 0).unwrap())
                .ours()
                .prepare(clear(2))
                .verify(ok(2)),
        ];
        let td = interleave(&mut down, reps(size, quick));
        let g = |t: &crate::common::Timings, i: usize| crate::common::gbps(size, t.median[i]);
        let over =
            |t: &crate::common::Timings| t.median[2].as_nanos() as i128 - t.median[1].as_nanos() as i128;
        println!(
            "{:>6} {:>10.2} {:>10.2} {:>10.2} {:>7.2}x | {:>10.2} {:>10.2} {:>10.2} {:>7.2}x | {:>+8} / {:>+8}",
            human(size),
            g(&tu, 0),
            g(&tu, 1),
            g(&tu, 2),
            tu.ratio().unwrap().0,
            g(&td, 0),
            g(&td, 1),
            g(&td, 2),
            td.ratio().unwrap().0,
            over(&tu),
            over(&td)
        );
        a.deallocate(ours, 0).unwrap();
    }
}

fn latency(staged: &WgpuAllocator, direct: Option<&WgpuAllocator>, quick: bool) {
    let (device, queue) = (staged.device(0).unwrap(), staged.queue(0).unwrap());
    let src = peers::storage(device, 256);
    peers::write_buffer(device, queue, &src, &[7u8; 256]);
    let reused = peers::Reused::new(device, 4);
    let ours = staged.allocate(4, 0, DEFAULT_ALIGNMENT).unwrap();
    staged.copy_host_to_device(ours, &[7u8; 4], 0).unwrap();
    let outs: Vec<RefCell<[u8; 4]>> = (0..6).map(|_| RefCell::new([0u8; 4])).collect();
    let outs = &outs;
    let clear = |k: usize| move || *outs[k].borrow_mut() = [0; 4];
    let ok = |k: usize| move || *outs[k].borrow() == [7u8; 4];
    let mut methods = vec![
        Method::new("fresh MAP_READ", || {
            peers::fresh_download(device, queue, &src, &mut outs[0].borrow_mut()[..])
        })
        .prepare(clear(0))
        .verify(ok(0)),
        Method::new("reused MAP_READ", || {
            reused.download(device, queue, &src, &mut outs[1].borrow_mut()[..])
        })
        .prepare(clear(1))
        .verify(ok(1)),
        Method::new("DownloadBuffer", || {
            peers::download_buffer(device, queue, &src, &mut outs[2].borrow_mut()[..])
        })
        .prepare(clear(2))
        .verify(ok(2)),
        Method::new("devalloc staged", || {
            staged.copy_device_to_host(&mut outs[3].borrow_mut()[..], ours, 0).unwrap()
        })
        .ours()
        .prepare(clear(3))
        .verify(ok(3)),
    ];
    let direct_bits = direct.map(|d| {
        let dev = d.device(0).unwrap();
        let hand = peers::mappable(dev, 256);
        peers::map_write(dev, &hand, &[7u8; 256]);
        let p = d.allocate(4, 0, DEFAULT_ALIGNMENT).unwrap();
        d.copy_host_to_device(p, &[7u8; 4], 0).unwrap();
        (d, dev, hand, p)
    });
    let t = interleave(&mut methods, reps(4, quick));
    let mut line = String::from("\n4-byte download latency (us):");
    for (n, d) in t.names.iter().zip(&t.median) {
        line += &format!(" {n} {:.1},", d.as_secs_f64() * 1e6);
    }
    if let Some((d, dev, hand, p)) = &direct_bits {
        let mut m = vec![
            Method::new("hand map", || peers::map_read(dev, hand, &mut outs[4].borrow_mut()[..]))
                .prepare(clear(4))
                .verify(ok(4)),
            Method::new("devalloc direct", || {
                d.copy_device_to_host(&mut outs[5].borrow_mut()[..], *p, 0).unwrap()
            })
            .ours()
            .prepare(clear(5))
            .verify(ok(5)),
        ];
        let td = interleave(&mut m, reps(4, quick));
        for (n, x) in td.names.iter().zip(&td.median) {
            line += &format!(" {n} {:.1},", x.as_secs_f64() * 1e6);
        }
    }
    let (r, peer) = t.ratio().unwrap();
    println!("{}  staged: {r:.2}x {peer}", line.trim_end_matches(','));
    staged.deallocate(ours, 0).unwrap();
    if let Some((d, _, _, p)) = direct_bits {
        d.deallocate(p, 0).unwrap();
    }
}

fn alloc_cycle(a: &WgpuAllocator, quick: bool) {
    let (device, queue) = (a.device(0).unwrap(), a.queue(0).unwrap());
    let uncached = WgpuAllocator::from_device_with_options(
        device.clone(),
        queue.clone(),
        WgpuOptions { pool: PoolOptions::default(), route: Some(a.route(0).unwrap()), ..Default::default() },
    )
    .unwrap();
    println!("\nalloc -> free cycles per second (each ending with a poll): bare | with first use (a 4-byte write, submitted)");
    println!(
        "{:>6} {:>14} {:>14} {:>14} {:>7} | {:>14} {:>14} {:>14} {:>7}",
        "size",
        "create_buffer",
        "devalloc",
        "no cache",
        "ratio",
        "create+write",
        "devalloc",
        "no cache",
        "ratio"
    );
    for size in [64 * KIB, MIB, 16 * MIB] {
        let n = if quick { 100 } else { 1000 };
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        // Dropped buffers are freed at the next poll: every call ends with one (timed, as in
        // an app's loop), or a thousand 16 MiB buffers pile up. devalloc's own per-call poll
        // then finds little left to do.
        let settle = || drop(device.poll(wgpu::PollType::Poll));
        let mut bare = vec![
            Method::new("create_buffer", || {
                drop(peers::buffer(device, size, usage));
                settle();
            }),
            Method::new("devalloc", || {
                let p = a.allocate(size, 0, DEFAULT_ALIGNMENT).unwrap();
                a.deallocate(p, 0).unwrap();
                settle();
            })
            .ours(),
            Method::new("no cache", || {
                let p = uncached.allocate(size, 0, DEFAULT_ALIGNMENT).unwrap();
                uncached.deallocate(p, 0).unwrap();
                settle();
            })
            .ceiling(),
        ];
        let tb = interleave(&mut bare, n);
        let mut used = vec![
            Method::new("create+write", || {
                let b = peers::buffer(device, size, usage);
                queue.write_buffer(&b, 0, &[1, 2, 3, 4]);
                drop(b);
                queue.submit([]);
                settle();
            }),
            Method::new("devalloc", || {
                let p = a.allocate(size, 0, DEFAULT_ALIGNMENT).unwrap();
                a.copy_host_to_device(p, &[1, 2, 3, 4], 0).unwrap();
                a.deallocate(p, 0).unwrap();
                queue.submit([]);
                settle();
            })
            .ours(),
            Method::new("no cache", || {
                let p = uncached.allocate(size, 0, DEFAULT_ALIGNMENT).unwrap();
                uncached.copy_host_to_device(p, &[1, 2, 3, 4], 0).unwrap();
                uncached.deallocate(p, 0).unwrap();
                queue.submit([]);
                settle();
            })
            .ceiling(),
        ];
        let tu = interleave(&mut used, n);
        queue.submit([]);
        peers::wait(device);
        let per = |d: Duration| 1.0 / d.as_secs_f64();
        println!(
            "{:>6} {:>14.0} {:>14.0} {:>14.0} {:>6.2}x | {:>14.0} {:>14.0} {:>14.0} {:>6.2}x",
            human(size),
            per(tb.median[0]),
            per(tb.median[1]),
            per(tb.median[2]),
            tb.ratio().unwrap().0,
            per(tu.median[0]),
            per(tu.median[1]),
            per(tu.median[2]),
            tu.ratio().unwrap().0
        );
    }
}

/// What each of devalloc's per-call checks costs, alone.
fn check_costs(a: &WgpuAllocator) {
    let device = a.device(0).unwrap();
    let p = a.allocate(64, 0, DEFAULT_ALIGNMENT).unwrap();
    let n = 20_000u32;
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        t.elapsed().as_nanos() as f64 / n as f64
    };
    // The pointer lookup is the generic pool's (the same code for every storage): measured on
    // host memory, whose own check is free; check_range on wgpu adds the lost-device poll.
    let host = devalloc::HostAllocator::new();
    let hp = host.allocate(64, 0, DEFAULT_ALIGNMENT).unwrap();
    let lookup = time(&mut || host.check_range(hp, 64, 0).unwrap());
    let checked = time(&mut || a.check_range(p, 64, 0).unwrap());
    let poll = time(&mut || drop(device.poll(wgpu::PollType::Poll)));
    // As devalloc reads a verdict: one poll of the (ready) future with a no-op waker.
    let scope = time(&mut || {
        let v = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut verdict = std::pin::pin!(v.pop());
        let ready = verdict.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
        assert!(matches!(ready, std::task::Poll::Ready(None)));
    });
    println!(
        "\nper-call checks (ns): pointer lookup {lookup:.0}, lost-device poll {poll:.0} (the two: {checked:.0}), one error scope {scope:.0}"
    );
    a.deallocate(p, 0).unwrap();
    host.deallocate(hp, 0).unwrap();
}
