//! Whether the workload is repeating itself exactly: a training or serving loop's steps, a
//! model's identical layers, a loop of temporaries one at a time. Seen from the pool, an
//! *excursion* is the live count rising above some level and coming back to it. Each
//! excursion's events (allocations by size, frees by size) are hashed as they come; where the
//! last `p` excursions at a level (a *period*, `p` up to [`MAX_PERIOD`], at least [`MIN_EVENTS`]
//! events in all) are the same as the `p` before them, the workload repeats there, period after
//! period, until the live count falls below that level or an excursion there differs from the
//! one a period before it.
//!
//! Cost: O([`MAX_PERIOD`]) per free and O(1) per allocation (a polynomial hash over the event
//! stream, whose excursions' hashes are differences of its prefixes), 40 bytes per live
//! allocation and up to `2 * MAX_PERIOD` excursions remembered per level.

use std::collections::VecDeque;

/// A period must be at least this many events (allocations and frees) to count: 32
/// allocations, a layer's or a step's worth, not two consecutive ops that happen to match.
const MIN_EVENTS: u64 = 64;
/// The most excursions one period may hold. One: a period of several excursions (say, the
/// q, k and v projections of one attention layer, one at a time) is mostly a coincidence of
/// neighbouring ops that does not go on, and a plan made from it holds blocks the workload does
/// not come back to. Measured on the corpus (tests/data/traces/corpus), one pass each, host
/// policy: up to 8 excursions held 1.43x the lower bound at worst, 2.9x when periods had to
/// be seen three times; one holds 1.07x.
const MAX_PERIOD: usize = 1;
/// The hash's base (odd, so invertible modulo 2^64).
const BASE: u64 = 0x9e37_79b9_7f4a_7c15;

/// An excursion that ended: its hash, its length in events, and the event count and the
/// caller's mark when it began.
#[derive(Clone, Copy)]
struct Ended {
    hash: u64,
    len: u64,
    events: u64,
    mark: u64,
}

/// Where the workload repeats.
#[derive(Clone, Copy)]
struct Repeating {
    level: usize,
    period: usize,
    /// The caller's mark when the last whole period began.
    since: u64,
    /// Excursions ended in the period under way, and the allocation count when it began.
    phase: usize,
    start: u64,
}

/// The repetition detector of one pool; see the module docs.
pub(crate) struct Repeats {
    /// The hash of every event so far: `prefix = prefix * BASE + event`.
    prefix: u64,
    /// BASE^events and its inverse.
    power: u64,
    inverse: u64,
    /// Events so far, and allocations so far.
    events: u64,
    allocs: u64,
    /// For each level below the live count: the prefix, inverse power, event count and the
    /// caller's mark (`allocated`'s `mark`) when the live count rose above it.
    open: Vec<(u64, u64, u64, u64)>,
    /// For each level: the last excursions above it that ended, newest last.
    ended: Vec<VecDeque<Ended>>,
    repeating: Option<Repeating>,
    /// The most excursions a period may hold, and the fewest events ([`MAX_PERIOD`],
    /// [`MIN_EVENTS`]; others in tests).
    max_period: usize,
    min_events: u64,
}

/// BASE's inverse modulo 2^64 (Newton's iteration).
const fn inverse_of(b: u64) -> u64 {
    let mut x = b;
    let mut i = 0;
    while i < 6 {
        x = x.wrapping_mul(2u64.wrapping_sub(b.wrapping_mul(x)));
        i += 1;
    }
    x
}

const BASE_INVERSE: u64 = inverse_of(BASE);

impl Repeats {
    pub fn new() -> Self {
        Self::with_limits(MAX_PERIOD, MIN_EVENTS)
    }

    /// A detector whose periods hold up to `max_period` excursions and at least `min_events`.
    fn with_limits(max_period: usize, min_events: u64) -> Self {
        let (open, ended) = (Vec::new(), Vec::new());
        let (prefix, power, inverse, events, allocs, repeating) = (0, 1, 1, 0, 0, None);
        Repeats { prefix, power, inverse, events, allocs, open, ended, repeating, max_period, min_events }
    }

    /// Whether the workload repeats now.
    pub fn repeating(&self) -> bool {
        self.repeating.is_some()
    }

    /// Where the workload repeats: the mark given when its last whole period began.
    pub fn since(&self) -> Option<u64> {
        self.repeating.map(|r| r.since)
    }

    /// Where the workload repeats: its level, and the next allocation's place among the
    /// allocations of the period under way there (0: it starts one).
    pub fn position(&self) -> Option<(usize, u64)> {
        self.repeating.map(|r| (r.level, self.allocs - r.start))
    }

    fn event(&mut self, value: u64) {
        // Mixed so that nearby capacities do not hash alike.
        let v = value.wrapping_mul(0xff51_afd7_ed55_8ccd) ^ (value >> 29);
        self.prefix = self.prefix.wrapping_mul(BASE).wrapping_add(v);
        self.power = self.power.wrapping_mul(BASE);
        self.inverse = self.inverse.wrapping_mul(BASE_INVERSE);
        self.events += 1;
    }

