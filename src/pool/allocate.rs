//! Allocation in named steps: prepare (check, work out the block), claim (addresses, a cached
//! block or room under the limit), alloc_block (the device, with one retry after emptying the
//! cache), record (stats and bookkeeping).

use std::sync::Arc;

use super::address::{Refused, Reservation, Span};
use super::cache::{reuse_bound, Cached, Key};
use super::pieces::Holder;
use super::retry::block_name;
use super::{lock, Live, Pool, PoolOptions, Prepared, Source, State};
use crate::allocator::DEFAULT_ALIGNMENT;
use crate::checks::{check_request, len64, round_up};
use crate::error::{Error, Result};
use crate::ptr::DevicePtr;
use crate::snapshot::EventKind;
use crate::storage::Storage;

/// A request worked out and claimed: its plan, where its block comes from, its addresses.
pub(super) type Started<S> =
    (Prepared<<S as Storage>::Params>, Source<<S as Storage>::Block>, Option<Reservation>);

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
        let (mut plan, source, reservation) = self.start(nbytes, alignment, params)?;
        let made = match source {
            Source::Cached(cached) => {
                return Ok(self.record(plan, cached, false, reservation.map(|r| r.span), label))
            }
            Source::Fresh(id) => (id, self.alloc_block(&mut plan, id)),
        };
        self.finish(plan, made, reservation, label)
    }

    /// Steps 1 and 2: the block a request needs, and a cached one or room for it.
    pub(super) fn start(&self, nbytes: usize, alignment: usize, params: S::Params) -> Result<Started<S>> {
        self.storage.check_usable()?;
        let config = lock(&self.config).clone();
        let mut plan = self.prepare(nbytes, alignment, params, &config)?;
        let (source, reservation) = self.claim(&mut plan, &config)?;
        Ok((plan, source, reservation))
    }

    /// After step 3: records a fresh block, or undoes the claim if the device refused it.
    pub(super) fn finish(
        &self,
        plan: Prepared<S::Params>,
        (id, made): (u64, Result<S::Block>),
        reservation: Option<Reservation>,
        label: Option<&str>,
    ) -> Result<DevicePtr> {
        let span = reservation.as_ref().map(|r| r.span);
        let failed = match made {
            // A storage with real addresses must give one: a null would be handed out.
            Ok(block) if span.is_none() && self.storage.address(&block).is_none_or(|a| a == 0) => {
                drop(block);
                Error::backend(self.device, "the storage gave a block without an address")
            }
            Ok(block) => {
                let holder = Holder::whole(Cached { id, block });
                return Ok(self.record(plan, holder, true, span, label));
            }
            Err(e) => e,
        };
        let mut state = lock(&self.state);
        state.pending -= plan.block;
        if let (Some(w), Some(reservation)) = (state.window.as_ref(), reservation) {
            lock(w).unreserve(reservation);
        }
        Err(failed)
    }

    /// Step 1: checks the request and works out the block it needs. Changes nothing.
    fn prepare(
        &self,
        nbytes: usize,
        alignment: usize,
        params: S::Params,
        config: &PoolOptions,
    ) -> Result<Prepared<S::Params>> {
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
        // A capacity past the limit falls back to the exact size.
        let class = config
            .caching
            .then(|| self.storage.size_class(size).and_then(granular))
            .flatten()
            .filter(|&c| c >= size);
        let capacity = class.filter(|&c| c <= max).unwrap_or(exact);
        let key = Key { alignment: self.storage.block_alignment(alignment), params, capacity };
        Ok(Prepared {
            size,
            alignment,
            block: key.capacity,
            want: key.clone(),
            key,
            exact,
            at: None,
            slot: None,
        })
    }

    /// Step 2: under the lock, takes a cached block, or room for a fresh one under the memory
    /// limit (the exact size where the class does not fit even with the cache given back), and
    /// the addresses; a fresh block gets its id. A refusal leaves everything as it was: the limit
    /// is checked before any addresses are taken (taking them may lift quarantine), and a cached
    /// block goes back if the addresses cannot be had.
    fn claim(
        &self,
        plan: &mut Prepared<S::Params>,
        config: &PoolOptions,
    ) -> Result<(Source<S::Block>, Option<Reservation>)> {
        let mut state = lock(&self.state);
        self.sweep_refused(&mut state);
        // Best fit: from the exact size up to an eighth past the capacity.
        let lo = Key { capacity: plan.exact, ..plan.key.clone() };
        let fit = reuse_bound(plan.key.capacity);
        let reuse = config.caching && config.reuse_freed;
        let splits = reuse && self.storage.splits();
        // A repeating workload's planned place (see `settle.rs`).
        let (mut cached, mut spot) = (None, None);
        if reuse && config.cache_headroom.is_some() {
            spot = self.planned_place(&mut state, plan, config, &mut cached);
        }
        let planned = plan.at.is_some() || plan.slot.is_some();
        if reuse && spot.is_none() && cached.is_none() && !planned {
            cached = state.cache.take_fit(&lo, fit);
        }
        // A free range of a split block (see `pieces.rs`), taken once the addresses are had.
        if spot.is_none() && cached.is_none() && !planned && splits {
            spot = state.pieces.find(&lo, plan.key.capacity);
        }
        let piece = spot.is_some();
        let held = state.stats.reserved_bytes + state.pending;
        if !piece && cached.is_none() && reuse && !planned {
            cached = self.larger_block(&mut state, plan, config, splits);
        }
        if !piece && cached.is_none() && held.checked_add(plan.block).is_none() {
            let detail = "the pool would hold more than 2^64 bytes".to_string();
            return Err(self.out_of_memory(&state, plan.size, detail));
        }
        if let (None, false, Some(limit)) = (&cached, piece, config.memory_limit) {
            // Not even with the cache given back: the exact size, or refuse before anything changes.
            // Only whole cached blocks can be given back (not the free ranges of split ones).
            let floor = held - state.cache.bytes();
            if floor + plan.key.capacity > limit {
                if floor + plan.exact > limit {
                    let detail = format!("devalloc memory limit of {limit} bytes");
                    return Err(self.out_of_memory(&state, plan.size, detail));
                }
                plan.key.capacity = plan.exact;
                plan.block = plan.exact;
                (plan.at, plan.slot) = (None, None);
            }
        }
        let reserved = state.window.as_ref().map(|w| lock(w).reserve(plan.size, plan.alignment));
        let reservation = match reserved {
            None => None,
            Some(Ok(reservation)) => Some(reservation),
            Some(Err(refused)) => {
                if let Some((taken, block)) = cached {
                    state.cache.put_back(taken, block);
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
        if let Some(spot) = spot {
            let (holder, len) = state.pieces.take_at(spot);
            state.stats.cached_bytes -= len;
            plan.key.capacity = len;
            return Ok((Source::Cached(holder), reservation));
        }
        if let Some((taken, block)) = cached {
            let whole = taken.key.capacity;
            state.stats.cached_bytes -= whole;
            if let Some(at) = plan.at {
                // The arena, whole: split at the planned piece.
                state.budget.arena(taken.key.capacity, block.id);
                let holder = state.pieces.split_at(taken.key, block, at, plan.key.capacity);
                state.stats.cached_bytes += whole - plan.key.capacity;
                return Ok((Source::Cached(holder), reservation));
            }
            if splits && whole > reuse_bound(plan.key.capacity) {
                let (holder, len) = state.pieces.split(taken.key, block, plan.exact, plan.key.capacity);
                state.stats.cached_bytes += whole - len;
                plan.key.capacity = len;
                return Ok((Source::Cached(holder), reservation));
            }
            plan.key = taken.key;
            return Ok((Source::Cached(Holder::whole(block)), reservation));
        }
        let capacity = plan.block;
        let mut evicted = Vec::new();
        if let Some(over) = config.memory_limit.and_then(|limit| (held + capacity).checked_sub(limit)) {
            // The check above made sure that giving cached blocks back makes room.
            if over > 0 {
                let (bytes, blocks) = state.cache.evict(over);
                state.stats.reserved_bytes -= bytes;
                state.stats.cached_bytes -= bytes;
                evicted = blocks;
                self.note(|| EventKind::Evict { bytes });
            }
        }
        if let (true, Some(fraction)) = (reuse, config.cache_headroom) {
            evicted.extend(self.keep_to_budget(&mut state, plan, fraction));
        }
        state.pending += plan.block;
        state.blocks_made += 1;
        let id = state.blocks_made;
        drop(state);
        drop(evicted);
        Ok((Source::Fresh(id), reservation))
    }

    /// Step 2, for a fresh block that the cache could not serve: gives back as many cached
    /// blocks as keep the pool within its budget (see `budget.rs`), or, where a repeating
    /// workload has a plan, every cached block the plan does not keep (see `settle.rs`).
    /// Returns the blocks, to drop outside the lock.
    fn keep_to_budget(
        &self,
        state: &mut State<S>,
        plan: &Prepared<S::Params>,
        fraction: f64,
    ) -> Vec<S::Block> {
        let (bytes, given) = if plan.at.is_some() {
            // A fresh arena: it serves the whole repetition, the whole cached blocks none of it.
            state.cache.evict_oldest(u64::MAX, |_| true)
        } else if let (Some(settled), Some(_)) = (state.budget.settled.as_ref(), plan.slot) {
            // A slot's fresh block: the cached blocks no slot keeps go back.
            state.cache.evict_unkept(|id| settled.keeps(id))
        } else {
            let held = state.stats.reserved_bytes.saturating_add(state.pending).saturating_add(plan.block);
            let mark = state.stats.peak_allocated_bytes.max(state.stats.allocated_bytes + plan.size);
            let limit = state.budget.limit(mark, state.stats.peak_reserved_bytes, fraction);
            let keep_from = state.budget.keep_from().unwrap_or(u64::MAX);
            state.cache.evict_oldest(keep_from, |freed| held.saturating_sub(freed) > limit)
        };
        if bytes == 0 {
            return Vec::new();
        }
        state.stats.reserved_bytes -= bytes;
        state.stats.cached_bytes -= bytes;
        self.note(|| EventKind::Evict { bytes });
        given.into_iter().map(|(_, b)| b).collect()
    }

    /// Step 3 (fresh blocks only), without the lock: asks the device for block `id`, and on
    /// out of memory empties the cache and asks once more, for the exact size.
    pub(super) fn alloc_block(&self, plan: &mut Prepared<S::Params>, id: u64) -> Result<S::Block> {
        let (alignment, params) = (plan.key.alignment, plan.key.params.clone());
        let capacity = plan.block;
        match self.storage.alloc(capacity, alignment, &params, &block_name(id, capacity)) {
            Err(Error::OutOfMemory { .. }) => {
                self.retry_exact(plan);
                let made = self.storage.alloc(plan.exact, alignment, &params, &block_name(id, plan.exact));
                self.second_try(plan, made)
            }
            other => other,
        }
    }

    /// Step 4: records the allocation, moves the stats and notes the event (under the lock,
    /// so that no free of this address can be noted before it). Cannot fail.
    pub(super) fn record(
        &self,
        plan: Prepared<S::Params>,
        holder: Holder<S::Block>,
        fresh: bool,
        span: Option<Span>,
        label: Option<&str>,
    ) -> DevicePtr {
        let mut state = lock(&self.state);
        let holder = match (fresh, plan.at, holder) {
            // A fresh arena (see `settle.rs`): the request gets its planned piece.
            (true, Some(at), Holder { id, block, .. }) => {
                let block = Arc::try_unwrap(block).ok().expect("a fresh block has one owner");
                let key = Key { capacity: plan.block, ..plan.key.clone() };
                state.budget.arena(plan.block, id);
                let holder = state.pieces.split_at(key, Cached { id, block }, at, plan.key.capacity);
                state.stats.cached_bytes += plan.block - plan.key.capacity;
                holder
            }
            (true, None, holder) => {
                if let Some(j) = plan.slot {
                    state.budget.bind(j, holder.id);
                }
                holder
            }
            (_, _, holder) => holder,
        };
        let Holder { id, block, at, piece } = holder;
        let capacity = plan.key.capacity;
        let base = match span {
            Some(span) => span.base,
            // Checked in `allocate_steps` for fresh blocks; a cached block had one when live.
            None => self.storage.address(&block).unwrap_or_default() + at,
        };
        let stats = &mut state.stats;
        if fresh {
            stats.reserved_bytes += plan.block;
            stats.peak_reserved_bytes = stats.peak_reserved_bytes.max(stats.reserved_bytes);
            stats.cache_misses += 1;
        } else {
            stats.cache_hits += 1;
        }
        stats.allocations += 1;
        stats.live_allocations += 1;
        stats.allocated_bytes += plan.size;
        stats.peak_allocated_bytes = stats.peak_allocated_bytes.max(stats.allocated_bytes);
        let seq = state.cache.next_seq();
        state.budget.allocated(base, plan.size, plan.want, seq);
        if fresh {
            state.pending -= plan.block;
        }
        let live = Live {
            size: plan.size,
            key: plan.key,
            block,
            block_id: id,
            piece: piece.then(|| Arc::new(at)),
            label: label.map(Into::into),
            span,
            // Made for a size the budget had given back (and so on through reuses).
            tensors: Box::default(),
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
