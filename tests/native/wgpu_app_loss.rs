//! A wgpu app's device lost or destroyed under devalloc: every call of every allocator on it
//! is `DeviceLost` (the first one, work queued at the time, copies in flight, range checks and
//! bindings), the app hears of it once through its own handler, its own buffers and lost
//! callback stay its own, and a panic inside wgpu is a loss only once the device is invalid.
//! Each test runs on Vulkan (lavapipe) and GL (llvmpipe); under CI=true a missing adapter fails.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use devalloc::wgpu::{BindingKind, BufferRequest, Route, WgpuAllocator, WgpuOptions};
use devalloc::{DeviceAllocator, Error, PoolOptions, DEFAULT_ALIGNMENT};

use crate::util::poll_once;
use crate::wgpu_app::{adopt_watched, app_device, app_device_mappable, counter, Watched, BACKENDS};
use crate::wgpu_hostile::{no_direct_route, on_route};

#[test]
fn every_call_after_destroy_is_device_lost_for_every_allocator_and_the_app_hears_once() {
    for backend in BACKENDS {
        let Some((device, queue)) = app_device(backend) else { continue };
        let (fired, fired_count) = counter();
        let reasons = Arc::new(Mutex::new(Vec::new()));
        let r2 = Arc::clone(&reasons);
        let on_lost: devalloc::wgpu::DeviceLostHandler = Arc::new(move |reason, msg: &str| {
            fired.fetch_add(1, Ordering::SeqCst);
            r2.lock().unwrap().push(format!("{reason:?}: {msg}"));
        });
        let options = WgpuOptions { on_device_lost: Some(on_lost), ..WgpuOptions::default() };
        let first = WgpuAllocator::from_device_with_options(device.clone(), queue.clone(), options).unwrap();
        let second = WgpuAllocator::from_device(device.clone(), queue.clone()).unwrap();
        let again = WgpuOptions { on_device_lost: Some(Arc::new(|_, _: &str| {})), ..WgpuOptions::default() };
        let e = WgpuAllocator::from_device_with_options(device.clone(), queue.clone(), again).err().unwrap();
        assert!(e.to_string().contains("give it once"), "{e}");
        let p1 = first.allocate(256, 0, DEFAULT_ALIGNMENT).unwrap();
        let p2 = second.allocate(256, 0, DEFAULT_ALIGNMENT).unwrap();
        let q2 = second.allocate(256, 0, DEFAULT_ALIGNMENT).unwrap();
        device.destroy(); // no poll in between
        for (name, a, p, q) in [("first", &first, p1, p1), ("second", &second, p2, q2)] {
            let lost = |what: &str, r: devalloc::Result<()>| {
                assert!(matches!(r, Err(Error::DeviceLost { .. })), "{backend:?} {name}: {what}: {r:?}")
            };
            lost("allocate", a.allocate(64, 0, DEFAULT_ALIGNMENT).map(drop));
            lost("allocate_zeroed", a.allocate_zeroed(64, 0, DEFAULT_ALIGNMENT).map(drop));
            lost("allocate_with", a.allocate_request(&BufferRequest::new(64).label("x"), 0).map(drop));
            lost("init_buffer", a.init_buffer(9, 64, 0).map(drop));
            lost("aligned write", a.copy_host_to_device(p, &[1u8; 64], 0));
            lost("ragged write", a.copy_host_to_device(p.offset(1).unwrap(), &[1u8; 3], 0));
            lost("read", a.copy_device_to_host(&mut [0u8; 64], p, 0));
            lost("async read", pollster::block_on(a.copy_device_to_host_async(&mut [0u8; 64], p, 0)));
            lost("d2d", a.copy_device_to_device(q, 0, p, 0, 64));
            lost("synchronize", a.synchronize(0));
            lost("synchronize_async", pollster::block_on(a.synchronize_async(0)));
            // Bookkeeping still works: pointers can be freed.
            a.deallocate(p, 0).unwrap();
        }
        second.deallocate(q2, 0).unwrap();
        assert_eq!(fired_count(), 1, "{backend:?}: the app's on_device_lost fired {} times", fired_count());
        assert!(reasons.lock().unwrap()[0].starts_with("Destroyed"), "{:?}", reasons.lock().unwrap());
    }
}

