//! The conformance suite on the wgpu allocator (Vulkan on lavapipe in CI, staged and direct
//! routes; GL on llvmpipe where available), and the wgpu allocator's own promises.

use crate::conformance;

use devalloc::wgpu::{BindingKind, Route, WgpuAllocator, WgpuOptions};
use devalloc::{
    Device, DeviceAllocator, DeviceAllocatorRegistry, DevicePtr, DeviceType, Error, HostAllocator,
    PoolOptions, DEFAULT_ALIGNMENT,
};

fn open(backend: wgpu::Backend, options: WgpuOptions) -> conformance::Made {
    conformance::ready(WgpuAllocator::with_options(backend, options))
}

/// Small staging chunks so that multi-chunk, pipelined copies happen at test sizes.
fn small_chunks(route: Option<Route>) -> WgpuOptions {
    WgpuOptions { staging_chunk: Some(64 << 10), route, ..WgpuOptions::default() }
}

fn vulkan_staged() -> conformance::Made {
    open(wgpu::Backend::Vulkan, small_chunks(Some(Route::Staged)))
}

fn vulkan_auto() -> conformance::Made {
    open(wgpu::Backend::Vulkan, small_chunks(None))
}

fn vulkan_uncached() -> conformance::Made {
    let pool = PoolOptions { caching: false, ..PoolOptions::default() };
    open(wgpu::Backend::Vulkan, WgpuOptions { pool, ..small_chunks(Some(Route::Staged)) })
}

fn gl() -> conformance::Made {
    open(wgpu::Backend::Gl, small_chunks(None))
}

/// A device whose largest buffer is 4 KiB (smaller than a staging chunk, or a small download
/// buffer), under a 64 KiB memory limit: for the model check.
fn vulkan_tiny() -> conformance::Made {
    let limits = wgpu::Limits { max_buffer_size: 4096, ..wgpu::Limits::downlevel_defaults() };
    let pool = PoolOptions { caching: true, memory_limit: Some(64 << 10), ..PoolOptions::default() };
    open(
        wgpu::Backend::Vulkan,
        WgpuOptions { required_limits: Some(limits), pool, ..small_chunks(Some(Route::Staged)) },
    )
}

fn gl_tiny() -> conformance::Made {
    let pool = PoolOptions { caching: true, memory_limit: Some(64 << 10), ..PoolOptions::default() };
    open(wgpu::Backend::Gl, WgpuOptions { pool, ..small_chunks(None) })
}

/// Vulkan (lavapipe) and GL (llvmpipe) are required under CI, skipped with a reason elsewhere.
mod vulkan_staged {
    use super::*;
    conformance_tests!(vulkan_staged, conformance::Need::InCi, conformance::Caching::On);

    #[test]
    fn model_check() {
        conformance::model::model_check(vulkan_staged, 16);
    }
}

mod vulkan_direct {
    use super::*;
    conformance_tests!(vulkan_auto, conformance::Need::InCi, conformance::Caching::On);

    #[test]
    fn model_check() {
        conformance::model::model_check(vulkan_auto, 16);
    }
}

mod vulkan_uncached {
    use super::*;
    conformance_tests!(vulkan_uncached, conformance::Need::InCi, conformance::Caching::Off);
}

mod vulkan_tiny {
    use super::*;

    #[test]
    fn model_check() {
        conformance::model::model_check(vulkan_tiny, 16);
    }
}

mod gl {
    use super::*;
    conformance_tests!(gl, conformance::Need::InCi, conformance::Caching::On);

    #[test]
    fn model_check() {
        conformance::model::model_check(gl_tiny, 12);
    }
}

/// An allocator of its own on Vulkan; `None`, saying so, where there is no Vulkan adapter (under
/// CI=true a failure).
pub(crate) fn vulkan(options: WgpuOptions) -> Option<WgpuAllocator> {
    backend(wgpu::Backend::Vulkan, options)
}

fn backend(backend: wgpu::Backend, options: WgpuOptions) -> Option<WgpuAllocator> {
    conformance::logging::init_for_tests();
    match WgpuAllocator::with_options(backend, options) {
        Ok(a) => Some(a),
        Err(e) if conformance::in_ci() => panic!("no {backend:?} adapter under CI: {e}"),
        Err(e) => {
            conformance::skip("a wgpu test", &format!("no {backend:?} adapter: {e}"));
            None
        }
    }
}

