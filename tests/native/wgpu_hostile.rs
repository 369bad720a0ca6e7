//! An app's hostile ways with devalloc on its own device: its map callbacks panic inside the
//! polls that devalloc's copies run, it polls an async copy by hand and then blocks on the same
//! memory on that thread, and it drops async copies (and `map_buffer_async` on its own buffer)
//! while another thread's poll is mapping their buffer. On a healthy device every call ends
//! with the right data or a clear error: never a hang, never the app's panic unwinding out of
//! devalloc, never a loss, and no buffer left mapped behind anyone's back. Vulkan (lavapipe) and
//! GL (llvmpipe), both routes where the adapter has them; under CI=true a missing adapter fails.

use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use devalloc::wgpu::{Route, WgpuAllocator, WgpuOptions};
use devalloc::{DeviceAllocator, Error, DEFAULT_ALIGNMENT};

use crate::conformance::{self, pattern};
use crate::util::{no_panic, poll_once, within};
use crate::wgpu_app::{app_device_mappable, Watched, BACKENDS};

/// The route auto-selection must take on `backend` where the adapters are known: under CI,
/// lavapipe's Vulkan (a CPU device that offers MAPPABLE_PRIMARY_BUFFERS) maps its buffers,
/// `Direct`, and llvmpipe's GL has no direct route, `Staged`. `None` elsewhere: there the route
/// is whatever the adapter allows.
pub(crate) fn known_route(backend: wgpu::Backend) -> Option<Route> {
    match backend {
        _ if !conformance::in_ci() => None,
        wgpu::Backend::Vulkan => Some(Route::Direct),
        wgpu::Backend::Gl => Some(Route::Staged),
        _ => None,
    }
}

/// `backend`'s device has no direct route (`why`): a failure where [`known_route`] says it has
/// one (lavapipe's Vulkan under CI: a lost direct route must not pass as a skip), nothing more
/// where it says it has none (llvmpipe's GL under CI: the refusal was expected), a counted skip
/// elsewhere.
pub(crate) fn no_direct_route(backend: wgpu::Backend, why: &dyn std::fmt::Display) {
    match known_route(backend) {
        Some(Route::Direct) => {
            panic!("{backend:?} has no direct route, and under CI (lavapipe) it must: {why}")
        }
        Some(Route::Staged) => {}
        None => conformance::skip("the direct route", &format!("no direct route on {backend:?} here: {why}")),
    }
}

/// The app's device (MAPPABLE_PRIMARY_BUFFERS where the adapter has it), watched, adopted by an
/// allocator on `route` with `chunk`-byte staging chunks (the default where `None`) that gets the
/// app's `on_device_lost`. `None`, saying why, where the backend has no adapter or no direct
/// route (see [`no_direct_route`]); the staged route is always there.
pub(crate) fn adopt(
    backend: wgpu::Backend,
    route: Route,
    chunk: Option<u64>,
) -> Option<(wgpu::Device, wgpu::Queue, WgpuAllocator, Watched)> {
    let (device, queue) = app_device_mappable(backend)?;
    let watch = Watched::on(&device);
    let options = WgpuOptions {
        route: Some(route),
        staging_chunk: chunk,
        on_device_lost: Some(watch.on_lost()),
        ..WgpuOptions::default()
    };
    let made = WgpuAllocator::from_device_with_options(device.clone(), queue.clone(), options);
    on_route(backend, route, made).map(|a| (device, queue, a, watch))
}

/// An allocator made on `route` (`made`), or `None` where `backend` refused the direct route
/// (see [`no_direct_route`]); the staged route is always there, and its refusal fails.
pub(crate) fn on_route(
    backend: wgpu::Backend,
    route: Route,
    made: devalloc::Result<WgpuAllocator>,
) -> Option<WgpuAllocator> {
    match made {
        Ok(a) => Some(a),
        Err(e) => {
            assert_eq!(route, Route::Direct, "{backend:?}: the staged route is always there: {e}");
            assert!(matches!(e, Error::NotSupported { .. }), "{backend:?}: the direct route refused: {e}");
            no_direct_route(backend, &e);
            None
        }
    }
}

/// Every backend with every route.
pub(crate) fn configs() -> impl Iterator<Item = (wgpu::Backend, Route)> {
    BACKENDS.into_iter().flat_map(|b| [(b, Route::Staged), (b, Route::Direct)])
}

