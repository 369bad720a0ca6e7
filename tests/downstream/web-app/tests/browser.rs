//! The app's own tests in headless Chromium (wasm-bindgen-test), with one devalloc allocator
//! per test binary, as devalloc's README shows.
#![cfg(target_arch = "wasm32")]

use devalloc::{DeviceAllocatorRegistry, DeviceType, Error};
use devalloc::wgpu::{WgpuAllocator, WgpuOptions};
use wasm_bindgen_test::wasm_bindgen_test;

wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

/// The test binary's one WebGPU allocator: the first test to ask opens and registers it.
async fn gpu() -> &'static WgpuAllocator {
    let registry = DeviceAllocatorRegistry::instance();
    if let Some(a) = registry.get::<WgpuAllocator>(DeviceType::WebGpu) {
        return a;
    }
    let made = WgpuAllocator::with_options_async(devalloc::wgpu::api::Backend::BrowserWebGpu, WgpuOptions::default())
        .await
        .expect("the browser offers WebGPU (--enable-unsafe-webgpu)");
    let made: &'static WgpuAllocator = Box::leak(Box::new(made));
    match registry.register_allocator(made) {
        Ok(()) => made,
        // Another test registered one while this one awaited the adapter: use that one.
        Err(_) => registry.get::<WgpuAllocator>(DeviceType::WebGpu).expect("registered"),
    }
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
