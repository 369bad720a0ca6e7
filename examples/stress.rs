//! A multi-threaded random-operation stress with content checks: every thread allocates,
//! writes (whole and ragged ranges), reads back (whole and sub-ranges), copies between its
//! buffers, synchronizes and frees at random, through both the blocking and the async calls,
//! and checks every byte it reads against its own model of the memory. One run per process;
//! `scripts/stress` runs it N times per backend and prints `K/N failed`.
//!
//!     cargo run --release --example stress -- host|vulkan|vulkan-direct|gl [--threads 16] [--ops 5000] [--seed S]
//!
//! Prints one line scripts can read, `stress: backend=B threads=T ops=N seed=S result=ok|failed`,
//! and exits non-zero when any thread saw an error, a wrong byte or a panic.
#[path = "support/logging.rs"]
mod logging;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use devalloc::{DeviceAllocator, DevicePtr, HostAllocator};

/// xorshift64*: a small deterministic generator per thread.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed | 1);
    (0..len).map(|_| r.next() as u8).collect()
}

struct Args {
    backend: String,
    threads: usize,
    ops: usize,
    seed: u64,
}

fn parse() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut out = Args { backend: String::new(), threads: 16, ops: 5000, seed: 0 };
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--threads" => {
                out.threads = value("--threads")?.parse().map_err(|e| format!("--threads: {e}"))?
            }
            "--ops" => out.ops = value("--ops")?.parse().map_err(|e| format!("--ops: {e}"))?,
            "--seed" => out.seed = value("--seed")?.parse().map_err(|e| format!("--seed: {e}"))?,
            b if !b.starts_with('-') && out.backend.is_empty() => out.backend = b.to_string(),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if out.backend.is_empty() {
        return Err("name a backend: host, vulkan, vulkan-direct or gl".into());
    }
    Ok(out)
}

fn open(backend: &str) -> Result<Box<dyn DeviceAllocator>, String> {
    use devalloc::wgpu::{Route, WgpuAllocator, WgpuOptions};
    let (wgpu_backend, route) = match backend {
        "host" => return Ok(Box::new(HostAllocator::new())),
        "vulkan" => (wgpu::Backend::Vulkan, Route::Staged),
        "vulkan-direct" => (wgpu::Backend::Vulkan, Route::Direct),
        "gl" => (wgpu::Backend::Gl, Route::Staged),
        other => return Err(format!("unknown backend {other}")),
    };
    let options = WgpuOptions { route: Some(route), ..WgpuOptions::default() };
    WgpuAllocator::with_options(wgpu_backend, options).map(|a| Box::new(a) as _).map_err(|e| e.to_string())
}

/// What a thread holds: each buffer's address and the bytes it must contain.
type Held = Vec<(DevicePtr, Vec<u8>)>;

