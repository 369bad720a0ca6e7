//! What a hostile review of segmented allocations found (issue 40), each kept as a test: copies
//! of a few bytes around the seams, an app-buffer copy racing device copies on the direct
//! route (they deadlocked: locks taken in two orders), a cached segmented block handed to a
//! request within one buffer, uniform binds of large segments, a device whose buffer limit is
//! under its binding alignment, and a copy into the allocation's own buffer.

use crate::wgpu::vulkan;

use devalloc::wgpu::{Bind, BindTarget, BufferRequest, Route, WgpuAllocator, WgpuOptions};
use devalloc::{DeviceAllocator, DevicePtr, Error, DEFAULT_ALIGNMENT};

fn sized(route: Option<Route>, max: u64) -> WgpuOptions {
    WgpuOptions { max_buffer_size: Some(max), staging_chunk: Some(4096), route, ..WgpuOptions::default() }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed)).collect()
}

fn read(a: &WgpuAllocator, p: DevicePtr, off: usize, n: usize) -> Vec<u8> {
    let mut back = vec![0u8; n];
    a.copy_device_to_host(&mut back, p.offset(off).unwrap(), 0).unwrap();
    back
}

/// Lengths of 1-9 bytes between and within allocations of 256-byte segments, around the seams,
/// blocking and async, on both routes.
#[test]
fn small_copies_across_seams_match_a_cpu_model() {
    for route in [Route::Staged, Route::Direct] {
        let Some(a) = vulkan(sized(Some(route), 256)) else { return };
        let n = 1100;
        let p = a.allocate(n, 0, 256).unwrap();
        let q = a.allocate(n, 0, 256).unwrap();
        let mut mp = pattern(n, 1);
        let mut mq = pattern(n, 99);
        a.copy_host_to_device(p, &mp, 0).unwrap();
        a.copy_host_to_device(q, &mq, 0).unwrap();
        for len in 1..=9usize {
            for so in [251usize, 252, 253, 255, 256, 508, 510, 767] {
                for d_o in [250usize, 252, 254, 255, 256, 509, 764, 1100 - 9] {
                    a.copy_device_to_device(q.offset(d_o).unwrap(), 0, p.offset(so).unwrap(), 0, len)
                        .unwrap();
                    let src = mp[so..so + len].to_vec();
                    mq[d_o..d_o + len].copy_from_slice(&src);
                }
            }
            assert!(read(&a, q, 0, n) == mq, "{route:?}: cross copies len {len}");
            // Within p, overlapping both ways
            for (so, d_o) in [
                (253usize, 255usize),
                (255, 253),
                (254, 258),
                (258, 254),
                (250, 251),
                (251, 250),
                (510, 513),
                (513, 510),
            ] {
                a.copy_device_to_device(p.offset(d_o).unwrap(), 0, p.offset(so).unwrap(), 0, len).unwrap();
                mp.copy_within(so..so + len, d_o);
            }
            assert!(read(&a, p, 0, n) == mp, "{route:?}: within copies len {len}");
        }
        // Big overlapping copies within, aligned and ragged, with and without async
        for (so, d_o, len, asy) in [
            (4usize, 260usize, 800usize, false),
            (260, 4, 800, true),
            (1, 258, 839, true),
            (258, 1, 839, false),
            (0, 256, 844, true),
            (256, 0, 844, false),
        ] {
            if asy {
                pollster::block_on(a.copy_device_to_device_async(
                    p.offset(d_o).unwrap(),
                    0,
                    p.offset(so).unwrap(),
                    0,
                    len,
                ))
                .unwrap();
            } else {
                a.copy_device_to_device(p.offset(d_o).unwrap(), 0, p.offset(so).unwrap(), 0, len).unwrap();
            }
            mp.copy_within(so..so + len, d_o);
            assert!(read(&a, p, 0, n) == mp, "{route:?}: big within copy {so}->{d_o} len {len} async {asy}");
        }
    }
}

