//! The conformance suite on the wgpu allocator (Vulkan on lavapipe in CI, staged and direct
//! routes; GL on llvmpipe where available), and the wgpu allocator's own promises.
#![cfg(all(feature = "wgpu", not(target_arch = "wasm32")))]

#[macro_use]
mod conformance;

use devalloc::wgpu::{MapMode, Route, WgpuAllocator, WgpuOptions};
use devalloc::{DeviceAllocator, DevicePtr, Error, DEFAULT_ALIGNMENT};

fn open(backend: wgpu::Backend, options: WgpuOptions) -> conformance::Made {
    conformance::ready(WgpuAllocator::new_with(backend, options))
}

/// Small staging chunks so that multi-chunk, pipelined copies happen at test sizes.
fn small_chunks(map_mode: MapMode) -> WgpuOptions {
    WgpuOptions { staging_chunk: Some(64 << 10), map_mode, ..WgpuOptions::default() }
}

fn vulkan_staged() -> conformance::Made {
    open(wgpu::Backend::Vulkan, small_chunks(MapMode::Staged))
}

fn vulkan_auto() -> conformance::Made {
    open(wgpu::Backend::Vulkan, small_chunks(MapMode::Auto))
}

fn vulkan_uncached() -> conformance::Made {
    open(wgpu::Backend::Vulkan, WgpuOptions { caching: false, ..small_chunks(MapMode::Staged) })
}

fn gl() -> conformance::Made {
    open(wgpu::Backend::Gl, small_chunks(MapMode::Auto))
}

/// Vulkan (lavapipe) and GL (llvmpipe) are required under CI, skipped with a reason elsewhere.
mod vulkan_staged {
    use super::*;
    conformance_tests!(vulkan_staged, conformance::Need::InCi);

    #[test]
    fn model_check() {
        conformance::model_check(vulkan_staged, 16);
    }
}

mod vulkan_direct {
    use super::*;
    conformance_tests!(vulkan_auto, conformance::Need::InCi);

    #[test]
    fn model_check() {
        conformance::model_check(vulkan_auto, 16);
    }
}

mod vulkan_uncached {
    use super::*;
    conformance_tests!(vulkan_uncached, conformance::Need::InCi);
}

mod gl {
    use super::*;
    conformance_tests!(gl, conformance::Need::InCi);
}

