//! The pool's policy, tested through a storage that counts what it is asked for: blocks are
//! reused whatever their label (best fit, at most an eighth past the request's capacity), a memory limit
//! gives back as few cached blocks as make room and falls back to the exact size, and a device
//! that runs out gets the exact size on the retry (and a refusal lifts no quarantine). On host
//! memory: a limit lowered below what is held, and stats that stay consistent under concurrent
//! allocations against a limit.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use devalloc::backend::{Pool, PooledAllocator, Storage};
use devalloc::{
    Device, DeviceAllocator, DevicePtr, DeviceType, Error, HostAllocator, PointerProblem, PoolOptions, Result,
};

/// Bookkeeping only: blocks hold no memory (so sizes up to 2^47 cost nothing); remembers every
/// capacity asked for, and runs out of memory for blocks larger than `oom_above`.
pub struct Counting {
    asked: Mutex<Vec<u64>>,
    oom_above: AtomicU64,
}

impl Counting {
    /// A counting storage of `cpu:0` that never runs out.
    pub fn new() -> Self {
        Counting { asked: Mutex::new(Vec::new()), oom_above: AtomicU64::new(u64::MAX) }
    }
}

impl Storage for Counting {
    type Block = u64;
    type Params = ();
    fn device(&self) -> Device {
        Device::new(DeviceType::Cpu, 0)
    }
    fn max_block_size(&self) -> u64 {
        1 << 47
    }
    fn alloc(&self, capacity: u64, _: u64, _: &(), name: &str) -> Result<u64> {
        assert!(name.starts_with("devalloc block "), "{name}");
        self.asked.lock().unwrap().push(capacity);
        if capacity > self.oom_above.load(Ordering::SeqCst) {
            return Err(Error::OutOfMemory {
                requested: capacity,
                device: self.device(),
                detail: "test".into(),
            });
        }
        Ok(capacity)
    }
    fn write(&self, _: &u64, _: u64, _: &[u8]) -> Result<()> {
        Ok(())
    }
    fn read(&self, _: &u64, _: u64, _: &mut [u8]) -> Result<()> {
        Ok(())
    }
    fn copy(&self, _: &u64, _: u64, _: &u64, _: u64, _: u64) -> Result<()> {
        Ok(())
    }
}

fn counting(limit: Option<u64>) -> PooledAllocator<Counting> {
    let storage = Counting::new();
    let options = PoolOptions { caching: true, memory_limit: limit, ..PoolOptions::default() };
    PooledAllocator::from_pools(DeviceType::Cpu, vec![Pool::new(storage, options).unwrap()]).unwrap()
}

fn asked(a: &PooledAllocator<Counting>) -> Vec<u64> {
    a.pool(0).unwrap().storage().asked.lock().unwrap().clone()
}

#[test]
fn a_freed_block_serves_any_label_and_a_near_size() {
    let a = counting(None);
    let p = a.allocate_labeled(4500, 0, 256, "step0.input").unwrap(); // capacity 4608
    a.deallocate(p, 0).unwrap();
    // Another label, another size of the same block's reach (capacity 4096, up to 4608): reused.
    let q = a.allocate_labeled(4000, 0, 256, "step1.input").unwrap();
    let s = a.stats(0).unwrap();
    assert_eq!((s.cache_hits, s.cache_misses, s.reserved_bytes), (1, 1, 4608), "{s:?}");
    let live = a.pool(0).unwrap().live_allocations();
    assert_eq!(live[0].label.as_deref(), Some("step1.input"));
    assert_eq!(live[0].capacity, 4608, "the block's capacity is what it holds");
    a.deallocate(q, 0).unwrap();
    // A block more than an eighth past the request's capacity is not taken.
    let r = a.allocate(3000, 0, 256).unwrap(); // capacity 3072, reach 3456
    assert_eq!(a.stats(0).unwrap().cache_misses, 2);
    a.deallocate(r, 0).unwrap();
    assert_eq!(asked(&a), vec![4608, 3072]);
}

#[test]
fn under_a_limit_the_exact_size_is_used_when_the_class_does_not_fit() {
    let a = counting(Some(2200));
    let p = a.allocate(1000, 0, 256).unwrap(); // capacity 1024
    let q = a.allocate(1100, 0, 256).unwrap(); // capacity 1536 would pass 2200: exact 1100
    assert_eq!(asked(&a), vec![1024, 1100]);
    assert_eq!(a.stats(0).unwrap().reserved_bytes, 2124);
    assert!(matches!(a.allocate(100, 0, 256), Err(Error::OutOfMemory { .. })));
    a.deallocate(p, 0).unwrap();
    a.deallocate(q, 0).unwrap();
}

