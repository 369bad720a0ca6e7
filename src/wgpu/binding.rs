//! Handing devalloc memory to an app's own pipelines: [`BufferRange`] and its checked
//! bindings, and copies between devalloc memory and buffers the app made itself.

use std::ops::Range;
use std::sync::Arc;

use super::lost::Loss;

use super::block::aligned;
use super::options::Route;
use super::storage::WgpuStorage;
use super::WgpuAllocator;
use crate::device::{Device, DeviceIndex};
use crate::error::{Error, Result};
use crate::ptr::DevicePtr;

/// What a buffer binding is for: the limits on its offset and size differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindingKind {
    /// `var<storage, read>` or `var<storage, read_write>`.
    Storage,
    /// `var<uniform>`.
    Uniform,
}

/// The binding limits of a device.
#[derive(Clone, Copy, Debug)]
struct BindLimits {
    storage_offset: u64,
    uniform_offset: u64,
    storage_size: u64,
    uniform_size: u64,
}

/// The wgpu buffer behind a range of devalloc memory, to use in an app's own pipelines.
///
/// A cached allocator reuses freed buffers: a bind group (or any command) made from a range
/// must not outlive the allocation, or it reaches whatever is allocated in that buffer next.
#[derive(Clone)]
pub struct BufferRange {
    /// The buffer (a cheap handle clone).
    pub buffer: wgpu::Buffer,
    /// The byte range of the buffer.
    pub range: Range<u64>,
    device: Device,
    limits: BindLimits,
    lost: Arc<Loss>,
}

impl std::fmt::Debug for BufferRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferRange")
            .field("buffer", &self.buffer)
            .field("range", &self.range)
            .field("device", &self.device)
            .finish()
    }
}

impl BufferRange {
    /// Bytes in the range (0 for a reversed range).
    pub fn len(&self) -> u64 {
        self.range.end.saturating_sub(self.range.start)
    }

    /// The range, refused if it was changed to one the buffer does not hold (the fields are
    /// public).
    fn checked_range(&self) -> Result<Range<u64>> {
        let r = self.range.clone();
        if r.start > r.end || r.end > self.buffer.size() {
            return Err(Error::invalid_argument(format!(
                "the range {r:?} is not in the {}-byte buffer on {}",
                self.buffer.size(),
                self.device
            )));
        }
        Ok(r)
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// A binding of the range for a bind group entry, checked against what the device can
    /// bind: a non-empty size, an offset that is a multiple of the device's
    /// `min_{storage,uniform}_buffer_offset_alignment`, a size within
    /// `max_{storage,uniform}_buffer_binding_size` (and a multiple of 4 for storage), and a
    /// buffer with the usage. Each refusal names the limit.
    pub fn binding(&self, kind: BindingKind) -> Result<wgpu::BufferBinding<'_>> {
        if self.lost.is_lost() {
            return Err(self.lost.error());
        }
        let range = self.checked_range()?;
        let (offset, size) = (range.start, range.end - range.start);
        let (usage, align, max, names) = match kind {
            BindingKind::Storage => (
                wgpu::BufferUsages::STORAGE,
                self.limits.storage_offset,
                self.limits.storage_size,
                ("STORAGE", "min_storage_buffer_offset_alignment", "max_storage_buffer_binding_size"),
            ),
            BindingKind::Uniform => (
                wgpu::BufferUsages::UNIFORM,
                self.limits.uniform_offset,
                self.limits.uniform_size,
                ("UNIFORM", "min_uniform_buffer_offset_alignment", "max_uniform_buffer_binding_size"),
            ),
        };
        let refuse = |why: String| {
            Err(Error::invalid_argument(format!(
                "cannot bind {} bytes at offset {offset} of a {kind:?} binding on {}: {why}",
                size, self.device
            )))
        };
        if size == 0 {
            return refuse("a binding needs at least one byte (wgpu has no empty binding)".into());
        }
        if !self.buffer.usage().contains(usage) {
            return refuse(format!("the buffer lacks {} usage (allocate it with that usage)", names.0));
        }
        if offset % align != 0 {
            return refuse(format!("the offset is not a multiple of {} ({align})", names.1));
        }
        if size > max {
            return refuse(format!("the size is past {} ({max})", names.2));
        }
        if kind == BindingKind::Storage && size % 4 != 0 {
            return refuse("a storage binding's size must be a multiple of 4".into());
        }
        Ok(wgpu::BufferBinding { buffer: &self.buffer, offset, size: wgpu::BufferSize::new(size) })
    }

    /// The range as a slice (vertex or index buffers, `copy_buffer_to_buffer` through
    /// `slice.buffer()`); an empty range is an error.
    pub fn slice(&self) -> Result<wgpu::BufferSlice<'_>> {
        let range = self.checked_range()?;
        if range.is_empty() {
            return Err(Error::invalid_argument(format!(
                "an empty buffer range on {} has no slice",
                self.device
            )));
        }
        Ok(self.buffer.slice(range))
    }
}