#[test]
fn synchronize_as_the_first_call_after_destroy_is_device_lost() {
    for backend in BACKENDS {
        let Some((device, queue)) = app_device(backend) else { continue };
        let a = WgpuAllocator::from_device(device.clone(), queue).unwrap();
        device.destroy();
        let r = a.synchronize(0);
        assert!(matches!(r, Err(Error::DeviceLost { .. })), "{backend:?}: {r:?}");
    }
}

/// Uploads skip the poll other calls make up front (they notice a loss through wgpu's refusal
/// instead), and direct-route maps of a buffer the app was never given run without an error
/// scope: as the very first call after `destroy()`, on both routes, small and chunked, with and
/// without work still queued, an upload must still say DeviceLost, the app hear of it once,
/// and no error reach the app's uncaptured-error handler.
#[test]
fn an_upload_as_the_first_call_after_destroy_is_device_lost() {
    for backend in BACKENDS {
        for route in [Route::Staged, Route::Direct] {
            for (size, queued) in [(4usize, false), (4096, true), (64 << 10, false), (3 << 20, true)] {
                let Some((device, queue, a, watch)) = adopt_watched(backend, route) else { continue };
                let p = a.allocate(size, 0, DEFAULT_ALIGNMENT).unwrap();
                if queued {
                    // The app's own work, still in the queue when it destroys the device.
                    let b = device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("app work"),
                        size: 1 << 20,
                        usage: wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    });
                    let mut enc = device.create_command_encoder(&Default::default());
                    enc.clear_buffer(&b, 0, None);
                    queue.submit([enc.finish()]);
                }
                device.destroy();
                let r = a.copy_host_to_device(p, &vec![7u8; size], 0);
                let what = format!("{backend:?} {route:?} {size} bytes, work queued: {queued}");
                assert!(matches!(r, Err(Error::DeviceLost { .. })), "{what}: {r:?}");
                a.deallocate(p, 0).unwrap();
                let _ = device.poll(wgpu::PollType::Poll);
                watch.heard_once(&what);
            }
        }
    }
}

/// The app destroys its device with heavy work still queued: wgpu marks the device invalid at
/// once but reports the loss only once that work is done. Every devalloc call that needs an
/// answer from the device (reads, writes small and large and ragged, device-to-device copies
/// through the host, synchronize) must still be DeviceLost, never a backend error, with the
/// app's handler told once and nothing reaching its uncaptured-error handler.
#[test]
fn with_work_queued_at_destroy_every_call_that_needs_the_device_is_device_lost() {
    for backend in BACKENDS {
        for route in [Route::Staged, Route::Direct] {
            for op in [
                "read",
                "async read",
                "small write",
                "large write",
                "ragged write",
                "ragged d2d",
                "synchronize",
            ] {
                let Some((device, queue, a, watch)) = adopt_watched(backend, route) else { continue };
                let p = a.allocate(3 << 20, 0, DEFAULT_ALIGNMENT).unwrap();
                let q = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
                a.copy_host_to_device(p, &[1u8; 4096], 0).unwrap();
                a.synchronize(0).unwrap();
                // The app's heavy work: clears of a 128 MiB buffer, still running at destroy().
                let heavy = device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("the app's heavy work"),
                    size: 128 << 20,
                    usage: wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                for _ in 0..4 {
                    let mut enc = device.create_command_encoder(&Default::default());
                    enc.clear_buffer(&heavy, 0, None);
                    queue.submit([enc.finish()]);
                }
                device.destroy();
                let mut buf = [0u8; 16];
                let r = match op {
                    "read" => a.copy_device_to_host(&mut buf, p, 0),
                    "async read" => pollster::block_on(a.copy_device_to_host_async(&mut buf, p, 0)),
                    "small write" => a.copy_host_to_device(p, &[9u8; 64], 0),
                    "large write" => a.copy_host_to_device(p, &vec![9u8; 3 << 20], 0),
                    "ragged write" => a.copy_host_to_device(p.offset(3).unwrap(), &[9u8], 0),
                    "ragged d2d" => a.copy_device_to_device(q.offset(1).unwrap(), 0, p, 0, 5),
                    _ => a.synchronize(0),
                };
                let what = format!("{backend:?} {route:?} {op}");
                assert!(matches!(r, Err(Error::DeviceLost { .. })), "{what}: {r:?}");
                let _ = device.poll(wgpu::PollType::wait_indefinitely());
                watch.heard_once(&what);
            }
        }
    }
}

