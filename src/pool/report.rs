//! What a pool holds, in words: live allocations, the report, the out-of-memory message.

use std::fmt::Write as _;

use super::{lock, Live, Pool, State};
use crate::error::Error;
use crate::snapshot::{CachedBlocks, DeviceSnapshot, LiveAllocation, PlannedBuffer, SegmentNote};
use crate::storage::Storage;

impl<S: Storage> Pool<S> {
    /// An out-of-memory error that says what the pool holds and its largest live allocations.
    pub(super) fn out_of_memory(&self, state: &State<S>, requested: u64, what: String) -> Error {
        let s = &state.stats;
        let mut largest: Vec<(&u64, &Live<S>)> = state.live.iter().collect();
        largest.sort_by_key(|(_, l)| std::cmp::Reverse(l.size));
        let mut detail = format!(
            "{what}; {} bytes allocated in {} allocation(s), {} reserved, {} cached",
            s.allocated_bytes, s.live_allocations, s.reserved_bytes, s.cached_bytes
        );
        if !largest.is_empty() {
            detail.push_str("; largest live:");
            for (base, l) in largest.iter().take(3) {
                let name = l.label.as_deref().unwrap_or("unlabelled");
                let _ = write!(detail, " {name} ({} bytes at {base:#x})", l.size);
            }
        }
        Error::OutOfMemory { requested, device: self.device, detail }
    }

    /// Every live allocation, in address order.
    pub fn live_allocations(&self) -> Vec<LiveAllocation> {
        let mut state = lock(&self.state);
        self.sweep_refused(&mut state);
        self.live_in(&state)
    }

    fn live_in(&self, state: &State<S>) -> Vec<LiveAllocation> {
        state
            .live
            .iter()
            .map(|(&addr, l)| LiveAllocation {
                addr,
                size: l.size,
                capacity: l.key.capacity,
                label: l.label.as_deref().map(Into::into),
                block: l.block_id,
                tensors: l.tensors.to_vec(),
                segments: self.segments_of(l),
            })
            .collect()
    }

    /// The device buffers of a live allocation, where it lies in several (offsets from its
    /// start, which is the block's: only storages that never split have segments).
    fn segments_of(&self, l: &Live<S>) -> Vec<SegmentNote> {
        let sizes = self.storage.segment_sizes(&l.block);
        let offsets = sizes.iter().scan(0, |at, &size| Some(std::mem::replace(at, *at + size)));
        offsets.zip(&sizes).map(|(offset, &size)| SegmentNote { offset, size }).collect()
    }

    /// A readable summary: stats, then each live allocation.
    pub fn report(&self) -> String {
        // Stats and allocations read under one lock, so that they agree.
        let (mut s, live) = {
            let mut state = lock(&self.state);
            self.sweep_refused(&mut state);
            (state.stats, self.live_in(&state))
        };
        s.staging_bytes = self.storage.staging_bytes();
        let mut out = format!(
            "{}: {} live allocation(s), {} bytes allocated (peak {}), {} reserved (peak {}), {} cached; {} hits / {} misses; {} staging\n",
            self.device,
            s.live_allocations,
            s.allocated_bytes,
            s.peak_allocated_bytes,
            s.reserved_bytes,
            s.peak_reserved_bytes,
            s.cached_bytes,
            s.cache_hits,
            s.cache_misses,
            s.staging_bytes
        );
        for a in live {
            let _ = writeln!(
                out,
                "  {} {} bytes ({})",
                a.ptr(),
                a.size,
                a.label.as_deref().unwrap_or("unlabelled")
            );
        }
        out
    }

    /// This device's part of a [`crate::snapshot::Snapshot`].
    pub fn snapshot(&self) -> DeviceSnapshot {
        // Everything but the device's own numbers under one lock (history after state, the
        // order every path takes them in), so that stats, allocations and events agree.
        let (mut stats, live, cached, planned, history) = {
            let mut state = lock(&self.state);
            self.sweep_refused(&mut state);
            let live = self.live_in(&state);
            // Whole cached blocks and the free ranges of split ones, by capacity.
            let mut by = state.pieces.counts();
            for (capacity, count) in state.cache.counts() {
                *by.entry(capacity).or_default() += count;
            }
            let cached = by.into_iter().map(|(capacity, count)| CachedBlocks { capacity, count }).collect();
            let planned = state
                .plans
                .list()
                .into_iter()
                // A planned buffer the browser refused holds nothing: not listed, as not counted.
                .filter(|(_, base, _)| !state.refused.contains_key(&base.addr()))
                .map(|(memory_id, base, size)| PlannedBuffer { memory_id, addr: base.addr(), size })
                .collect();
            (state.stats, live, cached, planned, self.history_snapshot())
        };
        stats.staging_bytes = self.storage.staging_bytes();
        DeviceSnapshot {
            device: self.device.to_string(),
            name: self.storage.name(),
            stats,
            memory_limit: self.memory_limit(),
            device_memory: self.storage.device_memory(),
            live,
            cached,
            planned,
            history,
        }
    }
}
