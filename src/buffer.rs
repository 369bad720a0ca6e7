//! [`DeviceMemoryBuffer`]: RAII ownership of one device allocation.

use crate::allocator::{DeviceAllocator, DEFAULT_ALIGNMENT};
use crate::device::{Device, DeviceIndex, DeviceType};
use crate::error::{Error, Result};
use crate::ptr::DevicePtr;
use crate::registry::DeviceAllocatorRegistry;
use crate::stream::{Progress, StreamOptions};

/// Owns one allocation and frees it exactly once, on drop.
///
/// Move-only; it borrows its allocator for `'a` (`'static` for one from a registry). The default value is empty: a null pointer, size 0, no allocator, nothing to
/// free. Reads and writes are bounds-checked by the allocator; the typed helpers use bytemuck.
///
/// ```
/// # use devalloc::{DeviceAllocatorRegistry, DeviceMemoryBuffer, DeviceType, HostAllocator, DEFAULT_ALIGNMENT};
/// let registry = DeviceAllocatorRegistry::new();
/// registry.register_allocator(Box::leak(Box::new(HostAllocator::new())))?;
/// let mut buf = DeviceMemoryBuffer::create_in(&registry, 16, DeviceType::Cpu, 0, DEFAULT_ALIGNMENT)?;
/// buf.write_pod(&[1.0f32, 2.0, 3.0, 4.0])?;
/// assert_eq!(buf.to_vec::<f32>()?, [1.0, 2.0, 3.0, 4.0]);
/// # Ok::<(), devalloc::Error>(())
/// ```
pub struct DeviceMemoryBuffer<'a> {
    ptr: DevicePtr,
    size: usize,
    device: Device,
    allocator: Option<&'a dyn DeviceAllocator>,
}

impl Default for DeviceMemoryBuffer<'_> {
    fn default() -> Self {
        DeviceMemoryBuffer {
            ptr: DevicePtr::NULL,
            size: 0,
            device: Device::new(DeviceType::Cpu, 0),
            allocator: None,
        }
    }
}

impl std::fmt::Debug for DeviceMemoryBuffer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMemoryBuffer")
            .field("ptr", &self.ptr)
            .field("size", &self.size)
            .field("device", &self.device)
            .finish()
    }
}

impl DeviceMemoryBuffer<'static> {
    /// Allocates `size` bytes on `device_type:index` through the process-wide registry, with
    /// [`DEFAULT_ALIGNMENT`]; [`Error::NotFound`] when no allocator is registered for the type.
    pub fn create(size: usize, device_type: DeviceType, index: DeviceIndex) -> Result<Self> {
        Self::create_aligned(size, device_type, index, DEFAULT_ALIGNMENT)
    }

    /// Like [`DeviceMemoryBuffer::create`] with an explicit alignment.
    pub fn create_aligned(
        size: usize,
        device_type: DeviceType,
        index: DeviceIndex,
        alignment: usize,
    ) -> Result<Self> {
        Self::create_in(DeviceAllocatorRegistry::instance(), size, device_type, index, alignment)
    }

    /// Like [`DeviceMemoryBuffer::create_aligned`] through the given registry.
    pub fn create_in(
        registry: &DeviceAllocatorRegistry,
        size: usize,
        device_type: DeviceType,
        index: DeviceIndex,
        alignment: usize,
    ) -> Result<Self> {
        Self::create_on(registry.require(device_type)?, size, index, alignment)
    }
}

impl<'a> DeviceMemoryBuffer<'a> {
    /// Allocates through `allocator` directly; the buffer borrows it (any lifetime: an
    /// allocator on the stack will do).
    pub fn create_on(
        allocator: &'a dyn DeviceAllocator,
        size: usize,
        index: DeviceIndex,
        alignment: usize,
    ) -> Result<Self> {
        let ptr = allocator.allocate(size, index, alignment)?;
        Ok(DeviceMemoryBuffer {
            ptr,
            size,
            device: Device::new(allocator.device_type(), index),
            allocator: Some(allocator),
        })
    }

    /// Allocates room for `values` on `allocator` (at [`DEFAULT_ALIGNMENT`]) and copies
    /// them in: the allocate-and-fill of a weight or an input. On a failed copy the memory is
    /// freed again and the copy's error returned; an empty slice is an
    /// [`Error::InvalidArgument`], as a zero-size allocation is.
    pub fn from_pod_on<T: bytemuck::NoUninit>(
        allocator: &'a dyn DeviceAllocator,
        values: &[T],
        index: DeviceIndex,
    ) -> Result<Self> {
        let bytes: &[u8] = bytemuck::cast_slice(values);
        let mut buf = Self::create_on(allocator, bytes.len(), index, DEFAULT_ALIGNMENT)?;
        buf.write_at(0, bytes)?;
        Ok(buf)
    }

    /// Async twin of [`DeviceMemoryBuffer::from_pod_on`] (the browser's way).
    pub async fn from_pod_on_async<T: bytemuck::NoUninit>(
        allocator: &'a dyn DeviceAllocator,
        values: &[T],
        index: DeviceIndex,
    ) -> Result<Self> {
        let bytes: &[u8] = bytemuck::cast_slice(values);
        let mut buf = Self::create_on_async(allocator, bytes.len(), index, DEFAULT_ALIGNMENT).await?;
        buf.write_at_async(0, bytes).await?;
        Ok(buf)
    }

    /// Async twin of [`DeviceMemoryBuffer::create_on`], through
    /// [`DeviceAllocator::allocate_async`]: in the browser, running out of memory is an
    /// error here rather than at the buffer's first use.
    pub async fn create_on_async(
        allocator: &'a dyn DeviceAllocator,
        size: usize,
        index: DeviceIndex,
        alignment: usize,
    ) -> Result<Self> {
        let ptr = allocator.allocate_async(size, index, alignment).await?;
        Ok(DeviceMemoryBuffer {
            ptr,
            size,
            device: Device::new(allocator.device_type(), index),
            allocator: Some(allocator),
        })
    }

