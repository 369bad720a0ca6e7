//! Weights from a file onto the device: devalloc's streamed copy against what a careful user
//! writes today, in one run, interleaved round by round, every result verified.
//!
//! - `read+upload`: the whole file read into memory (`std::fs::read`), then one upload;
//! - `mmap+upload`: the file mapped (`memmap2`), one upload from the map, as candle loads;
//! - `stream`: `devalloc::stream::write_from_reader` from the open file (through its window, or
//!   in place where the allocator fills its memory so: wgpu's staged route).
//!
//! Each upload is devalloc's `copy_host_to_device` (its staged route, which `examples/bench`
//! holds against `queue.write_buffer` and `StagingBelt`), so the methods differ only in how the
//! bytes get from the file to the upload. A method's time runs from opening the file until
//! a read of the last byte returns (every copy done). Its host memory: the heap's peak growth
//! (the counting allocator) and the resident set's peak growth (`VmHWM`, reset before each
//! method through `/proc/self/clear_refs`; a mapped file's pages count as resident). The
//! destination is a fresh allocation each time (caching off), so its first touch is in every
//! method alike. The file is in the page cache (read once before the rounds): the loads a
//! user repeats. Median of the rounds; ratios are stream / the faster peer.
//!
//!     cargo run --release --example stream_bench -- [--backend vulkan|gl|host] [--sizes 64,256,1024] [--rounds 3] [--window-mib 8]

#![allow(unsafe_code)] // memmap2's map is unsafe: the file must not change while mapped (ours)

#[path = "support/heap.rs"]
mod heap;
#[path = "support/logging.rs"]
mod logging;

use std::io::Write;
use std::time::Instant;

use devalloc::stream::{write_from_reader, StreamOptions};
use devalloc::{DeviceAllocator, DevicePtr, PoolOptions, DEFAULT_ALIGNMENT};

#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

type Failure = Box<dyn std::error::Error>;

const METHODS: [&str; 3] = ["read+upload", "mmap+upload", "stream"];

fn open(backend: &str) -> Result<Box<dyn DeviceAllocator>, Failure> {
    let pool = PoolOptions { caching: false, ..Default::default() };
    let wgpu = |b| {
        let options = devalloc::wgpu::WgpuOptions { pool: pool.clone(), ..Default::default() };
        devalloc::wgpu::WgpuAllocator::with_options(b, options)
    };
    Ok(match backend {
        "host" => Box::new(devalloc::HostAllocator::with_options(pool.clone())?),
        "vulkan" => Box::new(wgpu(wgpu::Backend::Vulkan)?),
        "gl" => Box::new(wgpu(wgpu::Backend::Gl)?),
        other => return Err(format!("unknown backend {other:?}: vulkan, gl or host").into()),
    })
}

/// One timed load by `method`; its seconds, heap peak growth and resident peak growth.
fn load(
    alloc: &dyn DeviceAllocator,
    path: &std::path::Path,
    size: usize,
    method: &str,
    window: usize,
) -> Result<(f64, u64, u64, DevicePtr), Failure> {
    let dst = alloc.allocate(size, 0, DEFAULT_ALIGNMENT)?;
    let rss_before = resident_now();
    // Writing 5 resets the peak resident set to the current one (Linux 4.0 and later).
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    heap::reset_peak();
    let heap_before = heap::now();
    let start = Instant::now();
    match method {
        "read+upload" => {
            let data = std::fs::read(path)?;
            alloc.copy_host_to_device(dst, &data, 0)?;
        }
        "mmap+upload" => {
            let file = std::fs::File::open(path)?;
            // SAFETY: the bench wrote the file and nothing changes it while it is mapped.
            let map = unsafe { memmap2::Mmap::map(&file)? };
            alloc.copy_host_to_device(dst, &map, 0)?;
        }
        _ => {
            let mut file = std::fs::File::open(path)?;
            let options = StreamOptions::new().window(window).total(size as u64);
            write_from_reader(alloc, dst, size, 0, &mut file, options)?;
        }
    }
    alloc.copy_device_to_host(&mut [0u8; 1], dst.offset(size - 1)?, 0)?;
    let seconds = start.elapsed().as_secs_f64();
    let heap_peak = (heap::peak() - heap_before) as u64;
    let rss_peak = match (reset, heap::peak_resident(), rss_before) {
        (true, Some(peak), Some(before)) => peak.saturating_sub(before),
        _ => 0,
    };
    Ok((seconds, heap_peak, rss_peak, dst))
}

