//! [`WgpuOptions`], the copy [`Route`], and how a route is chosen for a device.

use std::fmt;
use std::sync::Arc;

use super::platform::{Current, Platform};
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
    /// Usage of buffers allocated without one of their own (default `STORAGE`; `COPY_SRC |
    /// COPY_DST` are always added, as devalloc copies through them; `MAP_READ` / `MAP_WRITE` are refused: they are
    /// devalloc's to set). `WgpuAllocator::allocate_request` picks usage per allocation.
    pub usage: wgpu::BufferUsages,
    /// Size of one staging buffer, and so of one chunk of a large copy. `None`: natively 4 MiB
    /// on CPU and integrated adapters, 8 MiB on discrete GPUs (chosen by measurement: see
    /// `examples/bench`); on the browser's WebGPU 64 MiB (each map is a round trip to the GPU
    /// process: fewer, larger ones win); on WebGL2 8 MiB (there wgpu emulates mapping, and
    /// every staging buffer is a copy in wasm memory: with 64 MiB chunks a 35 MB stream grew
    /// the page's memory by 213-281 MB, with 8 MiB by 27-47 MB).
    pub staging_chunk: Option<u64>,
    /// Most bytes of staging buffers devalloc keeps per device (`None`: 8 chunks). Staging
    /// beyond it is released as soon as its copy is done, and a large upload waits for its
    /// earlier chunks rather than make more.
    pub staging_budget: Option<u64>,
    /// How wgpu's own allocator beneath devalloc sizes its memory blocks, when devalloc opens
    /// the device itself (an adopted device keeps the app's choice; the browser decides for
    /// itself). Default: `MemoryHints::Manual` with 4 MiB blocks (the smallest wgpu allows), so
    /// that what the backend holds stays close to what devalloc holds: on lavapipe, 1.02-1.23x
    /// devalloc's peak reserved over the model histories, where wgpu's own default
    /// (`Performance`, 64-256 MiB blocks) held 67,108,864 bytes for a history that peaks at
    /// 18 MB. Buffers larger than a block get memory of their own; buffers of 2-4 MiB cost wgpu
    /// most (1.44x when all are so). `MemoryHints::Performance` for wgpu's default: fewer,
    /// larger device allocations.
    pub memory_hints: wgpu::MemoryHints,
    /// The largest buffer devalloc makes; `None` (the default): the device's `max_buffer_size`.
    /// An allocation past it (rounded down to the device's binding alignment) is served as one
    /// address range over several buffers, its segments, each of that size but the last (see [`crate::wgpu::WgpuAllocator::segments`]). Set it
    /// below the device's to test segmented memory at small sizes, or to leave room on a
    /// device shared with others. At least 256 bytes.
    pub max_buffer_size: Option<u64>,
    /// Called once when the device is lost. wgpu keeps one lost callback per device and cannot
    /// hand back one already set, so devalloc, which needs the callback to notice a loss, takes
    /// it: an app that adopts its device must not set the device's lost callback itself
    /// afterwards (that would blind devalloc), and gives its own here instead. On native it
    /// may run on devalloc's polling thread: it must not call back into devalloc. A panic in
    /// it, or in a map callback of the app's that a devalloc poll or submit happens to run, is
    /// caught there and logged; the device is taken as lost only if wgpu then says it is no
    /// longer valid, so a panicking app callback never takes a healthy device away.
    pub on_device_lost: Option<DeviceLostHandler>,
}

