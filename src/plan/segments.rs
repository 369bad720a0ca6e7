//! Plans for a buffer past one device buffer's limit: [`plan_segmented`] and
//! [`check_segments`].

use super::heuristics::{area_order, best_fit_within, size_order, within_segment};
use super::validate::{lower_bound, validate, validate_tensors};
use super::{plan, Error, MemoryPlan, Strategy, TensorLife};

/// Plans like [`plan`], for a buffer that will be several device buffers of `segment` bytes
/// each (a wgpu allocation past the buffer limit: `WgpuAllocator::segment_size`): no tensor
/// of at most `segment` bytes crosses a multiple of `segment`, so each lies in one buffer and
/// binds on its own; a larger one starts at a multiple of it (it must span buffers; it then
/// binds as whole segments). `segment` must be a non-zero multiple of `alignment`.
///
/// [`plan`]'s result is kept where it already keeps to the seams; otherwise the smallest of
/// that plan with its crossing tensors placed again around the rest, and best fit by size and
/// by area from scratch, each placing a tensor only where it crosses no seam (`method()` says
/// which). Verified with [`super::check`] and [`check_segments`].
///
/// ```
/// use devalloc::plan::{check_segments, plan_segmented, Strategy, TensorLife};
/// let t = |size, first, last| TensorLife { size, first, last };
/// let tensors = [t(3000, 0, 1), t(2000, 1, 2), t(5000, 2, 3)];
/// let p = plan_segmented(&tensors, 256, 4096, Strategy::Fast)?;
/// check_segments(&tensors, p.offsets(), 4096)?; // 2000 bytes never at 3072..5072
/// # Ok::<(), devalloc::Error>(())
/// ```
pub fn plan_segmented(
    tensors: &[TensorLife],
    alignment: u64,
    segment: u64,
    strategy: Strategy,
) -> Result<MemoryPlan, Error> {
    validate(tensors, alignment)?;
    if segment == 0 || !segment.is_multiple_of(alignment) {
        return Err(Error::invalid_argument(format!(
            "a plan's segment of {segment} bytes must be a non-zero multiple of its alignment {alignment}"
        )));
    }
    let free = plan(tensors, alignment, strategy)?;
    if check_segments(tensors, free.offsets(), segment).is_ok() {
        return Ok(free);
    }
    let lb = lower_bound(tensors)?;
    // The unconstrained plan with only the tensors that cross a seam placed again, largest
    // first, around the rest; and best fit by size and by area from scratch.
    let at = free.offsets();
    let (crossing, kept): (Vec<usize>, Vec<usize>) =
        (0..tensors.len()).partition(|&i| within_segment(at[i], tensors[i].size, segment) != Some(at[i]));
    let kept: Vec<(usize, u64)> = kept.into_iter().map(|i| (i, at[i])).collect();
    let mut crossing_order = crossing;
    crossing_order.sort_unstable_by_key(|&i| (std::cmp::Reverse(tensors[i].size), i));
    let tries = [
        (crossing_order, kept, "the plan, crossing tensors moved"),
        (size_order(tensors), Vec::new(), "greedy_by_size within segments"),
        (area_order(tensors), Vec::new(), "best_fit_by_area within segments"),
    ];
    let mut best: Option<MemoryPlan> = None;
    for (order, fixed, method) in tries {
        let offsets = best_fit_within(tensors, alignment, &order, segment, &fixed)?;
        let p = MemoryPlan::verified(tensors, alignment, offsets, lb, false, method)?;
        if best.as_ref().is_none_or(|b| p.size() < b.size()) {
            best = Some(p);
        }
    }
    let best = best.expect("three were tried");
    check_segments(tensors, best.offsets(), segment)?;
    Ok(best)
}

/// Checks that `offsets` keep every tensor within one `segment` of the buffer unless it is
/// larger than one, and that such a one starts at a multiple of `segment` (what
/// [`plan_segmented`] promises); an error names the first tensor that does not, or that is
/// not a tensor (size 0, `first > last`) or ends past `u64`.
pub fn check_segments(tensors: &[TensorLife], offsets: &[u64], segment: u64) -> Result<(), Error> {
    if segment == 0 || offsets.len() != tensors.len() {
        return Err(Error::invalid_argument(format!(
            "check_segments: a segment of {segment} bytes and {} offsets for {} tensors",
            offsets.len(),
            tensors.len()
        )));
    }
    validate_tensors(tensors)?;
    for (i, (t, &at)) in tensors.iter().zip(offsets).enumerate() {
        if at.checked_add(t.size).is_none() {
            return Err(Error::invalid_argument(format!(
                "tensor {i}: offset {at} plus its {} bytes is past u64",
                t.size
            )));
        }
        if within_segment(at, t.size, segment) != Some(at) {
            return Err(Error::invalid_argument(format!(
                "tensor {i}: {} bytes at offset {at} cross a seam between buffers of {segment} bytes",
                t.size
            )));
        }
    }
    Ok(())
}
