//! How a repeating workload settles: once the pool sees it repeat (see `repeats.rs`), it plans
//! the blocks of the next repetitions from the one it just saw, rather than growing its cache
//! online. The pool keeps its last [`LOG_EVENTS`] allocations and frees; the repetition is a
//! stretch of them.
//!
//! - Where blocks split (host memory, CUDA), the repetition's allocations are laid out in one
//!   block, an *arena*, by the crate's planner ([`crate::plan`], [`Strategy::Fast`]): each
//!   allocation of the next repetitions gets its planned piece of the arena where it asks for
//!   what the plan's allocation at its place asked for. The pool then holds about what the
//!   repetition holds at once, plus what lives outside it.
//! - Where they do not (wgpu), each allocation gets a slot, a block it has to itself while it
//!   lives, by the smaller of two offline assignments over the repetition's lifetimes: largest
//!   first, best fit (`unshared`), and in the order made, a free slot grown where none is
//!   enough (`in_order`: a growing KV cache passes its slots along). The pool keeps the slots'
//!   blocks and gives the rest back.
//!
//! An allocation that does not match the plan (another size, an alignment the arena cannot give
//! at its place, its piece taken) is served as if there were no plan; a repetition that ends
//! differently ends the plan.

use std::collections::{BTreeMap, VecDeque};

use super::cache::{Cached, Key, Taken};
use super::pieces::Spot;
use super::{Pool, PoolOptions, Prepared, State};
use crate::plan::{executorch_greedy, greedy_by_size, TensorLife};
use crate::storage::{Storage, GRANULE};

/// Most events kept: a repetition longer than this gets no plan (about 40 bytes each).
pub(crate) const LOG_EVENTS: usize = 1 << 17;
/// The arena's offsets are multiples of this.
const ARENA_ALIGNMENT: u64 = 512;

/// One allocation or free, as the plan needs it.
enum Event<P> {
    /// An allocation at `addr` of `size` bytes, of a block of `key`'s kind and capacity.
    Alloc { addr: u64, size: u64, key: Key<P> },
    /// The free of the allocation at `addr`.
    Free { addr: u64 },
}

/// The last [`LOG_EVENTS`] events, and the number of the oldest.
pub(crate) struct EventLog<P> {
    events: VecDeque<Event<P>>,
    first: u64,
}

impl<P: Ord + Clone> EventLog<P> {
    pub fn new() -> Self {
        EventLog { events: VecDeque::new(), first: 0 }
    }

    fn push(&mut self, e: Event<P>) {
        if self.events.len() == LOG_EVENTS {
            self.events.pop_front();
            self.first += 1;
        }
        self.events.push_back(e);
    }

    /// Notes an allocation (`key`: its block's kind, with the capacity its size asks for).
    pub fn allocated(&mut self, addr: u64, size: u64, key: Key<P>) {
        self.push(Event::Alloc { addr, size, key });
    }

    /// Notes a free.
    pub fn freed(&mut self, addr: u64) {
        self.push(Event::Free { addr });
    }

