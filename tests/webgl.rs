//! The conformance suite in the browser on WebGL2 (wgpu's GL backend compiled to wasm32, in
//! headless Chromium through wasm-bindgen-test): the demo page's fallback where there is no
//! WebGPU. There wgpu fires callbacks only from `device.poll`, and a fence is signalled only
//! between browser tasks: every devalloc wait polls and yields to the browser. Plus the
//! sequence the page's bench runs: a read after the app's own `StagingBelt` upload. Every test
//! adopts one shared device (see [`device`]), except those that lose a context of their own
//! (`WEBGL_lose_context.loseContext()`: `conformance/browser_loss.rs`).
//!
//!     CHROMEDRIVER=/usr/bin/chromedriver cargo test --target wasm32-unknown-unknown --features webgl --test webgl
#![cfg(all(target_arch = "wasm32", feature = "webgl"))]

#[macro_use]
#[allow(dead_code, unused_macros)] // each browser suite runs a part of the suite
mod conformance;

use std::cell::RefCell;

use devalloc::wgpu::{WgpuAllocator, WgpuOptions};
use devalloc::{DeviceAllocator, PoolOptions, DEFAULT_ALIGNMENT};
use futures_util::future::{FutureExt, LocalBoxFuture, Shared};
use wasm_bindgen_test::wasm_bindgen_test;

wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

type Gpu = (wgpu::Device, wgpu::Queue);

thread_local! {
    static DEVICE: RefCell<Option<Shared<LocalBoxFuture<'static, Gpu>>>> = const { RefCell::new(None) };
}

/// One WebGL2 device for the whole suite, opened once: wasm-bindgen-test runs every test at
/// the same time, and a browser keeps only about 16 WebGL contexts alive (past that it loses
/// the oldest), so each test adopts this device with an allocator of its own
/// (`WgpuAllocator::from_device_with_options`) instead of opening a context.
async fn device() -> Gpu {
    let opening = DEVICE.with_borrow_mut(|d| {
        d.get_or_insert_with(|| {
            async {
                let a = WgpuAllocator::with_options_async(wgpu::Backend::Gl, WgpuOptions::default())
                    .await
                    .unwrap_or_else(|e| panic!("no WebGL2 adapter in this browser: {e}"));
                let gpu = (a.device(0).unwrap().clone(), a.queue(0).unwrap().clone());
                // Kept: it holds the device's lost callback for every allocator after it.
                Box::leak(Box::new(a));
                gpu
            }
            .boxed_local()
            .shared()
        })
        .clone()
    });
    opening.await
}

/// A fresh allocator on the suite's device.
async fn adopt(options: WgpuOptions) -> Result<WgpuAllocator, String> {
    let (device, queue) = device().await;
    WgpuAllocator::from_device_with_options(device, queue, options).map_err(|e| e.to_string())
}

fn webgl() -> conformance::Made {
    Box::pin(async { adopt(WgpuOptions::default()).await.map(|a| Box::new(a) as Box<dyn DeviceAllocator>) })
}

/// Under a 64 KiB memory limit, for the hostile model check.
fn webgl_tiny() -> conformance::Made {
    Box::pin(async {
        let pool = PoolOptions { caching: true, memory_limit: Some(64 << 10), ..PoolOptions::default() };
        adopt(WgpuOptions { pool, ..Default::default() })
            .await
            .map(|a| Box::new(a) as Box<dyn DeviceAllocator>)
    })
}

/// Allocations past one buffer (issue 40): 64 KiB buffers, so that the suite's larger
/// allocations are several buffers each, every copy cut at their seams.
fn webgl_segmented() -> conformance::Made {
    Box::pin(async {
        let options = WgpuOptions {
            staging_chunk: Some(64 << 10),
            max_buffer_size: Some(64 << 10),
            ..Default::default()
        };
        adopt(options).await.map(|a| Box::new(a) as Box<dyn DeviceAllocator>)
    })
}

mod webgl_segmented {
    use super::*;
    conformance_tests!(webgl_segmented, conformance::Need::Always, conformance::Caching::On);

    #[wasm_bindgen_test]
    async fn model_check() {
        conformance::model::model_check_seeded(webgl_segmented, 4).await;
    }
}

/// Headless Chromium always offers WebGL2 (on SwiftShader): a missing adapter fails.
mod webgl {
    use super::*;
    conformance_tests!(webgl, conformance::Need::Always, conformance::Caching::On);

    #[wasm_bindgen_test]
    async fn model_check() {
        conformance::model::model_check_seeded(webgl, 4).await;
    }

    #[wasm_bindgen_test]
    async fn model_check_tiny() {
        conformance::model::model_check_seeded(webgl_tiny, 4).await;
    }

