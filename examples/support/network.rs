//! A small dense network in WGSL on devalloc memory, run by the browser demo (`web/src/lib.rs`;
//! `examples/mlp.rs` is the native app): weights and biases in labelled devalloc allocations, each layer's
//! dims in an app-made uniform buffer (beside devalloc's memory in the same bind groups), and
//! the activations at offsets of one planned buffer that the planner laid out so that
//! activations whose lifetimes do not overlap share bytes. Checked against the CPU.
//!
//! Things a wgpu app needs to know, shown here:
//! - The plan's offsets are multiples of `binding_alignment`, so each activation can be bound
//!   on its own; `bind_group` checks offset, size, usage and access against the device.
//! - wgpu tracks usage per *buffer*: two tensors of one planned buffer in one dispatch must
//!   have the same access, so every activation here is `read_write` (binding one as `read` and
//!   another as `read_write` is refused). Tensors live at one step never overlap in a plan, so
//!   a layer's input and output never alias.
#![allow(dead_code)]

#[path = "compare.rs"]
mod compare;

use devalloc::plan::{self, MemoryPlan, Strategy, TensorLife};
use devalloc::wgpu::api as wgpu;
use devalloc::wgpu::{Bind, BufferRequest, WgpuAllocator};
use devalloc::{DeviceAllocator, DevicePtr, PlannedMemory};

const DENSE: &str = r#"
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