impl WgpuAllocator {
    pub(super) fn range_of(&self, s: &WgpuStorage, buffer: wgpu::Buffer, range: Range<u64>) -> BufferRange {
        let l = &s.limits;
        let limits = BindLimits {
            storage_offset: l.min_storage_buffer_offset_alignment.into(),
            uniform_offset: l.min_uniform_buffer_offset_alignment.into(),
            storage_size: l.max_storage_buffer_binding_size,
            uniform_size: l.max_uniform_buffer_binding_size,
        };
        BufferRange { buffer, range, device: s.gpu.id, limits, lost: Arc::clone(&s.gpu.lost) }
    }

    /// The buffer behind `ptr`, from `ptr` to the end of its allocation. An allocation past
    /// the buffer limit is several buffers: where the rest of it crosses into another, this is
    /// an error that says so; [`WgpuAllocator::segments`] gives each buffer's part.
    pub fn buffer(&self, ptr: DevicePtr, index: DeviceIndex) -> Result<BufferRange> {
        let r = self.0.pool(index)?.block_at(ptr, 0).map_err(|e| self.0.foreign(index, ptr, e))?;
        self.buffer_range(ptr, r.available, index)
    }

    /// The buffer behind `len` bytes at `ptr`, checked against the allocation; an error where
    /// the range crosses from one buffer of a segmented allocation into the next (see
    /// [`WgpuAllocator::segments`]).
    pub fn buffer_range(&self, ptr: DevicePtr, len: u64, index: DeviceIndex) -> Result<BufferRange> {
        let mut parts = self.segments_of(ptr, len, index)?;
        match parts.len() {
            1 => Ok(parts.remove(0)),
            n => Err(Error::invalid_argument(format!(
                "{len} bytes at {ptr} span {n} buffers (the allocation is past the buffer limit, in segments): use WgpuAllocator::segments to bind each part"
            ))),
        }
    }

    /// The offset alignment at which any range can be bound on device `index`, as storage or
    /// as uniform: the larger of the device's two minimum offset alignments. Lay out memory
    /// plans with it ([`crate::PlanLayout`]) so that every tensor can be bound on its own.
    pub fn binding_alignment(&self, index: DeviceIndex) -> Result<usize> {
        let l = &self.0.pool(index)?.storage().limits;
        Ok(l.min_storage_buffer_offset_alignment.max(l.min_uniform_buffer_offset_alignment) as usize)
    }

    /// Copies `len` bytes of devalloc memory at `src` into an app's own `dst` buffer at
    /// `dst_offset`, on the GPU, ordered before every later operation. Whole 4-byte words
    /// only, as wgpu copies; `dst` needs `COPY_DST` usage and must belong to this device.
    pub fn copy_to_buffer(
        &self,
        src: DevicePtr,
        dst: &wgpu::Buffer,
        dst_offset: u64,
        len: u64,
        index: DeviceIndex,
    ) -> Result<()> {
        self.copy_app_buffer(index, src, dst, dst_offset, len, true)
    }

    /// Copies `len` bytes of an app's own `src` buffer at `src_offset` into devalloc memory at
    /// `dst`, on the GPU, ordered before every later operation (see
    /// [`WgpuAllocator::copy_to_buffer`] for the rules).
    pub fn copy_from_buffer(
        &self,
        dst: DevicePtr,
        src: &wgpu::Buffer,
        src_offset: u64,
        len: u64,
        index: DeviceIndex,
    ) -> Result<()> {
        self.copy_app_buffer(index, dst, src, src_offset, len, false)
    }

    fn copy_app_buffer(
        &self,
        index: DeviceIndex,
        ptr: DevicePtr,
        app: &wgpu::Buffer,
        app_offset: u64,
        len: u64,
        to_app: bool,
    ) -> Result<()> {
        let pool = self.0.pool(index)?;
        if len == 0 {
            return Ok(());
        }
        let s = pool.storage();
        let r = pool.block_at(ptr, len).map_err(|e| self.0.foreign(index, ptr, e))?;
        s.gpu.check_lost()?;
        let (usage, flag) = if to_app {
            (wgpu::BufferUsages::COPY_DST, "COPY_DST")
        } else {
            (wgpu::BufferUsages::COPY_SRC, "COPY_SRC")
        };
        let refuse = |why: String| {
            Err(Error::invalid_argument(format!(
                "copying {len} bytes {} an app buffer on {}: {why}",
                if to_app { "to" } else { "from" },
                s.gpu.id
            )))
        };
        if !aligned(app_offset, len) || !aligned(r.offset, 0) {
            return refuse("wgpu copies whole 4-byte words at 4-byte offsets".into());
        }
        if app_offset.checked_add(len).is_none_or(|end| end > app.size()) {
            return refuse(format!(
                "{len} bytes at offset {app_offset} run past the buffer's {} bytes",
                app.size()
            ));
        }
        if !app.usage().contains(usage) {
            return refuse(format!("the buffer lacks {flag} usage"));
        }
        let pieces = r.block.pieces(r.offset, len);
        if pieces.iter().any(|(seg, ..)| seg.buffer == *app) {
            return refuse("it is this allocation's own buffer: copy within devalloc memory instead".into());
        }
        // On the direct route the buffers may be mapped by a copy right now: wait for them,
        // taking their locks in address order, as every copy does (no two copies wait on each
        // other in a circle).
        let mut held = Vec::new();
        if s.route == Route::Direct {
            let mut segments: Vec<&super::block::WgpuBlock> = pieces.iter().map(|p| p.0).collect();
            segments.sort_by_key(|seg| *seg as *const super::block::WgpuBlock);
            for seg in segments {
                held.push(seg.lock_blocking(&s.gpu)?);
            }
        }
        let submitted = s
            .gpu
            .submit("devalloc app-buffer copy", |enc| {
                for (seg, within, n, at) in &pieces {
                    if to_app {
                        enc.copy_buffer_to_buffer(&seg.buffer, *within, app, app_offset + at, *n)
                    } else {
                        enc.copy_buffer_to_buffer(app, app_offset + at, &seg.buffer, *within, *n)
                    }
                }
            })
            .map(drop);
        // A failure on a buffer the app destroyed: none of these is reused.
        pieces.iter().fold(submitted, |r, (seg, ..)| s.spoil_on(seg, r))
    }
}