/// A buffer the app got from `buffer()` and then destroyed (its own misuse) fails devalloc's
/// copies with an error; freed, it must not go back to the cache and break the next allocation.
#[test]
fn a_buffer_the_app_destroyed_is_not_handed_out_again() {
    for backend in BACKENDS {
        for route in [Route::Staged, Route::Direct] {
            // Mappable where the adapter allows: else the direct route would never be taken.
            let Some((device, queue)) = app_device_mappable(backend) else { continue };
            let errors = Arc::new(Mutex::new(Vec::<String>::new()));
            let sink = Arc::clone(&errors);
            device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                sink.lock().unwrap().push(e.to_string())
            }));
            let options = WgpuOptions { route: Some(route), ..WgpuOptions::default() };
            let made = WgpuAllocator::from_device_with_options(device.clone(), queue, options);
            let Some(a) = on_route(backend, route, made) else { continue };
            let p = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
            a.buffer(p, 0).unwrap().buffer.destroy();
            let what = format!("{backend:?} {route:?}");
            assert!(
                a.copy_host_to_device(p, &[1u8; 64], 0).is_err(),
                "{what}: a write into a destroyed buffer"
            );
            a.deallocate(p, 0).unwrap();
            let fresh = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
            a.copy_host_to_device(fresh, &[5u8; 4096], 0).unwrap_or_else(|e| {
                panic!("{what}: the next allocation inherited the destroyed buffer: {e}")
            });
            let mut back = vec![0u8; 4096];
            a.copy_device_to_host(&mut back, fresh, 0).unwrap();
            assert_eq!(back, vec![5u8; 4096], "{what}");
            let _ = device.poll(wgpu::PollType::Poll);
            assert!(errors.lock().unwrap().is_empty(), "{what}: {:?}", errors.lock().unwrap());
        }
    }
}

#[test]
fn a_refused_adoption_leaves_the_devices_lost_callback_to_the_app() {
    for backend in BACKENDS {
        let Some((device, queue)) = app_device(backend) else { continue };
        let handler: devalloc::wgpu::DeviceLostHandler = Arc::new(|_, _: &str| {});
        for bad in [
            WgpuOptions {
                pool: PoolOptions { address_window: 12345, ..PoolOptions::default() },
                on_device_lost: Some(Arc::clone(&handler)),
                ..WgpuOptions::default()
            },
            WgpuOptions {
                usage: wgpu::BufferUsages::MAP_READ,
                on_device_lost: Some(Arc::clone(&handler)),
                ..WgpuOptions::default()
            },
        ] {
            let e =
                WgpuAllocator::from_device_with_options(device.clone(), queue.clone(), bad).err().unwrap();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{backend:?}: {e}");
        }
        // Had a refused adoption taken the callback, this one would be told "give it once".
        let good = WgpuOptions { on_device_lost: Some(handler), ..WgpuOptions::default() };
        WgpuAllocator::from_device_with_options(device, queue, good)
            .expect("the callback was still the app's");
    }
}

#[test]
fn destroying_the_device_under_an_async_read_completes_or_is_device_lost_never_a_panic() {
    for backend in BACKENDS {
        let Some((device, queue)) = app_device_mappable(backend) else { continue };
        let errors = Arc::new(Mutex::new(Vec::<String>::new()));
        let sink = Arc::clone(&errors);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| sink.lock().unwrap().push(e.to_string())));
        let a = WgpuAllocator::from_device(device.clone(), queue).unwrap();
        let p = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
        a.copy_host_to_device(p, &[7u8; 4096], 0).unwrap();
        let mut buf = vec![0u8; 4096];
        let r = {
            let mut f = a.copy_device_to_host_async(&mut buf, p, 0);
            let _ = poll_once(f.as_mut());
            device.destroy();
            pollster::block_on(f)
        };
        // The polling thread may have mapped the buffer before destroy() took effect: then the
        // read completes, and must hold the data. Otherwise it is DeviceLost. Never wrong data.
        match r {
            Ok(()) => assert_eq!(buf, vec![7u8; 4096], "{backend:?}: Ok, with wrong data"),
            r => assert!(matches!(r, Err(Error::DeviceLost { .. })), "{backend:?}: {r:?}"),
        }
        let r = a.copy_device_to_host(&mut buf, p, 0);
        assert!(matches!(r, Err(Error::DeviceLost { .. })), "{backend:?}: the next read: {r:?}");
        let _ = device.poll(wgpu::PollType::Poll);
        assert!(
            errors.lock().unwrap().is_empty(),
            "{backend:?}: devalloc's errors reached the app: {:?}",
            errors.lock().unwrap()
        );
    }
}

