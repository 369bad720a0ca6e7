//! Strategies: the `Fast` portfolio and the anytime `Search` loop around the exact search.

use super::dive::{dive, DiveLimits};
use super::frames::{Limits, Outcome};
use super::heuristics::{area_order, best_fit, size_order};
use super::preorder::{CLASSIC_PREORDERS, PREORDERS};
use super::problem::Problem;
use super::search::Engine;
use super::validate::{lower_bound, validate};
use super::{executorch_greedy, Error, MemoryPlan, TensorLife};
use crate::clock::now_us;

/// Largest problem (overlap-list plus section entries) the search and the dives take on.
pub(crate) const MAX_PROBLEM_ENTRIES: usize = 1 << 23;
/// Largest number of candidate entries the live search frames may hold.
pub(crate) const MAX_FRAME_ENTRIES: usize = 1 << 22;
/// Work budget of the dives and search phase of `Fast`, in the units of `State::work`
/// (elementary steps; some 50 to 500 million a second on one x86 core of the 2020s): this much,
/// plus [`FAST_WORK_PER_TENSOR`] per tensor. A work budget rather than a time limit keeps
/// `Fast` deterministic: the same input gives the same plan on any machine, in any build.
pub(crate) const FAST_WORK: u64 = 4_000_000;
/// See [`FAST_WORK`].
pub(crate) const FAST_WORK_PER_TENSOR: u64 = 6_000;

/// The best plan found so far.
pub(crate) struct Best {
    /// Offsets in input order (empty until a first plan is offered).
    pub offsets: Vec<u64>,
    /// Its size.
    pub size: u64,
    /// What produced it.
    pub method: &'static str,
}

impl Best {
    /// Keeps `offsets` if they make a smaller plan (or the first one).
    fn offer(&mut self, tensors: &[TensorLife], offsets: Vec<u64>, method: &'static str) {
        if offsets.len() != tensors.len() {
            return;
        }
        let size = tensors.iter().zip(&offsets).map(|(t, &o)| o.saturating_add(t.size)).max().unwrap_or(0);
        if size < self.size || self.offsets.len() != tensors.len() {
            (self.offsets, self.size, self.method) = (offsets, size, method);
        }
    }
}

/// Luby's restart sequence 1, 1, 2, 1, 1, 2, 4, 1, 1, 2, ... (`i` counts from 1).
fn luby(mut i: u64) -> u64 {
    loop {
        let mut k = 1u32;
        while k < 63 && (1u64 << k) - 1 < i {
            k += 1;
        }
        if (1u64 << k) - 1 == i || k >= 63 {
            return 1u64 << (k - 1);
        }
        i -= (1u64 << (k - 1)) - 1;
    }
}

/// The van der Corput sequence in base 2 (0, 1/2, 1/4, 3/4, 1/8, ...), as a fraction of 2^32.
fn corput(j: u64) -> u64 {
    u64::from((j as u32).reverse_bits())
}

/// A capacity the anytime loop keeps working on with doubling node limits.
struct Target {
    cap: u64,
    limit: u64,
    preorder: usize,
}

/// How [`improve`] ended.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The best size is proven optimal.
    Proven,
    /// Time or work ran out.
    OutOfBudget,
    /// The problem is too big for the exact search's memory limit.
    TooBig,
}

/// The anytime loop. Half of the work goes to the lowest capacity not yet proven impossible,
/// searched MiniMalloc-style (round-robin over the preorders, node limit doubling each round),
/// which finds plans at the lower bound or proves it out of reach. The other half goes to a
/// portfolio of short restarts that spreads over the capacities between that bound and the
/// best size found (van der Corput points of the gap) and over the preorders, with ties in the
/// preorder broken at random (seeded by the run number, so still deterministic) and node limits
/// following Luby's sequence: the search at a single capacity is heavy-tailed (a run either
/// succeeds within a few hundred nodes or wanders for millions), so many short diverse runs
/// find good plans far sooner than one long one. A plan found anywhere becomes the new best; a
/// capacity proven impossible raises the bound. Stops at `deadline_us` or after `work_budget`
/// units of work (see `State::work`).
pub(crate) fn improve(
    tensors: &[TensorLife],
    p: &Problem,
    best: &mut Best,
    lb: u64,
    deadline_us: u64,
    work_budget: u64,
) -> Ended {
    let n = (p.len() as u64).max(1);
    let mut engine = Engine::new(p, lb);
    let mut lo = lb; // smallest size not yet proven impossible
    let mut low = Target { cap: lb, limit: 2 * n, preorder: 0 };
    let (mut low_spent, mut spread_spent, mut runs) = (0u64, 0u64, 0u64);
    loop {
        if lo >= best.size {
            return Ended::Proven;
        }
        let timed_out = deadline_us != u64::MAX && now_us() >= deadline_us;
        if low_spent.saturating_add(spread_spent) >= work_budget || timed_out {
            return Ended::OutOfBudget;
        }
        if low.cap < lo {
            low = Target { cap: lo, limit: 2 * n, preorder: 0 };
        }
        let left = work_budget - low_spent.saturating_add(spread_spent);
        let on_low = low_spent <= spread_spent;
        let (cap, preorder, limit) = if on_low {
            (low.cap, low.preorder, low.limit)
        } else {
            runs += 1;
            let gap = u128::from(best.size - lo);
            let cap = lo + ((gap * u128::from(corput(runs))) >> 32) as u64;
            (cap, (runs % CLASSIC_PREORDERS as u64) as usize, n.saturating_mul(luby(runs)))
        };
        engine.set_cap(cap);
        let before = engine.work();
        let work = before.saturating_add(left);
        let seed = if on_low { 0 } else { runs };
        let limits = Limits { nodes: limit, work, deadline_us, entries: MAX_FRAME_ENTRIES, seed };
        let out = engine.run(PREORDERS[preorder], limits);
        let used = engine.work() - before;
        if on_low {
            low_spent = low_spent.saturating_add(used);
            low.preorder += 1;
            if low.preorder == CLASSIC_PREORDERS {
                low.preorder = 0;
                low.limit = low.limit.saturating_mul(2);
            }
        } else {
            spread_spent = spread_spent.saturating_add(used);
        }
        match out {
            Outcome::Found(offsets) => best.offer(tensors, offsets, "search"),
            Outcome::Infeasible => lo = lo.max(cap.saturating_add(1)),
            Outcome::Unknown if engine.too_big() => return Ended::TooBig,
            Outcome::Unknown if engine.hard_stop() => return Ended::OutOfBudget,
            Outcome::Unknown => {}
        }
    }
}

