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
//! | `WgpuAllocator` | `vulkan`, `metal`, `dx12`, `gl`, `webgpu` | `vulkan`, `metal`, `dx12`, `gles`, `webgpu` (default), `webgl` |
//! | `CudaAllocator` | `cuda` | `cuda` (native; the driver is loaded at run time) |
//!
//! devalloc speaks wgpu 30 (re-exported as `devalloc::wgpu_api`); an app that uses wgpu
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
//!   data, not the stats (one exception: an allocation that runs out of memory may first give
//!   the cache back to the device, as PyTorch's does). Impossible requests are
//!   [`Error::TooLarge`] or [`Error::InvalidArgument`]; [`Error::OutOfMemory`] means "not now"
//!   and says what is held. In the browser, WebGPU reports a buffer it could not create only
//!   later, asynchronously: devalloc logs it, and the allocation has already returned.
//! - Stale, interior and foreign pointers are refused: host and wgpu addresses are virtual and
//!   a freed range is not handed out again within 2^32 frees (unless the device's 8 PiB
//!   window has no other room), so a use after free is reported as such.
//! - Copies between devices of different types go through [`DeviceAllocatorRegistry::copy`],
//!   which bounces through a small host buffer in chunks.
//!
//! ## The public API
//!
//! - The contract: [`DeviceAllocator`], [`AllocatorStats`], [`DEFAULT_ALIGNMENT`],
//!   [`BoxFuture`], [`WasmNotSendSync`]; devices and addresses: [`DeviceType`], [`Device`],
//!   [`DeviceIndex`], [`NUM_DEVICE_TYPES`], [`DevicePtr`]; errors: [`Error`],
//!   [`PointerProblem`], [`Result`], [`BackendSource`].
//! - The registry: [`DeviceAllocatorRegistry`] (with [`DeviceAllocatorRegistry::get`] for the
//!   concrete type back, and [`DeviceAllocatorRegistry::get_or_register`]),
//!   [`register_device_allocator`], [`get_device_allocator`], [`copy`],
//!   [`register_available`] with its [`Registration`] / [`Outcome`].
//! - Owning memory: [`DeviceMemoryBuffer`], [`PlannedMemory`], [`PlanLayout`].
//! - Allocators: [`HostAllocator`] with [`PoolConfig`]; with a wgpu feature `WgpuAllocator`,
//!   `WgpuOptions`, `Route`, `BufferRequest`, `BufferRange`, `BindingKind`,
//!   `DeviceLostHandler`, `register_wgpu_backends` and the `wgpu_api` re-export; with `cuda`
//!   `CudaAllocator`, `CudaOptions`, `CopyTuning`, `cuda_library` and the `cudarc_api`
//!   re-export.
//! - Where the memory went: [`Snapshot`] and its parts ([`DeviceSnapshot`], [`LiveAllocation`],
//!   [`CachedBlocks`], [`PlannedBuffer`], [`DeviceMemory`], [`HistorySnapshot`], [`Event`],
//!   [`EventKind`], [`CopyCounts`], [`Count`]), [`SNAPSHOT_FORMAT`], [`SNAPSHOT_VERSION`].
//! - [`backend`]: what someone writing a backend of their own needs (`Storage`, `Pool`,
//!   `PooledAllocator`, `BlockRef`, `AllocationInfo`, the built-in storages).
//!
//! ## Using devalloc in a wgpu app
//!
//! An app that already has a `wgpu::Device` hands it over with `WgpuAllocator::from_device`
//! (or `from_device_with`) and keeps using it; devalloc is a guest:
//!
//! - **Adoption.** devalloc never replaces the device's uncaptured-error handler: its own calls
//!   run in error scopes, so the app's handler sees the app's errors (the one call that runs
//!   without, a direct-route map of a buffer the app was never given, cannot raise one short
//!   of a race inside wgpu during a `destroy()`: see the wgpu backend's docs). The device's lost
//!   callback is the exception: wgpu keeps one per device and cannot hand back one already
//!   set, and devalloc needs it to notice a loss. Give yours as `WgpuOptions::on_device_lost`
//!   (devalloc calls it once, after recording the loss) and do not set the device's lost
//!   callback yourself after adoption. devalloc polls the device without blocking at the
//!   start of every call that touches it, or waits on a poll anyway, or (uploads) sees wgpu
//!   refuse the work of a device that is no longer valid and then waits for the loss, so after
//!   `device.destroy()` every such call of every allocator on it is [`Error::DeviceLost`]:
//!   allocations, copies, range checks, buffers, `synchronize`; a `BufferRange`'s `binding`
//!   polls nothing and is `DeviceLost` once any call has seen the loss. Bookkeeping keeps
//!   working so that the app can clean up: `deallocate`, `release_buffers`, `empty_cache`,
//!   `stats`, `get_offset_address`. A copy of 0 bytes touches nothing and is `Ok` even then.
//!   One limit, wgpu's: a device destroyed while its queue still has work is invalid at once,
//!   but wgpu reports the loss only once that work is done (as WebGPU specifies), and wgpu 30
//!   offers no cheap way to ask whether a device is still valid. Until then a call that needs
//!   no answer from the device (an allocation from the cache or a new buffer, `buffer`,
//!   `check_range`, an aligned device-to-device copy) can return `Ok`; every call that does
//!   (reads, writes, copies through the host, `synchronize`) sees wgpu refuse it, waits for
//!   the report (or records the loss itself after a second) and is `DeviceLost`.
//! - **Buffers you are given stay devalloc's.** Bind them, copy to and from them; do not
//!   destroy them or leave them mapped. devalloc's copies on such a buffer fail with an error
//!   (not a panic), and once freed it is dropped rather than cached for the next allocation.
//! - **Binding.** `WgpuAllocator::buffer(ptr, index)` (to the end of the allocation) or
//!   `buffer_range(ptr, len, index)` gives a `BufferRange`; its `binding(BindingKind::Storage)`
//!   or `binding(BindingKind::Uniform)` returns a `wgpu::BufferBinding` or an error that names
//!   the device limit it breaks (offset alignment, binding size, usage, empty range).
//! - **Alignment and plans.** Copies work at any offset; bindings need offsets that are
//!   multiples of `binding_alignment(index)`. Lay out plans with [`PlanLayout`] at that
//!   alignment (an existing plan's offsets cannot be moved). wgpu tracks usage per buffer, so
//!   two tensors of one planned buffer bound in one dispatch need the same access: bind planned
//!   activations `read_write`, or use one planned buffer per access kind.
//! - **Usage and labels.** `allocate_with(index, &BufferRequest::new(n).usage(..).label(..))`
//!   chooses usage per allocation (uniform, vertex, index, indirect...) and a label that wgpu's
//!   own messages show. The cache keeps buffers apart by usage and label.
//! - **The cache's reuse rule.** A freed buffer is cached and handed out again: a bind group
//!   (or any command) built on a freed allocation then reaches the next allocation in that
//!   buffer, as with every caching allocator (PyTorch's included). Drop bind groups before
//!   freeing. `PoolConfig::reuse_freed = false` never reuses freed buffers, so such a bug shows
//!   in testing.
//! - **Async.** On native the `_async` copies return `Pending` and are woken by a polling
//!   thread per device (map callbacks and `on_device_lost` then run on it, so
//!   `on_device_lost` must not call back into devalloc); the blocking copies poll inline. In
//!   the browser nothing may block: blocking calls that would wait return
//!   [`Error::NotSupported`] naming their async twin.
//! - **App buffers.** `copy_to_buffer` / `copy_from_buffer` move data between devalloc memory
//!   and buffers the app made, on the GPU, in queue order.
//!
//! `examples/mlp.rs` is such an app: a 2-layer network whose weights are devalloc allocations
//! and whose activations live in one planned buffer, beside the app's own uniform buffers.

