//! Frees: an allocation's block back to the cache (or the device), a piece of a split block
//! back to its block (see `pieces.rs`), and the cache back to the device.

use std::sync::{Arc, MutexGuard};

use super::cache::Cached;
use super::pieces::Freed;
use super::{lock, Live, Pool, State};
use crate::error::{Error, PointerProblem, Result};
use crate::ptr::DevicePtr;
use crate::snapshot::EventKind;
use crate::storage::Storage;

impl<S: Storage> Pool<S> {
    /// Frees the allocation that starts at `ptr`.
    pub fn deallocate(&self, ptr: DevicePtr) -> Result<()> {
        let config = lock(&self.config).clone();
        let mut state = lock(&self.state);
        self.sweep_refused(&mut state);
        let Some(live) = state.live.remove(&ptr.addr()) else {
            if let Some(e) = self.forget_refused(&mut state, ptr) {
                return Err(e);
            }
            let problem = match self.pointer_problem(&state, ptr) {
                PointerProblem::Unknown if Self::find(&state, ptr.addr()).is_some() => {
                    PointerProblem::NotAllocationStart
                }
                p => p,
            };
            return Err(Error::InvalidPointer { ptr, device: self.device, problem });
        };
        let capacity = live.key.capacity;
        state.budget.freed(ptr.addr(), live.size, self.storage.splits());
        let stats = &mut state.stats;
        stats.deallocations += 1;
        stats.live_allocations -= 1;
        stats.allocated_bytes -= live.size;
        if let (Some(w), Some(span)) = (state.window.as_ref(), live.span) {
            lock(w).release(span);
        }
        let keep = config.caching && config.reuse_freed && self.storage.reusable(&live.block);
        let size = live.size;
        if live.piece.is_some() {
            return self.free_piece(state, ptr, live, keep);
        }
        let to_drop = match (keep, Arc::try_unwrap(live.block)) {
            (true, Ok(block)) => {
                state.stats.cached_bytes += capacity;
                state.cache.put(live.key, Cached { id: live.block_id, block });
                None
            }
            (_, block) => {
                state.stats.reserved_bytes -= capacity;
                if let (false, Ok(owned)) = (config.reuse_freed, &block) {
                    self.storage.retire(owned);
                }
                Some(block)
            }
        };
        let to_cache = to_drop.is_none();
        // Noted under the lock: no allocation of this address can be noted before its free.
        self.note(|| EventKind::Free { addr: ptr.addr(), size, capacity, to_cache });
        drop(state);
        drop(to_drop);
        Ok(())
    }

    pub(super) fn take_cache(state: &mut State<S>) -> Vec<S::Block> {
        state.stats.reserved_bytes -= state.cache.bytes();
        state.stats.cached_bytes -= state.cache.bytes();
        state.cache.take_all()
    }

    /// Frees a piece of a split block (see `pieces.rs`): its range is free again in its
    /// segment, and a segment left with no live piece is one whole cached block again.
    fn free_piece(
        &self,
        mut state: MutexGuard<'_, State<S>>,
        ptr: DevicePtr,
        live: Live<S>,
        keep: bool,
    ) -> Result<()> {
        let (size, capacity, at) = (live.size, live.key.capacity, live.at());
        // A copy through this piece still runs (an async copy in flight): its range must not be
        // handed out again meanwhile.
        let in_use = !keep || live.piece.as_ref().is_some_and(|t| Arc::strong_count(t) > 1);
        drop(live.block);
        state.stats.cached_bytes += capacity;
        // Noted as a free to the cache; a segment dropped below is given back (an eviction).
        self.note(|| EventKind::Free { addr: ptr.addr(), size, capacity, to_cache: true });
        let to_drop = match state.pieces.free(live.block_id, at, capacity, in_use) {
            Freed::Kept => None,
            Freed::Whole(key, cached) => {
                state.cache.put(key, cached);
                None
            }
            Freed::Dropped(bytes, block) => {
                state.stats.reserved_bytes -= bytes;
                state.stats.cached_bytes -= bytes;
                self.note(|| EventKind::Evict { bytes });
                Some(block)
            }
        };
        drop(state);
        drop(to_drop);
        Ok(())
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
}
