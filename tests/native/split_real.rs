//! Split blocks under a hostile caller, through the public API: a splitting storage with real
//! addresses (as CUDA has) made here, random operations with history checked against the
//! viewer's model, and threads against a limit.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use devalloc::backend::{Pool, PooledAllocator, Storage};
use devalloc::{Device, DeviceAllocator, DevicePtr, DeviceType, Error, HostAllocator, PoolOptions, Result};

use super::util::poll_once;

#[path = "limit_refusals.rs"]
pub(super) mod limit_refusals;
use limit_refusals::{refused_alone, Gate};

use super::split_hostile::{
    adds_up, fill, finish, holds, host_adds_up, repeating, replay_matches, shares_a_block, Rng, KIB, MIB,
};

// ---------------------------------------------------------------------------------------------
// A splitting storage with real addresses (as CUDA), made here: real bytes, bounds asserted on
// every access (a piece past its block's end panics), a registry of live blocks, blocks that
// can be refused after they were made (as the browser does) or made not reusable.

struct RBlock {
    addr: u64,
    cap: u64,
    data: Mutex<Vec<u8>>,
    refused: AtomicBool,
    reg: Arc<Mutex<BTreeMap<u64, u64>>>,
}

impl Drop for RBlock {
    fn drop(&mut self) {
        self.reg.lock().unwrap().remove(&self.addr);
    }
}

#[derive(Default)]
struct Real {
    next: AtomicU64,
    reg: Arc<Mutex<BTreeMap<u64, u64>>>,
    refusals: AtomicU64,
    refuse_next: AtomicBool,
    /// The next block asked for is refused: out of memory.
    out_next: AtomicBool,
}

impl Real {
    fn new() -> Self {
        Real { next: AtomicU64::new(1 << 32), ..Default::default() }
    }
    fn held(&self) -> u64 {
        self.reg.lock().unwrap().values().sum()
    }
}

impl Storage for Real {
    type Block = RBlock;
    type Params = ();
    fn device(&self) -> Device {
        Device::new(DeviceType::Cpu, 0)
    }
    fn max_block_size(&self) -> u64 {
        1 << 40
    }
    fn has_real_addresses(&self) -> bool {
        true
    }
    fn splits(&self) -> bool {
        true
    }
    fn size_class(&self, size: u64) -> Option<u64> {
        // As CUDA: whole 2 MiB pages from 2 MiB, else 512 bytes.
        let unit = if size >= 2 << 20 { 2 << 20 } else { 512 };
        Some(size.div_ceil(unit) * unit)
    }
    fn address(&self, b: &RBlock) -> Option<u64> {
        Some(b.addr)
    }
    fn refused(&self, b: &RBlock) -> bool {
        b.refused.load(Ordering::SeqCst)
    }
    fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::SeqCst)
    }
    fn alloc(&self, capacity: u64, alignment: u64, _: &(), _: &str) -> Result<RBlock> {
        if self.out_next.swap(false, Ordering::SeqCst) {
            let device = self.device();
            return Err(Error::OutOfMemory {
                requested: capacity,
                device,
                detail: "the test's device".into(),
            });
        }
        let a = alignment.max(256);
        // Blocks 1 MiB apart past their end, aligned to what was asked.
        let at = self.next.fetch_add(capacity + a + (1 << 20), Ordering::SeqCst);
        let addr = at.div_ceil(a) * a;
        self.reg.lock().unwrap().insert(addr, capacity);
        let refused = self.refuse_next.swap(false, Ordering::SeqCst);
        Ok(RBlock {
            addr,
            cap: capacity,
            data: Mutex::new(vec![0; capacity as usize]),
            refused: AtomicBool::new(refused),
            reg: self.reg.clone(),
        })
    }
    fn write(&self, b: &RBlock, off: u64, src: &[u8]) -> Result<()> {
        assert!(off + src.len() as u64 <= b.cap, "a write past its block's end");
        b.data.lock().unwrap()[off as usize..][..src.len()].copy_from_slice(src);
        Ok(())
    }
    fn read(&self, b: &RBlock, off: u64, dst: &mut [u8]) -> Result<()> {
        assert!(off + dst.len() as u64 <= b.cap, "a read past its block's end");
        dst.copy_from_slice(&b.data.lock().unwrap()[off as usize..][..dst.len()]);
        Ok(())
    }
    fn copy(&self, s: &RBlock, so: u64, d: &RBlock, d_o: u64, len: u64) -> Result<()> {
        let mut tmp = vec![0; len as usize];
        self.read(s, so, &mut tmp)?;
        self.write(d, d_o, &tmp)
    }
}

fn real(options: PoolOptions) -> PooledAllocator<Real> {
    PooledAllocator::from_pools(DeviceType::Cpu, vec![Pool::new(Real::new(), options).unwrap()]).unwrap()
}

