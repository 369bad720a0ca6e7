//! The app's own tests in headless Chromium (wasm-bindgen-test), with one devalloc allocator
//! per test binary, as devalloc's README shows.
#![cfg(target_arch = "wasm32")]

use devalloc::{DeviceAllocatorRegistry, DeviceType, Error, RegistrationOutcome};
use devalloc::wgpu::WgpuAllocator;
use wasm_bindgen_test::wasm_bindgen_test;

wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

/// The test binary's one WebGPU allocator: the first test to ask opens and registers it, with
/// devalloc's one call in for the browser (WebGPU; WebGL2 too where built with `webgl`).
async fn gpu() -> &'static WgpuAllocator {
    let registry = DeviceAllocatorRegistry::instance();
    if let Some(a) = registry.get::<WgpuAllocator>(DeviceType::WebGpu) {
        return a;
    }
    // Another test may register it while this one awaits the adapter: then the report says
    // "already registered", and the registry has it all the same.
    let report = devalloc::register_available_async(registry).await;
    registry.get::<WgpuAllocator>(DeviceType::WebGpu).unwrap_or_else(|| {
        let said: Vec<String> = report.iter().map(|r| r.to_string()).collect();
        panic!("the browser offers WebGPU (--enable-unsafe-webgpu): {}", said.join("; "))
    })
}

/// Run by itself in a browser started without WebGPU (scripts/test, `--ignored`): the one
/// call in registers host memory, and says of WebGPU what the page must do.
#[wasm_bindgen_test]
#[ignore = "run by scripts/test in a browser without WebGPU"]
async fn without_webgpu_the_one_call_names_the_browsers_fix() {
    let registry: &'static DeviceAllocatorRegistry = Box::leak(Box::new(DeviceAllocatorRegistry::new()));
    let report = devalloc::register_available_async(registry).await;
    let said: Vec<String> = report.iter().map(|r| r.to_string()).collect();
    wasm_bindgen_test::console_log!("without WebGPU: {}", said.join("; "));
    assert!(report[0].is_registered(), "{said:?}");
    let webgpu = report.iter().find(|r| r.device_type == DeviceType::WebGpu).expect("WebGPU is reported");
    assert!(matches!(webgpu.outcome, RegistrationOutcome::Unavailable(_)), "{said:?}");
    assert!(webgpu.to_string().contains("navigator.gpu"), "the message names what to do: {webgpu}");
}

#[wasm_bindgen_test]
async fn triples_on_the_gpu() {
    let values: Vec<f32> = (0..500).map(|i| i as f32 - 100.0).collect();
    let out = web_app::triple(gpu().await, &values).await.unwrap();
    // Every value, and no more or fewer: `zip(..).all(..)` would pass an empty output, and a
    // NaN is never equal to what was expected.
    let want: Vec<f32> = values.iter().map(|v| v * 3.0).collect();
    assert_eq!(out.len(), want.len(), "the output's length");
    assert_eq!(out, want);
}

#[wasm_bindgen_test]
async fn a_second_test_shares_the_allocator() {
    let a = gpu().await;
    assert!(std::ptr::eq(a, gpu().await));
    let out = web_app::triple(a, &[1.0, 2.0]).await.unwrap();
    assert_eq!(out, [3.0, 6.0]);
}

#[wasm_bindgen_test]
async fn blocking_calls_say_to_use_their_async_twin() {
    let a = gpu().await;
    let e = a.synchronize(0).unwrap_err();
    assert!(matches!(e, Error::NotSupported { .. }), "{e}");
    a.synchronize_async(0).await.unwrap();
}
