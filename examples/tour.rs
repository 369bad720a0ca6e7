//! The tour: registers every allocator this machine can offer, prints a table of devices,
//! round-trips data through each one and reports the result, then runs a small model's
//! repeating workload (steady state) and a growing KV cache (memory given back) on each.
//!
//!     cargo run --example tour [-- --snapshot FILE]
//!
//! With `--snapshot FILE` every allocator records its history while the tour runs, and the
//! tour writes a snapshot of every device (JSON; open it in the demo page's memory viewer:
//! `index.html?snapshot=FILE` under `scripts/serve-web`, or drop the file on the page).
//! Set RUST_LOG=debug for what happens underneath.
#[path = "support/logging.rs"]
mod logging;
use std::time::Instant;

use devalloc::{
    DeviceAllocator, DeviceAllocatorRegistry, DeviceIndex, DeviceMemoryBuffer, DevicePtr, DEFAULT_ALIGNMENT,
};

fn main() {
    let default = "warn";
    logging::init(default);
    let registry = DeviceAllocatorRegistry::instance();

    let args: Vec<String> = std::env::args().collect();
    let snapshot = args.iter().position(|a| a == "--snapshot").map(|i| {
        args.get(i + 1).cloned().unwrap_or_else(|| {
            eprintln!("--snapshot needs a file name");
            std::process::exit(2)
        })
    });
    println!("devalloc tour: registering every allocator this machine offers\n");
    for line in devalloc::register_available(registry) {
        println!("  {line}");
    }
    if snapshot.is_some() {
        for alloc in registry.allocators() {
            if let Err(e) = alloc.record_history(10_000) {
                println!("  {}: no history: {e}", alloc.device_type());
            }
        }
    }

    if cfg!(debug_assertions) {
        println!(
            "\nGB/s below are from a debug build (devalloc and wgpu unoptimised), not devalloc's speed: \
             `cargo run --release --example tour` for release figures, the bench for comparisons."
        );
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
    println!();
    for alloc in registry.allocators() {
        for index in 0..alloc.device_count() as DeviceIndex {
            if let Err(e) = workload(alloc, index).and_then(|()| growing(alloc, index)) {
                println!("{}:{index}: the workload failed: {e}", alloc.device_type());
                failures += 1;
            }
        }
    }
    if let Some(path) = snapshot {
        let snap = registry.snapshot();
        let events: usize =
            snap.devices.iter().filter_map(|d| d.history.as_ref()).map(|h| h.events.len()).sum();
        match snap.write(&path) {
            Ok(()) => {
                println!("\nsnapshot of {} device(s), {events} events, written to {path}", snap.devices.len())
            }
            Err(e) => {
                eprintln!("writing the snapshot to {path}: {e}");
                std::process::exit(1);
            }
        }
    }
    if failures > 0 {
        eprintln!("\n{failures} failure(s): a round trip, a workload or the KV cache (above)");
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
    let mut buf = DeviceMemoryBuffer::create_on(alloc, n * 4, index, DEFAULT_ALIGNMENT)?;
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
    // A memory plan: two planned buffers, tensors at offsets.
    let plan = devalloc::PlannedMemory::new(alloc, &[1 << 20, 256 << 10], index)?;
    let tensor = plan.get_offset_address(0, 4096, 16)?;
    alloc.copy_host_to_device(tensor, &[42u8; 16], index)?;
    let mut t16 = [0u8; 16];
    alloc.copy_device_to_host(&mut t16, tensor, index)?;
    if t16 != [42u8; 16] {
        return Err(devalloc::Error::invalid_argument("planned pool round trip differs"));
    }
    Ok((n * 4, up, down))
}

/// What a small model does to memory, for the snapshot: weights that stay, a memory plan, and
/// six steps whose activations come and go layer by layer, under new labels each step. The
/// round trip's buffers are not the workload's: their cache is given back first. Prints, per
/// step, what is live and reserved and how many blocks were asked of the device, then the
/// steady state: reserved in the steps after the first over the workload's peak live, and one
/// `tour:` line of the same figures for `scripts/check-replay --readme` (the README's table).
/// Fails if any step after the first asks the device for a block: a workload that repeats
/// settles.
fn workload(alloc: &'static dyn DeviceAllocator, index: DeviceIndex) -> devalloc::Result<()> {
    let device = devalloc::Device::new(alloc.device_type(), index);
    alloc.empty_cache();
    let layers = 4;
    let start = alloc.stats(index)?;
    let weights: Vec<DevicePtr> = (0..layers)
        .map(|l| alloc.allocate_labeled((3 << 20) >> l, index, DEFAULT_ALIGNMENT, &format!("w.layer{l}")))
        .collect::<devalloc::Result<_>>()?;
    let plan = devalloc::PlannedMemory::new(alloc, &[512 << 10, 128 << 10], index)?;
    let (mut peak_live, mut steady_reserved) = (0u64, 0u64);
    let mut line = format!("{device}: workload, per step (live / reserved, device allocations):");
    let (mut lives, mut reserveds, mut allocs) = (Vec::new(), Vec::new(), Vec::new());
    for step in 0..6 {
        let input =
            alloc.allocate_labeled(256 << 10, index, DEFAULT_ALIGNMENT, &format!("input.step{step}"))?;
        alloc.copy_host_to_device(input, &[step as u8; 4096], index)?;
        let mut prev = input;
        let mut step_peak = 0;
        for l in 0..layers {
            let act = alloc.allocate_labeled(
                (1 << 20) >> l,
                index,
                DEFAULT_ALIGNMENT,
                &format!("act.layer{l}.step{step}"),
            )?;
            alloc.copy_device_to_device(act, index, prev, index, 4096)?;
            let s = alloc.stats(index)?;
            step_peak = step_peak.max(s.allocated_bytes);
            peak_live = peak_live.max(s.allocated_bytes);
            if step > 0 {
                steady_reserved = steady_reserved.max(s.reserved_bytes);
            }
            alloc.deallocate(prev, index)?;
            prev = act;
        }
        let mut out = [0u8; 16];
        alloc.copy_device_to_host(&mut out, prev, index)?;
        alloc.deallocate(prev, index)?;
        let s = alloc.stats(index)?;
        let asked = s.cache_misses - start.cache_misses;
        line += &format!(" {}/{} {asked}", human(step_peak as usize), human(s.reserved_bytes as usize));
        lives.push(step_peak.to_string());
        reserveds.push(s.reserved_bytes.to_string());
        allocs.push(asked);
    }
    println!("{line}");
    if peak_live > 0 && steady_reserved > 0 {
        println!(
            "{device}: steady state: reserved {} over a peak live of {} = {:.2}x",
            human(steady_reserved as usize),
            human(peak_live as usize),
            steady_reserved as f64 / peak_live as f64
        );
    }
    let counts: Vec<String> = allocs.iter().map(u64::to_string).collect();
    println!(
        "tour: device={device} live={} reserved={} allocs={} steady_reserved={steady_reserved} peak_live={peak_live}",
        lives.join(","),
        reserveds.join(","),
        counts.join(",")
    );
    if allocs.iter().any(|&n| n != allocs[0]) {
        return Err(devalloc::Error::invalid_argument(format!(
            "{device}: the workload asked the device for blocks after its first step (total after each step: {})",
            counts.join(" ")
        )));
    }
    drop(plan);
    for w in weights {
        alloc.deallocate(w, index)?;
    }
    Ok(())
}

/// A decode loop's KV cache, growing a MiB a step from 1 to 16 MiB, each step's copied from
/// the last: with no limit set, the pool's budget gives back the sizes the loop stopped asking
/// for (the snapshot's timeline shows reserved falling there), where a cache that kept every
/// freed block would hold 120 MiB of them. Fails unless the pool held at most its budget (an
/// eighth over the most bytes live at once, a little more for rounding) all the way: more
/// would mean older sizes were kept.
fn growing(alloc: &'static dyn DeviceAllocator, index: DeviceIndex) -> devalloc::Result<()> {
    let device = devalloc::Device::new(alloc.device_type(), index);
    let mut kv = alloc.allocate_labeled(1 << 20, index, DEFAULT_ALIGNMENT, "kv.step0")?;
    let mut peak_reserved = 0;
    for step in 1..16 {
        let next =
            alloc.allocate_labeled((step + 1) << 20, index, DEFAULT_ALIGNMENT, &format!("kv.step{step}"))?;
        alloc.copy_device_to_device(next, index, kv, index, 4096)?;
        alloc.deallocate(kv, index)?;
        kv = next;
        peak_reserved = peak_reserved.max(alloc.stats(index)?.reserved_bytes);
    }
    let s = alloc.stats(index)?;
    alloc.deallocate(kv, index)?;
    // The budget: the live high-water mark (here the loop's last two sizes, 31 MiB) plus an
    // eighth; 1% more for the backends' rounding of each block.
    let budget = s.peak_allocated_bytes as f64 * 1.125 * 1.01;
    let held = format!(
        "{device}: a KV cache growing to 16 MiB: at most {} reserved, {} at the end ({} cached), {:.3}x the most live at once ({})",
        human(peak_reserved as usize),
        human(s.reserved_bytes as usize),
        human(s.cached_bytes as usize),
        peak_reserved as f64 / s.peak_allocated_bytes.max(1) as f64,
        human(s.peak_allocated_bytes as usize)
    );
    if peak_reserved as f64 > budget {
        return Err(devalloc::Error::invalid_argument(format!(
            "{held}: over the budget (1.125x): older sizes were kept"
        )));
    }
    println!("{held}: within the budget (1.125x), so the older sizes were given back");
    Ok(())
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}
