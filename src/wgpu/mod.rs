//! [`WgpuAllocator`]: GPU buffers through wgpu on Vulkan, Metal, DX12, GL and the browser's
//! WebGPU, behind the [`DeviceAllocator`] contract.
//!
//! One allocator serves one wgpu backend; its [`DeviceAllocator::device_type`] is that
//! backend's [`DeviceType`], and its device indices are that backend's adapters in a stable
//! order: by adapter type (discrete, integrated, virtual, CPU, other; integrated first under
//! [`wgpu::PowerPreference::LowPower`]), then name, vendor and device id.
//!
//! Two ways in: *discovery* (`WgpuAllocator::new` and `new_with`, blocking, on native;
//! [`WgpuAllocator::new_async`] everywhere) opens every adapter of a backend; *adoption*
//! ([`WgpuAllocator::from_device`]) puts devalloc in front of a `wgpu::Device` and `Queue` an
//! app already has. [`WgpuAllocator::buffer`] gives back the `wgpu::Buffer` and byte range
//! behind a [`DevicePtr`], to bind devalloc memory in the app's own pipelines.
//!
//! Buffers are `STORAGE | COPY_SRC | COPY_DST` by default, pooled by size class (freed buffers
//! are reused; [`WgpuAllocator::empty_cache`] gives them back). A fresh buffer is zeroed by
//! wgpu; **a reused one holds its old bytes**: use [`WgpuAllocator::allocate_zeroed`] when that
//! matters. Host<->device copies are staged or direct-mapped (see [`storage`]).

pub mod storage;

use std::ops::Range;

// Used by native-only code; named by the docs on every target.
#[cfg_attr(web, allow(unused_imports))]
use crate::allocator::DeviceAllocator;
use crate::device::{Device, DeviceIndex, DeviceType};
use crate::error::{Error, Result};
use crate::pool::{Pool, PoolConfig};
use crate::pooled::PooledAllocator;
use crate::ptr::DevicePtr;
#[cfg(native)]
use crate::registry::DeviceAllocatorRegistry;
pub use storage::{Route, WgpuBlock, WgpuStorage};

/// How host<->device copies reach device memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MapMode {
    /// Direct mapping where the adapter has unified memory and `MAPPABLE_PRIMARY_BUFFERS`,
    /// staging elsewhere.
    #[default]
    Auto,
    /// Always through staging buffers.
    Staged,
    /// Always by mapping the buffers themselves; an error where the adapter cannot.
    Direct,
}

/// Options of a [`WgpuAllocator`].
#[derive(Clone, Debug)]
pub struct WgpuOptions {
    /// Which adapters come first (see the module docs).
    pub power_preference: wgpu::PowerPreference,
    /// Limits to ask each device for; `None` asks for everything the adapter offers (so
    /// `max_buffer_size` is the adapter's, not wgpu's 256 MiB default).
    pub required_limits: Option<wgpu::Limits>,
    /// Whether software adapters (lavapipe, llvmpipe, SwiftShader, WARP) count.
    pub allow_software: bool,
    /// Most bytes each device may hold for devalloc; past it allocations fail with
    /// [`Error::OutOfMemory`] before the device runs out.
    pub memory_limit: Option<u64>,
    /// Keep freed buffers by size class and reuse them.
    pub caching: bool,
    /// Staged or direct host<->device copies.
    pub map_mode: MapMode,
    /// Usage of device buffers (`COPY_SRC | COPY_DST` are always added).
    pub usage: wgpu::BufferUsages,
    /// Size of one staging buffer, and so of one chunk of a large copy. `None`: 2 MiB on CPU
    /// and integrated adapters (the chunk stays in cache while the other core copies the
    /// previous one: measured ~2x faster than 8 MiB on lavapipe), 8 MiB on discrete GPUs.
    pub staging_chunk: Option<u64>,
}

impl Default for WgpuOptions {
    fn default() -> Self {
        WgpuOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            required_limits: None,
            allow_software: true,
            memory_limit: None,
            caching: true,
            map_mode: MapMode::Auto,
            usage: wgpu::BufferUsages::STORAGE,
            staging_chunk: None,
        }
    }
}

/// The [`DeviceType`] of a wgpu backend, or `None` for backends without device memory (noop).
pub fn device_type_of(backend: wgpu::Backend) -> Option<DeviceType> {
    match backend {
        wgpu::Backend::Vulkan => Some(DeviceType::Vulkan),
        wgpu::Backend::Metal => Some(DeviceType::Metal),
        wgpu::Backend::Dx12 => Some(DeviceType::Dx12),
        wgpu::Backend::Gl => Some(DeviceType::Gl),
        wgpu::Backend::BrowserWebGpu => Some(DeviceType::WebGpu),
        _ => None,
    }
}

