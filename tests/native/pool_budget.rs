//! The cache's budget with no memory limit (the default policy, `PoolOptions::cache_headroom`):
//! a workload that moves on holds at most what its live blocks held at their peak; one that
//! repeats is planned from one repetition and settles, asking the device for nothing more.
//! Through the counting storage of `pool_policy` (blocks never split, as on wgpu).

use devalloc::backend::{Pool, PooledAllocator};
use devalloc::plan::Instance;
use devalloc::replay::{replay, Trace, TraceEvent};
use devalloc::{AllocatorStats, DeviceAllocator, DevicePtr, DeviceType, PoolOptions};

use super::pool_policy::Counting;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

fn pool(headroom: Option<f64>) -> PooledAllocator<Counting> {
    let options = PoolOptions { cache_headroom: headroom, ..PoolOptions::default() };
    PooledAllocator::from_pools(DeviceType::Cpu, vec![Pool::new(Counting::new(), options).unwrap()]).unwrap()
}

/// The stats, checked to add up: what is reserved is live capacity plus the cache.
fn stats(a: &PooledAllocator<Counting>) -> AllocatorStats {
    let s = a.stats(0).unwrap();
    let live: u64 = a.pool(0).unwrap().live_allocations().iter().map(|l| l.capacity).sum();
    assert_eq!(s.reserved_bytes, live + s.cached_bytes, "{s:?}");
    s
}

/// A decode loop: weights that stay, a KV cache that grows every step (each size asked once),
/// an activation per step. Returns (peak reserved, peak live capacity).
fn decode(a: &PooledAllocator<Counting>, steps: usize) -> (u64, u64) {
    let weights = a.allocate(8 * MIB, 0, 256).unwrap();
    let (mut peak_live, mut kv) = (0, None);
    for step in 0..steps {
        let next = a.allocate(MIB + step * 8 * KIB, 0, 256).unwrap();
        let act = a.allocate(256 * KIB, 0, 256).unwrap();
        let s = stats(a);
        peak_live = peak_live.max(s.reserved_bytes - s.cached_bytes);
        a.deallocate(act, 0).unwrap();
        if let Some(old) = kv.replace(next) {
            a.deallocate(old, 0).unwrap();
        }
    }
    a.deallocate(kv.unwrap(), 0).unwrap();
    a.deallocate(weights, 0).unwrap();
    (stats(a).peak_reserved_bytes, peak_live)
}

#[test]
fn a_growing_kv_cache_holds_no_more_than_its_live_blocks_did_at_their_peak() {
    let (reserved, live) = decode(&pool(Some(0.0)), 300);
    assert!(reserved <= live, "peak reserved {reserved} over a peak live of {live}");
    let (reserved, live) = decode(&pool(Some(1.0 / 16.0)), 300);
    assert!(reserved * 16 <= live * 17, "peak reserved {reserved} over a peak live of {live}");
    // The budget off (devalloc before 0.2): every old size stays cached.
    let (reserved, live) = decode(&pool(None), 300);
    assert!(reserved > 10 * live, "peak reserved {reserved} over a peak live of {live}");
}

/// One step of a network without weights: activations layer by layer (input 256 KiB, then
/// 1 MiB, 512 KiB, 256 KiB, 128 KiB), each freed after the next is made, eight times over (33
/// allocations: a pool sees a repetition of 32 allocations or more), beside `base` bytes that
/// stay live. Its blocks add up to 384 KiB more than it holds at once.
fn layers(a: &PooledAllocator<Counting>) {
    let mut prev = a.allocate(256 * KIB, 0, 256).unwrap();
    for _ in 0..8 {
        for n in [MIB, 512 * KIB, 256 * KIB, 128 * KIB] {
            let act = a.allocate(n, 0, 256).unwrap();
            a.deallocate(prev, 0).unwrap();
            prev = act;
        }
    }
    a.deallocate(prev, 0).unwrap();
}

/// Device allocations after each of `steps` steps of `layers` beside `base` live bytes, and
/// reserved after each.
fn repeat(a: &PooledAllocator<Counting>, base: usize, steps: usize) -> (Vec<u64>, Vec<u64>) {
    let base: Option<DevicePtr> = (base > 0).then(|| a.allocate(base, 0, 256).unwrap());
    let (mut misses, mut reserved) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        layers(a);
        let s = stats(a);
        misses.push(s.cache_misses);
        reserved.push(s.reserved_bytes);
    }
    if let Some(b) = base {
        a.deallocate(b, 0).unwrap();
    }
    (misses, reserved)
}

