//! When no cached block of a request's size and no free range of a split block serves it: while
//! the workload repeats (see `repeats.rs`), and its plan (see `settle.rs`) does not place the
//! request, the smallest larger cached block does (split, where the storage allows it; see
//! `pieces.rs`), rather than a fresh block. Otherwise a fresh block serves: a larger block
//! taken for a small request is what made pools hold more than their peak.

use super::cache::{reuse_bound, Cached, Key, Taken};
use super::{Pool, PoolOptions, Prepared, State};
use crate::storage::Storage;

/// A block taken out of the cache, and where it was.
type TakenBlock<S> = (Taken<<S as Storage>::Params>, Cached<<S as Storage>::Block>);

impl<S: Storage> Pool<S> {
    /// Takes the smallest larger cached block that should serve `plan` rather than a fresh
    /// block: only while the workload repeats, and only where a memory limit leaves room for
    /// what it holds.
    pub(super) fn larger_block(
        &self,
        state: &mut State<S>,
        plan: &Prepared<S::Params>,
        config: &PoolOptions,
        splits: bool,
    ) -> Option<TakenBlock<S>> {
        let want = plan.key.capacity;
        if config.cache_headroom.is_none() || !state.budget.repeating() {
            return None;
        }
        let lo = Key { capacity: plan.exact, ..plan.key.clone() };
        let (taken, block) = state.cache.take_fit(&lo, u64::MAX)?;
        // What the allocation will hold: a piece where the block is split.
        let holds = if splits && taken.key.capacity > reuse_bound(want) { want } else { taken.key.capacity };
        let held = state.stats.reserved_bytes + state.pending;
        if config.memory_limit.is_some_and(|l| held.saturating_add(holds) > l) {
            state.cache.put_back(taken, block);
            return None;
        }
        Some((taken, block))
    }
}