impl WgpuAllocator {
    /// Bytes of each buffer (segment) of an allocation past the buffer limit on device `index`,
    /// the last excepted: lay out a plan with [`crate::PlanLayout::with_segments`] and it, so that
    /// no tensor crosses from one buffer into the next unless it must.
    pub fn segment_size(&self, index: DeviceIndex) -> Result<u64> {
        Ok(self.0.pool(index)?.storage().segment)
    }

    /// The buffers behind `len` bytes at `ptr`, in order, each part within one buffer and at
    /// most the device's `max_storage_buffer_binding_size` (rounded down to its storage offset
    /// alignment), so that each can be bound on its own: one part for a range within one
    /// buffer and the binding limit, several for a range of an allocation past the buffer
    /// limit (see [`super::WgpuOptions::max_buffer_size`]) or past the binding limit. A shader
    /// indexes such a tensor as consecutive bindings of these parts (`examples/segmented.rs`).
    /// Checked against the allocation as [`WgpuAllocator::buffer_range`] is; an empty range is
    /// one empty part.
    pub fn segments(&self, ptr: DevicePtr, len: u64, index: DeviceIndex) -> Result<Vec<BufferRange>> {
        self.parts_for(ptr, len, index, BindingKind::Storage)
    }

    /// [`WgpuAllocator::segments`], each part within what a binding of `kind` may hold
    /// (`max_uniform_buffer_binding_size` for a uniform one).
    pub(super) fn parts_for(
        &self,
        ptr: DevicePtr,
        len: u64,
        index: DeviceIndex,
        kind: BindingKind,
    ) -> Result<Vec<BufferRange>> {
        let parts = self.segments_of(ptr, len, index)?;
        let l = &self.0.pool(index)?.storage().limits;
        let (align, size) = match kind {
            BindingKind::Storage => {
                (l.min_storage_buffer_offset_alignment, l.max_storage_buffer_binding_size)
            }
            BindingKind::Uniform => {
                (l.min_uniform_buffer_offset_alignment, l.max_uniform_buffer_binding_size)
            }
        };
        let align = u64::from(align).max(4);
        let most = (size / align * align).max(align);
        let mut out = Vec::new();
        for part in parts {
            let mut at = part.range.start;
            loop {
                let end = part.range.end.min(at.saturating_add(most));
                let mut piece = part.clone();
                piece.range = at..end;
                out.push(piece);
                if end >= part.range.end {
                    break;
                }
                at = end;
            }
        }
        Ok(out)
    }

    /// The parts of `len` bytes at `ptr`, one per buffer they touch (one empty part for an
    /// empty range); each buffer is marked as handed to the app.
    pub(super) fn segments_of(
        &self,
        ptr: DevicePtr,
        len: u64,
        index: DeviceIndex,
    ) -> Result<Vec<BufferRange>> {
        let pool = self.0.pool(index)?;
        pool.storage().gpu.check_lost()?;
        let r = pool.block_at(ptr, len).map_err(|e| self.0.foreign(index, ptr, e))?;
        let mut pieces = r.block.pieces(r.offset, len);
        if pieces.is_empty() {
            // An empty range: the buffer it starts in (the last one, at the allocation's end).
            let segment = r.block.buffer.size();
            let i = ((r.offset / segment) as usize).min(r.block.rest.len());
            let seg = r.block.segments().nth(i).unwrap_or(&r.block);
            pieces.push((seg, r.offset - i as u64 * segment, 0, 0));
        }
        let exposed = std::sync::atomic::Ordering::Release;
        Ok(pieces
            .into_iter()
            .map(|(seg, within, n, _)| {
                seg.exposed.store(true, exposed);
                self.range_of(pool.storage(), seg.buffer.clone(), within..within + n)
            })
            .collect())
    }
}