#[test]
fn a_repeating_workload_settles_and_holds_no_more_than_its_peak() {
    // The step's blocks add up to 384 KiB more than it holds at once (1.5 MiB): once it has
    // repeated (two steps), the plan serves it, with nothing more asked of the device.
    for base in [0, 2 * MIB, 64 * MIB] {
        let (misses, reserved) = repeat(&pool(PoolOptions::default().cache_headroom), base, 8);
        assert!(
            misses[3..].iter().all(|&m| m == misses[3]),
            "base {base}: device allocations after each step: {misses:?}"
        );
        assert!(
            reserved[3..].iter().all(|&r| r == reserved[3]),
            "base {base}: reserved after each step: {reserved:?}"
        );
        let most = (base + 1536 * KIB) as u64;
        assert!(
            reserved.iter().all(|&r| r <= most * 9 / 8),
            "base {base}: reserved {reserved:?} over {most}"
        );
    }
}

#[test]
fn temporaries_of_sizes_far_apart_settle() {
    // A step holds its input while temporaries come and go one at a time, each size far from
    // the others (their blocks add up to 2.9x the most live at once), seven rounds of them (36
    // allocations): once the step has repeated, the plan serves every size from the largest
    // block.
    let a = pool(Some(0.0));
    let mut misses = Vec::new();
    for _ in 0..6 {
        let input = a.allocate(64 * KIB, 0, 256).unwrap();
        for _ in 0..7 {
            for n in [MIB, 768 * KIB, 512 * KIB, 384 * KIB, 256 * KIB + 5] {
                let p = a.allocate(n, 0, 256).unwrap();
                let live = a.pool(0).unwrap().live_allocations();
                let own = live.iter().find(|l| l.addr == p.addr()).map(|l| l.size);
                assert_eq!((live.len(), own), (2, Some(n as u64)), "the allocation is its own size");
                a.deallocate(p, 0).unwrap();
            }
        }
        a.deallocate(input, 0).unwrap();
        misses.push(stats(&a).cache_misses);
    }
    assert!(misses[2..].iter().all(|&m| m == misses[2]), "device allocations after each step: {misses:?}");
    let s = stats(&a);
    assert!(s.peak_reserved_bytes <= (MIB + 64 * KIB) as u64, "{s:?}");
}

/// Temporaries one at a time with nothing held around them are no repetition the pool plans
/// for (each is its own excursion of two events; see the pool's policy): the pool holds no
/// more than the largest, and asks the device again for the sizes it gave back.
#[test]
fn temporaries_alone_are_held_to_the_largest() {
    let a = pool(Some(0.0));
    for _ in 0..6 {
        for n in [MIB, 768 * KIB, 512 * KIB, 384 * KIB, 256 * KIB + 5] {
            let p = a.allocate(n, 0, 256).unwrap();
            a.deallocate(p, 0).unwrap();
        }
    }
    let s = stats(&a);
    assert!(s.peak_reserved_bytes <= MIB as u64, "{s:?}");
    assert!(s.cache_misses > 5, "given back and asked for again: {s:?}");
}

/// Replays `trace` on `a` event by event, checking the budget's promise after each where the
/// workload has not repeated yet (`once` events: one pass): the pool holds at most what its
/// live blocks held at their peak, plus a sixteenth where a part of the pass repeats (a layer)
/// and the pool plans it. Returns the peak reserved.
fn replay_within_the_budget(a: &PooledAllocator<Counting>, name: &str, trace: &Trace, once: usize) -> u64 {
    let mut ptrs = std::collections::HashMap::new();
    let mut mark = 0u64;
    for (n, (_, e)) in trace.events.iter().enumerate() {
        match e {
            TraceEvent::Alloc { id, size, .. } => {
                ptrs.insert(*id, a.allocate(*size as usize, 0, 256).unwrap());
            }
            TraceEvent::Free { id } => a.deallocate(ptrs.remove(id).unwrap(), 0).unwrap(),
            TraceEvent::EmptyCache => _ = a.empty_cache(),
        }
        let s = a.stats(0).unwrap();
        mark = mark.max(s.reserved_bytes - s.cached_bytes);
        assert!(
            n >= once || s.reserved_bytes <= mark + mark / 16,
            "{name}, event {n}: reserved {} past a live high-water mark of {mark}",
            s.reserved_bytes
        );
    }
    for (_, p) in ptrs {
        a.deallocate(p, 0).unwrap();
    }
    stats(a).peak_reserved_bytes
}