    /// The plan for the repetition of the events from number `from` to the last (`None` where
    /// they are no longer all kept, or hold no allocation), with `arena` set where blocks split.
    pub fn plan(&self, from: u64, level: usize, arena: bool) -> Option<Settled<P>> {
        let skip = usize::try_from(from.checked_sub(self.first)?).ok()?;
        let events: Vec<&Event<P>> = self.events.iter().skip(skip).collect();
        let end = events.len() as u64;
        // Each allocation: (size, key, first step, last step).
        let mut allocs: Vec<(u64, Key<P>, u64, u64)> = Vec::new();
        let mut open: BTreeMap<u64, usize> = BTreeMap::new();
        for (step, e) in (0u64..).zip(&events) {
            match e {
                Event::Alloc { addr, size, key } => {
                    open.insert(*addr, allocs.len());
                    allocs.push((*size, key.clone(), step, end));
                }
                Event::Free { addr } => {
                    // A free of an allocation made before the repetition plays no part in it.
                    if let Some(i) = open.remove(addr) {
                        allocs[i].3 = step.saturating_sub(1).max(allocs[i].2);
                    }
                }
            }
        }
        if allocs.is_empty() {
            return None;
        }
        let (offsets, arena_size, slots);
        if arena {
            let lives: Vec<TensorLife> = allocs
                .iter()
                .map(|(_, k, first, last)| TensorLife { size: k.capacity, first: *first, last: *last })
                .collect();
            // The smaller of two fast planners' layouts.
            let by_size = greedy_by_size(&lives, ARENA_ALIGNMENT).ok()?;
            let planned = match executorch_greedy(&lives, ARENA_ALIGNMENT) {
                Ok(p) if p.size() < by_size.size() => p,
                _ => by_size,
            };
            offsets = planned.offsets().to_vec();
            (arena_size, slots) = (planned.size(), Vec::new());
        } else {
            // The fewer bytes of two offline assignments.
            let (a, b) = (unshared(&allocs), in_order(&allocs));
            let bytes = |s: &Slots<P>| s.iter().map(|(k, _)| u128::from(k.capacity)).sum::<u128>();
            (offsets, slots) = if bytes(&b.1) < bytes(&a.1) { b } else { a };
            arena_size = 0;
        }
        let allocs = allocs.into_iter().map(|(size, key, ..)| (size, key)).collect();
        let bound = BTreeMap::new();
        Some(Settled { level, allocs, offsets, arena_size, arena: None, slots, bound })
    }
}

/// Where the plan puts an allocation.
pub(crate) enum Place<P> {
    /// At this offset in the arena (blocks split).
    Arena(u64),
    /// In this slot's block, of this key (blocks do not split), and the block's id where the
    /// slot has one.
    Slot(usize, Key<P>, Option<u64>),
}

/// The plan of a repeating workload: see the module docs.
pub(crate) struct Settled<P> {
    /// The level (live allocations outside the repetition) it repeats at (see `repeats.rs`).
    pub level: usize,
    /// Each allocation of the repetition, in order: its size and the key its size asks for.
    allocs: Vec<(u64, Key<P>)>,
    /// Each allocation's offset in the arena (blocks split) or slot (they do not).
    offsets: Vec<u64>,
    /// Where blocks split: the arena's size, and its block once there is one.
    pub arena_size: u64,
    pub arena: Option<u64>,
    /// Where they do not: each slot's block (its key, and its id once it has one), and the ids.
    slots: Slots<P>,
    bound: BTreeMap<u64, usize>,
}

impl<P: Ord + Clone> Settled<P> {
    /// Where the allocation at place `k` of a repetition goes, if it asks for `size` bytes of
    /// `key`'s kind and capacity, as planned.
    pub fn place(&self, k: u64, size: u64, key: &Key<P>) -> Option<Place<P>> {
        let k = usize::try_from(k).ok()?;
        let (s, planned) = self.allocs.get(k)?;
        if *s != size || planned != key {
            return None;
        }
        let at = *self.offsets.get(k)?;
        if self.arena_size > 0 {
            return Some(Place::Arena(at));
        }
        let j = usize::try_from(at).ok()?;
        let (key, id) = self.slots.get(j)?;
        Some(Place::Slot(j, key.clone(), *id))
    }

    /// Slot `j`'s block is block `id` now.
    pub fn bind(&mut self, j: usize, id: u64) {
        if let Some((_, old)) = self.slots.get_mut(j) {
            if let Some(old) = old.replace(id) {
                self.bound.remove(&old);
            }
            self.bound.insert(id, j);
        }
    }

    /// Whether block `id` is a slot's (blocks that do not split).
    pub fn keeps(&self, id: u64) -> bool {
        self.bound.contains_key(&id)
    }
}

/// Each allocation's (size, key, first step, last step).
type Lives<P> = [(u64, Key<P>, u64, u64)];
/// Slots: each one's key and its block's id once it has one.
type Slots<P> = Vec<(Key<P>, Option<u64>)>;

