//! Static memory planning: give every tensor of a run an offset in one buffer so that tensors
//! live at a common step never share a byte, and make that buffer as small as possible.
//!
//! This is the dynamic storage allocation problem (NP-hard). [`plan`] offers two strategies:
//!
//! * [`Strategy::Fast`] runs a portfolio of greedy planners (greedy-by-size among them), then
//!   search-guided greedy dives and a short run of the exact search under a fixed *work*
//!   budget, and keeps the smallest valid result: deterministic, never worse than
//!   [`greedy_by_size`], tens of milliseconds at most on hundreds of tensors, well under a
//!   second on ten thousand.
//! * [`Strategy::Search`] does what `Fast` does, then keeps running a branch-and-bound search in
//!   the style of MiniMalloc (Moffitt, ASPLOS 2023) over *canonical* placements, narrowing the
//!   buffer size until it reaches the [`lower_bound`], proves that nothing smaller fits, or the
//!   time budget ends.
//!
//! The peers a caller may pick instead, [`one_after_another`], [`greedy_by_size`] and
//! [`executorch_greedy`], and every plan that [`plan`] returns, are verified with [`check`]
//! before they are handed out. Bad input is an [`Error::InvalidArgument`] that names the tensor,
//! never a panic.
//!
//! ```
//! use devalloc::plan::{plan, Strategy, TensorLife};
//! // Three activations: the first and the last are never live at once, so they share bytes.
//! let tensors = [
//!     TensorLife { size: 4096, first: 0, last: 1 },
//!     TensorLife { size: 1024, first: 1, last: 2 },
//!     TensorLife { size: 4096, first: 2, last: 3 },
//! ];
//! let p = plan(&tensors, 256, Strategy::Fast)?; // offsets at multiples of 256
//! assert_eq!(p.size(), p.lower_bound()); // 5120 bytes, not 9216 one after another
//! assert_eq!(p.offsets()[0], p.offsets()[2]);
//! # Ok::<(), devalloc::Error>(())
//! ```
//!
//! [`crate::PlannedMemory::from_plan`] allocates a plan's buffer, and
//! [`crate::PlannedMemory::tensor`] gives each tensor's address. For a buffer past one wgpu
//! buffer's limit, [`plan_segmented`] keeps each tensor within one of its segments.
mod csv;
mod dive;
mod driver;
mod frames;
mod heuristics;
mod preorder;
mod problem;
mod search;
mod segments;
mod state;
mod validate;

pub use csv::Instance;
pub use heuristics::{executorch_greedy, greedy_by_size, one_after_another};
pub use segments::{check_segments, plan_segmented};
pub use validate::{check, lower_bound};

use crate::error::Error;

/// One tensor to place: `size` bytes, live from step `first` through step `last` (inclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorLife {
    /// Bytes the tensor needs (must be at least 1).
    pub size: u64,
    /// First step at which the tensor is live.
    pub first: u64,
    /// Last step at which the tensor is live (inclusive; must be `>= first`).
    pub last: u64,
}

/// How hard [`plan`] should work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Greedy heuristics, search-guided dives and a short exact search under a fixed work
    /// budget; meant for load time. Deterministic, and never worse than [`greedy_by_size`].
    Fast,
    /// `Fast`, then a branch-and-bound search that keeps improving the plan until it reaches the
    /// lower bound, proves that no smaller buffer fits, or `budget_ms` milliseconds have passed.
    /// Never worse than [`Strategy::Fast`].
    Search {
        /// Wall-clock budget in milliseconds (the `Fast` part always runs in full first).
        budget_ms: u64,
    },
}

/// Offsets for every tensor of a planning problem, already verified with [`check`].
#[derive(Clone, Debug)]
pub struct MemoryPlan {
    offsets: Vec<u64>,
    sizes: Vec<u64>,
    size: u64,
    lower_bound: u64,
    alignment: u64,
    optimal: bool,
    method: &'static str,
}

impl MemoryPlan {
    /// Offset of each tensor in bytes, in input order.
    pub fn offsets(&self) -> &[u64] {
        &self.offsets
    }

    /// Tensor `i`'s (offset, size) in the planned buffer, if there is a tensor `i`.
    pub fn tensor(&self, i: usize) -> Option<(u64, u64)> {
        Some((*self.offsets.get(i)?, *self.sizes.get(i)?))
    }

    /// How many tensors the plan places.
    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    /// Whether it places none.
    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// Bytes the planned buffer needs: the largest `offset + size` over all tensors.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The largest total of (unrounded) sizes live at any one step; no plan can be smaller.
    pub fn lower_bound(&self) -> u64 {
        self.lower_bound
    }

    /// The alignment every offset is a multiple of.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// True when the size equals the lower bound, or the search proved that no smaller size
    /// fits.
    pub fn is_optimal(&self) -> bool {
        self.optimal
    }

    /// Which algorithm produced this plan (for reports), for example `"greedy_by_size"` or
    /// `"search"`.
    pub fn method(&self) -> &'static str {
        self.method
    }

    /// Builds a plan from offsets, verifying it with [`check`] first.
    pub(crate) fn verified(
        tensors: &[TensorLife],
        alignment: u64,
        offsets: Vec<u64>,
        lower_bound: u64,
        proven_optimal: bool,
        method: &'static str,
    ) -> Result<MemoryPlan, Error> {
        let size = validate::plan_size(tensors, &offsets)?;
        check(tensors, alignment, &offsets, size)?;
        let optimal = proven_optimal || size == lower_bound;
        let sizes = tensors.iter().map(|t| t.size).collect();
        Ok(MemoryPlan { offsets, sizes, size, lower_bound, alignment, optimal, method })
    }
}

/// Plans offsets for `tensors` (each offset a multiple of `alignment`, a power of two `>= 1`)
/// with the given [`Strategy`]. An empty list gives an empty plan of size 0.
///
/// Errors: a tensor of size 0, a tensor whose `first` is after its `last`, an alignment that is
/// zero or not a power of two, or sizes whose totals do not fit in `u64`.
pub fn plan(tensors: &[TensorLife], alignment: u64, strategy: Strategy) -> Result<MemoryPlan, Error> {
    match strategy {
        Strategy::Fast => driver::fast(tensors, alignment),
        Strategy::Search { budget_ms } => driver::search(tensors, alignment, budget_ms),
    }
}