#[test]
fn model_histories_replayed_again_and_again_settle() {
    // A training loop: each history four times in a row. By the fourth the pool asks the device
    // for nothing (the plan made after the second serves the third and fourth).
    for name in ["convnet", "decode", "large", "mlp_train", "transformer"] {
        let path = format!("{}/tests/data/traces/{name}.csv", env!("CARGO_MANIFEST_DIR"));
        let inst = Instance::from_csv(name, &std::fs::read_to_string(path).unwrap()).unwrap();
        let once = Trace::from_tensors(&inst.tensors, None);
        let counts: Vec<u64> = (1..=4)
            .map(|n| replay(&pool(Some(0.0)), &once.repeated(n).unwrap(), 0).unwrap().device_allocations)
            .collect();
        assert_eq!(counts[3], counts[2], "{name}: device allocations after 1-4 repetitions: {counts:?}");
        // The promise within the first pass; beside it, the figure (reported, not judged):
        // peak reserved over the trace's lower bound.
        let peak =
            replay_within_the_budget(&pool(Some(0.0)), name, &once.repeated(4).unwrap(), once.events.len());
        eprintln!("{name}: four passes held {:.3}x the lower bound", peak as f64 / once.lower_bound() as f64);
    }
}

#[test]
fn near_a_memory_limit_a_larger_block_never_serves_a_size_given_back() {
    // A hostile review's case: a limit of the most live (212,992 bytes) plus an eighth and
    // 4 KiB. Serving the 32 KiB request from the 80 KiB block the budget kept left too little
    // room for the last request, which failed although it fits without caching.
    let options = PoolOptions { memory_limit: Some(243_712), ..PoolOptions::default() };
    let a = PooledAllocator::from_pools(DeviceType::Cpu, vec![Pool::new(Counting::new(), options).unwrap()])
        .unwrap();
    for _ in 0..3 {
        let s1 = a.allocate(118_784, 0, 256).unwrap();
        a.deallocate(s1, 0).unwrap();
        for n in [32_768, 81_920] {
            let s2 = a.allocate(n, 0, 256).unwrap();
            a.deallocate(s2, 0).unwrap();
        }
        let s1 = a.allocate(36_864, 0, 256).unwrap();
        let s0 = a.allocate(32_768, 0, 256).unwrap();
        a.deallocate(s1, 0).unwrap();
        let s1 = a.allocate(106_496, 0, 256).unwrap();
        let s2 = a.allocate(73_728, 0, 256).unwrap();
        for p in [s0, s1, s2] {
            a.deallocate(p, 0).unwrap();
        }
    }
    assert_eq!(stats(&a).allocated_bytes, 0);
}

/// One pass of a serving loop: five requests of different shapes (a width of `w` KiB each),
/// none like another, each a forward pass of 6 identical layers of 20 activations (each freed
/// once the next two are made), beside the request's input. 605 allocations a pass, so the
/// loop repeats only as a whole. Returns the most bytes live at once.
fn serving_pass<A: DeviceAllocator>(a: &A) -> u64 {
    let mut most = 0u64;
    for w in [8, 40, 24, 64, 16] {
        let input = a.allocate(w * KIB, 0, 256).unwrap();
        let mut held = std::collections::VecDeque::new();
        for _layer in 0..6 {
            for k in 0..20 {
                held.push_back((a.allocate(w * KIB * (1 + k % 4), 0, 256).unwrap(), w * (1 + k % 4)));
                let live: usize = held.iter().map(|(_, n)| n).sum::<usize>() + w;
                most = most.max((live * KIB) as u64);
                if held.len() > 2 {
                    a.deallocate(held.pop_front().unwrap().0, 0).unwrap();
                }
            }
        }
        held.into_iter().for_each(|(p, _)| a.deallocate(p, 0).unwrap());
        a.deallocate(input, 0).unwrap();
    }
    most
}

#[test]
fn a_serving_loop_of_requests_that_differ_settles() {
    // No request repeats the one before it, the loop does: once it has been seen twice, its
    // plan serves every pass after, asking the device for nothing, on blocks that never split
    // (as on wgpu) and on host memory, whose blocks split.
    let unsplit = pool(PoolOptions::default().cache_headroom);
    let host = devalloc::HostAllocator::new();
    let mut most = 0;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        most = serving_pass(&unsplit).max(serving_pass(&host));
        a.push(stats(&unsplit).cache_misses);
        b.push(host.stats(0).unwrap().cache_misses);
    }
    assert!(a[3..].iter().all(|&m| m == a[2]), "device allocations after each pass, unsplit: {a:?}");
    assert!(b[3..].iter().all(|&m| m == b[2]), "device allocations after each pass, host: {b:?}");
    let (u, h) = (stats(&unsplit).peak_reserved_bytes, host.stats(0).unwrap().peak_reserved_bytes);
    eprintln!("serving loop: most live {most}, peak reserved unsplit {u}, host {h}");
    assert!(h <= most * 9 / 8, "host: peak reserved {h} over the most live, {most}");
    assert!(u <= most * 3 / 2, "unsplit: peak reserved {u} over the most live, {most}");
}
