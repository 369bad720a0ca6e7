//! The CUDA part of the benchmark (feature `cuda`; also the CUDA-only `cuda_bench` example that
//! the GPU bundle carries): devalloc against what a CUDA user would otherwise write, in one run,
//! interleaved, every result verified.
//!
//! - upload / download (4 KiB .. 256 MiB): cudarc's copy from pageable memory (the plain way)
//!   and from a pinned buffer of the whole size (the ceiling: what the link can do), against
//!   devalloc from pageable memory (its API) and from pinned memory (copied straight);
//! - where staging wins: devalloc staged against the driver's own pageable copy, 1-16 MiB;
//! - the alloc cycle: `cuMemAlloc` + `cuMemFree` against devalloc's cache;
//! - `--sweep`, `--pages`, `--probe`: see `cuda_extra.rs`.
//!
//! Every buffer is allocated once, before the timed loops (first touch of host memory is slow
//! on sandboxed machines). PyTorch, the peer a CUDA user would pick, is measured beside it by
//! the bundle's `torch_peer.py`.
#![allow(unsafe_code)] // cudarc's raw API: the peers a CUDA user would write by hand
use std::cell::RefCell;
use std::hint::black_box;

use devalloc::cuda::api::driver::{result, sys, CudaContext, CudaStream};
use devalloc::cuda::{CopyTuning, CudaAllocator, CudaOptions};
use devalloc::{DeviceAllocator, DeviceIndex, DevicePtr, DEFAULT_ALIGNMENT};

use crate::common::{header, human, interleave, reps, row, Method, KIB, MIB};

#[path = "cuda_extra.rs"]
mod extra;

/// What the command line asked for.
pub struct Asked {
    pub quick: bool,
    /// The staging sweep (alone: its own step in the bundle).
    pub sweep: bool,
    /// The 2 MiB page measurement (alone).
    pub pages: bool,
    /// Driver and library facts (alone).
    pub probe: bool,
    /// Seconds the sweep may take (`--budget-s N`).
    pub budget_s: u64,
}

impl Asked {
    pub fn from_args(args: &[String]) -> Self {
        let has = |a: &str| args.iter().any(|x| x == a);
        let budget_s = args
            .iter()
            .position(|a| a == "--budget-s")
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(40);
        Asked {
            quick: has("--quick"),
            sweep: has("--sweep"),
            pages: has("--pages"),
            probe: has("--probe"),
            budget_s,
        }
    }
}

fn require_all() -> bool {
    std::env::var("DEVALLOC_REQUIRE_ALL").is_ok_and(|v| v == "1")
}

pub fn run(asked: &Asked) {
    if asked.probe {
        extra::probe();
    }
    let alloc = match CudaAllocator::new() {
        Ok(a) => a,
        Err(e) => {
            println!("\n## cuda: not run: {e}");
            if require_all() {
                eprintln!("error: DEVALLOC_REQUIRE_ALL=1 and there is no CUDA device");
                std::process::exit(1);
            }
            return;
        }
    };
    println!("\nlibcuda: {}", devalloc::cuda::loaded_library().unwrap_or_else(|| "(path unknown)".into()));
    if asked.probe {
        return;
    }
    if asked.pages {
        extra::pages();
        return;
    }
    if asked.sweep {
        extra::sweep(asked.quick, std::time::Duration::from_secs(asked.budget_s));
        return;
    }
    for index in 0..alloc.device_count() as DeviceIndex {
        device(&alloc, index, asked.quick);
    }
}

/// Device memory of the peers' own, freed on drop.
pub(crate) struct Raw(pub sys::CUdeviceptr);

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: allocated by `malloc_sync` below and freed once.
        unsafe { result::free_sync(self.0) }.expect("free");
    }
}

pub(crate) fn raw(ctx: &CudaContext, n: usize) -> Raw {
    ctx.bind_to_thread().expect("bind");
    // SAFETY: a plain allocation, freed by `Raw`'s drop.
    Raw(unsafe { result::malloc_sync(n) }.expect("cuMemAlloc"))
}

/// Zeroes `size` bytes at `addr` and waits: on the bench's stream and synchronised, so that
/// no memset is still running when a copy on another stream (devalloc's) lands there.
pub(crate) fn zero(stream: &CudaStream, addr: sys::CUdeviceptr, size: usize) {
    stream.context().bind_to_thread().expect("bind");
    // SAFETY: `addr` holds at least `size` bytes; the stream is synchronised before return.
    unsafe { result::memset_d8_async(addr, 0, size, stream.cu_stream()) }.expect("cuMemsetD8Async");
    stream.synchronize().expect("sync");
}

