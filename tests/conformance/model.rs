//! The hostile model check: random sequences of valid *and* invalid operations (stale,
//! interior, unknown and out-of-range pointers, impossible sizes and alignments, oversized
//! copies) against a plain model. After every step the result must be the contract's answer,
//! a refused call must leave the stats exactly as they were, the stats must equal the model's,
//! and every live allocation must still hold its bytes. A valid allocation may be refused only
//! where a limit makes it right ([`Limits`]): `TooLarge` past the memory limit or the device's
//! largest buffer, `OutOfMemory` where the request would not fit under the memory limit even
//! with every cached block given back (checked by giving them back); with no limit, never.
//!
//! Operations come from proptest on native (with shrinking) and from a seeded generator in the
//! browser; one async executor runs them on both.
use devalloc::{AllocatorStats, DeviceAllocator, DevicePtr, Error, PointerProblem};

use super::{d2d, d2h, h2d, pattern, Factory, Rng};

#[path = "refusals.rs"]
mod refusals;
use refusals::{few_refusals, out_of_memory_was_right, Limits, Tally};

/// One step of a sequence. Indices pick among live (or freed) allocations modulo their count.
#[derive(Clone, Debug)]
pub enum Op {
    /// A valid allocation.
    Alloc { size: usize, align_shift: u8 },
    /// A request that can never be met: huge size, or huge alignment.
    AllocImpossible { which: u8 },
    /// Free a live allocation.
    Free(usize),
    /// Free, write or read through a pointer whose allocation was freed.
    UseStale { k: usize, how: u8 },
    /// Free an interior pointer of a live allocation.
    FreeInterior { k: usize, off: usize },
    /// Use an address no allocation ever had.
    UseUnknown { addr: u64, how: u8 },
    /// Write, in bounds or one past.
    Write { k: usize, off: usize, len: usize, seed: u64 },
    /// Read, in bounds or one past.
    Read { k: usize, off: usize, len: usize },
    /// Device-to-device copy, in bounds or one past.
    Copy { from: usize, to: usize, off: usize, len: usize },
}

/// A seeded sequence of `n` operations (for the browser, which has no proptest).
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))] // the browser suites' form
pub fn ops_from_seed(seed: u64, n: usize) -> Vec<Op> {
    let mut r = Rng(seed | 1);
    (0..n)
        .map(|_| match r.below(20) {
            0..=4 => Op::Alloc { size: 1 + r.below(3000), align_shift: r.below(12) as u8 },
            5 => Op::AllocImpossible { which: r.below(4) as u8 },
            6 | 7 => Op::Free(r.below(64)),
            8 => Op::UseStale { k: r.below(64), how: r.below(3) as u8 },
            9 => Op::FreeInterior { k: r.below(64), off: 1 + r.below(100) },
            10 => Op::UseUnknown { addr: r.below(1 << 20) as u64, how: r.below(3) as u8 },
            11..=13 => Op::Write {
                k: r.below(64),
                off: r.below(4000),
                len: r.below(4000),
                seed: r.below(999) as u64,
            },
            14..=16 => Op::Read { k: r.below(64), off: r.below(4000), len: r.below(4000) },
            _ => Op::Copy { from: r.below(64), to: r.below(64), off: r.below(4000), len: r.below(4000) },
        })
        .collect()
}

/// The proptest strategy of one operation.
#[cfg(not(target_arch = "wasm32"))]
pub fn op_strategy() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        5 => (1usize..3000, 0u8..12).prop_map(|(size, align_shift)| Op::Alloc { size, align_shift }),
        1 => (0u8..4).prop_map(|which| Op::AllocImpossible { which }),
        2 => any::<usize>().prop_map(Op::Free),
        1 => (any::<usize>(), 0u8..3).prop_map(|(k, how)| Op::UseStale { k, how }),
        1 => (any::<usize>(), 1usize..100).prop_map(|(k, off)| Op::FreeInterior { k, off }),
        1 => (any::<u64>(), 0u8..3).prop_map(|(addr, how)| Op::UseUnknown { addr, how }),
        3 => (any::<usize>(), any::<usize>(), any::<usize>(), any::<u64>())
            .prop_map(|(k, off, len, seed)| Op::Write { k, off, len, seed }),
        3 => (any::<usize>(), any::<usize>(), any::<usize>()).prop_map(|(k, off, len)| Op::Read { k, off, len }),
        2 => (any::<usize>(), any::<usize>(), any::<usize>(), any::<usize>())
            .prop_map(|(from, to, off, len)| Op::Copy { from, to, off, len }),
    ]
}