fn vulkan(options: WgpuOptions) -> Option<WgpuAllocator> {
    let _ = env_logger::builder().is_test(true).try_init();
    match WgpuAllocator::new_with(wgpu::Backend::Vulkan, options) {
        Ok(a) => Some(a),
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("no Vulkan adapter under CI: {e}"),
        Err(e) => {
            eprintln!("SKIPPED: no Vulkan adapter: {e}");
            None
        }
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Both routes, forced: ragged edges, copies larger than a staging chunk, interleaved
/// uploads and downloads of one buffer, 8 threads at once.
fn staging_paths(map_mode: MapMode, expect: Route) {
    let Some(a) = vulkan(small_chunks(map_mode)) else { return };
    if a.route(0).unwrap() != expect {
        assert_eq!(map_mode, MapMode::Auto, "a forced route was not taken");
        eprintln!("SKIPPED: this adapter has no direct route");
        return;
    }
    let n = (64 << 10) * 5 + 3; // five and a bit chunks
    let p = a.allocate(n + 16, 0, DEFAULT_ALIGNMENT).unwrap();
    let mut model = pattern(n + 16, 1);
    a.copy_host_to_device(p, &model, 0).unwrap();
    // Ragged edges on both sides, neighbours untouched.
    for (off, len) in [(1usize, 1usize), (2, 3), (3, 6), (5, 64 << 10), (7, (64 << 10) * 3 + 1), (n - 3, 19)]
    {
        let data = pattern(len, off as u8 ^ 0x5a);
        a.copy_host_to_device(p.offset(off).unwrap(), &data, 0).unwrap();
        model[off..off + len].copy_from_slice(&data);
        let mut all = vec![0u8; n + 16];
        a.copy_device_to_host(&mut all, p, 0).unwrap();
        assert!(all == model, "write of {len} at {off} disturbed its neighbours");
        let mut part = vec![0u8; len];
        a.copy_device_to_host(&mut part, p.offset(off).unwrap(), 0).unwrap();
        assert_eq!(part, data);
    }
    // Interleaved uploads and downloads of the same buffer.
    for round in 0..20u8 {
        let off = (round as usize * 4093) % (n - 100);
        let data = pattern(97, round);
        a.copy_host_to_device(p.offset(off).unwrap(), &data, 0).unwrap();
        model[off..off + 97].copy_from_slice(&data);
        let mut back = vec![0u8; 200];
        let start = off.saturating_sub(50);
        a.copy_device_to_host(&mut back, p.offset(start).unwrap(), 0).unwrap();
        assert!(back == model[start..start + 200], "round {round}");
    }
    // 8 threads, each on its own buffer and on disjoint ranges of a shared one.
    let shared = a.allocate(8 * 70_001, 0, DEFAULT_ALIGNMENT).unwrap();
    std::thread::scope(|s| {
        for t in 0..8usize {
            let a = &a;
            s.spawn(move || {
                let own = a.allocate(200_003, 0, 16).unwrap();
                for k in 0..6u8 {
                    let d = pattern(200_003, k + t as u8);
                    a.copy_host_to_device(own, &d, 0).unwrap();
                    let piece = pattern(70_001, k * 3 + t as u8);
                    let at = shared.offset(t * 70_001).unwrap();
                    a.copy_host_to_device(at, &piece, 0).unwrap();
                    let mut back = vec![0u8; 200_003];
                    a.copy_device_to_host(&mut back, own, 0).unwrap();
                    assert!(back == d, "thread {t} round {k}: own buffer");
                    let mut back = vec![0u8; 70_001];
                    a.copy_device_to_host(&mut back, at, 0).unwrap();
                    assert!(back == piece, "thread {t} round {k}: shared buffer range");
                }
                a.deallocate(own, 0).unwrap();
            });
        }
    });
    a.deallocate(shared, 0).unwrap();
    a.deallocate(p, 0).unwrap();
    assert_eq!(a.stats(0).unwrap().live_allocations, 0);
}

#[test]
fn staged_route() {
    staging_paths(MapMode::Staged, Route::Staged);
}

#[test]
fn direct_route() {
    staging_paths(MapMode::Auto, Route::Direct);
}

#[test]
fn memory_limit_and_oversize_are_errors_and_the_allocator_survives() {
    let Some(a) = vulkan(WgpuOptions { memory_limit: Some(8 << 20), ..WgpuOptions::default() }) else {
        return;
    };
    let max = a.device(0).unwrap().limits().max_buffer_size;
    let keep = a.allocate(4 << 20, 0, DEFAULT_ALIGNMENT).unwrap();
    a.copy_host_to_device(keep, &[7u8; 4096], 0).unwrap();
    let e = a.allocate(6 << 20, 0, DEFAULT_ALIGNMENT).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    let e = a.allocate(16 << 20, 0, DEFAULT_ALIGNMENT).unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    a.set_memory_limit(0, None).unwrap();
    let e = a.allocate(max as usize + 1, 0, DEFAULT_ALIGNMENT).unwrap_err();
    assert!(matches!(e, Error::TooLarge { max: m, .. } if m <= max), "{e}");
    let ok = a.allocate(6 << 20, 0, DEFAULT_ALIGNMENT).unwrap();
    let mut back = [0u8; 4096];
    a.copy_device_to_host(&mut back, keep, 0).unwrap();
    assert_eq!(back, [7u8; 4096]);
    a.deallocate(ok, 0).unwrap();
    a.deallocate(keep, 0).unwrap();
}

#[test]
fn lowered_device_limits_refuse_big_buffers_up_front() {
    let limits = wgpu::Limits { max_buffer_size: 1 << 20, ..wgpu::Limits::downlevel_defaults() };
    let Some(a) = vulkan(WgpuOptions { required_limits: Some(limits), ..WgpuOptions::default() }) else {
        return;
    };
    let e = a.allocate((1 << 20) + 1, 0, DEFAULT_ALIGNMENT).unwrap_err();
    assert!(matches!(e, Error::TooLarge { max: 1048576, .. }), "{e}");
    let p = a.allocate(1 << 20, 0, DEFAULT_ALIGNMENT).unwrap();
    a.deallocate(p, 0).unwrap();
}

#[test]
fn cache_reuses_buffers_and_zeroed_allocation_clears_them() {
    let Some(a) = vulkan(WgpuOptions::default()) else { return };
    let p = a.allocate(5000, 0, DEFAULT_ALIGNMENT).unwrap();
    a.copy_host_to_device(p, &[0xAB; 5000], 0).unwrap();
    a.deallocate(p, 0).unwrap();
    let q = a.allocate(5000, 0, DEFAULT_ALIGNMENT).unwrap();
    let s = a.stats(0).unwrap();
    assert_eq!(s.cache_hits, 1, "{s:?}");
    assert_ne!(p, q, "a reused buffer must get a fresh address");
    a.deallocate(q, 0).unwrap();
    let z = a.allocate_zeroed(5000, 0, DEFAULT_ALIGNMENT).unwrap();
    assert_eq!(a.stats(0).unwrap().cache_hits, 2);
    let mut back = vec![1u8; 5000];
    a.copy_device_to_host(&mut back, z, 0).unwrap();
    assert!(back.iter().all(|&b| b == 0), "allocate_zeroed returned old bytes");
    a.deallocate(z, 0).unwrap();
    assert!(a.empty_cache() > 0);
    assert_eq!(a.stats(0).unwrap().reserved_bytes, 0);
}

#[test]
fn buffer_ranges_are_checked() {
    let Some(a) = vulkan(WgpuOptions::default()) else { return };
    let p = a.allocate(1024, 0, DEFAULT_ALIGNMENT).unwrap();
    let r = a.buffer(p.offset(256).unwrap(), 512, 0).unwrap();
    assert_eq!(r.range, 256..768);
    assert!(r.buffer.size() >= 1024);
    assert!(r.buffer.usage().contains(wgpu::BufferUsages::STORAGE));
    assert!(matches!(a.buffer(p.offset(600).unwrap(), 512, 0), Err(Error::OutOfBounds { .. })));
    assert!(matches!(a.buffer(DevicePtr::new(0x10), 4, 0), Err(Error::InvalidPointer { .. })));
    a.deallocate(p, 0).unwrap();
}

#[test]
fn adopting_an_apps_device() {
    let _ = env_logger::builder().is_test(true).try_init();
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::VULKAN;
    let instance = wgpu::Instance::new(desc);
    let Ok(adapter) = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions::default()))
    else {
        assert!(std::env::var("CI").is_err(), "no Vulkan adapter under CI");
        return;
    };
    let (device, queue) =
        pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor::default())).unwrap();
    let a = WgpuAllocator::from_device(device.clone(), queue.clone()).unwrap();
    assert_eq!(a.device_type(), devalloc::DeviceType::Vulkan);
    assert_eq!(a.route(0).unwrap(), Route::Staged, "no MAPPABLE_PRIMARY_BUFFERS asked for: staged");
    let p = a.allocate(64, 0, DEFAULT_ALIGNMENT).unwrap();
    // The app writes through its own queue into devalloc memory; devalloc reads it back.
    let r = a.buffer(p, 64, 0).unwrap();
    queue.write_buffer(&r.buffer, r.range.start, &[3u8; 64]);
    let mut back = [0u8; 64];
    a.copy_device_to_host(&mut back, p, 0).unwrap();
    assert_eq!(back, [3u8; 64]);
    a.deallocate(p, 0).unwrap();
}

