//! [`Pool`]: the allocation policy every built-in allocator runs over its [`Storage`].
//!
//! # Policy
//!
//! - **Requests.** Size > 0, alignment a power of two (at least 256 bytes is what every
//!   address gets). A request that can never be met (larger than the device's largest block,
//!   than the memory limit, or the address window; an alignment past the window) is
//!   [`Error::TooLarge`] / [`Error::InvalidArgument`]; one that cannot be met *now* is
//!   [`Error::OutOfMemory`]. A refused request changes nothing: not the data, not the stats.
//! - **Capacities.** With caching on, a block's capacity is the request rounded up to 512
//!   bytes (as PyTorch rounds small requests), unless the storage says otherwise (CUDA rounds
//!   requests of 2 MiB and more up to whole 2 MiB pages). When that would not fit under the
//!   device's largest block or the memory limit but the exact size would, the exact size is used.
//! - **The cache** keeps freed blocks by the alignment the block itself has, the backend's
//!   per-allocation params (wgpu: usage) and capacity; never by label (labels are for people:
//!   they stay in devalloc's records, reports and snapshots, and a reused block serves any
//!   label). A request takes the smallest cached block of its alignment and params that holds
//!   it and is at most an eighth larger than its capacity (best fit).
//! - **The budget** (no limit needed, see `budget.rs`): a fresh block that would take the pool
//!   past the most bytes the workload has asked for at once (plus
//!   [`PoolOptions::cache_headroom`] of it, none by default), or past what the pool held at its
//!   peak if that is more, first gives back cached blocks, the ones freed longest ago first. A
//!   request never takes a cached block larger than its best fit unless the workload repeats:
//!   so a workload that moves on (a growing KV cache, varying shapes) holds at most what its
//!   live blocks held at their peak.
//! - **A repeating workload** (a training or serving loop's steps, a model's identical layers:
//!   see `repeats.rs`) is planned from one repetition once it has been seen twice (see
//!   `settle.rs`), where a repetition is the live count rising above some level and coming
//!   back to it with the same allocations and frees, 32 allocations or more (a step or a
//!   layer, not two neighbouring ops that happen to match: shorter periods of several
//!   excursions were mostly coincidences on the corpus, and plans made from them held up to
//!   2.9x the lower bound), or several such excursions in a row, 512 allocations or more
//!   together, that repeat only as a whole (a serving loop whose requests differ). Temporaries one at a time with nothing held around them are no such repetition:
//!   the budget holds them to the largest, and sizes given back are asked for again. A planned
//!   workload asks the device for nothing after its first planned repetition where each
//!   repetition is the same. Where blocks split ([`Storage::splits`]: host memory and CUDA),
//!   the repetition is laid out in one block, an arena, by the crate's planner, and each
//!   allocation gets its planned piece of it (see `pieces.rs`; a freed piece merges with its
//!   free neighbours, and an arena with no live piece left is one whole cached block again,
//!   which the budget, a limit or `empty_cache` can give back). Where they do not (wgpu: two
//!   allocations never share a buffer, so any two can be bound together with any access), each
//!   allocation gets its planned block, close to the least any such policy can hold. An
//!   allocation the plan does not place is served as without one, from any larger cached block
//!   (split where blocks split) before a fresh one. Pieces of one block show its id in
//!   `LiveAllocation::block`. `empty_cache` gives every whole cached block back to the device.
//!   With [`PoolOptions::reuse_freed`] off (a debug setting) freed blocks are never reused.
//!   Each block has an id (`LiveAllocation::block`), which wgpu's own messages show.
//! - **Out of memory.** Past the memory limit, as few cached blocks as make room are given back
//!   (the smallest one that is enough, else the largest first); if even the whole cache would
//!   not make room for the rounded capacity, the exact size is tried; else the request fails. When
//!   the device itself runs out, the cache is emptied and the exact size tried once more (so
//!   the one visible change of a failed request is cached blocks given back: by the budget,
//!   the limit or that retry).
//! - **Addresses.** Storages without real addresses (host, wgpu) get virtual ones from a
//!   per-device window (see `address.rs`): a reused cached block gets a *fresh* address, and a
//!   freed address range is not handed out again within 2^32 frees unless the 4 PiB window has
//!   no other room, so use-after-free and double free are reported as [`PointerProblem::Freed`].
//! - **What `reserved` counts**: the capacity of every live block plus every cached block;
//!   `allocated` counts the bytes asked for. Memory a device is allocating right now counts
//!   against the limit but not in the stats, which move only once a call has succeeded.

mod access;
mod address;
mod allocate;
mod budget;
mod cache;
mod free;
mod history;
mod larger;
mod pieces;
mod plans;
mod refused;
mod repeats;
mod report;
mod retry;
mod settle;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

pub(crate) use self::plans::PlanTable;

use self::history::History;

use self::address::{AddressWindow, SharedWindow, Span, MAX_DEVICES, MAX_WINDOW_BITS};
use self::budget::Budget;
use self::cache::{BlockCache, Key};
use self::pieces::{Holder, Pieces};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stats::AllocatorStats;
use crate::storage::Storage;
use crate::sync::lock;

