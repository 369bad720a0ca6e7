//! Comparing a GPU's output with the CPU's, blind to neither NaN nor a short output.
//!
//! `f32::max` drops NaN (`0f32.max(f32::NAN)` is 0), and `zip` stops at the shorter side, so
//! a fold of `max` over zipped pairs passes an all-NaN or an empty output. Here a length
//! mismatch or an empty output is an error, a NaN or infinite difference makes the result NaN
//! or infinite, and [`within`] holds only for a finite error at or below the tolerance.
#![allow(dead_code)]

/// The largest `|got - want|`, NaN if any difference is NaN (a NaN on either side), infinite
/// if any is infinite.
///
/// # Errors
///
/// `got` and `want` of different lengths, or both empty: there is nothing to compare.
pub fn max_abs_error(got: &[f32], want: &[f32]) -> Result<f32, String> {
    if got.len() != want.len() {
        return Err(format!("the output has {} values, the CPU's {}", got.len(), want.len()));
    }
    if got.is_empty() {
        return Err("the output is empty: nothing was compared".into());
    }
    Ok(got.iter().zip(want).map(|(g, w)| (g - w).abs()).fold(0f32, worse))
}

/// The larger of two errors, NaN if either is (not `f32::max`, which drops a NaN).
pub fn worse(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}

/// Whether `worst` (from [`max_abs_error`]) is a finite error at or below `tolerance`: false for
/// NaN, which no comparison passes.
pub fn within(worst: f32, tolerance: f32) -> bool {
    worst.is_finite() && worst <= tolerance
}
