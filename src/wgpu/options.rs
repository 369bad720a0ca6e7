//! [`WgpuOptions`], the copy [`Route`], and how a route is chosen for a device.

use std::fmt;
use std::sync::Arc;

use crate::device::DeviceType;
use crate::error::{Error, Result};
use crate::pool::PoolOptions;

/// How host<->device copies reach a device's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Through reusable staging buffers (every adapter).
    Staged,
    /// By mapping the buffers themselves (unified memory with `MAPPABLE_PRIMARY_BUFFERS`).
    Direct,
}

/// Called once when a device devalloc uses is lost, with wgpu's reason and message, after
/// devalloc has recorded the loss (see [`WgpuOptions::on_device_lost`]).
pub type DeviceLostHandler = Arc<dyn Fn(wgpu::DeviceLostReason, &str) + Send + Sync>;

/// Options of a [`crate::wgpu::WgpuAllocator`].
#[derive(Clone)]
pub struct WgpuOptions {
    /// Which adapters come first when devalloc opens them itself (see `WgpuAllocator::new`).
    pub power_preference: wgpu::PowerPreference,
    /// Limits to ask each device for; `None` asks for everything the adapter offers (so
    /// `max_buffer_size` is the adapter's, not wgpu's 256 MiB default).
    pub required_limits: Option<wgpu::Limits>,
    /// Whether software adapters (lavapipe, llvmpipe, SwiftShader, WARP) count.
    pub allow_software: bool,
    /// The pool's settings: caching (on by default here), memory limit, the debug setting
    /// that never reuses freed buffers.
    pub pool: PoolOptions,
    /// The copy route; `None` (the default) picks direct mapping where the adapter has unified
    /// memory (CPU or integrated) and offers `MAPPABLE_PRIMARY_BUFFERS`, staging elsewhere. A
    /// forced `Direct` is an error where the device cannot map its buffers.
    pub route: Option<Route>,
    /// Usage of buffers allocated without one of their own (`COPY_SRC | COPY_DST` are always
    /// added, as devalloc copies through them; `MAP_READ` / `MAP_WRITE` are refused: they are
    /// devalloc's to set). `WgpuAllocator::allocate_request` picks usage per allocation.
    pub usage: wgpu::BufferUsages,
    /// Size of one staging buffer, and so of one chunk of a large copy. `None`: natively 4 MiB
    /// on CPU and integrated adapters, 8 MiB on discrete GPUs (chosen by measurement: see
    /// `examples/bench`); in the browser 64 MiB (each map is a round trip to the GPU process:
    /// fewer, larger ones win).
    pub staging_chunk: Option<u64>,
    /// Most bytes of staging buffers devalloc keeps per device (`None`: 8 chunks). Staging
    /// beyond it is released as soon as its copy is done, and a large upload waits for its
    /// earlier chunks rather than make more.
    pub staging_budget: Option<u64>,
    /// Called once when the device is lost. wgpu keeps one lost callback per device and cannot
    /// hand back one already set, so devalloc, which needs the callback to notice a loss, takes
    /// it: an app that adopts its device must not set the device's lost callback itself
    /// afterwards (that would blind devalloc), and gives its own here instead. On native it
    /// may run on devalloc's polling thread: it must not call back into devalloc, and a panic
    /// in it (or in a map callback of the app's that a devalloc poll runs) is caught there and
    /// taken as a driver-level loss of the device.
    pub on_device_lost: Option<DeviceLostHandler>,
}

impl Default for WgpuOptions {
    fn default() -> Self {
        WgpuOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            required_limits: None,
            allow_software: true,
            pool: PoolOptions { caching: true, ..PoolOptions::default() },
            route: None,
            usage: wgpu::BufferUsages::STORAGE,
            staging_chunk: None,
            staging_budget: None,
            on_device_lost: None,
        }
    }
}

