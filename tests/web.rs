//! The conformance suite in the browser (headless Chromium through wasm-bindgen-test) on the
//! page's WebGPU adapter, and on host memory; plus browser-only tests: async downloads of
//! ragged ranges, many overlapping pending downloads, allocation after a failed one, the
//! blocking calls refused with an error that names their async twin, a device the page
//! destroys from JS behind wgpu's back (`conformance/browser_loss.rs`), and the memory planner
//! on MiniMalloc's instance A and the decode trace, in wasm.
//!
//!     CHROMEDRIVER=/usr/bin/chromedriver cargo test --target wasm32-unknown-unknown --test web
#![cfg(target_arch = "wasm32")]

#[macro_use]
#[allow(dead_code, unused_macros)] // each browser suite runs a part of the suite
mod conformance;

use devalloc::wgpu::{WgpuAllocator, WgpuOptions};
use devalloc::{DeviceAllocator, DevicePtr, Error, HostAllocator, PoolOptions, DEFAULT_ALIGNMENT};
use wasm_bindgen_test::wasm_bindgen_test;

wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

fn webgpu() -> conformance::Made {
    Box::pin(async {
        WgpuAllocator::with_options_async(
            wgpu::Backend::BrowserWebGpu,
            WgpuOptions { staging_chunk: Some(64 << 10), ..Default::default() },
        )
        .await
        .map(|a| Box::new(a) as Box<dyn DeviceAllocator>)
        .map_err(|e| e.to_string())
    })
}

fn host() -> conformance::Made {
    conformance::ready(Ok::<_, String>(HostAllocator::new()))
}

/// Under a 64 KiB memory limit, for the hostile model check.
fn webgpu_tiny() -> conformance::Made {
    Box::pin(async {
        let pool = PoolOptions { caching: true, memory_limit: Some(64 << 10), ..PoolOptions::default() };
        WgpuAllocator::with_options_async(
            wgpu::Backend::BrowserWebGpu,
            WgpuOptions { pool, ..Default::default() },
        )
        .await
        .map(|a| Box::new(a) as Box<dyn DeviceAllocator>)
        .map_err(|e| e.to_string())
    })
}

/// The browser's adapter must be there: a missing one fails, in CI and out of it (these tests
/// only run in a browser that was started with WebGPU enabled).
mod webgpu {
    use super::*;
    conformance_tests!(webgpu, conformance::Need::Always, conformance::Caching::On);

    #[wasm_bindgen_test]
    async fn model_check() {
        conformance::model::model_check_seeded(webgpu, 6).await;
    }

    #[wasm_bindgen_test]
    async fn model_check_tiny() {
        conformance::model::model_check_seeded(webgpu_tiny, 6).await;
    }

    #[wasm_bindgen_test]
    async fn readable_streams() {
        let check = conformance::browser_stream::readable_streams;
        conformance::on_every_device("readable_streams", webgpu, conformance::Need::Always, check).await;
    }

    #[wasm_bindgen_test]
    async fn half_a_gib_with_memory_flat() {
        let check = conformance::browser_stream::half_a_gib_with_memory_flat;
        conformance::on_every_device("half_a_gib_with_memory_flat", webgpu, conformance::Need::Always, check)
            .await;
    }
}

mod host {
    use super::*;
    conformance_tests!(host, conformance::Need::Always, conformance::Caching::On);

    #[wasm_bindgen_test]
    async fn readable_streams() {
        let check = conformance::browser_stream::readable_streams;
        conformance::on_every_device("readable_streams", host, conformance::Need::Always, check).await;
    }
}

async fn open() -> &'static WgpuAllocator {
    let a = WgpuAllocator::with_options_async(wgpu::Backend::BrowserWebGpu, WgpuOptions::default())
        .await
        .unwrap_or_else(|e| panic!("no WebGPU adapter in this browser: {e}"));
    Box::leak(Box::new(a))
}

#[wasm_bindgen_test]
async fn independent_allocations_bind_together_after_churn() {
    conformance::bindings::independent_allocations_bind_together_after_churn(open().await, 0).await;
}

