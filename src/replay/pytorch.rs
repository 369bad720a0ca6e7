//! A model of PyTorch's CUDA caching allocator, the peer a replay is measured against: what it
//! would reserve for the same trace, and the smallest limit it would need.
//!
//! (What the model follows is documented on [`pytorch_replay`].)

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{Trace, TraceEvent};
use crate::error::{Error, Result};

const MIN_BLOCK: u64 = 512;
const SMALL_SIZE: u64 = 1 << 20;
const SMALL_BUFFER: u64 = 2 << 20;
const LARGE_BUFFER: u64 = 20 << 20;
const MIN_LARGE_ALLOC: u64 = 10 << 20;
const ROUND_LARGE: u64 = 2 << 20;
const ONE_EXABYTE: u64 = 1 << 60;

/// What the model of PyTorch's caching allocator did with a trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PyTorchReport {
    /// The most bytes it held from the device at once (its `max_memory_reserved`).
    pub peak_reserved: u64,
    /// Segments it asked the device for (`cudaMalloc` calls).
    pub segments: u64,
    /// The step of the first request it could not serve under the limit, if any.
    pub failed_at: Option<u64>,
}

/// One block of a segment: its size, whether it is in use, and which pool and segment it is of.
#[derive(Clone, Copy)]
struct Block {
    size: u64,
    used: bool,
    small: bool,
    segment: u64,
}

/// The model's state: blocks by address (segments are laid out apart, so blocks of two segments
/// are never adjacent), the free ones of each pool by (size, address), the segments' sizes by
/// address.
#[derive(Default)]
struct Model {
    blocks: BTreeMap<u64, Block>,
    free: [BTreeSet<(u64, u64)>; 2],
    segments: HashMap<u64, u64>,
    next_address: u64,
    reserved: u64,
    limit: Option<u64>,
    report: PyTorchReport,
}

impl Model {
    fn pool(small: bool) -> usize {
        usize::from(small)
    }

    /// Serves a request of `size` bytes: the address of its block, or `None` (out of memory).
    fn malloc(&mut self, size: u64) -> Option<u64> {
        let size = size.max(1).div_ceil(MIN_BLOCK).saturating_mul(MIN_BLOCK);
        let small = size <= SMALL_SIZE;
        let found = self.free[Self::pool(small)].range((size, 0)..).next().copied();
        let (block_size, address) = match found {
            Some(f) => f,
            None => {
                let segment = if small {
                    SMALL_BUFFER
                } else if size < MIN_LARGE_ALLOC {
                    LARGE_BUFFER
                } else {
                    size.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
                };
                let address = match self.new_segment(segment, small) {
                    Some(a) => a,
                    None => {
                        self.release_cached();
                        self.new_segment(segment, small)?
                    }
                };
                (segment, address)
            }
        };
        self.free[Self::pool(small)].remove(&(block_size, address));
        let mut block = self.blocks[&address];
        let rest = block_size - size;
        let split = if small { rest >= MIN_BLOCK } else { rest > SMALL_SIZE };
        if split {
            block.size = size;
            let tail = Block { size: rest, used: false, small, segment: block.segment };
            self.blocks.insert(address + size, tail);
            self.free[Self::pool(small)].insert((rest, address + size));
        }
        block.used = true;
        self.blocks.insert(address, block);
        Some(address)
    }

    /// Asks the device for a segment of `size` bytes: its address, or `None` past the limit (or
    /// past 2^64 bytes of addresses, which no device has either).
    fn new_segment(&mut self, size: u64, small: bool) -> Option<u64> {
        if self.limit.is_some_and(|l| self.reserved.saturating_add(size) > l) {
            return None;
        }
        let address = self.next_address;
        // A gap of one byte keeps two segments from ever looking adjacent. Every block ends
        // below `next_address`, so no address sum below can overflow.
        self.next_address = address.checked_add(size)?.checked_add(1)?;
        self.segments.insert(address, size);
        self.blocks.insert(address, Block { size, used: false, small, segment: address });
        self.free[Self::pool(small)].insert((size, address));
        self.reserved += size;
        self.report.segments += 1;
        self.report.peak_reserved = self.report.peak_reserved.max(self.reserved);
        Some(address)
    }

    /// Frees the block at `address` and merges it with its free neighbours.
    fn free(&mut self, mut address: u64) {
        let Some(mut block) = self.blocks.remove(&address) else { return };
        block.used = false;
        let pool = Self::pool(block.small);
        if let Some((&prev_at, &prev)) = self.blocks.range(..address).next_back() {
            if !prev.used && prev.segment == block.segment && prev_at + prev.size == address {
                self.blocks.remove(&prev_at);
                self.free[pool].remove(&(prev.size, prev_at));
                address = prev_at;
                block.size += prev.size;
            }
        }
        let after = address + block.size;
        if let Some(&next) = self.blocks.get(&after) {
            if !next.used && next.segment == block.segment {
                self.blocks.remove(&after);
                self.free[pool].remove(&(next.size, after));
                block.size += next.size;
            }
        }
        self.blocks.insert(address, block);
        self.free[pool].insert((block.size, address));
    }