impl WgpuOptions {
    /// Refuses settings no allocator of `device` can work with (checked before a device is
    /// opened or adopted, so that a refusal changes nothing).
    pub(crate) fn check(&self, device: crate::device::Device) -> crate::error::Result<()> {
        self.pool.check(device)?;
        if self.usage.intersects(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::MAP_WRITE) {
            return Err(crate::error::Error::invalid_argument(
                "WgpuOptions::usage: MAP_READ / MAP_WRITE are devalloc's to set (the direct route maps buffers itself)",
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for WgpuOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WgpuOptions")
            .field("power_preference", &self.power_preference)
            .field("required_limits", &self.required_limits)
            .field("allow_software", &self.allow_software)
            .field("pool", &self.pool)
            .field("route", &self.route)
            .field("usage", &self.usage)
            .field("staging_chunk", &self.staging_chunk)
            .field("staging_budget", &self.staging_budget)
            .field("on_device_lost", &self.on_device_lost.as_ref().map(|_| "Fn"))
            .finish()
    }
}

/// Whether an adapter of this type shares memory with the host.
pub(crate) fn unified(t: wgpu::DeviceType) -> bool {
    matches!(t, wgpu::DeviceType::Cpu | wgpu::DeviceType::IntegratedGpu)
}

/// The route a device takes: `wanted` where it can, else what the adapter allows (see
/// [`WgpuOptions::route`]). `mappable`: the device has `MAPPABLE_PRIMARY_BUFFERS` (or, before
/// it is opened, its adapter offers it).
pub(crate) fn choose_route(
    wanted: Option<Route>,
    info: &wgpu::AdapterInfo,
    mappable: bool,
    device_type: DeviceType,
) -> Result<Route> {
    match wanted {
        None if unified(info.device_type) && mappable => Ok(Route::Direct),
        None | Some(Route::Staged) => Ok(Route::Staged),
        Some(Route::Direct) if mappable => Ok(Route::Direct),
        Some(Route::Direct) => Err(Error::NotSupported {
            operation: "direct mapping",
            device_type,
            reason: format!("{} ({:?}) has no MAPPABLE_PRIMARY_BUFFERS", info.name, info.backend),
        }),
    }
}

/// The staging chunk of a device: the option, else by adapter type; within the device's
/// largest buffer and at least 64 KiB where the device allows it.
pub(crate) fn staging_chunk(options: &WgpuOptions, info: &wgpu::AdapterInfo, max_buffer: u64) -> u64 {
    let auto = super::platform::default_chunk(info);
    let want = options.staging_chunk.unwrap_or(auto).max(64 << 10);
    want.min(max_buffer).max(4) & !3
}

/// The [`DeviceType`] of a wgpu backend, or `None` for backends without device memory (noop).
pub(crate) fn device_type_of(backend: wgpu::Backend) -> Option<DeviceType> {
    match backend {
        wgpu::Backend::Vulkan => Some(DeviceType::Vulkan),
        wgpu::Backend::Metal => Some(DeviceType::Metal),
        wgpu::Backend::Dx12 => Some(DeviceType::Dx12),
        wgpu::Backend::Gl => Some(DeviceType::Gl),
        wgpu::Backend::BrowserWebGpu => Some(DeviceType::WebGpu),
        _ => None,
    }
}

/// Sort rank of an adapter type: discrete first (integrated first under `LowPower`), then
/// integrated, virtual, CPU, other.
pub(crate) fn type_rank(t: wgpu::DeviceType, pref: wgpu::PowerPreference) -> u8 {
    match (t, pref) {
        (wgpu::DeviceType::IntegratedGpu, wgpu::PowerPreference::LowPower) => 0,
        (wgpu::DeviceType::DiscreteGpu, _) => 1,
        (wgpu::DeviceType::IntegratedGpu, _) => 2,
        (wgpu::DeviceType::VirtualGpu, _) => 3,
        (wgpu::DeviceType::Cpu, _) => 4,
        _ => 5,
    }
}
