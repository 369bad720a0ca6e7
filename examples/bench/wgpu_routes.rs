//! The wgpu half of the benchmark: staged and direct routes against their peers. Every copy
//! is verified, untimed: each upload read back (alternating two data sets, so an upload that
//! did nothing fails), each download compared after its destination was cleared.
use std::cell::RefCell;
use std::hint::black_box;

use devalloc::wgpu::{Route, WgpuAllocator, WgpuOptions};
use devalloc::{DeviceAllocator, DevicePtr, DEFAULT_ALIGNMENT};

use crate::common::{cold_row, header, human, interleave, reps, row, Alternate, Method, KIB, MIB};
use crate::goals::{self, Bound};
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

/// Whether devalloc's memory at `p` holds `want`, read straight from its wgpu buffer, not
/// through devalloc's staging (a download through it between uploads would change what they
/// meet).
fn holds_raw(a: &WgpuAllocator, readback: &peers::Readback, p: DevicePtr, want: &[u8]) -> bool {
    let (device, queue) = (a.device(0).unwrap(), a.queue(0).unwrap());
    let range = a.buffer(p, 0).expect("devalloc's buffer");
    readback.holds(device, queue, &range.buffer, range.range.start, want)
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
    crate::wgpu_calls::latency(&staged, direct.as_ref(), quick);
    crate::wgpu_calls::alloc_cycle(&staged, quick);
    crate::wgpu_calls::check_costs(&staged);
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
        // Each call sends the other of two data sets, and every call is read back (untimed):
        // an upload that did nothing leaves the other data, and fails.
        let data = [pattern(size, 1), pattern(size, 2)];
        let turns: [Alternate; 5] = Default::default();
        let pb = peers::storage(device, size);
        let bb = peers::storage(device, size);
        let cb = peers::storage(device, size);
        let ours = a.allocate(size, 0, DEFAULT_ALIGNMENT).unwrap();
        let sink = RefCell::new(vec![0u8; size]);
        let mut belt = peers::Belt::new(device, size);
        let mut pieces = peers::Belt::pieces(device, size, 4 * MIB);
        let readback = peers::Readback::new(device, size);
        let sent = |k: usize| &data[turns[k].last()];
        let mut methods = vec![
            Method::new("memcpy", || sink.borrow_mut().copy_from_slice(black_box(&data[turns[0].next()])))
                .ceiling()
                .verify(|| *sink.borrow() == *sent(0)),
            Method::new("write_buffer", || peers::write_buffer(device, queue, &pb, &data[turns[1].next()]))
                .verify(|| readback.holds(device, queue, &pb, 0, sent(1))),
            Method::new("StagingBelt", || belt.upload(device, queue, &bb, &data[turns[2].next()]))
                .verify(|| readback.holds(device, queue, &bb, 0, sent(2))),
            Method::new("StagingBelt/4M", || pieces.upload(device, queue, &cb, &data[turns[4].next()]))
                .verify(|| readback.holds(device, queue, &cb, 0, sent(4))),
            Method::new("devalloc", || {
                a.copy_host_to_device(ours, &data[turns[3].next()], 0).unwrap();
                a.synchronize(0).unwrap();
            })
            .ours()
            .verify(|| holds_raw(a, &readback, ours, sent(3))),
        ];
        let t = interleave(&mut methods, reps(size, quick));
        drop(methods);
        if first {
            println!("{}", header(&t));
            first = false;
        }
        println!("{}", row(size, &t));
        if size == MIB {
            println!("{}", cold_row(size, &t));
        }
        let (r, peer) = t.ratio().unwrap();
        goals::hold(
            "upload",
            format!("{} staged upload {} vs {peer}", a.device_type(), human(size)),
            r,
            Bound::AtLeast(0.95),
        );
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
            Method::new("memcpy", move || dsts[0].borrow_mut().copy_from_slice(black_box(data)))
                .ceiling()
                .prepare(clear(0))
                .verify(ok(0)),
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
        let (r, peer) = t.ratio().unwrap();
        goals::hold(
            "download",
            format!("{} staged download {} vs {peer}", a.device_type(), human(size)),
            r,
            Bound::AtLeast(0.95),
        );
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
        // Two data sets, alternating; every upload read back (untimed), as for the staged route.
        let updata = [pattern(size, 5), pattern(size, 6)];
        let turns: [Alternate; 3] = Default::default();
        let hand = peers::mappable(device, size);
        let ours = a.allocate(size, 0, DEFAULT_ALIGNMENT).unwrap();
        let sink = RefCell::new(vec![0u8; size]);
        let sent = |k: usize| &updata[turns[k].last()];
        // Checked on the host alone, as the route itself works: the hand-mapped buffer mapped
        // and compared in place, devalloc's read back through its direct route into a vector
        // made once.
        let scratch = RefCell::new(vec![0u8; size]);
        let ours_holds = |want: &[u8]| {
            let mut got = scratch.borrow_mut();
            a.copy_device_to_host(&mut got, ours, 0).expect("readback");
            *got == *want
        };
        let mut up = vec![
            Method::new("memcpy", || sink.borrow_mut().copy_from_slice(black_box(&updata[turns[0].next()])))
                .ceiling()
                .verify(|| *sink.borrow() == *sent(0)),
            Method::new("hand map", || peers::map_write(device, &hand, &updata[turns[1].next()]))
                .verify(|| peers::map_holds(device, &hand, sent(1))),
            Method::new("devalloc", || a.copy_host_to_device(ours, &updata[turns[2].next()], 0).unwrap())
                .ours()
                .verify(|| ours_holds(sent(2))),
        ];
        let tu = interleave(&mut up, reps(size, quick));
        drop(up);
        // The downloads read what the last upload left.
        let data = sent(2).clone();
        peers::map_write(device, &hand, &data);
        let dsts: Vec<RefCell<Vec<u8>>> = (0..3).map(|_| RefCell::new(vec![0u8; size])).collect();
        let (dsts, datar) = (&dsts, &data);
        let clear = |k: usize| move || dsts[k].borrow_mut()[..].fill(0);
        let ok = |k: usize| move || *dsts[k].borrow() == *datar;
        let mut down = vec![
            Method::new("memcpy", move || dsts[0].borrow_mut().copy_from_slice(black_box(datar)))
                .ceiling()
                .prepare(clear(0))
                .verify(ok(0)),
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
