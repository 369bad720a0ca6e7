//! The pool's budget under 16 threads at once (from the review of issue 27): whatever the
//! headroom, with and without a memory limit, they leave nothing behind. With no limit every
//! allocation must succeed; under one, a refusal stands only where the request would pass the
//! limit with the other threads stopped and the cache given back, and is served otherwise
//! (`split_real::limit_refusals::Gate`).

use std::sync::Arc;

use devalloc::{DeviceAllocator, HostAllocator, PoolOptions};

use super::{check, fake, st, Rng, KIB, MIB};
use crate::split_real::limit_refusals::Gate;

#[test]
fn sixteen_threads_leave_nothing_behind() {
    for headroom in [Some(1.0 / 16.0), Some(0.0), None] {
        for limit in [None, Some(64 * MIB as u64)] {
            let a = Arc::new(fake(PoolOptions {
                cache_headroom: headroom,
                memory_limit: limit,
                ..PoolOptions::default()
            }));
            let gate = Arc::new(Gate::default());
            let hs: Vec<_> = (0..16u64)
                .map(|t| {
                    let (a, gate) = (a.clone(), gate.clone());
                    std::thread::spawn(move || {
                        let mut rng = Rng(t * 7919 + 17);
                        let mut mine = Vec::new();
                        for _ in 0..4000 {
                            if rng.below(3) < 2 || mine.is_empty() {
                                let top = if rng.below(8) == 0 { 4 * MIB as u64 } else { 64 * KIB as u64 };
                                let size = 1 + rng.below(top) as usize;
                                let align = 256 << rng.below(4);
                                let made = match (gate.call(|| a.allocate(size, 0, align)), limit) {
                                    (Ok(p), _) => {
                                        gate.count.made();
                                        Some(p)
                                    }
                                    (Err(e), None) => {
                                        panic!("thread {t}: allocate({size}) with no limit: {e}")
                                    }
                                    (Err(e), Some(limit)) => gate.refused(&*a, &e, size, align, limit),
                                };
                                mine.extend(made);
                            } else {
                                let i = rng.below(mine.len() as u64) as usize;
                                let p = mine.swap_remove(i);
                                gate.call(|| a.deallocate(p, 0)).unwrap();
                            }
                            if rng.below(500) == 0 {
                                gate.call(|| a.empty_cache());
                            }
                        }
                        for p in mine {
                            a.deallocate(p, 0).unwrap();
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            let (s, _) = check(&a);
            assert_eq!((s.allocated_bytes, s.live_allocations), (0, 0));
            let (made, refused, retried) = gate.count.counts();
            assert_eq!(s.allocations, made, "allocations counted by the threads and by the pool");
            if let Some(limit) = limit {
                // The threads hold more than the limit allows (two thirds of their calls allocate):
                // refusals must have come, and only once the pool had come close to the limit.
                assert!(refused > 0, "{made} allocations under {limit} and none refused: {s:?}");
                assert!(s.peak_reserved_bytes + 4 * MIB as u64 > limit, "{s:?}");
            }
            a.empty_cache();
            let (s, _) = check(&a);
            assert_eq!((s.reserved_bytes, s.cached_bytes), (0, 0), "{s:?}");
            assert_eq!(st(&a).blocks.load(std::sync::atomic::Ordering::SeqCst), 0);
            eprintln!(
                "threads {headroom:?} {limit:?}: {made} allocations ({retried} refused at first), {refused} \
                 refused; {s:?}"
            );
        }
    }
    // Host memory too, with no limit: every allocation succeeds.
    let a = Arc::new(HostAllocator::new());
    let hs: Vec<_> = (0..16u64)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                let mut rng = Rng(t * 31 + 5);
                let mut mine = Vec::new();
                for _ in 0..2000 {
                    if rng.below(3) < 2 || mine.is_empty() {
                        let size = 1 + rng.below(256 * KIB as u64);
                        mine.push(a.allocate(size as usize, 0, 256).unwrap());
                    } else {
                        let i = rng.below(mine.len() as u64) as usize;
                        a.deallocate(mine.swap_remove(i), 0).unwrap();
                    }
                }
                for p in mine {
                    a.deallocate(p, 0).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let s = a.stats(0).unwrap();
    assert_eq!(s.reserved_bytes, s.cached_bytes, "{s:?}");
    a.empty_cache();
    let s = a.stats(0).unwrap();
    assert_eq!((s.reserved_bytes, s.cached_bytes, s.allocated_bytes), (0, 0, 0), "{s:?}");
}