/// Where blocks do not split: each allocation's slot, and the slots' keys. Largest allocations
/// first (then the longest-lived), each takes the smallest slot of its alignment and params that
/// holds it and is free for its whole life, or else a new slot of its own capacity: offline
/// best fit, close to the least any policy that never shares a block can hold
/// (`Trace::unshared_bound`).
fn unshared<P: Ord + Clone>(allocs: &Lives<P>) -> (Vec<u64>, Slots<P>) {
    let mut order: Vec<usize> = (0..allocs.len()).collect();
    order.sort_by_key(|&i| {
        (std::cmp::Reverse(allocs[i].1.capacity), std::cmp::Reverse(allocs[i].3 - allocs[i].2), i)
    });
    // Slots by (alignment, params, capacity, index), each with its lives sorted by start.
    let mut by_size: std::collections::BTreeSet<(Key<P>, usize)> = std::collections::BTreeSet::new();
    let mut lives: Vec<Vec<(u64, u64)>> = Vec::new();
    let mut slots: Slots<P> = Vec::new();
    let mut slot_of = vec![0u64; allocs.len()];
    for i in order {
        let (_, key, first, last) = &allocs[i];
        let free = |l: &Vec<(u64, u64)>| {
            let n = l.partition_point(|&(f, _)| f < *first);
            (n == 0 || l[n - 1].1 < *first) && l.get(n).is_none_or(|&(f, _)| f > *last)
        };
        let hi = Key { capacity: u64::MAX, ..key.clone() };
        let found =
            by_size.range((key.clone(), 0)..=(hi, usize::MAX)).map(|(_, j)| *j).find(|&j| free(&lives[j]));
        let j = found.unwrap_or_else(|| {
            slots.push((key.clone(), None));
            lives.push(Vec::new());
            by_size.insert((key.clone(), slots.len() - 1));
            slots.len() - 1
        });
        let n = lives[j].partition_point(|&(f, _)| f < *first);
        lives[j].insert(n, (*first, *last));
        slot_of[i] = j as u64;
    }
    (slot_of, slots)
}

/// Where blocks do not split, the other way: allocations in the order they were made, each
/// takes the smallest slot of its alignment and params that is free by then and holds it; else
/// the largest free one, grown to hold it; else a new slot. Slots that a growing tensor (a KV
/// cache) or a rotation of same-sized ones passes along are reused where largest-first
/// assignment (`unshared`) opens a slot per size.
fn in_order<P: Ord + Clone>(allocs: &Lives<P>) -> (Vec<u64>, Slots<P>) {
    use std::cmp::Reverse;
    let mut free: std::collections::BTreeSet<(Key<P>, usize)> = std::collections::BTreeSet::new();
    let mut busy: std::collections::BinaryHeap<Reverse<(u64, usize)>> = std::collections::BinaryHeap::new();
    let mut slots: Slots<P> = Vec::new();
    let mut slot_of = Vec::with_capacity(allocs.len());
    for (_, key, first, last) in allocs {
        while let Some(&Reverse((end, j))) = busy.peek() {
            if end >= *first {
                break;
            }
            busy.pop();
            free.insert((slots[j].0.clone(), j));
        }
        let lo = Key { capacity: 0, ..key.clone() };
        let hi = Key { capacity: u64::MAX, ..key.clone() };
        let fits = free.range((key.clone(), 0)..=(hi, usize::MAX)).next();
        let j = match fits.or_else(|| free.range((lo, 0)..(key.clone(), 0)).next_back()) {
            Some(found) => {
                let found = found.clone();
                free.remove(&found);
                let j = found.1;
                slots[j].0.capacity = slots[j].0.capacity.max(key.capacity);
                j
            }
            None => {
                slots.push((key.clone(), None));
                slots.len() - 1
            }
        };
        busy.push(Reverse((*last, j)));
        slot_of.push(j as u64);
    }
    (slot_of, slots)
}

/// A cached block taken for a request, and how it was taken.
type Found<S> = (Taken<<S as Storage>::Params>, Cached<<S as Storage>::Block>);

