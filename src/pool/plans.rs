//! Planned buffers on a pool: the seed's `init_buffer` / `get_offset_address`, and the table
//! of them (`PlanTable`, which `crate::planned`'s owner type keeps too).

use std::collections::{BTreeMap, BTreeSet};

use super::{lock, Pool};
use crate::allocator::DEFAULT_ALIGNMENT;
use crate::checks::len64;
use crate::device::Device;
use crate::error::{Error, PointerProblem, Result};
use crate::ptr::DevicePtr;
use crate::snapshot::EventKind;
use crate::storage::Storage;

impl<S: Storage> Pool<S> {
    /// Allocates planned buffer `memory_id` (see [`crate::PlannedMemory`] for the protocol).
    pub fn init_buffer(&self, memory_id: u32, nbytes: usize) -> Result<DevicePtr> {
        // Claim the id first, so that a second init of it (another thread's, at the same
        // time) fails before it allocates anything.
        lock(&self.state).plans.claim(self.device, memory_id)?;
        let label = format!("planned buffer {memory_id}");
        let made = self.allocate_params(nbytes, DEFAULT_ALIGNMENT, Some(&label), S::Params::default());
        let mut state = lock(&self.state);
        state.plans.unclaim(memory_id);
        let base = made?;
        state.plans.insert(self.device, memory_id, base, len64(nbytes))?;
        self.note(|| EventKind::PlannedBuffer { memory_id, addr: base.addr(), size: len64(nbytes) });
        drop(state);
        Ok(base)
    }

    /// Allocates a planned buffer the caller keeps (`PlannedMemory`), noted as planned buffer
    /// `memory_id` in the history; freed with `deallocate`.
    pub fn allocate_planned(&self, memory_id: u32, nbytes: usize, alignment: usize) -> Result<DevicePtr> {
        let label = format!("planned buffer {memory_id}");
        let base = self.allocate_params(nbytes, alignment, Some(&label), S::Params::default())?;
        self.note(|| EventKind::PlannedBuffer { memory_id, addr: base.addr(), size: len64(nbytes) });
        Ok(base)
    }

    /// Names the tensors inside the allocation that starts at `ptr` (replacing earlier names),
    /// each checked to lie inside it.
    pub fn label_tensors(&self, ptr: DevicePtr, tensors: &[crate::snapshot::TensorNote]) -> Result<()> {
        let mut state = lock(&self.state);
        self.sweep_refused(&mut state);
        if let Some(e) = self.refusal(&state, ptr) {
            return Err(e);
        }
        let Some(live) = state.live.get_mut(&ptr.addr()) else {
            let problem = match self.pointer_problem(&state, ptr) {
                PointerProblem::Unknown if Self::find(&state, ptr.addr()).is_some() => {
                    PointerProblem::NotAllocationStart
                }
                p => p,
            };
            return Err(Error::InvalidPointer { ptr, device: self.device, problem });
        };
        let size = live.size;
        if let Some(t) = tensors.iter().find(|t| t.offset.checked_add(t.size).is_none_or(|end| end > size)) {
            return Err(Error::OutOfBounds {
                device: self.device,
                what: format!("tensor '{}' of the allocation at {ptr}", t.label),
                offset: t.offset,
                len: t.size,
                size,
            });
        }
        live.tensors = tensors.into();
        drop(state);
        self.note(|| EventKind::Tensors { addr: ptr.addr(), tensors: tensors.to_vec() });
        Ok(())
    }

    /// `buffer(memory_id) + offset`, bounds-checked for `nbytes`.
    pub fn get_offset_address(&self, memory_id: u32, offset: usize, nbytes: usize) -> Result<DevicePtr> {
        lock(&self.state).plans.offset_address(self.device, memory_id, offset, nbytes)
    }

    /// Frees every planned buffer, all of them even when one fails; reports the first failure.
    pub fn release_buffers(&self) -> Result<()> {
        let buffers = lock(&self.state).plans.take_all();
        let count = buffers.len() as u64;
        self.note(|| EventKind::ReleaseBuffers { count });
        let mut first = Ok(());
        for (_, base) in buffers {
            if let Err(e) = self.deallocate(base) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}

/// Memory id -> (base address, size) for the planned buffers of one device.
#[derive(Debug, Default)]
pub(crate) struct PlanTable {
    buffers: BTreeMap<u32, (DevicePtr, u64)>,
    /// Ids whose buffer is being allocated right now (by `init_buffer` on some thread).
    pending: BTreeSet<u32>,
}

impl PlanTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records planned buffer `memory_id` at `base`, `nbytes` long; an error if the id is taken.
    pub fn insert(&mut self, device: Device, memory_id: u32, base: DevicePtr, nbytes: u64) -> Result<()> {
        if self.buffers.contains_key(&memory_id) {
            return Err(Self::already_initialised(device, memory_id));
        }
        self.buffers.insert(memory_id, (base, nbytes));
        Ok(())
    }

    /// The error for a second `init` of `memory_id`.
    pub fn already_initialised(device: Device, memory_id: u32) -> Error {
        Error::invalid_argument(format!(
            "memory id {memory_id} is already initialised on {device}; release the plan's buffers first"
        ))
    }

    /// Whether `memory_id` has a planned buffer, or one is being made.
    pub fn contains(&self, memory_id: u32) -> bool {
        self.buffers.contains_key(&memory_id) || self.pending.contains(&memory_id)
    }

    /// Claims `memory_id` while its buffer is allocated; an error if it is taken.
    pub fn claim(&mut self, device: Device, memory_id: u32) -> Result<()> {
        if self.contains(memory_id) {
            return Err(Self::already_initialised(device, memory_id));
        }
        self.pending.insert(memory_id);
        Ok(())
    }

    /// Gives up a claim (the allocation failed, or the buffer was inserted).
    pub fn unclaim(&mut self, memory_id: u32) {
        self.pending.remove(&memory_id);
    }

    /// `buffer(memory_id) + offset`, checked so that `nbytes` bytes from there fit in it.
    pub fn offset_address(
        &self,
        device: Device,
        memory_id: u32,
        offset: usize,
        nbytes: usize,
    ) -> Result<DevicePtr> {
        let &(base, size) = self.buffers.get(&memory_id).ok_or_else(|| {
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

    /// (memory id, base, size) of every planned buffer.
    pub fn list(&self) -> Vec<(u32, DevicePtr, u64)> {
        self.buffers.iter().map(|(&id, &(base, size))| (id, base, size)).collect()
    }

    /// Removes every planned buffer, returning their base addresses (null for empty ones).
    pub fn take_all(&mut self) -> Vec<(u32, DevicePtr)> {
        std::mem::take(&mut self.buffers).into_iter().map(|(id, (base, _))| (id, base)).collect()
    }

    /// Number of planned buffers.
    pub fn len(&self) -> usize {
        self.buffers.len()
    }

    /// Whether there are none.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.buffers.is_empty()
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
