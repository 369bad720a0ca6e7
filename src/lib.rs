//! # devalloc
//!
//! One way for ML and GPU runtimes to own device memory on any machine: the
//! [`DeviceAllocator`] contract, a [`DeviceAllocatorRegistry`] from [`DeviceType`] to allocator,
//! RAII [`DeviceMemoryBuffer`]s, memory plans ([`PlannedMemory`]) and real allocators behind
//! the contract. It is the Rust counterpart of ExecuTorch's `DeviceAllocator` /
//! `DeviceAllocatorRegistry`, widened from CUDA to every GPU API wgpu reaches.
#![warn(missing_docs, unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

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
mod storage;
#[cfg(feature = "wgpu")]
mod wgpu;

/// The wgpu crate devalloc speaks (major version 30): use these types with devalloc, and depend
/// on the same major version in your app (two versions of wgpu do not mix).
#[cfg(feature = "wgpu")]
pub use ::wgpu as wgpu_api;
pub use allocator::{AllocatorStats, BoxFuture, DeviceAllocator, DEFAULT_ALIGNMENT};
pub use buffer::DeviceMemoryBuffer;
#[cfg(all(feature = "cuda", native))]
pub use cuda::CudaAllocator;
pub use device::{Device, DeviceIndex, DeviceType, NUM_DEVICE_TYPES};
pub use discover::{register_available, Outcome, Registration};
pub use error::{BackendSource, Error, PointerProblem, Result};
pub use host::HostAllocator;
pub use planned::{PlanLayout, PlannedMemory};
pub use pool::PoolConfig;
pub use ptr::DevicePtr;
pub use registry::{copy, get_device_allocator, register_device_allocator, DeviceAllocatorRegistry};
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
