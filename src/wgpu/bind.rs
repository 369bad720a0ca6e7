//! Bind groups from devalloc memory in one call: [`Bind`] says what each entry binds and how,
//! [`WgpuAllocator::bindings`] checks them all ([`Bindings`], owned, to keep in a `let`), and
//! [`WgpuAllocator::bind_group`] makes the bind group, the app's own entries beside them.

use super::binding::{BindingKind, BufferRange};
use super::gpu::Raises;
use super::WgpuAllocator;
use crate::device::DeviceIndex;
use crate::error::{Error, Result};
use crate::planned::PlannedTensor;
use crate::ptr::DevicePtr;

/// How a shader reads a binding. wgpu tracks usage per *buffer* within a dispatch: a buffer
/// written through one binding (`ReadWrite`) cannot be read through another (`Read`,
/// `Uniform`) in the same dispatch, which [`WgpuAllocator::bindings`] checks up front.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// `var<storage, read>`.
    Read,
    /// `var<storage, read_write>`.
    ReadWrite,
    /// `var<uniform>`.
    Uniform,
}

/// Devalloc memory to bind: a whole allocation from a pointer (`DevicePtr`), `len` bytes at a
/// pointer (`(DevicePtr, u64)`), a [`crate::DeviceMemoryBuffer`], or a planned tensor
/// ([`PlannedTensor`], named by its label in errors); or a range bound as several consecutive
/// bindings, one per buffer it lies in ([`BindTarget::segments`]).
#[derive(Clone, Debug)]
pub struct BindTarget {
    ptr: DevicePtr,
    len: Option<u64>,
    name: Option<String>,
    slots: Option<u32>,
}

impl BindTarget {
    /// `len` bytes at `ptr` bound as `slots` consecutive bindings from the bind's binding
    /// number on, one per part of [`WgpuAllocator::segments`] (for a uniform bind, parts within
    /// `max_uniform_buffer_binding_size`): a tensor past one buffer or one binding, which the
    /// shader declares as `slots` arrays and indexes as part `i / part_len` (see
    /// `examples/segmented.rs`). A range of fewer parts fills the slots left with its last part
    /// again (for `read` and `uniform` binds; a `read_write` one must have a part per slot); a
    /// range of more parts than slots is an error that says how many it needs.
    pub fn segments(ptr: DevicePtr, len: u64, slots: u32) -> BindTarget {
        BindTarget { ptr, len: Some(len), name: None, slots: Some(slots) }
    }
}

impl From<DevicePtr> for BindTarget {
    fn from(ptr: DevicePtr) -> Self {
        BindTarget { ptr, len: None, name: None, slots: None }
    }
}

impl From<(DevicePtr, u64)> for BindTarget {
    fn from((ptr, len): (DevicePtr, u64)) -> Self {
        BindTarget { ptr, len: Some(len), name: None, slots: None }
    }
}

impl From<&crate::buffer::DeviceMemoryBuffer<'_>> for BindTarget {
    fn from(b: &crate::buffer::DeviceMemoryBuffer<'_>) -> Self {
        BindTarget { ptr: b.ptr(), len: Some(b.size() as u64), name: None, slots: None }
    }
}

impl From<&PlannedTensor> for BindTarget {
    fn from(t: &PlannedTensor) -> Self {
        BindTarget { ptr: t.ptr, len: Some(t.len), name: Some(t.name()), slots: None }
    }
}

impl From<PlannedTensor> for BindTarget {
    fn from(t: PlannedTensor) -> Self {
        BindTarget::from(&t)
    }
}

/// One entry of a bind group: binding number, memory, access.
///
/// ```no_run
/// # use devalloc::wgpu::{Bind, WgpuAllocator};
/// # fn f(alloc: &WgpuAllocator, x: devalloc::DevicePtr, w: devalloc::DevicePtr, y: devalloc::DevicePtr,
/// #      layout: &devalloc::wgpu::api::BindGroupLayout) -> devalloc::Result<()> {
/// let group = alloc.bind_group(layout, &[Bind::read(0, x), Bind::read(1, w), Bind::read_write(2, y)], &[], 0)?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Bind {
    /// The `@binding` number.
    pub binding: u32,
    /// What is bound.
    pub memory: BindTarget,
    /// How the shader reads it.
    pub access: Access,
}