/// Whether `size` bytes at `addr` equal `want` (read back through the driver, untimed).
pub(crate) fn holds(ctx: &CudaContext, check: &mut [u8], addr: sys::CUdeviceptr, want: &[u8]) -> bool {
    ctx.bind_to_thread().expect("bind");
    // SAFETY: `addr` holds at least `check.len()` bytes; the copy is synchronous.
    unsafe { result::memcpy_dtoh_sync(check, addr) }.expect("cuMemcpyDtoH");
    check == want
}

fn sizes(quick: bool) -> Vec<usize> {
    if quick {
        vec![4 * KIB, MIB, 64 * MIB]
    } else {
        vec![4 * KIB, 64 * KIB, MIB, 8 * MIB, 64 * MIB, 256 * MIB]
    }
}

pub(crate) fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(13) ^ (i >> 16) as u8).collect()
}

/// The buffers of one device's tables, allocated once at the largest size.
struct Buffers {
    data: Vec<u8>,
    outs: [RefCell<Vec<u8>>; 3],
    check: RefCell<Vec<u8>>,
    dev: Raw,
    pinned: RefCell<devalloc::cuda::api::driver::PinnedHostSlice<u8>>,
    p: DevicePtr,
}

fn device(a: &CudaAllocator, index: DeviceIndex, quick: bool) {
    println!("\n## cuda:{index}: {}", a.device_name(index));
    let ctx = CudaContext::new(index as usize).expect("context");
    let stream = ctx.new_stream().expect("stream");
    // The short tables first: if the step runs out of time, only the largest rows are lost.
    alloc_cycle(a, index, &ctx, &stream, quick);
    threshold(index, &ctx, &stream, quick);
    let max = *sizes(quick).last().unwrap();
    let data = pattern(max);
    // SAFETY: the pinned buffer is written before it is read.
    let mut pinned = unsafe { ctx.alloc_pinned_with_flags::<u8>(max, 0) }.expect("pinned");
    pinned.as_mut_slice().unwrap().copy_from_slice(&data);
    let b = Buffers {
        outs: [0, 1, 2].map(|_| RefCell::new(vec![0u8; max])),
        check: RefCell::new(vec![0u8; max]),
        dev: raw(&ctx, max),
        pinned: RefCell::new(pinned),
        p: a.allocate(max, index, DEFAULT_ALIGNMENT).unwrap(),
        data,
    };
    for upload in [true, false] {
        println!(
            "\n{} GB/s (interleaved medians; pinned is the ceiling; devalloc takes pageable memory, \
             `dv pinned` is devalloc given pinned memory)",
            if upload { "upload" } else { "download" }
        );
        let mut first = true;
        for size in sizes(quick) {
            let t = if upload {
                uploads(a, index, &ctx, &stream, &b, size, quick)
            } else {
                downloads(a, index, &stream, &b, size, quick)
            };
            if first {
                println!("{}   devalloc/pinned", header(&t));
                first = false;
            }
            let vs_pinned = t.median[0].as_secs_f64() / t.median[2].as_secs_f64();
            println!("{}   {vs_pinned:.2}x", row(size, &t));
        }
    }
    a.deallocate(b.p, index).unwrap();
}

