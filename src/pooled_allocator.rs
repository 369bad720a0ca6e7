//! [`PooledAllocator`]: the one [`DeviceAllocator`] implementation behind every built-in
//! allocator: one [`Pool`] per device over a backend's [`Storage`].
//!
//! [`crate::HostAllocator`], `WgpuAllocator` and `CudaAllocator` are types of their own, each
//! holding a `PooledAllocator` over its storage ([`Pooled`] hands it out); every [`Pooled`]
//! type is a [`DeviceAllocator`] through the one implementation here.

use std::any::Any;

use crate::allocator::{BoxFuture, DeviceAllocator, WasmNotSendSync};
use crate::bounce::{bounce, run_blocking, End, Mode};
use crate::checks::{check_index, len64};
use crate::device::{Device, DeviceIndex, DeviceType};
use crate::error::{Error, PointerProblem, Result};
use crate::pool::Pool;
use crate::ptr::DevicePtr;
use crate::stats::AllocatorStats;
use crate::storage::Storage;

/// One [`Pool`] per device of one [`DeviceType`], as a [`DeviceAllocator`].
pub struct PooledAllocator<S: Storage> {
    device_type: DeviceType,
    pools: Vec<Pool<S>>,
}

impl<S: Storage> PooledAllocator<S> {
    /// An allocator over these pools; device `i` is `pools[i]`, whose storage must say it is
    /// `device_type:i` (so that no two devices share addresses or memory).
    pub fn from_pools(device_type: DeviceType, pools: Vec<Pool<S>>) -> Result<Self> {
        for (i, pool) in pools.iter().enumerate() {
            let want = Device::new(device_type, i as DeviceIndex);
            if pool.device() != want {
                return Err(Error::invalid_argument(format!(
                    "pool {i} of a {device_type} allocator is for {}, not {want}",
                    pool.device()
                )));
            }
        }
        Ok(PooledAllocator { device_type, pools })
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

    /// Sets (or with `None` lifts) the memory limit of device `index`.
    pub fn set_memory_limit(&self, limit: Option<u64>, index: DeviceIndex) -> Result<()> {
        self.pool(index)?.set_memory_limit(limit);
        Ok(())
    }

    /// Sets device `index`'s memory limit to `fraction` (0 to 1) of the device's memory, where
    /// the backend knows its size (CUDA); [`Error::NotSupported`] elsewhere (wgpu has no query
    /// for a device's memory size).
    pub fn set_memory_fraction(&self, fraction: f64, index: DeviceIndex) -> Result<()> {
        let pool = self.pool(index)?;
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(Error::invalid_argument(format!("memory fraction {fraction}: it must be in (0, 1]")));
        }
        let total = pool.storage().device_memory().and_then(|m| m.total_bytes).ok_or_else(|| {
            Error::NotSupported {
                operation: "set_memory_fraction",
                device_type: self.device_type,
                reason: "the backend cannot say how much memory the device has; set a limit in bytes".into(),
            }
        })?;
        pool.set_memory_limit(Some((total as f64 * fraction) as u64));
        Ok(())
    }

    /// A readable summary of every device: stats and live allocations.
    pub fn report(&self) -> String {
        self.pools.iter().map(Pool::report).collect()
    }

    /// Turns an invalid-pointer error into "belongs to device j" when another device has it.
    pub(crate) fn foreign(&self, index: DeviceIndex, ptr: DevicePtr, e: Error) -> Error {
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

impl<S: Storage + 'static> PooledAllocator<S> {
    async fn copy_d2d(
        &self,
        dst: DevicePtr,
        dst_index: DeviceIndex,
        src: DevicePtr,
        src_index: DeviceIndex,
        nbytes: usize,
        mode: Mode,
    ) -> Result<()> {
        let d = self.pool(dst_index)?;
        let s = self.pool(src_index)?;
        if nbytes == 0 {
            return Ok(());
        }
        if dst_index != src_index {
            // A direct copy between the two devices where the backend has one (CUDA peer copy).
            let sb = s.block_at(src, len64(nbytes)).map_err(|e| self.foreign(src_index, src, e))?;
            let db = d.block_at(dst, len64(nbytes)).map_err(|e| self.foreign(dst_index, dst, e))?;
            let direct =
                s.storage().copy_to(&sb.block, sb.offset, d.storage(), &db.block, db.offset, len64(nbytes));
            if let Some(done) = direct {
                return done;
            }
            let dst = End { alloc: self, index: dst_index, ptr: dst };
            let src = End { alloc: self, index: src_index, ptr: src };
            return bounce(dst, src, nbytes, mode).await;
        }
        // Name the pointer that is wrong, source first (as a copy reads before it writes).
        s.block_at(src, len64(nbytes)).map_err(|e| self.foreign(src_index, src, e))?;
        d.block_at(dst, len64(nbytes)).map_err(|e| self.foreign(dst_index, dst, e))?;
        match mode {
            Mode::Blocking => d.copy(dst, src, nbytes),
            Mode::Async => d.copy_async(dst, src, nbytes).await,
        }
    }
}

/// A type whose memory is one [`PooledAllocator`]: every built-in allocator, and a backend of
/// your own. It is a [`DeviceAllocator`] through the pooled allocator it hands out.
pub trait Pooled: WasmNotSendSync + 'static {
    /// The storage under the pools.
    type Storage: Storage + 'static;