    /// With reuse off a bind group kept past the free is a validation error at the submit (a
    /// render pass here: WebGL2 has no compute).
    #[wasm_bindgen_test]
    async fn with_reuse_off_a_bind_group_kept_past_the_free_is_reported_at_the_submit() {
        let debug = PoolOptions { reuse_freed: false, ..PoolOptions::default() };
        let a = adopt(WgpuOptions { pool: debug, ..Default::default() }).await.unwrap();
        let error = conformance::bindings::stale_bind_group(&a, 0).await.map(|e| e.to_string());
        let message = error.expect("a destroyed buffer's bind group ran silently");
        assert!(message.contains("destroyed") && message.contains("devalloc block"), "{message}");
        let a = adopt(WgpuOptions::default()).await.unwrap();
        assert!(conformance::bindings::stale_bind_group(&a, 0).await.is_none(), "the default reuses");
    }

    /// `allocate_async` on WebGL2: wgpu's GL backend (wgpu-core) judges a buffer at once, and
    /// there is no `GPUDevice` whose `createBuffer` a test could make fail, so only the working
    /// path and an impossible size are checked here (the WebGPU suite injects out of memory).
    #[wasm_bindgen_test]
    async fn allocate_async_allocates_and_refuses_what_never_fits() {
        let a = adopt(WgpuOptions::default()).await.unwrap();
        let before = a.stats(0).unwrap();
        let p = a.allocate_async(4096, 0, DEFAULT_ALIGNMENT).await.unwrap();
        a.copy_host_to_device_async(p, &[5u8; 32], 0).await.unwrap();
        let mut back = [0u8; 32];
        a.copy_device_to_host_async(&mut back, p, 0).await.unwrap();
        assert_eq!(back, [5u8; 32]);
        a.deallocate(p, 0).unwrap();
        let r = a.allocate_async(usize::MAX / 2, 0, DEFAULT_ALIGNMENT).await;
        assert!(matches!(r, Err(devalloc::Error::TooLarge { .. })), "{r:?}");
        assert_eq!(a.stats(0).unwrap().allocated_bytes, before.allocated_bytes);
        eprintln!("webgl: no GPUDevice to inject out of memory into: checked the working path and a size past the device");
    }

    /// WebGL2 has no compute: the refusal of storage bindings and a uniform binding.
    #[wasm_bindgen_test]
    async fn bindings_in_one_call() {
        let a = adopt(WgpuOptions::default()).await.unwrap();
        conformance::bind_helper::bindings_in_one_call(&a, 0).await;
    }

    /// WebGL2 has no compute: the allocations are checked apart, and the check says so.
    #[wasm_bindgen_test]
    async fn independent_allocations_bind_together_after_churn() {
        let a = adopt(WgpuOptions::default()).await.unwrap();
        conformance::bindings::independent_allocations_bind_together_after_churn(&a, 0).await;
    }
}

/// The app's own upload through a `wgpu::util::StagingBelt` (its chunks then mapped again by
/// `recall`, callbacks that only a poll fires), then devalloc's reads, small and large: each
/// must come back, and hold what was written.
#[wasm_bindgen_test]
async fn reads_after_the_apps_own_staging_belt_upload() {
    let a = adopt(WgpuOptions::default()).await.unwrap();
    let (device, queue) = device().await;
    for n in [4u64, 4096, 64 << 10, 3 << 20] {
        let data: Vec<u8> = (0..n as usize).map(|i| (i * 7 + i / 4096) as u8).collect();
        let p = a.allocate(n as usize, 0, DEFAULT_ALIGNMENT).unwrap();
        a.copy_host_to_device_async(p, &data, 0).await.unwrap();
        let app = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("the app's buffer"),
            size: n,
            usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let mut belt = wgpu::util::StagingBelt::new(device.clone(), 1 << 20);
        for _ in 0..3 {
            let mut enc = device.create_command_encoder(&Default::default());
            belt.write_buffer(&mut enc, &app, 0, wgpu::BufferSize::new(n).unwrap()).copy_from_slice(&data);
            belt.finish();
            queue.submit([enc.finish()]);
            belt.recall();
            let mut back = vec![0u8; n as usize];
            a.copy_device_to_host_async(&mut back, p, 0).await.unwrap();
            assert!(back == data, "{n} bytes read back wrong after the app's belt upload");
        }
        a.synchronize_async(0).await.unwrap();
        a.deallocate(p, 0).unwrap();
    }
}

/// The browser loses the WebGL2 context (`WEBGL_lose_context.loseContext()`, the browser's own
/// way to simulate it), behind wgpu's back: wgpu's GL backend never notices, and its fences
/// would never signal again.
mod context_lost {
    use super::*;
    use conformance::browser_loss as loss;
    use wasm_bindgen::{JsCast, JsValue};

