//! A wgpu app that adopts devalloc: its own instance, adapter, device and queue (and its own
//! error handler), handed to `WgpuAllocator::from_device_with_options`; a 3-layer network in
//! WGSL whose weights live in devalloc allocations and whose activations live at offsets of one
//! planned buffer that the planner laid out (activations that are never live at once share
//! bytes), beside the app's own uniform buffers in the same bind groups; checked against the CPU.
//!
//!     cargo run --example mlp [vulkan|gl|metal|dx12]
//!
//! The network itself is `examples/support/network.rs`, which the browser demo runs too.
#[path = "support/logging.rs"]
mod logging;
#[path = "support/network.rs"]
mod network;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use devalloc::wgpu::{WgpuAllocator, WgpuOptions};
use devalloc::DeviceAllocator;

const BATCH: usize = 16;
const WIDTHS: [usize; 4] = [64, 128, 128, 10];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    logging::init("warn");
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
    let alloc = WgpuAllocator::from_device_with_options(device, queue, options)?;
    println!("mlp on {}", alloc.device_name(0));

    let report = pollster::block_on(network::run(&alloc, &WIDTHS, BATCH))?;
    let widths = WIDTHS.map(|w| w.to_string()).join(" -> ");
    println!("{BATCH}x{widths} (relu between layers): max |gpu - cpu| = {:e}", report.worst);
    let plan = &report.plan;
    println!(
        "activations planned: {} bytes ({} one after another; the most live at once: {}), offsets {:?}",
        plan.size(),
        report.unplanned,
        plan.lower_bound(),
        plan.offsets()
    );
    if app_errors.load(Ordering::SeqCst) > 0 {
        return Err("the app's error handler saw errors".into());
    }
    if report.worst > 1e-3 {
        return Err(format!("GPU result differs from the CPU by {}", report.worst).into());
    }
    if plan.size() >= report.unplanned {
        return Err("the plan reused no memory".into());
    }
    if alloc.stats(0)?.live_allocations != 0 {
        return Err("the network left allocations behind".into());
    }
    println!("the network's output matches the CPU");
    Ok(())
}
