//! Memory-planned pools: the seed's `init_buffer` / `get_offset_address`.
//!
//! A memory plan (ExecuTorch's, or any ahead-of-time planner's) says how many bytes each
//! memory id needs; every planned tensor then lives at `pool(memory_id) + offset`. Two pieces:
//!
//! - [`PlanTable`]: the bookkeeping (memory id -> pool), bounds-checked lookups. The built-in
//!   allocators keep one per device behind [`crate::DeviceAllocator::init_buffer`].
//! - [`PlannedMemory`]: an owner of all the pools of one plan on one device, over any
//!   allocator; it frees them on drop (ExecuTorch's `HierarchicalAllocator`).
//!
//! Protocol: `init` each memory id once (a second `init` of the same id is an error, release
//! first), then ask for addresses; `release` frees the pools. Addresses handed out earlier are
//! invalid after the release.
#![deny(unsafe_code)]

use std::collections::BTreeMap;

use crate::allocator::{DeviceAllocator, DEFAULT_ALIGNMENT};
use crate::device::{Device, DeviceIndex};
use crate::error::{Error, Result};
use crate::ptr::DevicePtr;

/// Memory id -> (base address, size) for the planned pools of one device.
#[derive(Debug, Default)]
pub struct PlanTable {
    pools: BTreeMap<u32, (DevicePtr, u64)>,
}

impl PlanTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records pool `memory_id` at `base`, `nbytes` long; an error if the id is taken.
    pub fn insert(&mut self, device: Device, memory_id: u32, base: DevicePtr, nbytes: u64) -> Result<()> {
        if self.pools.contains_key(&memory_id) {
            return Err(Self::already_initialised(device, memory_id));
        }
        self.pools.insert(memory_id, (base, nbytes));
        Ok(())
    }

    /// The error for a second `init` of `memory_id`.
    pub fn already_initialised(device: Device, memory_id: u32) -> Error {
        Error::invalid_argument(format!(
            "memory id {memory_id} is already initialised on {device}; release the plan's buffers first"
        ))
    }

    /// Whether `memory_id` has a pool.
    pub fn contains(&self, memory_id: u32) -> bool {
        self.pools.contains_key(&memory_id)
    }

    /// `pool(memory_id) + offset`, checked so that `nbytes` bytes from there fit in the pool.
    pub fn offset_address(
        &self,
        device: Device,
        memory_id: u32,
        offset: usize,
        nbytes: usize,
    ) -> Result<DevicePtr> {
        let &(base, size) = self.pools.get(&memory_id).ok_or_else(|| {
            Error::not_found(format!(
                "memory id {memory_id} is not initialised on {device} (call init_buffer first)"
            ))
        })?;
        let end = (offset as u64).checked_add(nbytes as u64);
        if end.is_none_or(|end| end > size) {
            return Err(Error::OutOfBounds {
                device,
                what: format!("planned buffer {memory_id}"),
                offset: offset as u64,
                len: nbytes as u64,
                size,
            });
        }
        base.offset(offset)
    }

    /// Removes every pool, returning their base addresses (null for empty ones) to be freed.
    pub fn take_all(&mut self) -> Vec<(u32, DevicePtr)> {
        std::mem::take(&mut self.pools).into_iter().map(|(id, (base, _))| (id, base)).collect()
    }

    /// Number of pools.
    pub fn len(&self) -> usize {
        self.pools.len()
    }

    /// Whether there are no pools.
    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }
}

/// The pools of one memory plan on one device, over any [`DeviceAllocator`], freed on drop.
///
/// ```
/// # use devalloc::{HostAllocator, PlannedMemory};
/// let host = HostAllocator::new();
/// // Memory id 0 is unused by this plan, id 1 needs 4 KiB, id 2 needs 64 bytes.
/// let plan = PlannedMemory::new(&host, 0, &[0, 4096, 64])?;
/// let tensor = plan.get_offset_address(1, 1024, 512)?; // 512 bytes at offset 1 KiB
/// assert!(plan.get_offset_address(2, 32, 64).is_err()); // runs past the pool
/// # Ok::<(), devalloc::Error>(())
/// ```
#[doc(alias = "HierarchicalAllocator")]
pub struct PlannedMemory<'a> {
    allocator: &'a dyn DeviceAllocator,
    index: DeviceIndex,
    table: PlanTable,
}

impl<'a> PlannedMemory<'a> {
    /// Allocates one pool per entry of `sizes` (memory id = position) on device `index`. A
    /// size of 0 makes an empty pool (null base) that serves only 0-byte addresses. On failure
    /// the pools already made are freed.
    pub fn new(allocator: &'a dyn DeviceAllocator, index: DeviceIndex, sizes: &[usize]) -> Result<Self> {
        let mut plan = PlannedMemory { allocator, index, table: PlanTable::new() };
        let device = plan.device();
        for (id, &size) in sizes.iter().enumerate() {
            let id = u32::try_from(id).map_err(|_| Error::invalid_argument("more than 2^32 memory ids"))?;
            let base = if size == 0 {
                DevicePtr::NULL
            } else {
                allocator.allocate(size, index, DEFAULT_ALIGNMENT)?
            };
            plan.table.insert(device, id, base, size as u64)?;
        }
        Ok(plan)
    }

    /// The device the pools live on.
    pub fn device(&self) -> Device {
        Device::new(self.allocator.device_type(), self.index)
    }

    /// Number of memory ids in the plan.
    pub fn num_buffers(&self) -> usize {
        self.table.len()
    }

    /// `pool(memory_id) + offset`, checked so that `nbytes` bytes from there fit in the pool.
    pub fn get_offset_address(&self, memory_id: u32, offset: usize, nbytes: usize) -> Result<DevicePtr> {
        self.table.offset_address(self.device(), memory_id, offset, nbytes)
    }
}

impl Drop for PlannedMemory<'_> {
    fn drop(&mut self) {
        for (id, base) in self.table.take_all() {
            if base.is_null() {
                continue;
            }
            if let Err(e) = self.allocator.deallocate(base, self.index) {
                log::error!("devalloc: freeing planned buffer {id} on {}: {e}", self.device());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceType;

    #[test]
    fn table_checks_ids_and_bounds() {
        let d = Device::new(DeviceType::Cpu, 0);
        let mut t = PlanTable::new();
        t.insert(d, 3, DevicePtr::new(0x1000), 100).unwrap();
        assert!(t
            .insert(d, 3, DevicePtr::new(0x2000), 10)
            .unwrap_err()
            .to_string()
            .contains("already initialised"));
        assert_eq!(t.offset_address(d, 3, 40, 60).unwrap().addr(), 0x1028);
        assert_eq!(t.offset_address(d, 3, 100, 0).unwrap().addr(), 0x1064);
        assert!(matches!(t.offset_address(d, 3, 41, 60), Err(Error::OutOfBounds { .. })));
        assert!(matches!(t.offset_address(d, 3, usize::MAX, 2), Err(Error::OutOfBounds { .. })));
        assert!(matches!(t.offset_address(d, 4, 0, 1), Err(Error::NotFound { .. })));
        assert_eq!(t.take_all().len(), 1);
        assert!(t.is_empty());
    }
}