/// Settings of a [`Pool`].
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// Keep freed blocks by capacity and reuse them (see the policy in the module docs). On
    /// by default, for every built-in allocator: a workload that repeats its shapes asks the
    /// device for nothing after its first step.
    pub caching: bool,
    /// Most bytes the pool may hold from the device (live and cached). Past it an allocation
    /// is [`Error::OutOfMemory`] (or [`Error::TooLarge`] when it alone exceeds the limit),
    /// before the device runs out. `None` by default.
    pub memory_limit: Option<u64>,
    /// How much more than the most bytes its requests have asked for at once (their
    /// high-water mark) the pool may hold before a fresh block gives cached ones back, as a
    /// fraction of that mark: `Some(0.0)` by default (the pool then holds at most what it held at
    /// its peak, or the mark if more: see the module docs). A fresh block that would take the pool
    /// past it first gives back the blocks cached longest ago. `None`: no budget and no plan for
    /// repeating workloads; the cache keeps every freed block until a limit, an out-of-memory
    /// or `empty_cache` (capacities still round to 512 bytes). Clamped to 0..=1; NaN counts as 0.
    pub cache_headroom: Option<f64>,
    /// Reuse freed blocks (the default). Off, a freed block is never handed out again, even
    /// with caching on, and the backend retires it at the free: a debug setting that makes a
    /// use of freed memory show up instead of silently reaching a new allocation. On wgpu the
    /// freed buffer is destroyed, so a bind group still pointing at it makes the submit that
    /// uses it a validation error naming the block (caught by the app's error scope or its
    /// uncaptured-error handler); on host and CUDA the memory goes back at once. A block an
    /// async copy still holds is only dropped.
    pub reuse_freed: bool,
    /// Size in bytes of each device's window of virtual addresses: a power of two from 2^17 to
    /// 2^52 (the default). Smaller windows exist for tests of the reuse rule; a full-size
    /// window is shared by every pool of the device with the same quarantine, so that two
    /// allocators of one device never hand out one address.
    pub address_window: u64,
    /// How many later frees (on the device's window) a freed address range stays out of use
    /// (2^32 by default; 0 is taken as 1).
    pub quarantine_frees: u64,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            caching: true,
            memory_limit: None,
            cache_headroom: Some(0.0),
            reuse_freed: true,
            address_window: 1 << MAX_WINDOW_BITS,
            quarantine_frees: 1 << 32,
        }
    }
}

/// The block behind a pointer, as [`Pool::block_at`] finds it.
pub struct BlockRef<B> {
    /// The block (kept alive while the caller uses it, even if freed meanwhile).
    pub block: Arc<B>,
    /// Offset of the pointer from the block's start.
    pub offset: u64,
    /// Bytes of the allocation from the pointer to its end.
    pub available: u64,
    /// Holds the allocation's piece of a split block while the caller uses it, so that a free
    /// meanwhile does not hand its range out again (see `pieces.rs`).
    _piece: Option<Arc<u64>>,
}

struct Live<S: Storage> {
    size: u64,
    key: Key<S::Params>,
    block: Arc<S::Block>,
    /// The pool's id of the block (it keeps it while cached and reused).
    block_id: u64,
    label: Option<Box<str>>,
    span: Option<Span>,
    /// For a piece of a split block (see `pieces.rs`), where it starts in the block (a whole
    /// block's allocation starts at 0); each copy through it holds this while it runs. (`Live`
    /// is kept to 120 bytes: past 128, moving it calls `memcpy`, 10% on the allocation cycle.)
    piece: Option<Arc<u64>>,
    /// The tensors inside it, where named.
    tensors: Box<[crate::snapshot::TensorNote]>,
}

impl<S: Storage> Live<S> {
    /// Where the allocation starts in its block.
    fn at(&self) -> u64 {
        self.piece.as_deref().copied().unwrap_or(0)
    }
}

struct State<S: Storage> {
    live: BTreeMap<u64, Live<S>>,
    cache: BlockCache<S::Block, S::Params>,
    /// Split blocks with a live piece, and their free ranges (counted as cached).
    pieces: Pieces<S::Block, S::Params>,
    window: Option<SharedWindow>,
    stats: AllocatorStats,
    /// Bytes the device is allocating right now (counted against the limit).
    pending: u64,
    plans: PlanTable,
    /// Blocks made so far (the next block's id).
    blocks_made: u64,
    /// How much the cache may hold (see `budget.rs`).
    budget: Budget<S::Params>,
    /// Allocations the device refused after they were returned, by address (`refused.rs`).
    refused: BTreeMap<u64, refused::Refusal>,
    /// The storage's count of refusals when the pool last looked.
    refusals_seen: u64,
}