/// The wgpu backends devalloc knows, in the order `register_wgpu_backends` (native) tries them.
pub const BACKENDS: [wgpu::Backend; 5] = [
    wgpu::Backend::Vulkan,
    wgpu::Backend::Metal,
    wgpu::Backend::Dx12,
    wgpu::Backend::Gl,
    wgpu::Backend::BrowserWebGpu,
];

/// The wgpu buffer behind a [`DevicePtr`] range, to bind in an app's own pipelines.
#[derive(Clone, Debug)]
pub struct BufferRange {
    /// The buffer (a cheap handle clone).
    pub buffer: wgpu::Buffer,
    /// The byte range of the buffer.
    pub range: Range<u64>,
}

impl BufferRange {
    /// A binding of the range (for a bind group entry). Storage bindings want the offset to be
    /// a multiple of the device's `min_storage_buffer_offset_alignment` (256 on most
    /// adapters): allocate with [`crate::DEFAULT_ALIGNMENT`] and bind from the start.
    pub fn binding(&self) -> wgpu::BufferBinding<'_> {
        wgpu::BufferBinding {
            buffer: &self.buffer,
            offset: self.range.start,
            size: wgpu::BufferSize::new(self.range.end - self.range.start),
        }
    }

    /// The range as a slice (for vertex/index buffers, mapping).
    pub fn slice(&self) -> wgpu::BufferSlice<'_> {
        self.buffer.slice(self.range.clone())
    }
}

/// wgpu device memory behind the [`DeviceAllocator`] contract; see the module docs.
pub type WgpuAllocator = PooledAllocator<WgpuStorage>;

fn type_rank(t: wgpu::DeviceType, pref: wgpu::PowerPreference) -> u8 {
    match (t, pref) {
        (wgpu::DeviceType::IntegratedGpu, wgpu::PowerPreference::LowPower) => 0,
        (wgpu::DeviceType::DiscreteGpu, _) => 1,
        (wgpu::DeviceType::IntegratedGpu, _) => 2,
        (wgpu::DeviceType::VirtualGpu, _) => 3,
        (wgpu::DeviceType::Cpu, _) => 4,
        _ => 5,
    }
}

impl PooledAllocator<WgpuStorage> {
    /// Opens every adapter of `backend` with default options, blocking (native only).
    #[cfg(native)]
    pub fn new(backend: wgpu::Backend) -> Result<Self> {
        Self::new_with(backend, WgpuOptions::default())
    }

    /// Opens every adapter of `backend`, blocking (native only).
    #[cfg(native)]
    pub fn new_with(backend: wgpu::Backend, options: WgpuOptions) -> Result<Self> {
        pollster::block_on(Self::new_async(backend, options))
    }