#[path = "wgpu_routes.rs"]
mod routes;

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn memory_limit_and_oversize_are_errors_and_the_allocator_survives() {
    let pool = PoolOptions { caching: true, memory_limit: Some(8 << 20), ..PoolOptions::default() };
    let Some(a) = vulkan(WgpuOptions { pool, ..WgpuOptions::default() }) else {
        return;
    };
    let max = a.max_allocation(0).unwrap();
    let keep = a.allocate(4 << 20, 0, DEFAULT_ALIGNMENT).unwrap();
    a.copy_host_to_device(keep, &[7u8; 4096], 0).unwrap();
    let e = a.allocate(6 << 20, 0, DEFAULT_ALIGNMENT).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    let e = a.allocate(16 << 20, 0, DEFAULT_ALIGNMENT).unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    a.set_memory_limit(None, 0).unwrap();
    let e = a.allocate(max as usize + 1, 0, DEFAULT_ALIGNMENT).unwrap_err();
    assert!(matches!(e, Error::TooLarge { max: m, .. } if m == max), "{e}");
    let ok = a.allocate(6 << 20, 0, DEFAULT_ALIGNMENT).unwrap();
    let mut back = [0u8; 4096];
    a.copy_device_to_host(&mut back, keep, 0).unwrap();
    assert_eq!(back, [7u8; 4096]);
    a.deallocate(ok, 0).unwrap();
    a.deallocate(keep, 0).unwrap();
}

/// With software adapters refused, a machine that has only software ones (lavapipe here) is
/// `NotFound` that names them and the option, not "is a driver installed?".
#[test]
fn refusing_software_adapters_where_there_are_only_software_ones_says_so() {
    let Some(a) = vulkan(WgpuOptions::default()) else { return };
    let software = a.device(0).unwrap().adapter_info().device_type == wgpu::DeviceType::Cpu;
    drop(a);
    let options = WgpuOptions { allow_software: false, ..WgpuOptions::default() };
    match WgpuAllocator::with_options(wgpu::Backend::Vulkan, options) {
        Err(e) if software => {
            let m = e.to_string();
            assert!(matches!(e, Error::NotFound { .. }), "{e}");
            assert!(m.contains("only software ones") && m.contains("allow_software"), "{m}");
            assert!(!m.contains("driver installed"), "{m}");
        }
        Err(e) => panic!("a hardware adapter was refused: {e}"),
        Ok(_) if software => panic!("a software adapter was opened with allow_software: false"),
        // A hardware adapter: nothing refused, nothing to check.
        Ok(_) => {}
    }
}

/// A device opened with a lower buffer limit serves a larger allocation as several buffers (its
/// segments), and refuses up front only what no segmentation serves, naming that limit.
#[test]
fn lowered_device_limits_serve_bigger_allocations_in_segments() {
    let limits = wgpu::Limits { max_buffer_size: 1 << 20, ..wgpu::Limits::downlevel_defaults() };
    let Some(a) = vulkan(WgpuOptions { required_limits: Some(limits), ..WgpuOptions::default() }) else {
        return;
    };
    let n = (3 << 20) + 12;
    let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
    let data = pattern(n, 9);
    a.copy_host_to_device(p, &data, 0).unwrap();
    let mut back = vec![0u8; n];
    a.copy_device_to_host(&mut back, p, 0).unwrap();
    assert!(back == data, "a segmented allocation's bytes did not round-trip");
    let parts = a.segments(p, n as u64, 0).unwrap();
    assert_eq!(parts.len(), 4, "3 MiB + 12 bytes over 1 MiB buffers: {parts:?}");
    assert!(parts.iter().all(|r| r.buffer.size() <= 1 << 20));
    let max = a.max_allocation(0).unwrap();
    let e = a.allocate(max as usize + 4, 0, DEFAULT_ALIGNMENT).unwrap_err();
    assert!(matches!(e, Error::TooLarge { max: m, .. } if m == max), "{e}");
    a.deallocate(p, 0).unwrap();
}

