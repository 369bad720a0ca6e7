//! A wgpu app that adopts devalloc, as a new user writes it from the docs: its own device (and
//! error handler) handed to `WgpuAllocator::from_device_with_options`; a 32-64-10 network with
//! a softmax (three dispatches) whose weights are devalloc allocations filled in one call and
//! whose activations are labelled tensors of one planned buffer (planned for the largest
//! batch); 50 iterations over batch sizes from 1 to 64, each with its own uniforms; bind groups
//! in one call each; every output checked against the CPU; then the stats and a snapshot.
//!
//!     cargo run --example mlp [vulkan|gl]
#[path = "support/compare.rs"]
mod compare;
#[path = "support/logging.rs"]
mod logging;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use devalloc::plan::{plan, Strategy, TensorLife};
use devalloc::wgpu::{Bind, WgpuAllocator, WgpuOptions};
use devalloc::{DeviceAllocator, DeviceMemoryBuffer as Buf, PlannedMemory};

const WGSL: &str = r#"
struct Dims { batch: u32, inputs: u32, outputs: u32, relu: u32 }
@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn dense(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x >= dims.batch * dims.outputs) { return; }
    let b = id.x / dims.outputs;
    let o = id.x % dims.outputs;
    var acc = bias[o];
    for (var i = 0u; i < dims.inputs; i++) { acc += x[b * dims.inputs + i] * w[i * dims.outputs + o]; }
    if (dims.relu == 1u) { acc = max(acc, 0.0); }
    y[id.x] = acc;
}

@group(0) @binding(0) var<uniform> sdims: Dims;
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
@group(0) @binding(4) var<storage, read_write> probs: array<f32>;

@compute @workgroup_size(64)
fn softmax(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x >= sdims.batch) { return; }
    let n = sdims.inputs;
    var top = logits[id.x * n];
    for (var i = 1u; i < n; i++) { top = max(top, logits[id.x * n + i]); }
    var sum = 0.0;
    for (var i = 0u; i < n; i++) { sum += exp(logits[id.x * n + i] - top); }
    for (var i = 0u; i < n; i++) { probs[id.x * n + i] = exp(logits[id.x * n + i] - top) / sum; }
}
"#;

