//! # devalloc
//!
//! One way for ML and GPU runtimes to own device memory on any machine: the
//! [`DeviceAllocator`] contract, a [`DeviceAllocatorRegistry`] from [`DeviceType`] to allocator,
//! RAII [`DeviceMemoryBuffer`]s, memory-planned pools ([`PlannedMemory`]) and real allocators
//! behind the contract. It is the Rust counterpart of ExecuTorch's `DeviceAllocator` /
//! `DeviceAllocatorRegistry`, widened from CUDA to every GPU API wgpu reaches.
//!
//! | allocator | device types | feature |
//! |---|---|---|
//! | [`HostAllocator`] | `cpu` | always |
//! | `WgpuAllocator` | `vulkan`, `metal`, `dx12`, `gl`, `webgpu` | `wgpu` (default) |
//! | `CudaAllocator` | `cuda` | `cuda` (driver loaded at run time) |
//!
//! Addresses are opaque [`DevicePtr`]s with checked offset arithmetic, so a planned tensor is
//! `base.offset(n)?` on every backend. Every failure is an [`Error`], never a panic: bad sizes
//! and alignments, unknown, freed or foreign pointers, out-of-bounds copies, out of memory.
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
//!   not at all; errors leave the allocator and every other allocation intact.
//! - Copies between devices of different types go through [`DeviceAllocatorRegistry::copy`],
//!   which bounces through a small host buffer in chunks.
#![warn(missing_docs, unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

pub mod allocator;
pub mod buffer;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod discover;
pub mod error;
pub mod host;
pub mod planned;
pub mod pool;
pub mod pooled;
pub mod ptr;
pub mod registry;
#[cfg(all(web, feature = "wgpu"))]
pub mod web;
#[cfg(feature = "wgpu")]
pub mod wgpu;

pub use allocator::{AllocatorStats, BoxFuture, DeviceAllocator, DEFAULT_ALIGNMENT};
pub use buffer::DeviceMemoryBuffer;
#[cfg(feature = "cuda")]
pub use cuda::CudaAllocator;
pub use device::{Device, DeviceIndex, DeviceType, NUM_DEVICE_TYPES};
pub use discover::register_available;
pub use error::{Error, PointerProblem, Result};
pub use host::HostAllocator;
pub use planned::PlannedMemory;
pub use pool::{Pool, PoolConfig, Storage};
pub use pooled::PooledAllocator;
pub use ptr::DevicePtr;
pub use registry::{copy, get_device_allocator, register_device_allocator, DeviceAllocatorRegistry};
#[cfg(feature = "wgpu")]
pub use wgpu::{WgpuAllocator, WgpuOptions};

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
