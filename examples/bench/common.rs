//! What the benchmark's parts share: methods run interleaved round by round, medians, tables.
#![allow(dead_code)]

use std::cell::Cell;
use std::time::{Duration, Instant};

pub(crate) const KIB: usize = 1 << 10;
pub(crate) const MIB: usize = 1 << 20;

/// One way of doing the operation under test.
pub(crate) struct Method<'a> {
    /// Its name in the table.
    pub name: &'static str,
    /// devalloc's own (the others are peers, or the memcpy ceiling).
    pub ours: bool,
    /// A ceiling, not a peer (memcpy).
    pub ceiling: bool,
    /// Untimed, before each timed call (e.g. clear the destination).
    pub prepare: Box<dyn FnMut() + 'a>,
    /// The timed call.
    pub run: Box<dyn FnMut() + 'a>,
    /// Untimed, after each call: whether the result is right.
    pub verify: Box<dyn FnMut() -> bool + 'a>,
}

impl<'a> Method<'a> {
    pub fn new(name: &'static str, run: impl FnMut() + 'a) -> Self {
        Method {
            name,
            ours: false,
            ceiling: false,
            prepare: Box::new(|| {}),
            run: Box::new(run),
            verify: Box::new(|| true),
        }
    }
    pub fn ours(mut self) -> Self {
        self.ours = true;
        self
    }
    pub fn ceiling(mut self) -> Self {
        self.ceiling = true;
        self
    }
    pub fn prepare(mut self, f: impl FnMut() + 'a) -> Self {
        self.prepare = Box::new(f);
        self
    }
    pub fn verify(mut self, f: impl FnMut() -> bool + 'a) -> Self {
        self.verify = Box::new(f);
        self
    }
}

thread_local! {
    /// Time spent in [`untimed`] sections so far (this thread's).
    static UNTIMED: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

/// Runs `f` inside a timed call without counting its time: for checking a result that only
/// exists in the middle of a call (a write into a buffer the call then frees).
pub(crate) fn untimed<T>(f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    UNTIMED.with(|u| u.set(u.get() + t.elapsed()));
    r
}

/// Which of two data sets a method's last call sent: each call sends the other one, so an
/// upload that did nothing leaves the previous data and fails its check.
#[derive(Default)]
pub(crate) struct Alternate(Cell<usize>);

impl Alternate {
    /// Flips to the other data set and returns its index (0 or 1).
    pub fn next(&self) -> usize {
        self.0.set(self.0.get() ^ 1);
        self.0.get()
    }
    /// The index the last call sent.
    pub fn last(&self) -> usize {
        self.0.get()
    }
}

/// Medians (and the first, cold, call) of each method.
pub(crate) struct Timings {
    pub names: Vec<&'static str>,
    pub ours: Vec<bool>,
    pub ceiling: Vec<bool>,
    pub median: Vec<Duration>,
    pub cold: Vec<Duration>,
}

impl Timings {
    /// devalloc's median over the best peer's (as speed: > 1 is faster), and the peer's name.
    pub fn ratio(&self) -> Option<(f64, &'static str)> {
        let ours = (0..self.names.len()).find(|&i| self.ours[i])?;
        let best = (0..self.names.len())
            .filter(|&i| !self.ours[i] && !self.ceiling[i])
            .min_by_key(|&i| self.median[i])?;
        Some((self.median[best].as_secs_f64() / self.median[ours].as_secs_f64(), self.names[best]))
    }

    /// The median of the method named `name`.
    pub fn of(&self, name: &str) -> Duration {
        let i = self.names.iter().position(|n| *n == name).unwrap_or_else(|| panic!("no method {name}"));
        self.median[i]
    }
}

/// One timed call of `m`, less its [`untimed`] sections.
fn timed(m: &mut Method<'_>) -> Duration {
    (m.prepare)();
    let before = UNTIMED.with(Cell::get);
    let t = Instant::now();
    (m.run)();
    let took = t.elapsed();
    took.saturating_sub(UNTIMED.with(Cell::get) - before)
}

/// Runs every method `reps` times, interleaved round by round (each round in a rotated order,
/// so no method always runs right after another), after one cold call each. Every call is
/// verified (untimed), right after it. Panics when a result is wrong: a figure for a wrong
/// result is no figure. A check should allocate nothing (see `peers::Readback`): on a
/// software GPU, memory a check allocates and frees changes what the next timed call meets.
pub(crate) fn interleave(methods: &mut [Method<'_>], reps: usize) -> Timings {
    let n = methods.len();
    let mut times = vec![Vec::with_capacity(reps); n];
    let mut cold = Vec::with_capacity(n);
    for m in methods.iter_mut() {
        cold.push(timed(m));
        assert!((m.verify)(), "{}: wrong result on the first call", m.name);
    }
    for round in 0..reps {
        for k in 0..n {
            let i = (k + round) % n;
            let m = &mut methods[i];
            times[i].push(timed(m));
            assert!((m.verify)(), "{}: wrong result in round {round}", m.name);
        }
    }
    let median = times
        .into_iter()
        .map(|mut v| {
            v.sort();
            v[v.len() / 2]
        })
        .collect();
    Timings {
        names: methods.iter().map(|m| m.name).collect(),
        ours: methods.iter().map(|m| m.ours).collect(),
        ceiling: methods.iter().map(|m| m.ceiling).collect(),
        median,
        cold,
    }
}

/// Repetitions for `bytes` per call: enough for a stable median, within a byte budget.
pub(crate) fn reps(bytes: usize, quick: bool) -> usize {
    let budget = if quick { 32 * MIB } else { 512 * MIB };
    (budget / bytes.max(1)).clamp(if quick { 5 } else { 9 }, if quick { 60 } else { 300 })
}

pub(crate) fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

pub(crate) fn human(b: usize) -> String {
    if b >= MIB {
        format!("{}M", b / MIB)
    } else if b >= KIB {
        format!("{}K", b / KIB)
    } else {
        format!("{b}B")
    }
}

/// One table row: size, GB/s of each method, and devalloc / best peer.
pub(crate) fn row(size: usize, t: &Timings) -> String {
    let mut out = format!("{:>6}", human(size));
    for d in &t.median {
        out += &format!(" {:>14.2}", gbps(size, *d));
    }
    if let Some((r, peer)) = t.ratio() {
        out += &format!("   {r:>5.2}x ({peer})");
    }
    out
}

/// The header of a table of `t`'s methods.
pub(crate) fn header(t: &Timings) -> String {
    let mut out = format!("{:>6}", "size");
    for n in &t.names {
        out += &format!(" {n:>14}");
    }
    out + "   devalloc/best peer"
}

/// The cold (first call) line of a table.
pub(crate) fn cold_row(size: usize, t: &Timings) -> String {
    let mut out = format!("{:>6}", "cold");
    for d in &t.cold {
        out += &format!(" {:>14.2}", gbps(size, *d));
    }
    out
}
