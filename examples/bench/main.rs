//! devalloc's transfers against the best thing a careful user would otherwise write, in one
//! run, interleaved round by round, every result verified; prints devalloc / best peer.
//!
//! wgpu (every backend this machine has), per size (4 KiB .. 256 MiB where it fits):
//! - upload, until the data are on the device: `queue.write_buffer` + submit + wait, a
//!   `wgpu::util::StagingBelt` kept across calls (the transfer in one piece, and in 4 MiB
//!   pieces), devalloc's staged route;
//! - download, into host memory: a fresh `MAP_READ` buffer, one reused `MAP_READ` buffer,
//!   `wgpu::util::DownloadBuffer`, devalloc's staged route;
//! - on adapters with unified memory and `MAPPABLE_PRIMARY_BUFFERS`: a hand-written map of a
//!   mappable storage buffer against devalloc's direct route, and the per-call overhead;
//! - `memcpy` as the ceiling; the first (cold) call of every method beside the medians;
//! - async copies: the first poll's time (bounded work per poll), the whole copy, the polls;
//! - 4-byte download latency; the alloc cycle bare and with first use; what devalloc's checks
//!   cost per call (pointer lookup, lost-device poll, error scopes); staging memory held.
//!
//! CUDA (feature `cuda`, where a device is present): devalloc against cudarc's pageable and
//! pinned copies and cuMemAlloc/cuMemFree.
//!
//!     cargo run --release --example bench [--features cuda] [-- --quick] [-- --check [--margin M] [--goals KINDS]] [-- vulkan|gl|cuda ...]
//!
//! `--quick`: the short form (4 KiB .. 16 MiB, a few repetitions; every copy still verified).
//! `--check`: holds the README's goals (`goals.rs`: ratios against the peers, a noise margin of
//! `--margin M`, 0.05 unless given; `--goals KINDS` holds only those kinds, printing the rest)
//! and exits 1 if one is missed, or if none was held.
//! A wrong byte in any copy, timed or not, panics (exit 101) in every mode.
mod common;
#[cfg(feature = "cuda")]
mod cuda;
mod first_poll;
mod goals;
mod history;
#[path = "../support/logging.rs"]
mod logging;
mod peers;
mod wgpu_calls;
mod wgpu_routes;

use std::process::ExitCode;

#[cfg(feature = "cuda")]
fn run_cuda(args: &[String]) {
    cuda::run(&cuda::Asked::from_args(args));
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(_args: &[String]) {
    println!("\n## cuda: not built (run with --features cuda)");
}

/// The command line: flags, the noise margin, and the parts asked for (none: all).
struct Args {
    quick: bool,
    check: Option<f64>,
    kinds: Vec<String>,
    only: Vec<String>,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let (mut quick, mut check, mut margin, mut only) = (false, false, 0.05, Vec::new());
    let mut kinds: Vec<String> = goals::KINDS.iter().map(|k| k.to_string()).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--check" => check = true,
            "--margin" => {
                let v = it.next().ok_or("--margin needs a ratio (e.g. 0.05)")?;
                margin = v
                    .parse()
                    .ok()
                    .filter(|m: &f64| (0.0..1.0).contains(m))
                    .ok_or(format!("--margin: {v}"))?;
            }
            "--goals" => {
                let v = it.next().ok_or("--goals needs kinds, e.g. alloc or upload,download")?;
                kinds = v.split(',').map(str::to_string).collect();
                if let Some(k) = kinds.iter().find(|k| !goals::KINDS.contains(&k.as_str())) {
                    return Err(format!("--goals: {k} is none of {}", goals::KINDS.join(", ")));
                }
            }
            // The CUDA part's own (cuda.rs reads them): skip a value where one follows.
            "--budget-s" => drop(it.next()),
            f if f.starts_with("--") => {}
            name => only.push(name.to_string()),
        }
    }
    Ok(Args { quick, check: check.then_some(margin), kinds, only })
}

fn main() -> ExitCode {
    let default = "warn";
    logging::init(default);
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse(&raw) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::from(2);
        }
    };
    let quick = args.quick;
    let asked = |name: &str| args.only.is_empty() || args.only.iter().any(|o| o == name);
    println!(
        "# devalloc bench{}{} (medians; GB/s; devalloc/best peer > 1 means devalloc is faster)",
        if quick { " (quick)" } else { "" },
        if args.check.is_some() { " (check)" } else { "" }
    );
    if cfg!(debug_assertions) {
        println!("# a debug build (wgpu unoptimised): ratios differ from a release build's, the README's");
    }
    if let Some(margin) = args.check {
        goals::enable(margin, args.kinds.clone());
    }
    for (name, backend) in wgpu_routes::BACKENDS {
        if asked(name) {
            wgpu_routes::run(name, backend, quick);
        }
    }
    if asked("host") {
        let host = devalloc::HostAllocator::new();
        first_poll::run("host", &host, 1 << 30, quick);
    }
    if asked("history") {
        history::run(quick);
    }
    if asked("cuda") {
        run_cuda(&raw);
    }
    if goals::report() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
