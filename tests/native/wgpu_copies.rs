//! wgpu copies under hostile use, on every backend and route the machine has: async copies
//! give their executor back once per staging chunk (small uploads and copies between device
//! types included), async copies dropped at any poll or in flight when the device is destroyed
//! leave nothing behind, copies within one allocation are memmove, zeroed allocations from the
//! cache hold zeros at any size, and bad buffer requests change nothing.

use std::task::Poll;
use std::time::Duration;

use devalloc::wgpu::{BufferRequest, Route, WgpuAllocator, WgpuOptions};
use devalloc::{
    Device, DeviceAllocator, DeviceAllocatorRegistry, DeviceType, Error, HostAllocator, DEFAULT_ALIGNMENT,
};

use crate::conformance::{pattern, polls_until_ready};
use crate::util::{poll_once, poll_some, within};
use crate::wgpu_app::{app_device, app_device_mappable, BACKENDS};
use crate::wgpu_hostile::{adopt, configs, heard, on_route};

const CHUNK: u64 = 64 << 10;

/// What [`polls_until_ready`] does between two polls here: waits until `device` has finished
/// everything asked of it, so that a copy that does not yield per chunk would finish in one poll.
fn idle(device: &wgpu::Device) -> impl FnMut() + '_ {
    move || {
        device.poll(wgpu::PollType::wait_indefinitely()).expect("waiting for the device");
    }
}

/// A 1 MiB upload with 64 KiB staging chunks is 16 chunks: it is `Pending` at least 15 times on
/// every route (the staged route once wrote uploads up to 1 MiB through the queue in one poll,
/// whatever the chunk).
#[test]
fn a_one_mib_upload_with_64k_chunks_yields_per_chunk() {
    let mut short = Vec::new();
    for (backend, route) in configs() {
        let Some((device, _q, a, _w)) = adopt(backend, route, Some(CHUNK)) else { continue };
        let n = 1 << 20;
        let data = pattern(n, 5);
        let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
        let (r, polls) = polls_until_ready(a.copy_host_to_device_async(p, &data, 0), idle(&device));
        r.unwrap();
        let mut back = vec![0u8; n];
        a.copy_device_to_host(&mut back, p, 0).unwrap();
        assert!(back == data, "{backend:?} {route:?}: the upload differs");
        if polls < 15 {
            short.push(format!(
                "{backend:?} {route:?}: a 1 MiB upload in 64 KiB chunks was Pending {polls} times"
            ));
        }
    }
    assert!(short.is_empty(), "{short:#?}");
}

/// Through the registry, host memory to Vulkan and back, 1 MiB in 64 KiB chunks: each way is
/// `Pending` at least 15 times, and the registry still gives the allocator back as its type.
#[test]
fn cross_device_async_copies_yield_per_chunk() {
    let options =
        WgpuOptions { route: Some(Route::Staged), staging_chunk: Some(CHUNK), ..WgpuOptions::default() };
    let Some(gpu) = crate::wgpu::vulkan(options) else { return };
    let registry = DeviceAllocatorRegistry::new();
    let host: &'static HostAllocator = Box::leak(Box::new(HostAllocator::new()));
    let gpu: &'static WgpuAllocator = Box::leak(Box::new(gpu));
    registry.register_allocator(host).unwrap();
    registry.register_allocator(gpu).unwrap();
    assert!(registry.get::<WgpuAllocator>(DeviceType::Vulkan).is_some(), "the concrete type was lost");
    let n = 1 << 20;
    let data = pattern(n, 3);
    let h = host.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
    host.copy_host_to_device(h, &data, 0).unwrap();
    let g = gpu.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
    let (cpu, vk) = (Device::new(DeviceType::Cpu, 0), Device::new(DeviceType::Vulkan, 0));
    let device = gpu.device(0).unwrap();
    let (r, up) = polls_until_ready(registry.copy_async(vk, g, cpu, h, n), idle(device));
    r.unwrap();
    let mut back = vec![0u8; n];
    gpu.copy_device_to_host(&mut back, g, 0).unwrap();
    assert!(back == data, "host -> vulkan differs");
    host.copy_host_to_device(h, &vec![0u8; n], 0).unwrap();
    let (r, down) = polls_until_ready(registry.copy_async(cpu, h, vk, g, n), idle(device));
    r.unwrap();
    host.copy_device_to_host(&mut back, h, 0).unwrap();
    assert!(back == data, "vulkan -> host differs");
    assert!(up >= 15 && down >= 15, "1 MiB in 64 KiB chunks: host -> vulkan Pending {up} times, back {down}");
    gpu.deallocate(g, 0).unwrap();
    host.deallocate(h, 0).unwrap();
}

