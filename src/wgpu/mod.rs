//! The wgpu backend: [`WgpuAllocator`], GPU buffers through wgpu on Vulkan, Metal, DX12, GL
//! and the browser's WebGPU, behind the [`crate::DeviceAllocator`] contract.
//!
//! One allocator serves one wgpu backend; its `device_type` is that backend's
//! [`crate::DeviceType`], and its device indices are that backend's adapters in a stable order:
//! by adapter type (discrete, integrated, virtual, CPU, other; integrated first under
//! [`wgpu::PowerPreference::LowPower`]), then name, vendor and device id.
//!
//! # Using devalloc in a wgpu app
//!
//! An app that already has a `wgpu::Device` hands it over with `WgpuAllocator::from_device`
//! (or `from_device_with_options`) and keeps using it; devalloc is a guest:
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
//!   `device.destroy()` every such call of every allocator on it is [`crate::Error::DeviceLost`]:
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
//! - **Binding.** One call makes a bind group from devalloc memory:
//!   `alloc.bind_group(&layout, &[Bind::read(0, w), Bind::read_write(1, &tensor), Bind::uniform(2,
//!   params)], &app_entries, index)`. A [`Bind`] takes a whole allocation (`DevicePtr`), `len`
//!   bytes at a pointer (`(ptr, len)`), a `DeviceMemoryBuffer` or a planned tensor
//!   ([`crate::PlannedTensor`]); `extra` holds the app's own entries (its uniform buffers,
//!   textures). Every bind is checked first (in the allocation, offset alignment, binding size,
//!   usage, access: below), each refusal naming the tensor or allocation and the limit, and the
//!   bind group is made in an error scope, so a mismatch with the layout is an error, not a
//!   message to the app's handler (natively; in the browser wgpu reports it to the device).
//!   `alloc.bindings(&binds, index)` gives the checked entries as owned [`Bindings`] to keep in a
//!   `let` and pass as `bindings.entries()`. Below that, `WgpuAllocator::buffer(ptr, index)`
//!   (to the end of the allocation) or `buffer_range(ptr, len, index)` gives a `BufferRange`
//!   whose `binding(BindingKind::Storage | Uniform)` is a `wgpu::BufferBinding` checked the same
//!   way (it borrows the range: use it inline).
//! - **Alignment and plans.** Copies work at any offset; bindings need offsets that are
//!   multiples of `binding_alignment(index)`. Lay out plans with [`crate::PlanLayout`] at that
//!   alignment (an existing plan's offsets cannot be moved), and `PlannedMemory::from_plan_labeled`
//!   keeps the plan: `memory.tensor(i)` is tensor `i`'s address, length and label, ready for a
//!   `Bind`. wgpu tracks usage per buffer, so two tensors of one planned buffer bound in one
//!   dispatch need the same access: bind planned activations `read_write`, or use one planned
//!   buffer per access kind. `bindings` and `bind_group` refuse a `Read` or `Uniform` bind of a
//!   buffer that another bind of theirs writes (or two overlapping ranges of it), naming both
//!   tensors, rather than let wgpu report `devalloc block N` at the dispatch.
//! - **Usage and labels.** `allocate_request(&BufferRequest::new(n).usage(..).label(..), index)`
//!   chooses usage per allocation (uniform, vertex, index, indirect...) and a label for people.
//!   The cache keeps buffers apart by usage, never by label: a freed buffer serves the next
//!   allocation of its usage whatever its label. wgpu fixes a buffer's label when it is made, so
//!   wgpu's own messages name the buffer by its block (`devalloc block 17 (1024 bytes)`), true
//!   while the block is reused; `live_allocations` and snapshots tie each block id to the label
//!   of the allocation in it.
//! - **The cache's reuse rule.** A freed buffer is cached and handed out again: a bind group
//!   (or any command) built on a freed allocation then reaches the next allocation in that
//!   buffer, as with every caching allocator (PyTorch's included). Drop bind groups before
//!   freeing. `PoolOptions::reuse_freed = false` never reuses freed buffers and destroys each
//!   at its free, so such a bug shows in testing: the submit that uses a bind group kept past
//!   the free is a validation error ("... has been destroyed", naming the block) in the app's
//!   error scope or its uncaptured-error handler.
//! - **Async.** On native the `_async` copies return `Pending` and are woken by a polling
//!   thread per device (map callbacks and `on_device_lost` then run on it, so
//!   `on_device_lost` must not call back into devalloc); the blocking copies poll inline. In
//!   the browser nothing may block: blocking calls that would wait return
//!   [`crate::Error::NotSupported`] naming their async twin.
//! - **App buffers.** `copy_to_buffer` / `copy_from_buffer` move data between devalloc memory
//!   and buffers the app made, on the GPU, in queue order.
//! - **Ordering with the app's own work.** devalloc uses the device's one queue. A copy through
//!   devalloc sees all the work the app submitted before it, on both routes (staged: devalloc's
//!   copy is queued after it; direct: mapping the buffer waits for it), and work the app submits
//!   after a blocking copy returned (or an async one completed) sees the copy's data. On the
//!   direct route a devalloc buffer is mapped while a copy on it is in flight, and wgpu refuses
//!   to submit work on a mapped buffer: the app must not submit work that uses a buffer while
//!   another thread's copy, or an async copy not yet complete, is on it. `synchronize(index)`
//!   waits for everything queued. (The conformance suite's binding check dispatches the app's
//!   kernel, then reads its output through devalloc, on both routes.)
//! - **Dynamic shapes.** Plan for the largest shape (one `PlannedMemory` for the biggest batch;
//!   smaller batches use the start of each tensor's range), or allocate per shape and let the
//!   cache serve them: a freed buffer serves requests up to an eighth smaller than it, and the
//!   pool's budget gives back the sizes the workload stopped asking for (see `PoolOptions`).
//! - **Owning memory without the registry.** `DeviceMemoryBuffer::create_on(&alloc, size,
//!   index, alignment)` allocates on this allocator and frees on drop.
//!
//! `examples/mlp.rs` is such an app, in under 150 lines of Rust: a 32-64-10 network with a
//! softmax whose weights are devalloc allocations filled in one call, whose activations are
//! labelled tensors of one planned buffer, over 50 batches of varying size, each checked
//! against the CPU.
//!
//! # Inside
//!
//! `allocator.rs` (the allocator, its requests), `options.rs` (options, route choice, the
//! backend's tuning), `storage.rs` (the `Storage` impl: blocks, routes, ragged writes),
//! `gpu.rs` (one device and devalloc's calls on it, in error scopes), `lost.rs` (is this
//! failure a device loss?), `belt.rs` (the staging belt: its state and protocols, one type),
//! `queue_upload.rs` (small uploads through the queue's own staging), `mapping.rs` (the one
//! way a buffer is mapped), `direct.rs` (mapped copies), `copy.rs` (between blocks),
//! `binding.rs` (bindings, app buffers), `platform/` (native vs web, behind one trait),
//! `workarounds.rs` (every workaround for wgpu-core 30.0.2: the one file to revisit on an
//! upgrade).

