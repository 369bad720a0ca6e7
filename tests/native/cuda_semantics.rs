//! What a CUDA runtime beside devalloc relies on, beyond the suite: devalloc never waits for
//! the program's queued work, `stats()` never waits for a copy, pinned memory is copied
//! straight, overlapping copies end right, out of memory -> empty cache -> retry really frees,
//! and peer copies between two GPUs.
#![allow(unsafe_code)] // the driver API, as a runtime beside devalloc would call it

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Condvar, Mutex};
use std::time::{Duration, Instant};

use devalloc::cuda::api::driver::{result, CudaContext};
use devalloc::cuda::CudaAllocator;
use devalloc::snapshot::EventKind;
use devalloc::{DeviceAllocator, DeviceIndex, Error, DEFAULT_ALIGNMENT};

use super::{gpu, pattern};
use crate::conformance;

static RELEASED: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());

/// A host function that holds its stream until released (20 s at most).
unsafe extern "C" fn hold(_: *mut std::ffi::c_void) {
    let (m, c) = &RELEASED;
    let g = m.lock().unwrap();
    let _ = c.wait_timeout_while(g, Duration::from_secs(20), |released| !*released).unwrap();
}

fn release() {
    *RELEASED.0.lock().unwrap() = true;
    RELEASED.1.notify_all();
}

/// Run alone (`--ignored --test-threads=1`): it holds one of the GPU's streams for a while.
/// Each step reports when it is done, so a step that waits for the program is named.
#[test]
#[ignore = "holds a stream of the GPU: the bundle runs it alone"]
fn opening_and_copying_never_wait_for_the_programs_queued_work() {
    let Some(a) = gpu("opening_and_copying_never_wait_for_the_programs_queued_work") else { return };
    drop(a);
    // The program (PyTorch, say): work queued on a stream of its own that will not finish
    // until it is released, in the primary context devalloc shares.
    let ctx = CudaContext::new(0).expect("the primary context");
    ctx.bind_to_thread().unwrap();
    let busy = result::stream::create(result::stream::StreamKind::NonBlocking).unwrap();
    // SAFETY: `hold` calls no CUDA function and returns within 20 s.
    unsafe { result::stream::launch_host_function(busy, hold, std::ptr::null_mut()) }.unwrap();
    let (tx, rx) = mpsc::channel::<&'static str>();
    let worker = std::thread::spawn(move || {
        let done = |step| tx.send(step).unwrap();
        // A fresh allocator: its first use opens the context and creates streams and staging.
        let a = CudaAllocator::new().unwrap();
        done("CudaAllocator::new");
        a.mem_info(0).unwrap();
        done("opening the device (mem_info)");
        let n = 24 << 20;
        let data = pattern(n, 3);
        let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
        done("allocate (cuMemAlloc)");
        a.copy_host_to_device(p, &data, 0).unwrap();
        done("a staged upload (first: cuMemHostAlloc of the staging)");
        a.copy_host_to_device(p, &data[..4096], 0).unwrap();
        done("a small upload");
        let mut back = vec![0u8; n];
        a.copy_device_to_host(&mut back, p, 0).unwrap();
        assert!(back == data);
        done("a staged download");
        a.copy_device_to_device(p.offset(1).unwrap(), 0, p, 0, 1 << 20).unwrap();
        done("an overlapping device copy (first: the temporary's cuMemAlloc)");
        a.deallocate(p, 0).unwrap();
        done("deallocate (into the cache, no cuMemFree)");
        a // dropped (and its blocks freed) after the program's work is released
    });
    let t = Instant::now();
    let mut waited_in = None;
    let mut steps = Vec::new();
    while steps.len() < 8 {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(step) => steps.push(format!("{step}: {:?}", t.elapsed())),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                waited_in = Some(steps.len());
                break;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    release();
    let a = worker.join().expect("devalloc's calls");
    // SAFETY: the stream is idle once released; destroyed once.
    unsafe { result::stream::synchronize(busy).and_then(|()| result::stream::destroy(busy)) }.unwrap();
    drop(a);
    eprintln!("beside a busy stream:\n  {}", steps.join("\n  "));
    assert!(
        waited_in.is_none(),
        "devalloc waited for the program's queued work in the step after {:?}",
        steps.last()
    );
}

#[test]
fn stats_never_wait_for_a_copy_in_flight() {
    let Some(a) = gpu("stats_never_wait_for_a_copy_in_flight") else { return };
    let n = 256 << 20;
    let data = pattern(n, 9);
    let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
    let t = Instant::now();
    a.copy_host_to_device(p, &data, 0).unwrap();
    let one_copy = t.elapsed();
    let copying = AtomicBool::new(true);
    let mut slowest = Duration::ZERO;
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut back = vec![0u8; n];
            for _ in 0..4 {
                a.copy_host_to_device(p, &data, 0).unwrap();
                a.copy_device_to_host(&mut back, p, 0).unwrap();
            }
            copying.store(false, Ordering::Release);
        });
        while copying.load(Ordering::Acquire) {
            let t = Instant::now();
            let _ = a.stats(0).unwrap();
            slowest = slowest.max(t.elapsed());
            std::thread::sleep(Duration::from_micros(200));
        }
    });
    a.deallocate(p, 0).unwrap();
    eprintln!("slowest stats() {slowest:?} beside copies of {one_copy:?}");
    assert!(
        slowest < one_copy / 4,
        "stats() took {slowest:?} beside copies of {one_copy:?}: it waited for one"
    );
}

