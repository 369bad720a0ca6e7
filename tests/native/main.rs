//! Every native test of devalloc, in one binary (the conformance suite compiles once): the
//! suite and the hostile model check on host memory (`host`), the contract's edges (`contract`),
//! the planner (`plan`), the pool's policy (`pool_policy`), the registry (`registry`), wgpu on lavapipe and llvmpipe (`wgpu`), a wgpu app that adopts
//! devalloc (`wgpu_app`), and CUDA where a driver is (`cuda`, feature `cuda`).
//!
//!     cargo test --test native [-- host::]      # a module's tests alone: filter by its name
#![cfg(not(target_arch = "wasm32"))]

#[macro_use]
#[path = "../conformance/mod.rs"]
mod conformance;

mod contract;
#[cfg(feature = "cuda")]
mod cuda;
mod host;
mod plan;
mod pool_policy;
mod registry;
#[cfg(feature = "wgpu")]
mod wgpu;
#[cfg(feature = "wgpu")]
mod wgpu_app;
