//! The pool's budget under a hostile caller (from the review of issue 27): random sequences
//! of allocations, frees, double frees, `empty_cache`, limits and storage failures over every
//! headroom setting (NaN, negative, infinite and `None` included) keep the stats adding up to
//! what the storage holds; 16 threads at once leave nothing behind (`pool_budget_threads.rs`); a refused request leaves
//! the order the budget gives blocks back alone; sizes past what a u64 of held bytes can count
//! are refused, not a panic. Through a storage that holds no memory but counts it.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use devalloc::backend::{Pool, PooledAllocator, Storage};
use devalloc::{
    AllocatorStats, Device, DeviceAllocator, DevicePtr, DeviceType, Error, PointerProblem, PoolOptions,
    Result,
};

use super::pool_policy::Counting;

#[path = "pool_budget_threads.rs"]
mod threads;

const KIB: usize = 1 << 10;

fn counting_pool(options: PoolOptions) -> PooledAllocator<Counting> {
    PooledAllocator::from_pools(DeviceType::Cpu, vec![Pool::new(Counting::new(), options).unwrap()]).unwrap()
}
const MIB: usize = 1 << 20;

/// A storage that holds no memory but counts what it holds (bytes and blocks, through the
/// blocks' Drop), and fails on demand: 1 = OutOfMemory, 2 = a backend error, 3 = OOM above
/// `oom_above`.
#[derive(Default)]
pub struct Fake {
    held: Arc<AtomicU64>,
    blocks: Arc<AtomicU64>,
    allocs: AtomicU64,
    fail: AtomicU8,
    oom_above: AtomicU64,
    real: bool,
    next_addr: AtomicU64,
    max_block: u64,
}

pub struct FBlock {
    cap: u64,
    addr: u64,
    held: Arc<AtomicU64>,
    blocks: Arc<AtomicU64>,
}

