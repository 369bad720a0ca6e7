//! Whether the workload is repeating itself exactly: a training or serving loop's steps, a
//! model's identical layers. Seen from the pool, an *excursion* is the live count rising above
//! some level and coming back to it. Each excursion's events (allocations by size, frees by
//! size) are hashed as they come; where an excursion of at least [`MIN_EVENTS`] events is the
//! same as the one before it at its level, the workload repeats there, excursion after
//! excursion, until the live count falls below that level or an excursion there differs from
//! the one before it.
//!
//! One excursion is one period. Periods of several excursions (say, the q, k and v projections
//! of one attention layer, one at a time) were mostly coincidences of neighbouring ops that did
//! not go on, and plans made from them held blocks the workload did not come back to: measured
//! on the corpus (tests/data/traces/corpus), one pass each, host policy, periods of up to 8
//! excursions held 1.43x the lower bound at worst, 2.9x when periods had to be seen three
//! times; one excursion holds 1.07x.
//!
//! Cost: O(1) per allocation and free (a polynomial hash over the event stream, whose
//! excursions' hashes are differences of its prefixes), 32 bytes per live allocation and one
//! excursion remembered per level.

/// An excursion must be at least this many events (allocations and frees) to count: 32
/// allocations, a layer's or a step's worth, not two consecutive ops that happen to match.
const MIN_EVENTS: u64 = 64;
/// The hash's base (odd, so invertible modulo 2^64).
const BASE: u64 = 0x9e37_79b9_7f4a_7c15;

/// Where the workload repeats.
#[derive(Clone, Copy)]
struct Repeating {
    level: usize,
    /// The caller's mark when the last whole excursion began.
    since: u64,
    /// The allocation count when the excursion under way began.
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
    /// For each level: the hash and length (in events) of the last excursion above it that
    /// ended.
    last: Vec<Option<(u64, u64)>>,
    repeating: Option<Repeating>,
    /// The fewest events an excursion must have ([`MIN_EVENTS`]; others in tests).
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
        Self::with_min_events(MIN_EVENTS)
    }

    /// A detector whose excursions count from `min_events` events.
    fn with_min_events(min_events: u64) -> Self {
        let (open, last) = (Vec::new(), Vec::new());
        let (prefix, power, inverse, events, allocs, repeating) = (0, 1, 1, 0, 0, None);
        Repeats { prefix, power, inverse, events, allocs, open, last, repeating, min_events }
    }

    /// Whether the workload repeats now.
    pub fn repeating(&self) -> bool {
        self.repeating.is_some()
    }

    /// Where the workload repeats: the mark given when its last whole excursion began.
    pub fn since(&self) -> Option<u64> {
        self.repeating.map(|r| r.since)
    }

    /// Where the workload repeats: its level, and the next allocation's place among the
    /// allocations of the excursion under way there (0: it starts one).
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

    /// A free of an allocation of `size` bytes. Where it ends an excursion that repeats the one
    /// before it (the workload repeats, or goes on repeating): the level, and the event count
    /// when the excursion began.
    pub fn freed(&mut self, size: u64) -> Option<(usize, u64)> {
        self.event((size << 1) | 1);
        let (prefix, inverse, events, mark) = self.open.pop()?;
        let level = self.open.len();
        let len = self.events - events;
        if len < self.min_events {
            // Too short to count (the hot cycle: one allocation freed): it ends a repetition at
            // its level or above, and leaves nothing the next excursion there could repeat.
            if self.repeating.is_some_and(|r| r.level >= level) {
                self.repeating = None;
            }
            if let Some(last) = self.last.get_mut(level) {
                *last = None;
            }
            return None;
        }
        // The hash of the events since: prefix_now - prefix_then * BASE^(events between).
        let hash = self.prefix.wrapping_sub(prefix.wrapping_mul(self.power.wrapping_mul(inverse)));
        if self.last.len() <= level {
            self.last.resize(level + 1, None);
        }
        let again = self.last[level].replace((hash, len)) == Some((hash, len));
        if let Some(r) = self.repeating.as_mut() {
            if r.level > level || (r.level == level && !again) {
                self.repeating = None;
            } else if r.level == level {
                (r.start, r.since) = (self.allocs, mark);
                return Some((level, events));
            } else {
                return None;
            }
        }
        if !again {
            return None;
        }
        self.repeating = Some(Repeating { level, since: mark, start: self.allocs });
        Some((level, events))
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
    fn short_excursions_do_not_count() {
        let mut r = Repeats::new();
        for _ in 0..20 {
            r.allocated(1 << 20, 0);
            assert_eq!(r.freed(1 << 20), None, "a temporary at a time: excursions of two events");
        }
        let mut r = Repeats::with_min_events(2);
        r.allocated(1 << 20, 7);
        assert_eq!(r.freed(1 << 20), None, "once is no repetition");
        r.allocated(1 << 20, 9);
        assert_eq!(r.freed(1 << 20), Some((0, 2)), "twice: the second excursion began at event 2");
        assert_eq!(r.since(), Some(9));
        assert_eq!(r.position(), Some((0, 0)), "an excursion just ended");
        r.allocated(1 << 20, 0);
        assert_eq!(r.position(), Some((0, 1)));
        assert_eq!(r.freed(1 << 20), Some((0, 4)), "it goes on");
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
