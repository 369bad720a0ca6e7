//! How much the cache may hold without a memory limit, and how a repeating workload settles.
//!
//! - **The budget** is the most bytes the workload has asked for at once (its requests' sizes,
//!   the request being made included), plus [`PoolOptions::cache_headroom`] of that (none by
//!   default), or what the pool held at its peak so far, whichever is more. A fresh block that
//!   would take the pool past it first gives back cached blocks, the ones freed longest ago
//!   first. So a workload that moves on (a growing KV cache, shapes that vary) gives back what
//!   it stopped using before the device or a limit makes it, and the pool never holds more than
//!   it held at the workload's peak, however the blocks fit.
//! - **A repeating workload** (see `repeats.rs`) settles on a plan made from one repetition (see
//!   `settle.rs`): once it repeats, blocks freed since its last repetition began are kept, and
//!   the plan says which blocks the next repetitions use.
//!
//! [`PoolOptions::cache_headroom`]: super::PoolOptions::cache_headroom

use super::cache::Key;
use super::repeats::Repeats;
use super::settle::{EventLog, Place, Settled};

/// The cache's budget of one pool, and what it knows of the workload's repetitions.
pub(crate) struct Budget<P> {
    repeats: Repeats,
    log: EventLog<P>,
    /// The plan of the repetition under way, where the workload repeats and one was made.
    pub settled: Option<Settled<P>>,
    /// A repetition seen but not planned yet: it is planned at the next allocation, so that the
    /// frees that end a step, each confirming the repetition at a lower level, plan it once.
    pending: Option<Pending>,
    /// Plans made so far.
    plans: u64,
}

/// A repetition to plan: the number of its first event, its level, and whether blocks split.
struct Pending {
    from: u64,
    level: usize,
    arena: bool,
}

impl<P: Ord + Clone> Budget<P> {
    pub fn new() -> Self {
        Budget { repeats: Repeats::new(), log: EventLog::new(), settled: None, pending: None, plans: 0 }
    }

    /// The most the pool may hold: the most bytes asked for at once (`mark`, the request being
    /// made included), plus `fraction` of it, or what it held at its peak if that is more.
    pub fn limit(&self, mark: u64, peak_reserved: u64, fraction: f64) -> u64 {
        let headroom = (mark as f64 * fraction.clamp(0.0, 1.0)) as u64;
        mark.saturating_add(headroom).max(peak_reserved)
    }

    /// Whether the workload repeats itself now (see `repeats.rs`).
    pub fn repeating(&self) -> bool {
        self.repeats.repeating()
    }

    /// Cached blocks from this cache sequence number on are kept (the workload repeats, and
    /// freed them since its last repetition began).
    pub fn keep_from(&self) -> Option<u64> {
        self.repeats.since()
    }

    /// Where the plan puts the next allocation, if there is a plan and it asks for `size` bytes
    /// of `key`'s kind and capacity, as planned.
    pub fn place(&mut self, size: u64, key: &Key<P>) -> Option<Place<P>> {
        if let Some(p) = self.pending.take() {
            self.settled = self.log.plan(p.from, p.level, p.arena);
            self.plans += 1;
            log::debug!("devalloc: repeating at level {}: planned: {}", p.level, self.settled.is_some());
        }
        let (level, k) = self.repeats.position()?;
        self.settled.as_ref().filter(|s| s.level == level)?.place(k, size, key)
    }

    /// Block `id`, of `size` bytes, is the plan's arena.
    pub fn arena(&mut self, size: u64, id: u64) {
        if let Some(s) = self.settled.as_mut().filter(|s| s.arena_size == size) {
            s.arena = Some(id);
        }
    }

    /// Block `id` is the plan's slot `j` now.
    pub fn bind(&mut self, j: usize, id: u64) {
        if let Some(s) = self.settled.as_mut() {
            s.bind(j, id);
        }
    }

    /// An allocation at `addr` of `size` bytes (`key`: its kind, with the capacity its size
    /// asks for), when the cache's next sequence number is `seq`.
    pub fn allocated(&mut self, addr: u64, size: u64, key: Key<P>, seq: u64) {
        self.repeats.allocated(size, seq);
        self.log.allocated(addr, size, key);
    }

    /// A free of the allocation at `addr`, of `size` bytes. Where blocks split (`arena`), a
    /// plan lays the repetition out in one block.
    pub fn freed(&mut self, addr: u64, size: u64, arena: bool) {
        self.log.freed(addr);
        let confirmed = self.repeats.freed(size);
        let planned = |l| {
            let settled = self.settled.as_ref().map(|s| s.level);
            self.pending.as_ref().map(|p| p.level).or(settled) == Some(l)
        };
        match confirmed {
            Some((level, _)) if planned(level) => {}
            Some((level, from)) => {
                self.settled = None;
                self.pending = Some(Pending { from, level, arena });
            }
            None if !self.repeats.repeating() => (self.settled, self.pending) = (None, None),
            None => {
                let at = self.repeats.position().map(|(l, _)| l);
                if self.settled.as_ref().is_some_and(|s| Some(s.level) != at) {
                    self.settled = None;
                }
                if self.pending.as_ref().is_some_and(|p| Some(p.level) != at) {
                    self.pending = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One step of a nested workload: 40 allocations, each live until the step ends, freed
    /// last first, so that the step's end is a cascade of frees, each ending an excursion at
    /// one level lower. Returns how many allocations the plan placed.
    fn step(b: &mut Budget<()>, seq: &mut u64) -> usize {
        let key = |i: u64| Key { alignment: 1, params: (), capacity: 512 * (i + 1) };
        let mut placed = 0;
        for i in 0..40 {
            placed += usize::from(b.place(512 * (i + 1), &key(i)).is_some());
            b.allocated(4096 * (i + 1), 512 * (i + 1), key(i), *seq);
            *seq += 1;
        }
        for i in (0..40).rev() {
            b.freed(4096 * (i + 1), 512 * (i + 1), true);
        }
        placed
    }

    #[test]
    fn a_step_that_ends_in_a_cascade_of_frees_is_planned_once() {
        let (mut b, mut seq) = (Budget::new(), 0);
        assert_eq!(step(&mut b, &mut seq), 0, "nothing repeats yet");
        assert_eq!(step(&mut b, &mut seq), 0, "it repeats only once this step ends");
        // Its end confirmed the repetition at each of 9 levels (40 allocations down to 32).
        for n in 3..6 {
            assert_eq!(step(&mut b, &mut seq), 40, "step {n}: the plan places every allocation");
            assert_eq!(b.plans, 1, "step {n}: one plan, made at the step's first allocation");
        }
    }
}
