//! devalloc's transfers against the best thing a careful user would otherwise write, in one
//! run, interleaved round by round, every result verified; prints devalloc / best peer.
//!
//! wgpu (every backend this machine has), per size (4 KiB .. 256 MiB where it fits):
//! - upload, until the data are on the device: `queue.write_buffer` + submit + wait, a
//!   `wgpu::util::StagingBelt` kept across calls, devalloc's staged route;
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
//!     cargo run --release --example bench [--features cuda] [-- --quick] [-- vulkan|gl|cuda ...]
mod common;
#[cfg(feature = "cuda")]
mod cuda;
mod first_poll;
mod history;
#[path = "../support/logging.rs"]
mod logging;
mod peers;
mod wgpu_calls;
mod wgpu_routes;

#[cfg(feature = "cuda")]
fn run_cuda(_quick: bool) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    cuda::run(&cuda::Asked::from_args(&args));
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(_quick: bool) {
    println!("\n## cuda: not built (run with --features cuda)");
}

fn main() {
    let default = "warn";
    logging::init(default);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let only: Vec<&str> = args.iter().filter(|a| !a.starts_with("--")).map(String::as_str).collect();
    println!(
        "# devalloc bench{} (medians; GB/s; devalloc/best peer > 1 means devalloc is faster)",
        if quick { " (quick)" } else { "" }
    );
    for (name, backend) in wgpu_routes::BACKENDS {
        if only.is_empty() || only.contains(&name) {
            wgpu_routes::run(name, backend, quick);
        }
    }
    if only.is_empty() || only.contains(&"host") {
        let host = devalloc::HostAllocator::new();
        first_poll::run("host", &host, 1 << 30, quick);
    }
    if only.is_empty() || only.contains(&"history") {
        history::run(quick);
    }
    if only.is_empty() || only.contains(&"cuda") {
        run_cuda(quick);
    }
}