    /// A device of its own: its context is lost.
    fn open(options: WgpuOptions) -> devalloc::BoxFuture<'static, WgpuAllocator> {
        Box::pin(async move {
            WgpuAllocator::with_options_async(wgpu::Backend::Gl, options)
                .await
                .unwrap_or_else(|e| panic!("no WebGL2 adapter in this browser: {e}"))
        })
    }

    /// Delivered once the canvas's `webglcontextlost` event has fired (at once where the
    /// context was lost already: a second loss fires no event).
    #[allow(unsafe_code)]
    fn lose_context(a: &WgpuAllocator) -> loss::Delivered {
        // SAFETY: only the context's JS handle is cloned out of the hal device; nothing is
        // called on the hal device.
        let gl = unsafe { a.device(0).unwrap().as_hal::<wgpu::hal::api::Gles>() }
            .expect("a GL device")
            .context()
            .webgl2_context
            .clone();
        let gl: &JsValue = gl.as_ref();
        let get = |o: &JsValue, name: &str| -> js_sys::Function {
            js_sys::Reflect::get(o, &name.into()).unwrap().dyn_into().unwrap()
        };
        // A lost context hands out no extension: a second loss goes through the first's.
        let kept = EXTENSIONS.with_borrow(|k| k.iter().find(|(c, _)| c == gl).map(|(_, e)| e.clone()));
        let ext = kept.unwrap_or_else(|| {
            let ext = get(gl, "getExtension").call1(gl, &"WEBGL_lose_context".into()).unwrap();
            assert!(!ext.is_null(), "this browser has no WEBGL_lose_context");
            EXTENSIONS.with_borrow_mut(|k| k.push((gl.clone(), ext.clone())));
            ext
        });
        let delivered = match get(gl, "isContextLost").call0(gl).unwrap().as_bool() {
            Some(true) => None,
            _ => {
                // Listening before the loss: the event is fired in a task of its own, after this.
                let canvas = js_sys::Reflect::get(gl, &"canvas".into()).unwrap();
                let once = js_sys::Object::new();
                js_sys::Reflect::set(&once, &"once".into(), &true.into()).unwrap();
                Some(js_sys::Promise::new(&mut |resolve, _| {
                    let listen = get(&canvas, "addEventListener");
                    listen.call3(&canvas, &"webglcontextlost".into(), &resolve, &once).unwrap();
                }))
            }
        };
        get(&ext, "loseContext").call0(&ext).unwrap();
        Box::pin(async move {
            if let Some(event) = delivered {
                wasm_bindgen_futures::JsFuture::from(event).await.expect("webglcontextlost");
            }
        })
    }

    thread_local! {
        /// The `WEBGL_lose_context` of each context lost so far.
        static EXTENSIONS: RefCell<Vec<(JsValue, JsValue)>> = const { RefCell::new(Vec::new()) };
    }

    #[wasm_bindgen_test]
    async fn between_two_calls() {
        loss::taken_away_between_two_calls(open, lose_context, "WebGL2, loseContext()").await;
    }

    #[wasm_bindgen_test]
    async fn during_copies() {
        loss::taken_away_during_copies(open, lose_context, "WebGL2, loseContext()").await;
    }
}

/// WebGL2 has no compute shaders, and says so before a pipeline would fail.
#[wasm_bindgen_test]
async fn supports_compute_is_false_on_webgl2() {
    let a = adopt(WgpuOptions::default()).await.unwrap();
    assert!(!a.supports_compute(0).unwrap());
}

/// The one call in, built with `webgl`: exactly one of WebGPU and WebGL2 is registered (WebGPU
/// where this browser offers it, WebGL2 otherwise), and the other says why not.
#[wasm_bindgen_test]
async fn register_available_async_opens_one_gpu_backend() {
    use devalloc::{DeviceAllocatorRegistry, DeviceType, RegistrationOutcome};
    let registry: &'static DeviceAllocatorRegistry = Box::leak(Box::new(DeviceAllocatorRegistry::new()));
    let report = devalloc::register_available_async(registry).await;
    let said: Vec<String> = report.iter().map(|r| r.to_string()).collect();
    let (webgpu, gl) = (&report[1], &report[2]);
    assert_eq!((webgpu.device_type, gl.device_type), (DeviceType::WebGpu, DeviceType::Gl), "{said:?}");
    if webgpu.is_registered() {
        assert!(matches!(gl.outcome, RegistrationOutcome::NotTried { .. }), "{said:?}");
    } else {
        assert!(matches!(webgpu.outcome, RegistrationOutcome::Unavailable(_)), "{said:?}");
        assert!(gl.is_registered(), "{said:?}");
    }
}