#[test]
fn pinned_memory_is_copied_straight_and_pageable_through_staging() {
    let Some(a) = gpu("pinned_memory_is_copied_straight_and_pageable_through_staging") else { return };
    let ctx = CudaContext::new(0).unwrap();
    let n = 64 << 20;
    let data = pattern(n, 4);
    // SAFETY: written before it is read.
    let mut pinned = unsafe { ctx.alloc_pinned_with_flags::<u8>(n, 0) }.unwrap();
    pinned.as_mut_slice().unwrap().copy_from_slice(&data);
    let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
    a.copy_host_to_device(p, pinned.as_slice().unwrap(), 0).unwrap();
    let host = pinned.as_mut_slice().unwrap();
    host.fill(0);
    a.copy_device_to_host(&mut host[1..], p.offset(1).unwrap(), 0).unwrap();
    assert!(host[1..] == data[1..], "a copy into pinned memory (at an offset) differs");
    assert_eq!(a.stats(0).unwrap().staging_bytes, 0, "pinned memory went through devalloc's staging");
    // Pageable memory of the same size is staged, and comes back the same.
    let mut back = vec![0u8; n];
    a.copy_host_to_device(p, &data, 0).unwrap();
    a.copy_device_to_host(&mut back, p, 0).unwrap();
    assert!(back == data);
    assert!(a.stats(0).unwrap().staging_bytes > 0, "a 64 MiB pageable copy was not staged");
    a.deallocate(p, 0).unwrap();
}

#[test]
fn overlapping_copies_on_the_device_end_as_if_through_a_temporary() {
    let Some(a) = gpu("overlapping_copies_on_the_device_end_as_if_through_a_temporary") else { return };
    let n = 24 << 20;
    let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
    let mib = 1 << 20;
    // (from, to, len): a byte apart both ways (through the temporary), 3 MiB apart both ways
    // (direct pieces), and longer than the temporary.
    for (from, to, len) in [
        (0, 1, 20 * mib),
        (1, 0, 20 * mib),
        (0, 3 * mib, 20 * mib),
        (3 * mib, 0, 20 * mib),
        (5, 4096, 9 * mib + 7),
    ] {
        let mut model = pattern(n, (from + to) as u64);
        a.copy_host_to_device(p, &model, 0).unwrap();
        a.copy_device_to_device(p.offset(to).unwrap(), 0, p.offset(from).unwrap(), 0, len).unwrap();
        model.copy_within(from..from + len, to);
        let mut back = vec![0u8; n];
        a.copy_device_to_host(&mut back, p, 0).unwrap();
        assert!(back == model, "{len} bytes from {from} to {to}");
    }
    a.deallocate(p, 0).unwrap();
}

