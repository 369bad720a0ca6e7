//! Split blocks under a hostile caller, through the public API, on host memory: pieces freed
//! under copies in flight, merging, refused requests (the split storage with real addresses, random
//! operations and threads are in `split_real`). The helpers here serve both.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;

use devalloc::snapshot::EventKind;
use devalloc::{
    AllocatorStats, DeviceAllocator, DevicePtr, Error, HostAllocator, PointerProblem, PoolOptions,
};

use super::util::poll_once;

pub(super) const KIB: usize = 1 << 10;
pub(super) const MIB: usize = 1 << 20;

// ---------------------------------------------------------------------------------------------
// Helpers

/// Stats that add up: reserved == live capacities + cached.
pub(super) fn adds_up<A: DeviceAllocator + ?Sized>(
    a: &A,
    live: &[devalloc::snapshot::LiveAllocation],
) -> AllocatorStats {
    let s = a.stats(0).unwrap();
    let cap: u64 = live.iter().map(|l| l.capacity).sum();
    assert_eq!(s.reserved_bytes, cap + s.cached_bytes, "reserved != live capacities + cached: {s:?}");
    assert_eq!(s.live_allocations, live.len() as u64, "{s:?}");
    s
}

/// Makes the pool see a workload repeat: twice a step that holds `n` bytes while 31 one-byte
/// temporaries come and go (64 events, the least a period may be: see the pool's policy),
/// leaving its blocks cached. While the workload repeats (anything live after it starts the next
/// step), a request that no cached block of its size serves takes a piece of a larger one.
/// What these tests need to hold pieces: the pool splits a block only for a repeating workload.
/// The temporaries' own block, of [`EXTRA`] bytes, stays cached too.
pub(super) fn repeating<A: DeviceAllocator + ?Sized>(a: &A, n: usize) {
    for _ in 0..2 {
        let p = a.allocate(n, 0, 256).unwrap();
        for _ in 0..31 {
            let q = a.allocate(1, 0, 256).unwrap();
            a.deallocate(q, 0).unwrap();
        }
        a.deallocate(p, 0).unwrap();
    }
}

/// The bytes of the block [`repeating`]'s one-byte temporaries leave cached (host memory's
/// smallest block).
pub(super) const EXTRA: u64 = 512;

pub(super) fn host_adds_up(a: &HostAllocator) -> AllocatorStats {
    adds_up(a, &a.live_allocations(0).unwrap())
}

pub(super) fn shares_a_block(live: &[devalloc::snapshot::LiveAllocation]) -> bool {
    let mut ids: Vec<u64> = live.iter().map(|l| l.block).collect();
    ids.sort_unstable();
    ids.windows(2).any(|w| w[0] == w[1])
}

pub(super) fn block_of(a: &HostAllocator, p: DevicePtr) -> u64 {
    a.live_allocations(0).unwrap().iter().find(|l| l.addr == p.addr()).expect("live").block
}

pub(super) fn fill<A: DeviceAllocator + ?Sized>(a: &A, p: DevicePtr, n: usize, seed: u8) {
    a.copy_host_to_device(p, &vec![seed; n], 0).unwrap();
}

pub(super) fn holds<A: DeviceAllocator + ?Sized>(a: &A, p: DevicePtr, n: usize, seed: u8) -> bool {
    let mut got = vec![0u8; n];
    a.copy_device_to_host(&mut got, p, 0).unwrap();
    got == vec![seed; n]
}

/// Drives a future polled by hand to its end.
pub(super) fn finish<F: std::future::Future + ?Sized>(mut fut: std::pin::Pin<&mut F>) -> F::Output {
    for _ in 0..10_000 {
        if let Poll::Ready(v) = poll_once(fut.as_mut()) {
            return v;
        }
    }
    panic!("the future never finished");
}