/// Out of memory, injected (see `conformance::browser_oom`), on an allocator of its own.
#[wasm_bindgen_test]
async fn out_of_memory_is_reported_on_both_paths() {
    let a = WgpuAllocator::with_options_async(wgpu::Backend::BrowserWebGpu, WgpuOptions::default())
        .await
        .unwrap();
    conformance::browser_oom::out_of_memory_in_the_browser(&a).await;
}

/// A hostile review's cases of out of memory (see `conformance::browser_oom`).
#[wasm_bindgen_test]
async fn refusals_reach_the_cache_reads_and_names() {
    let a = WgpuAllocator::with_options_async(wgpu::Backend::BrowserWebGpu, WgpuOptions::default())
        .await
        .unwrap();
    conformance::browser_oom::refusals_reach_the_cache_reads_and_names(&a).await;
}

#[wasm_bindgen_test]
async fn bindings_in_one_call() {
    conformance::bind_helper::bindings_in_one_call(open().await, 0).await;
}

#[wasm_bindgen_test]
async fn with_reuse_off_a_bind_group_kept_past_the_free_is_reported_at_the_submit() {
    let debug = PoolOptions { reuse_freed: false, ..PoolOptions::default() };
    let a = WgpuAllocator::with_options_async(
        wgpu::Backend::BrowserWebGpu,
        WgpuOptions { pool: debug, ..Default::default() },
    )
    .await
    .unwrap();
    let error = conformance::bindings::stale_bind_group(&a, 0).await.map(|e| e.to_string());
    let message = error.expect("a destroyed buffer's bind group ran silently");
    assert!(message.contains("destroyed") && message.contains("devalloc block"), "{message}");
    assert!(conformance::bindings::stale_bind_group(open().await, 0).await.is_none(), "the default reuses");
}

#[wasm_bindgen_test]
async fn ragged_async_downloads() {
    let a = open().await;
    let n = 10_007;
    let data: Vec<u8> = (0..n).map(|i| (i * 13 % 251) as u8).collect();
    let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
    a.copy_host_to_device_async(p, &data, 0).await.unwrap();
    for (off, len) in [(1usize, 1usize), (3, 2), (5, 7), (2, 4093), (n - 3, 3), (7, n - 9)] {
        let mut back = vec![0u8; len];
        a.copy_device_to_host_async(&mut back, p.offset(off).unwrap(), 0).await.unwrap();
        assert!(back == data[off..off + len], "ragged read {off}+{len}");
    }
    a.deallocate(p, 0).unwrap();
}

#[wasm_bindgen_test]
async fn many_overlapping_pending_downloads() {
    let a = open().await;
    let n = 64 << 10;
    let data: Vec<u8> = (0..n).map(|i| (i % 253) as u8).collect();
    let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
    a.copy_host_to_device_async(p, &data, 0).await.unwrap();
    // 32 downloads of overlapping ranges, all pending at once, then awaited together.
    let mut outs: Vec<(usize, Vec<u8>)> = (0..32).map(|k| (k * 1021, vec![0u8; 9000 + k])).collect();
    let futures: Vec<_> = outs
        .iter_mut()
        .map(|(off, buf)| a.copy_device_to_host_async(buf, p.offset(*off).unwrap(), 0))
        .collect();
    for r in futures_util::future::join_all(futures).await {
        r.unwrap();
    }
    for (off, buf) in &outs {
        assert!(buf[..] == data[*off..*off + buf.len()], "download at {off}");
    }
    a.deallocate(p, 0).unwrap();
}

#[wasm_bindgen_test]
async fn allocation_after_a_failed_one() {
    let a = open().await;
    let max = a.max_allocation(0).unwrap();
    let e = a.allocate(max as usize + 8, 0, DEFAULT_ALIGNMENT).unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    a.set_memory_limit(Some(1 << 20), 0).unwrap();
    let e = a.allocate(2 << 20, 0, DEFAULT_ALIGNMENT).unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    a.set_memory_limit(None, 0).unwrap();
    let p = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
    a.copy_host_to_device_async(p, &[5u8; 4096], 0).await.unwrap();
    let mut back = vec![0u8; 4096];
    a.copy_device_to_host_async(&mut back, p, 0).await.unwrap();
    assert_eq!(back, vec![5u8; 4096]);
    a.deallocate(p, 0).unwrap();
}

