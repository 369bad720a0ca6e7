//! The exact search: "does every tensor fit in `cap` bytes?", answered by a depth-first
//! branch-and-bound over canonical placements (the scheme of MiniMalloc, Moffitt, ASPLOS 2023).
//!
//! * **Canonical placements.** Tensors are placed in non-decreasing offset order (ties by a
//!   static preorder index), each at its lowest possible offset: the aligned top of the highest
//!   placed tensor it overlaps in time. Every plan can be pushed down into such a form, so the
//!   search loses nothing by looking only at these.
//! * **Candidates** are the unplaced tensors sorted by lowest offset, then preorder. The ones
//!   before the last placement in that order are skipped (non-decreasing order), and so is every
//!   candidate whose offset is at or above the top some unplaced tensor would reach at its own
//!   lowest offset (dominance: that tensor could always be slid into the gap below), and every
//!   tensor whose identical twin (same size and sections) of lower index is still unplaced.
//! * **Spatial inference over sections** (see `state.rs`): after each placement, each section's
//!   floor plus the sizes still to place there must stay within `cap`, else prune.
//! * **Decomposition.** When no unplaced tensor spans a section boundary any more, the two sides
//!   are independent sub-problems; each is solved on its own and a failure of one fails all.
//! * **Preorders** `WAT`, `TAW`, `TWA` (lifetime Width, Area = size x width, the largest section
//!   Total it is part of; all descending; see `preorder.rs`) break ties between candidates. The
//!   driver restarts runs with different preorders, node limits and (optionally) seeded random
//!   tie-breaks within a preorder.
//!
//! The search is iterative (an explicit stack of frames), so deep problems need no deep call
//! stack; memory is bounded by a limit on the candidate lists held by live frames.

use super::frames::{mix, AndFrame, Frame, Limits, OrFrame, Outcome, Part, Status};
use super::preorder::{preorder_keys, Preorder, PREORDERS};
use super::problem::Problem;
use super::state::{State, UNPLACED};
use crate::clock::now_us;

/// Runs the search with one preorder and the given limits.
pub(crate) struct Engine<'a> {
    st: State<'a>,
    parts: Vec<Part>,
    frames: Vec<Frame>,
    preorder: Preorder,
    nodes: u64,
    entries: usize,
    limits: Limits,
    hard_stop: bool,
    too_big: bool,
    /// Scratch marks per tensor (`stamp` = marked).
    marks: Vec<u32>,
    stamp: u32,
}

