//! "Would it fit?": replays an allocation history through a real allocator and says what it
//! held, how often it asked the device, when it stopped asking, and (with `--find-limit`) the
//! smallest memory limit under which all of it fits, each beside the lower bound (the most bytes
//! live at once) and beside what PyTorch's CUDA caching allocator would do with the same
//! history (`devalloc::replay::pytorch_replay`, a model of its default policy) and what
//! CubeCL's memory management holds (the real one, pinned, as cubecl-wgpu configures it, over a
//! storage that only counts bytes: `support/cubecl_peer.rs` says what is modelled).
//!
//!     cargo run --release --example replay -- FILE... [--backend host|vulkan|gl|wgpu-policy] [--limit BYTES] [--find-limit] [--repeat N]
//!
//! `--backend wgpu-policy`: wgpu's policy (blocks never split) over a storage that only counts
//! (`support/counting.rs`): devalloc's figures are what Vulkan's would be, in milliseconds and
//! without a GPU; the backend's own blocks beneath are not modelled.
//!
//! FILE: a devalloc snapshot with history (`cargo run --example tour -- --snapshot FILE`, or
//! the page's), one replay per device; or a MiniMalloc CSV (`id,lower,upper,size`: each buffer
//! allocated at `lower`, freed at `upper`, in step order). Each replay ends with one line
//! scripts can read (`backend_reserved`: the most the backend's own allocator report said it
//! held, where it keeps one: wgpu on Vulkan and DX12):
//!
//!     replay: file=NAME backend=B lower_bound=N peak_live=N peak_reserved=N device_allocs=N steady_after=STEP
//!             largest_request=N cubecl_largest_page=N [backend_reserved=N] unshared_bound=N [min_limit=N ratio=X]
//!             pytorch_peak_reserved=N cubecl_peak_reserved=N|cubecl_refused=1 [pytorch_min_limit=N pytorch_ratio=X]
//!             [repeat=N allocs_per_repeat=A,B,...]
//!
//! CubeCL refuses a request larger than its largest page (`cubecl_refused=1`, and
//! `largest_request` > `cubecl_largest_page` says why); any other refusal fails the replay.
//!
//! `--repeat N` replays each history N times in a row (a training or serving loop), everyone's
//! figures over all of it, and counts the device allocations of each repetition: a workload
//! that repeats should settle, with none in its last repetitions.
#[path = "support/counting.rs"]
mod counting;
#[path = "support/cubecl_peer.rs"]
mod cubecl_peer;
#[path = "support/logging.rs"]
mod logging;

use std::process::ExitCode;

use devalloc::plan::Instance;
use devalloc::replay::{find_min_limit, pytorch_min_limit, pytorch_replay, replay, Trace, TraceEvent};
use devalloc::snapshot::Snapshot;
use devalloc::wgpu::{WgpuAllocator, WgpuOptions};
use devalloc::{HostAllocator, PoolOptions};

struct Args {
    files: Vec<String>,
    backend: String,
    limit: Option<u64>,
    find_limit: bool,
    repeat: u64,
}

fn parse() -> Result<Args, String> {
    let mut args =
        Args { files: Vec::new(), backend: "host".into(), limit: None, find_limit: false, repeat: 1 };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--backend" => {
                args.backend = it.next().ok_or("--backend needs host, vulkan, gl or wgpu-policy")?
            }
            "--limit" => {
                let v = it.next().ok_or("--limit needs a number of bytes")?;
                args.limit = Some(v.parse().map_err(|_| format!("--limit: not a number of bytes: {v}"))?);
            }
            "--find-limit" => args.find_limit = true,
            "--repeat" => {
                let v = it.next().ok_or("--repeat needs a count")?;
                args.repeat =
                    v.parse().ok().filter(|&n| n > 0).ok_or(format!("--repeat: not a count: {v}"))?;
            }
            f if !f.starts_with("--") => args.files.push(f.to_string()),
            other => return Err(format!("unknown option {other}")),
        }
    }
    if args.files.is_empty() {
        return Err("name a snapshot (JSON) or a MiniMalloc CSV".into());
    }
    if !["host", "vulkan", "gl", "wgpu-policy"].contains(&args.backend.as_str()) {
        return Err(format!("--backend: host, vulkan, gl or wgpu-policy, not {}", args.backend));
    }
    Ok(args)
}

