//! [`CudaAllocator`]: CUDA device memory through `cudarc` (feature `cuda`, native only).
//!
//! **Untested on hardware:** this backend has never run on an NVIDIA GPU. Its tests have run
//! only on machines without one (where it must refuse cleanly); treat it as unproven until
//! `scripts/gpu-bundle`'s run on a GPU says otherwise.
//!
//! The driver is loaded at run time, so the crate builds without a CUDA toolkit and runs on
//! machines without a GPU: [`CudaAllocator::new`] first probes for `libcuda` (cudarc's own
//! loader panics when it is missing) and returns [`Error::NotFound`] when there is no usable
//! driver (none, a toolkit's stub library, a driver older than the library) or no device, and
//! logs which `libcuda` it loaded. Device indices are CUDA ordinals; a [`DevicePtr`] is the
//! real device address. Each device's context is opened on first use: a GPU that is busy or
//! in exclusive-process mode makes that one index unavailable, not the allocator.
//!
//! Semantics a CUDA runtime can rely on:
//! - every copy returns once its data are where they were sent (its stream is synchronised,
//!   on error paths too), so work on any stream afterwards sees them; the other way round,
//!   devalloc copies on non-blocking streams of its own (one per copy in flight), so work the
//!   caller has queued (a kernel writing what is to be read) must be finished before the copy
//!   is asked for;
//! - devalloc never waits for the caller's queued work: opening a device and copying
//!   synchronise nothing but devalloc's own streams (no `cuCtxSynchronize`, see `open.rs`);
//! - `allocate` returns memory every stream can use at once (`cuMemAlloc`, not stream-ordered)
//!   and uninitialised, as `cudaMalloc`'s; freeing is not stream-ordered: finish the work that
//!   uses an allocation before freeing it (see `storage.rs`);
//! - the caller's current context is the same after every devalloc call (`context.rs`);
//! - dropping the allocator waits for copies in flight before their pinned buffers go.
//!
//! Files: `errors.rs` (driver errors), `context.rs` (the context guard), `open.rs` (contexts
//! opened on first use, streams lent per copy), `storage.rs` (memory, small copies),
//! `tuning.rs` (staging settings, checked, and chunk plans), `pipeline.rs` (the order of a
//! staged copy's steps), `staging.rs` (large copies through pinned buffers and copy threads),
//! `copy.rs` (device-to-device and peer copies), `policy.rs` (block sizes).
#![allow(unsafe_code)] // at the edge: every unsafe block has a SAFETY note

mod context;
mod copy;
mod errors;
mod open;
mod pipeline;
mod policy;
mod staging;
pub(crate) mod storage;
mod tuning;

use std::sync::Arc;

use cudarc::driver::result;

use self::errors::driver_present;
pub use self::errors::loaded_library;
use self::errors::{driver_error, means_no_driver};
use self::storage::CudaStorage;
pub use self::tuning::CopyTuning;
use self::tuning::Tuning;
use crate::device::{Device, DeviceIndex, DeviceType};
use crate::error::{Error, Result};
use crate::pool::{Pool, PoolOptions};
use crate::pooled_allocator::PooledAllocator;
#[allow(unused_imports)] // named in the docs
use crate::ptr::DevicePtr;
/// The cudarc crate devalloc's CUDA backend is built on (0.19): contexts and streams of your
/// own that work with devalloc's device addresses.
pub use ::cudarc as api;

/// Options of a [`CudaAllocator`].
#[derive(Clone, Debug, Default)]
pub struct CudaOptions {
    /// The pool's settings (caching on by default; the limit applies per device).
    pub pool: PoolOptions,
    /// How large copies are staged (from `DEVALLOC_CUDA_*` by default). Any values are taken:
    /// the allocator runs with [`CopyTuning::checked`]'s.
    pub copies: CopyTuning,
}

/// CUDA device memory behind the [`crate::DeviceAllocator`] contract; see the module docs.
pub struct CudaAllocator(PooledAllocator<CudaStorage>);

crate::pooled_allocator::pool_controls!(CudaAllocator, CudaStorage);

impl CudaAllocator {
    /// Every CUDA device, with a caching pool and no limit.
    pub fn new() -> Result<Self> {
        Self::with_options(CudaOptions::default())
    }