mod allocator;
pub mod backend;
mod bounce;
mod buffer;
mod checks;
#[cfg(all(feature = "cuda", native))]
mod cuda;
mod device;
mod discover;
mod error;
mod host;
mod planned;
mod pool;
mod pooled_allocator;
mod ptr;
mod registry;
mod snapshot;
mod storage;
mod sync;
#[cfg(feature = "wgpu")]
mod wgpu;

/// The cudarc crate devalloc's CUDA backend is built on (0.19): contexts and streams of your
/// own that work with devalloc's device addresses.
#[cfg(all(feature = "cuda", native))]
pub use ::cudarc as cudarc_api;
/// The wgpu crate devalloc speaks (major version 30): use these types with devalloc, and depend
/// on the same major version in your app (two versions of wgpu do not mix).
#[cfg(feature = "wgpu")]
pub use ::wgpu as wgpu_api;
pub use allocator::{AllocatorStats, BoxFuture, DeviceAllocator, DEFAULT_ALIGNMENT};
pub use buffer::DeviceMemoryBuffer;
#[cfg(all(feature = "cuda", native))]
pub use cuda::{loaded_library as cuda_library, CopyTuning, CudaAllocator, CudaOptions};
pub use device::{Device, DeviceIndex, DeviceType, NUM_DEVICE_TYPES};
pub use discover::{register_available, Outcome, Registration};
pub use error::{BackendSource, Error, PointerProblem, Result};
pub use host::HostAllocator;
pub use planned::{PlanLayout, PlannedMemory};
pub use pool::PoolConfig;
pub use ptr::DevicePtr;
pub use registry::{copy, get_device_allocator, register_device_allocator, DeviceAllocatorRegistry};
pub use snapshot::{
    CachedBlocks, CopyCounts, Count, DeviceMemory, DeviceSnapshot, Event, EventKind, HistorySnapshot,
    LiveAllocation, PlannedBuffer, Snapshot, SNAPSHOT_FORMAT, SNAPSHOT_VERSION,
};
#[cfg(feature = "wgpu")]
pub use wgpu::{
    register_wgpu_backends, BindingKind, BufferRange, BufferRequest, DeviceLostHandler, Route, WgpuAllocator,
    WgpuOptions,
};

/// `Send + Sync` on native; nothing on wasm, where wgpu's web types are neither (as wgpu's own
/// `WasmNotSendSync`). Every allocator and storage implements it.
#[cfg(native)]
pub trait WasmNotSendSync: Send + Sync {}
#[cfg(native)]
impl<T: Send + Sync + ?Sized> WasmNotSendSync for T {}
/// `Send + Sync` on native; nothing on wasm, where wgpu's web types are neither (as wgpu's own
/// `WasmNotSendSync`). Every allocator and storage implements it.
#[cfg(web)]
pub trait WasmNotSendSync {}
#[cfg(web)]
impl<T: ?Sized> WasmNotSendSync for T {}

#[cfg(all(test, native))]
mod assertions {
    static_assertions::assert_impl_all!(crate::HostAllocator: Send, Sync);
    static_assertions::assert_impl_all!(crate::DeviceAllocatorRegistry: Send, Sync);
    static_assertions::assert_obj_safe!(crate::DeviceAllocator);
}
