//! Allocation in named steps: plan (check, work out the block), claim (addresses, a cached
//! block or room under the limit), alloc_block (the device, with one retry after emptying the
//! cache), record (stats and bookkeeping).

use std::sync::Arc;

use super::address::{Refused, Span};
use super::cache::Key;
use super::{lock, Live, Plan, Pool, PoolOptions, Source};
use crate::allocator::DEFAULT_ALIGNMENT;
use crate::checks::{check_request, len64, round_up};
use crate::error::{Error, Result};
use crate::ptr::DevicePtr;
use crate::snapshot::EventKind;
use crate::storage::Storage;

impl<S: Storage> Pool<S> {
    /// Allocates `nbytes` aligned to `alignment`.
    pub fn allocate(&self, nbytes: usize, alignment: usize) -> Result<DevicePtr> {
        self.allocate_params(nbytes, alignment, None, S::Params::default())
    }

    /// Allocates with a label (shown in reports and, where the backend names its memory, to
    /// the device) and the backend's per-allocation params.
    pub fn allocate_params(
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
                // A storage with real addresses must give one: a null would be handed out.
                Ok(block) if span.is_none() && self.storage.address(&block).is_none_or(|a| a == 0) => {
                    lock(&self.state).pending -= plan.key.capacity;
                    drop(block);
                    return Err(Error::backend(self.device, "the storage gave a block without an address"));
                }
                Ok(block) => (block, true),
                Err(e) => {
                    let mut state = lock(&self.state);
                    state.pending -= plan.key.capacity;
                    if let (Some(w), Some(span)) = (state.window.as_ref(), span) {
                        lock(w).unreserve(span);
                    }
                    return Err(e);
                }
            },
        };
        Ok(self.record(plan, block, fresh, span, label))
    }

    /// Step 1: checks the request and works out the block it needs. Changes nothing.
    fn plan(
        &self,
        nbytes: usize,
        alignment: usize,
        label: Option<&str>,
        params: S::Params,
        config: &PoolOptions,
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
        // The largest block, in whole granules (a limit of 1001 bytes on wgpu holds 1000).
        let granule = self.storage.granularity();
        let max = match config.memory_limit {
            Some(limit) => limit.min(self.storage.max_block_size()),
            None => self.storage.max_block_size(),
        } / granule
            * granule;
        let granular = |c: u64| round_up(c, self.storage.granularity());
        let exact =
            granular(size).filter(|&c| c <= max).ok_or(Error::TooLarge { requested: size, max, device })?;
        // A size class past the limit falls back to the exact size.
        let class = config
            .caching
            .then(|| self.storage.size_class(size).and_then(granular))
            .flatten()
            .filter(|&c| c >= size);
        let capacity = class.filter(|&c| c <= max).unwrap_or(exact);
        let label_key = (S::FIXED_LABELS).then(|| label.map(Box::from)).flatten();
        let key =
            Key { capacity, alignment: self.storage.block_alignment(alignment), params, label: label_key };
        Ok(Plan { size, alignment, key })
    }

    /// Step 2: under the lock, takes a cached block or room for a fresh one under the memory
    /// limit, and the addresses. A refusal leaves everything as it was: the limit is checked
    /// before any addresses are taken (taking them may lift quarantine), and a cached block
    /// goes back if the addresses cannot be had.
    fn claim(
        &self,
        plan: &Plan<S::Params>,
        config: &PoolOptions,
    ) -> Result<(Source<S::Block>, Option<Span>)> {
        let capacity = plan.key.capacity;
        let mut state = lock(&self.state);
        let cached = if config.caching && config.reuse_freed { state.cache.take(&plan.key) } else { None };
        let held = state.stats.reserved_bytes + state.pending;
        if let (None, Some(limit)) = (&cached, config.memory_limit) {
            // Not even with the cache given back: refuse before anything changes.
            if held - state.stats.cached_bytes + capacity > limit {
                let detail = format!("devalloc memory limit of {limit} bytes");
                return Err(self.out_of_memory(&state, plan.size, detail));
            }
        }
        let reserved = state.window.as_ref().map(|w| lock(w).reserve(plan.size, plan.alignment));
        let span = match reserved {
            None => None,
            Some(Ok(span)) => Some(span),
            Some(Err(refused)) => {
                if let Some(block) = cached {
                    state.cache.put(plan.key.clone(), block);
                }
                return Err(match refused {
                    Refused::NeverFits { max } if plan.size > max => {
                        Error::TooLarge { requested: plan.size, max, device: self.device }
                    }
                    Refused::NeverFits { .. } => Error::invalid_argument(format!(
                        "alignment {} leaves no room for {} bytes in {}'s window of {} addresses",
                        plan.alignment, plan.size, self.device, config.address_window
                    )),
                    Refused::Full => {
                        self.out_of_memory(&state, plan.size, "devalloc's address window is full".into())
                    }
                });
            }
        };
        if let Some(block) = cached {
            state.stats.cached_bytes -= capacity;
            return Ok((Source::Cached(block), span));
        }
        let mut evicted = Vec::new();
        if config.memory_limit.is_some_and(|limit| held + capacity > limit) {
            // The check above made sure that giving the cache back makes room.
            let bytes = state.stats.cached_bytes;
            evicted = Self::take_cache(&mut state);
            self.note(|| EventKind::Evict { bytes });
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
                // Noted as an eviction (a user's `empty_cache` is its own event), if any.
                let (freed, blocks) = {
                    let mut state = lock(&self.state);
                    let bytes = state.cache.bytes();
                    let blocks = Self::take_cache(&mut state);
                    if bytes > 0 {
                        self.note(|| EventKind::Evict { bytes });
                    }
                    (bytes, blocks)
                };
                drop(blocks);
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

    /// Step 4: records the allocation, moves the stats and notes the event (under the lock,
    /// so that no free of this address can be noted before it). Cannot fail.
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
            // Checked in `allocate_steps` for fresh blocks; a cached block had one when live.
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
        self.note(|| EventKind::Alloc {
            addr: base,
            size: plan.size,
            capacity,
            label: label.map(Into::into),
            from_cache: !fresh,
            backtrace: None,
        });
        DevicePtr::new(base)
    }
}