/// Deterministic values in [-1, 1].
pub fn values(n: usize, seed: u32) -> Vec<f32> {
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

/// What a run did: the largest difference from the CPU, and the plan of the activations.
pub struct Report {
    /// max |gpu - cpu| over the output: NaN if any output (or its CPU value) is NaN.
    pub worst: f32,
    /// The activations' plan (offsets in the planned buffer, its size, the lower bound).
    pub plan: MemoryPlan,
    /// The activations as planned: (label, bytes, first step, last step).
    pub tensors: Vec<(String, u64, u64, u64)>,
    /// Bytes the activations would take one after another (no reuse).
    pub unplanned: u64,
}

/// The activations' lifetimes: activation `l` is written at step `l - 1` (layer `l - 1`) and
/// read at step `l` (the input at step 0, the output at the last step and after).
fn activations(batch: usize, widths: &[usize]) -> Vec<TensorLife> {
    let layers = widths.len() as u64 - 1;
    widths
        .iter()
        .enumerate()
        .map(|(l, &n)| {
            let l = l as u64;
            TensorLife { size: (batch * n * 4) as u64, first: l.saturating_sub(1), last: l.min(layers) }
        })
        .collect()
}

/// Where a model file (`scripts/make-model`) keeps each layer's weights and biases: layer by
/// layer, weights (`inputs x outputs`, row-major) then biases, f32 little-endian, each starting
/// at a multiple of 256 bytes (WebGPU's largest binding alignment, so each binds where it lies),
/// zeros between. Gives (offset, bytes) of each layer's weights and biases, and the file's size
/// (saturating at `u64::MAX` for widths no file could hold: the caller compares it with what
/// it has).
pub fn model_layout(widths: &[usize]) -> (Vec<[(u64, u64); 2]>, u64) {
    let mut at = 0u64;
    let mut place = |floats: u64| {
        let bytes = floats.saturating_mul(4);
        let off = at.checked_next_multiple_of(256).unwrap_or(u64::MAX);
        at = off.saturating_add(bytes);
        (off, bytes)
    };
    let layers = widths
        .windows(2)
        .map(|w| [place((w[0] as u64).saturating_mul(w[1] as u64)), place(w[1] as u64)])
        .collect();
    (layers, at)
}

/// Runs `widths.len() - 1` dense layers (ReLU between them) on a batch of `batch`, on device
/// 0 of `a`; everything it allocates is freed before it returns.
pub async fn run(a: &WgpuAllocator, widths: &[usize], batch: usize) -> devalloc::Result<Report> {
    run_with(a, widths, batch, None).await
}

/// [`run`], with the weights and biases already on the device where `model` is given: a
/// model file laid out as [`model_layout`] says, at that address (streamed there by the page).
/// The CPU's reference then reads them back from the device.
pub async fn run_with(
    a: &WgpuAllocator,
    widths: &[usize],
    batch: usize,
    model: Option<DevicePtr>,
) -> devalloc::Result<Report> {
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
    // Weights and biases: (address, bytes) of each, with their values for the CPU.
    let (mut params, mut host, mut owned) = (Vec::new(), Vec::new(), Vec::new());
    if let Some(model) = model {
        for (l, place) in model_layout(widths).0.into_iter().enumerate() {
            let mut read = [(DevicePtr::NULL, 0u64); 2];
            let mut values = [Vec::new(), Vec::new()];
            for (k, (off, bytes)) in place.into_iter().enumerate() {
                let p = model.offset_u64(off)?;
                let mut v = vec![0f32; bytes as usize / 4];
                a.copy_device_to_host_async(bytemuck::cast_slice_mut(&mut v), p, 0).await?;
                read[k] = (p, bytes);
                values[k] = v;
            }
            let [w, b] = values;
            debug_assert!(w.len() == widths[l] * widths[l + 1]);
            params.push(read);
            host.push((w, b));
        }
    }
    // Or made here, one labelled allocation each, where no model was given.
    let made = if model.is_none() { 0..layers } else { 0..0 };
    for l in made {
        let w = values(widths[l] * widths[l + 1], 2 * l as u32 + 1);
        let b = values(widths[l + 1], 2 * l as u32 + 2);
        let mut ptrs = [(DevicePtr::NULL, 0u64); 2];
        for (k, (data, name)) in [(&w, "w"), (&b, "b")].into_iter().enumerate() {
            let p = a.allocate_request(
                &BufferRequest::new(data.len() * 4).label(&format!("{name}.layer{l}")),
                0,
            )?;
            owned.push(p);
            a.copy_host_to_device_async(p, bytemuck::cast_slice(data), 0).await?;
            ptrs[k] = (p, data.len() as u64 * 4);
        }
        params.push(ptrs);
        host.push((w, b));
    }
    // Activations: planned so that those never live at once share bytes, at bindable offsets.
    let lives = activations(batch, widths);
    let plan = plan::plan(&lives, a.binding_alignment(0)? as u64, Strategy::Fast)?;
    let names: Vec<String> =
        (0..lives.len()).map(|l| if l == 0 { "input".into() } else { format!("act.layer{l}") }).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let memory = PlannedMemory::from_plan_labeled(a, &plan, 0, Some("activations"), &names)?;
    let acts: Vec<DevicePtr> =
        (0..lives.len()).map(|i| memory.tensor(i).map(|t| t.ptr)).collect::<devalloc::Result<_>>()?;
    let x = values(batch * widths[0], 99);
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
    let mut enc = device.create_command_encoder(&Default::default());
    for l in 0..layers {
        // The app's own uniform buffer, in the same bind group as devalloc's memory.
        let dims = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("app dims"),
            size: 16,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let relu = u32::from(l + 1 < layers);
        queue.write_buffer(
            &dims,
            0,
            bytemuck::cast_slice(&[batch as u32, widths[l] as u32, widths[l + 1] as u32, relu]),
        );
        let binds = [
            Bind::read_write(1, (acts[l], lives[l].size)),
            Bind::read(2, params[l][0]),
            Bind::read(3, params[l][1]),
            Bind::read_write(4, (acts[l + 1], lives[l + 1].size)),
        ];
        let app = [wgpu::BindGroupEntry { binding: 0, resource: dims.as_entire_binding() }];
        let group = a.bind_group(&pipeline.get_bind_group_layout(0), &binds, &app, 0)?;
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups((batch * widths[l + 1]).div_ceil(64) as u32, 1, 1);
    }
    queue.submit([enc.finish()]);
    let mut out = vec![0f32; batch * widths[layers]];
    a.copy_device_to_host_async(bytemuck::cast_slice_mut(&mut out), acts[layers], 0).await?;
    // NaN if any output is NaN (the page's `maxError < 1e-3` then fails); a length mismatch
    // or an empty output is an error, not a pass.
    let worst = compare::max_abs_error(&out, &cpu(&x, &host, batch, widths))
        .map_err(|e| devalloc::Error::invalid_argument(format!("the network's output: {e}")))?;
    drop(memory);
    for p in owned {
        a.deallocate(p, 0)?;
    }
    let unplanned = lives.iter().map(|t| t.size).sum();
    let tensors = lives
        .iter()
        .enumerate()
        .map(|(l, t)| {
            (if l == 0 { "input".into() } else { format!("act.layer{l}") }, t.size, t.first, t.last)
        })
        .collect();
    Ok(Report { worst, plan, tensors, unplanned })
}

/// The network on the CPU.
fn cpu(x: &[f32], params: &[(Vec<f32>, Vec<f32>)], batch: usize, widths: &[usize]) -> Vec<f32> {
    let layers = widths.len() - 1;
    let mut h = x.to_vec();
    for (l, (w, b)) in params.iter().enumerate() {
        let (n_in, n_out) = (widths[l], widths[l + 1]);
        let mut next = vec![0f32; batch * n_out];
        for r in 0..batch {
            for o in 0..n_out {
                let mut acc = b[o];
                for i in 0..n_in {
                    acc += h[r * n_in + i] * w[i * n_out + o];
                }
                next[r * n_out + o] = if l + 1 < layers { acc.max(0.0) } else { acc };
            }
        }
        h = next;
    }
    h
}