#[test]
fn mapping_a_destroyed_or_foreign_buffer_is_an_error_not_a_panic_or_a_hang() {
    for backend in BACKENDS {
        let Some((device, queue)) = app_device(backend) else { continue };
        let Some((other, _other_queue)) = app_device(backend) else { continue };
        let errors = Arc::new(Mutex::new(Vec::<String>::new()));
        let sink = Arc::clone(&errors);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| sink.lock().unwrap().push(e.to_string())));
        let a = WgpuAllocator::from_device(device.clone(), queue).unwrap();
        let desc = wgpu::BufferDescriptor {
            label: Some("x"),
            size: 256,
            usage: wgpu::BufferUsages::MAP_READ,
            mapped_at_creation: false,
        };
        let x = device.create_buffer(&desc);
        x.destroy();
        let r = pollster::block_on(a.map_buffer_async(&x, wgpu::MapMode::Read, 0..8, 0));
        assert!(r.is_err(), "{backend:?}: mapping a destroyed buffer: {r:?}");
        let foreign = other.create_buffer(&desc);
        let r = pollster::block_on(a.map_buffer_async(&foreign, wgpu::MapMode::Read, 0..8, 0));
        let e = r.unwrap_err();
        assert!(e.to_string().contains("another device"), "{backend:?}: {e}");
        // Giving up cancelled devalloc's map: the buffer's own device maps it as usual.
        let (tx, rx) = std::sync::mpsc::channel();
        foreign.slice(0..8).map_async(wgpu::MapMode::Read, move |r| tx.send(r).unwrap());
        other.poll(wgpu::PollType::wait_indefinitely()).unwrap();
        let mapped = rx.recv().unwrap();
        assert!(mapped.is_ok(), "{backend:?}: devalloc left its map pending: {mapped:?}");
        assert!(errors.lock().unwrap().is_empty(), "{backend:?}: {:?}", errors.lock().unwrap());
        // The allocator is still fine.
        let p = a.allocate(64, 0, DEFAULT_ALIGNMENT).unwrap();
        a.copy_host_to_device(p, &[1u8; 64], 0).unwrap();
        a.deallocate(p, 0).unwrap();
    }
}

#[test]
fn a_buffer_the_app_mapped_itself_is_an_error_for_devalloc_and_stays_the_apps() {
    for backend in BACKENDS {
        let Some((device, queue)) = app_device_mappable(backend) else { continue };
        let a = WgpuAllocator::from_device(device.clone(), queue).unwrap();
        if a.route(0).unwrap() != Route::Direct {
            no_direct_route(backend, &"auto-selection took the staged route");
            continue;
        }
        let p = a.allocate(256, 0, DEFAULT_ALIGNMENT).unwrap();
        a.copy_host_to_device(p, &[3u8; 256], 0).unwrap();
        let range = a.buffer(p, 0).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        range.buffer.slice(0..256).map_async(wgpu::MapMode::Read, move |r| tx.send(r).unwrap());
        device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
        rx.recv().unwrap().unwrap();
        let view = range.buffer.slice(0..256).get_mapped_range().unwrap();
        // devalloc's map is refused; it must not unmap the app's mapping (with a view alive,
        // wgpu would panic) nor pretend the copy happened.
        let mut back = [0u8; 16];
        assert!(a.copy_device_to_host(&mut back, p, 0).is_err(), "{backend:?}");
        assert!(a.copy_host_to_device(p, &[9u8; 16], 0).is_err(), "{backend:?}");
        assert_eq!(view[..16], [3u8; 16], "{backend:?}: the app's view changed");
        drop(view);
        range.buffer.unmap();
        a.copy_device_to_host(&mut back, p, 0).unwrap();
        assert_eq!(back, [3u8; 16], "{backend:?}");
        a.deallocate(p, 0).unwrap();
    }
}

