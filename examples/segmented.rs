//! A tensor larger than one GPU buffer, indexed by a WGSL kernel as four bindings.
//!
//! With `WgpuOptions::max_buffer_size` at 1 MiB (a stand-in for the 256 MiB a browser or a
//! phone gives), a 3.5 MiB tensor is served as one devalloc range over four buffers, its
//! segments. The kernel declares four `array<f32>` bindings for it and reads element `i` from
//! part `i / part_len`. `Bind::read(0, BindTarget::segments(..))` fills bindings 0-3 from the
//! range's parts, whatever their number (up to four), and the output is bound the same way.
//! The result (`y = 2x + 1`) is checked against the CPU, element by element.
//!
//!     cargo run --release --example segmented [vulkan|gl|metal|dx12] [--bench [--segment-mib N]]
//!
//! `--bench`: a 64 MiB copy up and down, into one buffer and into 16 MiB segments (or N MiB:
//! more seams; two allocators on the same adapter), interleaved, median of 25 rounds, every
//! result checked; and what the segmented allocation holds against its size.
#[path = "support/logging.rs"]
mod logging;

use devalloc::wgpu::{Bind, BindTarget, BufferRequest, WgpuAllocator, WgpuOptions};
use devalloc::DeviceAllocator;

const SLOTS: u32 = 4;
/// Rounds of the bench: a 64 MiB copy takes 6-15 ms here, and 7 rounds' medians moved by 10%
/// from run to run on a 2-core machine (0.88x one time, 1.03x the next, same code).
const ROUNDS: usize = 25;

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
    let args: Vec<String> = std::env::args().skip(1).collect();
    let name = args.iter().find(|a| !a.starts_with("--")).cloned().unwrap_or_else(|| "vulkan".into());
    let backend = match name.as_str() {
        "vulkan" => wgpu::Backend::Vulkan,
        "gl" => wgpu::Backend::Gl,
        "metal" => wgpu::Backend::Metal,
        "dx12" => wgpu::Backend::Dx12,
        other => return Err(format!("unknown backend {other:?}").into()),
    };
    if args.iter().any(|a| a == "--bench") {
        let mib = match args.iter().position(|a| a == "--segment-mib") {
            Some(i) => args
                .get(i + 1)
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|m| (1..64).contains(m))
                .ok_or("--segment-mib takes a whole number of MiB from 1 to 63")?,
            None => 16,
        };
        return bench(&name, backend, mib << 20);
    }
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

/// Seconds of `f`, run once.
fn time(f: impl FnOnce() -> devalloc::Result<()>) -> Result<f64, Box<dyn std::error::Error>> {
    let t = std::time::Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64())
}

/// The median of `v`.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A copy across segments against the same copy into one buffer (see the module docs).
fn bench(name: &str, backend: wgpu::Backend, seg: u64) -> Result<(), Box<dyn std::error::Error>> {
    let size = 64usize << 20;
    let whole = WgpuAllocator::with_options(backend, WgpuOptions::default())?;
    let split = WgpuAllocator::with_options(
        backend,
        WgpuOptions { max_buffer_size: Some(seg), ..Default::default() },
    )?;
    let data: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
    let mut back = vec![0u8; size];
    let (pw, ps) = (whole.allocate(size, 0, 256)?, split.allocate(size, 0, 256)?);
    let parts = split.segments(ps, size as u64, 0)?.len();
    let want = (size as u64).div_ceil(seg) as usize;
    if whole.segments(pw, 0, 0)?.len() != 1 || parts != want {
        return Err(format!("{name}: {parts} parts of {} MiB, expected {want}", seg >> 20).into());
    }
    let (mut up, mut down) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for _ in 0..ROUNDS {
        for (k, (a, p)) in [(&whole, pw), (&split, ps)].into_iter().enumerate() {
            back.fill(0);
            up[k].push(time(|| a.copy_host_to_device(p, &data, 0).and_then(|_| a.synchronize(0)))?);
            down[k].push(time(|| a.copy_device_to_host(&mut back, p, 0))?);
            if back != data {
                return Err(format!("{name}: a 64 MiB round trip came back wrong ({} parts)", k + 1).into());
            }
        }
    }
    let gbps = |s: f64| size as f64 / s / 1e9;
    let held = split.stats(0)?.reserved_bytes;
    // What wgpu's own allocator holds beneath each (where the backend reports it).
    let beneath = |a: &WgpuAllocator| {
        let memory = a.snapshot().ok()?.devices.into_iter().next()?.device_memory?;
        memory.backend_reserved_bytes
    };
    println!(
        "# a 64 MiB copy into one buffer and into {} MiB segments ({parts} parts), {name}, median of {ROUNDS}, interleaved, verified",
        seg >> 20
    );
    println!("| copy | one buffer GB/s | segments GB/s | segments / one buffer |");
    println!("|---|---|---|---|");
    for (what, t) in [("host to device", &up), ("device to host", &down)] {
        let (one, seg) = (gbps(median(t[0].clone())), gbps(median(t[1].clone())));
        println!("| {what} | {one:.2} | {seg:.2} | {:.2}x |", seg / one);
    }
    println!(
        "segmented memory held: {held} bytes for a {size}-byte allocation ({:.4}x)",
        held as f64 / size as f64
    );
    if let (Some(w), Some(s)) = (beneath(&whole), beneath(&split)) {
        println!(
            "wgpu's allocator beneath: {w} bytes for one buffer, {s} for the segments ({:.4}x)",
            s as f64 / w as f64
        );
    }
    whole.deallocate(pw, 0)?;
    split.deallocate(ps, 0)?;
    Ok(())
}