#[wasm_bindgen_test]
async fn blocking_calls_name_their_async_twin() {
    let a = open().await;
    let p = a.allocate(64, 0, DEFAULT_ALIGNMENT).unwrap();
    let mut back = [0u8; 8];
    let e = a.copy_device_to_host(&mut back, p, 0).unwrap_err();
    assert!(
        matches!(e, Error::NotSupported { .. }) && e.to_string().contains("copy_device_to_host_async"),
        "{e}"
    );
    let e = a.copy_host_to_device(p.offset(1).unwrap(), &[1, 2], 0).unwrap_err();
    assert!(e.to_string().contains("copy_host_to_device_async"), "{e}");
    // Aligned uploads need no waiting and work as they are.
    a.copy_host_to_device(p, &[7u8; 64], 0).unwrap();
    let e = a.copy_device_to_device(p.offset(1).unwrap(), 0, p.offset(9).unwrap(), 0, 3).unwrap_err();
    assert!(e.to_string().contains("copy_device_to_device_async"), "{e}");
    assert!(matches!(a.deallocate(DevicePtr::new(8), 0), Err(Error::InvalidPointer { .. })));
    // synchronize cannot wait here: it says so rather than return a silent Ok.
    let e = a.synchronize(0).unwrap_err();
    assert!(matches!(e, Error::NotSupported { .. }) && e.to_string().contains("synchronize_async"), "{e}");
    a.synchronize_async(0).await.unwrap();
    let e = WgpuAllocator::new(wgpu::Backend::BrowserWebGpu).err().unwrap();
    assert!(e.to_string().contains("new_async(wgpu::Backend::BrowserWebGpu)"), "{e}");
    // A blocking open of WebGL2 names the backend asked for, not WebGPU.
    let e = WgpuAllocator::new(wgpu::Backend::Gl).err().unwrap();
    assert!(
        matches!(e, Error::NotSupported { device_type: devalloc::DeviceType::Gl, .. })
            && e.to_string().contains("new_async(wgpu::Backend::Gl)"),
        "{e}"
    );
    a.deallocate(p, 0).unwrap();
}

/// One allocator per test binary: every test asks the registry, the first one registers.
#[wasm_bindgen_test]
async fn one_allocator_per_test_binary() {
    let registry = devalloc::DeviceAllocatorRegistry::instance();
    let first = shared().await;
    let second = shared().await;
    assert!(std::ptr::eq(first, second));
    assert!(registry.get::<WgpuAllocator>(devalloc::DeviceType::WebGpu).is_some());
}

async fn shared() -> &'static WgpuAllocator {
    let registry = devalloc::DeviceAllocatorRegistry::instance();
    if let Some(a) = registry.get::<WgpuAllocator>(devalloc::DeviceType::WebGpu) {
        return a;
    }
    let a: &'static WgpuAllocator = open().await;
    match registry.register_allocator(a) {
        Ok(()) => a,
        Err(_) => registry.get::<WgpuAllocator>(devalloc::DeviceType::WebGpu).expect("registered meanwhile"),
    }
}

/// Allocations past one buffer (issue 40): 64 KiB buffers, so that the suite's larger
/// allocations are several buffers each, every copy cut at their seams.
fn webgpu_segmented() -> conformance::Made {
    Box::pin(async {
        let options = WgpuOptions {
            staging_chunk: Some(64 << 10),
            max_buffer_size: Some(64 << 10),
            ..Default::default()
        };
        WgpuAllocator::with_options_async(wgpu::Backend::BrowserWebGpu, options)
            .await
            .map(|a| Box::new(a) as Box<dyn DeviceAllocator>)
            .map_err(|e| e.to_string())
    })
}

mod webgpu_segmented {
    use super::*;
    conformance_tests!(webgpu_segmented, conformance::Need::Always, conformance::Caching::On);

    #[wasm_bindgen_test]
    async fn model_check() {
        conformance::model::model_check_seeded(webgpu_segmented, 4).await;
    }
}

/// `GPUDevice.destroy()`, called from JS on the device's own object, behind wgpu's back: what a
/// page (or a library sharing the device) can do at any time.
mod destroyed_from_js {
    use super::*;
    use conformance::browser_loss as loss;
    use wasm_bindgen::{JsCast, JsValue};