/// Run alone (`--ignored --test-threads=1`): it fills the GPU.
#[test]
#[ignore = "fills the GPU: the bundle runs it alone"]
fn out_of_memory_then_empty_cache_then_retry_frees_for_real() {
    let Some(a) = gpu("out_of_memory_then_empty_cache_then_retry_frees_for_real") else { return };
    let (free, total) = a.mem_info(0).unwrap();
    eprintln!("cuda:0: {free} of {total} bytes free");
    let block = 1usize << 30;
    let mut held = Vec::new();
    loop {
        match a.allocate(block, 0, DEFAULT_ALIGNMENT) {
            Ok(p) => held.push(p),
            Err(Error::OutOfMemory { .. }) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(held.len() < 10_000, "never ran out");
    }
    assert!(held.len() >= 2, "{} blocks of 1 GiB", held.len());
    // Free half into the cache: a request of another size must get the memory back.
    for p in held.drain(..held.len() / 2) {
        a.deallocate(p, 0).unwrap();
    }
    let before = a.stats(0).unwrap();
    assert!(before.cached_bytes >= block as u64, "{before:?}");
    a.record_history(64).unwrap();
    let other = a
        .allocate(block + (3 << 20), 0, DEFAULT_ALIGNMENT)
        .expect("the cache was emptied and the retry worked");
    let after = a.stats(0).unwrap();
    eprintln!("before {before:?}\nafter {after:?}");
    // The retry got its memory from the cache: it was given back to the driver (an eviction).
    assert_eq!(after.cached_bytes, 0, "the cache was not emptied: {after:?}");
    assert!(after.reserved_bytes < before.reserved_bytes + block as u64, "{before:?} -> {after:?}");
    let snap = a.snapshot().unwrap();
    let events = &snap.devices[0].history.as_ref().expect("recording").events;
    let evicted: u64 =
        events.iter().map(|e| if let EventKind::Evict { bytes } = e.kind { bytes } else { 0 }).sum();
    assert_eq!(evicted, before.cached_bytes, "the eviction gave back what was cached: {events:#?}");
    a.deallocate(other, 0).unwrap();
    for p in held {
        a.deallocate(p, 0).unwrap();
    }
    a.empty_cache();
    let (free2, _) = a.mem_info(0).unwrap();
    assert!(free2 + (1 << 30) >= free, "empty_cache gave the memory back to the driver: {free2} vs {free}");
}

#[test]
fn peer_copies_between_two_gpus() {
    let Some(a) = gpu("peer_copies_between_two_gpus") else { return };
    // SKIPPED on one GPU; a failure where the machine has two (other_device says so).
    let Some(j) = conformance::other_device(&a, 0, "peer_copies_between_two_gpus") else { return };
    let n = 24 << 20;
    let data = pattern(n, 42);
    let i: DeviceIndex = 0;
    let p = a.allocate(n, i, DEFAULT_ALIGNMENT).unwrap();
    let q = a.allocate(n, j, DEFAULT_ALIGNMENT).unwrap();
    a.copy_host_to_device(p, &data, i).unwrap();
    a.copy_device_to_device(q, j, p, i, n).unwrap();
    let mut back = vec![0u8; n];
    a.copy_device_to_host(&mut back, q, j).unwrap();
    assert!(back == data, "{i} -> {j}");
    // And back the other way, at an offset.
    a.copy_device_to_device(p.offset(7).unwrap(), i, q, j, n - 7).unwrap();
    a.copy_device_to_host(&mut back[..n - 7], p.offset(7).unwrap(), i).unwrap();
    assert!(back[..n - 7] == data[..n - 7], "{j} -> {i}");
    a.deallocate(p, i).unwrap();
    a.deallocate(q, j).unwrap();
}
