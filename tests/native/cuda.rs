//! The conformance suite on every CUDA device, where there is one, and the semantics a CUDA
//! runtime relies on: copies done when they return (a read on another stream right after sees
//! the data), the caller's current context kept, large ragged and concurrent copies, out of
//! memory -> empty cache -> retry. Without a driver (CI, this project's machines) each says it
//! did not run and why; `DEVALLOC_REQUIRE_ALL=1` (the GPU bundle's run) makes that a failure.
#![allow(unsafe_code)] // the driver API, as a runtime beside devalloc would call it

use crate::conformance;

use devalloc::cuda::api::driver::{result, CudaContext};
use devalloc::cuda::{CudaAllocator, CudaOptions};
use devalloc::{
    DeviceAllocator, DeviceAllocatorRegistry, DeviceIndex, DeviceType, Error, PoolOptions,
    RegistrationOutcome, DEFAULT_ALIGNMENT,
};

fn cuda() -> conformance::Made {
    conformance::ready(CudaAllocator::new())
}

fn cuda_uncached() -> conformance::Made {
    conformance::ready(CudaAllocator::with_options(CudaOptions {
        pool: PoolOptions::default(),
        ..CudaOptions::default()
    }))
}

fn require_all() -> bool {
    std::env::var("DEVALLOC_REQUIRE_ALL").is_ok_and(|v| v == "1")
}

/// The allocator, or `None` after saying why the test did not run (a failure when required).
fn gpu(test: &str) -> Option<CudaAllocator> {
    conformance::logging::init_for_tests();
    match CudaAllocator::new() {
        Ok(a) => Some(a),
        Err(e) if require_all() => panic!("{test}: no CUDA device, and DEVALLOC_REQUIRE_ALL=1: {e}"),
        Err(e) => {
            eprintln!("SKIPPED {test}: did not run: {e}");
            None
        }
    }
}

mod cached {
    use super::*;
    conformance_tests!(cuda, conformance::Need::Optional);

    #[test]
    fn model_check() {
        if gpu("model_check").is_some() {
            conformance::model::model_check(cuda, 32);
        }
    }
}

mod uncached {
    use super::*;
    conformance_tests!(cuda_uncached, conformance::Need::Optional);
}

#[test]
fn without_a_driver_construction_fails_and_the_registry_still_works() {
    let registry = DeviceAllocatorRegistry::new();
    let lines = devalloc::register_available(&registry);
    let cuda =
        lines.iter().find(|l| l.device_type == DeviceType::Cuda).expect("register_available reports CUDA");
    let cuda_line = cuda.to_string();
    match CudaAllocator::new() {
        Ok(_) => {
            assert!(registry.get_allocator(DeviceType::Cuda).is_some(), "{cuda_line}");
            eprintln!("a CUDA device is present: {cuda_line}");
        }
        Err(e) => {
            assert!(!require_all(), "DEVALLOC_REQUIRE_ALL=1 but: {e}");
            assert!(matches!(e, Error::NotFound { .. }), "{e}");
            assert!(
                matches!(&cuda.outcome, RegistrationOutcome::Unavailable(Error::NotFound { .. })),
                "{cuda_line}"
            );
            assert!(cuda_line.contains("not available") && cuda_line.contains("CUDA"), "{cuda_line}");
            assert!(registry.get_allocator(DeviceType::Cuda).is_none());
            eprintln!("SKIPPED CUDA conformance here: {e}");
        }
    }
    // The rest of the registry works either way.
    let host = registry.get_allocator(DeviceType::Cpu).expect("host is always registered");
    let p = host.allocate(64, 0, 64).unwrap();
    host.copy_host_to_device(p, &[9u8; 64], 0).unwrap();
    let mut back = [0u8; 64];
    host.copy_device_to_host(&mut back, p, 0).unwrap();
    assert_eq!(back, [9u8; 64]);
    host.deallocate(p, 0).unwrap();
}

fn pattern(n: usize, seed: u64) -> Vec<u8> {
    conformance::pattern(n, seed)
}

#[test]
fn copies_of_several_chunks_at_ragged_offsets() {
    let Some(a) = gpu("copies_of_several_chunks_at_ragged_offsets") else { return };
    let mib = 1 << 20;
    for (offset, len) in
        [(7usize, 2 * 8 * mib + 12345), (1, 3 * mib + 5), (4093, 64 * mib - 4093 - 1), (0, 8 * mib)]
    {
        let p = a.allocate(offset + len + 64, 0, DEFAULT_ALIGNMENT).unwrap();
        let data = pattern(len, (offset + len) as u64);
        a.copy_host_to_device(p.offset(offset).unwrap(), &data, 0).unwrap();
        let mut back = vec![0u8; len];
        a.copy_device_to_host(&mut back, p.offset(offset).unwrap(), 0).unwrap();
        assert!(back == data, "{len} bytes at offset {offset} differ");
        let q = a.allocate(len, 0, DEFAULT_ALIGNMENT).unwrap();
        a.copy_device_to_device(q, 0, p.offset(offset).unwrap(), 0, len).unwrap();
        a.copy_device_to_host(&mut back, q, 0).unwrap();
        assert!(back == data, "device-to-device of {len} bytes differs");
        a.deallocate(p, 0).unwrap();
        a.deallocate(q, 0).unwrap();
    }
}