/// Multi-chunk async copies (upload, download, ragged and aligned copies between allocations)
/// dropped after 0, 1, ... 23 polls: afterwards blocking copies of the same memory work at once
/// (no lock left held, no map left pending) with the right data, the device is not lost, and
/// staging goes back within its budget.
#[test]
fn dropping_async_copies_at_any_poll_leaves_everything_usable() {
    for (backend, route) in configs() {
        let Some((_device, _queue, a, watch)) = adopt(backend, route, Some(CHUNK)) else { continue };
        let what = format!("{backend:?} {route:?}");
        let a: &'static WgpuAllocator = Box::leak(Box::new(a));
        let n = 2 << 20;
        let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
        let q = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
        let data = pattern(n, 4);
        for k in 0..24 {
            let d = data.clone();
            let r = within(30, move || {
                let mut back = vec![0u8; n];
                let _ = poll_some(a.copy_host_to_device_async(p, &d, 0), k);
                let _ = poll_some(a.copy_device_to_host_async(&mut back, p, 0), k);
                let ragged =
                    a.copy_device_to_device_async(q.offset(1).unwrap(), 0, p.offset(2).unwrap(), 0, n - 4);
                let _ = poll_some(ragged, k);
                let _ = poll_some(a.copy_host_to_device_async(p.offset(3).unwrap(), &d[..n - 3], 0), k);
                // Everything usable at once, blocking.
                a.copy_host_to_device(p, &d, 0)?;
                a.copy_device_to_host(&mut back, p, 0)?;
                assert!(back == d, "after drops at poll {k}: wrong data");
                a.copy_device_to_device(q, 0, p, 0, n)?;
                a.copy_device_to_host(&mut back, q, 0)?;
                assert!(back == d, "after drops at poll {k}: wrong data in the copy");
                a.synchronize(0)
            });
            let r = r.unwrap_or_else(|| panic!("{what}: blocking calls hang after drops at poll {k}"));
            r.unwrap_or_else(|e| panic!("{what}: after drops at poll {k}: {e}"));
        }
        let s = a.stats(0).unwrap();
        assert!(
            s.staging_bytes <= 8 * CHUNK,
            "{what}: staging {} past its budget once idle",
            s.staging_bytes
        );
        let (fired, errors) = heard(&watch);
        assert_eq!(fired, 0, "{what}: reported lost");
        assert!(errors.is_empty(), "{what}: {errors:?}");
    }
}

/// Hand-polled async copies (a waker that does nothing) in flight when the app destroys its
/// device: polled on, each ends in `Ok` or `DeviceLost`, never a hang, and nothing of devalloc's
/// reaches the app's error handler.
#[test]
fn hand_polled_copies_in_flight_at_destroy_end() {
    for (backend, route) in configs() {
        let Some((device, _queue, a, watch)) = adopt(backend, route, Some(CHUNK)) else { continue };
        let what = format!("{backend:?} {route:?}");
        let a: &'static WgpuAllocator = Box::leak(Box::new(a));
        let n = 4 << 20;
        let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
        let q = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
        a.copy_host_to_device(p, &pattern(n, 1), 0).unwrap();
        let dev = device.clone();
        let r = within(60, move || {
            let data: &'static [u8] = Box::leak(pattern(n, 2).into_boxed_slice());
            let back: &'static mut [u8] = Box::leak(vec![0u8; n].into_boxed_slice());
            let mut futs: Vec<devalloc::BoxFuture<'static, devalloc::Result<()>>> = vec![
                a.copy_host_to_device_async(q, data, 0),
                a.copy_device_to_host_async(back, p, 0),
                a.copy_device_to_device_async(q.offset(1).unwrap(), 0, p.offset(3).unwrap(), 0, n - 8),
                a.copy_device_to_device_async(q, 0, p, 0, n),
            ];
            let mut out: Vec<Option<devalloc::Result<()>>> = vec![None, None, None, None];
            let mut rounds = 0;
            while out.iter().any(Option::is_none) {
                rounds += 1;
                if rounds == 3 {
                    dev.destroy();
                }
                for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
                    if o.is_none() {
                        if let Poll::Ready(v) = poll_once(f.as_mut()) {
                            *o = Some(v);
                        }
                    }
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            out.into_iter().map(Option::unwrap).collect::<Vec<_>>()
        });
        let results = r.unwrap_or_else(|| panic!("{what}: async copies in flight at destroy() never ended"));
        for r in &results {
            assert!(matches!(r, Ok(()) | Err(Error::DeviceLost { .. })), "{what}: {r:?}");
        }
        let _ = device.poll(wgpu::PollType::Poll);
        let errors = heard(&watch).1;
        assert!(errors.is_empty(), "{what}: devalloc's errors reached the app: {errors:?}");
        a.deallocate(p, 0).unwrap();
        a.deallocate(q, 0).unwrap();
    }
}

