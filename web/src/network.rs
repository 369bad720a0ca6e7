//! The page's workload for the memory viewer: a few dense layers of a network in WGSL, weights
//! in labelled devalloc allocations, activations at bindable offsets of one planned buffer,
//! checked against the CPU.
use devalloc::wgpu::{BindingKind, BufferRequest, WgpuAllocator};
use devalloc::{DeviceAllocator, DevicePtr, PlanLayout};

use crate::wgpu;

const DENSE: &str = r#"
struct Dims { batch: u32, inputs: u32, outputs: u32, relu: u32 }
@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(64)
fn dense(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x >= dims.batch * dims.outputs) { return; }
    let b = id.x / dims.outputs;
    let o = id.x % dims.outputs;
    var acc = 0.0;
    for (var i = 0u; i < dims.inputs; i++) { acc += x[b * dims.inputs + i] * w[i * dims.outputs + o]; }
    if (dims.relu == 1u) { acc = max(acc, 0.0); }
    y[id.x] = acc;
}
"#;

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

/// Runs `widths.len() - 1` dense layers on a batch of 8; returns max |gpu - cpu|.
pub async fn run(a: &WgpuAllocator, widths: &[usize]) -> devalloc::Result<f32> {
    const BATCH: usize = 8;
    let device = a.device(0)?.clone();
    let queue = a.queue(0)?.clone();
    if device.limits().max_compute_workgroups_per_dimension == 0 {
        // WebGL2 has no compute shaders: say so, rather than let wgpu refuse the pipeline.
        return Err(devalloc::Error::NotSupported {
            operation: "run_network",
            device_type: a.device_type(),
            reason: "this device has no compute shaders (WebGL2 has none); the network needs them".into(),
        });
    }
    let layers = widths.len() - 1;
    // Weights: one labelled allocation per layer.
    let mut weights = Vec::new();
    let mut host_w = Vec::new();
    for l in 0..layers {
        let w = values(widths[l] * widths[l + 1], l as u32 + 1);
        let p = a.allocate_request(&BufferRequest::new(w.len() * 4).label(&format!("w.layer{l}")), 0)?;
        a.copy_host_to_device_async(p, bytemuck::cast_slice(&w), 0).await?;
        weights.push(p);
        host_w.push(w);
    }
    // Activations: one planned buffer, each at a bindable offset.
    let mut layout = PlanLayout::new(a.binding_alignment(0)?)?;
    let offsets: Vec<usize> =
        widths.iter().map(|&n| layout.place(BATCH * n * 4)).collect::<devalloc::Result<_>>()?;
    a.init_buffer(0, layout.size(), 0)?;
    let acts: Vec<DevicePtr> = offsets
        .iter()
        .zip(widths)
        .map(|(&o, &n)| a.get_offset_address(0, o, BATCH * n * 4, 0))
        .collect::<devalloc::Result<_>>()?;
    let x = values(BATCH * widths[0], 99);
    a.copy_host_to_device_async(acts[0], bytemuck::cast_slice(&x), 0).await?;
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("dense"),
        source: wgpu::ShaderSource::Wgsl(DENSE.into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("dense"),
        layout: None,
        module: &module,
        entry_point: Some("dense"),
        compilation_options: Default::default(),
        cache: None,
    });
    // Each layer's dims in a uniform allocation of its own.
    let mut dims = Vec::new();
    let mut enc = device.create_command_encoder(&Default::default());
    let mut groups = Vec::new();
    for l in 0..layers {
        let d = a.allocate_request(
            &BufferRequest::new(16).usage(wgpu::BufferUsages::UNIFORM).label(&format!("dims.layer{l}")),
            0,
        )?;
        let relu = u32::from(l + 1 < layers);
        a.copy_host_to_device_async(
            d,
            bytemuck::cast_slice(&[BATCH as u32, widths[l] as u32, widths[l + 1] as u32, relu]),
            0,
        )
        .await?;
        dims.push(d);
        let (dr, xr, wr, yr) = (
            a.buffer(d, 0)?,
            a.buffer_range(acts[l], (BATCH * widths[l] * 4) as u64, 0)?,
            a.buffer(weights[l], 0)?,
            a.buffer_range(acts[l + 1], (BATCH * widths[l + 1] * 4) as u64, 0)?,
        );
        groups.push(device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("dense"),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(dr.binding(BindingKind::Uniform)?),
                },
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
                    resource: wgpu::BindingResource::Buffer(yr.binding(BindingKind::Storage)?),
                },
            ],
        }));
    }
    for (l, g) in groups.iter().enumerate() {
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, g, &[]);
        pass.dispatch_workgroups((BATCH * widths[l + 1]).div_ceil(64) as u32, 1, 1);
    }
    queue.submit([enc.finish()]);
    drop(groups);
    let mut out = vec![0f32; BATCH * widths[layers]];
    a.copy_device_to_host_async(bytemuck::cast_slice_mut(&mut out), acts[layers], 0).await?;
    // The CPU's answer.
    let mut h = x;
    for l in 0..layers {
        let (n_in, n_out) = (widths[l], widths[l + 1]);
        let mut next = vec![0f32; BATCH * n_out];
        for b in 0..BATCH {
            for o in 0..n_out {
                let mut acc = 0.0;
                for i in 0..n_in {
                    acc += h[b * n_in + i] * host_w[l][i * n_out + o];
                }
                next[b * n_out + o] = if l + 1 < layers { acc.max(0.0) } else { acc };
            }
        }
        h = next;
    }
    let worst = out.iter().zip(&h).map(|(g, c)| (g - c).abs()).fold(0f32, f32::max);
    a.release_buffers(0)?;
    for p in weights.into_iter().chain(dims) {
        a.deallocate(p, 0)?;
    }
    Ok(worst)
}
