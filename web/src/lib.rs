//! The browser demo of devalloc (wasm32 only): JS bindings over one `WgpuAllocator` on the
//! page's WebGPU adapter (WebGL2 with the `webgl` feature), a benchmark against the ways a
//! careful wgpu user would copy without devalloc, and the data the page's charts draw.
//!
//! Every argument that comes from JS is checked: sizes, lengths and alignments are
//! non-negative safe integers that fit, pointers are BigInts below 2^64; anything else is an
//! exception that names the argument. Every devalloc error arrives in JS as an exception with
//! devalloc's message. Reads return promises: in the browser nothing may block.
#![cfg(target_arch = "wasm32")]

mod bench;
mod network;

use devalloc::wgpu::{WgpuAllocator, WgpuOptions};
use devalloc::{DeviceAllocator, DeviceAllocatorRegistry, DevicePtr, DEFAULT_ALIGNMENT};
use js_sys::Promise;
use serde::Serialize;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

pub(crate) use devalloc::wgpu::api as wgpu;

/// A devalloc error as a JS exception.
pub(crate) fn js(e: devalloc::Error) -> JsValue {
    JsError::new(&e.to_string()).into()
}

/// A JS value for a serialisable Rust one.
pub(crate) fn to_js<T: Serialize>(v: &T) -> Result<JsValue, JsValue> {
    serde_wasm_bindgen::to_value(v).map_err(|e| JsError::new(&e.to_string()).into())
}

/// `value` as a byte count: a non-negative safe integer that fits in this build's `usize`.
fn count(value: &JsValue, name: &str) -> Result<usize, JsValue> {
    let bad = |why: &str| -> JsValue { JsError::new(&format!("{name} must be {why}, got {value:?}")).into() };
    let n = value.as_f64().ok_or_else(|| bad("a number"))?;
    if !js_sys::Number::is_safe_integer(value) || n < 0.0 {
        return Err(bad("a non-negative safe integer"));
    }
    usize::try_from(n as u64).map_err(|_| bad(&format!("at most {} here", usize::MAX)))
}