#[test]
fn eight_threads_copy_20_to_40_mib_at_once() {
    let Some(a) = gpu("eight_threads_copy_20_to_40_mib_at_once") else { return };
    std::thread::scope(|s| {
        for t in 0..8usize {
            let a = &a;
            s.spawn(move || {
                let n = (20 << 20) + t * (20 << 20) / 7 + t;
                let data = pattern(n, t as u64 + 1);
                let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
                for _ in 0..3 {
                    a.copy_host_to_device(p, &data, 0).unwrap();
                    let mut back = vec![0u8; n];
                    a.copy_device_to_host(&mut back, p, 0).unwrap();
                    assert!(back == data, "thread {t}");
                }
                a.deallocate(p, 0).unwrap();
            });
        }
    });
}

#[test]
fn a_read_on_another_stream_right_after_an_upload_sees_the_data() {
    let Some(a) = gpu("a_read_on_another_stream_right_after_an_upload_sees_the_data") else { return };
    let ctx = CudaContext::new(0).expect("the primary context");
    let other = ctx.new_stream().expect("a stream of the runtime's own");
    for n in [4096usize, 1 << 20, 24 << 20] {
        let data = pattern(n, n as u64);
        let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
        a.copy_host_to_device(p, &data, 0).unwrap();
        let mut back = vec![0u8; n];
        // SAFETY: `p` is a live allocation of `n` bytes on device 0; the stream is synchronised
        // before `back` is read.
        unsafe { result::memcpy_dtoh_async(&mut back, p.addr(), other.cu_stream()) }.unwrap();
        other.synchronize().unwrap();
        assert!(back == data, "{n} bytes: the other stream read stale data");
        a.deallocate(p, 0).unwrap();
    }
}

#[test]
fn the_callers_current_context_is_the_same_after_a_devalloc_call() {
    let Some(a) = gpu("the_callers_current_context_is_the_same_after_a_devalloc_call") else { return };
    // A context of the runtime's own on GPU 0 (one GPU is enough), current on this thread.
    let mine = CudaContext::new_non_primary(0, 0).expect("a second context");
    mine.bind_to_thread().unwrap();
    let before = result::ctx::get_current().unwrap();
    assert_eq!(before, Some(mine.cu_ctx()));
    let p = a.allocate(3 << 20, 0, DEFAULT_ALIGNMENT).unwrap();
    a.copy_host_to_device(p, &pattern(3 << 20, 5), 0).unwrap();
    let mut back = vec![0u8; 3 << 20];
    a.copy_device_to_host(&mut back, p, 0).unwrap();
    a.copy_device_to_device(p, 0, p.offset(16).unwrap(), 0, 1000).unwrap();
    a.deallocate(p, 0).unwrap();
    // Dropped below while it holds a cached block (`p`'s) and a live one: both are freed
    // through devalloc's context, and the caller's stays current.
    let _live = a.allocate(1 << 20, 0, DEFAULT_ALIGNMENT).unwrap();
    assert!(a.stats(0).unwrap().cached_bytes > 0);
    assert_eq!(result::ctx::get_current().unwrap(), before, "devalloc changed the caller's current context");
    drop(a);
    assert_eq!(result::ctx::get_current().unwrap(), before, "dropping devalloc changed the current context");
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
    assert!(!held.is_empty());
    let before = a.stats(0).unwrap();
    // Free half into the cache: a request of another size must get the memory back.
    for p in held.drain(..held.len() / 2) {
        a.deallocate(p, 0).unwrap();
    }
    assert!(a.stats(0).unwrap().cached_bytes > 0);
    let other = a
        .allocate(block + (3 << 20), 0, DEFAULT_ALIGNMENT)
        .expect("the cache was emptied and the retry worked");
    let after = a.stats(0).unwrap();
    eprintln!("before {before:?}\nafter {after:?}");
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
    if a.device_count() < 2 {
        eprintln!(
            "SKIPPED peer_copies_between_two_gpus: needs two GPUs, this machine has {}",
            a.device_count()
        );
        return;
    }
    let n = 24 << 20;
    let data = pattern(n, 42);
    let (i, j): (DeviceIndex, DeviceIndex) = (0, 1);
    let p = a.allocate(n, i, DEFAULT_ALIGNMENT).unwrap();
    let q = a.allocate(n, j, DEFAULT_ALIGNMENT).unwrap();
    a.copy_host_to_device(p, &data, i).unwrap();
    a.copy_device_to_device(q, j, p, i, n).unwrap();
    let mut back = vec![0u8; n];
    a.copy_device_to_host(&mut back, q, j).unwrap();
    assert!(back == data);
}
