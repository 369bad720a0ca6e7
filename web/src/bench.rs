//! The page's benchmark: devalloc against plain wgpu in the browser.
use serde::Serialize;

use crate::wgpu;
use devalloc::{DeviceAllocator, WgpuAllocator, DEFAULT_ALIGNMENT};

fn now_ms() -> f64 {
    use wasm_bindgen::JsCast;
    js_sys::Reflect::get(&js_sys::global(), &"performance".into())
        .ok()
        .and_then(|p| js_sys::Reflect::get(&p, &"now".into()).ok().map(|f| (p, f)))
        .and_then(|(p, f)| f.dyn_into::<js_sys::Function>().ok().and_then(|f| f.call0(&p).ok()))
        .and_then(|v| v.as_f64())
        .unwrap_or_else(js_sys::Date::now)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Medians of one size, GB/s and ms.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BenchResult {
    size: usize,
    verified: bool,
    up_devalloc: f64,
    up_plain: f64,
    down_devalloc: f64,
    down_plain: f64,
    up_ms: f64,
    down_ms: f64,
    plain_down_ms: f64,
}

pub async fn run(a: &'static WgpuAllocator, size: usize, reps: usize) -> devalloc::Result<BenchResult> {
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
    let padded_len = size.next_multiple_of(4) as u64;
    let plain = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("baseline"),
        size: padded_len,
        usage,
        mapped_at_creation: false,
    });
    let (mut pup, mut pdown) = (Vec::new(), Vec::new());
    let padded: Vec<u8> =
        data.iter().copied().chain(std::iter::repeat(0)).take(padded_len as usize).collect();
    for _ in 0..=reps {
        let t = now_ms();
        queue.write_buffer(&plain, 0, &padded);
        a.synchronize_async(0).await?;
        pup.push(now_ms() - t);
        let t = now_ms();
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("baseline staging"),
            size: padded_len,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&plain, 0, &staging, 0, padded_len);
        queue.submit([enc.finish()]);
        a.map_buffer_async(0, &staging, wgpu::MapMode::Read, 0..padded_len).await?;
        if let Ok(view) = staging.get_mapped_range(..) {
            back.copy_from_slice(&view[..size]);
        }
        pdown.push(now_ms() - t);
    }
    // The first repetition warms staging buffers and caches up; medians of the rest.
    let m = |v: &Vec<f64>| median(v[1..].to_vec());
    Ok(BenchResult {
        size,
        verified,
        up_devalloc: gbps(m(&up)),
        up_plain: gbps(m(&pup)),
        down_devalloc: gbps(m(&down)),
        down_plain: gbps(m(&pdown)),
        up_ms: m(&up),
        down_ms: m(&down),
        plain_down_ms: m(&pdown),
    })
}