    /// The pooled allocator: one [`Pool`] per device (stats, limit, cache, live allocations).
    fn pooled(&self) -> &PooledAllocator<Self::Storage>;
}

impl<S: Storage + 'static> Pooled for PooledAllocator<S> {
    type Storage = S;

    fn pooled(&self) -> &PooledAllocator<S> {
        self
    }
}

/// Common pool controls as inherent methods of a built-in allocator (a newtype over a
/// [`PooledAllocator`] in field 0), so that they are on its own page of the docs.
macro_rules! pool_controls {
    ($name:ident, $storage:ty) => {
        impl crate::pooled_allocator::Pooled for $name {
            type Storage = $storage;
            fn pooled(&self) -> &crate::pooled_allocator::PooledAllocator<Self::Storage> {
                &self.0
            }
        }

        impl $name {
            /// Sets (or with `None` lifts) the memory limit of device `index`: past it an
            /// allocation is `OutOfMemory` (after the cache is given back), before the device
            /// itself runs out. Blocks already held are not freed.
            pub fn set_memory_limit(
                &self,
                limit: Option<u64>,
                index: crate::device::DeviceIndex,
            ) -> crate::error::Result<()> {
                self.0.set_memory_limit(limit, index)
            }

            /// The memory limit of device `index`.
            pub fn memory_limit(
                &self,
                index: crate::device::DeviceIndex,
            ) -> crate::error::Result<Option<u64>> {
                Ok(self.0.pool(index)?.memory_limit())
            }

            /// Every live allocation of device `index`, in address order.
            pub fn live_allocations(
                &self,
                index: crate::device::DeviceIndex,
            ) -> crate::error::Result<Vec<crate::snapshot::LiveAllocation>> {
                Ok(self.0.pool(index)?.live_allocations())
            }

            /// A readable summary of every device: stats and live allocations.
            pub fn report(&self) -> String {
                self.0.report()
            }
        }
    };
}
pub(crate) use pool_controls;

impl<T: Pooled> DeviceAllocator for T {
    fn device_type(&self) -> DeviceType {
        self.pooled().device_type
    }

    fn allocate(&self, nbytes: usize, index: DeviceIndex, alignment: usize) -> Result<DevicePtr> {
        self.pooled().pool(index)?.allocate(nbytes, alignment)
    }

    fn allocate_labeled(
        &self,
        nbytes: usize,
        index: DeviceIndex,
        alignment: usize,
        label: &str,
    ) -> Result<DevicePtr> {
        let params = <T::Storage as Storage>::Params::default();
        self.pooled().pool(index)?.allocate_params(nbytes, alignment, Some(label), params)
    }