/// An app-buffer copy and device copies on one segmented allocation, from three threads, on the
/// direct route (where copies lock segments): each finishes (they once waited on each other).
#[test]
fn an_app_buffer_copy_racing_device_copies_finishes() {
    let Some(a) = vulkan(sized(Some(Route::Direct), 256)) else { return };
    let a = std::sync::Arc::new(a);
    let n = 64 * 256;
    let usage = wgpu::BufferUsages::COPY_DST;
    let desc = wgpu::BufferDescriptor { label: None, size: n as u64, usage, mapped_at_creation: false };
    let app = a.device(0).unwrap().create_buffer(&desc);
    for _ in 0..4 {
        let p = a.allocate(n, 0, 256).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let (a1, tx1, app) = (a.clone(), tx.clone(), app.clone());
        std::thread::spawn(move || {
            for _ in 0..100 {
                a1.copy_to_buffer(p, &app, 0, n as u64, 0).unwrap();
            }
            tx1.send(()).unwrap();
        });
        for _ in 0..2 {
            let (a, tx) = (a.clone(), tx.clone());
            std::thread::spawn(move || {
                for _ in 0..1000 {
                    a.copy_device_to_device(p, 0, p.offset(n - 256).unwrap(), 0, 256).unwrap();
                }
                tx.send(()).unwrap();
            });
        }
        for _ in 0..3 {
            rx.recv_timeout(std::time::Duration::from_secs(60)).expect("the copies waited on each other");
        }
        a.deallocate(p, 0).unwrap();
    }
}

/// With a buffer limit that is not a multiple of the binding alignment, the one-buffer bound is
/// the limit rounded down: a request within it lies in one buffer even when the cache hands it
/// a freed segmented block.
#[test]
fn a_request_within_one_buffer_never_straddles_a_cached_segmented_block() {
    let Some(probe) = vulkan(WgpuOptions::default()) else { return };
    let align = probe.binding_alignment(0).unwrap() as u64;
    drop(probe);
    let a = vulkan(sized(Some(Route::Staged), 8192 + align / 2)).unwrap();
    assert_eq!(a.segment_size(0).unwrap(), 8192);
    let big = a.allocate(8193, 0, 256).unwrap();
    a.deallocate(big, 0).unwrap();
    let q = a.allocate(8192, 0, 256).unwrap();
    assert_eq!(a.stats(0).unwrap().cache_hits, 1, "served from the freed segmented block");
    assert_eq!(a.segments(q, 8192, 0).unwrap().len(), 1);
    a.buffer_range(q, 8192, 0).unwrap();
    a.deallocate(q, 0).unwrap();
}

/// A uniform bind of a segmented range gets parts within the uniform binding limit, not the
/// storage one.
#[test]
fn uniform_binds_of_segments_fit_the_uniform_limit() {
    let Some(a) = vulkan(sized(Some(Route::Staged), 128 << 10)) else { return };
    let uniform = a.device(0).unwrap().limits().max_uniform_buffer_binding_size;
    let n = 256 << 10;
    let request = BufferRequest::new(n).usage(wgpu::BufferUsages::UNIFORM);
    let p = a.allocate_request(&request, 0).unwrap();
    let slots = (n as u64).div_ceil(uniform.min(128 << 10)) as u32;
    let b = a.bindings(&[Bind::uniform(0, BindTarget::segments(p, n as u64, slots))], 0).unwrap();
    assert_eq!(b.entries().len(), slots as usize);
    a.deallocate(p, 0).unwrap();
}

/// A device whose own buffer limit is under its binding alignment segments nothing: past the
/// limit is `TooLarge`, as before segments (its segments could not be bound).
#[test]
fn a_device_limit_under_the_binding_alignment_segments_nothing() {
    let limits = wgpu::Limits { max_buffer_size: 100, ..wgpu::Limits::downlevel_defaults() };
    let Some(a) = vulkan(WgpuOptions { required_limits: Some(limits), ..WgpuOptions::default() }) else {
        return;
    };
    assert_eq!((a.segment_size(0).unwrap(), a.max_allocation(0).unwrap()), (0, 100));
    let e = a.allocate(200, 0, DEFAULT_ALIGNMENT).unwrap_err();
    assert!(matches!(e, Error::TooLarge { max: 100, .. }), "{e}");
}

/// Copying between a range and its own buffer, handed back as if it were the app's, is refused
/// up front (wgpu copies nothing onto the same buffer); another segment's buffer is a buffer
/// like any other.
#[test]
fn an_app_copy_onto_the_ranges_own_buffer_is_refused() {
    let Some(a) = vulkan(sized(Some(Route::Staged), 1024)) else { return };
    let p = a.allocate(3000, 0, 256).unwrap();
    let data = pattern(3000, 4);
    a.copy_host_to_device(p, &data, 0).unwrap();
    let second = a.segments(p, 3000, 0).unwrap()[1].buffer.clone();
    let e = a.copy_to_buffer(p.offset(1024).unwrap(), &second, 512, 256, 0).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("own buffer"), "{e}");
    a.copy_to_buffer(p, &second, 0, 1024, 0).unwrap();
    assert!(read(&a, p, 1024, 1024) == data[..1024], "the first segment copied onto the second");
    a.deallocate(p, 0).unwrap();
}