impl Bind {
    /// `var<storage, read>` at `binding`.
    pub fn read(binding: u32, memory: impl Into<BindTarget>) -> Bind {
        Bind { binding, memory: memory.into(), access: Access::Read }
    }

    /// `var<storage, read_write>` at `binding`.
    pub fn read_write(binding: u32, memory: impl Into<BindTarget>) -> Bind {
        Bind { binding, memory: memory.into(), access: Access::ReadWrite }
    }

    /// `var<uniform>` at `binding` (the allocation needs `UNIFORM` usage: `BufferRequest`).
    pub fn uniform(binding: u32, memory: impl Into<BindTarget>) -> Bind {
        Bind { binding, memory: memory.into(), access: Access::Uniform }
    }
}

/// Checked bindings of devalloc memory, owning their buffers: [`Bindings::entries`] gives the
/// bind group entries (add the app's own beside them). Made by [`WgpuAllocator::bindings`].
/// Like any binding, they must not outlive the memory they bind (see the reuse rule).
#[derive(Debug)]
pub struct Bindings {
    items: Vec<(u32, BufferRange)>,
}

impl Bindings {
    /// The entries, in the order the binds were given (a segmented bind's, one per slot).
    pub fn entries(&self) -> Vec<wgpu::BindGroupEntry<'_>> {
        self.items
            .iter()
            .map(|(binding, range)| wgpu::BindGroupEntry {
                binding: *binding,
                // Checked when made; a device lost since then is caught by wgpu itself.
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &range.buffer,
                    offset: range.range.start,
                    size: wgpu::BufferSize::new(range.len()),
                }),
            })
            .collect()
    }
}

impl WgpuAllocator {
    /// Checks `binds` on device `index` and returns them as owned [`Bindings`]: each range as
    /// [`BufferRange::binding`] checks it (in the allocation, offset alignment, binding size,
    /// usage), no binding number twice, and no buffer both written through one binding and
    /// read or written through another in a way wgpu refuses in one dispatch (a `ReadWrite`
    /// binding beside a `Read` or `Uniform` one of the same buffer, or overlapping another
    /// binding of it). Errors name the memory: a planned tensor by its label, an allocation
    /// by its label and address.
    pub fn bindings(&self, binds: &[Bind], index: DeviceIndex) -> Result<Bindings> {
        // The device first: an index it does not have, or a device lost, even with no binds.
        self.0.pool(index)?.storage().gpu.check_lost()?;
        // Each bind as its bindings (one, or one per slot of a segmented bind), each checked.
        let mut items: Vec<(u32, BufferRange, &Bind)> = Vec::with_capacity(binds.len());
        for b in binds {
            let named = |e: Error| self.about(b, index, e);
            let kind = if b.access == Access::Uniform { BindingKind::Uniform } else { BindingKind::Storage };
            for (binding, range) in self.ranges_of(b, index).map_err(named)? {
                if items.iter().any(|(n, ..)| *n == binding) {
                    return Err(Error::invalid_argument(format!("binding {binding} is given twice")));
                }
                range.binding(kind).map_err(named)?;
                for (other_binding, other, o) in &items {
                    if other.buffer != range.buffer {
                        continue;
                    }
                    let writes = b.access == Access::ReadWrite || o.access == Access::ReadWrite;
                    let overlap = range.range.start < other.range.end && other.range.start < range.range.end;
                    if writes && (b.access != o.access || overlap) {
                        let why = if overlap { "overlapping ranges of it" } else { "different access to it" };
                        return Err(Error::invalid_argument(format!(
                            "{} ({:?}, binding {binding}) and {} ({:?}, binding {other_binding}) share one wgpu buffer, \
                             and wgpu refuses {why} in one dispatch while either is written: bind both read_write at \
                             ranges apart, or give them separate allocations (or planned buffers)",
                            self.describe(b, index),
                            b.access,
                            self.describe(o, index),
                            o.access,
                        )));
                    }
                }
                items.push((binding, range, b));
            }
        }
        let items = items.into_iter().map(|(n, range, _)| (n, range)).collect();
        Ok(Bindings { items })
    }

