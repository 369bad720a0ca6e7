//! The conformance suite on every CUDA device, where there is one, and the semantics a CUDA
//! runtime relies on: copies done when they return (a read on another stream right after sees
//! the data), the caller's current context kept, large ragged and concurrent copies, out of
//! memory -> empty cache -> retry. Without a driver (CI, this project's machines) each says it
//! did not run and why; `DEVALLOC_REQUIRE_ALL=1` (the GPU bundle's run) makes that a failure,
//! and so is a machine with fewer devices than `DEVALLOC_EXPECT_CUDA_DEVICES` says it has.
//! More semantics (a busy program, out of memory, peers, pinned memory) in `cuda_semantics.rs`.
#![allow(unsafe_code)] // the driver API, as a runtime beside devalloc would call it

use crate::conformance;

#[path = "cuda_semantics.rs"]
mod semantics;

use devalloc::cuda::api::driver::{result, CudaContext};
use devalloc::cuda::{CudaAllocator, CudaOptions};
use devalloc::{
    DeviceAllocator, DeviceAllocatorRegistry, DeviceType, Error, PoolOptions, RegistrationOutcome,
    DEFAULT_ALIGNMENT,
};

fn cuda() -> conformance::Made {
    conformance::ready(CudaAllocator::new())
}

/// Caching off: every allocation asks the driver, every free gives back (the default caches).
fn uncached_options() -> CudaOptions {
    CudaOptions { pool: PoolOptions { caching: false, ..PoolOptions::default() }, ..CudaOptions::default() }
}

fn cuda_uncached() -> conformance::Made {
    conformance::ready(CudaAllocator::with_options(uncached_options()))
}

use conformance::require_all;

/// The allocator, or `None` after saying why the test did not run (a failure when required).
/// Where the run says how many GPUs the machine has, the allocator must see as many.
fn gpu(test: &str) -> Option<CudaAllocator> {
    conformance::logging::init_for_tests();
    match CudaAllocator::new() {
        Ok(a) => {
            let expected = conformance::expected_devices(DeviceType::Cuda);
            if let Some(n) = expected.filter(|&n| n != a.device_count()) {
                let msg = format!("{test}: the machine has {n} GPU(s), devalloc sees {}", a.device_count());
                assert!(!require_all(), "{msg}");
                eprintln!("warning: {msg}");
            }
            Some(a)
        }
        Err(e) if require_all() => panic!("{test}: no CUDA device, and DEVALLOC_REQUIRE_ALL=1: {e}"),
        Err(e) => {
            conformance::skip(test, &format!("did not run: no CUDA device: {e}"));
            None
        }
    }
}

#[test]
fn the_uncached_suite_really_runs_uncached() {
    // Without a GPU this checks the options alone (with one, the suite below runs on them).
    assert!(!uncached_options().pool.caching, "the `uncached` suite would run with caching on");
    let Some(a) = gpu("the_uncached_suite_really_runs_uncached") else { return };
    drop(a);
    let a = CudaAllocator::with_options(uncached_options()).unwrap();
    let p = a.allocate(1 << 20, 0, DEFAULT_ALIGNMENT).unwrap();
    a.deallocate(p, 0).unwrap();
    assert_eq!(a.stats(0).unwrap().cached_bytes, 0, "a freed block was cached");
}

mod cached {
    use super::*;
    conformance_tests!(cuda, conformance::Need::Optional, conformance::Caching::On);

    #[test]
    fn model_check() {
        if gpu("model_check").is_some() {
            conformance::model::model_check(cuda, 32);
        }
    }
}

mod uncached {
    use super::*;
    conformance_tests!(cuda_uncached, conformance::Need::Optional, conformance::Caching::Off);
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
            conformance::skip(
                "without_a_driver_construction_fails_and_the_registry_still_works",
                &format!("the CUDA conformance suite does not run here: {e}"),
            );
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

/// Every kind of devalloc call, on the happy path and on error paths that reached the driver,
/// with `what_is_current` before; the same must be current after each.
fn calls_keep(a: &CudaAllocator, what_is_current: &str) {
    let before = result::ctx::get_current().unwrap();
    let same = |after: &str| {
        assert_eq!(
            result::ctx::get_current().unwrap(),
            before,
            "{what_is_current}: {after} changed the current context"
        );
    };
    let p = a.allocate(6 << 20, 0, DEFAULT_ALIGNMENT).unwrap();
    same("allocate");
    // 6 MiB: staged (above the 4 MiB threshold), on copy threads; 100 bytes: straight.
    a.copy_host_to_device(p, &pattern(6 << 20, 5), 0).unwrap();
    a.copy_host_to_device(p, &[1u8; 100], 0).unwrap();
    same("an upload");
    let mut back = vec![0u8; 6 << 20];
    a.copy_device_to_host(&mut back, p, 0).unwrap();
    same("a download");
    a.copy_device_to_device(p, 0, p.offset(16).unwrap(), 0, 1000).unwrap();
    same("a device-to-device copy");
    a.mem_info(0).unwrap();
    a.stats(0).unwrap();
    same("mem_info and stats");
    // Error paths that reach the driver: out of memory (allocating the whole card, twice: the
    // pool empties its cache and retries) and a failure half-way is the same.
    // (The context itself takes hundreds of MiB: the card less 64 MiB cannot fit.)
    let total = a.mem_info(0).unwrap().1 as usize;
    let e = a.allocate(total - (64 << 20), 0, DEFAULT_ALIGNMENT).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    same("an allocation that ran out of memory");
    assert!(a.copy_host_to_device(p.offset(6 << 20).unwrap(), &[1], 0).is_err());
    same("a refused copy");
    a.deallocate(p, 0).unwrap();
    same("deallocate");
}

#[test]
fn the_callers_current_context_is_the_same_after_a_devalloc_call() {
    let Some(a) = gpu("the_callers_current_context_is_the_same_after_a_devalloc_call") else { return };
    // A context of the runtime's own on GPU 0 (one GPU is enough), current on this thread.
    let mine = CudaContext::new_non_primary(0, 0).expect("a second context");
    mine.bind_to_thread().unwrap();
    assert_eq!(result::ctx::get_current().unwrap(), Some(mine.cu_ctx()));
    calls_keep(&a, "another context");
    // None current (a thread that never used CUDA): none afterwards, not devalloc's.
    // SAFETY: null unbinds.
    unsafe { result::ctx::set_current(std::ptr::null_mut()) }.unwrap();
    calls_keep(&a, "no context");
    assert_eq!(result::ctx::get_current().unwrap(), None);
    // The primary context, devalloc's own, already current (as in a PyTorch program).
    let primary = CudaContext::new(0).expect("the primary context");
    primary.bind_to_thread().unwrap();
    calls_keep(&a, "the primary context");
    // Dropped while it holds a cached block and a live one: both are freed through devalloc's
    // context, and the caller's stays current.
    mine.bind_to_thread().unwrap();
    let before = result::ctx::get_current().unwrap();
    let cached = a.allocate(1 << 20, 0, DEFAULT_ALIGNMENT).unwrap();
    a.deallocate(cached, 0).unwrap();
    let _live = a.allocate(1 << 20, 0, DEFAULT_ALIGNMENT).unwrap();
    assert!(a.stats(0).unwrap().cached_bytes > 0);
    drop(a);
    assert_eq!(result::ctx::get_current().unwrap(), before, "dropping devalloc changed the current context");
}
