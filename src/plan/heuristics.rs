//! Greedy planners: the peers a caller can pick instead of [`super::plan`], and the best-fit
//! engine that the `Fast` portfolio runs with several orderings.

use super::validate::{align_up, lower_bound, validate};
use super::{Error, MemoryPlan, TensorLife};

fn overflow(i: usize) -> Error {
    Error::invalid_argument(format!("tensor {i}: its offset plus size would be past u64"))
}

/// No reuse at all: each tensor is placed right after the previous one (in input order), at the
/// next multiple of `alignment`. The plan a runtime gets without a planner.
pub fn one_after_another(tensors: &[TensorLife], alignment: u64) -> Result<MemoryPlan, Error> {
    validate(tensors, alignment)?;
    let lb = lower_bound(tensors)?;
    let mut offsets = Vec::with_capacity(tensors.len());
    let mut top = 0u64;
    for (i, t) in tensors.iter().enumerate() {
        let off = align_up(top, alignment).ok_or_else(|| overflow(i))?;
        top = off.checked_add(t.size).ok_or_else(|| overflow(i))?;
        offsets.push(off);
    }
    MemoryPlan::verified(tensors, alignment, offsets, lb, false, "one_after_another")
}

/// TFLite's `GreedyBySizeAssignment` (the GPU delegate's offset planner): tensors are taken
/// largest first (ties: longer lifetime first, then lower index); each goes into the smallest
/// gap, between already placed tensors whose lifetimes overlap its own, that is big enough
/// (gaps start at aligned offsets), or else right above the highest of them.
pub fn greedy_by_size(tensors: &[TensorLife], alignment: u64) -> Result<MemoryPlan, Error> {
    validate(tensors, alignment)?;
    let lb = lower_bound(tensors)?;
    let order = size_order(tensors);
    let offsets = best_fit(tensors, alignment, &order)?;
    MemoryPlan::verified(tensors, alignment, offsets, lb, false, "greedy_by_size")
}

/// The order greedy-by-size uses: size descending, then lifetime length descending, then index.
pub(crate) fn size_order(tensors: &[TensorLife]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_unstable_by_key(|&i| {
        let t = tensors[i];
        (std::cmp::Reverse(t.size), std::cmp::Reverse(t.last - t.first), i)
    });
    order
}

/// Size times lifetime length descending, then index.
pub(crate) fn area_order(tensors: &[TensorLife]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_cached_key(|&i| {
        let t = tensors[i];
        let width = u128::from(t.last - t.first) + 1;
        (std::cmp::Reverse(u128::from(t.size) * width), i)
    });
    order
}

/// Best-fit placement in the given order (the engine behind [`greedy_by_size`]).
///
/// Placed tensors are kept sorted by offset (structure of arrays, for a fast scan). For each new
/// tensor the scan walks them in offset order, skips those whose lifetime does not overlap it,
/// and remembers the smallest gap between overlapping ones that can hold it.
pub(crate) fn best_fit(tensors: &[TensorLife], alignment: u64, order: &[usize]) -> Result<Vec<u64>, Error> {
    best_fit_within(tensors, alignment, order, 0, &[])
}

/// [`best_fit`] for a buffer of segments of `seam` bytes (0: one buffer): each tensor goes at
/// the lowest aligned offset of a gap at which it does not cross a seam (one larger than a
/// segment, at a seam), as [`super::plan_segmented`] promises. `fixed`: tensors already
/// placed, at their offsets (not in `order`).
pub(crate) fn best_fit_within(
    tensors: &[TensorLife],
    alignment: u64,
    order: &[usize],
    seam: u64,
    fixed: &[(usize, u64)],
) -> Result<Vec<u64>, Error> {
    let n = tensors.len();
    let mut offsets = vec![0u64; n];
    // Placed tensors in offset order: lifetimes, offset, aligned end.
    let (mut p_first, mut p_last) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut p_off, mut p_top) = (Vec::<u64>::with_capacity(n), Vec::with_capacity(n));
    let mut fixed = fixed.to_vec();
    fixed.sort_unstable_by_key(|&(_, o)| o);
    for (i, off) in fixed {
        let end = off.checked_add(tensors[i].size).ok_or_else(|| overflow(i))?;
        p_first.push(tensors[i].first);
        p_last.push(tensors[i].last);
        p_off.push(off);
        p_top.push(align_up(end, alignment).unwrap_or(u64::MAX));
        offsets[i] = off;
    }
    for &i in order {
        let t = tensors[i];
        let mut prev = 0u64;
        let mut best: Option<(u64, u64)> = None; // (gap, offset)
        for k in 0..p_off.len() {
            if p_last[k] < t.first || p_first[k] > t.last {
                continue;
            }
            let cur = p_off[k];
            if cur >= prev {
                let gap = cur - prev;
                let at = within_segment(prev, t.size, seam)
                    .filter(|a| a.checked_add(t.size).is_some_and(|e| e <= cur));
                if let Some(at) = at.filter(|_| best.is_none_or(|(g, _)| gap < g)) {
                    best = Some((gap, at));
                }
            }
            prev = prev.max(p_top[k]);
        }
        let off = match best {
            Some((_, o)) => o,
            None => within_segment(prev, t.size, seam).ok_or_else(|| overflow(i))?,
        };
        let end = off.checked_add(t.size).ok_or_else(|| overflow(i))?;
        // Nothing can go above a tensor whose aligned end is past u64.
        let top = align_up(end, alignment).unwrap_or(u64::MAX);
        let at = p_off.partition_point(|&o| o <= off);
        p_first.insert(at, t.first);
        p_last.insert(at, t.last);
        p_off.insert(at, off);
        p_top.insert(at, top);
        offsets[i] = off;
    }
    Ok(offsets)
}