#[test]
fn at_the_limit_as_few_cached_blocks_as_make_room_are_given_back() {
    // The limit alone (the budget off: it would give back the oldest blocks, see the tests
    // of the budget below).
    let storage = Counting::new();
    let options = PoolOptions { memory_limit: Some(10_000), cache_headroom: None, ..PoolOptions::default() };
    let a = PooledAllocator::from_pools(DeviceType::Cpu, vec![Pool::new(storage, options).unwrap()]).unwrap();
    let ptrs: Vec<_> = [256usize, 512, 4096].iter().map(|&n| a.allocate(n, 0, 256).unwrap()).collect();
    ptrs.iter().for_each(|&p| a.deallocate(p, 0).unwrap());
    assert_eq!(a.stats(0).unwrap().cached_bytes, 5120);
    // 8000 bytes need 3312 of the cache back: the 4096 block alone does it.
    let p = a.allocate(8000, 0, 256).unwrap();
    let s = a.stats(0).unwrap();
    assert_eq!((s.cached_bytes, s.reserved_bytes), (1024, 1024 + 8192), "{s:?}");
    // The small ones are still there to be reused.
    let q = a.allocate(200, 0, 256).unwrap();
    assert_eq!(a.stats(0).unwrap().cache_hits, 1);
    a.deallocate(p, 0).unwrap();
    a.deallocate(q, 0).unwrap();
}

#[test]
fn when_the_device_runs_out_the_cache_goes_back_and_the_exact_size_is_tried() {
    let a = counting(None);
    let p = a.allocate(3000, 0, 256).unwrap(); // capacity 3072
    a.deallocate(p, 0).unwrap();
    a.pool(0).unwrap().storage().oom_above.store(5000, Ordering::SeqCst);
    let q = a.allocate(4700, 0, 256).unwrap(); // capacity 5120: out of memory; exact 4700 fits
    assert_eq!(asked(&a), vec![3072, 5120, 4700]);
    let s = a.stats(0).unwrap();
    assert_eq!((s.cached_bytes, s.reserved_bytes), (0, 4700), "{s:?}");
    a.deallocate(q, 0).unwrap();
}

/// `allocate_async` takes the same path: the cache given back and the exact size tried once;
/// refused even then, it is `OutOfMemory` and leaves the stats as they were (the cache aside).
#[test]
fn allocate_async_retries_as_allocate_does() {
    let a = counting(None);
    let p = a.allocate(3000, 0, 256).unwrap();
    a.deallocate(p, 0).unwrap();
    a.pool(0).unwrap().storage().oom_above.store(5000, Ordering::SeqCst);
    let q = pollster::block_on(a.allocate_async(4700, 0, 256)).unwrap();
    assert_eq!(asked(&a), vec![3072, 5120, 4700]);
    let s = a.stats(0).unwrap();
    assert_eq!((s.cached_bytes, s.reserved_bytes, s.allocated_bytes), (0, 4700, 4700), "{s:?}");
    let r = pollster::block_on(a.allocate_async(6000, 0, 256));
    assert!(matches!(r, Err(Error::OutOfMemory { .. })), "{r:?}");
    assert_eq!(a.stats(0).unwrap(), s, "a refused allocation changes nothing");
    assert!(matches!(pollster::block_on(a.allocate_async(0, 0, 256)), Err(Error::InvalidArgument { .. })));
    a.deallocate(q, 0).unwrap();
}

#[test]
fn a_workload_that_repeats_with_new_labels_makes_no_device_allocation_after_its_first_step() {
    let a = counting(None);
    let shapes = [4096usize, 1 << 20, 3 << 18, 1000, 77_777];
    let mut misses = Vec::new();
    for step in 0..5 {
        let ptrs: Vec<_> = shapes
            .iter()
            .enumerate()
            .map(|(i, &n)| a.allocate_labeled(n, 0, 256, &format!("t{i}.step{step}")).unwrap())
            .collect();
        ptrs.into_iter().for_each(|p| a.deallocate(p, 0).unwrap());
        misses.push(a.stats(0).unwrap().cache_misses);
    }
    assert_eq!(misses, vec![5; 5], "device allocations after each step");
}

fn problem(r: Result<()>) -> PointerProblem {
    match r {
        Err(Error::InvalidPointer { problem, .. }) => problem,
        other => panic!("not an invalid pointer: {other:?}"),
    }
}