pub(super) struct Rng(pub(super) u64);
impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The viewer's model (web/viewer.js): replays alloc/free/evict/empty_cache events and checks
/// that what it recomputes (live capacities + cached) is what the stats say, and that its
/// cached bytes never go negative on the way (the viewer clamps them at 0, hiding that).
pub(super) fn replay_matches(snap: &devalloc::snapshot::Snapshot) {
    let d = &snap.devices[0];
    let h = d.history.as_ref().expect("recording");
    assert_eq!(h.dropped, 0, "the ring kept everything");
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    let mut cached: i128 = 0;
    for e in &h.events {
        match &e.kind {
            EventKind::Alloc { addr, capacity, from_cache, .. } => {
                assert!(live.insert(*addr, *capacity).is_none(), "alloc at a live address: {e:?}");
                if *from_cache {
                    cached -= *capacity as i128;
                }
            }
            EventKind::Free { addr, capacity, to_cache, .. } => {
                assert_eq!(live.remove(addr), Some(*capacity), "free of what was not live: {e:?}");
                if *to_cache {
                    cached += *capacity as i128;
                }
            }
            EventKind::Evict { bytes } | EventKind::EmptyCache { bytes } => cached -= *bytes as i128,
            _ => {}
        }
        assert!(cached >= 0, "the replayed cache went negative at {e:?}");
    }
    let cap: u64 = live.values().sum();
    assert_eq!(cached, d.stats.cached_bytes as i128, "replayed cached vs stats: {:?}", d.stats);
    assert_eq!(cap + d.stats.cached_bytes, d.stats.reserved_bytes, "replayed reserved vs stats");
    let snap_live: BTreeMap<u64, u64> = d.live.iter().map(|l| (l.addr, l.capacity)).collect();
    assert_eq!(live, snap_live, "replayed live allocations vs the snapshot's");
}

// ---------------------------------------------------------------------------------------------
// Promises that held

/// The in-flight rule: a piece freed while an async write into it still runs is not handed out
/// again, so the rest of that write never reaches the allocation that comes next.
#[test]
fn a_piece_freed_under_an_async_write_is_not_reused_while_the_write_runs() {
    let a = HostAllocator::new();
    repeating(&a, 16 * MIB);
    let p = a.allocate(8 * MIB, 0, 256).unwrap();
    let q = a.allocate(4 * MIB, 0, 256).unwrap();
    assert_eq!(block_of(&a, p), block_of(&a, q), "pieces of one block");
    fill(&a, q, 4 * MIB, 0x22);
    let data = vec![0xAAu8; 8 * MIB];
    let mut fut = a.copy_host_to_device_async(p, &data, 0);
    assert!(poll_once(fut.as_mut()).is_pending(), "one 4 MiB chunk per poll");
    a.deallocate(p, 0).unwrap();
    host_adds_up(&a);
    // Every size that would fit where p was.
    let n8 = a.allocate(8 * MIB, 0, 256).unwrap();
    let n4 = a.allocate(4 * MIB, 0, 256).unwrap();
    fill(&a, n8, 8 * MIB, 0x33);
    fill(&a, n4, 4 * MIB, 0x44);
    assert_eq!(finish(fut.as_mut()).map_err(|e| e.to_string()), Ok(()));
    drop(fut);
    assert!(holds(&a, n8, 8 * MIB, 0x33), "the write in flight reached a new allocation");
    assert!(holds(&a, n4, 4 * MIB, 0x44), "the write in flight reached a new allocation");
    assert!(holds(&a, q, 4 * MIB, 0x22));
    for x in [q, n8, n4] {
        a.deallocate(x, 0).unwrap();
    }
    let s = host_adds_up(&a);
    assert_eq!(s.reserved_bytes, s.cached_bytes);
    a.empty_cache();
    assert_eq!(host_adds_up(&a).reserved_bytes, 0, "nothing left behind");
}

