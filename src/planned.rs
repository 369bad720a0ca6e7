//! Memory plans: the seed's `init_buffer` / `get_offset_address`.
//!
//! A memory plan (ExecuTorch's, or any ahead-of-time planner's) says how many bytes each
//! memory id needs; one *planned buffer* is allocated per memory id, and every planned tensor
//! then lives at `buffer(memory_id) + offset`. Three pieces:
//!
//! - `PlanTable` (internal, in the pool's `plans.rs`, beneath this layer): the bookkeeping
//!   (memory id -> planned buffer), bounds-checked lookups. The built-in allocators' pools keep
//!   one per device behind [`crate::DeviceAllocator::init_buffer`]; [`PlannedMemory`] keeps its
//!   own.
//! - [`PlannedMemory`]: an owner of all the planned buffers of one plan on one device, over
//!   any allocator; it frees them on drop (ExecuTorch's `HierarchicalAllocator`).
//! - [`PlanLayout`]: a helper for writing a plan of your own, placing tensors at offsets that
//!   are multiples of an alignment (on wgpu, the device's binding alignment, so that every
//!   tensor can be bound on its own).
//!
//! Protocol: `init` each memory id once (a second `init` of the same id is an error, release
//! first), then ask for addresses; `release` frees the buffers. Addresses handed out earlier
//! are invalid after the release.

use crate::allocator::{DeviceAllocator, DEFAULT_ALIGNMENT};
use crate::device::{Device, DeviceIndex};
use crate::error::{Error, Result};
use crate::pool::PlanTable;
use crate::ptr::DevicePtr;

/// Lays out the tensors of a plan of your own, one after another, each at an offset that is
/// a multiple of `alignment`; [`PlanLayout::size`] is then the planned buffer's size.
///
/// ```
/// # use devalloc::PlanLayout;
/// let mut layout = PlanLayout::new(256)?; // e.g. WgpuAllocator::binding_alignment(0)
/// let a = layout.place(1000)?;
/// let b = layout.place(4)?;
/// assert_eq!((a, b, layout.size()), (0, 1024, 1028));
/// # Ok::<(), devalloc::Error>(())
/// ```
///
/// Where the planned buffer may pass one device buffer (wgpu: it is then several buffers,
/// `WgpuAllocator::segment_size` bytes each), [`PlanLayout::with_segments`] keeps every tensor
/// within one of them unless it is larger than one, so that each binds on its own.
#[derive(Clone, Debug)]
pub struct PlanLayout {
    alignment: usize,
    size: usize,
    /// Tensors do not cross a multiple of this unless larger (0: no such rule).
    segment: usize,
}

impl PlanLayout {
    /// An empty layout whose tensors start at multiples of `alignment` (a power of two).
    pub fn new(alignment: usize) -> Result<Self> {
        crate::checks::check_alignment(alignment)?;
        Ok(PlanLayout { alignment, size: 0, segment: 0 })
    }

    /// An empty layout as [`PlanLayout::new`]'s whose tensors also never cross a multiple of
    /// `segment` bytes (the planned buffer's seams between device buffers), unless a tensor is
    /// larger than a segment: that one starts at a seam, so it crosses as few as it must.
    /// `segment` must be a non-zero multiple of `alignment`.
    ///
    /// ```
    /// # use devalloc::PlanLayout;
    /// let mut layout = PlanLayout::with_segments(256, 4096)?;
    /// let offsets = [layout.place(3000)?, layout.place(2000)?, layout.place(5000)?];
    /// assert_eq!(offsets, [0, 4096, 8192]); // 2000 bytes at 3072 would cross 4096
    /// # Ok::<(), devalloc::Error>(())
    /// ```
    pub fn with_segments(alignment: usize, segment: usize) -> Result<Self> {
        crate::checks::check_alignment(alignment)?;
        if segment == 0 || !segment.is_multiple_of(alignment) {
            return Err(Error::invalid_argument(format!(
                "a plan's segment of {segment} bytes must be a non-zero multiple of its alignment {alignment}"
            )));
        }
        Ok(PlanLayout { alignment, size: 0, segment })
    }

    /// Places a tensor of `nbytes` after the ones placed so far; returns its offset.
    pub fn place(&mut self, nbytes: usize) -> Result<usize> {
        let mut offset = self.size.checked_next_multiple_of(self.alignment);
        if let Some(at) = offset.filter(|_| self.segment > 0 && nbytes > 0) {
            let seam = (at / self.segment).checked_add(1).and_then(|k| k.checked_mul(self.segment));
            let crosses = at.checked_add(nbytes).is_none_or(|end| seam.is_none_or(|s| end > s));
            if crosses && !at.is_multiple_of(self.segment) {
                offset = seam;
            }
        }
        let end = offset.and_then(|o| o.checked_add(nbytes));
        match (offset, end) {
            (Some(offset), Some(end)) => {
                self.size = end;
                Ok(offset)
            }
            _ => Err(Error::invalid_argument(format!(
                "a plan of {} bytes cannot take {nbytes} more: the size overflows",
                self.size
            ))),
        }
    }

