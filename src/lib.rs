//! # devalloc
//!
//! One way for ML and GPU runtimes to own device memory on any machine: the
//! [`DeviceAllocator`] contract, a [`DeviceAllocatorRegistry`] from [`DeviceType`] to allocator,
//! RAII [`DeviceMemoryBuffer`]s, memory plans ([`PlannedMemory`]) and real allocators behind
//! the contract. It is the Rust counterpart of ExecuTorch's `DeviceAllocator` /
//! `DeviceAllocatorRegistry`, widened from CUDA to every GPU API wgpu reaches.
//!
//! | allocator | device types | feature |
//! |---|---|---|
//! | [`HostAllocator`] | `cpu` | always |
//! | [`wgpu::WgpuAllocator`] | `vulkan`, `metal`, `dx12`, `gl`, `webgpu` | `vulkan`, `metal`, `dx12`, `gles`, `webgpu` (default), `webgl` |
//! | `cuda::CudaAllocator` | `cuda` | `cuda` (native; the driver is loaded at run time; never yet run on a GPU) |
//!
//! devalloc speaks wgpu 30 (re-exported as `devalloc::wgpu::api`); an app that uses wgpu
//! itself depends on the same major version. `default-features = false, features = ["vulkan"]`
//! builds wgpu for Vulkan alone.
//!
//! ## Quick start
//!
//! ```
//! use devalloc::{get_device_allocator, register_device_allocator, DeviceAllocator, DeviceMemoryBuffer,
//!                DeviceType, HostAllocator, DEFAULT_ALIGNMENT};
//!
//! // Register an allocator once per device type (allocators live for the whole program).
//! let host: &'static HostAllocator = Box::leak(Box::new(HostAllocator::new()));
//! register_device_allocator(host)?;
//!
//! // Raw use, as a runtime would: allocate, copy in, copy out, free.
//! let cpu = get_device_allocator(DeviceType::Cpu).expect("registered above");
//! let ptr = cpu.allocate(1024, 0, DEFAULT_ALIGNMENT)?;
//! cpu.copy_host_to_device(ptr.offset(16)?, b"hello", 0)?;
//! let mut back = [0u8; 5];
//! cpu.copy_device_to_host(&mut back, ptr.offset(16)?, 0)?;
//! assert_eq!(&back, b"hello");
//! cpu.deallocate(ptr, 0)?;
//! assert!(cpu.deallocate(ptr, 0).is_err()); // a double free is an error, not a crash
//!
//! // Or let a buffer own the memory and free it on drop.
//! let mut buf = DeviceMemoryBuffer::create(4 * 3, DeviceType::Cpu, 0)?;
//! buf.write_pod(&[1u32, 2, 3])?;
//! assert_eq!(buf.to_vec::<u32>()?, [1, 2, 3]);
//! # Ok::<(), devalloc::Error>(())
//! ```
//!
//! ## Rules every allocator keeps
//!
//! - A zero-size allocation is an [`Error::InvalidArgument`] (on every backend); alignment is a
//!   non-zero power of two and the address is a multiple of it.
//! - A copy of 0 bytes succeeds without looking at the pointer.
//! - Copies are bounds-checked against the allocation the pointer lies in and happen whole or
//!   not at all; copies that move in chunks check both ends before the first chunk (a device
//!   failing half-way through a chunked copy can leave the chunks before it written).
//! - Every failure is an [`Error`], never a panic, and a failed call changes nothing: not the
//!   data, not the stats (one exception: an allocation that fails on the device may first have
//!   given cached blocks back to it, to make room, as PyTorch's does). Impossible requests are
//!   [`Error::TooLarge`] or [`Error::InvalidArgument`]; [`Error::OutOfMemory`] means "not now"
//!   and says what is held. In the browser, WebGPU says it could not make a buffer only later,
//!   asynchronously: [`DeviceAllocator::allocate_async`] (and `DeviceMemoryBuffer::
//!   create_on_async`, `from_pod_on_async`, the JS class's `allocateAsync`) waits for that and
//!   is `OutOfMemory` as on native, after giving the cache back and trying once more. `allocate`
//!   cannot wait: an allocation the browser then refuses stops counting in the stats, and every
//!   later use of it (copies, `buffer`, bindings, `deallocate`) is `OutOfMemory` naming it, with
//!   one warning in the console. Use the async form wherever memory may run out in a browser.
//! - Stale, interior and foreign pointers are refused: host and wgpu addresses are virtual and
//!   a freed range is not handed out again within 2^32 frees (unless the device's 4 PiB
//!   window has no other room), so a use after free is reported as such.
//! - Copies between devices of different types go through [`DeviceAllocatorRegistry::copy`],
//!   which bounces through a small host buffer in chunks.
//!
//! ## The public API
//!
//! The contract and the registry sit at the root; each backend and the snapshot format have a
//! namespace of their own (as `gpu_allocator::vulkan`), and what a backend author needs lives
//! in [`backend`].
//!
//! Inside, the crate is built in layers, each importing only from those below it: the words
//! (clock, locks, devices, addresses, errors), the formats and the planner, the contract,
//! storage, the pool's policy, the owning types and the registry, the backends, discovery, and
//! this root. `ARCHITECTURE.md` lists the files of each, and `scripts/check-layers` holds the
//! source to it.
//!
//! - **The contract**: [`DeviceAllocator`], [`AllocatorStats`], [`DEFAULT_ALIGNMENT`],
//!   [`BoxFuture`], [`WasmNotSendSync`]; devices and addresses: [`DeviceType`], [`Device`],
//!   [`DeviceIndex`], [`DevicePtr`]; errors: [`Error`], [`PointerProblem`], [`Result`],
//!   [`BackendSource`].
//! - **The registry**: [`DeviceAllocatorRegistry`], [`register_device_allocator`],
//!   [`get_device_allocator`], [`copy_across_devices`], [`register_available`] with its
//!   [`Registration`] / [`RegistrationOutcome`].
//! - **Owning memory**: [`DeviceMemoryBuffer`], [`PlannedMemory`] (from sizes, or from a
//!   planner's [`plan::MemoryPlan`], whose tensors it hands out as [`PlannedTensor`]s with labels), [`PlanLayout`] (tensors one after another, no reuse).
//! - **[`plan`]**: memory plans that reuse memory: `plan(tensors, alignment, Strategy::Fast |
//!   Strategy::Search { budget_ms })`, the validity `check`, `lower_bound`, the peers
//!   (`one_after_another`, `greedy_by_size`, `executorch_greedy`), `TensorLife`, `MemoryPlan`,
//!   and MiniMalloc's CSV format (`Instance`).
//! - **[`replay`]**: "would it fit?": a recorded history (or buffers with lifetimes) replayed
//!   through a real allocator (`Trace`, `TraceEvent`, `replay`, `find_min_limit`,
//!   `ReplayReport`, `ReplayFailure`), beside the peer, a model of PyTorch's caching allocator
//!   (`pytorch_replay`, `pytorch_min_limit`, `PyTorchReport`).
//! - **Host memory**: [`HostAllocator`], with the pool settings every built-in allocator shares,
//!   [`PoolOptions`].
//! - **[`wgpu`]** (a wgpu feature): `WgpuAllocator`, `WgpuOptions`, `Route`, `BufferRequest`,
//!   `BufferRange`, `BindingKind`, `DeviceLostHandler`, `register_backends`, and `api` (the
//!   wgpu crate devalloc speaks). Its module docs are the guide for wgpu apps.
//! - **`cuda`** (feature `cuda`, native): `CudaAllocator`, `CudaOptions`, `CopyTuning`,
//!   `loaded_library`, and `api` (cudarc).
//! - **[`snapshot`]**: where the memory went, as a versioned JSON document: `Snapshot`,
//!   `DeviceSnapshot`, `LiveAllocation`, `TensorNote`, `SegmentNote`, `CachedBlocks`,
//!   `PlannedBuffer`, `MemoryReport`, `HistorySnapshot`, `Event`, `EventKind`, `CopyCounts`,
//!   `Count`, `FORMAT`, `VERSION`.
//! - **[`backend`]**: writing a backend of your own: `Storage`, `Pool`, `PooledAllocator`,
//!   `Pooled` (which also reaches a built-in allocator's pools), `BlockRef`, the built-in
//!   storages.
//!
//! Conventions, the same in every namespace:
//!
//! - **Argument order**: what the call acts on (addresses, sizes, data), then the device
//!   index, then settings (alignment, label): `allocate(nbytes, index, alignment)`,
//!   `deallocate(ptr, index)`, `copy_host_to_device(dst, src, index)`,
//!   `WgpuAllocator::buffer(ptr, index)`, `allocate_request(&request, index)`,
//!   `set_memory_limit(limit, index)`. A copy between two devices names each end's index right
//!   after its address: `copy_device_to_device(dst, dst_index, src, src_index, nbytes)`.
//! - **`with_options`** is a constructor that takes an options struct (`HostAllocator`,
//!   `WgpuAllocator`, `CudaAllocator`; `WgpuAllocator::from_device_with_options`);
//!   `_async` marks the twin that never blocks. No other `_with`.
//! - **Allocators are types of their own**, each a [`DeviceAllocator`]; their pools are reached
//!   through [`backend::Pooled`].

