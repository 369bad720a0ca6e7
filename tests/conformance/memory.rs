//! The conformance suite's memory checks (see the parent module): history and snapshots, and
//! steady state (a repeating workload allocates nothing new from the device after warm-up).
use devalloc::{AllocatorStats, DeviceAllocator, DeviceIndex, DevicePtr, DEFAULT_ALIGNMENT};

use super::*;

/// History records exactly what a scripted sequence did, the ring keeps the newest events, and
/// the snapshot says what is live, cached and planned, and round-trips through its JSON.
pub async fn history_and_snapshot(a: &'static dyn DeviceAllocator, i: DeviceIndex) {
    use devalloc::snapshot::{EventKind, Snapshot};
    // Only the device under test records (other devices of the allocator are quiet here).
    a.record_history(100).unwrap();
    let hits0 = a.stats(i).unwrap().cache_hits;
    let x = a.allocate(300, i, DEFAULT_ALIGNMENT).unwrap();
    h2d(a, x, &[7u8; 16], i).await.unwrap();
    let _ = read(a, x, 16, i).await;
    let y = a.allocate(5000, i, DEFAULT_ALIGNMENT).unwrap();
    a.deallocate(x, i).unwrap();
    let z = a.allocate(300, i, DEFAULT_ALIGNMENT).unwrap();
    let z_hit = a.stats(i).unwrap().cache_hits > hits0;
    d2d(a, z, i, y, i, 64).await.unwrap();
    let planned = a.init_buffer(5, 1000, i).unwrap();
    a.release_buffers(i).unwrap();
    a.deallocate(y, i).unwrap();
    let snap = a.snapshot().unwrap();
    let dev =
        snap.devices.iter().find(|d| d.device == format!("{}:{i}", a.device_type())).expect("this device");
    let h = dev.history.as_ref().expect("recording is on");
    let kinds: Vec<&str> = h
        .events
        .iter()
        .map(|e| match &e.kind {
            EventKind::Alloc { .. } => "alloc",
            EventKind::Free { .. } => "free",
            EventKind::PlannedBuffer { .. } => "planned_buffer",
            EventKind::ReleaseBuffers { .. } => "release_buffers",
            EventKind::EmptyCache { .. } => "empty_cache",
            EventKind::Evict { .. } => "evict",
            EventKind::OutOfMemory { .. } => "out_of_memory",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        ["alloc", "alloc", "free", "alloc", "alloc", "planned_buffer", "release_buffers", "free", "free"],
        "{:#?}",
        h.events
    );
    match &h.events[0].kind {
        EventKind::Alloc { addr, size, from_cache, .. } => {
            assert_eq!((*addr, *size), (x.addr(), 300));
            let _ = from_cache;
        }
        e => panic!("{e:?}"),
    }
    assert!(
        matches!(&h.events[3].kind, EventKind::Alloc { addr, from_cache, .. } if *addr == z.addr() && *from_cache == z_hit)
    );
    assert!(
        matches!(&h.events[5].kind, EventKind::PlannedBuffer { memory_id: 5, addr, size: 1000 } if *addr == planned.addr())
    );
    assert!(h.events.windows(2).all(|w| w[0].seq + 1 == w[1].seq && w[0].time_us <= w[1].time_us));
    assert_eq!((h.copies.host_to_device.count, h.copies.host_to_device.bytes), (1, 16));
    assert!(h.copies.device_to_host.count >= 1 && h.copies.device_to_host.bytes >= 16);
    assert_eq!((h.copies.device_to_device.count, h.copies.device_to_device.bytes), (1, 64));
    // What is live now: z alone.
    assert!(dev.live.iter().any(|l| l.addr == z.addr() && l.size == 300), "{:?}", dev.live);
    assert!(dev.planned.is_empty());
    assert_eq!(dev.stats, a.stats(i).unwrap());
    // The JSON round-trips.
    let back = Snapshot::from_json(&snap.to_json()).unwrap();
    assert_eq!(back, snap);
    assert!(matches!(
        Snapshot::from_json("{\"format\":\"other\"}"),
        Err(devalloc::Error::InvalidArgument { .. })
    ));
    // The ring keeps the newest events (the cache given back first: with a block cached, a
    // fresh allocation may give it back, one more event, as the pool's budget says).
    a.empty_cache();
    a.record_history(3).unwrap();
    let ptrs: Vec<DevicePtr> = (0..5).map(|k| a.allocate(64 + k, i, DEFAULT_ALIGNMENT).unwrap()).collect();
    let snap = a.snapshot().unwrap();
    let dev = snap.devices.iter().find(|d| d.device == format!("{}:{i}", a.device_type())).unwrap();
    let h = dev.history.as_ref().unwrap();
    assert_eq!((h.events.len(), h.dropped), (3, 2));
    let sizes: Vec<u64> = h
        .events
        .iter()
        .map(|e| match e.kind {
            EventKind::Alloc { size, .. } => size,
            _ => 0,
        })
        .collect();
    assert_eq!(sizes, [66, 67, 68], "the newest three");
    for p in ptrs {
        a.deallocate(p, i).unwrap();
    }
    // Off again: nothing recorded.
    a.record_history(0).unwrap();
    assert!(a.snapshot().unwrap().devices.iter().all(|d| d.history.is_none()));
    a.deallocate(z, i).unwrap();
}

/// Steady state: a workload that repeats the same shapes step after step, each step under new
/// labels, makes no device allocation after its first step (labels never keep a freed block
/// from being reused), and reserves no more in later steps than in the first. An allocator made
/// with caching off (`PoolOptions { caching: false, .. }`) must instead cache nothing and reuse
/// nothing, and the steady state is skipped, saying so (see [`cached_as_made`]).
pub async fn steady_state(a: &'static dyn DeviceAllocator, i: DeviceIndex, caching: Caching) {
    let shapes = [256usize, 4096, 65_536 + 12, 1 << 20, (3 << 18) + 5];
    let mut misses = Vec::new();
    let mut reserved = Vec::new();
    for step in 0..4 {
        let mut ptrs = Vec::new();
        for (t, &n) in shapes.iter().enumerate() {
            let p = a.allocate_labeled(n, i, DEFAULT_ALIGNMENT, &format!("t{t}.step{step}")).unwrap();
            h2d(a, p, &pattern(n.min(4096), step as u64), i).await.unwrap();
            ptrs.push(p);
        }
        let s = a.stats(i).unwrap();
        reserved.push(s.reserved_bytes);
        for p in ptrs {
            a.deallocate(p, i).unwrap();
        }
        let s = a.stats(i).unwrap();
        if step == 0 && !cached_as_made(a, i, caching, &s, "steady_state") {
            return;
        }
        misses.push(s.cache_misses);
    }
    assert!(misses.iter().all(|&m| m == misses[0]), "device allocations after each step: {misses:?}");
    assert!(reserved.iter().all(|&r| r == reserved[0]), "reserved during each step: {reserved:?}");
}

/// Temporaries of sizes far apart, one at a time, seven rounds of them in a step that holds its
/// input throughout (36 allocations; their blocks add up to nearly three times what is live at
/// once), step after step: the device is asked nothing after the fourth step (a pool plans a
/// step it has seen twice, 32 allocations or more, and its first planned step makes the blocks
/// of the plan), whatever the pool serves each from, and each allocation is its own size: its
/// bytes round trip and a read one byte past its end is refused (the block under it may be
/// larger). With caching off: as [`steady_state`].
pub async fn repeating_sizes_far_apart(a: &'static dyn DeviceAllocator, i: DeviceIndex, caching: Caching) {
    let sizes = [1usize << 20, 768 << 10, 512 << 10, 384 << 10, (256 << 10) + 5];
    let mut misses = Vec::new();
    for step in 0..5u64 {
        let input = a.allocate(64 << 10, i, DEFAULT_ALIGNMENT).unwrap();
        for round in 0..7 {
            for (t, &n) in sizes.iter().enumerate() {
                let p = a.allocate(n, i, DEFAULT_ALIGNMENT).unwrap();
                // The last 4 KiB or so, from a 4-byte boundary (under Miri, which interprets every
                // byte of the pattern, 256 bytes).
                let at = (n - if cfg!(miri) { 256 } else { 4096 }) & !3;
                let tail = pattern(n - at, step * 100 + round * 10 + t as u64);
                let end = p.offset(at).unwrap();
                h2d(a, end, &tail, i).await.unwrap();
                assert_eq!(read(a, end, n - at, i).await, tail, "step {step}, {n} bytes");
                let mut past = vec![0u8; n - at + 1];
                let e = d2h(a, &mut past, end, i).await.unwrap_err();
                assert!(matches!(e, devalloc::Error::OutOfBounds { .. }), "a read past {n} bytes: {e}");
                a.deallocate(p, i).unwrap();
            }
        }
        a.deallocate(input, i).unwrap();
        let s = a.stats(i).unwrap();
        if step == 0 && !cached_as_made(a, i, caching, &s, "repeating_sizes_far_apart") {
            return;
        }
        misses.push(s.cache_misses);
    }
    assert!(misses[3..].iter().all(|&m| m == misses[3]), "device allocations after each step: {misses:?}");
}

/// After a first step that freed everything it allocated (`s`: the stats then): an allocator
/// made with caching on kept some of it cached (one that cached nothing has stopped caching,
/// and fails), one made with caching off kept nothing and reused nothing. `true` where the
/// check goes on; `false` for caching off, after saying that its steady state was skipped.
fn cached_as_made(
    a: &dyn DeviceAllocator,
    i: DeviceIndex,
    caching: Caching,
    s: &AllocatorStats,
    test: &str,
) -> bool {
    let on = format!("{test} on {}:{i}", a.device_type());
    match caching {
        Caching::On => {
            assert!(
                s.cached_bytes > 0,
                "{on}: made with caching on, it cached nothing of a step it freed: {s:?}"
            );
            true
        }
        Caching::Off => {
            assert_eq!(
                (s.cached_bytes, s.cache_hits),
                (0, 0),
                "{on}: made with caching off, it cached: {s:?}"
            );
            skip(
                test,
                &format!(
                    "on {}:{i}: caching is off, no steady state to check (it cached nothing)",
                    a.device_type()
                ),
            );
            false
        }
    }
}
