//! When the hostile model check (`model.rs`) lets an allocator refuse a valid allocation: only
//! where a limit the allocator itself reports makes it right ([`Limits`]), each refusal checked
//! as it happens, and refusals a minority over the whole check ([`few_refusals`]).
use devalloc::{AllocatorStats, DeviceAllocator};

/// What may make an allocator refuse a valid request, as the allocator itself says.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Its memory limit on device 0 (from its snapshot), if any.
    pub memory: Option<u64>,
    /// The largest block device 0 makes (wgpu: `max_allocation`, the device's
    /// `max_buffer_size`); `u64::MAX` where the allocator does not say.
    pub largest: u64,
}

impl Limits {
    /// What `a` reports of its limits on device 0.
    pub fn of(a: &dyn DeviceAllocator) -> Limits {
        let want = format!("{}:0", a.device_type());
        let memory =
            a.snapshot().ok().and_then(|s| s.devices.into_iter().find(|d| d.device == want)?.memory_limit);
        Limits { memory, largest: largest_block(a) }
    }

    /// Whether `TooLarge` is the right answer to `size` bytes: past the limit or the device's
    /// largest block, in whole 4-byte granules (wgpu's copy alignment; host memory's granule
    /// is 1, so up to 3 bytes of leeway there).
    pub fn too_large(&self, size: usize) -> bool {
        granules(size) > self.memory.unwrap_or(u64::MAX).min(self.largest)
    }
}

/// `size` in whole 4-byte granules, as bytes.
fn granules(size: usize) -> u64 {
    (size as u64).div_ceil(4) * 4
}

#[cfg(feature = "wgpu")]
fn largest_block(a: &dyn DeviceAllocator) -> u64 {
    let wgpu = a.as_any().and_then(|a| a.downcast_ref::<devalloc::wgpu::WgpuAllocator>());
    wgpu.and_then(|w| w.max_allocation(0).ok()).unwrap_or(u64::MAX)
}

#[cfg(not(feature = "wgpu"))]
fn largest_block(_: &dyn DeviceAllocator) -> u64 {
    u64::MAX
}

/// Valid allocations made and refused, over a run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tally {
    /// Allocations made.
    pub made: u64,
    /// Valid allocations refused (`OutOfMemory` or `TooLarge`), each where a limit made it right.
    pub refused: u64,
}

/// An allocation of `size` bytes refused as out of memory (the stats `before` it): right only
/// under a memory limit it would pass, as held before the call, and still with every cached
/// block given back (`empty_cache` gives back every whole cached block; what stays held is
/// live, or the free ranges of split blocks with a live piece, which the pool could not use
/// for it either).
pub fn out_of_memory_was_right(
    a: &dyn DeviceAllocator,
    limits: &Limits,
    size: usize,
    before: &AllocatorStats,
) -> Result<(), String> {
    let Some(limit) = limits.memory else {
        return Err(format!("allocate({size}) ran out of memory with no memory limit set: {before:?}"));
    };
    if before.reserved_bytes + granules(size) <= limit {
        return Err(format!(
            "allocate({size}) ran out of memory with room under the limit {limit}: {before:?}"
        ));
    }
    a.empty_cache();
    let s = a.stats(0).map_err(|e| e.to_string())?;
    if s.reserved_bytes + granules(size) <= limit {
        return Err(format!(
            "allocate({size}) ran out of memory although it fits under the limit {limit} with the cache given \
             back: {s:?}"
        ));
    }
    Ok(())
}

/// Each refusal was checked against a limit as it happened; over the whole check they must
/// also stay a minority of the valid allocations (the sequences hold at most a few dozen KiB
/// live, under limits of 64 KiB and more), so an allocator that refuses most small requests
/// fails even where each refusal could be argued.
pub fn few_refusals(total: Tally) {
    eprintln!("model check: {} valid allocations made, {} refused", total.made, total.refused);
    assert!(
        total.made > 0 && total.refused < total.made,
        "model check: {} valid allocations made, {} refused: refusals must be a minority",
        total.made,
        total.refused
    );
}
