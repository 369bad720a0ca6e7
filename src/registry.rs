//! [`DeviceAllocatorRegistry`]: device type -> allocator, and copies between any two devices.

use std::sync::{Mutex, OnceLock};

use crate::allocator::DeviceAllocator;
use crate::bounce::{bounce, run_blocking, End, Mode};
use crate::device::{Device, DeviceIndex, DeviceType, NUM_DEVICE_TYPES};
use crate::error::{Error, Result};
use crate::ptr::DevicePtr;
use crate::sync::Unpoisoned;

/// A fixed-size table from [`DeviceType`] to its allocator.
///
/// Lookups read one slot (no allocation, no lock); registration sets a slot once, from any
/// thread: a second registration for the same type is [`Error::AlreadyRegistered`]. Allocators
/// are borrowed for `'static` (ExecuTorch's registry keeps raw, non-owning pointers to
/// singletons): leak a boxed allocator, or use a `static`.
///
/// [`DeviceAllocatorRegistry::instance`] is the process-wide registry behind
/// [`register_device_allocator`] / [`get_device_allocator`]; [`DeviceAllocatorRegistry::new`]
/// makes independent ones for embedding and tests. [`DeviceAllocatorRegistry::get`] gives back
/// the concrete type (a `WgpuAllocator`, say) of a registered allocator.
pub struct DeviceAllocatorRegistry {
    slots: [OnceLock<&'static dyn DeviceAllocator>; NUM_DEVICE_TYPES],
    /// Serialises [`DeviceAllocatorRegistry::get_or_register`]'s makers.
    making: Mutex<()>,
}

// On wasm without threads the allocators are not `Sync` (wgpu's web types are not), yet a
// `static` registry must be; with a single thread nothing can be shared across threads.
#[cfg(all(web, not(target_feature = "atomics")))]
#[allow(unsafe_code)]
// SAFETY: wasm32 without the atomics feature has exactly one thread.
unsafe impl Sync for DeviceAllocatorRegistry {}

static GLOBAL: DeviceAllocatorRegistry = DeviceAllocatorRegistry::new();

impl Default for DeviceAllocatorRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl DeviceAllocatorRegistry {
    /// An empty registry.
    pub const fn new() -> Self {
        DeviceAllocatorRegistry {
            slots: [const { OnceLock::new() }; NUM_DEVICE_TYPES],
            making: Mutex::new(()),
        }
    }

    /// The process-wide registry.
    pub fn instance() -> &'static DeviceAllocatorRegistry {
        &GLOBAL
    }

    /// Registers `allocator` for its [`DeviceAllocator::device_type`]; once per type.
    pub fn register_allocator(&self, allocator: &'static dyn DeviceAllocator) -> Result<()> {
        let device_type = allocator.device_type();
        self.slots[device_type.table_index()]
            .set(allocator)
            .map_err(|_| Error::AlreadyRegistered { device_type })?;
        log::debug!("devalloc: registered an allocator for {device_type}");
        Ok(())
    }