impl Drop for FBlock {
    fn drop(&mut self) {
        self.held.fetch_sub(self.cap, Ordering::SeqCst);
        self.blocks.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Fake {
    fn new() -> Self {
        Fake {
            oom_above: AtomicU64::new(u64::MAX),
            max_block: 1 << 47,
            next_addr: AtomicU64::new(1 << 20),
            ..Default::default()
        }
    }
    fn held(&self) -> u64 {
        self.held.load(Ordering::SeqCst)
    }
}

impl Storage for Fake {
    type Block = FBlock;
    type Params = ();
    fn device(&self) -> Device {
        Device::new(DeviceType::Cpu, 0)
    }
    fn max_block_size(&self) -> u64 {
        self.max_block
    }
    fn has_real_addresses(&self) -> bool {
        self.real
    }
    fn address(&self, b: &FBlock) -> Option<u64> {
        self.real.then_some(b.addr)
    }
    fn alloc(&self, capacity: u64, alignment: u64, _: &(), _name: &str) -> Result<FBlock> {
        let f = self.fail.load(Ordering::SeqCst);
        if f == 1 || (f == 3 && capacity > self.oom_above.load(Ordering::SeqCst)) {
            return Err(Error::OutOfMemory {
                requested: capacity,
                device: self.device(),
                detail: "fake".into(),
            });
        }
        if f == 2 {
            return Err(Error::backend(self.device(), "fake backend failure"));
        }
        self.allocs.fetch_add(1, Ordering::SeqCst);
        self.held.fetch_add(capacity, Ordering::SeqCst);
        self.blocks.fetch_add(1, Ordering::SeqCst);
        let a = alignment.max(256);
        let addr = self.next_addr.fetch_add(capacity.saturating_add(a) / a * a + a, Ordering::SeqCst);
        let addr = addr.div_ceil(a).saturating_mul(a);
        Ok(FBlock { cap: capacity, addr, held: self.held.clone(), blocks: self.blocks.clone() })
    }
    fn write(&self, _: &FBlock, _: u64, _: &[u8]) -> Result<()> {
        Ok(())
    }
    fn read(&self, _: &FBlock, _: u64, _: &mut [u8]) -> Result<()> {
        Ok(())
    }
    fn copy(&self, _: &FBlock, _: u64, _: &FBlock, _: u64, _: u64) -> Result<()> {
        Ok(())
    }
}

fn fake_with(options: PoolOptions, storage: Fake) -> PooledAllocator<Fake> {
    PooledAllocator::from_pools(DeviceType::Cpu, vec![Pool::new(storage, options).unwrap()]).unwrap()
}

fn fake(options: PoolOptions) -> PooledAllocator<Fake> {
    fake_with(options, Fake::new())
}

fn st(a: &PooledAllocator<Fake>) -> &Fake {
    a.pool(0).unwrap().storage()
}

/// Stats checked: reserved == live capacity + cached == what the storage holds.
fn check(a: &PooledAllocator<Fake>) -> (AllocatorStats, u64) {
    let s = a.stats(0).unwrap();
    let live: u64 = a.pool(0).unwrap().live_allocations().iter().map(|l| l.capacity).sum();
    assert_eq!(s.reserved_bytes, live + s.cached_bytes, "{s:?}");
    assert_eq!(s.reserved_bytes, st(a).held(), "storage holds what reserved says: {s:?}");
    assert!(s.peak_reserved_bytes >= s.reserved_bytes);
    (s, live)
}

/// Tiny deterministic RNG.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn random_operations_keep_the_stats_adding_up_to_what_the_storage_holds() {
    let headrooms = [
        Some(1.0 / 16.0),
        Some(0.0),
        Some(f64::NAN),
        Some(-1.0),
        Some(f64::INFINITY),
        Some(f64::NEG_INFINITY),
        Some(2.0),
        Some(f64::MIN_POSITIVE),
        None,
    ];
    let mut cfg = 0;
    let mut totals = (0u64, 0u64, 0u64);
    for &headroom in &headrooms {
        for caching in [true, false] {
            for reuse_freed in [true, false] {
                for seed in 1..=6u64 {
                    cfg += 1;
                    let options = PoolOptions {
                        cache_headroom: headroom,
                        caching,
                        reuse_freed,
                        ..PoolOptions::default()
                    };
                    let a = fake(options);
                    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ cfg | 1);
                    let mut live: Vec<DevicePtr> = Vec::new();
                    let mut last_peak = 0;
                    let mut peak_live = 0u64;
                    let mut limited = false;
                    for op in 0..4000 {
                        let (before, _) = check(&a);
                        let r = rng.below(100);
                        if r < 50 {
                            let size = match rng.below(9) {
                                6..=8 => {
                                    [
                                        1000u64,
                                        4096,
                                        70_000,
                                        65_536,
                                        300_000,
                                        MIB as u64,
                                        900_000,
                                        3 * MIB as u64,
                                    ][rng.below(8) as usize]
                                        + rng.below(3)
                                }
                                0 => 1 + rng.below(600),
                                1 => 1 + rng.below(64 * 1024),
                                2 => (1 + rng.below(8)) * MIB as u64 + rng.below(4096),
                                3 => 512 * (1 + rng.below(40)),
                                4 => 1 << (8 + rng.below(24)),
                                _ => 1 + rng.below(4 * MIB as u64),
                            } as usize;
                            let align = 1usize << rng.below(16);
                            match a.allocate(size, 0, align) {
                                Ok(p) => {
                                    assert_eq!(p.addr() % align.max(256) as u64, 0);
                                    live.push(p)
                                }
                                Err(e) => {
                                    let (after, _) = check(&a);
                                    assert_eq!(after.allocated_bytes, before.allocated_bytes);
                                    assert_eq!(after.live_allocations, before.live_allocations);
                                    assert_eq!(after.allocations, before.allocations, "{e}");
                                    assert_eq!(
                                        before.reserved_bytes - after.reserved_bytes,
                                        before.cached_bytes - after.cached_bytes,
                                        "{e}"
                                    );
                                    match e {
                                        Error::OutOfMemory { .. } | Error::Backend { .. } => {}
                                        e => assert_eq!(after.cached_bytes, before.cached_bytes, "{e}"),
                                    }
                                }
                            }
                        } else if r < 88 {
                            if !live.is_empty() {
                                let i = rng.below(live.len() as u64) as usize;
                                let p = live.swap_remove(i);
                                a.deallocate(p, 0).unwrap();
                                // Double free is reported.
                                if rng.below(10) == 0 {
                                    match a.deallocate(p, 0) {
                                        Err(Error::InvalidPointer { problem, .. }) => {
                                            assert_eq!(problem, PointerProblem::Freed)
                                        }
                                        other => panic!("double free: {other:?}"),
                                    }
                                }
                            }
                        } else if r < 90 {
                            a.empty_cache();
                            assert_eq!(check(&a).0.cached_bytes, 0);
                        } else if r < 94 {
                            // A limit: set below, at, above reserved, or lifted.
                            let s = before.reserved_bytes;
                            let limit = match rng.below(4) {
                                0 => None,
                                1 => Some(s / 2),
                                2 => Some(s),
                                _ => Some(s + rng.below(8 * MIB as u64)),
                            };
                            limited |= limit.is_some();
                            a.set_memory_limit(limit, 0).unwrap();
                        } else if r < 97 {
                            st(&a).fail.store(rng.below(4) as u8, Ordering::SeqCst);
                            st(&a).oom_above.store(rng.below(4 * MIB as u64), Ordering::SeqCst);
                        } else {
                            st(&a).fail.store(0, Ordering::SeqCst);
                        }
                        let (s, l) = check(&a);
                        assert!(s.peak_reserved_bytes >= last_peak, "peak_reserved went down at op {op}");
                        last_peak = s.peak_reserved_bytes;
                        peak_live = peak_live.max(l);
                        // The budget's promise (no limit ever set, a valid fraction).
                        if let (Some(f), false, true, true) = (headroom, limited, caching, reuse_freed) {
                            if f.is_finite() && (0.0..=1.0).contains(&f) {
                                let bound = peak_live as f64 * (1.0 + f + 1.0 / 16.0) + 1.0;
                                assert!(
                                    (s.reserved_bytes as f64) <= bound,
                                    "op {op} headroom {f}: reserved {} over peak live {peak_live}",
                                    s.reserved_bytes
                                );
                            }
                        }
                    }
                    st(&a).fail.store(0, Ordering::SeqCst);
                    let s0 = check(&a).0;
                    totals.0 += s0.allocations;
                    totals.1 += s0.cache_hits;
                    totals.2 += 1;
                    for p in live.drain(..) {
                        a.deallocate(p, 0).unwrap();
                    }
                    a.empty_cache();
                    let (s, _) = check(&a);
                    assert_eq!((s.reserved_bytes, s.cached_bytes, s.allocated_bytes), (0, 0, 0), "{s:?}");
                    assert_eq!(st(&a).blocks.load(Ordering::SeqCst), 0);
                }
            }
        }
    }
    eprintln!("fuzz: {totals:?} (allocations, cache hits, runs)");
}