    /// Bytes the planned buffer needs for everything placed so far.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The alignment of every offset.
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// The segment no tensor crosses unless larger ([`PlanLayout::with_segments`]); 0 for none.
    pub fn segment(&self) -> usize {
        self.segment
    }
}

/// The planned buffers of one memory plan on one device, over any [`DeviceAllocator`], freed
/// on drop.
///
/// ```
/// # use devalloc::{HostAllocator, PlannedMemory};
/// let host = HostAllocator::new();
/// // Memory id 0 is unused by this plan, id 1 needs 4 KiB, id 2 needs 64 bytes.
/// let plan = PlannedMemory::new(&host, &[0, 4096, 64], 0)?;
/// let tensor = plan.get_offset_address(1, 1024, 512)?; // 512 bytes at offset 1 KiB
/// assert!(plan.get_offset_address(2, 32, 64).is_err()); // runs past the planned buffer
/// # Ok::<(), devalloc::Error>(())
/// ```
#[doc(alias = "HierarchicalAllocator")]
pub struct PlannedMemory<'a> {
    allocator: &'a dyn DeviceAllocator,
    index: DeviceIndex,
    table: PlanTable,
    /// (offset, size) of each tensor of the plan it was made from, if any.
    tensors: Vec<(u64, u64)>,
    /// The label of each tensor (none, or one per tensor) and of the buffer.
    names: Vec<String>,
    label: Option<String>,
}

/// One tensor of a [`PlannedMemory`] made from a plan: its address and length in the planned
/// buffer, and its label. Bind it on wgpu with `devalloc::wgpu::Bind` (errors name it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedTensor {
    /// Its address.
    pub ptr: DevicePtr,
    /// Its bytes.
    pub len: u64,
    /// Its position in the plan.
    pub index: usize,
    /// Its label, if the memory was made with labels.
    pub label: Option<String>,
    /// The planned buffer's label, if it has one.
    pub buffer: Option<String>,
}

impl PlannedTensor {
    /// How errors name it: `tensor 'act1' (planned buffer 'activations')`, or by position.
    pub fn name(&self) -> String {
        let tensor = match &self.label {
            Some(l) => format!("tensor '{l}'"),
            None => format!("tensor {}", self.index),
        };
        match &self.buffer {
            Some(b) => format!("{tensor} (planned buffer '{b}')"),
            None => format!("{tensor} (planned buffer 0)"),
        }
    }
}

impl<'a> PlannedMemory<'a> {
    /// Allocates one planned buffer per entry of `sizes` (memory id = position) on device
    /// `index`. A size of 0 makes an empty one (null base) that serves only 0-byte addresses.
    /// Sizes and the index are checked before anything is allocated; if the device fails
    /// half-way (out of memory), the buffers already made are freed (the allocator's counters
    /// then show those allocations and frees).
    pub fn new(allocator: &'a dyn DeviceAllocator, sizes: &[usize], index: DeviceIndex) -> Result<Self> {
        Self::aligned(allocator, sizes, index, DEFAULT_ALIGNMENT, None)
    }

    /// [`PlannedMemory::new`] with every buffer aligned to `alignment` (a power of two).
    fn aligned(
        allocator: &'a dyn DeviceAllocator,
        sizes: &[usize],
        index: DeviceIndex,
        alignment: usize,
        label: Option<&str>,
    ) -> Result<Self> {
        let mut plan = PlannedMemory {
            allocator,
            index,
            table: PlanTable::new(),
            tensors: Vec::new(),
            names: Vec::new(),
            label: label.map(Into::into),
        };
        let device = plan.device();
        // What can be refused without asking the device is refused before anything is
        // allocated; a failure of the device half-way frees what was made.
        crate::checks::check_index(device.device_type, index, allocator.device_count())?;
        u32::try_from(sizes.len()).map_err(|_| Error::invalid_argument("more than 2^32 memory ids"))?;
        for &size in sizes.iter().filter(|&&s| s > 0) {
            crate::checks::check_request(size, alignment, device)?;
        }
        for (id, &size) in sizes.iter().enumerate() {
            let id = u32::try_from(id).map_err(|_| Error::invalid_argument("more than 2^32 memory ids"))?;
            let base = match (size, label) {
                (0, _) => DevicePtr::NULL,
                (_, Some(label)) => allocator.allocate_labeled(size, index, alignment, label)?,
                (_, None) => allocator.allocate_planned(id, size, index, alignment)?,
            };
            plan.table.insert(device, id, base, size as u64)?;
        }
        Ok(plan)
    }

