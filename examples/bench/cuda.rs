//! The CUDA part of the benchmark (feature `cuda`; also the CUDA-only `cuda_bench` example that
//! the GPU bundle carries): devalloc against what a CUDA user would otherwise write, in one run,
//! interleaved, every result verified.
//!
//! - upload / download: cudarc's copy from pageable memory (the plain way) and a copy from a
//!   pinned buffer of the whole size (the ceiling: what the link can do), against devalloc;
//! - the alloc cycle: `cuMemAlloc` + `cuMemFree` (synchronous) against devalloc's cache;
//! - `--sweep`: devalloc's staging (chunk, buffers, threads) at 64 MiB and 1 GiB.
//!
//! PyTorch, the peer a CUDA user would pick, is measured beside it by the bundle's
//! `torch_peer.py`, in the same run.
#![allow(unsafe_code)] // cudarc's raw API: the peers a CUDA user would write by hand
use std::hint::black_box;

use devalloc::cuda::api::driver::{result, sys, CudaContext, CudaStream};
use devalloc::cuda::{CopyTuning, CudaAllocator, CudaOptions};
use devalloc::{DeviceAllocator, DeviceIndex, DEFAULT_ALIGNMENT};

use crate::common::{header, human, interleave, reps, row, Method, KIB, MIB};

pub fn run(quick: bool, sweep: bool) {
    let alloc = match CudaAllocator::new() {
        Ok(a) => a,
        Err(e) => {
            println!("\n## cuda: not run: {e}");
            if std::env::var("DEVALLOC_REQUIRE_ALL").is_ok_and(|v| v == "1") {
                eprintln!("error: DEVALLOC_REQUIRE_ALL=1 and there is no CUDA device");
                std::process::exit(1);
            }
            return;
        }
    };
    println!("\nlibcuda: {}", devalloc::cuda::loaded_library().unwrap_or_else(|| "(path unknown)".into()));
    for index in 0..alloc.device_count() as DeviceIndex {
        device(&alloc, index, quick);
    }
    if sweep {
        sweep_tuning(quick);
    }
}

/// Device memory of the peers' own, freed on drop.
struct Raw(sys::CUdeviceptr);

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: allocated by `malloc_sync` below and freed once.
        unsafe { result::free_sync(self.0) }.expect("free");
    }
}

fn raw(ctx: &CudaContext, n: usize) -> Raw {
    ctx.bind_to_thread().expect("bind");
    // SAFETY: a plain allocation, freed by `Raw`'s drop.
    Raw(unsafe { result::malloc_sync(n) }.expect("cuMemAlloc"))
}

fn pageable_up(stream: &CudaStream, dst: &Raw, src: &[u8]) {
    // SAFETY: `dst` holds at least `src.len()` bytes; the stream is synchronised before return.
    unsafe { result::memcpy_htod_async(dst.0, src, stream.cu_stream()) }.expect("htod");
    stream.synchronize().expect("sync");
}

fn pageable_down(stream: &CudaStream, dst: &mut [u8], src: &Raw) {
    // SAFETY: `src` holds at least `dst.len()` bytes; synchronised before `dst` is read.
    unsafe { result::memcpy_dtoh_async(dst, src.0, stream.cu_stream()) }.expect("dtoh");
    stream.synchronize().expect("sync");
}

fn sizes(quick: bool) -> Vec<usize> {
    if quick {
        vec![4 * KIB, MIB, 64 * MIB]
    } else {
        vec![4 * KIB, 64 * KIB, MIB, 8 * MIB, 64 * MIB, 256 * MIB, 1024 * MIB]
    }
}