/// The same with an async device-to-device copy between two pieces of one block, its source
/// and its destination freed mid-copy, and a read in flight from a freed piece.
#[test]
fn async_copies_between_pieces_survive_frees_mid_copy() {
    let a = HostAllocator::new();
    repeating(&a, 24 * MIB);
    let s = a.allocate(8 * MIB, 0, 256).unwrap();
    let d = a.allocate(8 * MIB, 0, 256).unwrap();
    assert_eq!(block_of(&a, s), block_of(&a, d));
    fill(&a, s, 8 * MIB, 0x5A);
    let mut fut = a.copy_device_to_device_async(d, 0, s, 0, 8 * MIB);
    assert!(poll_once(fut.as_mut()).is_pending());
    a.deallocate(s, 0).unwrap();
    a.deallocate(d, 0).unwrap();
    let mut new = Vec::new();
    for k in 0..4u8 {
        let p = a.allocate(4 * MIB, 0, 256).unwrap();
        fill(&a, p, 4 * MIB, 0x60 + k);
        new.push(p);
    }
    assert_eq!(finish(fut.as_mut()).map_err(|e| e.to_string()), Ok(()));
    drop(fut);
    for (k, &p) in new.iter().enumerate() {
        assert!(holds(&a, p, 4 * MIB, 0x60 + k as u8), "piece {k} was written by the copy in flight");
    }
    // A read in flight from a freed piece reads what that piece held.
    let r = a.allocate(8 * MIB, 0, 256).unwrap();
    fill(&a, r, 8 * MIB, 0x77);
    let mut got = vec![0u8; 8 * MIB];
    {
        let mut fut = a.copy_device_to_host_async(&mut got, r, 0);
        assert!(poll_once(fut.as_mut()).is_pending());
        a.deallocate(r, 0).unwrap();
        let o = a.allocate(8 * MIB, 0, 256).unwrap();
        fill(&a, o, 8 * MIB, 0x11);
        new.push(o);
        assert!(finish(fut.as_mut()).is_ok());
    }
    assert!(got.iter().all(|&b| b == 0x77), "the read in flight saw another allocation's bytes");
    for p in new {
        a.deallocate(p, 0).unwrap();
    }
    a.empty_cache();
    assert_eq!(host_adds_up(&a).reserved_bytes, 0);
}

/// Freed pieces merge in any order, and a request fits the merged range without the device.
#[test]
fn freed_pieces_merge_in_any_order() {
    for order in [[0, 1, 2], [2, 1, 0], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1]] {
        let a = HostAllocator::new();
        repeating(&a, 4 * MIB);
        let first = a.allocate(MIB, 0, 256).unwrap();
        let mid: Vec<DevicePtr> = (0..3).map(|_| a.allocate(512 * KIB, 0, 256).unwrap()).collect();
        let misses = host_adds_up(&a).cache_misses;
        for k in order {
            a.deallocate(mid[k], 0).unwrap();
            host_adds_up(&a);
        }
        // 1.5 MiB freed in the middle + 1.5 MiB free at the end: 3 MiB in one range.
        let whole = a.allocate(3 * MIB, 0, 256).unwrap();
        let s = host_adds_up(&a);
        assert_eq!(s.cache_misses, misses, "order {order:?}: the merged range served 3 MiB: {s:?}");
        assert_eq!(block_of(&a, whole), block_of(&a, first));
        a.deallocate(first, 0).unwrap();
        a.deallocate(whole, 0).unwrap();
        assert_eq!(a.empty_cache(), 4 * MIB as u64 + EXTRA, "whole again");
    }
}

