//! [`PooledAllocator`]: the one [`DeviceAllocator`] implementation behind every built-in
//! allocator: one [`Pool`] per device over a backend's [`Storage`].
//!
//! [`crate::HostAllocator`], `WgpuAllocator` and `CudaAllocator` are this type over their
//! storage; their constructors live in their own modules.
#![deny(unsafe_code)]

use crate::allocator::{
    bounce_copy, bounce_copy_async, check_index, AllocatorStats, BoxFuture, DeviceAllocator,
};
use crate::device::{Device, DeviceIndex, DeviceType};
use crate::error::{Error, PointerProblem, Result};
use crate::pool::{Pool, Storage};
use crate::ptr::DevicePtr;

/// One [`Pool`] per device of one [`DeviceType`], as a [`DeviceAllocator`].
pub struct PooledAllocator<S: Storage> {
    device_type: DeviceType,
    pools: Vec<Pool<S>>,
}

impl<S: Storage> PooledAllocator<S> {
    /// An allocator over these pools; device `i` is `pools[i]`.
    pub fn from_pools(device_type: DeviceType, pools: Vec<Pool<S>>) -> Self {
        PooledAllocator { device_type, pools }
    }

    /// The pool of device `index`: stats, limit, cache, live allocations, report.
    pub fn pool(&self, index: DeviceIndex) -> Result<&Pool<S>> {
        check_index(self.device_type, index, self.pools.len())?;
        Ok(&self.pools[index as usize])
    }

    /// Every device's pool.
    pub fn pools(&self) -> &[Pool<S>] {
        &self.pools
    }

    /// Allocates with a label that the leak report shows.
    pub fn allocate_labeled(
        &self,
        nbytes: usize,
        index: DeviceIndex,
        alignment: usize,
        label: &str,
    ) -> Result<DevicePtr> {
        self.pool(index)?.allocate_labeled(nbytes, alignment, Some(label))
    }

    /// Frees every cached block of every device; returns the bytes given back.
    pub fn empty_cache(&self) -> u64 {
        self.pools.iter().map(Pool::empty_cache).sum()
    }

    /// Sets (or with `None` lifts) the memory limit of device `index`.
    pub fn set_memory_limit(&self, index: DeviceIndex, limit: Option<u64>) -> Result<()> {
        self.pool(index)?.set_memory_limit(limit);
        Ok(())
    }

    /// A readable summary of every device: stats and live allocations.
    pub fn report(&self) -> String {
        self.pools.iter().map(Pool::report).collect()
    }

    /// Turns an invalid-pointer error into "belongs to device j" when another device has it.
    fn foreign(&self, index: DeviceIndex, ptr: DevicePtr, e: Error) -> Error {
        if let Error::InvalidPointer { .. } = e {
            for (j, other) in self.pools.iter().enumerate() {
                if j != index as usize && other.contains(ptr) {
                    return Error::InvalidPointer {
                        ptr,
                        device: Device::new(self.device_type, index),
                        problem: PointerProblem::OtherDevice(other.device()),
                    };
                }
            }
        }
        e
    }
}

impl<S: Storage> DeviceAllocator for PooledAllocator<S> {
    fn device_type(&self) -> DeviceType {
        self.device_type
    }

    fn allocate(&self, nbytes: usize, index: DeviceIndex, alignment: usize) -> Result<DevicePtr> {
        self.pool(index)?.allocate(nbytes, alignment)
    }

    fn deallocate(&self, ptr: DevicePtr, index: DeviceIndex) -> Result<()> {
        self.pool(index)?.deallocate(ptr).map_err(|e| self.foreign(index, ptr, e))
    }

    fn copy_host_to_device(&self, dst: DevicePtr, src: &[u8], index: DeviceIndex) -> Result<()> {
        self.pool(index)?.write(dst, src).map_err(|e| self.foreign(index, dst, e))
    }

    fn copy_device_to_host(&self, dst: &mut [u8], src: DevicePtr, index: DeviceIndex) -> Result<()> {
        self.pool(index)?.read(dst, src).map_err(|e| self.foreign(index, src, e))
    }

    fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        dst_index: DeviceIndex,
        src: DevicePtr,
        src_index: DeviceIndex,
        nbytes: usize,
    ) -> Result<()> {
        let d = self.pool(dst_index)?;
        if dst_index == src_index {
            return d.copy(dst, src, nbytes).map_err(|e| self.foreign(dst_index, dst, e));
        }
        self.pool(src_index)?;
        bounce_copy(self, dst_index, dst, self, src_index, src, nbytes)
    }

    fn copy_device_to_device_async<'a>(
        &'a self,
        dst: DevicePtr,
        dst_index: DeviceIndex,
        src: DevicePtr,
        src_index: DeviceIndex,
        nbytes: usize,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let d = self.pool(dst_index)?;
            if dst_index == src_index {
                return d.copy_async(dst, src, nbytes).await.map_err(|e| self.foreign(dst_index, dst, e));
            }
            self.pool(src_index)?;
            bounce_copy_async(self, dst_index, dst, self, src_index, src, nbytes).await
        })
    }

    fn device_count(&self) -> usize {
        self.pools.len()
    }

    fn device_name(&self, index: DeviceIndex) -> String {
        match self.pool(index) {
            Ok(p) => p.storage().name(),
            Err(e) => e.to_string(),
        }
    }

    fn init_buffer(&self, memory_id: u32, nbytes: usize, index: DeviceIndex) -> Result<DevicePtr> {
        self.pool(index)?.init_buffer(memory_id, nbytes)
    }

    fn get_offset_address(
        &self,
        memory_id: u32,
        offset: usize,
        nbytes: usize,
        index: DeviceIndex,
    ) -> Result<DevicePtr> {
        self.pool(index)?.get_offset_address(memory_id, offset, nbytes)
    }

    fn release_buffers(&self, index: DeviceIndex) -> Result<()> {
        self.pool(index)?.release_buffers()
    }

    fn stats(&self, index: DeviceIndex) -> Result<AllocatorStats> {
        Ok(self.pool(index)?.stats())
    }

    fn copy_host_to_device_async<'a>(
        &'a self,
        dst: DevicePtr,
        src: &'a [u8],
        index: DeviceIndex,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let pool = self.pool(index)?;
            if src.is_empty() {
                return Ok(());
            }
            let r = pool.resolve(dst, src.len() as u64).map_err(|e| self.foreign(index, dst, e))?;
            pool.storage().write_async(&r.block, r.offset, src).await
        })
    }

    fn copy_device_to_host_async<'a>(
        &'a self,
        dst: &'a mut [u8],
        src: DevicePtr,
        index: DeviceIndex,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let pool = self.pool(index)?;
            if dst.is_empty() {
                return Ok(());
            }
            let r = pool.resolve(src, dst.len() as u64).map_err(|e| self.foreign(index, src, e))?;
            pool.storage().read_async(&r.block, r.offset, dst).await
        })
    }
}
