//! Whether the workload is repeating itself exactly: a training or serving loop's steps, a
//! model's identical layers. Seen from the pool, an *excursion* is the live count rising above
//! some level and coming back to it. Each excursion's events (allocations by size, frees by
//! size) are hashed as they come. The workload repeats at a level from the end of a *period*
//! there that is the same as the period before it, and goes on repeating, period after period,
//! until the live count falls below that level or the two periods that end at an excursion
//! there differ. A period is either
//! - one excursion of at least [`MIN_EVENTS`] events, the same as the one before it at its
//!   level (a step, a layer); or
//! - several consecutive excursions, up to [`MAX_PERIOD`], of at least [`MIN_PERIOD_EVENTS`]
//!   events together (with the short excursions between them), where no single one repeats: a
//!   serving loop whose requests differ from each other, each request an excursion, the loop
//!   repeating only as a whole. The fewest excursions that repeat is the period.
//!
//! Short periods of several excursions (say, the q, k and v projections of one attention
//! layer, one at a time) were mostly coincidences of neighbouring ops that did not go on, and
//! plans made from them held blocks the workload did not come back to: measured on the corpus
//! (tests/data/traces/corpus), one pass each, host policy, periods of up to 8 excursions of any
//! length held 1.43x the lower bound at worst, 2.9x when periods had to be seen three times;
//! one excursion holds 1.07x. [`MIN_PERIOD_EVENTS`] is what keeps such coincidences out.
//!
//! Cost: O(1) per allocation and free (a polynomial hash over the event stream, whose
//! excursions' hashes are differences of its prefixes), and at the end of an excursion of
//! [`MIN_EVENTS`] or more, up to [`MAX_PERIOD`] comparisons; 40 bytes per live allocation, one
//! excursion remembered per level, and the starts of the last `2 * MAX_PERIOD` long excursions
//! (40 bytes each) at each level where the live count has stayed since they began.

/// An excursion must be at least this many events (allocations and frees) to count: 32
/// allocations, a layer's or a step's worth, not two consecutive ops that happen to match.
const MIN_EVENTS: u64 = 64;
/// A period of several excursions must be at least this many events: 512 allocations, a whole
/// request or step of a model, which neighbouring ops that match by chance do not make.
const MIN_PERIOD_EVENTS: u64 = 1024;
/// The most excursions a period may have.
const MAX_PERIOD: usize = 32;
/// The hash's base (odd, so invertible modulo 2^64).
const BASE: u64 = 0x9e37_79b9_7f4a_7c15;

/// Where the workload repeats.
#[derive(Clone, Copy)]
struct Repeating {
    level: usize,
    /// The caller's mark when the last whole period began.
    since: u64,
    /// The allocation count when the period under way began.
    start: u64,
    /// Excursions per period, and how many of the period under way have ended.
    period: usize,
    done: usize,
}

