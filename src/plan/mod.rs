//! Memory plans (stub while the planner lands): the tensors a plan places.

mod csv;

pub use csv::Instance;

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
