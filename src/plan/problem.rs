//! The search's view of a planning problem: time cut into *sections*, pairwise overlaps and
//! the per-section data that spatial inference needs.
//!
//! A section is the set of tensors live at some step just before one of them dies, recorded
//! only when some tensor started since the previous section (every other set of live tensors
//! is a subset of a recorded one, so it can never be the tighter constraint). Every tensor
//! spans a contiguous, non-empty range of sections, and two tensors overlap in time exactly
//! when they share a section.

use super::TensorLife;

/// Sections, overlaps and sizes of one problem, in compressed form.
pub(crate) struct Problem {
    /// Size of each tensor in bytes.
    pub size: Vec<u64>,
    /// Lifetime length of each tensor in steps (saturating).
    pub width: Vec<u64>,
    /// Offsets must be multiples of this (a power of two).
    pub align: u64,
    /// First section of each tensor.
    pub sec_lo: Vec<u32>,
    /// One past the last section of each tensor.
    pub sec_hi: Vec<u32>,
    /// Start of each section's member list in `sec_members` (one extra entry at the end).
    pub sec_start: Vec<usize>,
    /// Members of all sections, section by section.
    pub sec_members: Vec<u32>,
    /// Start of each tensor's slots in `slot0` (one slot per section it spans).
    pub slot_base: Vec<usize>,
    /// For tensor `b` and section `s` it spans: `b`'s index in `sec_members`, stored at
    /// `slot_base[b] + s - sec_lo[b]`.
    pub slot0: Vec<u32>,
    ov_start: Vec<usize>,
    ov: Vec<u32>,
    /// Total size of the tensors of each section.
    pub sec_total: Vec<u64>,
    /// For each boundary between sections `s` and `s + 1`: how many tensors span it.
    pub cuts: Vec<u32>,
    /// For each tensor, the previous tensor (by index) with the same size and sections, or
    /// [`NO_TWIN`]. Such twins are interchangeable, so the search places them in index order.
    pub twin: Vec<u32>,
}

/// No twin (see [`Problem::twin`]).
pub(crate) const NO_TWIN: u32 = u32::MAX;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Start,
    End,
}

/// Live-set bookkeeping with O(1) insertion and removal.
struct LiveSet {
    items: Vec<u32>,
    pos: Vec<usize>,
}

impl LiveSet {
    fn insert(&mut self, i: u32) {
        if let Some(p) = self.pos.get_mut(i as usize) {
            *p = self.items.len();
        }
        self.items.push(i);
    }

    fn remove(&mut self, i: u32) {
        let Some(&p) = self.pos.get(i as usize) else { return };
        if p >= self.items.len() {
            return;
        }
        self.items.swap_remove(p);
        if let Some(&moved) = self.items.get(p) {
            if let Some(q) = self.pos.get_mut(moved as usize) {
                *q = p;
            }
        }
    }
}