impl<'a> Engine<'a> {
    /// An engine for `p` with capacity `cap`.
    pub(crate) fn new(p: &'a Problem, cap: u64) -> Engine<'a> {
        let limits = Limits { nodes: 0, work: 0, deadline_us: 0, entries: 0, seed: 0 };
        let (parts, frames) = (Vec::new(), Vec::new());
        let st = State::new(p, cap);
        let marks = vec![0; p.len()];
        let preorder = PREORDERS[0];
        Engine {
            st,
            parts,
            frames,
            preorder,
            nodes: 0,
            entries: 0,
            limits,
            hard_stop: false,
            too_big: false,
            marks,
            stamp: 0,
        }
    }

    /// Changes the capacity for the next runs.
    pub(crate) fn set_cap(&mut self, cap: u64) {
        self.st.cap = cap;
    }

    /// Work done by all runs so far (see `State::work`).
    pub(crate) fn work(&self) -> u64 {
        self.st.work
    }

    /// Whether the last run stopped on the clock, the work limit or the memory limit (a larger
    /// node limit would not help).
    pub(crate) fn hard_stop(&self) -> bool {
        self.hard_stop
    }

    /// Whether the last run stopped because its frames would hold too many candidates (the
    /// problem is too big for this search).
    pub(crate) fn too_big(&self) -> bool {
        self.too_big
    }

    /// One complete run with `preorder` under `limits`.
    pub(crate) fn run(&mut self, preorder: Preorder, limits: Limits) -> Outcome {
        self.preorder = preorder;
        self.limits = limits;
        self.nodes = 0;
        self.entries = 0;
        self.hard_stop = false;
        self.too_big = false;
        self.st.reset();
        self.parts.clear();
        self.frames.clear();
        let p = self.st.p;
        let sections = p.sections();
        if (0..sections).any(|s| p.sec_total[s] > self.st.cap) {
            return Outcome::Infeasible;
        }
        for (lo, hi, pre) in p.partitions() {
            self.parts.push(Part { pre, lo, hi });
        }
        self.frames.push(Frame::And(AndFrame { first: 0, end: self.parts.len(), next: 0 }));
        match self.drive() {
            Status::Found => Outcome::Found(self.st.off.clone()),
            Status::NotFound => Outcome::Infeasible,
            Status::Abort => Outcome::Unknown,
        }
    }

    /// Appends one part per non-empty group of `tensors` between consecutive `bounds`
    /// (section indices, the first being the lowest), the last group ending at `hi`.
    fn split(&mut self, tensors: &[u32], bounds: &[u32], hi: usize) {
        let p = self.st.p;
        let mut groups: Vec<Vec<u32>> = vec![Vec::new(); bounds.len()];
        for &b in tensors {
            let k = bounds.partition_point(|&s| s <= p.sec_lo[b as usize]).saturating_sub(1);
            if let Some(g) = groups.get_mut(k) {
                g.push(b);
            }
        }
        for (k, pre) in groups.into_iter().enumerate() {
            if pre.is_empty() {
                continue;
            }
            let lo = bounds[k] as usize;
            let end = bounds.get(k + 1).map_or(hi, |&s| s as usize);
            self.parts.push(Part { pre, lo, hi: end });
        }
    }

    /// The explicit-stack depth-first search.
    fn drive(&mut self) -> Status {
        let mut ret: Option<Status> = None;
        while let Some(frame) = self.frames.pop() {
            match frame {
                Frame::Or(f) => {
                    if let Some(r @ (Status::Found | Status::Abort)) = ret {
                        self.entries = self.entries.saturating_sub(f.order.len());
                        ret = Some(r);
                        continue;
                    }
                    ret = self.step(f);
                }
                Frame::And(mut a) => {
                    match ret.take() {
                        Some(Status::Found) => a.next += 1,
                        Some(r) => {
                            self.parts.truncate(a.first);
                            ret = Some(r);
                            continue;
                        }
                        None => {}
                    }
                    if a.first + a.next >= a.end {
                        self.parts.truncate(a.first);
                        ret = Some(Status::Found);
                        continue;
                    }
                    let part = a.first + a.next;
                    self.frames.push(Frame::And(a));
                    ret = self.open_part(part);
                }
            }
        }
        ret.unwrap_or(Status::Found)
    }

    /// Sorts a part's tensors into the static preorder and opens its root node.
    fn open_part(&mut self, part: usize) -> Option<Status> {
        let Some(pt) = self.parts.get_mut(part) else { return Some(Status::Found) };
        let st = &self.st;
        let (preorder, seed) = (self.preorder, self.limits.seed);
        pt.pre.sort_by_cached_key(|&b| {
            let tie = if seed == 0 { 0 } else { mix(u64::from(b) ^ seed) };
            (std::cmp::Reverse(preorder_keys(st, preorder, b as usize)), tie, b)
        });
        let order: Vec<u32> = (0..pt.pre.len() as u32).collect();
        self.open_node(part, order, (0, 0), false)
    }

    /// The candidates of a child node: `order` (its parent's, sorted by lowest offset then
    /// preorder index) without placed tensors, re-sorted after the latest placement. Only the
    /// tensors that placement raised changed key (all to the same offset), so sorting those few
    /// and merging them back suffices.
    fn child_order(&mut self, part: usize, order: &[u32]) -> Vec<u32> {
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.marks.fill(0);
            self.stamp = 1;
        }
        for &(u, _) in self.st.last_raised() {
            if let Some(m) = self.marks.get_mut(u as usize) {
                *m = self.stamp;
            }
        }
        let Some(pt) = self.parts.get(part) else { return Vec::new() };
        let (st, pre) = (&self.st, &pt.pre);
        let mut kept = Vec::with_capacity(order.len());
        let mut moved = Vec::new();
        for &k in order {
            let t = pre[k as usize] as usize;
            if st.off[t] != UNPLACED {
                continue;
            }
            if self.marks[t] == self.stamp {
                moved.push(k);
            } else {
                kept.push(k);
            }
        }
        if moved.is_empty() {
            return kept;
        }
        moved.sort_unstable();
        let key = |k: u32| (st.min_off[pre[k as usize] as usize], k);
        let mut merged = Vec::with_capacity(kept.len() + moved.len());
        let (mut i, mut j) = (0, 0);
        while i < kept.len() && j < moved.len() {
            if key(kept[i]) < key(moved[j]) {
                merged.push(kept[i]);
                i += 1;
            } else {
                merged.push(moved[j]);
                j += 1;
            }
        }
        merged.extend_from_slice(&kept[i..]);
        merged.extend_from_slice(&moved[j..]);
        merged
    }

