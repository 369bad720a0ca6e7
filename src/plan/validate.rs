//! Input validation, the lower bound and the plan checker.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use super::{Error, TensorLife};

/// Refuses an alignment that is zero or not a power of two.
pub(crate) fn validate_alignment(alignment: u64) -> Result<(), Error> {
    if alignment == 0 || !alignment.is_power_of_two() {
        return Err(Error::invalid_argument(format!("alignment {alignment} is not a power of two >= 1")));
    }
    Ok(())
}

/// Refuses a tensor of size 0 or with `first > last`.
pub(crate) fn validate_tensors(tensors: &[TensorLife]) -> Result<(), Error> {
    for (i, t) in tensors.iter().enumerate() {
        if t.size == 0 {
            return Err(Error::invalid_argument(format!("tensor {i}: size is 0")));
        }
        if t.first > t.last {
            return Err(Error::invalid_argument(format!(
                "tensor {i}: first step {} is after last step {}",
                t.first, t.last
            )));
        }
    }
    Ok(())
}

/// Validates tensors and alignment together.
pub(crate) fn validate(tensors: &[TensorLife], alignment: u64) -> Result<(), Error> {
    validate_alignment(alignment)?;
    validate_tensors(tensors)
}

/// Rounds `value` up to a multiple of `alignment` (a power of two), or `None` past `u64`.
pub(crate) fn align_up(value: u64, alignment: u64) -> Option<u64> {
    let mask = alignment.wrapping_sub(1);
    value.checked_add(mask).map(|v| v & !mask)
}

/// The largest `offset + size` over all tensors (0 for none); errors past `u64`.
pub(crate) fn plan_size(tensors: &[TensorLife], offsets: &[u64]) -> Result<u64, Error> {
    let mut size = 0u64;
    for (i, (t, &o)) in tensors.iter().zip(offsets).enumerate() {
        let end = o.checked_add(t.size).ok_or_else(|| {
            Error::invalid_argument(format!("tensor {i}: offset {o} + size {} is past u64", t.size))
        })?;
        size = size.max(end);
    }
    Ok(size)
}

/// The lower bound on any plan's size: the largest total of sizes live at any one step.
///
/// Errors: a tensor of size 0, `first > last`, or a total past `u64` (naming the tensor whose
/// addition overflowed).
pub fn lower_bound(tensors: &[TensorLife]) -> Result<u64, Error> {
    validate_tensors(tensors)?;
    let mut starts: Vec<usize> = (0..tensors.len()).collect();
    starts.sort_unstable_by_key(|&i| tensors[i].first);
    let mut ends: Vec<usize> = starts.clone();
    ends.sort_unstable_by_key(|&i| tensors[i].last);
    let (mut live, mut best, mut e) = (0u64, 0u64, 0usize);
    for &i in &starts {
        let t = tensors[i];
        // Everything that ended before this start is no longer live.
        while let Some(&j) = ends.get(e) {
            if tensors[j].last >= t.first {
                break;
            }
            live -= tensors[j].size;
            e += 1;
        }
        live = live.checked_add(t.size).ok_or_else(|| {
            Error::invalid_argument(format!("tensor {i}: total size live at step {} is past u64", t.first))
        })?;
        best = best.max(live);
    }
    Ok(best)
}

/// Checks a placement: one offset per tensor, every offset a multiple of `alignment`, every
/// tensor within `size` bytes, and no two tensors live at a common step sharing a byte.
///
/// Runs a sweep over steps with an ordered map of the live tensors' byte ranges, so it takes
/// O(n log n) time. The error names the offending tensor (or pair of tensors).
pub fn check(tensors: &[TensorLife], alignment: u64, offsets: &[u64], size: u64) -> Result<(), Error> {
    validate(tensors, alignment)?;
    if offsets.len() != tensors.len() {
        return Err(Error::invalid_argument(format!(
            "offsets has {} entries for {} tensors",
            offsets.len(),
            tensors.len()
        )));
    }
    let mut ends = Vec::with_capacity(tensors.len());
    for (i, (t, &o)) in tensors.iter().zip(offsets).enumerate() {
        if o % alignment != 0 {
            return Err(Error::invalid_argument(format!(
                "tensor {i}: offset {o} is not a multiple of alignment {alignment}"
            )));
        }
        match o.checked_add(t.size) {
            Some(end) if end <= size => ends.push(end),
            _ => {
                return Err(Error::invalid_argument(format!(
                    "tensor {i}: offset {o} + size {} is past the planned size {size}",
                    t.size
                )))
            }
        }
    }
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_unstable_by_key(|&i| (tensors[i].first, i));
    // Live tensors by (offset, index) -> end; pairwise disjoint at all times.
    let mut live: BTreeMap<(u64, usize), u64> = BTreeMap::new();
    let mut expiry: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    for &i in &order {
        let t = tensors[i];
        while let Some(&Reverse((last, j))) = expiry.peek() {
            if last >= t.first {
                break;
            }
            expiry.pop();
            live.remove(&(offsets[j], j));
        }
        let key = (offsets[i], i);
        let below = live.range(..key).next_back().filter(|(_, &end)| end > offsets[i]);
        let above = live.range(key..).next().filter(|((o, _), _)| *o < ends[i]);
        if let Some((&(_, j), _)) = below.or(above) {
            let (a, b) = (i.min(j), i.max(j));
            return Err(Error::invalid_argument(format!(
                "tensors {a} and {b} overlap: both are live at step {} and share bytes \
                 (offsets {} and {})",
                t.first, offsets[a], offsets[b]
            )));
        }
        live.insert(key, ends[i]);
        expiry.push(Reverse((t.last, i)));
    }
    Ok(())
}
