//! [`Pool`]: the allocation policy every built-in allocator runs over its [`Storage`].
//!
//! # Policy
//!
//! - **Requests.** Size > 0, alignment a power of two (at least 256 bytes is what every
//!   address gets). A request that can never be met (larger than the device's largest block,
//!   than the memory limit, or the address window; an alignment past the window) is
//!   [`Error::TooLarge`] / [`Error::InvalidArgument`]; one that cannot be met *now* is
//!   [`Error::OutOfMemory`]. A refused request changes nothing: not the data, not the stats.
//! - **Size classes.** With caching on, a block's capacity is the request rounded up to a size
//!   class: four per power of two, 256 bytes at least (at most 25% more than asked), unless
//!   the storage says otherwise (CUDA rounds requests of 1 MiB and more up to 2 MiB). When the
//!   class would not fit under the device's largest block or the memory limit but the exact
//!   size would, the exact size is used.
//! - **The cache** keeps freed blocks, keyed by capacity, the alignment the block itself has,
//!   the backend's per-allocation params (wgpu: usage) and, where blocks carry their label
//!   (wgpu), the label. There is no splitting or merging: a block is reused only whole, for a
//!   request of the same key. `empty_cache` gives every cached block back to the device.
//!   With [`PoolConfig::reuse_freed`] off (a debug setting) freed blocks are never reused.
//! - **Out of memory.** Past the memory limit, the cache is emptied if that makes room, else the
//!   request fails. When the device itself runs out, the cache is emptied and the request tried
//!   once more (so the one visible change of a failed request is a cache given back).
//! - **Addresses.** Storages without real addresses (host, wgpu) get virtual ones from a
//!   per-device window (see `address.rs`): a reused cached block gets a *fresh* address, and a
//!   freed address range is not handed out again within 2^32 frees unless the 8 PiB window has
//!   no other room, so use-after-free and double free are reported as [`PointerProblem::Freed`].
//! - **What `reserved` counts**: the capacity of every live block plus every cached block;
//!   `allocated` counts the bytes asked for. Memory a device is allocating right now counts
//!   against the limit but not in the stats, which move only once a call has succeeded.
#![deny(unsafe_code)]

mod access;
mod address;
mod cache;
mod history;
mod plans;
mod report;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};

pub(crate) use self::history::now_us;
use self::history::History;

use self::address::{AddressWindow, Refused, Span, MAX_DEVICES, MAX_WINDOW_BITS};
pub(crate) use self::cache::size_class as default_size_class;
use self::cache::{BlockCache, Key};
use crate::allocator::{AllocatorStats, DEFAULT_ALIGNMENT};
use crate::checks::{check_request, len64, round_up};
use crate::device::Device;
use crate::error::{Error, PointerProblem, Result};
use crate::planned::PlanTable;
use crate::ptr::DevicePtr;
use crate::snapshot::EventKind;
use crate::storage::Storage;

/// Settings of a [`Pool`].
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Keep freed blocks by size class and reuse them (see the policy in the module docs).
    pub caching: bool,
    /// Most bytes the pool may hold from the device (live and cached). Past it an allocation
    /// is [`Error::OutOfMemory`] (or [`Error::TooLarge`] when it alone exceeds the limit),
    /// before the device runs out.
    pub memory_limit: Option<u64>,
    /// Reuse freed blocks (the default). Off, a freed block is never handed out again, even
    /// with caching on: a debug setting that makes a use of freed memory (say, a bind group
    /// still pointing at a freed buffer) show up instead of silently reaching a new allocation.
    pub reuse_freed: bool,
    /// Size in bytes of each device's window of virtual addresses: a power of two from 2^17 to
    /// 2^53 (the default). Smaller windows exist for tests of the reuse rule.
    pub address_window: u64,
    /// How many later frees a freed address range stays out of use (2^32 by default).
    pub quarantine_frees: u64,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            caching: false,
            memory_limit: None,
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
}

/// A live allocation, as reported by [`Pool::live_allocations`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocationInfo {
    /// Its address.
    pub ptr: DevicePtr,
    /// Bytes requested.
    pub size: u64,
    /// Bytes held for it.
    pub capacity: u64,
    /// Its label, if it was given one.
    pub label: Option<String>,
}

struct Live<S: Storage> {
    size: u64,
    key: Key<S::Params>,
    block: Arc<S::Block>,
    label: Option<Box<str>>,
    span: Option<Span>,
}

