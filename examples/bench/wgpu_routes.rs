//! The wgpu half of the benchmark: staged and direct routes against their peers.
use std::cell::RefCell;
use std::hint::black_box;

use devalloc::wgpu::{Route, WgpuAllocator, WgpuOptions};
use devalloc::{DeviceAllocator, DevicePtr, DEFAULT_ALIGNMENT};

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