    /// The device address (null when empty).
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether the buffer holds no allocation.
    pub fn is_empty(&self) -> bool {
        self.allocator.is_none()
    }

    /// The device the memory is on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The allocator that owns the memory (None when empty).
    pub fn allocator(&self) -> Option<&'a dyn DeviceAllocator> {
        self.allocator
    }

    fn alloc(&self) -> Result<&'a dyn DeviceAllocator> {
        self.allocator.ok_or_else(|| Error::invalid_argument("the buffer is empty (default or released)"))
    }

    fn at(&self, offset: usize, len: usize) -> Result<DevicePtr> {
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(Error::OutOfBounds {
                device: self.device,
                what: "a DeviceMemoryBuffer".into(),
                offset: offset as u64,
                len: len as u64,
                size: self.size as u64,
            });
        }
        self.ptr.offset(offset)
    }

    /// Writes `src` at byte `offset`.
    pub fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        let a = self.alloc()?;
        a.copy_host_to_device(self.at(offset, src.len())?, src, self.device.index)
    }

    /// Async twin of [`DeviceMemoryBuffer::write_at`] (the browser's way to write ragged ranges).
    pub async fn write_at_async(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        let a = self.alloc()?;
        let ptr = self.at(offset, src.len())?;
        a.copy_host_to_device_async(ptr, src, self.device.index).await
    }

    /// Reads `dst.len()` bytes from byte `offset`.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let a = self.alloc()?;
        a.copy_device_to_host(dst, self.at(offset, dst.len())?, self.device.index)
    }

    /// Async twin of [`DeviceMemoryBuffer::read_at`] (the browser's way to read).
    pub async fn read_at_async(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let a = self.alloc()?;
        let ptr = self.at(offset, dst.len())?;
        a.copy_device_to_host_async(dst, ptr, self.device.index).await
    }

    /// Fills the buffer from byte `offset` to its end from `reader`, through a bounded host
    /// window: see [`crate::stream::write_from_reader`] (the same errors and checks).
    pub fn write_from_reader<R: crate::stream::Source + ?Sized, P: FnMut(Progress)>(
        &mut self,
        offset: usize,
        reader: &mut R,
        options: StreamOptions<P>,
    ) -> Result<u64> {
        let a = self.alloc()?;
        let len = self.size.saturating_sub(offset);
        crate::stream::write_from_reader(a, self.at(offset, len)?, len, self.device.index, reader, options)
    }

    /// Async twin of [`DeviceMemoryBuffer::write_from_reader`] over a stream of byte chunks:
    /// see [`crate::stream::write_from_stream`].
    pub async fn write_from_stream<S, B, E, P>(
        &mut self,
        offset: usize,
        stream: S,
        options: StreamOptions<P>,
    ) -> Result<u64>
    where
        S: futures_core::Stream<Item = std::result::Result<B, E>> + Unpin,
        B: AsRef<[u8]>,
        E: Into<crate::error::BackendSource>,
        P: FnMut(Progress),
    {
        let a = self.alloc()?;
        let len = self.size.saturating_sub(offset);
        let ptr = self.at(offset, len)?;
        crate::stream::write_from_stream(a, ptr, len, self.device.index, stream, options).await
    }

    /// Writes a slice of plain values at offset 0.
    pub fn write_pod<T: bytemuck::NoUninit>(&mut self, values: &[T]) -> Result<()> {
        self.write_at(0, bytemuck::cast_slice(values))
    }

    /// Reads the whole buffer as values of `T`; its size must be a multiple of `T`'s.
    pub fn to_vec<T: bytemuck::AnyBitPattern + bytemuck::NoUninit>(&self) -> Result<Vec<T>> {
        let mut out = self.typed_vec::<T>()?;
        self.read_at(0, bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }

    /// Async twin of [`DeviceMemoryBuffer::to_vec`].
    pub async fn to_vec_async<T: bytemuck::AnyBitPattern + bytemuck::NoUninit>(&self) -> Result<Vec<T>> {
        let mut out = self.typed_vec::<T>()?;
        self.read_at_async(0, bytemuck::cast_slice_mut(&mut out)).await?;
        Ok(out)
    }

    fn typed_vec<T: bytemuck::AnyBitPattern>(&self) -> Result<Vec<T>> {
        let elem = std::mem::size_of::<T>().max(1);
        if !self.size.is_multiple_of(elem) {
            return Err(Error::invalid_argument(format!(
                "a buffer of {} bytes is not a whole number of {}-byte values",
                self.size, elem
            )));
        }
        let n = self.size / elem;
        let mut v = Vec::new();
        v.try_reserve_exact(n).map_err(|e| Error::OutOfMemory {
            requested: self.size as u64,
            device: Device::new(DeviceType::Cpu, 0),
            detail: format!("a host vector for the buffer's {} bytes: {e}", self.size),
        })?;
        v.resize(n, T::zeroed());
        Ok(v)
    }

    /// Gives up ownership: returns the pointer and size; the caller must deallocate them.
    pub fn into_raw(mut self) -> (DevicePtr, usize) {
        self.allocator = None;
        (self.ptr, self.size)
    }
}

impl Drop for DeviceMemoryBuffer<'_> {
    fn drop(&mut self) {
        if let Some(a) = self.allocator.take() {
            if let Err(e) = a.deallocate(self.ptr, self.device.index) {
                log::error!("devalloc: freeing a {}-byte buffer on {}: {e}", self.size, self.device);
            }
        }
    }
}