impl Default for WgpuOptions {
    fn default() -> Self {
        WgpuOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            required_limits: None,
            allow_software: true,
            pool: PoolOptions::default(),
            route: None,
            usage: wgpu::BufferUsages::STORAGE,
            staging_chunk: None,
            staging_budget: None,
            memory_hints: wgpu::MemoryHints::Manual {
                suballocated_device_memory_block_size: (4 << 20)..(4 << 20),
            },
            on_device_lost: None,
            max_buffer_size: None,
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
        if self.max_buffer_size.is_some_and(|m| m < 256) {
            return Err(crate::error::Error::invalid_argument(format!(
                "WgpuOptions::max_buffer_size: {:?} bytes is under the 256 a segment needs",
                self.max_buffer_size
            )));
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
            .field("memory_hints", &self.memory_hints)
            .field("on_device_lost", &self.on_device_lost.as_ref().map(|_| "Fn"))
            .field("max_buffer_size", &self.max_buffer_size)
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

/// How the staged route is tuned for one adapter: the backend's choices, measured (each
/// field says where), which differ between native and the browser.
pub(crate) struct Tuning {
    /// Bytes of one staging buffer: one chunk of a large copy (see [`WgpuOptions::staging_chunk`]).
    pub chunk: u64,
    /// Uploads up to this size go through the queue's own staging (`write_buffer_with`, or
    /// `write_buffer` on browser WebGPU).
    pub small_upload: u64,
    /// Downloads up to this size get a staging buffer of their own (not one kept from an
    /// earlier download).
    pub fresh_downloads: u64,
}

impl Tuning {
    /// The tuning of `info`'s adapter under `options`, within `max_buffer`.
    pub(crate) fn of(options: &WgpuOptions, info: &wgpu::AdapterInfo, max_buffer: u64) -> Self {
        let gl = info.backend == wgpu::Backend::Gl;
        let browser = Current::IN_BROWSER;
        // The chunk, when the options name none. Native: 4 MiB where the host shares the
        // adapter's memory, 8 MiB elsewhere (lavapipe, 2 cores, against a StagingBelt as large
        // as the whole transfer: with 8 chunks of staging, 2 MiB chunks lose at 256 MiB, 0.55x:
        // the queue cannot keep up with that many submissions; 4 and 8 MiB win at 16-256 MiB).
        // Browser: 64 MiB, as every map is a round trip to the GPU process; WebGL2: 8 MiB, as
        // there each staging buffer is a `Vec` in wasm memory (wgpu-hal 30's gles
        // `create_buffer` under EMULATE_BUFFER_MAP) and the budget is 8 chunks (the page's
        // "Load a model" card, 2026-12-07: wasm memory grew by 213-281 MB for 35 MB streamed
        // with 64 MiB chunks, 27-47 MB with 8 MiB; the page's bench, under load, 0.94-0.95x the
        // `StagingBelt` peer at 16-64 MiB uploads against 1.01-1.02x, downloads 0.98-1.48x).
        let auto = match (browser, unified(info.device_type)) {
            (true, _) if gl => 8 << 20,
            (true, _) => 64 << 20,
            (false, true) => 4 << 20,
            (false, false) => 8 << 20,
        };
        let want = options.staging_chunk.unwrap_or(auto).max(64 << 10);
        let chunk = want.min(max_buffer).max(4) & !3;
        // Small uploads. Native Vulkan & co.: the queue's staging up to 64 KiB (lavapipe,
        // 2026-12-07: `write_buffer` 0.58 GB/s against a `StagingBelt`'s 0.53 at 64 KiB, but
        // 1.0 against 3.6 at 1 MiB, where the queue's staging makes a buffer per call; on
        // 2026-12-03 the queue had won up to 1 MiB, 1.00-1.05x against 0.86-0.94x). Native GL: never
        // (`write_buffer_with` makes a GL buffer per call; the belt measured 0.93-0.99x
        // `StagingBelt` at 4 KiB-1 MiB against 0.86-0.96x). Browser WebGPU: always
        // (`writeBuffer` copies straight out of wasm memory: the fastest upload at every size).
        // WebGL2: up to 4 MiB (the queue's staging wins up to 1 MiB, the belt from 16 MiB: the
        // page's bench).
        let small_upload = match (browser, gl) {
            (false, false) => 64 << 10,
            (false, true) => 0,
            (true, false) => u64::MAX,
            (true, true) => 4 << 20,
        };
        // Fresh download staging: on WebGL2, for every read. There a map for reading reads back
        // the whole buffer (wgpu-hal emulates mapping with `getBufferSubData`), and Chromium
        // warns on every reuse of a read buffer ("READ-usage buffer was written, then fenced,
        // but written again before being read back"), 256 times and then "too many errors",
        // which hides every later real error of the page. A fresh buffer per read is quiet; it
        // costs large reads (the page's bench: 16-64 MiB at ~0.6-1.0 GB/s against ~0.7-1.4
        // reused), and is faster for small ones (4 KiB 0.007 against 0.002 GB/s). Natively
        // reusing them is what makes small reads fast.
        let fresh_downloads = if browser && gl { u64::MAX } else { 0 };
        // No upload does more than a chunk's work in one poll: the queue's staging takes at most
        // a chunk too.
        let small_upload = small_upload.min(chunk);
        Tuning { chunk, small_upload, fresh_downloads }
    }
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