/// Random operations on host memory, with history recorded: data of every allocation stays its
/// own, the stats add up after each step, the limit holds, and the viewer's replay of the
/// events agrees with the stats (async copies frozen mid-way and frees under them included).
/// Only seeds 1 and 2 have a limit, so only they may refuse, and only what would pass it (see
/// `limit_refusals`), a minority of their allocations.
#[test]
fn random_operations_keep_data_stats_and_history_consistent() {
    let mut shared_all = 0;
    for seed in 1..=4u64 {
        // Seeds 1 and 2 under a limit (where the pool rarely splits: see `larger.rs`), 3 and 4 not.
        let limit = 24 * MIB as u64;
        let memory_limit = (seed <= 2).then_some(limit);
        let a = HostAllocator::with_options(PoolOptions { memory_limit, ..PoolOptions::default() }).unwrap();
        a.record_history(1 << 20).unwrap();
        // The pool splits blocks only for a workload that repeats: it sees one first, and the
        // random operations go on above its level (see `repeating`).
        repeating(&a, 8 * MIB);
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ seed.wrapping_mul(0x1234_5678_9ABC));
        let mut live: Vec<(DevicePtr, usize, u8)> = Vec::new();
        let mut tag = 0u8;
        let mut ceiling = memory_limit.unwrap_or(u64::MAX);
        let mut now = memory_limit;
        let (mut made, mut refused) = (0u32, 0u32);
        let mut shared = 0;
        // An allocation of `n` bytes, or a refusal that the limit in force makes right.
        let mut allocate = |a: &HostAllocator, n: usize, align: usize, now: Option<u64>| {
            let before = a.stats(0).unwrap();
            match a.allocate(n, 0, align) {
                Ok(p) => {
                    made += 1;
                    Some(p)
                }
                Err(e) => {
                    refused_alone(a, &e, n, now, &before);
                    refused += 1;
                    None
                }
            }
        };
        for step in 0..600 {
            let op = rng.below(100);
            if op < 50 || live.is_empty() {
                let n = match rng.below(4) {
                    0 => 1 + rng.below(4 * KIB as u64) as usize,
                    1 => 1 + rng.below(256 * KIB as u64) as usize,
                    2 => 1 + rng.below(2 * MIB as u64) as usize,
                    _ => 1 + rng.below(6 * MIB as u64) as usize,
                };
                let align = 256 << rng.below(4);
                if let Some(p) = allocate(&a, n, align, now) {
                    tag = tag.wrapping_add(1).max(1);
                    fill(&a, p, n, tag);
                    live.push((p, n, tag));
                }
            } else if op < 85 {
                let (p, n, t) = live.swap_remove(rng.below(live.len() as u64) as usize);
                assert!(holds(&a, p, n, t), "seed {seed} step {step}: an allocation lost its bytes");
                a.deallocate(p, 0).unwrap();
            } else if op < 95 {
                // An async write frozen after its first chunk, its target freed under it.
                let k = rng.below(live.len() as u64) as usize;
                let (p, n, _) = live[k];
                if n > 4 * MIB {
                    let junk = vec![0xEE; n];
                    let mut fut = a.copy_host_to_device_async(p, &junk, 0);
                    assert!(poll_once(fut.as_mut()).is_pending());
                    live.swap_remove(k);
                    a.deallocate(p, 0).unwrap();
                    // Allocations while it is frozen.
                    for _ in 0..3 {
                        let n = 1 + rng.below(5 * MIB as u64) as usize;
                        if let Some(q) = allocate(&a, n, 256, now) {
                            tag = tag.wrapping_add(1).max(1);
                            fill(&a, q, n, tag);
                            live.push((q, n, tag));
                        }
                    }
                    if rng.below(2) == 0 {
                        assert!(finish(fut.as_mut()).is_ok());
                    }
                }
            } else if op < 98 {
                a.empty_cache();
            } else if memory_limit.is_some() {
                let l = limit / 2 + rng.below(limit);
                ceiling = ceiling.max(l);
                now = Some(l);
                a.set_memory_limit(now, 0).unwrap();
            }
            if shares_a_block(&a.live_allocations(0).unwrap()) {
                shared += 1;
            }
            let s = host_adds_up(&a);
            assert!(s.reserved_bytes <= ceiling, "seed {seed} step {step}: past every limit set {s:?}");
        }
        for &(p, n, t) in &live {
            assert!(holds(&a, p, n, t), "seed {seed}: an allocation lost its bytes");
        }
        eprintln!(
            "seed {seed}: pieces shared a block after {shared} of 600 steps; {made} allocations, {refused} refused"
        );
        assert!(refused < made, "seed {seed}: {refused} refusals beside {made} allocations");
        shared_all += shared;
        replay_matches(&a.snapshot().unwrap());
        for (p, _, _) in live.drain(..) {
            a.deallocate(p, 0).unwrap();
        }
        a.empty_cache();
        let s = host_adds_up(&a);
        assert_eq!((s.reserved_bytes, s.cached_bytes), (0, 0), "seed {seed}: all freed, all given back");
        replay_matches(&a.snapshot().unwrap());
    }
    assert!(shared_all > 200, "pieces shared a block after only {shared_all} steps");
}