/// Where an excursion began: the hash of every event before it, BASE^events and its inverse,
/// the event count and the caller's mark.
#[derive(Clone, Copy)]
struct Start {
    prefix: u64,
    power: u64,
    inverse: u64,
    events: u64,
    mark: u64,
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
    /// For each level below the live count: where the excursion above it began (the caller's
    /// mark is `allocated`'s `mark`).
    open: Vec<Start>,
    /// For each level: the hash and length (in events) of the last excursion above it that
    /// ended.
    last: Vec<Option<(u64, u64)>>,
    /// For each level up to the live count: where its last long excursions began (at most
    /// `2 * MAX_PERIOD`), since the live count was last below it; so the events from any of
    /// them to the last one's end are consecutive excursions there.
    runs: Vec<std::collections::VecDeque<Start>>,
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
        let (open, last, runs) = (Vec::new(), Vec::new(), Vec::new());
        let (prefix, power, inverse, events, allocs, repeating) = (0, 1, 1, 0, 0, None);
        Repeats { prefix, power, inverse, events, allocs, open, last, runs, repeating, min_events }
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
        self.open.push(Start { mark, ..self.now() });
        self.allocs += 1;
        self.event(size << 1);
    }

    /// The hash of the events from `a` to `b` (a prefix difference), and how many they are.
    fn stretch(a: &Start, b: &Start) -> (u64, u64) {
        let hash = b.prefix.wrapping_sub(a.prefix.wrapping_mul(b.power.wrapping_mul(a.inverse)));
        (hash, b.events - a.events)
    }

    /// Whether the last `p` (> 1) long excursions at `level` (the last one just ended) and the
    /// short ones between them are the same events as the `p` before them, of at least
    /// [`MIN_PERIOD_EVENTS`]. (A period of one is `last`'s comparison, which also reaches across
    /// a fall below the level.)
    fn periodic(&self, level: usize, p: usize) -> bool {
        let runs = &self.runs[level];
        let Some(first) = runs.len().checked_sub(2 * p) else { return false };
        let (a, b) =
            (Self::stretch(&runs[first], &runs[first + p]), Self::stretch(&runs[first + p], &self.now()));
        a == b && b.1 >= MIN_PERIOD_EVENTS
    }

    /// A free of an allocation of `size` bytes. Where it ends a period that repeats the one
    /// before it (the workload repeats, or goes on repeating): the level, and the event count
    /// when the period began.
    pub fn freed(&mut self, size: u64) -> Option<(usize, u64)> {
        self.event((size << 1) | 1);
        let start = self.open.pop()?;
        let level = self.open.len();
        // The live count is at `level` now: the levels above it start afresh.
        self.runs.truncate(level + 1);
        let len = self.events - start.events;
        if len < self.min_events {
            // Too short to count (the hot cycle: one allocation freed): it ends a repetition of
            // one excursion at its level or above, and leaves nothing the next excursion there
            // could repeat. A period of several goes on: it holds the short ones between.
            if self.repeating.is_some_and(|r| r.level > level || (r.level == level && r.period == 1)) {
                self.repeating = None;
            }
            if let Some(last) = self.last.get_mut(level) {
                *last = None;
            }
            return None;
        }
        let hash = Self::stretch(&start, &self.now()).0;
        if self.last.len() <= level {
            self.last.resize(level + 1, None);
        }
        let again = self.last[level].replace((hash, len)) == Some((hash, len));
        if self.runs.len() <= level {
            self.runs.resize_with(level + 1, Default::default);
        }
        let runs = &mut self.runs[level];
        if runs.len() == 2 * MAX_PERIOD {
            runs.pop_front();
        }
        runs.push_back(start);
        if let Some(r) = self.repeating {
            if r.level < level {
                return None;
            }
            let holds =
                r.level == level && if r.period == 1 { again } else { self.periodic(level, r.period) };
            if !holds {
                self.repeating = None;
            } else if r.done + 1 < r.period {
                self.repeating = Some(Repeating { done: r.done + 1, ..r });
                return None;
            } else {
                return Some(self.begin(level, r.period));
            }
        }
        let period = if again { 1 } else { (2..=MAX_PERIOD).find(|&p| self.periodic(level, p))? };
        Some(self.begin(level, period))
    }

    /// The events so far, as where an excursion would begin.
    fn now(&self) -> Start {
        let (prefix, power, inverse, events) = (self.prefix, self.power, self.inverse, self.events);
        Start { prefix, power, inverse, events, mark: 0 }
    }

    /// A period of `period` excursions at `level` just ended, the same as the one before it:
    /// the next one begins. Returns the level and the event count when the one that ended began.
    fn begin(&mut self, level: usize, period: usize) -> (usize, u64) {
        let runs = &self.runs[level];
        let from = runs[runs.len() - period];
        let (since, start) = (from.mark, self.allocs);
        self.repeating = Some(Repeating { level, since, start, period, done: 0 });
        (level, from.events)
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

    /// A request of a serving loop: `n` allocations, of sizes that `seed` makes its own, freed
    /// in reverse (one excursion of `2n` events).
    fn request(r: &mut Repeats, seed: u64, n: u64) -> Option<(usize, u64)> {
        (0..n).for_each(|i| r.allocated((seed * 1000 + i) * 512, i));
        let mut seen = None;
        for i in (0..n).rev() {
            seen = r.freed((seed * 1000 + i) * 512);
        }
        seen
    }

    #[test]
    fn a_loop_of_requests_that_differ_repeats_as_a_whole() {
        let mut r = Repeats::new();
        // Five requests of 120 allocations (1,200 events), none like another: no request
        // repeats the one before it, the loop does from its second pass's last request on.
        for pass in 0..2 {
            for seed in 1..=5 {
                let seen = request(&mut r, seed, 120);
                assert_eq!(seen.is_some(), pass == 1 && seed == 5, "pass {pass}, request {seed}");
                assert_eq!(r.repeating(), pass == 1 && seed == 5);
            }
        }
        assert_eq!(r.position(), Some((0, 0)), "the next period begins");
        assert_eq!(r.since(), Some(0), "the mark where the period that ended began");
        // It goes on request after request, and says so at each period's end only, with the
        // event count where that period began.
        for seed in 1..=5 {
            let seen = request(&mut r, seed, 120);
            assert!(r.repeating(), "request {seed}");
            assert_eq!(seen, (seed == 5).then_some((0, 2 * 600 * 2)), "request {seed}");
        }
        assert_eq!(r.position(), Some((0, 0)));
        // A request that differs ends it.
        request(&mut r, 9, 120);
        assert!(!r.repeating(), "another request");
    }

    #[test]
    fn a_short_loop_of_excursions_is_a_period_only_once_it_is_long() {
        // Three excursions of 100 events each that differ, again and again: 300 events a loop,
        // under MIN_PERIOD_EVENTS, so not a period as such (neighbouring ops can match by
        // chance). Four loops, 1,200 events, are: seen twice (eight loops), they repeat.
        let mut r = Repeats::new();
        for pass in 0..8 {
            for seed in 1..=3 {
                let seen = request(&mut r, seed, 50);
                let last = pass == 7 && seed == 3;
                assert_eq!(seen, last.then_some((0, 1200)), "loop {pass}, excursion {seed}");
            }
        }
        assert!(r.repeating());
    }

    #[test]
    fn a_period_does_not_reach_across_a_fall_below_its_level() {
        // Requests above a kept allocation, which is freed and made again between passes: the
        // live count falls below the requests' level, so one pass is never compared with the
        // next, however alike.
        // (The kept allocation's size changes each pass, so that no pass repeats the one before.)
        let mut r = Repeats::new();
        for pass in 0..4 {
            r.allocated(4096 + pass * 512, 0);
            for seed in 1..=3 {
                assert_eq!(request(&mut r, seed, 200), None, "pass {pass}, request {seed}");
            }
            r.freed(4096 + pass * 512);
        }
        assert!(!r.repeating());
    }
}
