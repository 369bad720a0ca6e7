//! The browser demo of devalloc (wasm32 only): JS bindings over one `WgpuAllocator` on the
//! page's WebGPU adapter (WebGL2 with the `webgl` feature), a benchmark against the ways a
//! careful wgpu user would copy without devalloc, a replay of snapshot histories under a
//! memory limit, and the data the page's charts draw.
//!
//! Every argument that comes from JS is checked (`args.rs`): sizes, lengths and alignments are
//! non-negative whole numbers that fit, pointers are BigInts below 2^64; anything else is an
//! exception that names the argument in JS's words. Every devalloc error arrives in JS as an
//! exception with devalloc's message. Reads return promises: in the browser nothing may block.
#![cfg(target_arch = "wasm32")]

mod args;
mod bench;
mod model;
/// The network of `examples/mlp.rs`, shared: activations on a plan from devalloc's planner.
#[path = "../../examples/support/network.rs"]
mod network;
mod peers;
mod replay;

use std::cell::RefCell;
use std::sync::Arc;

use devalloc::wgpu::{DeviceLostHandler, WgpuAllocator, WgpuOptions};
use devalloc::{
    DeviceAllocator, DeviceAllocatorRegistry, DeviceType, RegistrationOutcome, DEFAULT_ALIGNMENT,
};
use js_sys::Promise;
use serde::Serialize;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use args::{address, count, describe};
pub use replay::replay_snapshot;

pub(crate) use devalloc::wgpu::api as wgpu;

/// A devalloc error as a JS exception.
pub(crate) fn js(e: devalloc::Error) -> JsValue {
    JsError::new(&e.to_string()).into()
}

/// A JS value for a serialisable Rust one.
pub(crate) fn to_js<T: Serialize>(v: &T) -> Result<JsValue, JsValue> {
    serde_wasm_bindgen::to_value(v).map_err(|e| JsError::new(&e.to_string()).into())
}

thread_local! {
    /// The page's `onLost` callback.
    static ON_LOST: RefCell<Option<js_sys::Function>> = const { RefCell::new(None) };
    /// What devalloc's `on_device_lost` said, and how many times it was called.
    static LOST: RefCell<(u32, Option<String>)> = const { RefCell::new((0, None)) };
}

/// What devalloc's `on_device_lost` said, once it has been called.
pub(crate) fn lost() -> Option<String> {
    LOST.with_borrow(|l| l.1.clone())
}

/// The page's `on_device_lost`: notes the loss, then calls the page's callback from a
/// microtask (never from inside the devalloc call that noticed the loss).
fn on_lost() -> DeviceLostHandler {
    Arc::new(|reason, message: &str| {
        let text = format!("{reason:?}: {message}");
        LOST.with_borrow_mut(|l| {
            l.0 += 1;
            l.1.get_or_insert_with(|| text.clone());
        });
        wasm_bindgen_futures::spawn_local(async move {
            if let Some(f) = ON_LOST.with_borrow(|f| f.clone()) {
                if let Err(e) = f.call1(&JsValue::NULL, &text.into()) {
                    log::warn!("the page's onLost callback threw: {}", describe(&e));
                }
            }
        });
    })
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AdapterJs {
    /// What the browser says the adapter is: WebGPU's `GPUAdapterInfo` (vendor, architecture,
    /// device, description), WebGL2's renderer string; empty where it says nothing.
    vendor: String,
    architecture: String,
    description: String,
    device_type: String,
    backend: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct LimitsJs {
    max_buffer_size: u64,
    /// 0 where the device has no storage buffers (WebGL2).
    max_storage_buffer_binding_size: u64,
    storage_buffers: bool,
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

/// `n` zeroed values to read into, or an exception naming `name` where this page's memory
/// cannot hold them (a wasm32 page has 4 GiB at most: a failed allocation would abort it).
fn room<T: Clone + Default>(n: usize, name: &str, unit: &str) -> Result<Vec<T>, JsValue> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        args::error(format!("{name} is too large: {n} {unit} do not fit in this page's memory"))
    })?;
    v.resize(n, T::default());
    Ok(v)
}