/// memmove within one allocation of 9 MiB (past the 4 MiB host bounce and many staging chunks),
/// blocking and async: overlapping by one byte (ragged) and by four (aligned: wgpu refuses a
/// buffer-to-buffer copy within one buffer), forwards and backwards, and far apart.
#[test]
fn overlapping_copies_within_one_allocation_are_memmove() {
    for (backend, route) in configs() {
        let Some((_d, _q, a, _w)) = adopt(backend, route, Some(CHUNK)) else { continue };
        let what = format!("{backend:?} {route:?}");
        let n = 9 << 20;
        let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
        let cases =
            [(0usize, 1usize, n - 1), (1, 0, n - 1), (0, 4, n - 4), (4, 0, n - 4), (3, 5 << 20, 4 << 20)];
        for (k, (so, d_o, len)) in cases.into_iter().enumerate() {
            for asynchronous in [false, true] {
                let mut model = pattern(n, k as u64 + 11);
                a.copy_host_to_device(p, &model, 0).unwrap();
                let (dst, src) = (p.offset(d_o).unwrap(), p.offset(so).unwrap());
                let r = if asynchronous {
                    pollster::block_on(a.copy_device_to_device_async(dst, 0, src, 0, len))
                } else {
                    a.copy_device_to_device(dst, 0, src, 0, len)
                };
                r.unwrap_or_else(|e| panic!("{what}: {e}"));
                model.copy_within(so..so + len, d_o);
                let mut back = vec![0u8; n];
                a.copy_device_to_host(&mut back, p, 0).unwrap();
                if back != model {
                    let at = back.iter().zip(&model).position(|(x, y)| x != y);
                    panic!("{what}: copy {so} -> {d_o} of {len} (async {asynchronous}): differs at {at:?}");
                }
            }
        }
        a.deallocate(p, 0).unwrap();
    }
}

/// A zeroed allocation served from the cache reads as zeros, at ragged sizes too.
#[test]
fn zeroed_allocations_from_the_cache_read_as_zeros() {
    for (backend, route) in configs() {
        let Some((_d, _q, a, _w)) = adopt(backend, route, None) else { continue };
        let what = format!("{backend:?} {route:?}");
        for n in [1usize, 3, 255, 4096, 100_001] {
            let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
            a.copy_host_to_device(p, &vec![0xAB; n], 0).unwrap();
            a.deallocate(p, 0).unwrap();
            let hits = a.stats(0).unwrap().cache_hits;
            let q = a.allocate_zeroed(n, 0, DEFAULT_ALIGNMENT).unwrap();
            assert_eq!(a.stats(0).unwrap().cache_hits, hits + 1, "{what}: {n} bytes not from the cache");
            let mut back = vec![1u8; n];
            a.copy_device_to_host(&mut back, q, 0).unwrap();
            assert!(back.iter().all(|&b| b == 0), "{what}: a zeroed allocation of {n} bytes holds old bytes");
            a.deallocate(q, 0).unwrap();
        }
    }
}

/// Bad buffer requests (size 0, a bad or huge alignment, a usage devalloc cannot serve, a size
/// past everything, a device that is not there) are refused and change nothing.
#[test]
fn bad_requests_change_nothing() {
    let Some((_d, _q, a, _w)) = adopt(wgpu::Backend::Vulkan, Route::Staged, None) else { return };
    let before = a.stats(0).unwrap();
    for r in [
        BufferRequest::new(0),
        BufferRequest::new(16).alignment(0),
        BufferRequest::new(16).alignment(3),
        BufferRequest::new(16).usage(wgpu::BufferUsages::MAP_WRITE),
        BufferRequest::new(usize::MAX),
        BufferRequest::new(16).alignment(1 << 62),
    ] {
        let e = a.allocate_request(&r, 0).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. } | Error::TooLarge { .. }), "{r:?}: {e}");
    }
    assert!(matches!(a.allocate_request(&BufferRequest::new(16), 1), Err(Error::NoSuchDevice { .. })));
    assert_eq!(a.stats(0).unwrap(), before);
}