mod allocator;
pub mod backend;
mod bounce;
mod buffer;
mod checks;
mod clock;
#[cfg(all(feature = "cuda", native))]
pub mod cuda;
mod device;
mod discover;
mod error;
mod host;
pub mod plan;
mod planned;
mod pool;
mod pooled_allocator;
mod ptr;
mod registration;
mod registry;
pub mod replay;
pub mod snapshot;
mod stats;
mod storage;
pub mod stream;
mod sync;
#[cfg(feature = "wgpu")]
pub mod wgpu;

pub use allocator::{BoxFuture, DeviceAllocator, WasmNotSendSync, DEFAULT_ALIGNMENT};
pub use buffer::DeviceMemoryBuffer;
pub use device::{Device, DeviceIndex, DeviceType};
pub use discover::{register_available, register_available_async};
pub use error::{BackendSource, Error, PointerProblem, Result};
pub use host::HostAllocator;
pub use planned::{PlanLayout, PlannedMemory, PlannedTensor};
pub use pool::PoolOptions;
pub use ptr::DevicePtr;
pub use registration::{Registration, RegistrationOutcome};
pub use registry::{
    copy_across_devices, copy_between, get_device_allocator, register_device_allocator, CopyEnd,
    DeviceAllocatorRegistry,
};
pub use stats::AllocatorStats;
pub use stream::{write_from_reader, write_from_stream, Progress, StreamOptions};

#[cfg(all(test, native))]
mod assertions {
    static_assertions::assert_impl_all!(crate::HostAllocator: Send, Sync);
    static_assertions::assert_impl_all!(crate::DeviceAllocatorRegistry: Send, Sync);
    static_assertions::assert_obj_safe!(crate::DeviceAllocator);
}

/// The README's Rust code, compiled (and the quick start run) as doc tests, so the front page
/// cannot drift from the API.
#[cfg(all(doctest, feature = "wgpu"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