fn uploads(
    a: &CudaAllocator,
    index: DeviceIndex,
    ctx: &CudaContext,
    stream: &CudaStream,
    b: &Buffers,
    size: usize,
    quick: bool,
) -> crate::common::Timings {
    let data = &b.data[..size];
    let (dev, p) = (b.dev.0, b.p);
    // Every upload lands on zeroed memory and is read back, untimed: a figure for an upload
    // that did not happen is no figure. (devalloc's addresses are the driver's own.)
    let verify = |addr| move || holds(ctx, &mut b.check.borrow_mut()[..size], addr, data);
    let mut methods = vec![
        Method::new("pinned", || {
            let pinned = b.pinned.borrow();
            // SAFETY: in bounds; pinned source; synchronised before return.
            unsafe {
                result::memcpy_htod_async(dev, &pinned.as_slice().unwrap()[..size], stream.cu_stream())
            }
            .unwrap();
            stream.synchronize().unwrap();
        })
        .ceiling()
        .prepare(|| zero(stream, dev, size))
        .verify(verify(dev)),
        Method::new("pageable", || {
            // SAFETY: in bounds; synchronised before return.
            unsafe { result::memcpy_htod_async(dev, black_box(data), stream.cu_stream()) }.unwrap();
            stream.synchronize().unwrap();
        })
        .prepare(|| zero(stream, dev, size))
        .verify(verify(dev)),
        Method::new("devalloc", || a.copy_host_to_device(p, black_box(data), index).unwrap())
            .ours()
            .prepare(|| zero(stream, p.addr(), size))
            .verify(verify(p.addr())),
        Method::new("dv pinned", || {
            let pinned = b.pinned.borrow();
            a.copy_host_to_device(p, &pinned.as_slice().unwrap()[..size], index).unwrap()
        })
        .ceiling()
        .prepare(|| zero(stream, p.addr(), size))
        .verify(verify(p.addr())),
    ];
    interleave(&mut methods, reps(size, quick))
}

fn downloads(
    a: &CudaAllocator,
    index: DeviceIndex,
    stream: &CudaStream,
    b: &Buffers,
    size: usize,
    quick: bool,
) -> crate::common::Timings {
    let data = &b.data[..size];
    let (dev, p) = (b.dev.0, b.p);
    // The sources hold the data; each destination is cleared before and checked after.
    stream.context().bind_to_thread().unwrap();
    // SAFETY: both hold at least `size` bytes; synchronous copies.
    unsafe { result::memcpy_htod_sync(dev, data) }.unwrap();
    a.copy_host_to_device(p, data, index).unwrap();
    let clear = |k: usize| move || b.outs[k].borrow_mut()[..size].fill(0);
    let ok = |k: usize| move || b.outs[k].borrow()[..size] == *data;
    let clear_pinned = || b.pinned.borrow_mut().as_mut_slice().unwrap()[..size].fill(0);
    let pinned_ok = || b.pinned.borrow().as_slice().unwrap()[..size] == *data;
    let mut methods = vec![
        Method::new("pinned", || {
            let mut pinned = b.pinned.borrow_mut();
            let into = &mut pinned.as_mut_slice().unwrap()[..size];
            // SAFETY: in bounds; pinned destination read after the synchronise.
            unsafe { result::memcpy_dtoh_async(into, dev, stream.cu_stream()) }.unwrap();
            stream.synchronize().unwrap();
        })
        .ceiling()
        .prepare(clear_pinned)
        .verify(pinned_ok),
        Method::new("pageable", || {
            let mut out = b.outs[1].borrow_mut();
            // SAFETY: in bounds; read after the synchronise.
            unsafe { result::memcpy_dtoh_async(&mut out[..size], dev, stream.cu_stream()) }.unwrap();
            stream.synchronize().unwrap();
        })
        .prepare(clear(1))
        .verify(ok(1)),
        Method::new("devalloc", || {
            a.copy_device_to_host(&mut b.outs[2].borrow_mut()[..size], p, index).unwrap()
        })
        .ours()
        .prepare(clear(2))
        .verify(ok(2)),
        Method::new("dv pinned", || {
            let mut pinned = b.pinned.borrow_mut();
            a.copy_device_to_host(&mut pinned.as_mut_slice().unwrap()[..size], p, index).unwrap()
        })
        .ceiling()
        .prepare(clear_pinned)
        .verify(pinned_ok),
    ];
    interleave(&mut methods, reps(size, quick))
}