/// A loop that uses one temporary at a time, of five sizes each more than an eighth apart
/// (a layer-by-layer forward pass without weights).
#[test]
fn a_refused_request_leaves_the_order_blocks_go_back_in_alone() {
    let run = |refuse: bool| -> u64 {
        let a = counting_pool(PoolOptions { address_window: 1 << 20, ..PoolOptions::default() });
        // A high-water mark of 1014 KiB; then w (56 KiB) and v (8 KiB) cached, w first.
        let h = a.allocate(950 * KIB, 0, 256).unwrap();
        let w = a.allocate(56 * KIB, 0, 256).unwrap();
        let v = a.allocate(8 * KIB, 0, 256).unwrap();
        a.deallocate(w, 0).unwrap();
        a.deallocate(v, 0).unwrap();
        a.deallocate(h, 0).unwrap();
        let h = a.allocate(950 * KIB, 0, 256).unwrap(); // the cached block again
        let fill: Vec<_> = (0..3).map(|_| a.allocate(12 * KIB, 0, 256).unwrap()).collect();
        if refuse {
            // 50 KiB: the cached 56 KiB block would serve it, but the window has no 50 KiB free.
            let e = a.allocate(50 * KIB, 0, 256);
            assert!(matches!(e, Err(Error::OutOfMemory { .. })), "{e:?}");
        }
        // A fresh block past the budget (the high-water mark of 1014 KiB) by 56 KiB: one cached
        // block goes back, the one freed longest ago (w), leaving v's 8 KiB.
        let f = a.allocate(20 * KIB, 0, 256).unwrap();
        let cached = a.stats(0).unwrap().cached_bytes;
        for p in fill.into_iter().chain([h, f]) {
            a.deallocate(p, 0).unwrap();
        }
        cached
    };
    assert_eq!(run(false), 8 * KIB as u64);
    assert_eq!(run(true), 8 * KIB as u64, "a refused request changed which block the budget gives back");
}

/// F7: a fresh allocation that then fails (a backend error, not out of memory) has already had
/// the budget give the cache back.
#[test]
fn held_bytes_past_u64_are_refused_not_a_panic() {
    let a = fake_with(PoolOptions::default(), Fake { real: true, max_block: u64::MAX, ..Fake::new() });
    let p = a.allocate(1 << 62, 0, 256).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.allocate(usize::MAX - 4096, 0, 256)));
    assert!(r.is_ok(), "allocate panicked");
    a.deallocate(p, 0).unwrap();
}