mod allocator;
mod belt;
mod bind;
mod binding;
pub(crate) mod block;
mod copy;
mod direct;
mod gpu;
mod in_place;
mod lost;
mod mapping;
mod options;
mod platform;
mod queue_upload;
mod segments;
pub(crate) mod storage;
mod verdict;
mod workarounds;

/// The wgpu crate devalloc speaks (major version 30): use these types with devalloc, and
/// depend on the same major version in your app (two versions of wgpu do not mix).
pub use ::wgpu as api;
pub use allocator::{BufferRequest, WgpuAllocator};
pub use bind::{Access, Bind, BindTarget, Bindings};
pub use binding::{BindingKind, BufferRange};
pub use options::{DeviceLostHandler, Route, WgpuOptions};

use self::options::device_type_of;
use crate::allocator::DeviceAllocator;
use crate::registration::{Registration, RegistrationOutcome};
use crate::registry::DeviceAllocatorRegistry;

/// The wgpu backends `register_backends` tries, in order.
const NATIVE_BACKENDS: [wgpu::Backend; 4] =
    [wgpu::Backend::Vulkan, wgpu::Backend::Metal, wgpu::Backend::Dx12, wgpu::Backend::Gl];

/// Opens every wgpu backend this build and machine offer (blocking; native only) and
/// registers each that has a usable adapter into `registry`; says for each what happened.
pub fn register_backends(registry: &DeviceAllocatorRegistry, options: &WgpuOptions) -> Vec<Registration> {
    let mut report = Vec::new();
    for backend in NATIVE_BACKENDS {
        let Some(device_type) = device_type_of(backend) else { continue };
        if !wgpu::Instance::enabled_backend_features().contains(backend.into()) {
            continue;
        }
        // Held while the allocator is made, as `get_or_register` does: no thread makes a second.
        let _making = registry.making();
        if registry.get_allocator(device_type).is_some() {
            report.push(Registration { device_type, outcome: RegistrationOutcome::AlreadyRegistered });
            continue;
        }
        let made = WgpuAllocator::with_options(backend, options.clone())
            .map(|a| Box::leak(Box::new(a)) as &'static dyn DeviceAllocator);
        report.push(Registration::made(registry, device_type, made));
    }
    report
}

/// Opens the browser's WebGPU and, where it has no adapter and devalloc was built with
/// `webgl`, WebGL2 (wgpu's GL backend) instead; registers the one that opened into `registry`
/// and says for each what happened (`NotBuilt`, `Unavailable` with the browser's reason,
/// `NotTried` for WebGL2 once WebGPU opened). What `register_available` does natively, for the
/// browser, where adapters can only be opened asynchronously.
#[cfg(web)]
pub async fn register_browser_backends(
    registry: &DeviceAllocatorRegistry,
    options: &WgpuOptions,
) -> Vec<Registration> {
    let mut report = Vec::new();
    let mut opened = None;
    for (backend, feature) in [(wgpu::Backend::BrowserWebGpu, "webgpu"), (wgpu::Backend::Gl, "webgl")] {
        let Some(device_type) = device_type_of(backend) else { continue };
        let outcome = if !wgpu::Instance::enabled_backend_features().contains(backend.into()) {
            RegistrationOutcome::NotBuilt { feature }
        } else if let Some(first) = opened {
            let because =
                format!("{first} opened, and WebGL2 is only the fallback where WebGPU has no adapter");
            RegistrationOutcome::NotTried { because }
        } else if registry.get_allocator(device_type).is_some() {
            RegistrationOutcome::AlreadyRegistered
        } else {
            // No lock across the wait: where another caller registers meanwhile, `made` says
            // AlreadyRegistered and this one's allocator is dropped.
            let made = WgpuAllocator::with_options_async(backend, options.clone()).await;
            let made = made.map(|a| Box::leak(Box::new(a)) as &'static dyn DeviceAllocator);
            Registration::made(registry, device_type, made).outcome
        };
        if matches!(outcome, RegistrationOutcome::Registered { .. } | RegistrationOutcome::AlreadyRegistered)
        {
            opened = Some(device_type);
        }
        report.push(Registration { device_type, outcome });
    }
    report
}

#[cfg(all(test, native))]
mod assertions {
    static_assertions::assert_impl_all!(super::WgpuAllocator: Send, Sync);
}