/// `value` as a device address: a BigInt from 0 to 2^64 - 1.
fn address(value: &JsValue, name: &str) -> Result<DevicePtr, JsValue> {
    if !value.is_bigint() {
        return Err(JsError::new(&format!("{name} must be a BigInt device address, got {value:?}")).into());
    }
    u64::try_from(value.clone())
        .map(DevicePtr::new)
        .map_err(|_| JsError::new(&format!("{name} must be from 0 to 2^64 - 1, got {value:?}")).into())
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AdapterJs {
    name: String,
    vendor: u32,
    architecture: String,
    device_type: String,
    backend: String,
    driver: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct LimitsJs {
    max_buffer_size: u64,
    max_storage_buffer_binding_size: u64,
    min_storage_buffer_offset_alignment: u32,
}

#[derive(Serialize)]
struct DeviceJs {
    device: String,
    name: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatsJs {
    allocated: u64,
    reserved: u64,
    cached: u64,
    staging: u64,
    peak_allocated: u64,
    peak_reserved: u64,
    live: u64,
    hits: u64,
    misses: u64,
}

/// devalloc in the browser: one WgpuAllocator on the page's adapter, registered globally.
#[wasm_bindgen]
pub struct Devalloc {
    alloc: &'static WgpuAllocator,
}

#[wasm_bindgen]
impl Devalloc {
    /// Opens the browser's WebGPU adapter (WebGL2 when built with `webgl` and WebGPU is
    /// missing) and registers it in the global registry.
    pub async fn init() -> Result<Devalloc, JsError> {
        let _ = console_log::init_with_level(log::Level::Info);
        let mut last = None;
        for backend in [wgpu::Backend::BrowserWebGpu, wgpu::Backend::Gl] {
            if !wgpu::Instance::enabled_backend_features().contains(backend.into()) {
                continue;
            }
            match WgpuAllocator::with_options_async(backend, WgpuOptions::default()).await {
                Ok(a) => {
                    let alloc: &'static WgpuAllocator = Box::leak(Box::new(a));
                    if let Err(e) = DeviceAllocatorRegistry::instance().register_allocator(alloc) {
                        log::warn!("devalloc: {e}");
                    }
                    return Ok(Devalloc { alloc });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(JsError::new(&last.map_or("this build has no browser backend".into(), |e| e.to_string())))
    }

    /// "webgpu" or "gl".
    #[wasm_bindgen(getter)]
    pub fn backend(&self) -> String {
        self.alloc.device_type().to_string()
    }

    /// The adapter: name, vendor, architecture, device type, backend, driver.
    pub fn adapter(&self) -> Result<JsValue, JsValue> {
        let i = self.alloc.adapter_info(0).map_err(js)?;
        to_js(&AdapterJs {
            name: i.name.clone(),
            vendor: i.vendor,
            architecture: i.device.to_string(),
            device_type: format!("{:?}", i.device_type),
            backend: format!("{:?}", i.backend),
            driver: i.driver.clone(),
        })
    }

    /// The limits that matter for memory.
    pub fn limits(&self) -> Result<JsValue, JsValue> {
        let l = self.alloc.device(0).map_err(js)?.limits();
        to_js(&LimitsJs {
            max_buffer_size: l.max_buffer_size,
            max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
            min_storage_buffer_offset_alignment: l.min_storage_buffer_offset_alignment,
        })
    }

    /// Every registered device: `[{device: "webgpu:0", name}]`.
    pub fn devices(&self) -> Result<JsValue, JsValue> {
        let mut out = Vec::new();
        for a in DeviceAllocatorRegistry::instance().allocators() {
            for i in 0..a.device_count() as u32 {
                out.push(DeviceJs { device: format!("{}:{i}", a.device_type()), name: a.device_name(i) });
            }
        }
        to_js(&out)
    }

    /// Allocates `nbytes` (alignment: 256 when omitted); returns the address as a BigInt.
    pub fn allocate(&self, nbytes: JsValue, alignment: JsValue) -> Result<u64, JsValue> {
        let n = count(&nbytes, "nbytes")?;
        let align =
            if alignment.is_undefined() { DEFAULT_ALIGNMENT } else { count(&alignment, "alignment")? };
        self.alloc.allocate(n, 0, align).map(DevicePtr::addr).map_err(js)
    }

    /// Frees an allocation.
    pub fn deallocate(&self, ptr: JsValue) -> Result<(), JsValue> {
        self.alloc.deallocate(address(&ptr, "ptr")?, 0).map_err(js)
    }

    /// Writes bytes at `ptr` (any offset and length); resolves once queued on the GPU.
    pub fn write(&self, ptr: JsValue, data: Vec<u8>) -> Result<Promise, JsValue> {
        let (a, ptr) = (self.alloc, address(&ptr, "ptr")?);
        Ok(future_to_promise(async move {
            a.copy_host_to_device_async(ptr, &data, 0).await.map_err(js)?;
            Ok(JsValue::UNDEFINED)
        }))
    }

    /// Writes floats at `ptr`.
    pub fn write_f32(&self, ptr: JsValue, data: Vec<f32>) -> Result<Promise, JsValue> {
        self.write(ptr, bytemuck::cast_slice(&data).to_vec())
    }

    /// Reads `len` bytes at `ptr`; resolves to a `Uint8Array`.
    pub fn read(&self, ptr: JsValue, len: JsValue) -> Result<Promise, JsValue> {
        let (a, ptr, len) = (self.alloc, address(&ptr, "ptr")?, count(&len, "len")?);
        Ok(future_to_promise(async move {
            let mut out = vec![0u8; len];
            a.copy_device_to_host_async(&mut out, ptr, 0).await.map_err(js)?;
            Ok(js_sys::Uint8Array::from(&out[..]).into())
        }))
    }

    /// Reads `count` floats at `ptr`; resolves to a `Float32Array`.
    pub fn read_f32(&self, ptr: JsValue, n: JsValue) -> Result<Promise, JsValue> {
        let (a, ptr, n) = (self.alloc, address(&ptr, "ptr")?, count(&n, "count")?);
        let bytes = n.checked_mul(4).ok_or_else(|| JsValue::from(JsError::new("count * 4 overflows")))?;
        Ok(future_to_promise(async move {
            let mut out = vec![0f32; bytes / 4];
            a.copy_device_to_host_async(bytemuck::cast_slice_mut(&mut out), ptr, 0).await.map_err(js)?;
            Ok(js_sys::Float32Array::from(&out[..]).into())
        }))
    }

    /// The allocator's statistics.
    pub fn stats(&self) -> Result<JsValue, JsValue> {
        let s = self.alloc.stats(0).map_err(js)?;
        to_js(&StatsJs {
            allocated: s.allocated_bytes,
            reserved: s.reserved_bytes,
            cached: s.cached_bytes,
            staging: s.staging_bytes,
            peak_allocated: s.peak_allocated_bytes,
            peak_reserved: s.peak_reserved_bytes,
            live: s.live_allocations,
            hits: s.cache_hits,
            misses: s.cache_misses,
        })
    }

    /// Gives cached buffers back to the browser; returns the bytes freed.
    pub fn empty_cache(&self) -> f64 {
        self.alloc.empty_cache() as f64
    }

    /// Starts recording the newest `events` events (0 stops); see `snapshot`.
    pub fn record_history(&self, events: JsValue) -> Result<(), JsValue> {
        self.alloc.record_history(count(&events, "events")?).map_err(js)
    }

    /// A snapshot of the allocator (devalloc's snapshot format, as a JS object).
    pub fn snapshot(&self) -> Result<JsValue, JsValue> {
        let snap = self.alloc.snapshot().map_err(js)?;
        // Through JSON text, so that the page sees exactly what a snapshot file holds.
        js_sys::JSON::parse(&snap.to_json())
    }

    /// Runs a few dense layers of a network in WGSL on devalloc memory (weights in labelled
    /// allocations, activations in one planned buffer); resolves to max |gpu - cpu|.
    pub fn run_network(&self) -> Promise {
        let a = self.alloc;
        future_to_promise(async move {
            let worst = network::run(a, &[256, 512, 256, 128, 10]).await.map_err(js)?;
            Ok(JsValue::from(worst))
        })
    }

    /// Measures upload and download of `size` bytes through devalloc and the peers a careful
    /// wgpu user would pick here, interleaved round by round; resolves to the medians.
    pub fn bench(&self, size: JsValue, reps: JsValue) -> Result<Promise, JsValue> {
        let (a, size, reps) = (self.alloc, count(&size, "size")?, count(&reps, "reps")?.max(1));
        Ok(future_to_promise(async move {
            let r = bench::run(a, size, reps).await.map_err(js)?;
            to_js(&r)
        }))
    }
}
