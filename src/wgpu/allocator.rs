//! [`WgpuAllocator`] and the [`BufferRequest`] it serves: opening adapters, adopting an app's
//! device, allocations with usage and labels, and the calls that wait for the device.

use std::ops::Range;

use super::mapping::MapGuard;
use super::options::{choose_route, device_type_of, type_rank};
use super::platform::{Current, Platform};
use super::storage::{WgpuParams, WgpuStorage};
use super::{Route, WgpuOptions};
use crate::allocator::DEFAULT_ALIGNMENT;
use crate::bounce::Mode;
use crate::device::{Device, DeviceIndex, DeviceType};
use crate::error::{Error, Result};
use crate::pool::Pool;
use crate::pooled_allocator::PooledAllocator;
use crate::ptr::DevicePtr;
use crate::storage::Storage;

/// wgpu device memory behind the [`crate::DeviceAllocator`] contract; the [`crate::wgpu`]
/// module docs are the guide for wgpu apps.
pub struct WgpuAllocator(pub(super) PooledAllocator<WgpuStorage>);

crate::pooled_allocator::pool_controls!(WgpuAllocator, WgpuStorage);

/// One allocation for [`WgpuAllocator::allocate_request`]: size, alignment, usage, label, and
/// whether it must read as zeros.
#[derive(Clone, Debug)]
pub struct BufferRequest<'a> {
    /// Bytes.
    pub size: usize,
    /// Alignment of the address (a power of two).
    pub alignment: usize,
    /// The buffer's usage; empty: the allocator's ([`WgpuOptions::usage`]). `COPY_SRC |
    /// COPY_DST` are always added; `MAP_READ` / `MAP_WRITE` are devalloc's to set.
    pub usage: wgpu::BufferUsages,
    /// A label for people: devalloc's reports, snapshots, histories and out-of-memory errors name
    /// the allocation by it. (wgpu's own messages name the buffer by its block, `devalloc block
    /// <id> (<capacity> bytes)`, which `live_allocations` and snapshots tie to the label.)
    pub label: Option<&'a str>,
    /// Whether the memory must read as zeros (a reused buffer holds old bytes otherwise).
    pub zeroed: bool,
}

impl<'a> BufferRequest<'a> {
    /// `size` bytes with [`DEFAULT_ALIGNMENT`], the allocator's usage, no label.
    pub fn new(size: usize) -> Self {
        BufferRequest {
            size,
            alignment: DEFAULT_ALIGNMENT,
            usage: wgpu::BufferUsages::empty(),
            label: None,
            zeroed: false,
        }
    }

    /// With this usage.
    pub fn usage(mut self, usage: wgpu::BufferUsages) -> Self {
        self.usage = usage;
        self
    }

    /// With this label.
    pub fn label(mut self, label: &'a str) -> Self {
        self.label = Some(label);
        self
    }

    /// With this alignment.
    pub fn alignment(mut self, alignment: usize) -> Self {
        self.alignment = alignment;
        self
    }

    /// Reading as zeros.
    pub fn zeroed(mut self) -> Self {
        self.zeroed = true;
        self
    }
}

impl WgpuAllocator {
    /// Opens every adapter of `backend` with default options, blocking (native only; in the
    /// browser use [`WgpuAllocator::new_async`]).
    pub fn new(backend: wgpu::Backend) -> Result<Self> {
        Self::with_options(backend, WgpuOptions::default())
    }

    /// Opens every adapter of `backend`, blocking (native only; in the browser use
    /// [`WgpuAllocator::with_options_async`], as opening an adapter there cannot be waited for).
    pub fn with_options(backend: wgpu::Backend, options: WgpuOptions) -> Result<Self> {
        Current::open_blocking(device_type_for(backend)?, backend, Self::with_options_async(backend, options))
    }

    /// Opens every adapter of `backend` with default options; the way in on the web, where
    /// nothing may block.
    pub async fn new_async(backend: wgpu::Backend) -> Result<Self> {
        Self::with_options_async(backend, WgpuOptions::default()).await
    }