#[test]
fn a_lost_device_turns_every_call_into_device_lost() {
    let Some(a) = vulkan(WgpuOptions::default()) else { return };
    let p = a.allocate(64, 0, DEFAULT_ALIGNMENT).unwrap();
    a.device(0).unwrap().destroy();
    let _ = a.device(0).unwrap().poll(wgpu::PollType::Poll);
    let e = a.copy_host_to_device(p, &[1u8; 64], 0).unwrap_err();
    assert!(matches!(e, Error::DeviceLost { .. }), "{e}");
    let mut back = [0u8; 64];
    assert!(matches!(a.copy_device_to_host(&mut back, p, 0), Err(Error::DeviceLost { .. })));
    assert!(matches!(a.allocate(64, 0, DEFAULT_ALIGNMENT), Err(Error::DeviceLost { .. })));
    // Bookkeeping still works: the pointer can be freed.
    a.deallocate(p, 0).unwrap();
}

#[test]
fn leaks_are_reported_on_drop() {
    let Some(a) = vulkan(WgpuOptions::default()) else { return };
    let _p = a.allocate_labeled(4096, 0, DEFAULT_ALIGNMENT, "kv-cache").unwrap();
    let report = a.report();
    assert!(report.contains("kv-cache") && report.contains("4096 bytes"), "{report}");
    drop(a); // logs "leak on vulkan:0: 4096 bytes ... (kv-cache)"
}
