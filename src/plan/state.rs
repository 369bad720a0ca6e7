//! Search state with undo trails: placements, each tensor's lowest possible offset, each
//! section's floor and unplaced total, and the cut counts used for decomposition.

use super::problem::{Problem, NO_TWIN};

/// Offset value of a tensor that is not placed yet.
pub(crate) const UNPLACED: u64 = u64::MAX;

/// One placement on the trail, with where its recorded changes start.
struct Step {
    tensor: u32,
    /// Length of `raises` before this placement.
    raises: usize,
    /// Whether the cut counts inside the tensor's sections were lowered.
    cut: bool,
}

/// Mutable state of one search run.
pub(crate) struct State<'a> {
    pub p: &'a Problem,
    /// Largest buffer size allowed.
    pub cap: u64,
    /// Offset of each tensor, or [`UNPLACED`].
    pub off: Vec<u64>,
    /// Lowest aligned offset each unplaced tensor can take (above every placed tensor it
    /// overlaps in time); [`UNPLACED`] for placed tensors.
    pub min_off: Vec<u64>,
    floor: Vec<u64>,
    total: Vec<u64>,
    cuts: Vec<u32>,
    /// Placements, in order.
    trail: Vec<Step>,
    /// Lowest offsets overwritten by placements: (tensor, old value).
    raises: Vec<(u32, u64)>,
    /// Floors overwritten by placements, one per section of the placed tensor.
    floors: Vec<u64>,
    /// Work done so far (elementary steps: overlaps scanned, sections tested, members scanned),
    /// a machine-independent measure of time for budgets that must be deterministic.
    pub work: u64,
    /// Section member lists, permuted so that each section's unplaced members come first.
    members: Vec<u32>,
    /// Where each (tensor, section) pair sits in `members` (indexed like `Problem::slot0`).
    slot: Vec<u32>,
    /// Number of unplaced members of each section.
    unplaced: Vec<usize>,
    /// Per section, a member found unplaced with a low enough lowest offset when the section
    /// was last checked (a hint only: while it stays so, no scan of the members is needed).
    witness: Vec<u32>,
}