/// How often the app's lost handler fired, and what reached its uncaptured-error handler.
pub(crate) fn heard(watch: &Watched) -> (usize, Vec<String>) {
    (watch.fired.load(Ordering::SeqCst), watch.errors.lock().unwrap().clone())
}

/// A buffer of the app's whose map callback panics (wgpu runs ready map callbacks from
/// `Device::poll` and `Queue::submit`: here, from inside devalloc's calls).
pub(crate) fn panicking_map(device: &wgpu::Device) -> wgpu::Buffer {
    let b = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("app's buffer"),
        size: 16,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    b.slice(..).map_async(wgpu::MapMode::Read, |_| panic!("the app's map callback panics"));
    b
}

/// devalloc's next blocking copy is the call that runs the app's panicking map callback: the
/// copy completes with the right data, the app's panic does not unwind out of it, it does not
/// hang, and the device is not reported lost; the allocator goes on working.
#[test]
fn an_apps_panicking_map_callback_run_by_a_blocking_copy() {
    let mut failures = Vec::new();
    for (backend, route) in configs() {
        let Some((device, _queue, a, watch)) = adopt(backend, route, None) else { continue };
        let what = format!("{backend:?} {route:?}");
        let a: &'static WgpuAllocator = Box::leak(Box::new(a));
        let p = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
        a.copy_host_to_device(p, &[9u8; 4096], 0).unwrap();
        a.synchronize(0).unwrap();
        let b = panicking_map(&device);
        let r = within(20, move || {
            no_panic(|| {
                let mut back = vec![0u8; 4096];
                a.copy_device_to_host(&mut back, p, 0).map(|()| back)
            })
        });
        match r {
            None => failures.push(format!("{what}: the blocking read hangs")),
            Some(Err(panic)) => {
                failures.push(format!("{what}: the app's panic unwound out of the read: {panic}"))
            }
            Some(Ok(Err(e))) => failures.push(format!("{what}: a healthy device's read failed: {e}")),
            Some(Ok(Ok(back))) if back != vec![9u8; 4096] => failures.push(format!("{what}: wrong data")),
            Some(Ok(Ok(_))) => {}
        }
        if heard(&watch).0 != 0 {
            failures.push(format!("{what}: reported lost"));
        }
        let r = within(20, move || {
            no_panic(|| {
                a.copy_host_to_device(p, &[3u8; 4096], 0)?;
                let mut back = vec![0u8; 4096];
                a.copy_device_to_host(&mut back, p, 0)?;
                Ok::<_, Error>(back == vec![3u8; 4096])
            })
        });
        if !matches!(r, Some(Ok(Ok(true)))) {
            failures.push(format!("{what}: afterwards: {r:?}"));
        }
        drop(b);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Async reads on another thread, each followed by an app poll that runs the app's panicking
/// map callback (the app catches its own panic): every read has the data, the allocator is not
/// reported lost.
#[test]
fn an_apps_panicking_map_callback_beside_an_async_copy() {
    for (backend, route) in configs() {
        let Some((device, _queue, a, watch)) = adopt(backend, route, None) else { continue };
        let what = format!("{backend:?} {route:?}");
        let a: &'static WgpuAllocator = Box::leak(Box::new(a));
        let p = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
        a.copy_host_to_device(p, &[7u8; 4096], 0).unwrap();
        a.synchronize(0).unwrap();
        let mut failures = Vec::new();
        for _ in 0..20 {
            let r = within(20, move || {
                let mut back = vec![0u8; 4096];
                let r = {
                    let mut f = a.copy_device_to_host_async(&mut back, p, 0);
                    match poll_once(f.as_mut()) {
                        Poll::Ready(r) => r,
                        Poll::Pending => pollster::block_on(f),
                    }
                };
                r.map(|()| back)
            });
            let b = panicking_map(&device);
            let _ = no_panic(|| device.poll(wgpu::PollType::Poll));
            match r {
                None => failures.push("hang".to_string()),
                Some(Err(e)) => failures.push(e.to_string()),
                Some(Ok(back)) if back != vec![7u8; 4096] => failures.push("wrong data".into()),
                Some(Ok(_)) => {}
            }
            drop(b);
        }
        assert!(failures.is_empty(), "{what}: reads on a healthy device: {failures:?}");
        assert_eq!(heard(&watch).0, 0, "{what}: reported lost");
    }
}

/// An async read polled once (its map requested), then the app's map with a panicking callback,
/// and the app's own poll runs both: when the app's callback panics first, wgpu drops the
/// callbacks after it, devalloc's among them. The read must still complete with the data on a
/// healthy device (it failed on the staged route before a dropped map callback was taken for
/// a mapped buffer: "wgpu dropped a callback devalloc was waiting for").
#[test]
fn an_apps_panicking_map_callback_in_the_poll_that_completes_an_async_read() {
    let mut failures = Vec::new();
    for (backend, route) in configs() {
        let Some((device, _queue, a, watch)) = adopt(backend, route, None) else { continue };
        let p = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
        a.copy_host_to_device(p, &[7u8; 4096], 0).unwrap();
        a.synchronize(0).unwrap();
        for i in 0..20 {
            let mut back = vec![0u8; 4096];
            let r = {
                let mut f = a.copy_device_to_host_async(&mut back, p, 0);
                let _ = poll_once(f.as_mut());
                let b = panicking_map(&device);
                std::thread::sleep(Duration::from_millis(20));
                let _ = no_panic(|| device.poll(wgpu::PollType::wait_indefinitely()));
                let r = pollster::block_on(f);
                drop(b);
                r
            };
            match r {
                Ok(()) if back == vec![7u8; 4096] => {}
                Ok(()) => failures.push(format!("{backend:?} {route:?} #{i}: wrong data")),
                Err(e) => failures.push(format!("{backend:?} {route:?} #{i}: {e}")),
            }
        }
        assert_eq!(heard(&watch).0, 0, "{backend:?} {route:?}: reported lost");
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// One thread polls a ragged async write once (it may hold the allocation's lock, waiting on
/// the device) and then makes a blocking copy of the same allocation: the copy must not wait
/// forever on its own thread. It is done, or refused as `NotSupported`; once the async write
/// is dropped, blocking copies work again.
#[test]
fn a_blocking_copy_behind_this_threads_hand_polled_async_copy_is_refused_not_a_hang() {
    for (backend, route) in configs() {
        let Some((_device, _queue, a, _watch)) = adopt(backend, route, Some(64 << 10)) else { continue };
        let what = format!("{backend:?} {route:?}");
        let a: &'static WgpuAllocator = Box::leak(Box::new(a));
        let n = 1 << 20;
        let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
        let r = within(20, move || {
            let data = pattern(n, 8);
            let mut f = a.copy_host_to_device_async(p.offset(1).unwrap(), &data[..n - 2], 0);
            let pending = poll_once(f.as_mut()).is_pending();
            let blocked = a.copy_host_to_device(p, &data, 0);
            drop(f);
            let mut back = vec![0u8; n];
            let after =
                a.copy_host_to_device(p, &data, 0).and_then(|()| a.copy_device_to_host(&mut back, p, 0));
            (pending, blocked, after.map(|()| back == data))
        });
        let (pending, blocked, after) = r.unwrap_or_else(|| {
            panic!("{what}: a blocking copy waits forever behind the same thread's pending async copy")
        });
        match blocked {
            Ok(()) => {}
            Err(Error::NotSupported { .. }) if pending => {}
            Err(e) => panic!("{what}: the blocking copy (async copy pending: {pending}): {e}"),
        }
        assert!(matches!(after, Ok(true)), "{what}: once the async copy is dropped: {after:?}");
    }
}

/// The direct route, one allocation: an async read is polled once (its map is pending) and
/// dropped, while another thread polls the device (the app's render loop) or nobody but
/// devalloc's own polling thread does. A poll half-way through mapping the buffer as the drop
/// unmaps it must not leave it mapped: every blocking read after a drop works and has the data,
/// and so does the next allocation that reuses the block. (Before the fix this failed within
/// the first 5,000 iterations, mostly the first thousand; 20,000 take 2 to 3 s.)
fn dropped_direct_copy_race(app_polls: bool) {
    let Some((device, _queue, a, watch)) = adopt(wgpu::Backend::Vulkan, Route::Direct, None) else { return };
    let a: &'static WgpuAllocator = Box::leak(Box::new(a));
    let p = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
    a.copy_host_to_device(p, &[5u8; 4096], 0).unwrap();
    let stop: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let d2 = device.clone();
    let poller = std::thread::spawn(move || {
        while app_polls && !stop.load(Ordering::Relaxed) {
            let _ = d2.poll(wgpu::PollType::Poll);
            // The core given up after each poll: a bare spin starved the racing thread on two
            // busy cores (the map race below took ~40 s under the suite's load, for 2 s of work).
            std::thread::yield_now();
        }
    });
    let r = within(60, move || {
        for i in 0..20_000u64 {
            let mut back = vec![0u8; 4096];
            {
                let mut f = a.copy_device_to_host_async(&mut back, p, 0);
                let _ = poll_once(f.as_mut());
                if !app_polls {
                    std::thread::sleep(Duration::from_micros((i % 7) * 3));
                }
            } // dropped: its pending map is cancelled
            if i % 16 == 0 {
                if let Err(e) = a.copy_device_to_host(&mut back, p, 0) {
                    let again = a.copy_device_to_host(&mut back, p, 0).is_err();
                    a.deallocate(p, 0).unwrap();
                    let q = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
                    let next = a.copy_host_to_device(q, &[1u8; 4096], 0);
                    return Err(format!(
                        "iteration {i}: a blocking read after the drop: {e}; a second read fails too: \
                         {again}; the next allocation (from the cache) writes: {next:?}"
                    ));
                }
                if back != vec![5u8; 4096] {
                    return Err(format!("iteration {i}: wrong data"));
                }
            }
        }
        Ok(())
    });
    stop.store(true, Ordering::Relaxed);
    poller.join().unwrap();
    let r = r.unwrap_or_else(|| Err("a blocking read hangs (its map callback was dropped)".into()));
    assert!(r.is_ok(), "{}; the app's error handler saw: {:?}", r.unwrap_err(), heard(&watch).1.first());
}

#[test]
fn a_dropped_direct_route_copy_racing_the_apps_poll_leaves_the_buffer_usable() {
    dropped_direct_copy_race(true);
}

#[test]
fn a_dropped_direct_route_copy_racing_devallocs_own_poll_leaves_the_buffer_usable() {
    dropped_direct_copy_race(false);
}

/// `map_buffer_async` on the app's own buffer, polled once and dropped ("being dropped cancels
/// it") while the app polls its device on another thread. Where that poll mapped the buffer at
/// once (the first poll is `Ready(Ok)`) the buffer is the app's, mapped, and it unmaps it;
/// otherwise the drop must leave it unmapped: every time, the app's own `map_async` of its
/// buffer succeeds. (Before the fix this failed within the first 2,000 iterations; 20,000 take
/// about 2 s.)
#[test]
fn a_dropped_map_buffer_async_racing_a_poll_leaves_the_apps_buffer_unmapped() {
    let Some((device, _queue, a, _watch)) = adopt(wgpu::Backend::Vulkan, Route::Staged, None) else { return };
    let a: &'static WgpuAllocator = Box::leak(Box::new(a));
    let b = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("app's readback"),
        size: 256,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let stop: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let d2 = device.clone();
    let poller = std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let _ = d2.poll(wgpu::PollType::Poll);
            // As above: as many polls as the scheduler allows, none starving the racing thread.
            std::thread::yield_now();
        }
    });
    let r = within(60, move || {
        for i in 0..20_000 {
            {
                let mut f = std::pin::pin!(a.map_buffer_async(&b, wgpu::MapMode::Read, 0..256, 0));
                match poll_once(f.as_mut()) {
                    Poll::Ready(Ok(())) => b.unmap(),
                    Poll::Ready(Err(e)) => return Err(format!("iteration {i}: map_buffer_async: {e}")),
                    Poll::Pending => {}
                }
            }
            if i % 16 == 0 {
                let (tx, rx) = std::sync::mpsc::channel();
                b.slice(..).map_async(wgpu::MapMode::Read, move |r| {
                    let _ = tx.send(r);
                });
                match rx.recv_timeout(Duration::from_secs(5)) {
                    Ok(Ok(())) => b.unmap(),
                    other => {
                        return Err(format!("iteration {i}: the app's own map of its buffer: {other:?}"))
                    }
                }
            }
        }
        Ok(())
    });
    stop.store(true, Ordering::Relaxed);
    poller.join().unwrap();
    let r = r.unwrap_or_else(|| Err("hang".into()));
    assert!(r.is_ok(), "{}", r.unwrap_err());
}
