//! The CUDA part of the benchmark: devalloc vs cudarc's plain copies from pageable memory,
//! the pinned-memory peak as the ceiling, and alloc+free cycles cached vs cuMemAlloc/cuMemFree.
use std::time::Duration;

use cudarc::driver::CudaContext;
use devalloc::{CudaAllocator, DeviceAllocator, DeviceIndex, DEFAULT_ALIGNMENT};

use super::{gbps, human, MIB};

use std::time::Instant;

/// Median time of `f` over enough repetitions for `bytes` per call, after one warm-up call.
fn time(bytes: usize, quick: bool, mut f: impl FnMut()) -> Duration {
    f();
    let n = super::reps(bytes, quick);
    let mut v: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    v.sort();
    v[v.len() / 2]
}

pub fn run(quick: bool) {
    let alloc = match CudaAllocator::new() {
        Ok(a) => a,
        Err(e) => {
            println!("\n## cuda: not run: {e}");
            return;
        }
    };
    for index in 0..alloc.device_count() as DeviceIndex {
        device(&alloc, index, quick);
    }
}

fn device(alloc: &CudaAllocator, index: DeviceIndex, quick: bool) {
    println!("\n## cuda:{index}: {}", alloc.device_name(index));
    let ctx = CudaContext::new(index as usize).expect("context");
    let stream = ctx.new_stream().expect("stream");
    let sizes: &[usize] = if quick { &[4 << 10, MIB, 64 * MIB] } else { &[4 << 10, MIB, 64 * MIB, 1 << 30] };
    println!(
        "{:>6} {:>9} {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} {:>9}",
        "size", "H2D pin", "pageable", "devalloc", "vs peak", "D2H pin", "pageable", "devalloc", "vs peak"
    );
    for &s in sizes {
        let host: Vec<u8> = (0..s).map(|i| i as u8).collect();
        let mut back = vec![0u8; s];
        let mut dev = stream.alloc_zeros::<u8>(s).expect("alloc");
        // SAFETY (benchmark only): the pinned buffer is written before it is copied from.
        let mut pinned = unsafe { ctx.alloc_pinned_with_flags::<u8>(s, 0) }.expect("pinned");
        pinned.as_mut_slice().unwrap().copy_from_slice(&host);
        let h_pin = gbps(
            s,
            time(s, quick, || {
                stream.memcpy_htod(&pinned, &mut dev).unwrap();
                stream.synchronize().unwrap();
            }),
        );
        let h_page = gbps(
            s,
            time(s, quick, || {
                stream.memcpy_htod(&host, &mut dev).unwrap();
                stream.synchronize().unwrap();
            }),
        );
        let d_pin = gbps(
            s,
            time(s, quick, || {
                stream.memcpy_dtoh(&dev, &mut pinned).unwrap();
                stream.synchronize().unwrap();
            }),
        );
        let d_page = gbps(
            s,
            time(s, quick, || {
                stream.memcpy_dtoh(&dev, &mut back).unwrap();
            }),
        );
        let p = alloc.allocate(s, index, DEFAULT_ALIGNMENT).unwrap();
        let h_dev = gbps(
            s,
            time(s, quick, || {
                alloc.copy_host_to_device(p, &host, index).unwrap();
                alloc.synchronize(index).unwrap();
            }),
        );
        let d_dev = gbps(s, time(s, quick, || alloc.copy_device_to_host(&mut back, p, index).unwrap()));
        assert!(back == host, "devalloc's download differs");
        alloc.deallocate(p, index).unwrap();
        println!(
            "{:>6} {:>9.2} {:>9.2} {:>9.2} {:>8.2}x | {:>9.2} {:>9.2} {:>9.2} {:>8.2}x   (devalloc/pageable: up {:.2}x, down {:.2}x)",
            human(s), h_pin, h_page, h_dev, h_dev / h_pin, d_pin, d_page, d_dev, d_dev / d_pin, h_dev / h_page, d_dev / d_page
        );
    }
    println!("alloc+free per second");
    for s in [64 << 10, MIB, 16 * MIB] {
        let per = |d: Duration| 1.0 / d.as_secs_f64();
        let plain = per(time(1, quick, || drop(stream.alloc_zeros::<u8>(s).unwrap())));
        let cached = per(time(1, quick, || {
            let p = alloc.allocate(s, index, DEFAULT_ALIGNMENT).unwrap();
            alloc.deallocate(p, index).unwrap();
        }));
        println!(
            "{:>6} cuMemAlloc/Free {plain:>10.0}  devalloc {cached:>10.0}  ratio {:.2}x",
            human(s),
            cached / plain
        );
    }
}