impl<'a> State<'a> {
    /// A fresh state for `p` with capacity `cap`.
    pub(crate) fn new(p: &'a Problem, cap: u64) -> State<'a> {
        let (n, s) = (p.len(), p.sections());
        State {
            p,
            cap,
            off: vec![UNPLACED; n],
            min_off: vec![0; n],
            floor: vec![0; s],
            total: p.sec_total.clone(),
            cuts: p.cuts.clone(),
            trail: Vec::new(),
            raises: Vec::new(),
            floors: Vec::new(),
            work: 0,
            members: p.sec_members.clone(),
            slot: p.slot0.clone(),
            unplaced: (0..s).map(|k| p.sec_start[k + 1] - p.sec_start[k]).collect(),
            witness: (0..s).map(|k| p.sec_members.get(p.sec_start[k]).copied().unwrap_or(0)).collect(),
        }
    }

    /// Back to "nothing placed".
    pub(crate) fn reset(&mut self) {
        self.work += (self.off.len() + self.floor.len() + self.members.len()) as u64;
        self.off.fill(UNPLACED);
        self.min_off.fill(0);
        self.floor.fill(0);
        self.total.clone_from(&self.p.sec_total);
        self.cuts.clone_from(&self.p.cuts);
        self.trail.clear();
        self.raises.clear();
        self.floors.clear();
        self.members.clone_from(&self.p.sec_members);
        self.slot.clone_from(&self.p.slot0);
        let p = self.p;
        for (s, u) in self.unplaced.iter_mut().enumerate() {
            *u = p.sec_start[s + 1] - p.sec_start[s];
        }
        for (s, w) in self.witness.iter_mut().enumerate() {
            *w = p.sec_members.get(p.sec_start[s]).copied().unwrap_or(0);
        }
    }

    /// Number of placements on the trail, to undo back to later.
    pub(crate) fn mark(&self) -> usize {
        self.trail.len()
    }

    /// The tensors whose lowest offset the latest placement raised (all to the same value),
    /// with their previous lowest offsets.
    pub(crate) fn last_raised(&self) -> &[(u32, u64)] {
        // The first entry of a placement is the placed tensor itself.
        let from = self.trail.last().map_or(self.raises.len(), |step| step.raises + 1);
        self.raises.get(from..).unwrap_or(&[])
    }

    /// Whether tensor `b` must wait for its twin (see `Problem::twin`), still unplaced.
    pub(crate) fn twin_waits(&self, b: usize) -> bool {
        let twin = self.p.twin[b];
        twin != NO_TWIN && self.off[twin as usize] == UNPLACED
    }

    /// Current unplaced total of section `s`.
    pub(crate) fn total(&self, s: usize) -> u64 {
        self.total.get(s).copied().unwrap_or(0)
    }

    /// Undoes every placement made since `mark`, latest first.
    pub(crate) fn undo(&mut self, mark: usize) {
        let p = self.p;
        while self.trail.len() > mark {
            let Some(step) = self.trail.pop() else { break };
            let b = step.tensor as usize;
            if step.cut {
                for s in range(p, b).skip(1) {
                    self.cuts[s - 1] += 1;
                }
            }
            while self.raises.len() > step.raises {
                let Some((u, v)) = self.raises.pop() else { break };
                self.min_off[u as usize] = v;
            }
            let size = p.size[b];
            for s in range(p, b).rev() {
                self.floor[s] = self.floors.pop().unwrap_or(0);
                self.total[s] += size;
                // The tensor taken out of the unplaced members still sits right after them.
                self.unplaced[s] += 1;
            }
            self.off[b] = UNPLACED;
        }
    }

    /// Places tensor `b` at offset `o` and propagates: raises the lowest offsets of the unplaced
    /// tensors it overlaps, raises the floors (highest placed top) of its sections and lowers
    /// their unplaced totals. Returns whether every section in `lo..hi` still passes the
    /// capacity test (see [`State::fits`]) given that every unplaced tensor goes at or above
    /// `bound` (`o` itself in the canonical search).
    pub(crate) fn place(&mut self, b: usize, o: u64, lo: usize, hi: usize, bound: u64) -> bool {
        let p = self.p;
        let size = p.size[b];
        let span = (p.sec_hi[b] - p.sec_lo[b]) as u64;
        self.work += p.overlaps(b).len() as u64 + span + hi.saturating_sub(lo) as u64;
        self.trail.push(Step { tensor: b as u32, raises: self.raises.len(), cut: false });
        self.off[b] = o;
        // A placed tensor no longer bounds any section from below.
        self.raises.push((b as u32, self.min_off[b]));
        self.min_off[b] = UNPLACED;
        let top = o.saturating_add(size);
        let mask = p.align - 1;
        let aligned = top.checked_add(mask).map_or(u64::MAX, |v| v & !mask);
        for s in range(p, b) {
            self.floors.push(self.floor[s]);
            self.floor[s] = self.floor[s].max(top);
            self.total[s] -= size;
            self.remove_member(b, s);
        }
        for &u in p.overlaps(b) {
            let u = u as usize;
            // Placed tensors have min_off == UNPLACED, so this skips them too.
            if self.min_off.get(u).is_none_or(|&m| m >= aligned) {
                continue;
            }
            self.raises.push((u as u32, self.min_off[u]));
            self.min_off[u] = aligned;
        }
        self.fits(bound, lo, hi)
    }

    /// The capacity test of every section in `lo..hi`, given that all unplaced tensors go at
    /// or above `o`: the tensors still to place in a section are live together, so they stack;
    /// they start no lower than `o`, than the section's floor, and than the smallest lowest
    /// offset among them, and must still end within the capacity.
    fn fits(&mut self, o: u64, lo: usize, hi: usize) -> bool {
        let p = self.p;
        for s in lo..hi.min(self.floor.len()) {
            let total = self.total[s];
            if self.floor[s].max(o).saturating_add(total) > self.cap {
                return false;
            }
            if total == 0 {
                continue;
            }
            // Some unplaced member must be able to start at or below `room`.
            let room = self.cap - total;
            if self.min_off[self.witness[s] as usize] <= room {
                continue;
            }
            let start = p.sec_start[s];
            let members = &self.members[start..start + self.unplaced[s]];
            let found = members.iter().position(|&m| self.min_off[m as usize] <= room);
            self.work += found.map_or(members.len(), |k| k + 1) as u64;
            match found {
                Some(k) => self.witness[s] = members[k],
                None => return false,
            }
        }
        true
    }

    /// The smallest capacity for which [`State::fits`] would pass on `lo..hi` with bound `o`.
    pub(crate) fn need(&mut self, o: u64, lo: usize, hi: usize) -> u64 {
        let p = self.p;
        let hi = hi.min(self.floor.len());
        self.work += 2 * hi.saturating_sub(lo) as u64;
        let mut need =
            (lo..hi).map(|s| self.floor[s].max(o).saturating_add(self.total[s])).max().unwrap_or(0);
        for s in lo..hi {
            let total = self.total[s];
            // Only a section whose unplaced members all start above `need - total` raises it.
            let Some(room) = need.checked_sub(total).filter(|_| total > 0) else { continue };
            if self.min_off[self.witness[s] as usize] <= room {
                continue;
            }
            let start = p.sec_start[s];
            let members = &self.members[start..start + self.unplaced[s]];
            self.work += 2 * members.len() as u64;
            match members.iter().find(|&&m| self.min_off[m as usize] <= room) {
                Some(&m) => self.witness[s] = m,
                None => {
                    let lowest = members.iter().map(|&m| self.min_off[m as usize]).min().unwrap_or(0);
                    need = need.max(lowest.saturating_add(total));
                }
            }
        }
        need
    }

    /// Moves tensor `b` out of the unplaced members of section `s` (to just past them).
    fn remove_member(&mut self, b: usize, s: usize) {
        let p = self.p;
        let at = p.slot_base[b] + s - p.sec_lo[b] as usize;
        let (Some(&i), Some(n)) = (self.slot.get(at), self.unplaced.get_mut(s)) else { return };
        let i = i as usize;
        *n -= 1;
        let j = p.sec_start[s] + *n;
        let other = self.members[j] as usize;
        self.members.swap(i, j);
        self.slot[at] = j as u32;
        let other_at = p.slot_base[other] + s - p.sec_lo[other] as usize;
        self.slot[other_at] = i as u32;
    }

    /// Lowers the cut counts of the boundaries inside the sections of the tensor placed last
    /// (`b`) and returns the sections that start a new independent sub-problem (cut count 0).
    pub(crate) fn split_points(&mut self, b: usize) -> Vec<u32> {
        let mut points = Vec::new();
        match self.trail.last_mut() {
            Some(step) if step.tensor as usize == b && !step.cut => step.cut = true,
            _ => return points,
        }
        for s in range(self.p, b).skip(1) {
            let c = &mut self.cuts[s - 1];
            *c = c.saturating_sub(1);
            if *c == 0 {
                points.push(s as u32);
            }
        }
        points
    }
}

/// Sections of tensor `b`.
fn range(p: &Problem, b: usize) -> std::ops::Range<usize> {
    p.sec_lo[b] as usize..p.sec_hi[b] as usize
}