impl<S: Storage> Pool<S> {
    /// Where a repeating workload has a plan (see the module docs) and the request asks for what the
    /// plan's request at its place asked for: its planned place.
    ///
    /// Where blocks split, its piece of the arena: a spot (returned) where the arena is split
    /// already and the piece is free; the arena, whole, from the cache (in `cached`, with
    /// `plan.at` set); or a fresh arena (`plan.at` and `plan.block` set), where a memory limit
    /// leaves room for it. Where they do not, its slot's block from the cache (in `cached`), or a
    /// fresh block of the slot's capacity (`plan.slot` set).
    pub(super) fn planned_place(
        &self,
        state: &mut State<S>,
        plan: &mut Prepared<S::Params>,
        config: &PoolOptions,
        cached: &mut Option<Found<S>>,
    ) -> Option<Spot> {
        let place = state.budget.place(plan.size, &plan.want)?;
        let settled = state.budget.settled.as_ref()?;
        let held = state.stats.reserved_bytes + state.pending - state.cache.bytes();
        let roomy = |size: u64| {
            config.memory_limit.is_none_or(|l| held.saturating_add(size) <= l)
                && size <= self.storage.max_block_size()
        };
        match place {
            Place::Slot(j, key, id) => {
                let found = match id {
                    Some(id) => state.cache.take_id(&key, id),
                    // A slot without a block yet takes a cached one of its key no slot keeps.
                    None => state.cache.take_unkept(&key, |id| settled.keeps(id)),
                };
                if let Some(found) = found {
                    state.budget.bind(j, found.1.id);
                    *cached = Some(found);
                } else if roomy(key.capacity) {
                    plan.key.capacity = key.capacity;
                    plan.block = key.capacity;
                    plan.slot = Some(j);
                }
                None
            }
            Place::Arena(at) => {
                let len = plan.key.capacity;
                let (size, arena) = (settled.arena_size, settled.arena);
                if at % plan.key.alignment.max(GRANULE) != 0 || at + len > size {
                    return None;
                }
                if let Some(id) = arena.filter(|&id| state.pieces.holds(id)) {
                    return state.pieces.find_at(id, at, len);
                }
                let key = Key { capacity: size, ..plan.key.clone() };
                if let Some(found) = state.cache.take_fit(&key, size) {
                    plan.at = Some(at);
                    *cached = Some(found);
                } else if roomy(size) {
                    plan.at = Some(at);
                    plan.block = size;
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three layers' KV caches, each growing by a granule a step and made while the one it
    /// replaces still lives (a decode loop): at most 4 live at once.
    fn kv_caches() -> Vec<(u64, Key<()>, u64, u64)> {
        let mut lives: Vec<(u64, Key<()>, u64, u64)> = Vec::new();
        let (mut step, mut open) = (0, [None; 3]);
        for t in 0..10u64 {
            for layer in &mut open {
                let capacity = 512 * (t + 1);
                lives.push((capacity, Key { alignment: 1, params: (), capacity }, step, u64::MAX));
                if let Some(i) = layer.replace(lives.len() - 1) {
                    let old: &mut (u64, Key<()>, u64, u64) = &mut lives[i];
                    old.3 = step;
                }
                step += 1;
            }
        }
        lives.iter_mut().filter(|l| l.3 == u64::MAX).for_each(|l| l.3 = step);
        lives
    }

    fn bytes(slots: &Slots<()>) -> u64 {
        slots.iter().map(|(k, _)| k.capacity).sum()
    }

    /// Whether no two allocations of one slot live at once, and each slot holds its own.
    fn valid(lives: &Lives<()>, (slot_of, slots): &(Vec<u64>, Slots<()>)) -> bool {
        lives.iter().zip(slot_of).enumerate().all(|(i, (a, &j))| {
            slots[j as usize].0.capacity >= a.1.capacity
                && lives.iter().zip(slot_of).skip(i + 1).all(|(b, &k)| k != j || b.2 > a.3 || a.2 > b.3)
        })
    }

    #[test]
    fn growing_caches_pass_their_slots_along() {
        let lives = kv_caches();
        let (largest_first, in_order) = (unshared(&lives), in_order(&lives));
        assert!(valid(&lives, &largest_first) && valid(&lives, &in_order));
        let end = lives.iter().map(|l| l.3).max().unwrap();
        let live_at =
            |t: u64| lives.iter().filter(|l| l.2 <= t && t <= l.3).map(|l| l.1.capacity).sum::<u64>();
        let most = (0..=end).map(live_at).max().unwrap();
        assert_eq!(bytes(&in_order.1), most, "in order: the most bytes live at once");
        assert!(bytes(&largest_first.1) > most * 5 / 4, "{} vs {most}", bytes(&largest_first.1));
    }
}