/// One thread's run; `Err` names the first thing that went wrong.
fn run_thread(
    a: &dyn DeviceAllocator,
    t: u64,
    args: &Args,
    stop: &AtomicBool,
    done: &AtomicU64,
) -> Result<(), String> {
    let mut rng = Rng(args.seed.wrapping_add(1).wrapping_mul(0x9e37_79b9) ^ ((t + 1) * 0x5851_f42d));
    let mut mine: Held = Vec::new();
    let wgpu = a.device_type() != devalloc::DeviceType::Cpu;
    for step in 0..args.ops {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let asynchronous = rng.below(2) == 0;
        let op = rng.below(10);
        let what = |name: &str| {
            format!("thread {t} step {step}: {name} ({})", if asynchronous { "async" } else { "blocking" })
        };
        match op {
            0 | 1 if mine.len() < 8 => {
                let big = rng.below(16) == 0;
                let size = 1 + rng.below(if big { 9 << 20 } else { 70_000 });
                let p = a
                    .allocate(size, 0, 1 << rng.below(12))
                    .map_err(|e| format!("{}: {e}", what("allocate")))?;
                let data = pattern(size, t << 32 | step as u64);
                write(a, p, &data, asynchronous).map_err(|e| format!("{}: {e}", what("write")))?;
                mine.push((p, data));
            }
            2 if !mine.is_empty() => {
                let (p, data) = mine.swap_remove(rng.below(mine.len()));
                let back =
                    read(a, p, data.len(), asynchronous).map_err(|e| format!("{}: {e}", what("read")))?;
                if back != data {
                    return Err(what("contents changed before free"));
                }
                a.deallocate(p, 0).map_err(|e| format!("{}: {e}", what("free")))?;
            }
            3 | 4 if !mine.is_empty() => {
                let k = rng.below(mine.len());
                let (p, data) = &mut mine[k];
                let off = rng.below(data.len());
                let len = 1 + rng.below((data.len() - off).min(1 << 16));
                let bytes = pattern(len, step as u64 ^ t);
                let at = p.offset(off).map_err(|e| e.to_string())?;
                write(a, at, &bytes, asynchronous).map_err(|e| format!("{}: {e}", what("ragged write")))?;
                data[off..off + len].copy_from_slice(&bytes);
            }
            5 if mine.len() >= 2 => {
                let (x, y) = (rng.below(mine.len()), rng.below(mine.len()));
                if x != y {
                    let n = mine[x].1.len().min(mine[y].1.len());
                    let (src, dst) = (mine[x].0, mine[y].0);
                    copy(a, dst, src, n, asynchronous)
                        .map_err(|e| format!("{}: {e}", what("device-to-device copy")))?;
                    let from = mine[x].1[..n].to_vec();
                    mine[y].1[..n].copy_from_slice(&from);
                }
            }
            6 if wgpu && rng.below(8) == 0 => {
                synchronize(a, asynchronous).map_err(|e| format!("{}: {e}", what("synchronize")))?;
            }
            _ if !mine.is_empty() => {
                let (p, data) = &mine[rng.below(mine.len())];
                let off = rng.below(data.len());
                let len = 1 + rng.below(data.len() - off);
                let at = p.offset(off).map_err(|e| e.to_string())?;
                let back = read(a, at, len, asynchronous).map_err(|e| format!("{}: {e}", what("read")))?;
                if back != data[off..off + len] {
                    return Err(what(&format!("a read of {len} bytes at {off} differs")));
                }
            }
            _ => {}
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
    for (p, data) in mine {
        let back = read(a, p, data.len(), false).map_err(|e| format!("thread {t} at the end: read: {e}"))?;
        if back != data {
            return Err(format!("thread {t} at the end: contents changed"));
        }
        a.deallocate(p, 0).map_err(|e| format!("thread {t} at the end: free: {e}"))?;
    }
    Ok(())
}

fn write(a: &dyn DeviceAllocator, p: DevicePtr, data: &[u8], asynchronous: bool) -> devalloc::Result<()> {
    if asynchronous {
        pollster::block_on(a.copy_host_to_device_async(p, data, 0))
    } else {
        a.copy_host_to_device(p, data, 0)
    }
}

fn read(a: &dyn DeviceAllocator, p: DevicePtr, len: usize, asynchronous: bool) -> devalloc::Result<Vec<u8>> {
    let mut back = vec![0u8; len];
    if asynchronous {
        pollster::block_on(a.copy_device_to_host_async(&mut back, p, 0))?;
    } else {
        a.copy_device_to_host(&mut back, p, 0)?;
    }
    Ok(back)
}

fn copy(
    a: &dyn DeviceAllocator,
    dst: DevicePtr,
    src: DevicePtr,
    n: usize,
    asynchronous: bool,
) -> devalloc::Result<()> {
    if asynchronous {
        pollster::block_on(a.copy_device_to_device_async(dst, 0, src, 0, n))
    } else {
        a.copy_device_to_device(dst, 0, src, 0, n)
    }
}

fn synchronize(a: &dyn DeviceAllocator, asynchronous: bool) -> devalloc::Result<()> {
    let Some(w) = a.as_any().and_then(|x| x.downcast_ref::<devalloc::wgpu::WgpuAllocator>()) else {
        return Ok(());
    };
    if asynchronous {
        pollster::block_on(w.synchronize_async(0))
    } else {
        w.synchronize(0)
    }
}

fn main() {
    logging::init("warn");
    let args = parse().unwrap_or_else(|e| {
        eprintln!("stress: {e}");
        std::process::exit(2)
    });
    let alloc = match open(&args.backend) {
        Ok(a) => a,
        Err(e) => {
            println!("stress: backend={} result=unavailable: {e}", args.backend);
            std::process::exit(3)
        }
    };
    let started = Instant::now();
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..args.threads as u64)
            .map(|t| {
                let (a, args, stop, done) = (&*alloc, &args, &stop, &done);
                s.spawn(move || {
                    let r = run_thread(a, t, args, stop, done);
                    if r.is_err() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| match h.join() {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(_) => Some("a thread panicked".into()),
            })
            .collect()
    });
    let stats = alloc.stats(0).map(|s| format!("{} allocations, {} cache hits", s.allocations, s.cache_hits));
    for f in &failures {
        println!("  {f}");
    }
    println!(
        "  {} operations in {:.1} s; {}",
        done.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64(),
        stats.unwrap_or_else(|e| e.to_string())
    );
    let result = if failures.is_empty() { "ok" } else { "failed" };
    println!(
        "stress: backend={} threads={} ops={} seed={} result={result}",
        args.backend, args.threads, args.ops, args.seed
    );
    if !failures.is_empty() {
        std::process::exit(1);
    }
}
