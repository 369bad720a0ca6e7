//! A tensor larger than one GPU buffer, indexed by a WGSL kernel as four bindings.
//!
//! With `WgpuOptions::max_buffer_size` at 1 MiB (a stand-in for the 256 MiB a browser or a
//! phone gives), a 3.5 MiB tensor is served as one devalloc range over four buffers, its
//! segments. The kernel declares four `array<f32>` bindings for it and reads element `i` from
//! part `i / part_len`. `Bind::read(0, BindTarget::segments(..))` fills bindings 0-3 from the
//! range's parts, whatever their number (up to four), and the output is bound the same way.
//! The result (`y = 2x + 1`) is checked against the CPU, element by element.
//!
//!     cargo run --release --example segmented [vulkan|gl|metal|dx12]
#[path = "support/logging.rs"]
mod logging;

use devalloc::wgpu::{Bind, BindTarget, BufferRequest, WgpuAllocator, WgpuOptions};
use devalloc::DeviceAllocator;

const SLOTS: u32 = 4;

const SHADER: &str = r#"
struct Params { part: u32, n: u32 }
@group(0) @binding(0) var<storage, read> x0: array<f32>;
@group(0) @binding(1) var<storage, read> x1: array<f32>;
@group(0) @binding(2) var<storage, read> x2: array<f32>;
@group(0) @binding(3) var<storage, read> x3: array<f32>;
@group(0) @binding(4) var<storage, read_write> y0: array<f32>;
@group(0) @binding(5) var<storage, read_write> y1: array<f32>;
@group(0) @binding(6) var<storage, read_write> y2: array<f32>;
@group(0) @binding(7) var<storage, read_write> y3: array<f32>;
@group(0) @binding(8) var<uniform> p: Params;

fn load(i: u32) -> f32 {
    let j = i % p.part;
    switch (i / p.part) {
        case 0u: { return x0[j]; }
        case 1u: { return x1[j]; }
        case 2u: { return x2[j]; }
        default: { return x3[j]; }
    }
}

fn store(i: u32, v: f32) {
    let j = i % p.part;
    switch (i / p.part) {
        case 0u: { y0[j] = v; }
        case 1u: { y1[j] = v; }
        case 2u: { y2[j] = v; }
        default: { y3[j] = v; }
    }
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < p.n) {
        store(id.x, load(id.x) * 2.0 + 1.0);
    }
}
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    logging::init("warn");
    let name = std::env::args().nth(1).unwrap_or_else(|| "vulkan".into());
    let backend = match name.as_str() {
        "vulkan" => wgpu::Backend::Vulkan,
        "gl" => wgpu::Backend::Gl,
        "metal" => wgpu::Backend::Metal,
        "dx12" => wgpu::Backend::Dx12,
        other => return Err(format!("unknown backend {other:?}").into()),
    };
    let max_buffer = 1u64 << 20;
    let options = WgpuOptions { max_buffer_size: Some(max_buffer), ..Default::default() };
    let alloc = WgpuAllocator::with_options(backend, options)?;
    let n: u32 = 7 << 17; // 917,504 floats: 3.5 MiB
    let bytes = u64::from(n) * 4;
    let xs: Vec<f32> = (0..n).map(|i| (i % 1009) as f32 * 0.5 - 100.0).collect();
    let x = alloc.allocate(bytes as usize, 0, 256)?;
    let y = alloc.allocate(bytes as usize, 0, 256)?;
    alloc.copy_host_to_device(x, bytemuck::cast_slice(&xs), 0)?;
    let parts = alloc.segments(x, bytes, 0)?;
    // Every part but the last is one whole segment: elements per part.
    let part = (parts[0].len() / 4) as u32;
    let params = alloc.allocate_request(&BufferRequest::new(16).usage(wgpu::BufferUsages::UNIFORM), 0)?;
    alloc.copy_host_to_device(params, bytemuck::cast_slice(&[part, n, 0, 0]), 0)?;

    let device = alloc.device(0)?;
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("segmented"),
        source: wgpu::ShaderSource::Wgsl(SHADER.into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("segmented"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let binds = [
        Bind::read(0, BindTarget::segments(x, bytes, SLOTS)),
        Bind::read_write(SLOTS, BindTarget::segments(y, bytes, SLOTS)),
        Bind::uniform(2 * SLOTS, (params, 16)),
    ];
    let group = alloc.bind_group(&pipeline.get_bind_group_layout(0), &binds, &[], 0)?;
    let mut encoder = device.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(n.div_ceil(64), 1, 1);
    }
    alloc.queue(0)?.submit([encoder.finish()]);

    let mut back = vec![0f32; n as usize];
    alloc.copy_device_to_host(bytemuck::cast_slice_mut(&mut back), y, 0)?;
    let wrong = xs.iter().zip(&back).filter(|(x, y)| **y != **x * 2.0 + 1.0).count();
    println!(
        "segmented: backend={name} device={:?} elements={n} bytes={bytes} max_buffer={max_buffer} parts={} part_elements={part} wrong={wrong}",
        alloc.device_name(0),
        parts.len(),
    );
    for p in [x, y, params] {
        alloc.deallocate(p, 0)?;
    }
    if parts.len() != SLOTS as usize || wrong > 0 {
        return Err(
            format!("{wrong} of {n} elements differ from the CPU's, over {} parts", parts.len()).into()
        );
    }
    Ok(())
}
