//! When no cached block of a request's size and no free range of a split block serves it: a
//! larger cached block may (split, where the storage allows it; see `pieces.rs`), rather than a
//! fresh block.

use super::cache::{reuse_bound, Cached, Key, Taken};
use super::{Pool, PoolOptions, Prepared, State};
use crate::storage::Storage;

/// The largest block split for a request, in times its capacity, unless the budget gave its
/// size back before. A small piece kept long in a much larger block keeps the rest of it from
/// going back (MiniMalloc's adversarial instances hold 1.85x their lower bound with it, 2.21x
/// with no bound, where PyTorch's policy holds 2.0x), while model histories lose nothing by it.
/// A free range of a block already split serves any request it holds, however small: bounding
/// that too (by the block's size) left holes unused, and model histories replayed four times
/// held up to 3.1x their lower bound (t_long: a 4-layer transformer over 2,048 tokens) where
/// they hold 1.84x without it.
const SPLIT_AT_MOST: u64 = 4;

/// A block taken out of the cache, and where it was.
type TakenBlock<S> = (Taken<<S as Storage>::Params>, Cached<<S as Storage>::Block>);

impl<S: Storage> Pool<S> {
    /// Takes the smallest larger cached block that should serve `plan` rather than a fresh
    /// block, where one should and live blocks stay within the budget with it (see
    /// `budget.rs`). Where blocks are not split: where a fresh block would pass the budget for
    /// a size it gave back before (a workload that repeats; the block then serves whole). Where
    /// they are (`splits`): a block at most [`SPLIT_AT_MOST`] times the request, or any for a
    /// size the budget gave back (the request gets a piece, the rest stays free), except where
    /// that size fits as a proven block. Under a memory limit, only where the limit is far
    /// (twice the budget) and would still have room for a fresh block: near a limit, the
    /// limit's own eviction fits best.
    pub(super) fn larger_block(
        &self,
        state: &mut State<S>,
        plan: &Prepared<S::Params>,
        config: &PoolOptions,
        splits: bool,
    ) -> Option<TakenBlock<S>> {
        let lo = Key { capacity: plan.exact, ..plan.key.clone() };
        let want = plan.key.capacity;
        let fit = reuse_bound(want);
        let held = state.stats.reserved_bytes + state.pending;
        let live = held - state.stats.cached_bytes;
        let proven = state.cache.proven_bytes();
        let fraction = config.cache_headroom;
        let budget =
            |live: u64, proven: u64| fraction.map_or(u64::MAX, |f| state.budget.limit(live, f, proven));
        let over =
            fraction.is_some() && held.saturating_add(want) > budget(live.saturating_add(want), proven);
        let ghost = over && state.budget.remembers(&lo, fit);
        if splits {
            // A size the budget gave back that fits as a proven block (see `budget.rs`): a fresh
            // block, as the workload comes back to it; anything else a split block serves if it
            // can, rather than a fresh one.
            let as_proven = budget(live.saturating_add(want), proven.saturating_add(want));
            if ghost && held.saturating_add(want) <= as_proven {
                return None;
            }
        } else if !ghost {
            return None;
        }
        // Split blocks at most `SPLIT_AT_MOST` times the request, except for a size it gave back.
        let max = if splits && !ghost { want.saturating_mul(SPLIT_AT_MOST) } else { u64::MAX };
        let (taken, block) = state.cache.take_fit(&lo, max)?;
        // What the allocation will hold: a piece where the block is split.
        let holds = if splits && taken.key.capacity > fit { want } else { taken.key.capacity };
        // The block taken no longer counts as cached.
        let limit = budget(live, state.cache.proven_bytes());
        let roomy = config
            .memory_limit
            .is_none_or(|l| held.saturating_add(holds) <= l && limit.saturating_mul(2) <= l);
        if live.saturating_add(holds) > limit || !roomy {
            state.cache.put_back(taken, block);
            return None;
        }
        Some((taken, block))
    }
}
