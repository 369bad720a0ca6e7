//! JavaScript bindings for browser demos (wasm32 only): initialise devalloc on the browser's
//! WebGPU (or WebGL2 with the `webgl` feature), list devices, allocate, write and read
//! `Uint8Array` / `Float32Array` data, free, stats, and measure throughput against plain wgpu.
//!
//! Every error arrives in JS as an exception (`Error`) carrying devalloc's message; nothing
//! traps. Reads return promises: in the browser nothing may block.
#![deny(unsafe_code)]

use js_sys::Promise;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::allocator::{DeviceAllocator, DEFAULT_ALIGNMENT};
use crate::ptr::DevicePtr;
use crate::registry::DeviceAllocatorRegistry;
use crate::wgpu::{WgpuAllocator, WgpuOptions};

fn js(e: crate::Error) -> JsValue {
    JsError::new(&e.to_string()).into()
}

fn now_ms() -> f64 {
    js_sys::Reflect::get(&js_sys::global(), &"performance".into())
        .ok()
        .and_then(|p| js_sys::Reflect::get(&p, &"now".into()).ok().map(|f| (p, f)))
        .and_then(|(p, f)| f.dyn_into::<js_sys::Function>().ok().and_then(|f| f.call0(&p).ok()))
        .and_then(|v| v.as_f64())
        .unwrap_or_else(js_sys::Date::now)
}

/// Sends `log` records to the browser console.
struct ConsoleLog;