/// The resident set now (`VmRSS`).
fn resident_now() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// Panics unless the `size` bytes at `dst` are the file's (read back 16 MiB at a time).
fn verify(alloc: &dyn DeviceAllocator, dst: DevicePtr, file: &[u8], what: &str) -> Result<(), Failure> {
    let mut buf = vec![0u8; (16 << 20).min(file.len())];
    for (k, want) in file.chunks(buf.len()).enumerate() {
        let got = &mut buf[..want.len()];
        alloc.copy_device_to_host(got, dst.offset(k * (16 << 20))?, 0)?;
        assert!(got == want, "{what}: the bytes on the device differ from the file in piece {k}");
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Failure> {
    logging::init("warn");
    let (mut backend, mut sizes, mut rounds, mut window) =
        ("vulkan".to_string(), vec![64, 256, 1024], 3, 8usize);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--backend" => backend = value()?,
            "--sizes" => sizes = value()?.split(',').map(str::parse).collect::<Result<_, _>>()?,
            "--rounds" => rounds = value()?.parse()?,
            "--window-mib" => window = value()?.parse()?,
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    let alloc = open(&backend)?;
    let alloc: &dyn DeviceAllocator = &*alloc;
    println!(
        "# streamed weights on {} ({backend}), window {window} MiB, {rounds} rounds, median",
        alloc.device_name(0)
    );
    println!("| size | method | GB/s | heap peak | resident peak |");
    println!("|---|---|---|---|---|");
    for mib in sizes {
        let size = mib << 20;
        let path =
            std::env::temp_dir().join(format!("devalloc-stream-bench-{}-{mib}.bin", std::process::id()));
        let data: Vec<u8> =
            (0..size).map(|i| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes()[7]).collect();
        std::fs::File::create(&path)?.write_all(&data)?;
        let mut results: Vec<Vec<(f64, u64, u64)>> = vec![Vec::new(); METHODS.len()];
        for round in 0..rounds {
            // Interleaved, starting from a different method each round.
            for k in 0..METHODS.len() {
                let m = (k + round) % METHODS.len();
                let (s, heap_peak, rss_peak, dst) = load(alloc, &path, size, METHODS[m], window << 20)?;
                verify(alloc, dst, &data, METHODS[m])?;
                alloc.deallocate(dst, 0)?;
                results[m].push((s, heap_peak, rss_peak));
            }
        }
        std::fs::remove_file(&path)?;
        let mut rates = Vec::new();
        for (m, r) in results.iter().enumerate() {
            let gbps = median(&mut r.iter().map(|x| size as f64 / x.0 / 1e9).collect::<Vec<_>>());
            let heap_peak = r.iter().map(|x| x.1).max().unwrap_or(0);
            let rss_peak = r.iter().map(|x| x.2).max().unwrap_or(0);
            println!(
                "| {mib} MiB | {} | {gbps:.2} | {:.1} MiB | {:.1} MiB |",
                METHODS[m],
                mib_of(heap_peak),
                mib_of(rss_peak)
            );
            rates.push((gbps, heap_peak));
        }
        let (stream, best_peer) = (rates[2], rates[0].0.max(rates[1].0));
        println!(
            "| {mib} MiB | stream / faster peer | {:.2}x | {:.3}x of read+upload's | |",
            stream.0 / best_peer,
            stream.1 as f64 / rates[0].1.max(1) as f64
        );
    }
    Ok(())
}

fn mib_of(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}