    fn open(options: WgpuOptions) -> devalloc::BoxFuture<'static, WgpuAllocator> {
        Box::pin(async move {
            WgpuAllocator::with_options_async(wgpu::Backend::BrowserWebGpu, options)
                .await
                .unwrap_or_else(|e| panic!("no WebGPU adapter in this browser: {e}"))
        })
    }

    /// Delivered once the device's `lost` promise has resolved (at once after a second call).
    fn destroy_from_js(a: &WgpuAllocator) -> loss::Delivered {
        let device = a.device(0).unwrap().as_webgpu().expect("a WebGPU device");
        let raw: &JsValue = device.as_ref();
        let lost: js_sys::Promise = js_sys::Reflect::get(raw, &"lost".into()).unwrap().dyn_into().unwrap();
        let destroy: js_sys::Function =
            js_sys::Reflect::get(raw, &"destroy".into()).unwrap().dyn_into().unwrap();
        destroy.call0(raw).unwrap();
        Box::pin(async move {
            wasm_bindgen_futures::JsFuture::from(lost).await.expect("the device's lost promise");
        })
    }

    #[wasm_bindgen_test]
    async fn between_two_calls() {
        loss::taken_away_between_two_calls(open, destroy_from_js, "WebGPU, destroy() from JS").await;
    }

    #[wasm_bindgen_test]
    async fn during_copies() {
        loss::taken_away_during_copies(open, destroy_from_js, "WebGPU, destroy() from JS").await;
    }
}

/// The planner in wasm: MiniMalloc's instance A and the 12,464-tensor decode trace, each
/// planned and checked (no two tensors live at once overlap), within a few percent of the
/// lower bound and well under one after another, in the browser's time.
#[wasm_bindgen_test]
fn the_planner_runs_in_the_browser() {
    use devalloc::plan::{check, one_after_another, plan, Instance, Strategy};
    let inputs = [
        ("A.1048576.csv", include_str!("data/minimalloc/A.1048576.csv"), Strategy::Search { budget_ms: 500 }),
        ("decode.csv", include_str!("data/traces/decode.csv"), Strategy::Fast),
    ];
    for (name, text, strategy) in inputs {
        let t = Instance::from_csv(name, text).unwrap().tensors;
        let start = js_sys::Date::now();
        let p = plan(&t, 1, strategy).unwrap();
        let ms = js_sys::Date::now() - start;
        check(&t, 1, p.offsets(), p.size()).unwrap();
        let ratio = p.size() as f64 / p.lower_bound() as f64;
        let naive = one_after_another(&t, 1).unwrap().size();
        wasm_bindgen_test::console_log!(
            "{name}: {} tensors, planned {} bytes = {ratio:.4}x the lower bound ({naive} one after another), {ms:.0} ms",
            t.len(),
            p.size()
        );
        assert!(ratio < 1.05, "{name}: {ratio:.4}x the lower bound");
        assert!(p.size() < naive, "{name}: no reuse");
    }
}

/// The one call in: host memory and the browser's WebGPU registered, WebGL2 not built here
/// (this suite is built without `webgl`), each said; a second call finds them registered.
#[wasm_bindgen_test]
async fn register_available_async_opens_webgpu_and_says_what_it_did() {
    use devalloc::{DeviceAllocatorRegistry, DeviceType, RegistrationOutcome};
    let registry: &'static DeviceAllocatorRegistry = Box::leak(Box::new(DeviceAllocatorRegistry::new()));
    let report = devalloc::register_available_async(registry).await;
    let said: Vec<String> = report.iter().map(|r| r.to_string()).collect();
    let types: Vec<DeviceType> = report.iter().map(|r| r.device_type).collect();
    assert_eq!(types, [DeviceType::Cpu, DeviceType::WebGpu, DeviceType::Gl], "{said:?}");
    assert!(report[0].is_registered() && report[1].is_registered(), "{said:?}");
    assert!(matches!(report[2].outcome, RegistrationOutcome::NotBuilt { feature: "webgl" }), "{said:?}");
    let gpu = registry.get::<WgpuAllocator>(DeviceType::WebGpu).expect("registered");
    assert!(gpu.supports_compute(0).unwrap(), "WebGPU always runs compute shaders");
    let again = devalloc::register_available_async(registry).await;
    assert!(
        again[..2].iter().all(|r| matches!(r.outcome, RegistrationOutcome::AlreadyRegistered)),
        "{again:?}"
    );
}