/// Compute where the device has it (Vulkan, llvmpipe's GL 4.5), and not on a device whose
/// limits leave it out (WebGL2's, as a browser app on WebGL2 gets).
#[test]
fn supports_compute_follows_the_devices_limits() {
    for b in [wgpu::Backend::Vulkan, wgpu::Backend::Gl] {
        let Some(full) = backend(b, WgpuOptions::default()) else { continue };
        assert!(full.supports_compute(0).unwrap(), "{b:?}");
        let limits = wgpu::Limits::downlevel_webgl2_defaults();
        let Some(webgl2) =
            backend(b, WgpuOptions { required_limits: Some(limits), ..WgpuOptions::default() })
        else {
            continue;
        };
        assert!(!webgl2.supports_compute(0).unwrap(), "{b:?} with WebGL2's limits");
    }
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
    let r = a.buffer_range(p.offset(256).unwrap(), 512, 0).unwrap();
    assert_eq!(r.range, 256..768);
    assert!(r.buffer.size() >= 1024);
    assert!(r.buffer.usage().contains(wgpu::BufferUsages::STORAGE));
    assert_eq!(a.buffer(p.offset(256).unwrap(), 0).unwrap().range, 256..1024, "to the end of the allocation");
    assert!(matches!(a.buffer_range(p.offset(600).unwrap(), 512, 0), Err(Error::OutOfBounds { .. })));
    assert!(matches!(a.buffer_range(DevicePtr::new(0x10), 4, 0), Err(Error::InvalidPointer { .. })));
    a.deallocate(p, 0).unwrap();
}

#[test]
fn an_empty_binding_is_an_error_not_the_rest_of_the_buffer() {
    let Some(a) = vulkan(WgpuOptions::default()) else { return };
    let p = a.allocate(1024, 0, DEFAULT_ALIGNMENT).unwrap();
    let r = a.buffer_range(p, 0, 0).unwrap();
    let e = r.binding(BindingKind::Storage).unwrap_err();
    assert!(e.to_string().contains("at least one byte"), "{e}");
    assert!(r.slice().is_err());
    a.deallocate(p, 0).unwrap();
}

#[test]
fn mapping_an_out_of_range_or_unaligned_range_is_an_error_not_a_panic() {
    let Some(a) = vulkan(WgpuOptions::default()) else { return };
    let device = a.device(0).unwrap();
    let usage = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
    let b = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 64,
        usage,
        mapped_at_creation: false,
    });
    for (start, end) in [(0, 68), (64, 72), (0, u64::MAX), (4, 12), (0, 6), (8, 8), (16, 8)] {
        let range = start..end;
        let r = pollster::block_on(a.map_buffer_async(&b, wgpu::MapMode::Read, range.clone(), 0));
        assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{range:?}: {r:?}");
    }
    let r = pollster::block_on(a.map_buffer_async(&b, wgpu::MapMode::Write, 0..8, 0));
    assert!(r.unwrap_err().to_string().contains("MAP_WRITE"));
    pollster::block_on(a.map_buffer_async(&b, wgpu::MapMode::Read, 8..64, 0)).unwrap();
    b.unmap();
}

#[test]
fn staged_reads_work_on_a_device_whose_largest_buffer_is_under_a_staging_chunk() {
    for max in [4096u64, 1000] {
        let limits = wgpu::Limits { max_buffer_size: max, ..wgpu::Limits::downlevel_defaults() };
        let options = WgpuOptions {
            required_limits: Some(limits),
            route: Some(Route::Staged),
            ..WgpuOptions::default()
        };
        let Some(a) = vulkan(options) else { return };
        let n = max as usize & !3;
        let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
        let data: Vec<u8> = (0..n).map(|i| (i * 7) as u8).collect();
        a.copy_host_to_device(p, &data, 0).unwrap();
        let mut back = vec![0u8; n];
        a.copy_device_to_host(&mut back, p, 0).unwrap();
        assert!(back == data, "max_buffer_size {max}");
        a.copy_device_to_host(&mut back[..3], p.offset(5).unwrap(), 0).unwrap();
        assert_eq!(back[..3], data[5..8]);
        a.deallocate(p, 0).unwrap();
    }
}

/// A request the size of the device's largest buffer is one buffer, though its 512-byte class
/// would not fit (the limit here is a multiple of the binding alignment, 256, not of 512).
#[test]
fn a_request_that_fits_the_device_exactly_is_allocated_with_caching_on() {
    let limits = wgpu::Limits { max_buffer_size: 1_000_192, ..wgpu::Limits::downlevel_defaults() };
    let Some(a) = vulkan(WgpuOptions { required_limits: Some(limits), ..WgpuOptions::default() }) else {
        return;
    };
    let p = a.allocate(1_000_192, 0, DEFAULT_ALIGNMENT).expect("the device's largest buffer fits");
    assert_eq!(a.segments(p, 1_000_192, 0).unwrap().len(), 1, "one buffer, not segments");
    a.deallocate(p, 0).unwrap();
    let max = a.max_allocation(0).unwrap() as usize;
    assert!(matches!(a.allocate(max + 1, 0, DEFAULT_ALIGNMENT), Err(Error::TooLarge { .. })));
}