    /// Makes a bind group for `layout` from `binds` (checked as [`WgpuAllocator::bindings`]
    /// checks them) and the app's own `extra` entries (its uniform buffers, textures,
    /// samplers), in an error scope: a bind group that does not match the layout is an
    /// [`Error::Backend`] with wgpu's message (in the browser, where a scope cannot be awaited
    /// here, wgpu reports it to the device as usual).
    ///
    /// What devalloc cannot check: `extra` entries are passed as they are (give devalloc
    /// memory as `binds`, not as entries of kept [`Bindings`], so that its access is checked
    /// against the other binds); each bind's [`Access`] is taken as given (wgpu does not
    /// expose a layout's entries: declare what the shader declares); and `layout` and `extra`
    /// must come from this allocator's device (wgpu resolves another `wgpu::Instance`'s
    /// objects by id, and may take them for this device's own).
    pub fn bind_group(
        &self,
        layout: &wgpu::BindGroupLayout,
        binds: &[Bind],
        extra: &[wgpu::BindGroupEntry<'_>],
        index: DeviceIndex,
    ) -> Result<wgpu::BindGroup> {
        let bindings = self.bindings(binds, index)?;
        let mut entries = bindings.entries();
        entries.extend(extra.iter().cloned());
        let pool = self.0.pool(index)?;
        let gpu = &pool.storage().gpu;
        gpu.scoped("create_bind_group", 0, Raises::Validation, || {
            gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("devalloc bindings"),
                layout,
                entries: &entries,
            })
        })
    }

    /// The bindings of `b`: its binding number and range; for a segmented bind, a binding per
    /// slot (see [`BindTarget::segments`]).
    fn ranges_of(&self, b: &Bind, index: DeviceIndex) -> Result<Vec<(u32, BufferRange)>> {
        let m = &b.memory;
        let Some(slots) = m.slots else {
            let range = match m.len {
                None => self.buffer(m.ptr, index),
                Some(len) => self.buffer_range(m.ptr, len, index),
            }?;
            return Ok(vec![(b.binding, range)]);
        };
        let kind = if b.access == Access::Uniform { BindingKind::Uniform } else { BindingKind::Storage };
        let parts = self.parts_for(m.ptr, m.len.unwrap_or(0), index, kind)?;
        let (count, last) = (parts.len(), parts.last().cloned());
        if slots == 0 || count > slots as usize || (count < slots as usize && b.access == Access::ReadWrite) {
            return Err(Error::invalid_argument(format!(
                "the range is {count} part(s) (one per buffer, each within the binding limit), bound to {slots} slot(s): \
                 declare {count} (a read_write bind needs exactly one slot per part)"
            )));
        }
        let padding = std::iter::repeat_n(last, slots as usize - count).flatten();
        let first = b.binding;
        let end = first.checked_add(slots - 1).ok_or_else(|| {
            Error::invalid_argument(format!(
                "{slots} slots from binding {first} run past binding {}",
                u32::MAX
            ))
        })?;
        Ok((first..=end).zip(parts.into_iter().chain(padding)).collect())
    }

    /// `e`, saying which bind it is about (its kind kept).
    fn about(&self, b: &Bind, index: DeviceIndex, e: Error) -> Error {
        let name = format!("{} (binding {})", self.describe(b, index), b.binding);
        match e {
            Error::InvalidArgument { message } => Error::invalid_argument(format!("{name}: {message}")),
            Error::OutOfBounds { device, what, offset, len, size } => {
                Error::OutOfBounds { device, what: format!("{what}: {name}"), offset, len, size }
            }
            e => e,
        }
    }

    /// A planned tensor by its label; an allocation by its label (if it has one) and address.
    fn describe(&self, b: &Bind, index: DeviceIndex) -> String {
        if let Some(name) = &b.memory.name {
            return name.clone();
        }
        let ptr = b.memory.ptr;
        let label = self.0.pool(index).ok().and_then(|p| {
            p.live_allocations()
                .into_iter()
                .find(|l| ptr.offset_from(l.ptr()).is_some_and(|off| off < l.size.max(1)))
                .and_then(|l| l.label)
        });
        match label {
            Some(label) => format!("'{label}' at {ptr}"),
            None => format!("the allocation at {ptr}"),
        }
    }
}