    /// Every CUDA device with these options. [`Error::NotFound`] when there is no usable
    /// driver or no device.
    pub fn with_options(options: CudaOptions) -> Result<Self> {
        if !driver_present() {
            return Err(Error::not_found("no CUDA driver: libcuda could not be loaded"));
        }
        let first = Device::new(DeviceType::Cuda, 0);
        // cudarc panics on some loader failures; keep them from escaping devalloc.
        let init = std::panic::catch_unwind(result::init)
            .map_err(|_| Error::not_found("no CUDA driver: the driver library failed to load"))?;
        let library = loaded_library().unwrap_or_else(|| "an unknown path".into());
        if let Err(e) = init {
            return Err(if means_no_driver(&e) {
                Error::not_found(format!(
                    "no usable CUDA driver: initialising {library} gave {} (a toolkit's stub library, or a driver that does not match)",
                    errors::describe(&e)
                ))
            } else {
                driver_error(first, "initialising the driver", e, 0)
            });
        }
        log::info!("devalloc: CUDA driver loaded from {library}");
        let count = match result::device::get_count() {
            Ok(n) if n > 0 => n as usize,
            Ok(_) => return Err(Error::not_found("no CUDA device: the driver reports none")),
            Err(e) if means_no_driver(&e) => {
                return Err(Error::not_found(format!("no CUDA device: {}", errors::describe(&e))))
            }
            Err(e) => return Err(driver_error(first, "counting devices", e, 0)),
        };
        // The checked tuning, the only kind a storage takes.
        let tuning = Tuning::new(&options.copies);
        let threads = tuning.get().threads;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("devalloc-cuda-copy-{i}"))
            .build()
            .map_err(|e| Error::backend(first, format!("starting {threads} copy threads: {e}")))?;
        let pool = Arc::new(pool);
        let pools = (0..count)
            .map(|i| Pool::new(CudaStorage::new(i, tuning.clone(), Arc::clone(&pool))?, options.pool.clone()))
            .collect::<Result<Vec<_>>>()?;
        Ok(CudaAllocator(PooledAllocator::from_pools(DeviceType::Cuda, pools)?))
    }

    /// Sets device `index`'s memory limit to `fraction` (0 to 1) of the device's memory (as
    /// PyTorch's `set_per_process_memory_fraction`).
    pub fn set_memory_fraction(&self, fraction: f64, index: DeviceIndex) -> Result<()> {
        self.0.set_memory_fraction(fraction, index)
    }

    /// Waits for every copy queued on device `index` (copies already wait for themselves; this
    /// is for symmetry with the other allocators).
    pub fn synchronize(&self, index: DeviceIndex) -> Result<()> {
        self.0.pool(index)?.storage().synchronize()
    }

    /// Free and total bytes of device `index`, as the driver counts them (`cuMemGetInfo`).
    pub fn mem_info(&self, index: DeviceIndex) -> Result<(u64, u64)> {
        self.0.pool(index)?.storage().mem_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_construction_is_a_clear_error() {
        match CudaAllocator::new() {
            Ok(a) => eprintln!(
                "a CUDA driver is present here ({} device(s)); nothing to check",
                crate::DeviceAllocator::device_count(&a)
            ),
            Err(e) => {
                assert!(matches!(e, Error::NotFound { .. }), "{e}");
                assert!(e.to_string().contains("no CUDA") || e.to_string().contains("no usable CUDA"), "{e}");
                eprintln!("CUDA not available here, as expected on this machine: {e}");
            }
        }
    }

    #[test]
    fn hostile_options_never_panic() {
        let zeros =
            CopyTuning { pinned_threshold: 0, chunk: 0, buffers: 0, threads: 0, write_combined: false };
        let huge = CopyTuning {
            pinned_threshold: usize::MAX,
            chunk: usize::MAX,
            buffers: usize::MAX,
            threads: usize::MAX,
            write_combined: true,
        };
        for copies in [zeros, huge] {
            let pool = PoolOptions::default();
            match CudaAllocator::with_options(CudaOptions { pool, copies }) {
                // On a GPU: copies work with what the tuning was checked into.
                Ok(a) => {
                    use crate::DeviceAllocator;
                    let data: Vec<u8> = (0..5_000_003u32).map(|i| (i % 251) as u8).collect();
                    let p = a.allocate(data.len(), 0, 256).unwrap();
                    a.copy_host_to_device(p, &data, 0).unwrap();
                    let mut back = vec![0u8; data.len()];
                    a.copy_device_to_host(&mut back, p, 0).unwrap();
                    assert!(back == data);
                    a.deallocate(p, 0).unwrap();
                }
                Err(e) => eprintln!("SKIPPED the copies of hostile_options_never_panic: {e}"),
            }
        }
    }
}