    /// Opens every adapter of `backend`; the way in on the web, where nothing may block.
    pub async fn new_async(backend: wgpu::Backend, options: WgpuOptions) -> Result<Self> {
        let device_type = device_type_of(backend).ok_or_else(|| {
            Error::invalid_argument(format!(
                "wgpu backend {backend:?} has no device memory devalloc can serve"
            ))
        })?;
        let no_device = |why: String| Error::not_found(format!("no usable {device_type} adapter: {why}"));
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = backend.into();
        let instance = wgpu::Instance::new(desc);
        let mut adapters = Self::adapters(&instance, backend).await;
        if !options.allow_software {
            adapters.retain(|a| a.get_info().device_type != wgpu::DeviceType::Cpu);
        }
        if adapters.is_empty() {
            return Err(no_device("wgpu found no adapter (is a driver installed?)".into()));
        }
        adapters.sort_by_key(|a| {
            let i = a.get_info();
            (type_rank(i.device_type, options.power_preference), i.name, i.vendor, i.device)
        });
        let mut devices = Vec::new();
        for (index, adapter) in adapters.iter().enumerate() {
            let id = Device::new(device_type, index as DeviceIndex);
            let info = adapter.get_info();
            let limits = options.required_limits.clone().unwrap_or_else(|| adapter.limits());
            let unified = matches!(info.device_type, wgpu::DeviceType::Cpu | wgpu::DeviceType::IntegratedGpu);
            let mappable = adapter.features().contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS);
            let route = match options.map_mode {
                MapMode::Staged => Route::Staged,
                MapMode::Auto if unified && mappable => Route::Direct,
                MapMode::Auto => Route::Staged,
                MapMode::Direct if mappable => Route::Direct,
                MapMode::Direct => {
                    return Err(Error::NotSupported {
                        operation: "direct mapping",
                        device_type,
                        reason: format!("{} does not offer MAPPABLE_PRIMARY_BUFFERS", info.name),
                    })
                }
            };
            let features = match route {
                Route::Direct => wgpu::Features::MAPPABLE_PRIMARY_BUFFERS,
                Route::Staged => wgpu::Features::empty(),
            };
            let (device, queue) = adapter
                .request_device(&wgpu::DeviceDescriptor {
                    label: Some("devalloc"),
                    required_features: features,
                    required_limits: limits,
                    ..Default::default()
                })
                .await
                .map_err(|e| Error::Backend {
                    device: id,
                    message: format!("opening {}: {e}", info.name),
                    source: Some(Box::new(e)),
                })?;
            log::info!(
                "devalloc: {id} is {} ({:?}, {:?}), {route:?} copies",
                info.name,
                info.device_type,
                info.backend
            );
            devices.push(Self::open_pool(device, queue, id, route, &options));
        }
        Ok(PooledAllocator::from_pools(device_type, devices))
    }

    #[cfg(native)]
    async fn adapters(instance: &wgpu::Instance, backend: wgpu::Backend) -> Vec<wgpu::Adapter> {
        instance.enumerate_adapters(backend.into()).await
    }

    #[cfg(web)]
    async fn adapters(instance: &wgpu::Instance, backend: wgpu::Backend) -> Vec<wgpu::Adapter> {
        // The browser offers one adapter, through request_adapter; WebGL2 gives one only for a
        // surface, so the GL backend gets a 1x1 offscreen canvas.
        let surface = if backend == wgpu::Backend::Gl {
            web_sys::OffscreenCanvas::new(1, 1)
                .ok()
                .and_then(|c| instance.create_surface(wgpu::SurfaceTarget::OffscreenCanvas(c)).ok())
        } else {
            None
        };
        let opts = wgpu::RequestAdapterOptions { compatible_surface: surface.as_ref(), ..Default::default() };
        instance.request_adapter(&opts).await.into_iter().collect()
    }

    fn open_pool(
        device: wgpu::Device,
        queue: wgpu::Queue,
        id: Device,
        route: Route,
        o: &WgpuOptions,
    ) -> Pool<WgpuStorage> {
        let unified = matches!(
            device.adapter_info().device_type,
            wgpu::DeviceType::Cpu | wgpu::DeviceType::IntegratedGpu
        );
        let chunk = o.staging_chunk.unwrap_or(if unified { 2 << 20 } else { 8 << 20 });
        let mut usage = o.usage | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        if route == Route::Direct {
            usage |= wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::MAP_WRITE;
        }
        let storage = WgpuStorage::new(device, queue, id, usage, route, chunk);
        Pool::new(storage, PoolConfig { caching: o.caching, memory_limit: o.memory_limit })
    }

    /// Puts devalloc in front of a device and queue the app already has (device index 0),
    /// with default options. Copies are staged unless the device was opened with
    /// `MAPPABLE_PRIMARY_BUFFERS` on unified memory.
    pub fn from_device(device: wgpu::Device, queue: wgpu::Queue) -> Result<Self> {
        Self::from_device_with(device, queue, WgpuOptions::default())
    }

    /// [`WgpuAllocator::from_device`] with options.
    pub fn from_device_with(device: wgpu::Device, queue: wgpu::Queue, options: WgpuOptions) -> Result<Self> {
        let info = device.adapter_info();
        let device_type = device_type_of(info.backend).ok_or_else(|| {
            Error::invalid_argument(format!("a {:?} device has no memory devalloc can serve", info.backend))
        })?;
        let id = Device::new(device_type, 0);
        let unified = matches!(info.device_type, wgpu::DeviceType::Cpu | wgpu::DeviceType::IntegratedGpu);
        let mappable = device.features().contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS);
        let route = match options.map_mode {
            MapMode::Auto if unified && mappable => Route::Direct,
            MapMode::Direct if mappable => Route::Direct,
            MapMode::Direct => {
                return Err(Error::NotSupported {
                    operation: "direct mapping",
                    device_type,
                    reason: "the device was opened without MAPPABLE_PRIMARY_BUFFERS".into(),
                })
            }
            _ => Route::Staged,
        };
        Ok(PooledAllocator::from_pools(
            device_type,
            vec![Self::open_pool(device, queue, id, route, &options)],
        ))
    }

    /// The wgpu device of `index`.
    pub fn device(&self, index: DeviceIndex) -> Result<&wgpu::Device> {
        Ok(&self.pool(index)?.storage().device)
    }

    /// The wgpu queue of `index`.
    pub fn queue(&self, index: DeviceIndex) -> Result<&wgpu::Queue> {
        Ok(&self.pool(index)?.storage().queue)
    }

    /// The adapter behind device `index`.
    pub fn adapter_info(&self, index: DeviceIndex) -> Result<&wgpu::AdapterInfo> {
        Ok(&self.pool(index)?.storage().info)
    }

    /// The route host<->device copies take on device `index`.
    pub fn route(&self, index: DeviceIndex) -> Result<Route> {
        Ok(self.pool(index)?.storage().route())
    }

    /// The buffer and byte range behind `len` bytes at `ptr`, checked against the allocation.
    pub fn buffer(&self, ptr: DevicePtr, len: u64, index: DeviceIndex) -> Result<BufferRange> {
        let r = self.pool(index)?.resolve(ptr, len)?;
        Ok(BufferRange { buffer: r.block.buffer().clone(), range: r.offset..r.offset + len })
    }

    /// Allocates memory that reads as zeros (a reused buffer is cleared on the GPU).
    pub fn allocate_zeroed(&self, nbytes: usize, index: DeviceIndex, alignment: usize) -> Result<DevicePtr> {
        let pool = self.pool(index)?;
        let ptr = pool.allocate(nbytes, alignment)?;
        let r = pool.resolve(ptr, nbytes as u64)?;
        let len = r.block.buffer().size();
        if let Err(e) = pool.storage().clear(&r.block, 0, len) {
            let _ = pool.deallocate(ptr);
            return Err(e);
        }
        Ok(ptr)
    }

    /// Resolves once the GPU has finished all work submitted to device `index`, without
    /// blocking (the browser's way to wait; works on every backend).
    pub async fn synchronize_async(&self, index: DeviceIndex) -> Result<()> {
        self.pool(index)?.storage().idle().await
    }

    /// Maps `buffer[range]` of device `index` (an app's own buffer too) and resolves once it
    /// can be read or written with `get_mapped_range`; on WebGL2 this polls the device as wgpu
    /// requires there.
    pub async fn map_buffer_async(
        &self,
        index: DeviceIndex,
        buffer: &wgpu::Buffer,
        mode: wgpu::MapMode,
        range: Range<u64>,
    ) -> Result<()> {
        self.pool(index)?.storage().map_buffer(buffer, mode, range).await
    }

    /// Waits until the GPU has finished all work submitted to device `index` (blocking on
    /// native; in the browser it only flushes: use [`WgpuAllocator::synchronize_async`]).
    pub fn synchronize(&self, index: DeviceIndex) -> Result<()> {
        self.pool(index)?.storage().synchronize()
    }
}

