//! [`AllocatorStats`], what an allocator holds on one device: in the formats' layer, below the
//! snapshot that records them and the contract that returns them. Imports nothing from the
//! crate.

/// What an allocator holds on one device, in bytes and counts.
///
/// `allocated` counts the bytes callers asked for and still hold; `reserved` counts what the
/// allocator holds from the device for them, rounding and cached free blocks included. Staging
/// memory (the host-visible buffers a copy passes through) is counted apart, in
/// `staging_bytes`. Stats move only when a call succeeds (and when an allocation that ran
/// out of memory gave the cache back first), except `staging_bytes`, a gauge of what is held
/// right now: a failed copy can release staging, never take more. Marked `non_exhaustive`: start from
/// `AllocatorStats::default()` when writing an allocator of your own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct AllocatorStats {
    /// Bytes of live allocations, as requested.
    pub allocated_bytes: u64,
    /// Highest `allocated_bytes` seen.
    pub peak_allocated_bytes: u64,
    /// Bytes held from the device: live allocations after rounding, plus the cache.
    pub reserved_bytes: u64,
    /// Highest `reserved_bytes` seen.
    pub peak_reserved_bytes: u64,
    /// Bytes in freed blocks kept for reuse (part of `reserved_bytes`).
    pub cached_bytes: u64,
    /// Number of live allocations.
    pub live_allocations: u64,
    /// Successful allocations so far.
    pub allocations: u64,
    /// Successful deallocations so far.
    pub deallocations: u64,
    /// Allocations served from the cache.
    pub cache_hits: u64,
    /// Allocations that had to ask the device.
    pub cache_misses: u64,
    /// Bytes of staging buffers the allocator holds for copies right now (not part of
    /// `reserved_bytes`). wgpu's own staging inside `queue.write_buffer` is wgpu's, not counted.
    pub staging_bytes: u64,
}
