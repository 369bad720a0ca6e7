//! A real wgpu compute program on devalloc memory: `y = a * x + y` (saxpy) over 4 million
//! floats in WGSL. Every buffer the kernel touches comes from a `WgpuAllocator`; the app binds
//! them through `WgpuAllocator::buffer`, and the result is checked against the CPU.
//!
//!     cargo run --release --example compute [vulkan|gl|metal|dx12]
#[path = "support/compare.rs"]
mod compare;
#[path = "support/logging.rs"]
mod logging;
use std::time::Instant;

use devalloc::wgpu::{BindingKind, WgpuAllocator, WgpuOptions};
use devalloc::{DeviceAllocator, DeviceMemoryBuffer, DEFAULT_ALIGNMENT};

const SHADER: &str = r#"
struct Params { a: f32, n: u32 }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn saxpy(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = id.x + id.y * groups.x * 256u;
    if (i < params.n) {
        y[i] = params.a * x[i] + y[i];
    }
}
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    logging::init("warn");
    let backend = match std::env::args().nth(1).as_deref() {
        None | Some("vulkan") => wgpu::Backend::Vulkan,
        Some("gl") => wgpu::Backend::Gl,
        Some("metal") => wgpu::Backend::Metal,
        Some("dx12") => wgpu::Backend::Dx12,
        Some(other) => return Err(format!("unknown backend {other:?}").into()),
    };
    let options = WgpuOptions {
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::UNIFORM,
        ..Default::default()
    };
    let alloc: &'static WgpuAllocator = Box::leak(Box::new(WgpuAllocator::with_options(backend, options)?));
    println!("saxpy on {}", alloc.device_name(0));

    let n: u32 = 4 << 20;
    let a = 2.5f32;
    let xs: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.001).collect();
    let ys: Vec<f32> = (0..n).map(|i| (i % 77) as f32 - 38.0).collect();

    // All device memory from devalloc: params, x, y.
    let mut params = DeviceMemoryBuffer::create_on(alloc, 16, 0, DEFAULT_ALIGNMENT)?;
    let mut x = DeviceMemoryBuffer::create_on(alloc, n as usize * 4, 0, DEFAULT_ALIGNMENT)?;
    let mut y = DeviceMemoryBuffer::create_on(alloc, n as usize * 4, 0, DEFAULT_ALIGNMENT)?;
    params.write_at(0, bytemuck::cast_slice(&[a.to_bits(), n, 0, 0]))?;
    x.write_pod(&xs)?;
    y.write_pod(&ys)?;

    let device = alloc.device(0)?;
    let queue = alloc.queue(0)?;
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("saxpy"),
        source: wgpu::ShaderSource::Wgsl(SHADER.into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("saxpy"),
        layout: None,
        module: &module,
        entry_point: Some("saxpy"),
        compilation_options: Default::default(),
        cache: None,
    });
    let (pb, xb, yb) = (alloc.buffer(params.ptr(), 0)?, alloc.buffer(x.ptr(), 0)?, alloc.buffer(y.ptr(), 0)?);
    let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("saxpy"),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(pb.binding(BindingKind::Uniform)?),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: wgpu::BindingResource::Buffer(xb.binding(BindingKind::Storage)?),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: wgpu::BindingResource::Buffer(yb.binding(BindingKind::Storage)?),
            },
        ],
    });
    let groups = n.div_ceil(256);
    let (gx, gy) = (groups.min(65_535), groups.div_ceil(65_535));
    let t = Instant::now();
    let mut enc = device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(gx, gy, 1);
    }
    queue.submit([enc.finish()]);
    alloc.synchronize(0)?;
    let kernel = t.elapsed();

    let out = y.to_vec::<f32>()?;
    let want: Vec<f32> = xs.iter().zip(&ys).map(|(x, y)| a * x + y).collect();
    // NaN and a short output fail too (a NaN difference makes `worst` NaN).
    let worst = compare::max_abs_error(&out, &want)?;
    println!("{n} floats: kernel {:.2} ms, max |gpu - cpu| = {worst:e}", kernel.as_secs_f64() * 1e3);
    if !compare::within(worst, 1e-4) {
        return Err(format!("GPU result differs from the CPU by {worst}").into());
    }
    println!("saxpy result matches the CPU");
    Ok(())
}