/// Where staging wins: devalloc with every copy staged against devalloc with none (the
/// driver's own copy from pageable memory), at the sizes around the threshold. Every upload
/// lands on zeroed memory and is read back, untimed; every download is compared.
fn threshold(index: DeviceIndex, ctx: &CudaContext, stream: &CudaStream, quick: bool) {
    let sizes: &[usize] = if quick { &[MIB, 4 * MIB] } else { &[MIB, 2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB] };
    let max = *sizes.last().unwrap();
    let base = CopyTuning::default();
    let make = |threshold| {
        let copies = CopyTuning { pinned_threshold: threshold, ..base.clone() };
        CudaAllocator::with_options(CudaOptions { copies, ..CudaOptions::default() }).expect("allocator")
    };
    let (staged, direct) = (make(1), make(usize::MAX));
    println!(
        "\nwhere staging wins (GB/s; staged: every copy through devalloc's pinned buffers; pageable: the \
         driver's own copy; devalloc's threshold now: {} bytes)",
        base.pinned_threshold
    );
    println!(
        "{:>6} {:>10} {:>10} {:>12} {:>12}",
        "size", "up staged", "up direct", "down staged", "down direct"
    );
    let data = pattern(max);
    let (ps, pd) = (staged.allocate(max, index, 256).unwrap(), direct.allocate(max, index, 256).unwrap());
    let backs = [0, 1, 2].map(|_| RefCell::new(vec![0u8; max]));
    for &size in sizes {
        let d = &data[..size];
        let n = reps(size, quick);
        let back = &backs[2];
        let verify = |addr| move || holds(ctx, &mut back.borrow_mut()[..size], addr, d);
        let mut up = vec![
            Method::new("staged", || staged.copy_host_to_device(ps, black_box(d), index).unwrap())
                .ours()
                .prepare(|| zero(stream, ps.addr(), size))
                .verify(verify(ps.addr())),
            Method::new("direct", || direct.copy_host_to_device(pd, black_box(d), index).unwrap())
                .prepare(|| zero(stream, pd.addr(), size))
                .verify(verify(pd.addr())),
        ];
        let tu = interleave(&mut up, n);
        let mut down = vec![
            Method::new("staged", || {
                staged.copy_device_to_host(&mut backs[0].borrow_mut()[..size], ps, index).unwrap()
            })
            .ours()
            .prepare(|| backs[0].borrow_mut()[..size].fill(0))
            .verify(|| backs[0].borrow()[..size] == *d),
            Method::new("direct", || {
                direct.copy_device_to_host(&mut backs[1].borrow_mut()[..size], pd, index).unwrap()
            })
            .prepare(|| backs[1].borrow_mut()[..size].fill(0))
            .verify(|| backs[1].borrow()[..size] == *d),
        ];
        let td = interleave(&mut down, n);
        let g = |t: &crate::common::Timings, i| crate::common::gbps(size, t.median[i]);
        println!(
            "{:>6} {:>10.2} {:>10.2} {:>12.2} {:>12.2}",
            human(size),
            g(&tu, 0),
            g(&tu, 1),
            g(&td, 0),
            g(&td, 1)
        );
    }
    staged.deallocate(ps, index).unwrap();
    direct.deallocate(pd, index).unwrap();
}

fn alloc_cycle(a: &CudaAllocator, index: DeviceIndex, ctx: &CudaContext, stream: &CudaStream, quick: bool) {
    println!(
        "\nalloc + free per second (each freed at once): cuMemAlloc/cuMemFree, the driver's stream-ordered \
         pool (cuMemAllocAsync/cuMemFreeAsync, not synchronised: usable in stream order only) and devalloc's cache"
    );
    ctx.bind_to_thread().expect("bind");
    let s = stream.cu_stream();
    for size in [64 * KIB, MIB, 16 * MIB, 256 * MIB] {
        let n = if quick { 50 } else { 300 };
        let mut methods = vec![
            Method::new("cuMemAlloc", || {
                // SAFETY: a plain allocation, freed at once (the context is current).
                unsafe { result::free_sync(result::malloc_sync(size).expect("cuMemAlloc")) }
                    .expect("cuMemFree")
            }),
            Method::new("cuMemAllocAsync", || {
                // SAFETY: allocated and freed in order on one stream, never used.
                unsafe { result::free_async(result::malloc_async(s, size).expect("cuMemAllocAsync"), s) }
                    .expect("cuMemFreeAsync")
            }),
            Method::new("devalloc", || {
                let p = a.allocate(size, index, DEFAULT_ALIGNMENT).unwrap();
                a.deallocate(p, index).unwrap();
            })
            .ours(),
        ];
        let t = interleave(&mut methods, n);
        stream.synchronize().expect("sync");
        let per = |i: usize| 1.0 / t.median[i].as_secs_f64();
        let (ratio, best) = t.ratio().unwrap();
        println!(
            "{:>6} cuMemAlloc/Free {:>12.0}/s  async pool {:>12.0}/s  devalloc {:>12.0}/s  {ratio:.1}x {best}",
            human(size),
            per(0),
            per(1),
            per(2),
        );
    }
}