/// The lowest offset from `at` where `size` bytes cross no multiple of `seam` (0: `at`
/// itself); more than `seam` bytes start at one. `None` past `u64`.
pub(crate) fn within_segment(at: u64, size: u64, seam: u64) -> Option<u64> {
    if seam == 0 || at.is_multiple_of(seam) {
        return Some(at);
    }
    let end = at.checked_add(size)?;
    // No multiple of `seam` above `at` within u64: the last window, cut off, has no seam.
    let Some(next) = (at / seam + 1).checked_mul(seam) else { return (size <= seam).then_some(at) };
    match size > seam || end > next {
        true => Some(next),
        false => Some(at),
    }
}

/// One "shared object" of [`executorch_greedy`]: a slab with members at offsets inside it.
struct SharedObject {
    size: u64,
    members: Vec<(usize, u64)>,
}

/// ExecuTorch's `greedy` memory planner (`exir/memory_planning.py`, the current version with
/// `allow_overlapping_allocations`, at its default `True`, and no extra padding), re-implemented:
///
/// 1. every size is rounded up to `alignment` (`TensorSpec.realign`);
/// 2. tensors are taken largest first (ExecuTorch inserts them with `bisect.insort` and then
///    reverses, so equal sizes go by descending index here);
/// 3. `pick_shared_obj`: the tensor joins the *first* shared object (in creation order) none of
///    whose members' lifetimes overlap its own, at offset 0 inside it; failing that, the first
///    object where it fits above the highest member that does overlap it (at that member's end,
///    if it still ends within the object's size); failing that, it opens a new object of its
///    own size. Objects never grow;
/// 4. `materialize_buffer`: objects are laid out one after another in creation order.
///
/// Older ExecuTorch releases walked tensors in graph order and picked the available object
/// closest in size instead; the version above is the one current ExecuTorch runs by default.
pub fn executorch_greedy(tensors: &[TensorLife], alignment: u64) -> Result<MemoryPlan, Error> {
    validate(tensors, alignment)?;
    let lb = lower_bound(tensors)?;
    let mut sizes = Vec::with_capacity(tensors.len());
    for (i, t) in tensors.iter().enumerate() {
        sizes.push(align_up(t.size, alignment).ok_or_else(|| overflow(i))?);
    }
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_unstable_by_key(|&i| (std::cmp::Reverse(sizes[i]), std::cmp::Reverse(i)));
    let overlaps =
        |a: usize, b: usize| tensors[a].first <= tensors[b].last && tensors[b].first <= tensors[a].last;
    let mut objects: Vec<SharedObject> = Vec::new();
    let mut home = vec![(0usize, 0u64); tensors.len()]; // (object, offset inside it)
    for &i in &order {
        let free = objects.iter().position(|o| o.members.iter().all(|&(m, _)| !overlaps(i, m)));
        let spot = free.map(|k| (k, 0)).or_else(|| {
            objects.iter().enumerate().find_map(|(k, o)| {
                let top = o
                    .members
                    .iter()
                    .filter(|&&(m, _)| overlaps(i, m))
                    .map(|&(m, off)| off.saturating_add(sizes[m]))
                    .max()
                    .unwrap_or(0);
                (top > 0 && top.checked_add(sizes[i]).is_some_and(|end| end <= o.size)).then_some((k, top))
            })
        });
        let (k, off) = match spot {
            Some(s) => s,
            None => {
                objects.push(SharedObject { size: sizes[i], members: Vec::new() });
                (objects.len() - 1, 0)
            }
        };
        if let Some(o) = objects.get_mut(k) {
            o.members.push((i, off));
        }
        home[i] = (k, off);
    }
    let mut bases = Vec::with_capacity(objects.len());
    let mut total = 0u64;
    for o in &objects {
        bases.push(total);
        total = total.checked_add(o.size).ok_or_else(|| overflow(o.members.first().map_or(0, |m| m.0)))?;
    }
    let mut offsets = Vec::with_capacity(tensors.len());
    for (i, &(k, off)) in home.iter().enumerate() {
        let base = bases.get(k).copied().unwrap_or(0);
        offsets.push(base.checked_add(off).ok_or_else(|| overflow(i))?);
    }
    MemoryPlan::verified(tensors, alignment, offsets, lb, false, "executorch_greedy")
}
