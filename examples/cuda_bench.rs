//! The CUDA benchmark alone, without wgpu: what the GPU bundle carries to a machine with an
//! NVIDIA GPU (see `examples/bench/cuda.rs`).
//!
//!     cargo run --release --no-default-features --features cuda --example cuda_bench [-- --quick]
//!     ... -- --probe | --pages | --sweep [--budget-s 40]     (each alone: its own step in the bundle)
#[path = "bench/common.rs"]
mod common;
#[path = "bench/cuda.rs"]
mod cuda;
#[path = "support/logging.rs"]
mod logging;

fn main() {
    logging::init("warn");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let asked = cuda::Asked::from_args(&args);
    println!("# devalloc CUDA bench{} (medians; GB/s)", if asked.quick { " (quick)" } else { "" });
    cuda::run(&asked);
}