#[test]
fn after_destroy_range_checks_buffers_and_bindings_are_device_lost_and_bookkeeping_works() {
    for backend in BACKENDS {
        let Some((device, queue)) = app_device(backend) else { continue };
        let a = WgpuAllocator::from_device(device.clone(), queue).unwrap();
        let p = a.allocate(1024, 0, DEFAULT_ALIGNMENT).unwrap();
        let range = a.buffer(p, 0).unwrap();
        a.init_buffer(1, 512, 0).unwrap();
        device.destroy();
        let lost = |what: &str, r: devalloc::Result<()>| {
            assert!(matches!(r, Err(Error::DeviceLost { .. })), "{backend:?} {what}: {r:?}")
        };
        lost("check_range", a.check_range(p, 8, 0));
        lost("buffer", a.buffer(p, 0).map(drop));
        lost("buffer_range", a.buffer_range(p, 8, 0).map(drop));
        lost("binding", range.binding(BindingKind::Storage).map(drop));
        // Bookkeeping keeps working, so that the app can clean up.
        a.get_offset_address(1, 0, 8, 0).unwrap();
        a.stats(0).unwrap();
        a.release_buffers(0).unwrap();
        a.deallocate(p, 0).unwrap();
        a.empty_cache();
        assert_eq!(a.stats(0).unwrap().live_allocations, 0);
    }
}

/// A panic that comes out of wgpu while devalloc polls (here the app's own map callback, which
/// devalloc's poll runs; wgpu-core 30.0.2 also panics on a healthy device when polls race) is
/// not a loss while the device is valid: every call goes on working, and the app hears of no
/// loss. Once the device is destroyed, such a panic (which drops wgpu's own lost callback along
/// with the callbacks after it) is still found to be a loss.
#[test]
fn a_panic_inside_a_poll_is_a_loss_only_once_the_device_is_invalid() {
    for backend in BACKENDS {
        for route in [Route::Staged, Route::Direct] {
            let Some((device, queue)) = app_device_mappable(backend) else { continue };
            let watch = Watched::on(&device);
            let options = WgpuOptions {
                route: Some(route),
                on_device_lost: Some(watch.on_lost()),
                ..WgpuOptions::default()
            };
            let made = WgpuAllocator::from_device_with_options(device.clone(), queue, options);
            let Some(a) = on_route(backend, route, made) else { continue };
            let what = format!("{backend:?} {route:?}");
            let p = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
            a.copy_host_to_device(p, &[9u8; 4096], 0).unwrap();
            let panicking_map = || crate::wgpu_hostile::panicking_map(&device);
            // Healthy: the next poll (devalloc's range check) runs the callback, which panics.
            let _b = panicking_map();
            a.check_range(p, 4096, 0).unwrap_or_else(|e| panic!("{what}: after a panic in a poll: {e}"));
            let mut back = vec![0u8; 4096];
            a.copy_device_to_host(&mut back, p, 0).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(back, vec![9u8; 4096], "{what}");
            a.copy_host_to_device(p, &[10u8; 4096], 0).unwrap_or_else(|e| panic!("{what}: {e}"));
            pollster::block_on(a.copy_device_to_host_async(&mut back, p, 0)).unwrap();
            assert_eq!(back, vec![10u8; 4096], "{what}");
            assert_eq!(watch.fired.load(Ordering::SeqCst), 0, "{what}: a healthy device was reported lost");
            // Destroyed: the panic comes in the poll that would have reported the loss.
            let _c = panicking_map();
            device.destroy();
            let r = a.check_range(p, 4096, 0);
            assert!(matches!(r, Err(Error::DeviceLost { .. })), "{what}: after destroy and a panic: {r:?}");
            let r = a.copy_device_to_host(&mut back, p, 0);
            assert!(matches!(r, Err(Error::DeviceLost { .. })), "{what}: a read after it: {r:?}");
            watch.heard_once(&what);
        }
    }
}