/// What an allocation will be, worked out before anything changes.
struct Prepared<P> {
    size: u64,
    alignment: u64,
    /// The block it would take: its capacity (or the exact size, see `exact`).
    key: Key<P>,
    /// The exact size in whole granules (what a block needs at least).
    exact: u64,
    /// Bytes of the fresh block it would make: its capacity, or a repeating workload's arena
    /// (see `settle.rs`), of which the request gets a piece.
    block: u64,
    /// The key its size asks for (`key` may become a larger block's).
    want: Key<P>,
    /// Where its piece of a repeating workload's arena is (see `settle.rs`), when it gets one
    /// by splitting the arena (whole in the cache, or fresh).
    at: Option<u64>,
    /// The plan's slot it makes a fresh block for (blocks that do not split, see `settle.rs`).
    slot: Option<usize>,
}

/// Where an allocation's block comes from.
enum Source<B> {
    /// A cached block, whole or a piece of one.
    Cached(Holder<B>),
    /// A fresh block, with its id.
    Fresh(u64),
}

/// Generic allocation policy over a [`Storage`]; see the module docs.
pub struct Pool<S: Storage> {
    // Fields drop in order: the blocks (in `state`) go back to the storage before the storage
    // itself goes (a CUDA block frees through a context the storage also holds).
    state: Mutex<State<S>>,
    storage: S,
    device: Device,
    config: Mutex<PoolOptions>,
    history: Mutex<Option<History>>,
    recording: AtomicBool,
}

impl PoolOptions {
    /// Refuses settings no pool of `device` can have: a device index past 255 (addresses tell
    /// 256 devices of a type apart) and an address window that is not a power of two from
    /// 2^17 to 2^52. (A quarantine of 0 frees is taken as 1.)
    pub(crate) fn check(&self, device: Device) -> Result<()> {
        if device.index >= MAX_DEVICES {
            return Err(Error::invalid_argument(format!(
                "device {device}: devalloc tells at most {MAX_DEVICES} devices of a type apart"
            )));
        }
        let w = self.address_window;
        if !w.is_power_of_two() || !(1 << 17..=1 << MAX_WINDOW_BITS).contains(&w) {
            return Err(Error::invalid_argument(format!(
                "address window of {w} bytes: it must be a power of two from 2^17 to 2^{MAX_WINDOW_BITS}"
            )));
        }
        Ok(())
    }
}

impl<S: Storage> Pool<S> {
    /// A pool over `storage`. Refuses a device index past 255 (addresses tell 256 devices of a
    /// type apart) and an address window that is not a power of two from 2^17 to 2^52.
    pub fn new(storage: S, config: PoolOptions) -> Result<Self> {
        let device = storage.device();
        config.check(device)?;
        let g = storage.granularity();
        if !g.is_power_of_two() {
            return Err(Error::invalid_argument(format!(
                "{device}: the storage's granularity of {g} bytes is not a power of two"
            )));
        }
        let w = config.address_window;
        let window = (!storage.has_real_addresses())
            .then(|| AddressWindow::shared(device, w, config.quarantine_frees.max(1)));
        Ok(Pool {
            storage,
            device,
            config: Mutex::new(config),
            state: Mutex::new(State {
                live: BTreeMap::new(),
                cache: BlockCache::new(),
                pieces: Pieces::new(),
                window,
                stats: AllocatorStats::default(),
                pending: 0,
                plans: PlanTable::new(),
                blocks_made: 0,
                budget: Budget::new(),
                refused: BTreeMap::new(),
                refusals_seen: 0,
            }),
            history: Mutex::new(None),
            recording: AtomicBool::new(false),
        })
    }

    /// The storage under the pool.
    pub fn storage(&self) -> &S {
        &self.storage
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Sets (or with `None` lifts) the memory limit; blocks already held are not freed.
    pub fn set_memory_limit(&self, limit: Option<u64>) {
        lock(&self.config).memory_limit = limit;
    }

    /// The memory limit.
    pub fn memory_limit(&self) -> Option<u64> {
        lock(&self.config).memory_limit
    }

    /// The pool's statistics.
    pub fn stats(&self) -> AllocatorStats {
        let mut state = lock(&self.state);
        self.sweep_refused(&mut state);
        let mut stats = state.stats;
        debug_assert_eq!(stats.cached_bytes, state.cache.bytes() + state.pieces.bytes(), "cached bytes");
        drop(state);
        stats.staging_bytes = self.storage.staging_bytes();
        stats
    }
}

impl<S: Storage> Drop for Pool<S> {
    fn drop(&mut self) {
        let state = lock(&self.state);
        if state.live.is_empty() {
            return;
        }
        log::warn!(
            "devalloc: {} dropped with {} live allocation(s), {} bytes; freeing them",
            self.device,
            state.live.len(),
            state.stats.allocated_bytes
        );
        for (&base, l) in &state.live {
            log::warn!(
                "devalloc: leak on {}: {} bytes at {:#x} ({})",
                self.device,
                l.size,
                base,
                l.label.as_deref().unwrap_or("unlabelled")
            );
            // The window may outlive this pool (other pools of the device share it): its
            // ranges go back, quarantined like any free.
            if let (Some(w), Some(span)) = (state.window.as_ref(), l.span) {
                lock(w).release(span);
            }
        }
    }
}