    /// Opens every adapter of `backend` with these options, without blocking.
    pub async fn with_options_async(backend: wgpu::Backend, options: WgpuOptions) -> Result<Self> {
        let device_type = device_type_for(backend)?;
        options.check(Device::new(device_type, 0))?;
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = backend.into();
        let instance = wgpu::Instance::new(desc);
        let mut adapters = Current::adapters(&instance, backend).await;
        let software: Vec<String> = adapters
            .iter()
            .map(|a| a.get_info())
            .filter(|i| i.device_type == wgpu::DeviceType::Cpu)
            .map(|i| super::storage::adapter_name(&i).to_string())
            .collect();
        if !options.allow_software {
            adapters.retain(|a| a.get_info().device_type != wgpu::DeviceType::Cpu);
        }
        if adapters.is_empty() && !software.is_empty() {
            return Err(Error::not_found(format!(
                "no usable {device_type} adapter: only software ones ({}), and WgpuOptions::allow_software is false",
                software.join(", ")
            )));
        }
        if adapters.is_empty() {
            return Err(Error::not_found(format!(
                "no usable {device_type} adapter: {}",
                Current::no_adapter(backend)
            )));
        }
        adapters.sort_by_key(|a| {
            let i = a.get_info();
            (type_rank(i.device_type, options.power_preference), i.name, i.vendor, i.device)
        });
        let mut pools = Vec::new();
        for (index, adapter) in adapters.iter().enumerate() {
            let id = Device::new(device_type, index as DeviceIndex);
            let info = adapter.get_info();
            let mappable = adapter.features().contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS);
            let route = choose_route(options.route, &info, mappable, device_type)?;
            let required_features = match route {
                Route::Direct => wgpu::Features::MAPPABLE_PRIMARY_BUFFERS,
                Route::Staged => wgpu::Features::empty(),
            };
            let required_limits = options.required_limits.clone().unwrap_or_else(|| adapter.limits());
            let desc = wgpu::DeviceDescriptor {
                label: Some("devalloc"),
                required_features,
                required_limits,
                memory_hints: options.memory_hints.clone(),
                ..Default::default()
            };
            let (device, queue) = adapter.request_device(&desc).await.map_err(|e| Error::Backend {
                device: id,
                message: format!("opening {}: {e}", info.name),
                source: Some(Box::new(e)),
            })?;
            log::info!(
                "devalloc: {id} is {} ({:?}, {:?}), {route:?} copies",
                super::storage::adapter_name(&info),
                info.device_type,
                info.backend
            );
            pools.push(Pool::new(
                WgpuStorage::new(device, queue, id, route, &options)?,
                options.pool.clone(),
            )?);
        }
        Ok(WgpuAllocator(PooledAllocator::from_pools(device_type, pools)?))
    }

    /// Puts devalloc in front of a device and queue the app already has (device index 0),
    /// with default options; see the crate docs' section on wgpu apps. Copies are staged
    /// unless the device was opened with `MAPPABLE_PRIMARY_BUFFERS` on unified memory.
    pub fn from_device(device: wgpu::Device, queue: wgpu::Queue) -> Result<Self> {
        Self::from_device_with_options(device, queue, WgpuOptions::default())
    }

    /// [`WgpuAllocator::from_device`] with options.
    pub fn from_device_with_options(
        device: wgpu::Device,
        queue: wgpu::Queue,
        options: WgpuOptions,
    ) -> Result<Self> {
        let info = device.adapter_info();
        let device_type = device_type_of(info.backend).ok_or_else(|| {
            Error::invalid_argument(format!("a {:?} device has no memory devalloc can serve", info.backend))
        })?;
        let mappable = device.features().contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS);
        let route = choose_route(options.route, &info, mappable, device_type)?;
        let id = Device::new(device_type, 0);
        // Every setting checked before the storage takes the device's lost callback: a refused
        // adoption leaves the app's device as it was.
        options.check(id)?;
        let storage = WgpuStorage::new(device, queue, id, route, &options)?;
        let pools = vec![Pool::new(storage, options.pool.clone())?];
        Ok(WgpuAllocator(PooledAllocator::from_pools(device_type, pools)?))
    }

    /// The wgpu device of `index`.
    pub fn device(&self, index: DeviceIndex) -> Result<&wgpu::Device> {
        Ok(&self.0.pool(index)?.storage().gpu.device)
    }

    /// The wgpu queue of `index`.
    pub fn queue(&self, index: DeviceIndex) -> Result<&wgpu::Queue> {
        Ok(&self.0.pool(index)?.storage().gpu.queue)
    }

    /// The adapter behind device `index`.
    pub fn adapter_info(&self, index: DeviceIndex) -> Result<&wgpu::AdapterInfo> {
        Ok(&self.0.pool(index)?.storage().gpu.info)
    }

    /// Whether device `index` runs compute shaders: false on WebGL2 (and GL contexts without
    /// compute), where creating a compute pipeline would fail. Read from the device's own
    /// limits (a device without compute has no compute workgroups), so it also answers for a
    /// device the app opened with limits that leave compute out.
    pub fn supports_compute(&self, index: DeviceIndex) -> Result<bool> {
        let limits = self.device(index)?.limits();
        Ok(limits.max_compute_workgroups_per_dimension > 0
            && limits.max_compute_invocations_per_workgroup > 0)
    }

    /// The route host<->device copies take on device `index`.
    pub fn route(&self, index: DeviceIndex) -> Result<Route> {
        Ok(self.0.pool(index)?.storage().route)
    }

    /// Allocates as `request` says: usage, label, alignment, zeroing. Freed buffers are cached by
    /// usage (never by label) and reused for any label. If clearing a zeroed allocation fails
    /// (the device was lost meanwhile), the allocation is freed again before the error
    /// returns: the stats then count one allocation and one free.
    pub fn allocate_request(&self, request: &BufferRequest<'_>, index: DeviceIndex) -> Result<DevicePtr> {
        let pool = self.0.pool(index)?;
        let params = request_params(request)?;
        let ptr = pool.allocate_params(request.size, request.alignment, request.label, params)?;
        self.zeroed_if_asked(request, ptr, index)
    }

    /// Async twin of [`WgpuAllocator::allocate_request`], waiting (in the browser) for the
    /// device's verdict: see [`crate::DeviceAllocator::allocate_async`].
    pub async fn allocate_request_async(
        &self,
        request: &BufferRequest<'_>,
        index: DeviceIndex,
    ) -> Result<DevicePtr> {
        let pool = self.0.pool(index)?;
        let params = request_params(request)?;
        let ptr = pool.allocate_params_async(request.size, request.alignment, request.label, params).await?;
        self.zeroed_if_asked(request, ptr, index)
    }

    /// `ptr`, cleared if `request` asks for zeros; freed again if clearing fails.
    fn zeroed_if_asked(
        &self,
        request: &BufferRequest<'_>,
        ptr: DevicePtr,
        index: DeviceIndex,
    ) -> Result<DevicePtr> {
        if request.zeroed {
            if let Err(e) = self.zero(index, ptr) {
                let _ = self.0.pool(index)?.deallocate(ptr);
                return Err(e);
            }
        }
        Ok(ptr)
    }

    /// Allocates memory that reads as zeros (cleared on the GPU, fresh buffers too).
    pub fn allocate_zeroed(&self, nbytes: usize, index: DeviceIndex, alignment: usize) -> Result<DevicePtr> {
        self.allocate_request(&BufferRequest::new(nbytes).alignment(alignment).zeroed(), index)
    }

    fn zero(&self, index: DeviceIndex, ptr: DevicePtr) -> Result<()> {
        let pool = self.0.pool(index)?;
        let r = pool.block_at(ptr, 0)?;
        let len = r.block.size();
        crate::bounce::run_blocking(pool.storage().clear_pieces(
            &r.block,
            0,
            len,
            crate::bounce::Mode::Blocking,
        ))
    }

    /// Waits until the GPU has finished all work submitted to device `index` (blocking; in
    /// the browser [`Error::NotSupported`]: use [`WgpuAllocator::synchronize_async`]).
    pub fn synchronize(&self, index: DeviceIndex) -> Result<()> {
        self.0.pool(index)?.storage().synchronize()
    }

    /// Resolves once the GPU has finished all work submitted to device `index`, without
    /// blocking a thread (works on every backend, the browser included).
    pub async fn synchronize_async(&self, index: DeviceIndex) -> Result<()> {
        self.0.pool(index)?.storage().gpu.synchronize(Mode::Async).await
    }

    /// Maps `buffer[range]` of device `index` (an app's own buffer too) and resolves once it
    /// can be read or written with `get_mapped_range`; on WebGL2 this polls the device as
    /// wgpu requires there. The range must start at a multiple of 8, be a non-empty multiple
    /// of 4 long, lie in the buffer, and the buffer must have the mapping usage.
    pub async fn map_buffer_async(
        &self,
        buffer: &wgpu::Buffer,
        mode: wgpu::MapMode,
        range: Range<u64>,
        index: DeviceIndex,
    ) -> Result<()> {
        let s = &self.0.pool(index)?.storage().gpu;
        let (usage, flag) = match mode {
            wgpu::MapMode::Read => (wgpu::BufferUsages::MAP_READ, "MAP_READ"),
            wgpu::MapMode::Write => (wgpu::BufferUsages::MAP_WRITE, "MAP_WRITE"),
        };
        let why = if range.start >= range.end || range.end > buffer.size() {
            Some(format!("it must be non-empty and within the buffer's {} bytes", buffer.size()))
        } else if !range.start.is_multiple_of(wgpu::MAP_ALIGNMENT)
            || !(range.end - range.start).is_multiple_of(4)
        {
            Some("it must start at a multiple of 8 and be a multiple of 4 long".into())
        } else if !buffer.usage().contains(usage) {
            Some(format!("the buffer lacks {flag} usage"))
        } else {
            None
        };
        if let Some(why) = why {
            return Err(Error::invalid_argument(format!("cannot map {range:?} on {}: {why}", s.id)));
        }
        s.check_lost()?;
        // Until the map resolves, giving up (or being dropped) cancels it, for good: a map left
        // pending would map the app's buffer behind its back later (see `mapping.rs`).
        let mut pending = MapGuard::request(s, buffer, mode, range, true)?;
        // A buffer of another device would never map here (only that device's polls complete
        // its map): give up once this device is idle.
        let waited = pending.waited(Mode::Async, true).await;
        if waited.is_err() {
            // It will not map here (another device's buffer, or a loss): no use waiting for it.
            pending.cancel();
        }
        pending.settle(waited)?;
        pending.keep_mapped();
        Ok(())
    }

    /// Bytes of the largest allocation device `index` can make.
    pub fn max_allocation(&self, index: DeviceIndex) -> Result<u64> {
        Ok(self.0.pool(index)?.storage().max_block_size())
    }
}

/// The device type `backend` serves, or why it serves none.
fn device_type_for(backend: wgpu::Backend) -> Result<DeviceType> {
    device_type_of(backend).ok_or_else(|| {
        Error::invalid_argument(format!("wgpu backend {backend:?} has no device memory devalloc can serve"))
    })
}

/// The pool params of `request`: its usage, which may not include mapping (devalloc's).
fn request_params(request: &BufferRequest<'_>) -> Result<WgpuParams> {
    let mapping = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::MAP_WRITE;
    if request.usage.intersects(mapping) {
        return Err(Error::invalid_argument(
            "MAP_READ / MAP_WRITE usage is devalloc's to set (the direct route maps buffers itself)",
        ));
    }
    Ok(WgpuParams::with_usage(request.usage))
}
