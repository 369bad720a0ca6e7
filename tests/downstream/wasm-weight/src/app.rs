//! The app on devalloc, as its README shows: the browser's one call in (or, with `direct`,
//! WebGPU alone), allocations, async copies, a bind group of devalloc memory.
use devalloc::wgpu::{Bind, WgpuAllocator};
use devalloc::{DeviceAllocator, DEFAULT_ALIGNMENT};
#[cfg(not(feature = "direct"))]
use devalloc::{DeviceAllocatorRegistry, DeviceType};
use wasm_bindgen::JsValue;

fn js(e: devalloc::Error) -> JsValue {
    JsValue::from_str(&e.to_string())
}

pub async fn run() -> Result<usize, JsValue> {
    #[cfg(not(feature = "direct"))]
    let alloc: &WgpuAllocator = {
        let registry = DeviceAllocatorRegistry::instance();
        devalloc::register_available_async(registry).await;
        registry.get(DeviceType::WebGpu).ok_or_else(|| JsValue::from_str("no WebGPU"))?
    };
    #[cfg(feature = "direct")]
    let alloc = &WgpuAllocator::new_async(devalloc::wgpu::api::Backend::BrowserWebGpu).await.map_err(js)?;
    let input = super::input();
    let bytes = input.len() * 4;
    let a = alloc.allocate(bytes, 0, DEFAULT_ALIGNMENT).map_err(js)?;
    let b = alloc.allocate(bytes, 0, DEFAULT_ALIGNMENT).map_err(js)?;
    alloc.copy_host_to_device_async(a, bytemuck::cast_slice(&input), 0).await.map_err(js)?;
    let device = alloc.device(0).map_err(js)?;
    let pipeline = super::pipeline(device);
    let group = alloc
        .bind_group(&pipeline.get_bind_group_layout(0), &[Bind::read(0, a), Bind::read_write(1, b)], &[], 0)
        .map_err(js)?;
    let enc = super::dispatch(device, &pipeline, &group, input.len());
    alloc.queue(0).map_err(js)?.submit([enc.finish()]);
    let mut out = vec![0f32; input.len()];
    alloc.copy_device_to_host_async(bytemuck::cast_slice_mut(&mut out), b, 0).await.map_err(js)?;
    // A read one float past the end is refused.
    let mut past = vec![0u8; bytes + 4];
    if alloc.copy_device_to_host_async(&mut past, b, 0).await.is_ok() {
        return Err(JsValue::from_str("a read past the end was not refused"));
    }
    alloc.deallocate(a, 0).map_err(js)?;
    alloc.deallocate(b, 0).map_err(js)?;
    super::check(&out, &input)
}
