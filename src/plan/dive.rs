//! A greedy dive guided by the search's inference. Tensors are placed one at a time, each at its
//! lowest possible offset, trying candidates in the search's order (lowest offset, then static
//! preorder; skipping those out of canonical order or dominated) and taking the first whose
//! placement passes the search's section test at the current capacity. When none of the first
//! few does, the capacity is raised to the least value that admits one of the first few
//! candidates of all, and that one is placed. One pass, no backtracking; the capacity it ends
//! with bounds the plan's size. Starting at the lower bound, it is a much better greedy than
//! best-fit by size on hard instances (1.02-1.10x the bound instead of 1.3-1.4x on MiniMalloc's).

use std::collections::BTreeSet;

use super::frames::mix;
use super::preorder::{preorder_keys, Preorder};
use super::problem::Problem;
use super::state::State;
use crate::clock::now_us;

/// How many candidates a step tries (and compares when it must raise the capacity).
const TRIES: usize = 8;

/// Limits of one dive.
#[derive(Clone, Copy)]
pub(crate) struct DiveLimits {
    /// Give up once the work (see `State::work`) passes this.
    pub work: u64,
    /// Give up once the clock passes this; `u64::MAX`: never read the clock.
    pub deadline_us: u64,
    /// 0: break preorder ties by index; otherwise by a hash of the index and this seed.
    pub seed: u64,
}

/// Runs one dive with `preorder`, starting at capacity `cap` (for example the lower bound),
/// over each independent sub-problem in turn. Returns the offsets in input order and the work
/// done (see `State::work`), or `None` if a limit was hit first.
pub(crate) fn dive(p: &Problem, preorder: Preorder, cap: u64, limits: DiveLimits) -> Option<(Vec<u64>, u64)> {
    let n = p.len();
    let mut st = State::new(p, cap);
    let mut by_rank: Vec<u32> = (0..n as u32).collect();
    let seed = limits.seed;
    by_rank.sort_by_cached_key(|&b| {
        let tie = if seed == 0 { 0 } else { mix(u64::from(b) ^ seed) };
        (std::cmp::Reverse(preorder_keys(&st, preorder, b as usize)), tie, b)
    });
    let mut rank = vec![0u32; n];
    for (r, &b) in by_rank.iter().enumerate() {
        rank[b as usize] = r as u32;
    }
    let mut failed: Vec<u32> = Vec::with_capacity(TRIES);
    // Independent sub-problems still to place: sections lo..hi and their tensors. A placement
    // that leaves no unplaced tensor spanning some section boundary splits its sub-problem.
    let mut work = p.partitions();
    let mut steps = 0u64;
    while let Some((lo, hi, tensors)) = work.pop() {
        // Unplaced tensors by (lowest offset, rank), and by (lowest offset + size, rank).
        let mut order: BTreeSet<(u64, u32)> = BTreeSet::new();
        let mut tops: BTreeSet<(u64, u32)> = BTreeSet::new();
        for &b in &tensors {
            let (o, r) = (st.min_off[b as usize], rank[b as usize]);
            order.insert((o, r));
            tops.insert((o.saturating_add(p.size[b as usize]), r));
        }
        let mut last = (0u64, 0u32);
        while let Some(&(min_top, _)) = tops.first() {
            steps += 1;
            let late =
                limits.deadline_us != u64::MAX && steps.is_multiple_of(64) && now_us() > limits.deadline_us;
            if st.work > limits.work || late {
                return None;
            }
            // Eligible candidates come at or after the latest placement in this order; the
            // fallbacks are the first few of all.
            let eligible = order.range(last..).map(|&(_, r)| by_rank[r as usize]);
            let first = order.iter().take(TRIES).map(|&(_, r)| by_rank[r as usize]);
            failed.clear();
            failed.extend(first);
            let b = step(&mut st, eligible, min_top, lo, hi, &failed)?;
            let (o, r) = (st.off[b as usize], rank[b as usize]);
            last = (o, r);
            let size = |t: u32| p.size[t as usize];
            // The placed tensor's old key is its offset (it went at its lowest offset).
            order.remove(&(o, r));
            tops.remove(&(o.saturating_add(size(b)), r));
            st.work += 2 * st.last_raised().len() as u64;
            for &(u, old) in st.last_raised() {
                let (new, ru) = (st.min_off[u as usize], rank[u as usize]);
                order.remove(&(old, ru));
                order.insert((new, ru));
                tops.remove(&(old.saturating_add(size(u)), ru));
                tops.insert((new.saturating_add(size(u)), ru));
            }
            let points = st.split_points(b as usize);
            if !points.is_empty() {
                let mut bounds = points;
                bounds.insert(0, lo as u32);
                let mut groups: Vec<Vec<u32>> = vec![Vec::new(); bounds.len()];
                for &(_, r) in &order {
                    let t = by_rank[r as usize];
                    let k = bounds.partition_point(|&s| s <= p.sec_lo[t as usize]).saturating_sub(1);
                    groups[k].push(t);
                }
                for (k, group) in groups.into_iter().enumerate() {
                    let end = bounds.get(k + 1).map_or(hi, |&s| s as usize);
                    if !group.is_empty() {
                        work.push((bounds[k] as usize, end, group));
                    }
                }
                break;
            }
        }
    }
    Some((st.off.clone(), st.work))
}

/// Places one tensor of a sub-problem (sections `lo..hi`): the first of `eligible` (tensors
/// in canonical order after the latest placement, by lowest offset then rank) whose placement
/// passes the section test, trying a few below `min_top` (the lowest top any unplaced tensor can
/// reach; candidates at or above it are dominated). If none does, raises the capacity as
/// little as lets one of `fallbacks` in and places that one. Returns the placed tensor.
fn step(
    st: &mut State<'_>,
    eligible: impl Iterator<Item = u32>,
    min_top: u64,
    lo: usize,
    hi: usize,
    fallbacks: &[u32],
) -> Option<u32> {
    for b in eligible.take(2 * TRIES) {
        let o = st.min_off[b as usize];
        if o >= min_top {
            break;
        }
        if st.twin_waits(b as usize) {
            continue;
        }
        let mark = st.mark();
        if st.place(b as usize, o, lo, hi, o) {
            return Some(b);
        }
        st.undo(mark);
    }
    let mut fallback: Option<(u64, u32)> = None;
    for &b in fallbacks {
        let o = st.min_off[b as usize];
        let mark = st.mark();
        st.place(b as usize, o, lo, hi, 0);
        let need = st.need(o, lo, hi);
        st.undo(mark);
        if fallback.is_none_or(|(best, _)| need < best) {
            fallback = Some((need, b));
        }
    }
    let (need, b) = fallback?;
    st.cap = st.cap.max(need);
    st.place(b as usize, st.min_off[b as usize], lo, hi, 0);
    Some(b)
}