/// Opens every wgpu backend this machine offers (blocking, native) and registers each that
/// has a usable adapter into `registry`. Returns one line per backend saying what happened.
#[cfg(native)]
pub fn register_wgpu_backends(registry: &DeviceAllocatorRegistry, options: &WgpuOptions) -> Vec<String> {
    let mut report = Vec::new();
    for backend in BACKENDS {
        let Some(ty) = device_type_of(backend) else { continue };
        if !wgpu::Instance::enabled_backend_features().contains(backend.into()) || ty == DeviceType::WebGpu {
            continue;
        }
        if registry.get_allocator(ty).is_some() {
            report.push(format!("{ty}: already registered"));
            continue;
        }
        match WgpuAllocator::new_with(backend, options.clone()) {
            Ok(a) => {
                let names: Vec<String> = (0..a.device_count() as DeviceIndex)
                    .filter_map(|i| a.adapter_info(i).ok().map(|x| x.name.clone()))
                    .collect();
                let a: &'static WgpuAllocator = Box::leak(Box::new(a));
                match registry.register_allocator(a) {
                    Ok(()) => report.push(format!("{ty}: wgpu, {}", names.join(", "))),
                    Err(e) => report.push(format!("{ty}: {e}")),
                }
            }
            Err(e) => report.push(format!("{ty}: not available: {e}")),
        }
    }
    report
}

#[cfg(all(test, native))]
mod assertions {
    static_assertions::assert_impl_all!(super::WgpuAllocator: Send, Sync);
}