struct State<S: Storage> {
    live: BTreeMap<u64, Live<S>>,
    cache: BlockCache<S::Block, S::Params>,
    window: Option<AddressWindow>,
    stats: AllocatorStats,
    /// Bytes the device is allocating right now (counted against the limit).
    pending: u64,
    plans: PlanTable,
}

/// What an allocation will be, worked out before anything changes.
struct Plan<P> {
    size: u64,
    alignment: u64,
    key: Key<P>,
}

/// Where an allocation's block comes from.
enum Source<B> {
    Cached(B),
    Fresh,
}

/// Generic allocation policy over a [`Storage`]; see the module docs.
pub struct Pool<S: Storage> {
    storage: S,
    device: Device,
    config: Mutex<PoolConfig>,
    state: Mutex<State<S>>,
    history: Mutex<Option<History>>,
    recording: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The bookkeeping is updated in steps that never panic half-way, so a poisoned lock (a
    // panic elsewhere while holding it) leaves it consistent: carry on.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<S: Storage> Pool<S> {
    /// A pool over `storage`. Refuses a device index past 255 (addresses tell 256 devices of a
    /// type apart) and an address window that is not a power of two from 2^17 to 2^53.
    pub fn new(storage: S, config: PoolConfig) -> Result<Self> {
        let device = storage.device();
        if device.index >= MAX_DEVICES {
            return Err(Error::invalid_argument(format!(
                "device {device}: devalloc tells at most {MAX_DEVICES} devices of a type apart"
            )));
        }
        let w = config.address_window;
        if !w.is_power_of_two() || !(1 << 17..=1 << MAX_WINDOW_BITS).contains(&w) {
            return Err(Error::invalid_argument(format!(
                "address window of {w} bytes: it must be a power of two from 2^17 to 2^{MAX_WINDOW_BITS}"
            )));
        }
        let window = (!storage.has_real_addresses())
            .then(|| AddressWindow::new(device, w, config.quarantine_frees.max(1)));
        Ok(Pool {
            storage,
            device,
            config: Mutex::new(config),
            state: Mutex::new(State {
                live: BTreeMap::new(),
                cache: BlockCache::new(),
                window,
                stats: AllocatorStats::default(),
                pending: 0,
                plans: PlanTable::new(),
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

    /// Allocates `nbytes` aligned to `alignment`.
    pub fn allocate(&self, nbytes: usize, alignment: usize) -> Result<DevicePtr> {
        self.allocate_with(nbytes, alignment, None, S::Params::default())
    }

    /// Allocates with a label (shown in reports and, where the backend names its memory, to
    /// the device) and the backend's per-allocation params.
    pub fn allocate_with(
        &self,
        nbytes: usize,
        alignment: usize,
        label: Option<&str>,
        params: S::Params,
    ) -> Result<DevicePtr> {
        let r = self.allocate_steps(nbytes, alignment, label, params);
        if let Err(Error::OutOfMemory { requested, detail, .. }) = &r {
            self.note(|| EventKind::OutOfMemory { requested: *requested, detail: detail.clone() });
        }
        r
    }

    fn allocate_steps(
        &self,
        nbytes: usize,
        alignment: usize,
        label: Option<&str>,
        params: S::Params,
    ) -> Result<DevicePtr> {
        self.storage.check_usable()?;
        let config = lock(&self.config).clone();
        let plan = self.plan(nbytes, alignment, label, params, &config)?;
        let (source, span) = self.claim(&plan, &config)?;
        let (block, fresh) = match source {
            Source::Cached(block) => (block, false),
            Source::Fresh => match self.alloc_block(&plan, label) {
                Ok(block) => (block, true),
                Err(e) => {
                    let mut state = lock(&self.state);
                    state.pending -= plan.key.capacity;
                    if let (Some(w), Some(span)) = (state.window.as_mut(), span) {
                        w.unreserve(span);
                    }
                    return Err(e);
                }
            },
        };
        let (size, capacity) = (plan.size, plan.key.capacity);
        let ptr = self.record(plan, block, fresh, span, label);
        self.note(|| EventKind::Alloc {
            addr: ptr.addr(),
            size,
            capacity,
            label: label.map(Into::into),
            from_cache: !fresh,
            backtrace: None,
        });
        Ok(ptr)
    }

    /// Step 1: checks the request and works out the block it needs. Changes nothing.
    fn plan(
        &self,
        nbytes: usize,
        alignment: usize,
        label: Option<&str>,
        params: S::Params,
        config: &PoolConfig,
    ) -> Result<Plan<S::Params>> {
        let device = self.device;
        let size = check_request(nbytes, alignment, device)?;
        let alignment = len64(alignment).max(len64(DEFAULT_ALIGNMENT));
        let max_alignment =
            if self.storage.has_real_addresses() { 1 << 62 } else { config.address_window / 2 };
        if alignment > max_alignment {
            return Err(Error::invalid_argument(format!(
                "alignment {alignment} cannot be honoured on {device}: the most is {max_alignment}"
            )));
        }
        let max = match config.memory_limit {
            Some(limit) => limit.min(self.storage.max_block_size()),
            None => self.storage.max_block_size(),
        };
        let granular = |c: u64| round_up(c, self.storage.granularity());
        let exact =
            granular(size).filter(|&c| c <= max).ok_or(Error::TooLarge { requested: size, max, device })?;
        // A size class past the limit falls back to the exact size.
        let class = config.caching.then(|| self.storage.size_class(size).and_then(granular)).flatten();
        let capacity = class.filter(|&c| c <= max).unwrap_or(exact);
        let label_key = (S::FIXED_LABELS).then(|| label.map(Box::from)).flatten();
        let key =
            Key { capacity, alignment: self.storage.block_alignment(alignment), params, label: label_key };
        Ok(Plan { size, alignment, key })
    }

    /// Step 2: under the lock, takes the addresses and either a cached block or room for a
    /// fresh one under the memory limit.
    fn claim(&self, plan: &Plan<S::Params>, config: &PoolConfig) -> Result<(Source<S::Block>, Option<Span>)> {
        let capacity = plan.key.capacity;
        let mut state = lock(&self.state);
        let span = match state.window.as_mut().map(|w| w.reserve(plan.size, plan.alignment)) {
            None => None,
            Some(Ok(span)) => Some(span),
            Some(Err(Refused::NeverFits { max })) => {
                return Err(Error::TooLarge { requested: plan.size, max, device: self.device })
            }
            Some(Err(Refused::Full)) => {
                return Err(self.out_of_memory(&state, plan.size, "devalloc's address window is full".into()))
            }
        };
        let cached = if config.caching && config.reuse_freed { state.cache.take(&plan.key) } else { None };
        if let Some(block) = cached {
            state.stats.cached_bytes -= capacity;
            return Ok((Source::Cached(block), span));
        }
        let mut evicted = Vec::new();
        if let Some(limit) = config.memory_limit {
            let held = state.stats.reserved_bytes + state.pending;
            if held + capacity > limit && held - state.stats.cached_bytes + capacity <= limit {
                let bytes = state.stats.cached_bytes;
                evicted = Self::take_cache(&mut state);
                self.note(|| EventKind::Evict { bytes });
            }
            let held = state.stats.reserved_bytes + state.pending;
            if held + capacity > limit {
                if let (Some(w), Some(span)) = (state.window.as_mut(), span) {
                    w.unreserve(span);
                }
                let detail = format!("devalloc memory limit of {limit} bytes");
                return Err(self.out_of_memory(&state, plan.size, detail));
            }
        }
        state.pending += capacity;
        drop(state);
        drop(evicted);
        Ok((Source::Fresh, span))
    }

    /// Step 3 (fresh blocks only), without the lock: asks the device, and on out of memory
    /// empties the cache and asks once more.
    fn alloc_block(&self, plan: &Plan<S::Params>, label: Option<&str>) -> Result<S::Block> {
        let (capacity, alignment, params) = (plan.key.capacity, plan.key.alignment, &plan.key.params);
        match self.storage.alloc(capacity, alignment, params, label) {
            Err(Error::OutOfMemory { .. }) => {
                let freed = self.empty_cache();
                log::debug!(
                    "devalloc: {} out of memory; emptied {freed} cached bytes and retrying",
                    self.device
                );
                self.storage.alloc(capacity, alignment, params, label).map_err(|e| match e {
                    Error::OutOfMemory { detail, .. } => {
                        self.out_of_memory(&lock(&self.state), plan.size, detail)
                    }
                    e => e,
                })
            }
            other => other,
        }
    }

    /// Step 4: records the allocation and moves the stats. Cannot fail.
    fn record(
        &self,
        plan: Plan<S::Params>,
        block: S::Block,
        fresh: bool,
        span: Option<Span>,
        label: Option<&str>,
    ) -> DevicePtr {
        let capacity = plan.key.capacity;
        let mut state = lock(&self.state);
        let base = match span {
            Some(span) => span.base,
            None => self.storage.address(&block).unwrap_or_default(),
        };
        let stats = &mut state.stats;
        if fresh {
            stats.reserved_bytes += capacity;
            stats.peak_reserved_bytes = stats.peak_reserved_bytes.max(stats.reserved_bytes);
            stats.cache_misses += 1;
        } else {
            stats.cache_hits += 1;
        }
        stats.allocations += 1;
        stats.live_allocations += 1;
        stats.allocated_bytes += plan.size;
        stats.peak_allocated_bytes = stats.peak_allocated_bytes.max(stats.allocated_bytes);
        if fresh {
            state.pending -= capacity;
        }
        let live = Live {
            size: plan.size,
            key: plan.key,
            block: Arc::new(block),
            label: label.map(Into::into),
            span,
        };
        state.live.insert(base, live);
        DevicePtr::new(base)
    }

    /// Frees the allocation that starts at `ptr`.
    pub fn deallocate(&self, ptr: DevicePtr) -> Result<()> {
        let config = lock(&self.config).clone();
        let mut state = lock(&self.state);
        let Some(live) = state.live.remove(&ptr.addr()) else {
            let problem = match self.pointer_problem(&state, ptr) {
                PointerProblem::Unknown if Self::find(&state, ptr.addr()).is_some() => {
                    PointerProblem::NotAllocationStart
                }
                p => p,
            };
            return Err(Error::InvalidPointer { ptr, device: self.device, problem });
        };
        let capacity = live.key.capacity;
        let stats = &mut state.stats;
        stats.deallocations += 1;
        stats.live_allocations -= 1;
        stats.allocated_bytes -= live.size;
        if let (Some(w), Some(span)) = (state.window.as_mut(), live.span) {
            w.release(span);
        }
        let keep = config.caching && config.reuse_freed;
        let size = live.size;
        let to_drop = match (keep, Arc::try_unwrap(live.block)) {
            (true, Ok(block)) => {
                state.stats.cached_bytes += capacity;
                state.cache.put(live.key, block);
                None
            }
            (_, block) => {
                state.stats.reserved_bytes -= capacity;
                Some(block)
            }
        };
        drop(state);
        let to_cache = to_drop.is_none();
        drop(to_drop);
        self.note(|| EventKind::Free { addr: ptr.addr(), size, capacity, to_cache });
        Ok(())
    }

    fn find(state: &State<S>, addr: u64) -> Option<(u64, &Live<S>)> {
        state.live.range(..=addr).next_back().filter(|(&b, l)| addr <= b + l.size).map(|(&b, l)| (b, l))
    }

    fn pointer_problem(&self, state: &State<S>, ptr: DevicePtr) -> PointerProblem {
        if ptr.is_null() {
            PointerProblem::Null
        } else if state.window.as_ref().is_some_and(|w| w.was_freed(ptr.addr())) {
            PointerProblem::Freed
        } else {
            PointerProblem::Unknown
        }
    }

    /// Whether `ptr` lies in (or at the end of) a live allocation of this pool.
    pub fn contains(&self, ptr: DevicePtr) -> bool {
        Self::find(&lock(&self.state), ptr.addr()).is_some()
    }

    /// The block behind `ptr`, checked so that `len` bytes from `ptr` stay in its allocation.
    pub fn block_at(&self, ptr: DevicePtr, len: u64) -> Result<BlockRef<S::Block>> {
        let state = lock(&self.state);
        let Some((base, live)) = Self::find(&state, ptr.addr()) else {
            let problem = self.pointer_problem(&state, ptr);
            return Err(Error::InvalidPointer { ptr, device: self.device, problem });
        };
        let offset = ptr.addr() - base;
        if offset.checked_add(len).is_none_or(|end| end > live.size) {
            return Err(Error::OutOfBounds {
                device: self.device,
                what: "an allocation".into(),
                offset,
                len,
                size: live.size,
            });
        }
        Ok(BlockRef { block: Arc::clone(&live.block), offset, available: live.size - offset })
    }

    fn take_cache(state: &mut State<S>) -> Vec<S::Block> {
        state.stats.reserved_bytes -= state.cache.bytes();
        state.stats.cached_bytes = 0;
        state.cache.take_all()
    }

    /// Frees every cached block; returns the bytes given back to the device.
    pub fn empty_cache(&self) -> u64 {
        let mut state = lock(&self.state);
        let bytes = state.cache.bytes();
        let blocks = Self::take_cache(&mut state);
        drop(state);
        drop(blocks);
        self.note(|| EventKind::EmptyCache { bytes });
        bytes
    }

    /// The pool's statistics.
    pub fn stats(&self) -> AllocatorStats {
        let mut stats = lock(&self.state).stats;
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
        }
    }
}
