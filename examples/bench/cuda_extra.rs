//! The CUDA bench's steps that run alone in the GPU bundle, each with its own limit:
//!
//! - `--probe`: the library path, the `libcuda` loaded, the driver's version, the devices;
//! - `--pages`: what `src/cuda/policy.rs` assumes (allocations of 2 MiB and more take whole
//!   2 MiB pages and start on a 2 MiB boundary), measured: `cuMemGetInfo`'s free bytes before
//!   and after blocks of 1.1, 2, 2.1 and 3 MiB, and the alignment of their pointers;
//! - `--sweep`: devalloc's staging settings at 256 MiB, at most 8 configurations around the
//!   defaults, one setting changed at a time, that fit the step by construction: every buffer
//!   is allocated once, the bytes each configuration touches are printed, and a configuration
//!   runs only if the host's measured speed says it fits in what is left of `--budget-s`.
#![allow(unsafe_code)] // the driver API, as a CUDA user would call it

use std::cell::RefCell;
use std::time::{Duration, Instant};

use devalloc::cuda::api::driver::{result, sys, CudaContext};
use devalloc::cuda::{CopyTuning, CudaAllocator, CudaOptions};
use devalloc::DeviceAllocator;

use super::{holds, pattern, zero};
use crate::common::{gbps, human, interleave, Method, MIB};

pub fn probe() {
    println!("\n## probe");
    println!("LD_LIBRARY_PATH={}", std::env::var("LD_LIBRARY_PATH").unwrap_or_else(|_| "(unset)".into()));
    match CudaAllocator::new() {
        Ok(a) => {
            let mut version = 0;
            // SAFETY: the driver is loaded (the allocator was made); a plain query.
            let asked = unsafe { sys::cuDriverGetVersion(&mut version) };
            println!("driver API version: {version} ({asked:?})");
            for i in 0..a.device_count() {
                println!("cuda:{i}: {}", a.device_name(i as u32));
            }
        }
        Err(e) => println!("no allocator: {e}"),
    }
    println!("libcuda loaded: {}", devalloc::cuda::loaded_library().unwrap_or_else(|| "(none)".into()));
}

/// `free` bytes as the driver counts them, after waiting for everything (frees are lazy).
fn free_bytes(ctx: &CudaContext) -> u64 {
    ctx.synchronize().expect("sync");
    ctx.mem_get_info().expect("cuMemGetInfo").0 as u64
}

pub fn pages() {
    const BLOCKS: usize = 16;
    println!("\n## pages: does the driver back blocks of >= 2 MiB with whole 2 MiB pages, 2 MiB aligned? ({BLOCKS} blocks each)");
    let ctx = CudaContext::new(0).expect("context");
    println!(
        "{:>9} {:>16} {:>16} {:>13} {:>22}  strides between consecutive pointers",
        "block", "free drop/block", "in 2 MiB pages", "min align", "ptr mod 2 MiB (first 4)"
    );
    for size in [MIB + MIB / 10, 2 * MIB, 2 * MIB + MIB / 10, 3 * MIB] {
        let before = free_bytes(&ctx);
        ctx.bind_to_thread().expect("bind");
        // SAFETY: plain allocations, freed below.
        let ptrs: Vec<u64> =
            (0..BLOCKS).map(|_| unsafe { result::malloc_sync(size) }.expect("cuMemAlloc")).collect();
        let after = free_bytes(&ctx);
        let per = before.saturating_sub(after) / BLOCKS as u64;
        let align = ptrs.iter().map(|p| 1u64 << p.trailing_zeros().min(40)).min().unwrap_or(0);
        let offs: Vec<String> = ptrs.iter().take(4).map(|p| format!("{:#x}", p % (2 << 20))).collect();
        let strides: Vec<String> =
            ptrs.windows(2).take(6).map(|w| human(w[1].abs_diff(w[0]) as usize)).collect();
        println!(
            "{:>9} {:>16} {:>16.2} {:>13} {:>22}  {}",
            format!("{:.1}M", size as f64 / MIB as f64),
            per,
            per as f64 / (2 << 20) as f64,
            human(align as usize),
            offs.join(" "),
            strides.join(" ")
        );
        ctx.bind_to_thread().expect("bind");
        for p in ptrs {
            // SAFETY: allocated above, freed once.
            unsafe { result::free_sync(p) }.expect("cuMemFree");
        }
    }
    println!(
        "(policy.rs assumes: from 2 MiB, free drop/block = the size rounded up to 2 MiB, min align >= 2M)"
    );
}