#[test]
fn an_async_download_returns_pending_and_its_data_arrive() {
    for backend in BACKENDS {
        for route in [Some(Route::Staged), None] {
            let Some((device, queue)) = app_device(backend) else { continue };
            let a = WgpuAllocator::from_device_with_options(
                device,
                queue,
                WgpuOptions { route, ..WgpuOptions::default() },
            )
            .unwrap();
            let n = 64 << 20;
            let data = pattern(n, 77);
            let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
            a.copy_host_to_device(p, &data, 0).unwrap();
            let mut back = vec![0u8; n];
            {
                let mut fut = std::pin::pin!(a.copy_device_to_host_async(&mut back, p, 0));
                let first = poll_once(fut.as_mut());
                assert!(first.is_pending(), "{backend:?} {route:?}: the first poll did the whole download");
                pollster::block_on(fut).unwrap();
            }
            assert!(back == data, "{backend:?} {route:?}: the data differ");
            a.deallocate(p, 0).unwrap();
        }
    }
}

/// No async copy does more than one chunk of work per poll, even where the device has finished
/// everything by the next poll (as lavapipe has): with 1 MiB staging chunks, 16 MiB uploads,
/// downloads and ragged copies (through the host) return `Pending` at least 15 times, on both
/// routes, Vulkan and GL, and every byte arrives.
#[test]
fn an_async_copy_does_at_most_one_chunk_of_work_per_poll() {
    for backend in BACKENDS {
        for route in [Route::Staged, Route::Direct] {
            let Some((device, queue)) = app_device_mappable(backend) else { continue };
            let options =
                WgpuOptions { route: Some(route), staging_chunk: Some(1 << 20), ..WgpuOptions::default() };
            let made = WgpuAllocator::from_device_with_options(device.clone(), queue, options);
            let Some(a) = on_route(backend, route, made) else { continue };
            let what = format!("{backend:?} {route:?}");
            let n = 16 << 20;
            let data = pattern(n, 21);
            let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
            let q = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
            let (r, polls) = polls_until_ready(a.copy_host_to_device_async(p, &data, 0), idle(&device));
            r.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(polls >= 15, "{what}: a 16 MiB upload was Pending only {polls} times");
            let mut back = vec![0u8; n];
            let (r, polls) = polls_until_ready(a.copy_device_to_host_async(&mut back, p, 0), idle(&device));
            r.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(polls >= 15, "{what}: a 16 MiB download was Pending only {polls} times");
            assert!(back == data, "{what}: the download differs");
            let ragged =
                a.copy_device_to_device_async(q.offset(1).unwrap(), 0, p.offset(3).unwrap(), 0, n - 8);
            let (r, polls) = polls_until_ready(ragged, idle(&device));
            r.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(polls >= 15, "{what}: a 16 MiB ragged copy was Pending only {polls} times");
            a.copy_device_to_host(&mut back[..n - 8], q.offset(1).unwrap(), 0).unwrap();
            assert!(back[..n - 8] == data[3..n - 5], "{what}: the ragged copy differs");
        }
    }
}

#[test]
fn a_dropped_async_copy_leaves_the_buffer_usable_on_every_route() {
    for backend in BACKENDS {
        for route in [None, Some(Route::Staged)] {
            let Some((device, queue)) = app_device_mappable(backend) else { continue };
            let a = WgpuAllocator::from_device_with_options(
                device,
                queue,
                WgpuOptions { route, ..WgpuOptions::default() },
            )
            .unwrap();
            let what = format!("{backend:?} {:?}", a.route(0).unwrap());
            let p = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
            let q = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
            a.copy_host_to_device(p, &[5u8; 4096], 0).unwrap();
            let mut buf = vec![0u8; 4096];
            {
                let mut f = a.copy_device_to_host_async(&mut buf, p, 0);
                let _ = poll_once(f.as_mut());
            }
            {
                let data = [6u8; 4096];
                let mut f = a.copy_host_to_device_async(q, &data, 0);
                let _ = poll_once(f.as_mut());
            }
            {
                let mut f =
                    a.copy_device_to_device_async(q.offset(1).unwrap(), 0, p.offset(3).unwrap(), 0, 100);
                let _ = poll_once(f.as_mut());
            }
            a.synchronize(0).unwrap();
            a.copy_host_to_device(p, &[7u8; 4096], 0).unwrap_or_else(|e| panic!("{what}: {e}"));
            a.copy_device_to_host(&mut buf, p, 0).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(buf, vec![7u8; 4096], "{what}");
            a.copy_device_to_device(q, 0, p, 0, 4096).unwrap_or_else(|e| panic!("{what}: {e}"));
            a.deallocate(p, 0).unwrap();
            let r = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap(); // the cached buffer
            a.copy_host_to_device(r, &[8u8; 4096], 0)
                .unwrap_or_else(|e| panic!("{what}: the next allocation inherited it: {e}"));
        }
    }
}