/// "A failed call changes nothing": an allocation the device refuses must not take a stale
/// pointer out of quarantine (the pool lifts quarantine in a full window to find room, and must
/// put it back when the device then says no): a second free of it is still `Freed`.
#[test]
fn a_failed_allocation_does_not_lift_quarantine() {
    let options = PoolOptions { caching: false, address_window: 1 << 17, ..PoolOptions::default() };
    let pool = Pool::new(Counting::new(), options).unwrap();
    let a = PooledAllocator::from_pools(DeviceType::Cpu, vec![pool]).unwrap();
    // Fill the window with 4 KiB allocations, then free them all: all quarantined.
    let mut ptrs = Vec::new();
    while let Ok(p) = a.allocate(4096, 0, 256) {
        ptrs.push(p);
    }
    assert!(ptrs.len() > 10, "{} allocations fill the window", ptrs.len());
    for &p in &ptrs {
        a.deallocate(p, 0).unwrap();
    }
    let stale = ptrs[0];
    assert_eq!(problem(a.deallocate(stale, 0)), PointerProblem::Freed);
    // The device refuses the next allocation.
    a.pool(0).unwrap().storage().oom_above.store(0, Ordering::SeqCst);
    assert!(matches!(a.allocate(4096, 0, 256), Err(Error::OutOfMemory { .. })));
    let after = problem(a.deallocate(stale, 0));
    assert_eq!(after, PointerProblem::Freed, "a refused allocation lifted the quarantine of a freed range");
}

/// A limit lowered below what is held: a request the cache can serve is still served; one it
/// cannot is `TooLarge` when it alone passes the limit, else `OutOfMemory`; and nothing live is
/// touched.
#[test]
fn a_limit_lowered_below_what_is_held() {
    let a = HostAllocator::new();
    let p = a.allocate(100_000, 0, 256).unwrap();
    let q = a.allocate(50_000, 0, 256).unwrap();
    a.deallocate(q, 0).unwrap();
    let before = a.stats(0).unwrap();
    a.set_memory_limit(Some(before.reserved_bytes - 1), 0).unwrap();
    let r = a.allocate(50_000, 0, 256).unwrap();
    assert_eq!(a.stats(0).unwrap().cache_hits, before.cache_hits + 1, "not served from the cache");
    a.deallocate(r, 0).unwrap();
    let held = a.stats(0).unwrap();
    a.set_memory_limit(Some(1000), 0).unwrap();
    assert!(matches!(a.allocate(2000, 0, 256), Err(Error::TooLarge { .. })));
    let e = a.allocate(500, 0, 256).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    let after = a.stats(0).unwrap();
    assert_eq!(
        (after.allocated_bytes, after.live_allocations),
        (held.allocated_bytes, held.live_allocations)
    );
    a.deallocate(p, 0).unwrap();
}

/// Four threads allocate and free at random under an 8 MiB limit (emptying the cache now and
/// then) while another samples the stats: at every sample reserved is within the limit and
/// holds what is cached and what is allocated; at the end the stats add up.
#[test]
fn concurrent_allocations_under_a_limit_keep_the_stats_consistent() {
    let limit = 8 << 20;
    let options = PoolOptions { memory_limit: Some(limit), ..PoolOptions::default() };
    let a: &'static HostAllocator = Box::leak(Box::new(HostAllocator::with_options(options).unwrap()));
    let stop: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let sampler = std::thread::spawn(move || {
        let (mut samples, mut bad) = (0u64, Vec::new());
        while !stop.load(Ordering::Relaxed) {
            let s = a.stats(0).unwrap();
            if s.reserved_bytes > limit
                || s.cached_bytes > s.reserved_bytes
                || s.allocated_bytes > s.reserved_bytes
            {
                bad.push(s);
            }
            samples += 1;
        }
        (samples, bad)
    });
    let workers: Vec<_> = (0..4u64)
        .map(|t| {
            std::thread::spawn(move || {
                let mut rng = crate::conformance::Rng(t + 77);
                let mut mine: Vec<DevicePtr> = Vec::new();
                for i in 0..20_000 {
                    if rng.below(3) > 0 || mine.is_empty() {
                        let cap = if rng.below(8) == 0 { 2 << 20 } else { 40_000 };
                        let size = 1 + rng.below(cap);
                        match a.allocate_labeled(size, 0, 256, &format!("t{t}.{i}")) {
                            Ok(p) => mine.push(p),
                            Err(Error::OutOfMemory { .. }) => {}
                            Err(e) => panic!("{e}"),
                        }
                    } else {
                        let k = rng.below(mine.len());
                        a.deallocate(mine.swap_remove(k), 0).unwrap();
                    }
                    if i % 5000 == 0 {
                        a.empty_cache();
                    }
                }
                for p in mine {
                    a.deallocate(p, 0).unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let (samples, bad) = sampler.join().unwrap();
    assert!(bad.is_empty(), "{} of {samples} samples inconsistent, the first: {:?}", bad.len(), bad[0]);
    let s = a.stats(0).unwrap();
    assert_eq!((s.live_allocations, s.allocated_bytes), (0, 0));
    assert_eq!(s.reserved_bytes, s.cached_bytes, "{s:?}");
    assert_eq!(s.cache_hits + s.cache_misses, s.allocations, "{s:?}");
    assert_eq!(a.empty_cache(), s.cached_bytes);
    assert_eq!(a.stats(0).unwrap().reserved_bytes, 0);
}
