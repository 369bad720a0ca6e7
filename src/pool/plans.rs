//! Planned buffers on a pool: the seed's `init_buffer` / `get_offset_address`.

use super::{lock, Pool};
use crate::allocator::DEFAULT_ALIGNMENT;
use crate::checks::len64;
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