impl log::Log for ConsoleLog {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Info
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            let msg = format!("[{}] {}", r.level(), r.args());
            match r.level() {
                log::Level::Error => web_sys::console::error_1(&msg.into()),
                log::Level::Warn => web_sys::console::warn_1(&msg.into()),
                _ => web_sys::console::log_1(&msg.into()),
            }
        }
    }
    fn flush(&self) {}
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
        let _ = log::set_logger(&ConsoleLog).map(|()| log::set_max_level(log::LevelFilter::Info));
        let mut last = None;
        for backend in [wgpu::Backend::BrowserWebGpu, wgpu::Backend::Gl] {
            if !wgpu::Instance::enabled_backend_features().contains(backend.into()) {
                continue;
            }
            match WgpuAllocator::new_async(backend, WgpuOptions::default()).await {
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

    /// The adapter as JSON: name, vendor, architecture, device type, backend.
    pub fn adapter(&self) -> Result<String, JsError> {
        let i = self.alloc.adapter_info(0).map_err(|e| JsError::new(&e.to_string()))?;
        Ok(format!(
            r#"{{"name":{:?},"vendor":{},"architecture":{:?},"deviceType":"{:?}","backend":"{:?}","driver":{:?}}}"#,
            i.name,
            i.vendor,
            i.device.to_string(),
            i.device_type,
            i.backend,
            i.driver
        ))
    }

    /// The limits that matter for memory, as JSON.
    pub fn limits(&self) -> Result<String, JsError> {
        let l = self.alloc.device(0).map_err(|e| JsError::new(&e.to_string()))?.limits();
        Ok(format!(
            r#"{{"maxBufferSize":{},"maxStorageBufferBindingSize":{},"minStorageBufferOffsetAlignment":{}}}"#,
            l.max_buffer_size, l.max_storage_buffer_binding_size, l.min_storage_buffer_offset_alignment
        ))
    }

    /// Every registered device as JSON: `[{"device":"webgpu:0","name":"..."}]`.
    pub fn devices(&self) -> String {
        let mut out = Vec::new();
        for a in DeviceAllocatorRegistry::instance().allocators() {
            for i in 0..a.device_count() as u32 {
                out.push(format!(r#"{{"device":"{}:{i}","name":{:?}}}"#, a.device_type(), a.device_name(i)));
            }
        }
        format!("[{}]", out.join(","))
    }

    /// Allocates `nbytes` (alignment: 256 when omitted); returns the address as a BigInt.
    pub fn allocate(&self, nbytes: usize, alignment: Option<usize>) -> Result<u64, JsValue> {
        self.alloc
            .allocate(nbytes, 0, alignment.unwrap_or(DEFAULT_ALIGNMENT))
            .map(DevicePtr::addr)
            .map_err(js)
    }

    /// Frees an allocation.
    pub fn free(&self, ptr: u64) -> Result<(), JsValue> {
        self.alloc.deallocate(DevicePtr::new(ptr), 0).map_err(js)
    }

    /// Writes bytes at `ptr` (any offset and length); resolves once queued on the GPU.
    pub fn write(&self, ptr: u64, data: Vec<u8>) -> Promise {
        let a = self.alloc;
        future_to_promise(async move {
            a.copy_host_to_device_async(DevicePtr::new(ptr), &data, 0).await.map_err(js)?;
            Ok(JsValue::UNDEFINED)
        })
    }

    /// Writes floats at `ptr`.
    pub fn write_f32(&self, ptr: u64, data: Vec<f32>) -> Promise {
        self.write(ptr, bytemuck::cast_slice(&data).to_vec())
    }

    /// Reads `len` bytes at `ptr`; resolves to a `Uint8Array`.
    pub fn read(&self, ptr: u64, len: usize) -> Promise {
        let a = self.alloc;
        future_to_promise(async move {
            let mut out = vec![0u8; len];
            a.copy_device_to_host_async(&mut out, DevicePtr::new(ptr), 0).await.map_err(js)?;
            Ok(js_sys::Uint8Array::from(&out[..]).into())
        })
    }

    /// Reads `count` floats at `ptr`; resolves to a `Float32Array`.
    pub fn read_f32(&self, ptr: u64, count: usize) -> Promise {
        let a = self.alloc;
        future_to_promise(async move {
            let mut out = vec![0f32; count];
            a.copy_device_to_host_async(bytemuck::cast_slice_mut(&mut out), DevicePtr::new(ptr), 0)
                .await
                .map_err(js)?;
            Ok(js_sys::Float32Array::from(&out[..]).into())
        })
    }

    /// The allocator's statistics as JSON.
    pub fn stats(&self) -> Result<String, JsValue> {
        let s = self.alloc.stats(0).map_err(js)?;
        Ok(format!(
            r#"{{"allocated":{},"reserved":{},"cached":{},"peakAllocated":{},"peakReserved":{},"live":{},"hits":{},"misses":{}}}"#,
            s.allocated_bytes,
            s.reserved_bytes,
            s.cached_bytes,
            s.peak_allocated_bytes,
            s.peak_reserved_bytes,
            s.live_allocations,
            s.cache_hits,
            s.cache_misses
        ))
    }

    /// Gives cached buffers back to the browser; returns the bytes freed.
    pub fn empty_cache(&self) -> f64 {
        self.alloc.empty_cache() as f64
    }

    /// Measures upload and download of `size` bytes, `reps` times each, through devalloc and
    /// through plain wgpu (`queue.write_buffer`; a fresh `MAP_READ` buffer per download), and
    /// resolves to JSON with medians in GB/s.
    pub fn bench(&self, size: usize, reps: u32) -> Promise {
        let a = self.alloc;
        future_to_promise(async move { bench(a, size, reps.max(1)).await.map(JsValue::from).map_err(js) })
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn bench(a: &'static WgpuAllocator, size: usize, reps: u32) -> crate::Result<String> {
    let device = a.device(0)?.clone();
    let queue = a.queue(0)?.clone();
    let data: Vec<u8> = (0..size).map(|i| (i * 7) as u8).collect();
    let mut back = vec![0u8; size];
    let gbps = |ms: f64| size as f64 / (ms.max(1e-3) * 1e6);
    let p = a.allocate(size, 0, DEFAULT_ALIGNMENT)?;
    let (mut up, mut down) = (Vec::new(), Vec::new());
    for _ in 0..=reps {
        let t = now_ms();
        a.copy_host_to_device_async(p, &data, 0).await?;
        a.synchronize_async(0).await?;
        up.push(now_ms() - t);
        let t = now_ms();
        a.copy_device_to_host_async(&mut back, p, 0).await?;
        down.push(now_ms() - t);
    }
    let verified = back == data;
    a.deallocate(p, 0)?;

    let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let plain = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("baseline"),
        size: size.next_multiple_of(4) as u64,
        usage,
        mapped_at_creation: false,
    });
    let (mut pup, mut pdown) = (Vec::new(), Vec::new());
    let padded: Vec<u8> =
        data.iter().copied().chain(std::iter::repeat(0)).take(size.next_multiple_of(4)).collect();
    for _ in 0..=reps {
        let t = now_ms();
        queue.write_buffer(&plain, 0, &padded);
        a.synchronize_async(0).await?;
        pup.push(now_ms() - t);
        let t = now_ms();
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("baseline staging"),
            size: padded.len() as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&plain, 0, &staging, 0, padded.len() as u64);
        queue.submit([enc.finish()]);
        a.map_buffer_async(0, &staging, wgpu::MapMode::Read, 0..padded.len() as u64).await?;
        if let Ok(view) = staging.get_mapped_range(..) {
            back.copy_from_slice(&view[..size]);
        }
        pdown.push(now_ms() - t);
    }
    // The first repetition warms staging buffers and caches up; medians of the rest.
    let m = |v: &Vec<f64>| median(v[1..].to_vec());
    Ok(format!(
        r#"{{"size":{size},"verified":{verified},"upDevalloc":{:.4},"upPlain":{:.4},"downDevalloc":{:.4},"downPlain":{:.4},"upMs":{:.4},"downMs":{:.4},"plainDownMs":{:.4}}}"#,
        gbps(m(&up)),
        gbps(m(&pup)),
        gbps(m(&down)),
        gbps(m(&pdown)),
        m(&up),
        m(&down),
        m(&pdown)
    ))
}