/// Threads allocating, writing, checking and freeing against a limit while another empties the
/// cache: the limit holds at every step, no allocation's bytes change, and a refusal stands only
/// where the request would pass the limit with the other threads stopped and the cache given
/// back (else it must then be served: `limit_refusals::Gate`).
#[test]
fn threads_against_a_limit_with_empty_cache_keep_data_and_limit() {
    let limit = 48 * MIB as u64;
    let a = Arc::new(
        HostAllocator::with_options(PoolOptions { memory_limit: Some(limit), ..PoolOptions::default() })
            .unwrap(),
    );
    // Blocks split only for a workload that repeats (see `repeating`), while it does: this
    // allocation, held to the end, keeps the live count above the level it repeats at.
    repeating(&*a, 8 * MIB);
    let held = a.allocate(1, 0, 256).unwrap();
    let gate = Arc::new(Gate::default());
    let stop = Arc::new(AtomicBool::new(false));
    let emptier = {
        let (a, stop, gate) = (a.clone(), stop.clone(), gate.clone());
        std::thread::spawn(move || {
            let mut shared = 0;
            while !stop.load(Ordering::Relaxed) {
                shared += usize::from(shares_a_block(&a.live_allocations(0).unwrap()));
                gate.call(|| a.empty_cache());
                let s = a.stats(0).unwrap();
                assert!(s.reserved_bytes <= limit, "{s:?}");
                std::thread::yield_now();
            }
            shared
        })
    };
    let workers: Vec<_> = (0..3u64)
        .map(|t| {
            let (a, gate) = (a.clone(), gate.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0xDEAD_BEEF ^ ((t + 1) * 0x9E37_79B9));
                let mut live: Vec<(DevicePtr, usize, u8)> = Vec::new();
                for step in 0..400 {
                    if rng.below(2) == 0 || live.is_empty() {
                        let top = [8 * KIB, 300 * KIB, 3 * MIB][rng.below(3) as usize];
                        let n = 1 + rng.below(top as u64) as usize;
                        let made = match gate.call(|| a.allocate(n, 0, 256)) {
                            Ok(p) => {
                                gate.count.made();
                                Some(p)
                            }
                            Err(e) => gate.refused(&*a, &e, n, 256, limit),
                        };
                        if let Some(p) = made {
                            let tag = (t as u8) * 80 + (step % 80) as u8 + 1;
                            fill(&*a, p, n, tag);
                            live.push((p, n, tag));
                        }
                    } else {
                        let (p, n, tag) = live.swap_remove(rng.below(live.len() as u64) as usize);
                        assert!(holds(&*a, p, n, tag), "thread {t} step {step}: bytes changed");
                        gate.call(|| a.deallocate(p, 0)).unwrap();
                    }
                    let s = a.stats(0).unwrap();
                    assert!(s.reserved_bytes <= limit, "{s:?}");
                }
                for (p, n, tag) in live {
                    assert!(holds(&*a, p, n, tag));
                    a.deallocate(p, 0).unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    assert!(emptier.join().unwrap() > 0, "no two live allocations ever shared a block");
    let (made, refused, retried) = gate.count.counts();
    eprintln!("{made} allocations ({retried} of them refused at first), {refused} refused");
    assert!(refused < made, "{refused} refusals beside {made} allocations");
    a.deallocate(held, 0).unwrap();
    let s = host_adds_up(&a);
    assert_eq!(s.live_allocations, 0);
    a.empty_cache();
    assert_eq!(host_adds_up(&a).reserved_bytes, 0, "whole again and given back");
}

/// With real addresses (CUDA's way): every piece honours its alignment, lies inside its block,
/// overlaps no other live allocation, keeps its bytes; stats add up to what the storage holds.
#[test]
fn real_address_pieces_are_aligned_in_bounds_and_disjoint() {
    let a = real(PoolOptions::default());
    let pool = a.pool(0).unwrap();
    let mut rng = Rng(0x51ED_270B_27F2_B6E1);
    let mut live: HashMap<u64, (usize, usize, u8)> = HashMap::new();
    let mut tag = 0u8;
    // A few large blocks to split first.
    for n in [8 * MIB, 6 * MIB, 3 * MIB] {
        let p = a.allocate(n, 0, 256).unwrap();
        a.deallocate(p, 0).unwrap();
    }
    for step in 0..1500 {
        if rng.below(100) < 55 || live.is_empty() {
            let top = [2 * KIB, 200 * KIB, 3 * MIB][rng.below(3) as usize];
            let n = 1 + rng.below(top as u64) as usize;
            let align = 256usize << rng.below(9);
            let p = a.allocate(n, 0, align).unwrap();
            assert_eq!(p.addr() % align as u64, 0, "step {step}: {n} bytes aligned to {align} at {p}");
            tag = tag.wrapping_add(1).max(1);
            fill(&a, p, n, tag);
            live.insert(p.addr(), (n, align, tag));
        } else {
            let k = *live.keys().nth(rng.below(live.len() as u64) as usize).unwrap();
            let (n, _, t) = live.remove(&k).unwrap();
            assert!(holds(&a, DevicePtr::new(k), n, t), "step {step}: bytes changed");
            a.deallocate(DevicePtr::new(k), 0).unwrap();
        }
        let la = pool.live_allocations();
        let s = adds_up(&a, &la);
        assert_eq!(
            s.reserved_bytes,
            pool.storage().held(),
            "step {step}: reserved vs what the storage holds"
        );
        let reg = pool.storage().reg.lock().unwrap().clone();
        let mut prev_end = 0;
        for l in &la {
            assert!(l.addr >= prev_end, "step {step}: live allocations overlap at {:#x}", l.addr);
            prev_end = l.addr + l.capacity;
            let (&b, &cap) = reg.range(..=l.addr).next_back().expect("inside a block");
            assert!(l.addr + l.capacity <= b + cap, "step {step}: a piece past its block's end");
        }
    }
    for (k, (n, _, t)) in live {
        assert!(holds(&a, DevicePtr::new(k), n, t));
        a.deallocate(DevicePtr::new(k), 0).unwrap();
    }
    a.empty_cache();
    assert_eq!((a.stats(0).unwrap().reserved_bytes, pool.storage().held()), (0, 0));
}

/// Custom storages may both split and refuse blocks later (`Storage::splits`,
/// `Storage::refused`): a refused block's free ranges are given back with it, never served.
#[test]
fn a_refused_split_block_serves_no_more_pieces() {
    let a = real(PoolOptions::default());
    let pool = a.pool(0).unwrap();
    pool.storage().refuse_next.store(true, Ordering::SeqCst);
    repeating(&a, 4 * MIB);
    // Not yet known to the pool: a piece of it, then the verdict.
    let p = a.allocate(2 * MIB, 0, 256).unwrap();
    pool.storage().refusals.store(1, Ordering::SeqCst);
    let r = a.copy_host_to_device(p, &[1], 0);
    assert!(matches!(r, Err(Error::OutOfMemory { .. })), "{r:?}");
    // The refused block's free range must not serve anything now.
    let q = a.allocate(MIB, 0, 256).unwrap();
    let w = a.copy_host_to_device(q, &[1], 0);
    assert_eq!(w.map_err(|e| e.to_string()), Ok(()), "a fresh allocation after the refusal is unusable");
}

/// The device runs out just as a planned repetition makes its arena (see the pool's policy):
/// the request that asked for it is served by a block of its own size after the cache is
/// given back, its bytes and bounds are its own, and the workload goes on (and settles again).
#[test]
fn out_of_memory_while_making_a_planned_arena_serves_the_request_alone() {
    let a = real(PoolOptions::default());
    let pool = a.pool(0).unwrap();
    let step = || {
        // Planned after two steps: the third's first allocation, this small one that the
        // plan puts after the input, asks for the arena.
        let header = a.allocate(KIB, 0, 256).unwrap();
        fill(&a, header, KIB, 9);
        let input = a.allocate(3 * MIB, 0, 256).unwrap();
        fill(&a, input, 3 * MIB, 7);
        for k in 0..30u8 {
            let t = a.allocate(64 * KIB + usize::from(k), 0, 256).unwrap();
            fill(&a, t, 64 * KIB + usize::from(k), k);
            assert!(holds(&a, t, 64 * KIB + usize::from(k), k));
            assert!(holds(&a, input, 3 * MIB, 7), "step's input kept its bytes");
            a.deallocate(t, 0).unwrap();
        }
        a.deallocate(input, 0).unwrap();
        assert!(holds(&a, header, KIB, 9), "the header kept its bytes");
        a.deallocate(header, 0).unwrap();
    };
    step();
    step();
    pool.storage().out_next.store(true, Ordering::SeqCst);
    step();
    assert!(!pool.storage().out_next.load(Ordering::SeqCst), "the device was asked and ran out");
    for _ in 0..3 {
        step();
    }
    let before = a.stats(0).unwrap().cache_misses;
    step();
    let s = a.stats(0).unwrap();
    assert_eq!(s.cache_misses, before, "settled again: {s:?}");
    assert_eq!((s.live_allocations, s.reserved_bytes), (0, pool.storage().held()), "{s:?}");
}