/// The traces in `path`: one per device with history (a snapshot), or one (a CSV).
fn traces(path: &str) -> Result<Vec<(String, Trace)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let name =
        std::path::Path::new(path).file_name().map_or(path.into(), |n| n.to_string_lossy().into_owned());
    if path.ends_with(".csv") {
        let inst = Instance::from_csv(&name, &text).map_err(|e| e.to_string())?;
        return Ok(vec![(name, Trace::from_tensors(&inst.tensors, None))]);
    }
    let snap = Snapshot::from_json(&text).map_err(|e| format!("{path}: {e}"))?;
    let found: Vec<_> = snap
        .devices
        .iter()
        .filter_map(|d| d.history.as_ref().map(|h| (format!("{name}#{}", d.device), Trace::from_history(h))))
        .collect();
    if found.is_empty() {
        return Err(format!("{path}: no device in the snapshot has a history (record with record_history)"));
    }
    Ok(found)
}

fn run<T: devalloc::backend::Pooled>(
    name: &str,
    trace: &Trace,
    args: &Args,
    make: impl Fn() -> devalloc::Result<T>,
) -> devalloc::Result<()> {
    let once = trace;
    let repeated =
        |n: u64| once.repeated(n).ok_or_else(|| devalloc::Error::invalid_argument("too many repetitions"));
    let all = repeated(args.repeat)?;
    let trace = &all;
    let lb = trace.lower_bound();
    let fresh = || -> devalloc::Result<T> {
        let a = make()?;
        a.pooled().set_memory_limit(args.limit, 0)?;
        Ok(a)
    };
    let a = fresh()?;
    let r = replay(&a, trace, 0)?;
    let ratio = |v: u64| if lb == 0 { 0.0 } else { v as f64 / lb as f64 };
    let times = if args.repeat > 1 { format!(", {} times in a row", args.repeat) } else { String::new() };
    println!("\n{name} on {}{times} ({} events, lower bound {lb} bytes)", args.backend, trace.events.len());
    if trace.orphan_frees > 0 {
        println!("  {} frees of allocations older than the history were left out", trace.orphan_frees);
    }
    if let Some(limit) = args.limit {
        match &r.failure {
            None => println!("  under a limit of {limit} bytes: replays whole"),
            Some(f) => println!(
                "  under a limit of {limit} bytes: fails first at step {} (event {}): {}",
                f.step, f.event, f.error
            ),
        }
    }
    println!("  peak live      {:>12}  {:.3}x", r.peak_live, ratio(r.peak_live));
    // What settling costs where no block is shared (wgpu): any such allocator, at least (a floor).
    let unshared = trace.unshared_bound();
    println!("  settling with no block shared needs at least {unshared} ({:.3}x)", ratio(unshared));
    println!("  peak reserved  {:>12}  {:.3}x (devalloc's)", r.peak_reserved, ratio(r.peak_reserved));
    if let Some(b) = r.backend_peak_reserved {
        println!("  backend        {:>12}  {:.3}x (the backend's own report)", b, ratio(b));
    }
    let torch = pytorch_replay(trace, args.limit)?;
    println!(
        "  PyTorch's policy: peak reserved {} ({:.3}x), {} segment(s) asked for{}",
        torch.peak_reserved,
        ratio(torch.peak_reserved),
        torch.segments,
        match (args.limit, torch.failed_at) {
            (Some(_), Some(step)) => format!("; under the limit it fails first at step {step}"),
            (Some(_), None) => "; under the limit it replays whole".into(),
            (None, Some(step)) => format!("; it fails at step {step} even without a limit"),
            (None, None) => String::new(),
        }
    );
    // CubeCL's pool takes no limit: it is replayed as it runs by default.
    // A request past CubeCL's largest page (128 MiB under WebGPU's default limits) is one it
    // refuses: a finding about the peer, not an error of this replay. Any other refusal is an
    // error (the model is wrong), and fails the replay.
    let cubecl = match cubecl_peer::cubecl_replay(trace) {
        Ok(c) => {
            println!(
                "  CubeCL's pool: peak reserved {} ({:.3}x), {} storage allocation(s)",
                c.peak_reserved,
                ratio(c.peak_reserved),
                c.allocations
            );
            Some(c)
        }
        Err(e @ cubecl_peer::CubeclError::Refused { .. }) => {
            println!("  CubeCL's pool refuses this history: {e}");
            None
        }
        Err(e) => return Err(devalloc::Error::invalid_argument(e.to_string())),
    };
    let largest = trace
        .events
        .iter()
        .filter_map(|(_, e)| match e {
            TraceEvent::Alloc { size, .. } => Some(*size),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let steady = r.steady_after.map_or("none".to_string(), |s| s.to_string());
    println!(
        "  device allocations {}, cache hits {}, no device allocation after step {steady}",
        r.device_allocations, r.cache_hits
    );
    let mut line = format!(
        "replay: file={name} backend={} lower_bound={lb} peak_live={} peak_reserved={} device_allocs={} steady_after={steady} largest_request={largest} cubecl_largest_page={}",
        args.backend, r.peak_live, r.peak_reserved, r.device_allocations, cubecl_peer::largest_page()
    );
    if let Some(b) = r.backend_peak_reserved {
        line += &format!(" backend_reserved={b}");
    }
    line += &format!(" unshared_bound={unshared}");
    if args.find_limit {
        match find_min_limit(&make, trace, 0)? {
            Some(min) => {
                println!("  smallest limit {:>12}  {:.3}x", min, ratio(min));
                line += &format!(" min_limit={min} ratio={:.3}", ratio(min));
            }
            None => println!("  no limit: the replay fails even without one"),
        }
    }
    line += &format!(" pytorch_peak_reserved={}", torch.peak_reserved);
    match &cubecl {
        Some(c) => line += &format!(" cubecl_peak_reserved={}", c.peak_reserved),
        None => line += " cubecl_refused=1",
    }
    if args.find_limit {
        // The peer failing (a request of 1 EiB or more, which PyTorch refuses) is a finding
        // about the peer, not an error of this replay.
        match pytorch_min_limit(trace) {
            Ok(min) => {
                println!("  PyTorch's policy: smallest limit {min} ({:.3}x)", ratio(min));
                line += &format!(" pytorch_min_limit={min} pytorch_ratio={:.3}", ratio(min));
            }
            Err(e) => println!("  PyTorch's policy: no limit: {e}"),
        }
    }
    if args.repeat > 1 {
        // The allocator is deterministic: replaying the first k repetitions counts what the
        // first k of the whole run asked the device for.
        let mut before = 0;
        let mut per = Vec::new();
        for k in 1..=args.repeat {
            let total = if k == args.repeat {
                r.device_allocations
            } else {
                replay(&fresh()?, &repeated(k)?, 0)?.device_allocations
            };
            per.push((total - before).to_string());
            before = total;
        }
        println!("  device allocations in each repetition: {}", per.join(", "));
        line += &format!(" repeat={} allocs_per_repeat={}", args.repeat, per.join(","));
    }
    println!("{line}");
    Ok(())
}

fn main() -> ExitCode {
    logging::init("warn");
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("replay: {e}");
            return ExitCode::from(2);
        }
    };
    let mut failed = false;
    for path in &args.files {
        let found = match traces(path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("replay: {e}");
                failed = true;
                continue;
            }
        };
        for (name, trace) in found {
            let cached = PoolOptions { caching: true, ..PoolOptions::default() };
            let done = match args.backend.as_str() {
                "host" => run(&name, &trace, &args, || HostAllocator::with_options(cached.clone())),
                "wgpu-policy" => {
                    run(&name, &trace, &args, || counting::allocator(WgpuOptions::default().pool))
                }
                b => {
                    let backend = if b == "gl" { wgpu::Backend::Gl } else { wgpu::Backend::Vulkan };
                    run(&name, &trace, &args, || WgpuAllocator::with_options(backend, WgpuOptions::default()))
                }
            };
            if let Err(e) = done {
                eprintln!("replay: {name}: {e}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
