//! Every native test of devalloc, in one binary (the conformance suite, `conformance`, compiles
//! once): the suite and the hostile model check on host memory (`host`), the contract's edges (`contract`),
//! the planner (`plan`, `plan_search`, `plan_segments`), its CSV reader and replay under hostile input (`inputs`), the pool's
//! policy (`pool_policy`), its cache budget (`pool_budget`; hostile: `pool_budget_hostile`) and split blocks (`pool_split`; hostile: `split_hostile`, `split_real`), the registry (`registry`), wgpu on lavapipe and llvmpipe (`wgpu`), a
//! wgpu app that adopts devalloc (`wgpu_app`) and loses its device (`wgpu_app_loss`; mid-stream: `stream_loss`), streamed copies under hostile readers
//! (`hostile_in_place`, on wgpu's in-place route `hostile_in_place_gpu`, progress and totals `hostile_stream_progress`), an app's hostile ways with it (panicking map
//! callbacks, async copies dropped mid-map: `wgpu_hostile`), wgpu copies under hostile use
//! (bounded work per async poll, drops at any poll, destroy mid-copy: `wgpu_copies`), what wgpu
//! holds beneath the pool (bindings after churn, memory hints: `wgpu_memory`), allocations past
//! one buffer (the suite on segmented memory, the seams' hostile cases: `wgpu_segmented`; what a
//! hostile review found: `wgpu_segments_found`), and CUDA
//! where a driver is (`cuda`, feature `cuda`). `util` holds the hostile tests' small helpers;
//! `fuzz_found` keeps each input the fuzzers found as a test.
//!
//!     cargo test --test native [-- host::]      # a module's tests alone: filter by its name
#![cfg(not(target_arch = "wasm32"))]

#[macro_use]
#[path = "../conformance/mod.rs"]
mod conformance;

mod contract;
#[cfg(feature = "cuda")]
mod cuda;
mod fuzz_found;
mod host;
mod hostile_in_place;
#[cfg(feature = "wgpu")]
mod hostile_in_place_gpu;
mod hostile_stream_progress;
mod inputs;
mod plan;
mod plan_search;
mod plan_segments;
mod pool_budget;
mod pool_budget_hostile;
mod pool_policy;
mod pool_split;
mod registry;
mod split_hostile;
mod split_real;
#[cfg(feature = "wgpu")]
mod stream_loss;
mod util;
#[cfg(feature = "wgpu")]
mod wgpu;
#[cfg(feature = "wgpu")]
mod wgpu_app;
#[cfg(feature = "wgpu")]
mod wgpu_app_loss;
#[cfg(feature = "wgpu")]
mod wgpu_copies;
#[cfg(feature = "wgpu")]
mod wgpu_hostile;
#[cfg(feature = "wgpu")]
mod wgpu_memory;
#[cfg(feature = "wgpu")]
mod wgpu_segmented;
#[cfg(feature = "wgpu")]
mod wgpu_segments_found;