    /// One planned buffer (memory id 0) as large as `plan` says, aligned to at least the plan's
    /// alignment (so every tensor's address keeps it), for the tensors it placed, which it
    /// keeps: [`PlannedMemory::tensor`] gives each one's address and length.
    pub fn from_plan(
        allocator: &'a dyn DeviceAllocator,
        plan: &crate::plan::MemoryPlan,
        index: DeviceIndex,
    ) -> Result<Self> {
        Self::from_plan_labeled(allocator, plan, index, None, &[])
    }

    /// [`PlannedMemory::from_plan`], with a label for the planned buffer (the allocation's label
    /// in stats, snapshots and the viewer; `None`: `planned buffer 0`) and one per tensor
    /// (none, or exactly one per tensor of the plan), which [`PlannedTensor::name`] and the
    /// binding errors of `devalloc::wgpu::Bind` use.
    pub fn from_plan_labeled(
        allocator: &'a dyn DeviceAllocator,
        plan: &crate::plan::MemoryPlan,
        index: DeviceIndex,
        label: Option<&str>,
        tensor_labels: &[&str],
    ) -> Result<Self> {
        if !tensor_labels.is_empty() && tensor_labels.len() != plan.len() {
            return Err(Error::invalid_argument(format!(
                "{} tensor labels for a plan of {} tensors (give none, or one per tensor)",
                tensor_labels.len(),
                plan.len()
            )));
        }
        let big = |what: &str, v: u64| {
            usize::try_from(v)
                .map_err(|_| Error::invalid_argument(format!("a plan's {what} of {v} does not fit in usize")))
        };
        let alignment = big("alignment", plan.alignment())?.max(DEFAULT_ALIGNMENT);
        let mut memory = Self::aligned(allocator, &[big("size", plan.size())?], index, alignment, label)?;
        memory.tensors = (0..plan.len()).filter_map(|i| plan.tensor(i)).collect();
        memory.names = tensor_labels.iter().map(|l| l.to_string()).collect();
        let notes: Vec<crate::snapshot::TensorNote> = memory
            .names
            .iter()
            .zip(&memory.tensors)
            .map(|(label, &(offset, size))| crate::snapshot::TensorNote {
                label: label.clone(),
                offset,
                size,
            })
            .collect();
        let base = memory.table.list().first().map(|&(_, base, _)| base).unwrap_or(DevicePtr::NULL);
        if !notes.is_empty() && !base.is_null() {
            // Names for snapshots and the viewer: an allocator that keeps none, or refuses them,
            // costs the names only (the memory is made, and a failed call would have to free it).
            match allocator.label_tensors(base, index, &notes) {
                Ok(()) | Err(Error::NotSupported { .. }) => {}
                Err(e) => log::warn!("devalloc: naming the tensors of planned buffer {base}: {e}"),
            }
        }
        Ok(memory)
    }

    /// Tensor `i` of the plan this memory was made from: its address, length and label. An
    /// error for memory made without a plan, or past the plan's tensors.
    pub fn tensor(&self, i: usize) -> Result<PlannedTensor> {
        let &(offset, len) = self.tensors.get(i).ok_or_else(|| {
            Error::invalid_argument(format!("no tensor {i}: the plan has {} tensors", self.tensors.len()))
        })?;
        let big = |v: u64| usize::try_from(v).map_err(|_| Error::invalid_argument("an offset past usize"));
        Ok(PlannedTensor {
            ptr: self.get_offset_address(0, big(offset)?, big(len)?)?,
            len,
            index: i,
            label: self.names.get(i).cloned(),
            buffer: self.label.clone(),
        })
    }

    /// Number of tensors of the plan this memory was made from (0 without a plan).
    pub fn num_tensors(&self) -> usize {
        self.tensors.len()
    }

    /// The device the planned buffers live on.
    pub fn device(&self) -> Device {
        Device::new(self.allocator.device_type(), self.index)
    }

    /// Number of memory ids in the plan.
    pub fn num_buffers(&self) -> usize {
        self.table.len()
    }

    /// `buffer(memory_id) + offset`, checked so that `nbytes` bytes from there fit in it.
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

    #[test]
    fn layouts_align_and_refuse_overflow() {
        let mut l = PlanLayout::new(64).unwrap();
        assert_eq!(l.place(1).unwrap(), 0);
        assert_eq!(l.place(64).unwrap(), 64);
        assert_eq!(l.place(0).unwrap(), 128);
        assert_eq!(l.size(), 128);
        assert!(PlanLayout::new(48).is_err());
        assert!(l.place(usize::MAX - 100).is_err());
        assert_eq!(l.size(), 128, "a refused placement changes nothing");
    }
}