const WIDTHS: [usize; 3] = [32, 64, 10];
const MAX_BATCH: usize = 64;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    logging::init("warn");
    let gl = std::env::args().any(|a| a == "gl");
    // The app's own device, as any wgpu app opens it, with its own error handler.
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = if gl { wgpu::Backends::GL } else { wgpu::Backends::VULKAN };
    let adapter = pollster::block_on(wgpu::Instance::new(desc).request_adapter(&Default::default()))?;
    let (device, queue) = pollster::block_on(adapter.request_device(&Default::default()))?;
    let app_errors = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&app_errors);
    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
        eprintln!("app: uncaptured wgpu error: {e}");
        seen.fetch_add(1, Ordering::SeqCst);
    }));
    // devalloc adopts it; every allocation may be bound as storage or as a uniform.
    let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::UNIFORM;
    let options = WgpuOptions { usage, ..Default::default() };
    let alloc = WgpuAllocator::from_device_with_options(device.clone(), queue.clone(), options)?;
    println!("mlp on {}", alloc.device_name(0));

    // Weights and biases: allocated and filled in one call each.
    let host: Vec<[Vec<f32>; 2]> = (0..2)
        .map(|l| [values(WIDTHS[l] * WIDTHS[l + 1], 2 * l), values(WIDTHS[l + 1], 2 * l + 1)])
        .collect();
    let params =
        host.iter().flatten().map(|v| Buf::from_pod_on(&alloc, v, 0)).collect::<Result<Vec<_>, _>>()?;
    // Activations: tensors of one planned buffer, planned for the largest batch (tensors never
    // live at once share bytes), at offsets that can be bound on their own.
    let (sizes, steps) =
        ([32, 64, 10, 10].map(|n| (MAX_BATCH * n * 4) as u64), [(0, 0), (0, 1), (1, 2), (2, 2)]);
    let lives: Vec<_> =
        sizes.iter().zip(steps).map(|(&size, (first, last))| TensorLife { size, first, last }).collect();
    let p = plan(&lives, alloc.binding_alignment(0)? as u64, Strategy::Fast)?;
    let labels = ["x", "hidden", "logits", "probs"];
    let acts = PlannedMemory::from_plan_labeled(&alloc, &p, 0, Some("activations"), &labels)?;
    let t = (0..4).map(|i| acts.tensor(i)).collect::<Result<Vec<_>, _>>()?;

    let source = wgpu::ShaderSource::Wgsl(WGSL.into());
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor { label: Some("mlp"), source });
    let pipeline = |entry: &str| {
        device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(entry),
            layout: None,
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        })
    };
    let (dense, softmax) = (pipeline("dense"), pipeline("softmax"));
    let (mut worst, mut warm) = (0f32, 0);
    for it in 0..50 {
        let batch = 1 + it * 13 % MAX_BATCH;
        let x = values(batch * WIDTHS[0], 100 + it);
        alloc.copy_host_to_device(t[0].ptr, bytemuck::cast_slice(&x), 0)?;
        // This iteration's uniforms, one small allocation per dispatch (cached from the 2nd on).
        let dims = [[batch, 32, 64, 1], [batch, 64, 10, 0], [batch, 10, 0, 0]].map(|d| d.map(|v| v as u32));
        let dims = dims.iter().map(|d| Buf::from_pod_on(&alloc, d, 0)).collect::<Result<Vec<_>, _>>()?;
        // Bind groups in one call each: the planned tensors read_write (they share one buffer).
        let io = |l: usize| {
            [Bind::uniform(0, &dims[l]), Bind::read_write(1, &t[l]), Bind::read_write(4, &t[l + 1])]
        };
        let layer = |l: usize| {
            let binds =
                [&io(l)[..], &[Bind::read(2, &params[2 * l]), Bind::read(3, &params[2 * l + 1])]].concat();
            alloc.bind_group(&dense.get_bind_group_layout(0), &binds, &[], 0)
        };
        let soft = alloc.bind_group(&softmax.get_bind_group_layout(0), &io(2), &[], 0)?;
        let (groups, work) = ([layer(0)?, layer(1)?, soft], [batch * WIDTHS[1], batch * WIDTHS[2], batch]);
        let mut enc = device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for (k, group) in groups.iter().enumerate() {
                pass.set_pipeline(if k < 2 { &dense } else { &softmax });
                pass.set_bind_group(0, group, &[]);
                pass.dispatch_workgroups(work[k].div_ceil(64) as u32, 1, 1);
            }
        }
        queue.submit([enc.finish()]);
        // A blocking copy through devalloc sees the work the app submitted before it.
        let mut probs = vec![0f32; batch * WIDTHS[2]];
        alloc.copy_device_to_host(bytemuck::cast_slice_mut(&mut probs), t[3].ptr, 0)?;
        // NaN-aware (a NaN anywhere makes `worst` NaN, which fails below); a length mismatch
        // or an empty output is an error.
        let err = compare::max_abs_error(&probs, &cpu(&x, &host, batch))?;
        worst = compare::worse(worst, err);
        warm = if it == 0 { alloc.stats(0)?.cache_misses } else { warm };
    }

    let (stats, snapshot) = (alloc.stats(0)?, alloc.snapshot()?.to_json());
    println!("50 iterations, batches 1-64: max |gpu - cpu| = {worst:e}");
    println!("activations: {} bytes planned for {} one after another", p.size(), sizes.iter().sum::<u64>());
    let (after, reserved) = (stats.cache_misses - warm, stats.reserved_bytes);
    println!("{reserved} bytes reserved, {} device allocations, {after} after the first", stats.cache_misses);
    std::fs::write("target/mlp-snapshot.json", &snapshot)?;
    println!("snapshot: target/mlp-snapshot.json (the planned buffer shows as 'activations')");
    let errors = app_errors.load(Ordering::SeqCst);
    if !compare::within(worst, 1e-5) || errors > 0 || after > 0 || !snapshot.contains("\"activations\"") {
        return Err(format!("error {worst}, {errors} app errors, {after} allocations after warm-up").into());
    }
    drop((acts, params));
    if alloc.stats(0)?.live_allocations != 0 {
        return Err("allocations left behind".into());
    }
    println!("every output matches the CPU");
    Ok(())
}

/// Deterministic values in [-1, 1].
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7919 + seed * 104_729) * 2_654_435_761 % 2001) as f32 / 1000.0 - 1.0).collect()
}

/// The network on the CPU: dense + ReLU, dense, softmax per row.
fn cpu(x: &[f32], params: &[[Vec<f32>; 2]], batch: usize) -> Vec<f32> {
    let mut h = x.to_vec();
    for (l, [w, b]) in params.iter().enumerate() {
        let (n_in, n_out) = (WIDTHS[l], WIDTHS[l + 1]);
        let dot = |k: usize| {
            b[k % n_out] + (0..n_in).map(|i| h[k / n_out * n_in + i] * w[i * n_out + k % n_out]).sum::<f32>()
        };
        h = (0..batch * n_out).map(|k| if l == 0 { dot(k).max(0.0) } else { dot(k) }).collect();
    }
    let softmax = |row: &[f32]| {
        let top = row.iter().fold(f32::MIN, |a, &v| a.max(v));
        let sum: f32 = row.iter().map(|v| (v - top).exp()).sum();
        row.iter().map(|v| (v - top).exp() / sum).collect::<Vec<_>>()
    };
    h.chunks(WIDTHS[2]).flat_map(softmax).collect()
}