struct Model {
    live: Vec<(DevicePtr, Vec<u8>)>,
    freed: Vec<DevicePtr>,
    allocations: u64,
    deallocations: u64,
}

/// How one operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// It did what was asked.
    Done,
    /// It was refused, rightly (the contract's error); nothing may have changed.
    Refused,
    /// A valid allocation of this many bytes was refused as out of memory under a memory limit:
    /// to be checked against the limit once the stats are.
    OutOfMemory(usize),
}

fn fail(step: usize, op: &Op, what: impl std::fmt::Display) -> String {
    format!("step {step} ({op:?}): {what}")
}

fn is_ptr_error(r: &devalloc::Result<()>, want: Option<PointerProblem>) -> bool {
    match (r, want) {
        (Err(Error::InvalidPointer { problem, .. }), Some(w)) => *problem == w,
        (Err(Error::InvalidPointer { .. }), None) => true,
        _ => false,
    }
}

/// Runs `ops` on a fresh allocator from `make` (device 0); `Err` names the first broken promise.
pub async fn run(make: Factory, ops: &[Op]) -> Result<Tally, String> {
    let a = make().await?;
    let a: &dyn DeviceAllocator = &*a;
    let limits = Limits::of(a);
    let mut m = Model { live: Vec::new(), freed: Vec::new(), allocations: 0, deallocations: 0 };
    let mut tally = Tally::default();
    for (step, op) in ops.iter().enumerate() {
        let before = a.stats(0).map_err(|e| e.to_string())?;
        let outcome = apply(a, &mut m, op, &limits).await.map_err(|e| fail(step, op, e))?;
        let after = a.stats(0).map_err(|e| e.to_string())?;
        if outcome != Outcome::Done && after != before {
            return Err(fail(step, op, format!("a refused call changed the stats: {before:?} -> {after:?}")));
        }
        check_stats(&after, &m).map_err(|e| fail(step, op, e))?;
        match (outcome, op) {
            (Outcome::OutOfMemory(size), _) => {
                out_of_memory_was_right(a, &limits, size, &before).map_err(|e| fail(step, op, e))?;
                tally.refused += 1;
            }
            (Outcome::Refused, Op::Alloc { .. }) => tally.refused += 1,
            (Outcome::Done, Op::Alloc { .. }) => tally.made += 1,
            _ => {}
        }
        for (p, bytes) in &m.live {
            let mut back = vec![0u8; bytes.len()];
            d2h(a, &mut back, *p, 0).await.map_err(|e| fail(step, op, format!("reading {p}: {e}")))?;
            if back != *bytes {
                return Err(fail(step, op, format!("the allocation at {p} lost its bytes")));
            }
        }
    }
    for (p, _) in m.live.drain(..) {
        a.deallocate(p, 0).map_err(|e| e.to_string())?;
    }
    Ok(tally)
}

fn check_stats(s: &AllocatorStats, m: &Model) -> Result<(), String> {
    let live = m.live.len() as u64;
    let bytes: u64 = m.live.iter().map(|(_, b)| b.len() as u64).sum();
    if s.live_allocations != live || s.allocated_bytes != bytes {
        return Err(format!(
            "stats say {} live / {} bytes, the model {live} / {bytes}",
            s.live_allocations, s.allocated_bytes
        ));
    }
    if s.allocations != m.allocations || s.deallocations != m.deallocations {
        return Err(format!(
            "stats count {}/{} (de)allocations, the model {}/{}",
            s.allocations, s.deallocations, m.allocations, m.deallocations
        ));
    }
    if s.reserved_bytes < s.allocated_bytes
        || s.cached_bytes > s.reserved_bytes
        || s.peak_reserved_bytes < s.reserved_bytes
    {
        return Err(format!("inconsistent stats: {s:?}"));
    }
    Ok(())
}