#[test]
fn a_huge_alignment_is_refused_without_moving_the_stats() {
    let Some(a) = vulkan(WgpuOptions::default()) else { return };
    let before = a.stats(0).unwrap();
    let e = a.allocate(8, 0, 1 << 62).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert_eq!(a.stats(0).unwrap(), before, "a refused allocation counted a miss or a peak");
}

#[test]
fn a_registry_copy_into_a_too_small_gpu_allocation_writes_nothing() {
    let Some(vk) = vulkan(WgpuOptions::default()) else { return };
    let vk: &'static WgpuAllocator = Box::leak(Box::new(vk));
    let host: &'static HostAllocator = Box::leak(Box::new(HostAllocator::new()));
    let registry = DeviceAllocatorRegistry::new();
    registry.register_allocator(host).unwrap();
    registry.register_allocator(vk).unwrap();
    let mib = 1 << 20;
    let src = host.allocate(8 * mib, 0, 256).unwrap();
    host.copy_host_to_device(src, &vec![9u8; 8 * mib], 0).unwrap();
    let dst = vk.allocate(6 * mib, 0, 256).unwrap();
    vk.copy_host_to_device(dst, &vec![1u8; 6 * mib], 0).unwrap();
    let (cpu, gpu) = (Device::new(DeviceType::Cpu, 0), Device::new(DeviceType::Vulkan, 0));
    assert!(matches!(registry.copy(gpu, dst, cpu, src, 8 * mib), Err(Error::OutOfBounds { .. })));
    assert!(matches!(
        pollster::block_on(registry.copy_async(gpu, dst, cpu, src, 8 * mib)),
        Err(Error::OutOfBounds { .. })
    ));
    let mut back = vec![0u8; 6 * mib];
    vk.copy_device_to_host(&mut back, dst, 0).unwrap();
    assert!(back.iter().all(|&b| b == 1), "the first chunk was written before the range was checked");
    assert_eq!(registry.get::<WgpuAllocator>(DeviceType::Vulkan).map(|a| a.route(0).is_ok()), Some(true));
    assert!(registry.get::<HostAllocator>(DeviceType::Vulkan).is_none());
}

/// `report()` names what is live (the drop-time leak report itself is checked, from the log,
/// by `contract::leak_report`).
#[test]
fn a_report_names_live_allocations() {
    let Some(a) = vulkan(WgpuOptions::default()) else { return };
    let _p = a.allocate_labeled(4096, 0, DEFAULT_ALIGNMENT, "kv-cache").unwrap();
    let report = a.report();
    assert!(report.contains("kv-cache") && report.contains("4096 bytes"), "{report}");
}

#[test]
fn a_burst_of_large_copies_leaves_staging_within_its_budget() {
    let budget = 256 << 10;
    let options = WgpuOptions {
        staging_chunk: Some(64 << 10),
        staging_budget: Some(budget),
        route: Some(Route::Staged),
        ..WgpuOptions::default()
    };
    for backend in [wgpu::Backend::Vulkan, wgpu::Backend::Gl] {
        let Some(a) = self::backend(backend, options.clone()) else { continue };
        let n = 3 << 20; // 48 chunks each way, from four threads at once
        let ptrs: Vec<DevicePtr> = (0..4).map(|_| a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap()).collect();
        std::thread::scope(|s| {
            for (t, &p) in ptrs.iter().enumerate() {
                let a = &a;
                s.spawn(move || {
                    let data = pattern(n, t as u8);
                    for _ in 0..3 {
                        a.copy_host_to_device(p, &data, 0).unwrap();
                        let mut back = vec![0u8; n];
                        a.copy_device_to_host(&mut back, p, 0).unwrap();
                        assert!(back == data, "{backend:?}: thread {t}");
                    }
                });
            }
        });
        a.synchronize(0).unwrap();
        let s = a.stats(0).unwrap();
        assert!(s.staging_bytes > 0, "{backend:?}: no staging is kept at all: {s:?}");
        assert!(
            s.staging_bytes <= budget,
            "{backend:?}: {} bytes of staging held, budget {budget}",
            s.staging_bytes
        );
        // A single large upload stays within the budget plus the chunk in hand.
        let before = s.staging_bytes;
        a.copy_host_to_device(ptrs[0], &pattern(n, 9), 0).unwrap();
        let during = a.stats(0).unwrap().staging_bytes;
        assert!(
            during <= budget + (64 << 10),
            "{backend:?}: {during} bytes after one large upload (before: {before})"
        );
        for p in ptrs {
            a.deallocate(p, 0).unwrap();
        }
    }
}
