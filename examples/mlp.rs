//! A wgpu app that adopts devalloc: its own instance, adapter, device and queue (and its own
//! error handler), handed to `WgpuAllocator::from_device_with`; a 2-layer network in WGSL whose
//! weights live in devalloc allocations and whose activations live at offsets of one planned
//! buffer, beside the app's own uniform buffer in the same bind groups; checked against the CPU.
//!
//!     cargo run --example mlp [vulkan|gl|metal|dx12]
//!
//! Things a wgpu app needs to know, shown here:
//! - Offsets in a plan are laid out at `binding_alignment` (PlanLayout), so each activation can
//!   be bound on its own; `binding(kind)` checks offset, size and usage against the device.
//! - wgpu tracks usage per *buffer*: two tensors of one planned buffer in one dispatch must
//!   have the same access, so every activation here is `read_write` (binding one as
//!   `read` and another as `read_write` is refused: conflicting STORAGE_READ_ONLY /
//!   STORAGE_READ_WRITE). The other way out is one planned buffer per access kind.
//! - The app keeps its uncaptured-error handler; devalloc catches its own errors in scopes.
#[path = "support/logging.rs"]
mod logging;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use devalloc::wgpu::{BindingKind, BufferRequest, WgpuAllocator, WgpuOptions};
use devalloc::{DeviceAllocator, PlanLayout};

const LAYER: &str = r#"
struct Dims { batch: u32, inputs: u32, outputs: u32, relu: u32 }
@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn dense(@builtin(global_invocation_id) id: vec3<u32>) {
    let n = dims.batch * dims.outputs;
    if (id.x >= n) { return; }
    let b = id.x / dims.outputs;
    let o = id.x % dims.outputs;
    var acc = bias[o];
    for (var i = 0u; i < dims.inputs; i++) {
        acc += x[b * dims.inputs + i] * w[i * dims.outputs + o];
    }
    if (dims.relu == 1u) { acc = max(acc, 0.0); }
    y[id.x] = acc;
}
"#;

const BATCH: usize = 16;
const IN: usize = 64;
const HIDDEN: usize = 128;
const OUT: usize = 10;

fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn dense_cpu(x: &[f32], w: &[f32], b: &[f32], inputs: usize, outputs: usize, relu: bool) -> Vec<f32> {
    let mut y = vec![0f32; BATCH * outputs];
    for r in 0..BATCH {
        for o in 0..outputs {
            let mut acc = b[o];
            for i in 0..inputs {
                acc += x[r * inputs + i] * w[i * outputs + o];
            }
            y[r * outputs + o] = if relu { acc.max(0.0) } else { acc };
        }
    }
    y
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let default = "warn";
    logging::init(default);
    let backend = match std::env::args().nth(1).as_deref() {
        None | Some("vulkan") => wgpu::Backends::VULKAN,
        Some("gl") => wgpu::Backends::GL,
        Some("metal") => wgpu::Backends::METAL,
        Some("dx12") => wgpu::Backends::DX12,
        Some(other) => return Err(format!("unknown backend {other:?}").into()),
    };

    // The app's own device, as any wgpu app opens it.
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backend;
    let instance = wgpu::Instance::new(desc);
    let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions::default()))?;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor::default()))?;
    let app_errors = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&app_errors);
    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
        eprintln!("app: uncaptured wgpu error: {e}");
        seen.fetch_add(1, Ordering::SeqCst);
    }));

    // devalloc adopts it; the app gives its lost callback through the options.
    let options = WgpuOptions {
        on_device_lost: Some(Arc::new(|reason, msg: &str| eprintln!("app: device lost ({reason:?}): {msg}"))),
        ..WgpuOptions::default()
    };
    let alloc = WgpuAllocator::from_device_with_options(device.clone(), queue.clone(), options)?;
    println!("mlp on {}", alloc.device_name(0));

    // Weights: one labelled allocation each (wgpu's messages name them).
    let (w1, b1, w2, b2) =
        (values(IN * HIDDEN, 1), values(HIDDEN, 2), values(HIDDEN * OUT, 3), values(OUT, 4));
    let weight = |data: &[f32], label: &str| -> devalloc::Result<devalloc::DevicePtr> {
        let p = alloc.allocate_request(&BufferRequest::new(data.len() * 4).label(label), 0)?;
        alloc.copy_host_to_device(p, bytemuck::cast_slice(data), 0)?;
        Ok(p)
    };
    let (w1p, b1p, w2p, b2p) =
        (weight(&w1, "w1")?, weight(&b1, "b1")?, weight(&w2, "w2")?, weight(&b2, "b2")?);

    // Activations: one planned buffer, each tensor at a bindable offset.
    let mut layout = PlanLayout::new(alloc.binding_alignment(0)?)?;
    let (x_off, h_off, y_off) =
        (layout.place(BATCH * IN * 4)?, layout.place(BATCH * HIDDEN * 4)?, layout.place(BATCH * OUT * 4)?);
    alloc.init_buffer(0, layout.size(), 0)?;
    let x_ptr = alloc.get_offset_address(0, x_off, BATCH * IN * 4, 0)?;
    let h_ptr = alloc.get_offset_address(0, h_off, BATCH * HIDDEN * 4, 0)?;
    let y_ptr = alloc.get_offset_address(0, y_off, BATCH * OUT * 4, 0)?;
    let x = values(BATCH * IN, 5);
    alloc.copy_host_to_device(x_ptr, bytemuck::cast_slice(&x), 0)?;

    // The app's own uniform buffers, beside devalloc's memory in the same bind groups.
    let dims = |inputs: usize, outputs: usize, relu: u32| {
        let b = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("app dims"),
            size: 16,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        queue.write_buffer(&b, 0, bytemuck::cast_slice(&[BATCH as u32, inputs as u32, outputs as u32, relu]));
        b
    };
    let (dims1, dims2) = (dims(IN, HIDDEN, 1), dims(HIDDEN, OUT, 0));

    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("dense"),
        source: wgpu::ShaderSource::Wgsl(LAYER.into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("dense"),
        layout: None,
        module: &module,
        entry_point: Some("dense"),
        compilation_options: Default::default(),
        cache: None,
    });
    let layer = |dims: &wgpu::Buffer,
                 x: devalloc::DevicePtr,
                 w,
                 b,
                 y: devalloc::DevicePtr,
                 xn,
                 yn|
     -> devalloc::Result<wgpu::BindGroup> {
        let (xr, wr, br, yr) = (
            alloc.buffer_range(x, xn, 0)?,
            alloc.buffer(w, 0)?,
            alloc.buffer(b, 0)?,
            alloc.buffer_range(y, yn, 0)?,
        );
        Ok(device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("dense"),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: dims.as_entire_binding() },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: wgpu::BindingResource::Buffer(xr.binding(BindingKind::Storage)?),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: wgpu::BindingResource::Buffer(wr.binding(BindingKind::Storage)?),
                },
                wgpu::BindGroupEntry {
                    binding: 3,
                    resource: wgpu::BindingResource::Buffer(br.binding(BindingKind::Storage)?),
                },
                wgpu::BindGroupEntry {
                    binding: 4,
                    resource: wgpu::BindingResource::Buffer(yr.binding(BindingKind::Storage)?),
                },
            ],
        }))
    };
    let (in4, hid4, out4) = ((BATCH * IN * 4) as u64, (BATCH * HIDDEN * 4) as u64, (BATCH * OUT * 4) as u64);
    let g1 = layer(&dims1, x_ptr, w1p, b1p, h_ptr, in4, hid4)?;
    let g2 = layer(&dims2, h_ptr, w2p, b2p, y_ptr, hid4, out4)?;
    let mut enc = device.create_command_encoder(&Default::default());
    for (group, n) in [(&g1, BATCH * HIDDEN), (&g2, BATCH * OUT)] {
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, group, &[]);
        pass.dispatch_workgroups(n.div_ceil(64) as u32, 1, 1);
    }
    queue.submit([enc.finish()]);

    let mut y = vec![0f32; BATCH * OUT];
    alloc.copy_device_to_host(bytemuck::cast_slice_mut(&mut y), y_ptr, 0)?;
    let h_cpu = dense_cpu(&x, &w1, &b1, IN, HIDDEN, true);
    let y_cpu = dense_cpu(&h_cpu, &w2, &b2, HIDDEN, OUT, false);
    let worst = y.iter().zip(&y_cpu).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    println!("{BATCH}x{IN} -> {HIDDEN} (relu) -> {OUT}: max |gpu - cpu| = {worst:e}");
    println!("plan: {} bytes, activations at offsets {x_off}, {h_off}, {y_off}", layout.size());
    alloc.release_buffers(0)?;
    for p in [w1p, b1p, w2p, b2p] {
        alloc.deallocate(p, 0)?;
    }
    if app_errors.load(Ordering::SeqCst) > 0 {
        return Err("the app's error handler saw errors".into());
    }
    if worst > 1e-3 || y.iter().all(|&v| v == 0.0) {
        return Err(format!("GPU result differs from the CPU by {worst}").into());
    }
    println!("the network's output matches the CPU");
    Ok(())
}