/// Applies one operation and checks its answer; says how it ended.
async fn apply(a: &dyn DeviceAllocator, m: &mut Model, op: &Op, limits: &Limits) -> Result<Outcome, String> {
    match *op {
        Op::Alloc { size, align_shift } => {
            let align = 1usize << align_shift;
            let p = match a.allocate(size, 0, align) {
                Ok(p) => p,
                // Only a limit makes a refusal right: the run checks this one against the
                // memory limit once it has checked the stats.
                Err(Error::OutOfMemory { .. }) if limits.memory.is_some() => {
                    return Ok(Outcome::OutOfMemory(size))
                }
                Err(Error::TooLarge { .. }) if limits.too_large(size) => return Ok(Outcome::Refused),
                Err(e) => return Err(format!("allocate({size}, align {align}) under {limits:?}: {e}")),
            };
            if p.addr() % align as u64 != 0 {
                return Err(format!("{p} is not aligned to {align}"));
            }
            if m.live
                .iter()
                .any(|(q, b)| p.addr() < q.addr() + b.len() as u64 && q.addr() < p.addr() + size as u64)
            {
                return Err(format!("{p} overlaps a live allocation"));
            }
            // Fresh memory may hold old bytes when cached: define it first.
            let init = pattern(size, p.addr());
            h2d(a, p, &init, 0).await.map_err(|e| format!("first write: {e}"))?;
            m.allocations += 1;
            m.live.push((p, init));
            Ok(Outcome::Done)
        }
        Op::AllocImpossible { which } => {
            let (size, align) = match which {
                0 => (usize::MAX / 2, 256),
                1 => (usize::MAX - 3, 1),
                2 if usize::BITS == 64 => (8, 1usize << (usize::BITS - 2)),
                _ => (0, 256),
            };
            match a.allocate(size, 0, align) {
                Err(Error::TooLarge { .. } | Error::InvalidArgument { .. }) => Ok(Outcome::Refused),
                other => Err(format!("allocate({size}, align {align}) should never fit, got {other:?}")),
            }
        }
        Op::Free(k) if !m.live.is_empty() => {
            let (p, _) = m.live.swap_remove(k % m.live.len());
            a.deallocate(p, 0).map_err(|e| format!("free: {e}"))?;
            m.deallocations += 1;
            m.freed.push(p);
            Ok(Outcome::Done)
        }
        Op::UseStale { k, how } if !m.freed.is_empty() => {
            let p = m.freed[k % m.freed.len()];
            if m.live.iter().any(|(q, b)| q.addr() <= p.addr() && p.addr() <= q.addr() + b.len() as u64) {
                return Ok(Outcome::Refused); // a real-address allocator (CUDA) hands cached addresses out again
            }
            let r = match how {
                0 => a.deallocate(p, 0),
                1 => h2d(a, p, &[1, 2, 3], 0).await,
                _ => d2h(a, &mut [0u8; 3], p, 0).await,
            };
            if !is_ptr_error(&r, None) {
                return Err(format!("a stale pointer {p} was not refused: {r:?}"));
            }
            Ok(Outcome::Refused)
        }
        Op::FreeInterior { k, off } if !m.live.is_empty() => {
            let (p, b) = &m.live[k % m.live.len()];
            let q = p.offset(off % b.len().max(1) + 1).unwrap();
            let r = a.deallocate(q, 0);
            if !is_ptr_error(&r, None) {
                return Err(format!("freeing interior pointer {q} was not refused: {r:?}"));
            }
            Ok(Outcome::Refused)
        }
        Op::UseUnknown { addr, how } => {
            let p = DevicePtr::new(addr);
            if m.live.iter().any(|(q, b)| q.addr() <= addr && addr <= q.addr() + b.len() as u64) {
                return Ok(Outcome::Refused);
            }
            let r = match how {
                0 => a.deallocate(p, 0),
                1 => h2d(a, p, &[9], 0).await,
                _ => d2h(a, &mut [0u8; 1], p, 0).await,
            };
            if !is_ptr_error(&r, None) {
                return Err(format!("unknown pointer {p} was not refused: {r:?}"));
            }
            Ok(Outcome::Refused)
        }
        Op::Write { k, off, len, seed } if !m.live.is_empty() => {
            let n = m.live.len();
            let (p, bytes) = &mut m.live[k % n];
            let off = off % (bytes.len() + 1);
            let len = len % (bytes.len() - off + 2); // sometimes one past the end
            let data = pattern(len, seed);
            let r = h2d(a, p.offset(off).unwrap(), &data, 0).await;
            if off + len <= bytes.len() {
                r.map_err(|e| format!("write: {e}"))?;
                bytes[off..off + len].copy_from_slice(&data);
                Ok(Outcome::Done)
            } else if matches!(r, Err(Error::OutOfBounds { .. })) {
                Ok(Outcome::Refused)
            } else {
                Err(format!("a write past the end gave {r:?}"))
            }
        }
        Op::Read { k, off, len } if !m.live.is_empty() => {
            let (p, bytes) = &m.live[k % m.live.len()];
            let off = off % (bytes.len() + 1);
            let len = len % (bytes.len() - off + 2);
            let mut back = vec![0u8; len];
            let r = d2h(a, &mut back, p.offset(off).unwrap(), 0).await;
            if off + len <= bytes.len() {
                r.map_err(|e| format!("read: {e}"))?;
                if back != bytes[off..off + len] {
                    return Err(format!("read {off}+{len} differs"));
                }
                Ok(Outcome::Done)
            } else if matches!(r, Err(Error::OutOfBounds { .. })) {
                Ok(Outcome::Refused)
            } else {
                Err(format!("a read past the end gave {r:?}"))
            }
        }
        Op::Copy { from, to, off, len } if !m.live.is_empty() => {
            let (f, t) = (from % m.live.len(), to % m.live.len());
            let n = m.live[f].1.len().min(m.live[t].1.len());
            let off = off % n;
            let len = len % (n - off + 2);
            let (src, dst) = (m.live[f].0, m.live[t].0.offset(off).unwrap());
            let r = d2d(a, dst, 0, src, 0, len).await;
            if off + len <= m.live[t].1.len() && len <= m.live[f].1.len() {
                r.map_err(|e| format!("copy: {e}"))?;
                let data = m.live[f].1[..len].to_vec();
                m.live[t].1[off..off + len].copy_from_slice(&data);
                Ok(Outcome::Done)
            } else if matches!(r, Err(Error::OutOfBounds { .. })) {
                Ok(Outcome::Refused)
            } else {
                Err(format!("a copy past the end gave {r:?}"))
            }
        }
        _ => Ok(Outcome::Refused),
    }
}

/// Native: `cases` proptest cases of up to 60 operations on fresh allocators from `make`.
#[cfg(not(target_arch = "wasm32"))]
pub fn model_check(make: Factory, cases: u32) {
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    let total = std::cell::Cell::new(Tally::default());
    runner
        .run(&proptest::collection::vec(op_strategy(), 1..60), |ops| {
            let t = pollster::block_on(run(make, &ops)).map_err(TestCaseError::fail)?;
            let sum = total.get();
            total.set(Tally { made: sum.made + t.made, refused: sum.refused + t.refused });
            Ok(())
        })
        .unwrap_or_else(|e| panic!("model check failed: {e}"));
    few_refusals(total.get());
}

/// Browser: `seeds` seeded sequences of 40 operations.
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))] // the browser suites' form
pub async fn model_check_seeded(make: Factory, seeds: u64) {
    let mut total = Tally::default();
    for seed in 1..=seeds {
        let ops = ops_from_seed(seed * 7919, 40);
        match run(make, &ops).await {
            Ok(t) => (total.made, total.refused) = (total.made + t.made, total.refused + t.refused),
            Err(e) => panic!("model check failed with seed {}: {e}", seed * 7919),
        }
    }
    few_refusals(total);
}