/// The configurations: the defaults, then one setting changed at a time.
fn configs(base: &CopyTuning) -> Vec<(&'static str, CopyTuning)> {
    let with = |f: &dyn Fn(&mut CopyTuning)| {
        let mut t = base.clone();
        f(&mut t);
        t
    };
    vec![
        ("defaults", base.clone()),
        ("write-combined off", with(&|t| t.write_combined = false)),
        ("chunk 2 MiB", with(&|t| t.chunk = 2 * MIB)),
        ("chunk 8 MiB", with(&|t| t.chunk = 8 * MIB)),
        ("chunk 16 MiB, 4 buf", with(&|t| (t.chunk, t.buffers) = (16 * MIB, 4))),
        ("3 buffers", with(&|t| t.buffers = 3)),
        ("2 threads", with(&|t| t.threads = 2)),
        ("8 threads, 10 buf", with(&|t| (t.threads, t.buffers) = (8, 10))),
    ]
}

pub fn sweep(quick: bool, budget: Duration) {
    let start = Instant::now();
    let size = if quick { 64 * MIB } else { 256 * MIB };
    let calls = 3usize; // one cold call and two timed ones, per direction
                        // Host bytes each configuration touches: per upload 2x (devalloc reads the source and
                        // writes its pinned buffers) + the check (the driver's download, 2x, and a compare, 2x);
                        // per download 2x (devalloc) + clearing 1x + the compare 2x.
    let per_config = (calls * (6 + 5) * size) as u64;
    let base = CopyTuning { pinned_threshold: MIB, ..CopyTuning::from_env() };
    let configs = configs(&base);
    println!(
        "\n## sweep: devalloc upload/download GB/s at {} by staging setting (cuda:0); {} configurations, \
         {calls} calls per direction each, {:.1} GiB of host memory touched per configuration; budget {:?}",
        human(size),
        configs.len(),
        per_config as f64 / (1u64 << 30) as f64,
        budget
    );
    // Every buffer once, before the loop.
    let data = pattern(size);
    let back = RefCell::new(vec![0u8; size]);
    let check = RefCell::new(vec![0u8; size]);
    // The host's speed here, to see what fits: one pass over the buffers just made.
    let t = Instant::now();
    back.borrow_mut().copy_from_slice(&data);
    let host_gbps = gbps(2 * size, t.elapsed()).max(0.1);
    let estimate = Duration::from_secs_f64(per_config as f64 / (host_gbps * 1e9));
    println!("host memcpy: {host_gbps:.1} GB/s (2x counted): about {estimate:.1?} a configuration");
    let ctx = CudaContext::new(0).expect("context");
    let stream = ctx.new_stream().expect("stream");
    println!(
        "{:>20} {:>7} {:>6} {:>7} {:>3} {:>8} {:>8} {:>8}",
        "configuration", "chunk", "bufs", "threads", "wc", "up", "down", "took"
    );
    let mut slowest = estimate;
    for (name, copies) in configs {
        let left = budget.saturating_sub(start.elapsed());
        if slowest + slowest / 2 > left {
            println!("{name:>20}: NOT RUN: {left:.1?} left of the budget, a configuration takes about {slowest:.1?}");
            continue;
        }
        let t0 = Instant::now();
        let a = CudaAllocator::with_options(CudaOptions { copies: copies.clone(), ..CudaOptions::default() })
            .unwrap_or_else(|e| panic!("the sweep's allocator ({name}): {e}"));
        let p = a.allocate(size, 0, 256).unwrap();
        let mut up = vec![Method::new("devalloc", || a.copy_host_to_device(p, &data, 0).unwrap())
            .ours()
            .prepare(|| zero(&stream, p.addr(), size))
            .verify(|| holds(&ctx, &mut check.borrow_mut(), p.addr(), &data))];
        let tu = interleave(&mut up, calls - 1);
        let mut down =
            vec![Method::new("devalloc", || a.copy_device_to_host(&mut back.borrow_mut(), p, 0).unwrap())
                .ours()
                .prepare(|| back.borrow_mut().fill(0))
                .verify(|| *back.borrow() == data)];
        let td = interleave(&mut down, calls - 1);
        drop((up, down));
        a.deallocate(p, 0).unwrap();
        drop(a);
        let took = t0.elapsed();
        slowest = slowest.max(took);
        println!(
            "{name:>20} {:>7} {:>6} {:>7} {:>3} {:>8.2} {:>8.2} {:>7.1?}",
            human(copies.chunk),
            copies.buffers,
            copies.threads,
            if copies.write_combined { "on" } else { "off" },
            gbps(size, tu.median[0]),
            gbps(size, td.median[0]),
            took
        );
    }
    println!("sweep took {:.1?} of {budget:?}", start.elapsed());
}
