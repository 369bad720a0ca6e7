//! The wgpu allocator's two copy routes on Vulkan, each through ragged edges, copies of several
//! staging chunks, interleaved uploads and downloads and 8 threads at once: the staged route,
//! forced, and the route auto-selection takes, which must be the direct one where the adapter
//! maps its buffers (under CI, lavapipe: see `wgpu_hostile::known_route`).

use super::{pattern, small_chunks, vulkan};
use crate::wgpu_hostile::no_direct_route;

use devalloc::wgpu::Route;
use devalloc::{DeviceAllocator, DEFAULT_ALIGNMENT};

/// Both routes, forced: ragged edges, copies larger than a staging chunk, interleaved
/// uploads and downloads of one buffer, 8 threads at once.
fn staging_paths(route: Option<Route>, expect: Route) {
    let Some(a) = vulkan(small_chunks(route)) else { return };
    let taken = a.route(0).unwrap();
    if taken != expect {
        assert_eq!(route, None, "the forced route {expect:?} was not taken: {taken:?}");
        // Auto-selection: under CI (lavapipe) a failure, elsewhere a counted skip.
        no_direct_route(wgpu::Backend::Vulkan, &format!("auto-selection took {taken:?}"));
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

/// The staged route, forced: always there.
#[test]
fn staged_route() {
    staging_paths(Some(Route::Staged), Route::Staged);
}

/// The route auto-selection takes: direct where the adapter maps its buffers (under CI it must).
#[test]
fn direct_route() {
    staging_paths(None, Route::Direct);
}