    /// Opens a node of `part` whose candidates are `order`; unless `sorted` says it is already
    /// free of placed tensors and sorted, it is filtered and sorted here. `last` is the
    /// (offset, preorder index) of the part's latest placement.
    fn open_node(
        &mut self,
        part: usize,
        mut order: Vec<u32>,
        last: (u64, u32),
        sorted: bool,
    ) -> Option<Status> {
        self.nodes += 1;
        if self.nodes > self.limits.nodes {
            return Some(Status::Abort);
        }
        if self.st.work > self.limits.work {
            self.hard_stop = true;
            return Some(Status::Abort);
        }
        // No clock reads at all without a deadline (`Fast` never sets one).
        let timed = self.limits.deadline_us != u64::MAX;
        if timed && self.nodes.is_multiple_of(64) && now_us() > self.limits.deadline_us {
            self.hard_stop = true;
            return Some(Status::Abort);
        }
        self.st.work += order.len() as u64;
        let Some(pt) = self.parts.get(part) else { return Some(Status::Abort) };
        let (st, pre) = (&self.st, &pt.pre);
        if !sorted {
            order.retain(|&k| st.off[pre[k as usize] as usize] == UNPLACED);
            order.sort_unstable_by_key(|&k| (st.min_off[pre[k as usize] as usize], k));
        }
        if order.is_empty() {
            return Some(Status::Found);
        }
        let size = &st.p.size;
        let min_top = order
            .iter()
            .map(|&k| {
                let b = pre[k as usize] as usize;
                st.min_off[b].saturating_add(size[b])
            })
            .min()
            .unwrap_or(u64::MAX);
        // Everything still to place lands at or above the next offset, so a section holding
        // `total` bytes of unplaced tensors allows offsets up to `cap - total` only.
        let most = (pt.lo..pt.hi).map(|s| st.total(s)).max().unwrap_or(0);
        let min_top = match st.cap.checked_sub(most) {
            Some(room) => min_top.min(room.saturating_add(1)),
            None => 0,
        };
        self.entries += order.len();
        if self.entries > self.limits.entries {
            self.entries = self.entries.saturating_sub(order.len());
            self.hard_stop = true;
            self.too_big = true;
            return Some(Status::Abort);
        }
        let mark = self.st.mark();
        // Candidates before the latest placement in (offset, preorder) order are skipped for
        // good (placements go in non-decreasing order); they form a prefix.
        let next = order.partition_point(|&k| (st.min_off[pre[k as usize] as usize], k) < last);
        self.frames.push(Frame::Or(OrFrame { part, order, next, last, min_top, mark }));
        None
    }

    /// Tries the next candidates of node `f` until one opens a child (returns `None`) or none
    /// is left (returns `NotFound`).
    fn step(&mut self, mut f: OrFrame) -> Option<Status> {
        self.st.undo(f.mark);
        let (lo, hi) = match self.parts.get(f.part) {
            Some(pt) => (pt.lo, pt.hi),
            None => return Some(Status::NotFound),
        };
        while let Some(&k) = f.order.get(f.next) {
            f.next += 1;
            let b = self.parts[f.part].pre[k as usize] as usize;
            let o = self.st.min_off[b];
            if (o, k) < f.last {
                continue;
            }
            if o >= f.min_top {
                break;
            }
            if self.st.twin_waits(b) {
                continue;
            }
            if !self.st.place(b, o, lo, hi, o) {
                self.st.undo(f.mark);
                continue;
            }
            let points = self.st.split_points(b);
            let part = f.part;
            if points.is_empty() {
                let order = self.child_order(part, &f.order);
                self.frames.push(Frame::Or(f));
                return self.open_node(part, order, (o, k), true);
            }
            let pre = self.parts[part].pre.clone();
            let mut bounds = points;
            bounds.insert(0, lo as u32);
            let first = self.parts.len();
            let unplaced: Vec<u32> =
                pre.into_iter().filter(|&t| self.st.off[t as usize] == UNPLACED).collect();
            self.split(&unplaced, &bounds, hi);
            let end = self.parts.len();
            self.frames.push(Frame::Or(f));
            self.frames.push(Frame::And(AndFrame { first, end, next: 0 }));
            return None;
        }
        self.entries = self.entries.saturating_sub(f.order.len());
        Some(Status::NotFound)
    }
}