fn device(a: &CudaAllocator, index: DeviceIndex, quick: bool) {
    println!("\n## cuda:{index}: {}", a.device_name(index));
    let ctx = CudaContext::new(index as usize).expect("context");
    let stream = ctx.new_stream().expect("stream");
    for upload in [true, false] {
        println!(
            "\n{} GB/s (interleaved medians; pinned is the ceiling)",
            if upload { "upload" } else { "download" }
        );
        let mut first = true;
        for size in sizes(quick) {
            let data: Vec<u8> = (0..size).map(|i| (i as u8).wrapping_mul(13) ^ (i >> 16) as u8).collect();
            let dev = raw(&ctx, size);
            // SAFETY: the pinned buffer is written before it is read.
            let mut pinned = unsafe { ctx.alloc_pinned_with_flags::<u8>(size, 0) }.expect("pinned");
            pinned.as_mut_slice().unwrap().copy_from_slice(&data);
            let p = a.allocate(size, index, DEFAULT_ALIGNMENT).unwrap();
            a.copy_host_to_device(p, &data, index).unwrap();
            pageable_up(&stream, &dev, &data);
            let outs: Vec<std::cell::RefCell<Vec<u8>>> =
                (0..3).map(|_| std::cell::RefCell::new(vec![0u8; size])).collect();
            let (outs, datar) = (&outs, &data);
            let t = if upload {
                // Every upload lands on zeroed memory and is read back, untimed: a figure for
                // an upload that did not happen is no figure. (devalloc's CUDA addresses are
                // the driver's own, so the raw calls reach its memory too.)
                let ctx = &ctx;
                let zero = |addr: sys::CUdeviceptr| {
                    move || {
                        ctx.bind_to_thread().unwrap();
                        // SAFETY: `addr` holds `size` bytes (the raw buffer or devalloc's).
                        unsafe { result::memset_d8_sync(addr, 0, size) }.expect("cuMemsetD8");
                    }
                };
                let holds = |addr: sys::CUdeviceptr| {
                    move || {
                        let mut check = outs[0].borrow_mut();
                        ctx.bind_to_thread().unwrap();
                        // SAFETY: `addr` holds `size` bytes; `check` is `size` bytes long.
                        unsafe { result::memcpy_dtoh_sync(&mut check[..], addr) }.expect("cuMemcpyDtoH");
                        *check == *datar
                    }
                };
                let mut methods = vec![
                    Method::new("pinned", || {
                        // SAFETY: in bounds; pinned source; synchronised before return.
                        unsafe {
                            result::memcpy_htod_async(dev.0, pinned.as_slice().unwrap(), stream.cu_stream())
                        }
                        .unwrap();
                        stream.synchronize().unwrap();
                    })
                    .ceiling()
                    .prepare(zero(dev.0))
                    .verify(holds(dev.0)),
                    Method::new("pageable", || pageable_up(&stream, &dev, black_box(datar)))
                        .prepare(zero(dev.0))
                        .verify(holds(dev.0)),
                    Method::new("devalloc", || a.copy_host_to_device(p, black_box(datar), index).unwrap())
                        .ours()
                        .prepare(zero(p.addr()))
                        .verify(holds(p.addr())),
                ];
                interleave(&mut methods, reps(size, quick))
            } else {
                let clear = |k: usize| move || outs[k].borrow_mut().fill(0);
                let ok = |k: usize| move || *outs[k].borrow() == *datar;
                let pinned = std::cell::RefCell::new(&mut pinned);
                let mut methods = vec![
                    Method::new("pinned", || {
                        // SAFETY: in bounds; pinned destination read after the synchronise.
                        unsafe {
                            result::memcpy_dtoh_async(
                                pinned.borrow_mut().as_mut_slice().unwrap(),
                                dev.0,
                                stream.cu_stream(),
                            )
                        }
                        .unwrap();
                        stream.synchronize().unwrap();
                    })
                    .ceiling()
                    .prepare(|| pinned.borrow_mut().as_mut_slice().unwrap().fill(0))
                    .verify(|| *pinned.borrow().as_slice().unwrap() == *datar),
                    Method::new("pageable", || pageable_down(&stream, &mut outs[1].borrow_mut(), &dev))
                        .prepare(clear(1))
                        .verify(ok(1)),
                    Method::new("devalloc", || {
                        a.copy_device_to_host(&mut outs[2].borrow_mut(), p, index).unwrap()
                    })
                    .ours()
                    .prepare(clear(2))
                    .verify(ok(2)),
                ];
                interleave(&mut methods, reps(size, quick))
            };
            if first {
                println!("{}   devalloc/pinned", header(&t));
                first = false;
            }
            let vs_pinned = t.median[0].as_secs_f64() / t.median[2].as_secs_f64();
            println!("{}   {vs_pinned:.2}x", row(size, &t));
            a.deallocate(p, index).unwrap();
        }
    }
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

/// devalloc's staging settings at 64 MiB and 1 GiB: one short run finds the best.
fn sweep_tuning(quick: bool) {
    println!("\nsweep: devalloc upload/download GB/s by staging chunk, buffers, copy threads (cuda:0)");
    let size = if quick { 64 * MIB } else { 1024 * MIB };
    let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let mut back = vec![0u8; size];
    println!("{:>6} {:>8} {:>8} {:>8} {:>10} {:>10}", "size", "chunk", "buffers", "threads", "up", "down");
    for chunk in [4 * MIB, 8 * MIB, 32 * MIB] {
        for buffers in [2, 4] {
            for threads in [1, 4, 8] {
                let copies = CopyTuning { pinned_threshold: MIB, chunk, buffers, threads };
                let a = CudaAllocator::with_options(CudaOptions { copies, ..CudaOptions::default() })
                    .unwrap_or_else(|e| {
                        panic!("the sweep's allocator ({chunk} / {buffers} / {threads}): {e}")
                    });
                let p = a.allocate(size, 0, DEFAULT_ALIGNMENT).unwrap();
                let zeros = vec![0u8; size];
                let mut check = vec![0u8; size];
                // Each upload lands on zeros and is read back; each download on a cleared buffer.
                let mut up = vec![Method::new("devalloc", || a.copy_host_to_device(p, &data, 0).unwrap())
                    .ours()
                    .prepare(|| a.copy_host_to_device(p, &zeros, 0).unwrap())
                    .verify(|| {
                        a.copy_device_to_host(&mut check, p, 0).unwrap();
                        check == data
                    })];
                let tu = interleave(&mut up, 3);
                let back = std::cell::RefCell::new(&mut back);
                let mut down = vec![Method::new("devalloc", || {
                    a.copy_device_to_host(&mut back.borrow_mut(), p, 0).unwrap()
                })
                .ours()
                .prepare(|| back.borrow_mut().fill(0))
                .verify(|| **back.borrow() == data)];
                let td = interleave(&mut down, 3);
                println!(
                    "{:>6} {:>8} {:>8} {:>8} {:>10.2} {:>10.2}",
                    human(size),
                    human(chunk),
                    buffers,
                    threads,
                    crate::common::gbps(size, tu.median[0]),
                    crate::common::gbps(size, td.median[0])
                );
                a.deallocate(p, 0).unwrap();
            }
        }
    }
}