/// The benchmark's largest size: it keeps six copies of the data in this page's memory.
const BENCH_MAX: usize = 256 << 20;

/// `value` as a benchmark size: from 1 byte to [`BENCH_MAX`].
fn bench_size(value: &JsValue) -> Result<usize, JsValue> {
    let size = count(value, "size", "bytes")?;
    if size == 0 || size > BENCH_MAX {
        return Err(args::error(format!(
            "size must be from 1 to {BENCH_MAX} bytes (the benchmark keeps six copies in this page's memory), got {size}"
        )));
    }
    Ok(size)
}

/// A string property of a JS object, or "".
fn text_of(object: &JsValue, key: &str) -> String {
    js_sys::Reflect::get(object, &key.into()).ok().and_then(|v| v.as_string()).unwrap_or_default()
}

/// devalloc in the browser: one WgpuAllocator on the page's adapter, registered globally.
#[wasm_bindgen]
pub struct Devalloc {
    alloc: &'static WgpuAllocator,
    /// Why WebGPU was not used, where the page fell back to WebGL2.
    fallback: Option<String>,
}

#[wasm_bindgen]
impl Devalloc {
    /// Opens the browser's WebGPU adapter (WebGL2 when built with `webgl` and WebGPU has no
    /// adapter) and registers it in the global registry. `on_lost(message)` is called once if
    /// the device is lost (after which every call fails with devalloc's DeviceLost).
    pub async fn init(on_lost_js: Option<js_sys::Function>) -> Result<Devalloc, JsError> {
        let _ = console_log::init_with_level(log::Level::Info);
        ON_LOST.set(on_lost_js);
        let options = WgpuOptions { on_device_lost: Some(on_lost()), ..WgpuOptions::default() };
        // devalloc's one call in for the browser: WebGPU, else WebGL2 where built with `webgl`.
        let registry = DeviceAllocatorRegistry::instance();
        let report = devalloc::wgpu::register_browser_backends(registry, &options).await;
        for r in &report {
            log::info!("devalloc: {r}");
        }
        let opened = report.iter().find(|r| {
            matches!(
                r.outcome,
                RegistrationOutcome::Registered { .. } | RegistrationOutcome::AlreadyRegistered
            )
        });
        let Some(alloc) = opened.and_then(|r| registry.get::<WgpuAllocator>(r.device_type)) else {
            let why: Vec<String> = report.iter().map(|r| r.to_string()).collect();
            return Err(JsError::new(&format!("no GPU in this browser: {}", why.join("; "))));
        };
        // The page's own wgpu calls (the benchmark's peers): an error is logged, never a panic
        // (wgpu's default handler on WebGL2).
        alloc.device(0).map_err(|e| JsError::new(&e.to_string()))?.on_uncaptured_error(Arc::new(
            |e: wgpu::Error| log::error!("the page's own wgpu call failed: {e}"),
        ));
        // Why WebGPU was not used, where the page fell back.
        let fallback = report.iter().find_map(|r| match &r.outcome {
            RegistrationOutcome::Unavailable(e)
                if r.device_type == DeviceType::WebGpu && alloc.device_type() == DeviceType::Gl =>
            {
                Some(e.to_string())
            }
            _ => None,
        });
        Ok(Devalloc { alloc, fallback })
    }

    /// "webgpu" or "gl".
    #[wasm_bindgen(getter)]
    pub fn backend(&self) -> String {
        self.alloc.device_type().to_string()
    }

    /// Why WebGPU was not used (the page fell back to WebGL2), or `undefined`.
    #[wasm_bindgen(getter)]
    pub fn fallback(&self) -> Option<String> {
        self.fallback.clone()
    }

    /// What devalloc's `on_device_lost` said once the device was lost, or `undefined`.
    #[wasm_bindgen(getter)]
    pub fn lost(&self) -> Option<String> {
        lost()
    }

    /// How many times devalloc's `on_device_lost` was called (once at most).
    #[wasm_bindgen(getter, js_name = lostCalls)]
    pub fn lost_calls(&self) -> u32 {
        LOST.with_borrow(|l| l.0)
    }