    /// The allocator registered for `device_type`; if there is none yet, registers the one
    /// `make` returns (which must be of that type). One test binary whose tests each want "the"
    /// allocator of a type calls this from every test: the first makes it, the others get it.
    pub fn get_or_register(
        &self,
        device_type: DeviceType,
        make: impl FnOnce() -> Result<&'static dyn DeviceAllocator>,
    ) -> Result<&'static dyn DeviceAllocator> {
        if let Some(a) = self.get_allocator(device_type) {
            return Ok(a);
        }
        let _making = self.making();
        if let Some(a) = self.get_allocator(device_type) {
            return Ok(a);
        }
        let made = make()?;
        if made.device_type() != device_type {
            return Err(Error::invalid_argument(format!(
                "get_or_register({device_type}) was given a {} allocator",
                made.device_type()
            )));
        }
        self.register_allocator(made)?;
        Ok(made)
    }

    /// Held while an allocator is made and registered (by [`Self::get_or_register`],
    /// [`crate::register_available`], `wgpu::register_backends`), so that two threads never
    /// both make one for a type and one of them loses.
    pub(crate) fn making(&self) -> std::sync::MutexGuard<'_, ()> {
        self.making.lock().unpoisoned()
    }

    /// The allocator registered for `device_type`, if any.
    pub fn get_allocator(&self, device_type: DeviceType) -> Option<&'static dyn DeviceAllocator> {
        self.slots[device_type.table_index()].get().copied()
    }

    /// The allocator registered for `device_type` as its concrete type `A` (e.g.
    /// `registry.get::<WgpuAllocator>(DeviceType::Vulkan)` for `buffer()` and bindings);
    /// `None` when none is registered or it is of another type.
    pub fn get<A: DeviceAllocator + 'static>(&self, device_type: DeviceType) -> Option<&'static A> {
        self.get_allocator(device_type)?.as_any()?.downcast_ref::<A>()
    }

    /// The allocator for `device_type`, or [`Error::NotFound`] saying none is registered.
    pub fn require(&self, device_type: DeviceType) -> Result<&'static dyn DeviceAllocator> {
        self.get_allocator(device_type)
            .ok_or_else(|| Error::not_found(format!("no allocator is registered for {device_type}")))
    }

    /// Every registered allocator, in [`DeviceType`] order.
    pub fn allocators(&self) -> impl Iterator<Item = &'static dyn DeviceAllocator> + '_ {
        self.slots.iter().filter_map(|s| s.get().copied())
    }

    /// One [`crate::snapshot::Snapshot`] of every device of every registered allocator that can take one.
    pub fn snapshot(&self) -> crate::snapshot::Snapshot {
        let devices = self.allocators().filter_map(|a| a.snapshot().ok()).flat_map(|s| s.devices).collect();
        crate::snapshot::Snapshot::new(devices)
    }

    /// Copies `nbytes` from `src_ptr` on `src` to `dst_ptr` on `dst`: through the allocator's
    /// own device-to-device copy when both are of one type, else through a host bounce buffer
    /// in chunks of 4 MiB. Both ranges are checked before a byte moves.
    pub fn copy(
        &self,
        dst: Device,
        dst_ptr: DevicePtr,
        src: Device,
        src_ptr: DevicePtr,
        nbytes: usize,
    ) -> Result<()> {
        run_blocking(self.copy_with(dst, dst_ptr, src, src_ptr, nbytes, Mode::Blocking))
    }

    /// Async twin of [`DeviceAllocatorRegistry::copy`] (the way to copy in the browser).
    pub async fn copy_async(
        &self,
        dst: Device,
        dst_ptr: DevicePtr,
        src: Device,
        src_ptr: DevicePtr,
        nbytes: usize,
    ) -> Result<()> {
        self.copy_with(dst, dst_ptr, src, src_ptr, nbytes, Mode::Async).await
    }

    async fn copy_with(
        &self,
        dst: Device,
        dst_ptr: DevicePtr,
        src: Device,
        src_ptr: DevicePtr,
        nbytes: usize,
        mode: Mode,
    ) -> Result<()> {
        let d = self.require(dst.device_type)?;
        let s = self.require(src.device_type)?;
        copy_between_with((d, dst.index, dst_ptr), (s, src.index, src_ptr), nbytes, mode).await
    }
}

/// One end of a copy between allocators: the allocator, the device index, the address.
pub type CopyEnd<'a> = (&'a dyn DeviceAllocator, DeviceIndex, DevicePtr);

/// Copies `nbytes` from `src` (an allocator, a device index of it, an address) to `dst`, with
/// no registry: through the allocator's own device-to-device copy when both ends are one
/// allocator, else through a host bounce buffer in chunks of 4 MiB, as
/// [`DeviceAllocatorRegistry::copy`] does (it calls this). For allocators a program owns and
/// drops itself (the C ABI's, which close at `devalloc_shutdown`). Both ranges are checked
/// before a byte moves.
pub fn copy_between(dst: CopyEnd<'_>, src: CopyEnd<'_>, nbytes: usize) -> Result<()> {
    run_blocking(copy_between_with(dst, src, nbytes, Mode::Blocking))
}

async fn copy_between_with(dst: CopyEnd<'_>, src: CopyEnd<'_>, nbytes: usize, mode: Mode) -> Result<()> {
    let ((d, dst_index, dst_ptr), (s, src_index, src_ptr)) = (dst, src);
    if std::ptr::addr_eq(d, s) {
        return match mode {
            Mode::Blocking => d.copy_device_to_device(dst_ptr, dst_index, src_ptr, src_index, nbytes),
            Mode::Async => {
                d.copy_device_to_device_async(dst_ptr, dst_index, src_ptr, src_index, nbytes).await
            }
        };
    }
    let dst = End { alloc: d, index: dst_index, ptr: dst_ptr };
    let src = End { alloc: s, index: src_index, ptr: src_ptr };
    bounce(dst, src, nbytes, mode).await
}

/// Registers `allocator` in the process-wide registry.
pub fn register_device_allocator(allocator: &'static dyn DeviceAllocator) -> Result<()> {
    DeviceAllocatorRegistry::instance().register_allocator(allocator)
}

/// The allocator for `device_type` in the process-wide registry, if any.
pub fn get_device_allocator(device_type: DeviceType) -> Option<&'static dyn DeviceAllocator> {
    DeviceAllocatorRegistry::instance().get_allocator(device_type)
}

/// [`DeviceAllocatorRegistry::copy`] on the process-wide registry.
pub fn copy_across_devices(
    dst: Device,
    dst_ptr: DevicePtr,
    src: Device,
    src_ptr: DevicePtr,
    nbytes: usize,
) -> Result<()> {
    DeviceAllocatorRegistry::instance().copy(dst, dst_ptr, src, src_ptr, nbytes)
}