impl Problem {
    /// Builds the problem, or `None` when its overlap lists and sections together would exceed
    /// `max_entries` entries (too big to search; `max_entries` must stay below `u32::MAX`).
    pub(crate) fn build(tensors: &[TensorLife], align: u64, max_entries: usize) -> Option<Problem> {
        let n = tensors.len();
        if u32::try_from(n).is_err() || u32::try_from(max_entries).is_err() {
            return None;
        }
        let mut events: Vec<(u64, Kind, u32)> = Vec::with_capacity(2 * n);
        for (i, t) in tensors.iter().enumerate() {
            events.push((t.first, Kind::Start, i as u32));
            events.push((t.last, Kind::End, i as u32));
        }
        events.sort_unstable();
        // Pass 1: sizes only, to refuse problems too big to hold.
        let (mut live, mut entries, mut fresh) = (0usize, 0usize, false);
        for &(_, kind, _) in &events {
            match kind {
                Kind::Start => {
                    entries = entries.saturating_add(live.saturating_mul(2));
                    live += 1;
                    fresh = true;
                }
                Kind::End => {
                    if fresh {
                        entries = entries.saturating_add(live);
                        fresh = false;
                    }
                    live = live.saturating_sub(1);
                }
            }
            if entries > max_entries {
                return None;
            }
        }
        // Pass 2: sections, section ranges and overlap pairs.
        let mut set = LiveSet { items: Vec::new(), pos: vec![0; n] };
        let (mut sec_lo, mut sec_hi) = (vec![0u32; n], vec![0u32; n]);
        let (mut sec_start, mut sec_members) = (vec![0usize], Vec::new());
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        let mut fresh = false;
        for &(_, kind, i) in &events {
            let sections = (sec_start.len() - 1) as u32;
            match kind {
                Kind::Start => {
                    pairs.extend(set.items.iter().map(|&j| (i, j)));
                    sec_lo[i as usize] = sections;
                    set.insert(i);
                    fresh = true;
                }
                Kind::End => {
                    if fresh {
                        sec_members.extend_from_slice(&set.items);
                        sec_start.push(sec_members.len());
                        fresh = false;
                    }
                    sec_hi[i as usize] = (sec_start.len() - 1) as u32;
                    set.remove(i);
                }
            }
        }
        let mut degree = vec![0usize; n + 1];
        for &(a, b) in &pairs {
            degree[a as usize + 1] += 1;
            degree[b as usize + 1] += 1;
        }
        for i in 0..n {
            degree[i + 1] += degree[i];
        }
        let ov_start = degree.clone();
        let mut ov = vec![0u32; ov_start[n]];
        for &(a, b) in &pairs {
            for (x, y) in [(a, b), (b, a)] {
                let slot = &mut degree[x as usize];
                if let Some(e) = ov.get_mut(*slot) {
                    *e = y;
                }
                *slot += 1;
            }
        }
        let sections = sec_start.len() - 1;
        let size: Vec<u64> = tensors.iter().map(|t| t.size).collect();
        let sec_total = (0..sections)
            .map(|s| {
                sec_members[sec_start[s]..sec_start[s + 1]]
                    .iter()
                    .fold(0u64, |a, &b| a.saturating_add(size[b as usize]))
            })
            .collect();
        let mut cuts = vec![0u32; sections];
        for i in 0..n {
            for c in &mut cuts[sec_lo[i] as usize..(sec_hi[i] as usize).saturating_sub(1)] {
                *c += 1;
            }
        }
        let mut slot_base = Vec::with_capacity(n + 1);
        slot_base.push(0usize);
        for i in 0..n {
            let span = (sec_hi[i] - sec_lo[i]) as usize;
            slot_base.push(slot_base[i] + span);
        }
        let mut slot0 = vec![0u32; slot_base[n]];
        for s in 0..sections {
            for (at, &m) in sec_members.iter().enumerate().take(sec_start[s + 1]).skip(sec_start[s]) {
                let m = m as usize;
                if let Some(slot) = slot0.get_mut(slot_base[m] + s - sec_lo[m] as usize) {
                    *slot = at as u32;
                }
            }
        }
        let width = tensors.iter().map(|t| (t.last - t.first).saturating_add(1)).collect();
        let mut by_shape: Vec<usize> = (0..n).collect();
        by_shape.sort_unstable_by_key(|&i| (size[i], sec_lo[i], sec_hi[i], i));
        let mut twin = vec![NO_TWIN; n];
        for w in by_shape.windows(2) {
            let (a, b) = (w[0], w[1]);
            if (size[a], sec_lo[a], sec_hi[a]) == (size[b], sec_lo[b], sec_hi[b]) {
                twin[b] = a as u32;
            }
        }
        Some(Problem {
            size,
            width,
            align,
            sec_lo,
            sec_hi,
            sec_start,
            sec_members,
            slot_base,
            slot0,
            ov_start,
            ov,
            sec_total,
            cuts,
            twin,
        })
    }

    /// Number of tensors.
    pub(crate) fn len(&self) -> usize {
        self.size.len()
    }

    /// Number of sections.
    pub(crate) fn sections(&self) -> usize {
        self.sec_start.len() - 1
    }

    /// The independent sub-problems: maximal section ranges `lo..hi` that no tensor spans a
    /// boundary of, each with its tensors (in index order).
    pub(crate) fn partitions(&self) -> Vec<(usize, usize, Vec<u32>)> {
        let sections = self.sections();
        let mut parts: Vec<(usize, usize, Vec<u32>)> = Vec::new();
        let mut lo = 0;
        for s in 0..sections {
            if s + 1 == sections || self.cuts[s] == 0 {
                parts.push((lo, s + 1, Vec::new()));
                lo = s + 1;
            }
        }
        for b in 0..self.len() {
            let first = self.sec_lo[b] as usize;
            let k = parts.partition_point(|&(lo, _, _)| lo <= first).saturating_sub(1);
            if let Some(part) = parts.get_mut(k) {
                part.2.push(b as u32);
            }
        }
        parts
    }

    /// Tensors whose lifetimes overlap tensor `i`'s.
    pub(crate) fn overlaps(&self, i: usize) -> &[u32] {
        match (self.ov_start.get(i), self.ov_start.get(i + 1)) {
            (Some(&a), Some(&b)) => self.ov.get(a..b).unwrap_or(&[]),
            _ => &[],
        }
    }
}
