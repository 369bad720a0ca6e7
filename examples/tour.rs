//! The tour: registers every allocator this machine can offer, prints a table of devices,
//! round-trips data through each one and reports the result.
//!
//!     cargo run --example tour
//!
//! Set RUST_LOG=debug for what happens underneath.
use std::time::Instant;

use devalloc::{
    DeviceAllocator, DeviceAllocatorRegistry, DeviceIndex, DeviceMemoryBuffer, DEFAULT_ALIGNMENT,
};

fn main() {
    // wgpu's EGL probe logs an error on machines where one of Mesa's drivers is missing even
    // when GL then works; RUST_LOG overrides this default.
    let default = "warn,wgpu_hal::gles::egl=off";
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default)).init();
    let registry = DeviceAllocatorRegistry::instance();

    println!("devalloc tour: registering every allocator this machine offers\n");
    for line in devalloc::register_available(registry) {
        println!("  {line}");
    }

    println!(
        "\n{:<10} {:<44} {:>10} {:>10} {:>10}  result",
        "device", "name", "size", "up GB/s", "down GB/s"
    );
    let mut failures = 0;
    for alloc in registry.allocators() {
        for index in 0..alloc.device_count() as DeviceIndex {
            let device = devalloc::Device::new(alloc.device_type(), index);
            let name = alloc.device_name(index);
            match round_trip(alloc, index) {
                Ok((size, up, down)) => {
                    println!(
                        "{:<10} {:<44} {:>10} {:>10.2} {:>10.2}  ok",
                        device.to_string(),
                        name,
                        human(size),
                        up,
                        down
                    )
                }
                Err(e) => {
                    failures += 1;
                    println!(
                        "{:<10} {:<44} {:>10} {:>10} {:>10}  FAILED: {e}",
                        device.to_string(),
                        name,
                        "-",
                        "-",
                        "-"
                    );
                }
            }
        }
    }
    println!();
    for alloc in registry.allocators() {
        for index in 0..alloc.device_count() as DeviceIndex {
            if let Ok(s) = alloc.stats(index) {
                println!(
                    "{}:{index}: {} allocations, {} frees, peak {} allocated / {} reserved, now {} live",
                    alloc.device_type(),
                    s.allocations,
                    s.deallocations,
                    human(s.peak_allocated_bytes as usize),
                    human(s.peak_reserved_bytes as usize),
                    s.live_allocations
                );
            }
        }
    }
    if failures > 0 {
        eprintln!("\n{failures} device(s) failed the round trip");
        std::process::exit(1);
    }
    println!("\nevery device round-tripped its data");
}

/// Writes 16 MiB of f32s, reads them back, checks them; also a planned pool and a ragged
/// sub-range. Returns (bytes, upload GB/s, download GB/s).
fn round_trip(
    alloc: &'static dyn DeviceAllocator,
    index: DeviceIndex,
) -> devalloc::Result<(usize, f64, f64)> {
    let n = 4 << 20;
    let values: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 7.0).collect();
    let mut buf = DeviceMemoryBuffer::create_with(alloc, n * 4, index, DEFAULT_ALIGNMENT)?;
    let t = Instant::now();
    buf.write_pod(&values)?;
    let up = (n * 4) as f64 / t.elapsed().as_secs_f64() / 1e9;
    let t = Instant::now();
    let back = buf.to_vec::<f32>()?;
    let down = (n * 4) as f64 / t.elapsed().as_secs_f64() / 1e9;
    if back != values {
        return Err(devalloc::Error::invalid_argument("the data read back differ from the data written"));
    }
    // A ragged sub-range through an offset pointer.
    buf.write_at(4 * 1001 + 3, b"devalloc")?;
    let mut word = [0u8; 8];
    buf.read_at(4 * 1001 + 3, &mut word)?;
    if &word != b"devalloc" {
        return Err(devalloc::Error::invalid_argument("ragged sub-range round trip differs"));
    }
    // A memory-planned pool.
    let plan = devalloc::PlannedMemory::new(alloc, index, &[1 << 20])?;
    let tensor = plan.get_offset_address(0, 4096, 16)?;
    alloc.copy_host_to_device(tensor, &[42u8; 16], index)?;
    let mut t16 = [0u8; 16];
    alloc.copy_device_to_host(&mut t16, tensor, index)?;
    if t16 != [42u8; 16] {
        return Err(devalloc::Error::invalid_argument("planned pool round trip differs"));
    }
    Ok((n * 4, up, down))
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}
