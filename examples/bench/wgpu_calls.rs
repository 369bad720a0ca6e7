//! The wgpu half of the benchmark, per call: 4-byte read latency, allocation cycles and the
//! cost of devalloc's checks. Every copy is verified: each 4-byte read into a cleared
//! destination, each first-use write read back before its buffer goes.
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::time::{Duration, Instant};

use devalloc::wgpu::{WgpuAllocator, WgpuOptions};
use devalloc::{DeviceAllocator, DevicePtr, PoolOptions, DEFAULT_ALIGNMENT};

use crate::common::{human, interleave, reps, untimed, Method, KIB, MIB};
use crate::goals::{self, Bound};
use crate::peers;

pub fn latency(staged: &WgpuAllocator, direct: Option<&WgpuAllocator>, quick: bool) {
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
    let vs_reused = t.of("devalloc staged").as_secs_f64() / t.of("reused MAP_READ").as_secs_f64();
    goals::hold(
        "latency",
        format!("{} 4-byte download time vs reused MAP_READ", staged.device_type()),
        vs_reused,
        Bound::AtMost(1.05),
    );
    staged.deallocate(ours, 0).unwrap();
    if let Some((d, _, _, p)) = direct_bits {
        d.deallocate(p, 0).unwrap();
    }
}

pub fn alloc_cycle(a: &WgpuAllocator, quick: bool) {
    let (device, queue) = (a.device(0).unwrap(), a.queue(0).unwrap());
    let uncached = WgpuAllocator::from_device_with_options(
        device.clone(),
        queue.clone(),
        // Caching off: PoolOptions::default() caches (this column measured a second cache).
        WgpuOptions {
            pool: PoolOptions { caching: false, ..PoolOptions::default() },
            route: Some(a.route(0).unwrap()),
            ..Default::default()
        },
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
        // Each first use is a 4-byte write, read back before the free (untimed: the readback
        // waits for the device, so the write's own work is done there, for every method alike).
        // Each call writes other bytes than the last, so a write that did nothing fails.
        let (stamp, bad) = (Cell::new(0u8), Cell::new(0usize));
        let next = || {
            stamp.set(stamp.get().wrapping_add(1));
            [stamp.get(), 2, 3, 4]
        };
        let check = |got: [u8; 4]| bad.set(bad.get() + usize::from(got != [stamp.get(), 2, 3, 4]));
        let ours_holds = |x: &WgpuAllocator, p: DevicePtr| {
            untimed(|| {
                let mut got = [0u8; 4];
                x.copy_device_to_host(&mut got, p, 0).unwrap();
                check(got);
            })
        };
        let mut used = vec![
            Method::new("create+write", || {
                let b = peers::buffer(device, size, usage);
                queue.write_buffer(&b, 0, &next());
                untimed(|| {
                    let mut got = [0u8; 4];
                    peers::fresh_download(device, queue, &b, &mut got);
                    check(got);
                });
                drop(b);
                queue.submit([]);
                settle();
            })
            .verify(|| bad.get() == 0),
            Method::new("devalloc", || {
                let p = a.allocate(size, 0, DEFAULT_ALIGNMENT).unwrap();
                a.copy_host_to_device(p, &next(), 0).unwrap();
                ours_holds(a, p);
                a.deallocate(p, 0).unwrap();
                queue.submit([]);
                settle();
            })
            .ours()
            .verify(|| bad.get() == 0),
            Method::new("no cache", || {
                let p = uncached.allocate(size, 0, DEFAULT_ALIGNMENT).unwrap();
                uncached.copy_host_to_device(p, &next(), 0).unwrap();
                ours_holds(&uncached, p);
                uncached.deallocate(p, 0).unwrap();
                queue.submit([]);
                settle();
            })
            .ceiling()
            .verify(|| bad.get() == 0),
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
        // Cached allocate + free against create_buffer + drop (as time: > 1 is slower).
        let vs_create = tb.of("devalloc").as_secs_f64() / tb.of("create_buffer").as_secs_f64();
        goals::hold(
            "alloc",
            format!("{} allocate+free {} time vs create_buffer+drop", a.device_type(), human(size)),
            vs_create,
            Bound::AtMost(1.0),
        );
    }
}

/// What each of devalloc's per-call checks costs, alone.
pub fn check_costs(a: &WgpuAllocator) {
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