    /// The adapter, as the browser describes it (wgpu's `AdapterInfo` is nearly empty on the
    /// web: on WebGPU this reads the device's `adapterInfo`).
    pub fn adapter(&self) -> Result<JsValue, JsValue> {
        let i = self.alloc.adapter_info(0).map_err(js)?;
        let device = self.alloc.device(0).map_err(js)?;
        let info = device
            .as_webgpu()
            .and_then(|d| js_sys::Reflect::get(d.as_ref(), &"adapterInfo".into()).ok())
            .filter(|v| v.is_object());
        let (vendor, architecture, description) = match &info {
            Some(info) => (text_of(info, "vendor"), text_of(info, "architecture"), {
                let (d, dev) = (text_of(info, "description"), text_of(info, "device"));
                if d.is_empty() {
                    dev
                } else {
                    d
                }
            }),
            None => (String::new(), String::new(), i.name.trim().to_string()),
        };
        to_js(&AdapterJs {
            vendor,
            architecture,
            description,
            device_type: format!("{:?}", i.device_type),
            backend: format!("{:?}", i.backend),
        })
    }

    /// The limits that matter for memory.
    pub fn limits(&self) -> Result<JsValue, JsValue> {
        let l = self.alloc.device(0).map_err(js)?.limits();
        to_js(&LimitsJs {
            max_buffer_size: l.max_buffer_size,
            max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
            storage_buffers: l.max_storage_buffers_per_shader_stage > 0,
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
        let n = count(&nbytes, "nbytes", "bytes")?;
        let align = if alignment.is_undefined() {
            DEFAULT_ALIGNMENT
        } else {
            count(&alignment, "alignment", "bytes")?
        };
        self.alloc.allocate(n, 0, align).map(devalloc::DevicePtr::addr).map_err(js)
    }

    /// Allocates `nbytes` (alignment: 256 when omitted) once the browser has said it could make
    /// the buffer: resolves to the address as a BigInt, or rejects with an error that says out
    /// of memory and how much devalloc held (after giving its cache back and trying once more).
    /// `allocate` returns at once, and a buffer the browser then refuses is refused at its
    /// next use.
    #[wasm_bindgen(js_name = allocateAsync)]
    pub fn allocate_async(&self, nbytes: JsValue, alignment: JsValue) -> Result<Promise, JsValue> {
        let n = count(&nbytes, "nbytes", "bytes")?;
        let align = if alignment.is_undefined() {
            DEFAULT_ALIGNMENT
        } else {
            count(&alignment, "alignment", "bytes")?
        };
        let a = self.alloc;
        Ok(future_to_promise(async move {
            let ptr = a.allocate_async(n, 0, align).await.map_err(js)?;
            Ok(JsValue::from(ptr.addr()))
        }))
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

    /// Streams a `ReadableStream` of `Uint8Array` chunks (a `fetch` body) to the device from
    /// `ptr`, through a window of a few MiB (the module's memory does not grow with the data);
    /// resolves to the number of bytes written. The stream may fill the allocation from `ptr`
    /// to its end, no more: a longer one rejects once the range is full, with nothing past it
    /// written. `onProgress(done, total)` (optional) is called as each window lands. `total`
    /// (optional: the response's `Content-Length`) is the bytes the stream holds: one that
    /// cannot fit is refused before anything is read, one that ends short of it rejects, and
    /// `onProgress` gets it (else `undefined`). A stream that errors rejects with how many
    /// bytes landed; the stream is cancelled whenever the copy stops early.
    #[wasm_bindgen(js_name = writeFromStream)]
    pub fn write_from_stream(
        &self,
        ptr: JsValue,
        stream: JsValue,
        on_progress: JsValue,
        total: JsValue,
    ) -> Result<Promise, JsValue> {
        let (a, ptr) = (self.alloc, address(&ptr, "ptr")?);
        let stream = stream.dyn_into::<web_sys::ReadableStream>().map_err(|v| {
            args::error(format!(
                "stream must be a ReadableStream (a fetch body: response.body), got {}",
                describe(&v)
            ))
        })?;
        let progress = if on_progress.is_undefined() || on_progress.is_null() {
            None
        } else {
            Some(on_progress.dyn_into::<js_sys::Function>().map_err(|v| {
                args::error(format!(
                    "onProgress must be a function (done, total) or omitted, got {}",
                    describe(&v)
                ))
            })?)
        };
        let total = if total.is_undefined() || total.is_null() {
            None
        } else {
            Some(count(&total, "total", "bytes")?)
        };
        let room = a.bytes_after(ptr, 0).map_err(js)?;
        Ok(future_to_promise(async move {
            let report = |p: devalloc::Progress| {
                if let Some(f) = &progress {
                    let total = p.total.map_or(JsValue::UNDEFINED, |t| JsValue::from(t as f64));
                    if let Err(e) = f.call2(&JsValue::UNDEFINED, &JsValue::from(p.done as f64), &total) {
                        log::warn!("devalloc: writeFromStream's onProgress threw: {}", describe(&e));
                    }
                }
            };
            let options = devalloc::StreamOptions::new().allow_short();
            let options = match total {
                Some(t) => options.total(t as u64),
                None => options,
            }
            .on_progress(report);
            let n = devalloc::stream::write_from_readable_stream(a, ptr, room, 0, stream, options)
                .await
                .map_err(js)?;
            Ok(JsValue::from(n as f64))
        }))
    }

    /// Reads `len` bytes at `ptr`; resolves to a `Uint8Array`.
    pub fn read(&self, ptr: JsValue, len: JsValue) -> Result<Promise, JsValue> {
        let (a, ptr, len) = (self.alloc, address(&ptr, "ptr")?, count(&len, "len", "bytes")?);
        let mut out = room::<u8>(len, "len", "bytes")?;
        Ok(future_to_promise(async move {
            a.copy_device_to_host_async(&mut out, ptr, 0).await.map_err(js)?;
            Ok(js_sys::Uint8Array::from(&out[..]).into())
        }))
    }

    /// Reads `count` floats at `ptr`; resolves to a `Float32Array`.
    pub fn read_f32(&self, ptr: JsValue, n: JsValue) -> Result<Promise, JsValue> {
        let (a, ptr, n) = (self.alloc, address(&ptr, "ptr")?, count(&n, "count", "floats")?);
        if n > usize::MAX / 4 {
            let most = usize::MAX / 4;
            return Err(args::error(format!("count is too large: {n} floats; at most {most} on wasm32")));
        }
        let mut out = room::<f32>(n, "count", "floats")?;
        Ok(future_to_promise(async move {
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
        self.alloc.record_history(count(&events, "events", "events")?).map_err(js)
    }

    /// A snapshot of the allocator (devalloc's snapshot format), as JSON text: exactly what
    /// a snapshot file holds.
    pub fn snapshot(&self) -> Result<String, JsValue> {
        Ok(self.alloc.snapshot().map_err(js)?.to_json())
    }

    /// Measures upload and download of `size` bytes through devalloc and the peers a careful
    /// wgpu user would pick here, `reps` samples each, interleaved round by round; resolves to
    /// the medians.
    pub fn bench(&self, size: JsValue, reps: JsValue) -> Result<Promise, JsValue> {
        let a = self.alloc;
        let (size, reps) = (bench_size(&size)?, count(&reps, "reps", "samples")?.max(1));
        let plan = bench::Plan { reps, repeat: 1, uploads: true };
        Ok(future_to_promise(async move { to_js(&bench::run(a, size, plan).await.map_err(js)?) }))
    }

    /// The latency of a `size`-byte download by each method: `samples` samples of `reads`
    /// reads timed together (one read is below the browser's timer resolution); resolves to
    /// the medians per read.
    pub fn latency(&self, size: JsValue, reads: JsValue, samples: JsValue) -> Result<Promise, JsValue> {
        let a = self.alloc;
        let size = bench_size(&size)?;
        let repeat = count(&reads, "reads", "reads")?.max(1);
        let reps = count(&samples, "samples", "samples")?.max(1);
        let plan = bench::Plan { reps, repeat, uploads: false };
        Ok(future_to_promise(async move { to_js(&bench::run(a, size, plan).await.map_err(js)?) }))
    }
}