    /// An allocation of `size` bytes; `mark` is the caller's (say, a clock) at this point.
    pub fn allocated(&mut self, size: u64, mark: u64) {
        self.open.push((self.prefix, self.inverse, self.events, mark));
        self.allocs += 1;
        self.event(size << 1);
    }

    /// A free of an allocation of `size` bytes. Where it ends a period that repeats the one
    /// before it (the workload repeats, or goes on repeating): the level, the period (in
    /// excursions) and the event count when the period began.
    pub fn freed(&mut self, size: u64) -> Option<(usize, usize, u64)> {
        self.event((size << 1) | 1);
        let (prefix, inverse, events, mark) = self.open.pop()?;
        let level = self.open.len();
        // The hash of the events since: prefix_now - prefix_then * BASE^(events between).
        let hash = self.prefix.wrapping_sub(prefix.wrapping_mul(self.power.wrapping_mul(inverse)));
        if self.ended.len() <= level {
            self.ended.resize_with(level + 1, VecDeque::new);
        }
        let ended = &mut self.ended[level];
        if ended.len() == 2 * self.max_period {
            ended.pop_front();
        }
        ended.push_back(Ended { hash, len: self.events - events, events, mark });
        let ended = &self.ended[level];
        // Whether the newest excursion is the one `p` before it.
        let again = |p: usize| {
            let n = ended.len();
            n > p && (ended[n - 1].hash, ended[n - 1].len) == (ended[n - 1 - p].hash, ended[n - 1 - p].len)
        };
        if let Some(r) = self.repeating.as_mut() {
            if r.level > level || (r.level == level && !again(r.period)) {
                self.repeating = None;
            } else if r.level == level {
                r.phase += 1;
                if r.phase < r.period {
                    return None;
                }
                let first = ended[ended.len() - r.period];
                (r.phase, r.start, r.since) = (0, self.allocs, first.mark);
                return Some((level, r.period, first.events));
            } else {
                return None;
            }
        }
        // A new repetition: the shortest period whose last two are the same.
        let n = ended.len();
        let period = (1..=self.max_period.min(n / 2)).find(|&p| {
            (1..=p).all(|i| {
                let (a, b) = (ended[n - i], ended[n - i - p]);
                (a.hash, a.len) == (b.hash, b.len)
            }) && ended.range(n - p..).map(|e| e.len).sum::<u64>() >= self.min_events
        })?;
        let first = ended[n - period];
        self.repeating = Some(Repeating { level, period, since: first.mark, phase: 0, start: self.allocs });
        Some((level, period, first.events))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Allocates `sizes` in order and frees them in reverse.
    fn step(r: &mut Repeats, sizes: &[u64]) {
        sizes.iter().for_each(|&s| r.allocated(s, 0));
        sizes.iter().rev().for_each(|&s| {
            r.freed(s);
        });
    }

    #[test]
    fn the_inverse_is_one() {
        assert_eq!(BASE.wrapping_mul(BASE_INVERSE), 1);
    }

    #[test]
    fn a_step_done_twice_repeats_until_one_differs() {
        let mut r = Repeats::new();
        let a: Vec<u64> = (1..=40).map(|i| i * 512).collect();
        let mut b = a.clone();
        b[17] += 512;
        step(&mut r, &a);
        assert!(!r.repeating(), "once is no repetition");
        step(&mut r, &a);
        assert!(r.repeating(), "twice the same");
        step(&mut r, &b);
        assert!(!r.repeating(), "one size differs");
        step(&mut r, &b);
        assert!(r.repeating());
    }

    #[test]
    fn temporaries_one_at_a_time_repeat_with_a_period() {
        let sizes = [1 << 20, 768 << 10, 512 << 10, 384 << 10, 256 << 10];
        let mut r = Repeats::new();
        for _ in 0..20 {
            for &s in &sizes {
                r.allocated(s, 0);
                assert_eq!(r.freed(s), None, "periods of one excursion of two events only");
            }
        }
        let mut r = Repeats::with_limits(8, 8);
        let mut found = Vec::new();
        for _ in 0..8 {
            for &s in &sizes {
                r.allocated(s, 0);
                found.extend(r.freed(s));
            }
        }
        assert_eq!(found.first().map(|f| (f.0, f.1)), Some((0, 5)), "{found:?}");
        assert_eq!(r.position(), Some((0, 0)), "a period just ended");
        r.allocated(1 << 20, 0);
        assert_eq!(r.position(), Some((0, 1)));
        r.freed(1 << 20);
        r.allocated(1000, 0);
        r.freed(1000);
        assert!(!r.repeating(), "another size ends it");
    }

    #[test]
    fn leaving_the_level_ends_it() {
        let mut r = Repeats::new();
        r.allocated(4096, 0); // weights, kept
        let a: Vec<u64> = (1..=40).map(|i| i * 256).collect();
        step(&mut r, &a);
        step(&mut r, &a);
        assert!(r.repeating(), "steps above the weights");
        r.freed(4096);
        assert!(!r.repeating(), "below the level it repeated at");
    }
}