/// Refused requests change nothing while a split block has free ranges: the address window
/// full, a size past the limit, a bad alignment.
#[test]
fn refused_requests_leave_split_blocks_alone() {
    let a = HostAllocator::with_options(PoolOptions { address_window: 1 << 17, ..PoolOptions::default() })
        .unwrap();
    repeating(&a, 32 * KIB);
    // Pieces of the 32 KiB block at the window's 64 KiB-aligned addresses, until none is left.
    let mut others = Vec::new();
    loop {
        match a.allocate(8 * KIB, 0, 64 * KIB) {
            Ok(p) => others.push(p),
            Err(Error::OutOfMemory { .. }) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(others.len() < 8);
    }
    let x = others.pop().unwrap();
    fill(&a, x, 8 * KIB, 9);
    let cached = host_adds_up(&a).cached_bytes;
    assert!(cached >= 8 * KIB as u64, "the split block still has a free range: {cached}");
    assert!(a.live_allocations(0).unwrap().iter().all(|l| l.block == block_of(&a, x)), "all pieces of it");
    let before = (host_adds_up(&a), a.live_allocations(0).unwrap());
    // The split block has room for this, but the window has no such address.
    let r = a.allocate(4 * KIB, 0, 64 * KIB);
    assert!(matches!(r, Err(Error::OutOfMemory { .. })), "{r:?}");
    let r = a.allocate(4 * KIB, 0, 3);
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    a.set_memory_limit(Some(before.0.reserved_bytes), 0).unwrap();
    let r = a.allocate(before.0.reserved_bytes as usize + 1, 0, 256);
    assert!(matches!(r, Err(Error::TooLarge { .. })), "{r:?}");
    let after = (host_adds_up(&a), a.live_allocations(0).unwrap());
    assert_eq!(before.0, after.0);
    assert_eq!(before.1, after.1);
    assert!(holds(&a, x, 8 * KIB, 9));
    // Interior, end-of-piece and stale frees of pieces.
    let interior = a.deallocate(x.offset(512).unwrap(), 0);
    assert!(
        matches!(interior, Err(Error::InvalidPointer { problem: PointerProblem::NotAllocationStart, .. })),
        "{interior:?}"
    );
    a.deallocate(x, 0).unwrap();
    let again = a.deallocate(x, 0);
    assert!(matches!(again, Err(Error::InvalidPointer { problem: PointerProblem::Freed, .. })), "{again:?}");
    assert_eq!(host_adds_up(&a).live_allocations, others.len() as u64);
    // Its last piece freed, the block is whole again, and the window has its address back.
    let s = host_adds_up(&a);
    assert_eq!((s.reserved_bytes, s.cached_bytes), (32 * KIB as u64 + EXTRA, 32 * KIB as u64 + EXTRA));
    let y = a.allocate(4 * KIB, 0, 64 * KIB).unwrap();
    a.deallocate(y, 0).unwrap();
}

/// The in-flight rule is per piece (a hostile review found it per block): a piece freed while an
/// async copy into a *different* piece of its block runs is free again at once, so under a
/// limit an allocation that fits in what the pool says is cached succeeds, copy or no copy.
#[test]
fn a_piece_freed_during_a_copy_into_another_piece_is_free_again() {
    let run = |with_copy: bool| {
        let a = HostAllocator::new();
        repeating(&a, 16 * MIB);
        let p = a.allocate(5 * MIB, 0, 256).unwrap();
        let q = a.allocate(4 * MIB, 0, 256).unwrap();
        assert_eq!(block_of(&a, p), block_of(&a, q));
        let data = vec![1u8; 5 * MIB];
        let mut fut = a.copy_host_to_device_async(p, &data, 0);
        if with_copy {
            assert!(poll_once(fut.as_mut()).is_pending());
        }
        // q is not the copy's target.
        a.deallocate(q, 0).unwrap();
        assert!(finish(fut.as_mut()).is_ok());
        drop(fut);
        // Nothing is in flight now: 11 MiB of the block are free, 5 MiB live.
        let s = host_adds_up(&a);
        assert_eq!((s.reserved_bytes, s.cached_bytes), (16 * MIB as u64 + EXTRA, 11 * MIB as u64 + EXTRA));
        a.empty_cache();
        a.set_memory_limit(Some(16 * MIB as u64), 0).unwrap();
        let r = a.allocate(9 * MIB, 0, 256);
        let s = host_adds_up(&a);
        (r.map(|_| ()).map_err(|e| e.to_string()), s)
    };
    let (without, _) = run(false);
    assert_eq!(without, Ok(()), "control: 5 MiB live + 9 MiB under a 16 MiB limit, 11 MiB cached");
    let (with, s) = run(true);
    assert_eq!(with, Ok(()), "after an async copy into another piece had ended: {s:?}");
}

/// The same with blocking copies into one piece on another thread: a loop that frees and
/// allocates another size meanwhile reuses its own range, and asks the device for nothing.
#[test]
fn copies_on_another_thread_leave_frees_of_other_pieces_reusable() {
    let a = Arc::new(HostAllocator::new());
    repeating(&*a, 64 * MIB);
    let p = a.allocate(16 * MIB, 0, 256).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicBool::new(false));
    let copier = {
        let (a, stop, started) = (a.clone(), stop.clone(), started.clone());
        std::thread::spawn(move || {
            let data = vec![3u8; 16 * MIB];
            while !stop.load(Ordering::Relaxed) {
                a.copy_host_to_device(p, &data, 0).unwrap();
                started.store(true, Ordering::Relaxed);
            }
        })
    };
    while !started.load(Ordering::Relaxed) {
        std::thread::yield_now();
    }
    let misses0 = a.stats(0).unwrap().cache_misses;
    for _ in 0..200 {
        let q = a.allocate(MIB, 0, 256).unwrap();
        a.deallocate(q, 0).unwrap();
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    stop.store(true, Ordering::Relaxed);
    copier.join().unwrap();
    // Nothing in flight now, p live: the other 48 MiB of its block are free, the stats say so.
    let s = host_adds_up(&a);
    let all = a.allocate(48 * MIB, 0, 256).map(|_| ()).map_err(|e| e.to_string());
    let t = host_adds_up(&a);
    assert_eq!(
        (all, t.cache_misses - misses0),
        (Ok(()), 0),
        "48 MiB of p's block free, yet fresh blocks: before {s:?}, after {t:?}"
    );
}

/// The documented price of filling holes: a free range of a split block serves any request, so
/// a small piece kept there keeps the block from going back (`larger.rs` says why the 4x bound
/// on splitting a whole block is not applied to free ranges). Without the earlier split, the
/// small request gets its own block and the large one goes back.
#[test]
fn a_small_piece_in_a_free_range_keeps_its_block_from_going_back() {
    let run = |split_first: bool| {
        let a = HostAllocator::new();
        repeating(&a, MIB);
        let mid = split_first.then(|| a.allocate(256 * KIB, 0, 256).unwrap());
        // Larger than the temporaries' block `repeating` leaves cached.
        let tiny = a.allocate(1024, 0, 256).unwrap();
        if let Some(m) = mid {
            a.deallocate(m, 0).unwrap();
        }
        let gave = a.empty_cache();
        let s = host_adds_up(&a);
        a.deallocate(tiny, 0).unwrap();
        (gave, s.reserved_bytes)
    };
    // Only the temporaries' block goes back.
    assert_eq!(
        run(false),
        (EXTRA, MIB as u64),
        "while the workload repeats the small request takes a piece too"
    );
    assert_eq!(run(true), (EXTRA, MIB as u64), "the block holds the small piece: nothing goes back");
}

/// The snapshot's `cached` list (cached blocks by capacity) includes the free ranges of split
/// blocks, which the stats count as cached: the two agree.
#[test]
fn the_snapshot_lists_the_free_ranges_of_split_blocks_as_cached() {
    let a = HostAllocator::new();
    repeating(&a, 4 * MIB);
    let _p = a.allocate(2 * MIB, 0, 256).unwrap();
    let snap = a.snapshot().unwrap();
    let d = &snap.devices[0];
    let listed: u64 = d.cached.iter().map(|c| c.capacity * c.count).sum();
    assert_eq!(listed, d.stats.cached_bytes, "snapshot cached list {:?} vs stats {:?}", d.cached, d.stats);
}