    /// Gives back every cached segment that is wholly free.
    fn release_cached(&mut self) {
        for pool in 0..2 {
            let whole: Vec<(u64, u64)> = self.free[pool]
                .iter()
                .filter(|&&(size, at)| self.segments.get(&at) == Some(&size))
                .copied()
                .collect();
            for (size, at) in whole {
                self.free[pool].remove(&(size, at));
                self.blocks.remove(&at);
                self.segments.remove(&at);
                self.reserved -= size;
            }
        }
    }
}

/// Replays `trace` through a model of PyTorch's caching allocator, under `limit` bytes of
/// reserved memory or none. A trace that allocates a live id again is an error, as for
/// [`super::replay`].
///
/// The model follows `c10/cuda/CUDACachingAllocator.cpp` with the default settings (no
/// `PYTORCH_CUDA_ALLOC_CONF`: `max_split_size` unlimited, no power-of-two rounding, no garbage
/// collection threshold, no expandable segments), on one stream, and a limit as
/// `torch.cuda.set_per_process_memory_fraction` sets one:
/// - A request of 0 bytes takes nothing, and one of 1 EiB or more fails. Others are rounded up
///   to a multiple of 512 bytes (512 at least); up to 1 MiB they are served from the small
///   pool, above from the large pool.
/// - It takes the smallest free block of its pool that holds it (the lowest address among equal
///   sizes). The block is split, the request taking its start and the rest staying free, when
///   the rest is at least 512 bytes (small pool) or more than 1 MiB (large pool); otherwise the
///   request takes the whole block.
/// - With no such block it asks the device for a segment: 2 MiB for a small request, 20 MiB for
///   one under 10 MiB, else the request rounded up to 2 MiB. Past the limit it first gives back
///   every cached segment that is wholly free, then asks again; if that fails too, the request
///   fails (PyTorch's out-of-memory error).
/// - A freed block merges with free neighbours of its segment and is cached; segments are given
///   back only as above, or at an `EmptyCache` event (`torch.cuda.empty_cache()`).
pub fn pytorch_replay(trace: &Trace, limit: Option<u64>) -> Result<PyTorchReport> {
    let mut model = Model { limit, ..Model::default() };
    // An id's block, or `None` for a 0-byte allocation (PyTorch hands out a null pointer and
    // allocates nothing).
    let mut live: HashMap<u64, Option<u64>> = HashMap::new();
    for (n, (step, e)) in trace.events.iter().enumerate() {
        match e {
            TraceEvent::Alloc { id, size, .. } => {
                if live.contains_key(id) {
                    return Err(Error::invalid_argument(format!(
                        "the trace allocates id {id} again at step {step} (event {n}) while it is live"
                    )));
                }
                // PyTorch refuses 1 EiB or more up front (an out-of-memory error).
                let served = match *size {
                    0 => Some(None),
                    s if s >= ONE_EXABYTE => None,
                    s => model.malloc(s).map(Some),
                };
                match served {
                    Some(block) => {
                        live.insert(*id, block);
                    }
                    None => {
                        model.report.failed_at = Some(*step);
                        break;
                    }
                }
            }
            TraceEvent::Free { id } => {
                if let Some(Some(address)) = live.remove(id) {
                    model.free(address);
                }
            }
            TraceEvent::EmptyCache => model.release_cached(),
        }
    }
    Ok(model.report)
}

/// The smallest limit under which the model of PyTorch's caching allocator replays all of
/// `trace`, bisected: a multiple of 2 MiB (every segment is one, so whether a limit fits depends
/// only on the multiples of 2 MiB below it), from the lower bound up to the unlimited replay's
/// peak reserved (under which the replay runs as without a limit). An error when even the
/// unlimited replay fails.
///
/// The bisection takes a limit to fit whenever a smaller one does. For PyTorch's policy that is
/// not always so: under a smaller limit it gives cached segments back earlier, which can spare
/// it a split that a larger limit runs into. What is returned always fits; on such a trace a
/// smaller limit may fit too. (On the model traces and MiniMalloc's instances in `tests/data`, a
/// scan of every 2 MiB step finds no limit above the returned one that fails.)
pub fn pytorch_min_limit(trace: &Trace) -> Result<u64> {
    let unlimited = pytorch_replay(trace, None)?;
    if let Some(step) = unlimited.failed_at {
        return Err(Error::invalid_argument(format!(
            "PyTorch's policy cannot replay the trace even without a limit: it fails at step {step}"
        )));
    }
    let fits =
        |k: u64| -> Result<bool> { Ok(pytorch_replay(trace, Some(k * ROUND_LARGE))?.failed_at.is_none()) };
    // In units of 2 MiB: `lo` fails (or is below every candidate), `hi` fits.
    let (mut lo, mut hi) = (trace.lower_bound().div_ceil(ROUND_LARGE), unlimited.peak_reserved / ROUND_LARGE);
    if lo >= hi || fits(lo)? {
        return Ok(lo.min(hi) * ROUND_LARGE);
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi * ROUND_LARGE)
}

#[cfg(test)]
#[path = "pytorch_tests.rs"]
mod tests;