/// The greedy portfolio: best-fit (TFLite's gap rule) by size, as [`super::greedy_by_size`],
/// and by area (size times lifetime), and [`executorch_greedy`]; returns the smallest. A method
/// that cannot place everything within `u64` is skipped; if none can, greedy-by-size's error
/// is returned.
pub(crate) fn greedy_portfolio(tensors: &[TensorLife], alignment: u64) -> Result<Best, Error> {
    let mut best = Best { offsets: Vec::new(), size: u64::MAX, method: "greedy_by_size" };
    let by_size = best_fit(tensors, alignment, &size_order(tensors));
    let by_area = best_fit(tensors, alignment, &area_order(tensors));
    let executorch = executorch_greedy(tensors, alignment).map(|p| p.offsets().to_vec());
    let mut size_error = None;
    for (offsets, method) in
        [(by_size, "greedy_by_size"), (by_area, "best_fit_by_area"), (executorch, "executorch_greedy")]
    {
        match offsets {
            Ok(offsets) => best.offer(tensors, offsets, method),
            Err(e) if method == "greedy_by_size" => size_error = Some(e),
            Err(_) => {}
        }
    }
    match size_error {
        Some(e) if best.offsets.len() != tensors.len() => Err(e),
        _ => Ok(best),
    }
}

/// The result of the `Fast` strategy, and the search's view of the problem when it was small
/// enough to build.
pub(crate) struct FastResult {
    /// The best plan.
    pub best: Best,
    /// Whether it is proven optimal.
    pub proven: bool,
    /// The problem as the search sees it, if built.
    pub problem: Option<Problem>,
}

/// The `Fast` strategy: the greedy portfolio, then (when the problem is small enough to hold)
/// a guided dive with every preorder, then the anytime loop; the dives and the loop share the
/// work budget [`FAST_WORK`] (a dive that would overrun it is abandoned, and ends the phase).
pub(crate) fn fast_best(tensors: &[TensorLife], alignment: u64, lb: u64) -> Result<FastResult, Error> {
    let mut best = greedy_portfolio(tensors, alignment)?;
    let done = |best, proven, problem| Ok(FastResult { best, proven, problem });
    if best.size <= lb {
        return done(best, true, None);
    }
    let Some(p) = Problem::build(tensors, alignment, MAX_PROBLEM_ENTRIES) else {
        return done(best, false, None);
    };
    let mut left = FAST_WORK.saturating_add(FAST_WORK_PER_TENSOR.saturating_mul(tensors.len() as u64));
    for preorder in PREORDERS {
        let limits = DiveLimits { work: left, deadline_us: u64::MAX, seed: 0 };
        let Some((offsets, work)) = dive(&p, preorder, lb, limits) else { return done(best, false, Some(p)) };
        best.offer(tensors, offsets, "dive");
        if best.size <= lb {
            return done(best, true, Some(p));
        }
        left = left.saturating_sub(work);
    }
    let proven = improve(tensors, &p, &mut best, lb, u64::MAX, left) == Ended::Proven;
    done(best, proven, Some(p))
}

/// `Strategy::Fast`.
pub(crate) fn fast(tensors: &[TensorLife], alignment: u64) -> Result<MemoryPlan, Error> {
    validate(tensors, alignment)?;
    let lb = lower_bound(tensors)?;
    let r = fast_best(tensors, alignment, lb)?;
    MemoryPlan::verified(tensors, alignment, r.best.offsets, lb, r.proven, r.best.method)
}

/// `Strategy::Search`: `Fast` first (in full, whatever the budget, so never worse than `Fast`),
/// then the anytime loop until the lower bound is reached, optimality is proven or the budget
/// ends.
pub(crate) fn search(tensors: &[TensorLife], alignment: u64, budget_ms: u64) -> Result<MemoryPlan, Error> {
    let deadline = now_us().saturating_add(budget_ms.saturating_mul(1000));
    validate(tensors, alignment)?;
    let lb = lower_bound(tensors)?;
    let FastResult { mut best, mut proven, problem } = fast_best(tensors, alignment, lb)?;
    if let (false, Some(p)) = (proven, problem) {
        match improve(tensors, &p, &mut best, lb, deadline, u64::MAX) {
            Ended::Proven => proven = true,
            Ended::OutOfBudget => {}
            // Too big to search exhaustively: spend the budget on dives with random tie-breaks.
            Ended::TooBig => {
                for seed in 1u64.. {
                    let limits = DiveLimits { work: u64::MAX, deadline_us: deadline, seed };
                    let preorder = PREORDERS[seed as usize % PREORDERS.len()];
                    let Some((offsets, _)) = dive(&p, preorder, lb, limits) else { break };
                    best.offer(tensors, offsets, "dive");
                    if best.size <= lb {
                        proven = true;
                        break;
                    }
                }
            }
        }
    }
    MemoryPlan::verified(tensors, alignment, best.offsets, lb, proven, best.method)
}