    fn allocate_async<'a>(
        &'a self,
        nbytes: usize,
        index: DeviceIndex,
        alignment: usize,
    ) -> crate::allocator::BoxFuture<'a, Result<DevicePtr>> {
        Box::pin(async move {
            let params = <T::Storage as Storage>::Params::default();
            self.pooled().pool(index)?.allocate_params_async(nbytes, alignment, None, params).await
        })
    }

    fn deallocate(&self, ptr: DevicePtr, index: DeviceIndex) -> Result<()> {
        self.pooled().pool(index)?.deallocate(ptr).map_err(|e| self.pooled().foreign(index, ptr, e))
    }

    fn label_tensors(
        &self,
        ptr: DevicePtr,
        index: DeviceIndex,
        tensors: &[crate::snapshot::TensorNote],
    ) -> Result<()> {
        self.pooled()
            .pool(index)?
            .label_tensors(ptr, tensors)
            .map_err(|e| self.pooled().foreign(index, ptr, e))
    }

    fn copy_host_to_device(&self, dst: DevicePtr, src: &[u8], index: DeviceIndex) -> Result<()> {
        self.pooled().pool(index)?.write(dst, src).map_err(|e| self.pooled().foreign(index, dst, e))
    }

    fn copy_device_to_host(&self, dst: &mut [u8], src: DevicePtr, index: DeviceIndex) -> Result<()> {
        self.pooled().pool(index)?.read(dst, src).map_err(|e| self.pooled().foreign(index, src, e))
    }

    fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        dst_index: DeviceIndex,
        src: DevicePtr,
        src_index: DeviceIndex,
        nbytes: usize,
    ) -> Result<()> {
        run_blocking(self.pooled().copy_d2d(dst, dst_index, src, src_index, nbytes, Mode::Blocking))
    }

    fn copy_device_to_device_async<'a>(
        &'a self,
        dst: DevicePtr,
        dst_index: DeviceIndex,
        src: DevicePtr,
        src_index: DeviceIndex,
        nbytes: usize,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.pooled().copy_d2d(dst, dst_index, src, src_index, nbytes, Mode::Async))
    }

    fn fill_in_place(
        &self,
        dst: DevicePtr,
        nbytes: usize,
        index: DeviceIndex,
        piece: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Option<(u64, Result<()>)> {
        let pool = match self.pooled().pool(index) {
            Ok(p) => p,
            Err(e) => return Some((0, Err(e))),
        };
        let (landed, r) = pool.fill_in_place(dst, len64(nbytes), piece, fill)?;
        Some((landed, r.map_err(|e| self.pooled().foreign(index, dst, e))))
    }

    fn check_range(&self, ptr: DevicePtr, nbytes: usize, index: DeviceIndex) -> Result<()> {
        let pool = self.pooled().pool(index)?;
        if nbytes == 0 {
            return Ok(());
        }
        pool.storage().check_usable()?;
        pool.block_at(ptr, len64(nbytes)).map(drop).map_err(|e| self.pooled().foreign(index, ptr, e))
    }

    fn bytes_after(&self, ptr: DevicePtr, index: DeviceIndex) -> Result<usize> {
        let pool = self.pooled().pool(index)?;
        let r = pool.block_at(ptr, 0).map_err(|e| self.pooled().foreign(index, ptr, e))?;
        // An allocation's size came in as a usize.
        Ok(usize::try_from(r.available).unwrap_or(usize::MAX))
    }

    fn device_count(&self) -> usize {
        self.pooled().pools.len()
    }

    fn device_name(&self, index: DeviceIndex) -> String {
        match self.pooled().pool(index) {
            Ok(p) => p.storage().name(),
            Err(e) => e.to_string(),
        }
    }

    fn allocate_planned(
        &self,
        memory_id: u32,
        nbytes: usize,
        index: DeviceIndex,
        alignment: usize,
    ) -> Result<DevicePtr> {
        self.pooled().pool(index)?.allocate_planned(memory_id, nbytes, alignment)
    }

    fn init_buffer(&self, memory_id: u32, nbytes: usize, index: DeviceIndex) -> Result<DevicePtr> {
        self.pooled().pool(index)?.init_buffer(memory_id, nbytes)
    }

    fn get_offset_address(
        &self,
        memory_id: u32,
        offset: usize,
        nbytes: usize,
        index: DeviceIndex,
    ) -> Result<DevicePtr> {
        self.pooled().pool(index)?.get_offset_address(memory_id, offset, nbytes)
    }

    fn release_buffers(&self, index: DeviceIndex) -> Result<()> {
        self.pooled().pool(index)?.release_buffers()
    }

    fn stats(&self, index: DeviceIndex) -> Result<AllocatorStats> {
        Ok(self.pooled().pool(index)?.stats())
    }

    fn copy_host_to_device_async<'a>(
        &'a self,
        dst: DevicePtr,
        src: &'a [u8],
        index: DeviceIndex,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let pool = self.pooled().pool(index)?;
            pool.write_async(dst, src).await.map_err(|e| self.pooled().foreign(index, dst, e))
        })
    }

    fn copy_device_to_host_async<'a>(
        &'a self,
        dst: &'a mut [u8],
        src: DevicePtr,
        index: DeviceIndex,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let pool = self.pooled().pool(index)?;
            pool.read_async(dst, src).await.map_err(|e| self.pooled().foreign(index, src, e))
        })
    }

    fn empty_cache(&self) -> u64 {
        self.pooled().pools.iter().map(Pool::empty_cache).sum()
    }

    fn record_history(&self, events: usize) -> Result<()> {
        self.pooled().pools.iter().for_each(|p| p.record_history(events, false));
        Ok(())
    }

    fn snapshot(&self) -> Result<crate::snapshot::Snapshot> {
        Ok(crate::snapshot::Snapshot::new(self.pooled().pools.iter().map(Pool::snapshot).collect()))
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}
