//! CubeCL's memory management (the allocator under burn's wgpu and CUDA backends) as a replay
//! peer: the real thing, driven through its public API, over a storage that only counts bytes.
//!
//! What is modelled, exactly:
//! - The crates, pinned: `cubecl-server` 0.11.3 (`MemoryManagement` and its pools),
//!   `cubecl-runtime` 0.11.4 (the configuration, handles and `ComputeStorage`), `cubecl-ir`
//!   0.11.4 (`MemoryDeviceProperties`), all with default features off. Without `std` CubeCL
//!   reads no `cubecl.toml` and no environment variable, so its runtime configuration is its
//!   default (persistent memory only inside explicit windows, which a replay never opens: every
//!   allocation is `Auto`).
//! - The pool configuration cubecl-wgpu uses by default: `MemoryConfiguration::default()`
//!   (`Adaptive`: a small pool of 8 MiB pages for buffers up to 64 KiB, and an arena whose page
//!   size follows the largest allocation so far), in one `MemoryManagement` like a wgpu
//!   stream's main memory ("Main GPU Memory"; the stream's staging and uniform memories are
//!   not modelled: a replay has no reads or launches).
//! - The device properties cubecl-wgpu derives from the device's limits (its `runtime.rs`),
//!   here from `wgpu::Limits::default()` (WebGPU's defaults, not a particular GPU's): max page
//!   size `min(max_storage_buffer_binding_size, max_buffer_size)` = min(128 MiB, 256 MiB) =
//!   128 MiB, alignment `max(min_uniform_buffer_offset_alignment,
//!   min_storage_buffer_offset_alignment)` = 256, and no memory capacity, as on WebGPU (so
//!   memory pressure never triggers a relocation; a full arena still does).
//! - The storage counts what cubecl-wgpu's `WgpuStorage` would hold: an allocation of `size`
//!   bytes holds `max(size, 32)` (its `MIN_BUFFER_SIZE`), and a deallocation gives it back at
//!   once (`flush` does nothing, as there). `peak_reserved` is the most it held at once,
//!   `allocations` how many storage allocations (wgpu buffers) were made.
//! - Each allocation does what the server's `reserve` does with no graph recording: a
//!   relocation when `relocation_need()` asks for one (`relocate_when_wanted`), then
//!   `reserve(size, PageUpdate::Allow, ..)`, which runs the pools' periodic cleanup
//!   (`Cleanup::Periodic`: pages past their deallocation period go back) before reserving. A
//!   reservation the pools refuse is retried once after reclaiming room, as the server does.
//!   Relocation copies no bytes (there are none), but moves the slices as it would.
//! - A free drops the allocation's `ManagedMemoryHandle` (its slice is free for the next
//!   reservation); an id allocated again drops what it held first. An `EmptyCache` event is the
//!   server's `memory_cleanup`: a relocation for `Explicit` when pages are outdated, then
//!   `cleanup(Cleanup::Explicit, ..)`.

use std::collections::HashMap;
use std::sync::Arc;

use cubecl_ir::MemoryDeviceProperties;
use cubecl_runtime::logging::ServerLogger;
use cubecl_runtime::memory_management::{ManagedMemoryHandle, MemoryConfiguration};
use cubecl_server::memory_management::relocation::{
    CopyQueue, RelocationNeed, RelocationReason, StorageCopy,
};
use cubecl_server::memory_management::{
    Cleanup, ErrorGraph, MemoryManagement, MemoryManagementOptions, PageUpdate,
};
use cubecl_server::server::{IoError, ServerError};
use cubecl_server::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};
use devalloc::replay::{Trace, TraceEvent};

/// cubecl-wgpu's `MIN_BUFFER_SIZE`: no wgpu buffer it makes is smaller.
const MIN_BUFFER_SIZE: u64 = 32;

/// Why CubeCL's memory management did not replay a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CubeclError {
    /// A request larger than CubeCL's largest page ([`largest_page`]), which it refuses by
    /// design (`IoError::BufferTooBig`): a finding about the peer, not an error of the replay.
    Refused {
        /// The trace's step of the request.
        step: u64,
        /// The request, in bytes.
        size: u64,
        /// CubeCL's largest page, in bytes.
        largest_page: u64,
    },
    /// Anything else: a refusal of a request its pages could hold, or the counting gone wrong.
    /// Either means the model is wrong, not the trace: the replay fails.
    Failed(String),
}

impl std::fmt::Display for CubeclError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CubeclError::Refused { step, size, largest_page } => write!(
                f,
                "CubeCL's pool: step {step}: {size} bytes refused, past its largest page ({largest_page} bytes)"
            ),
            CubeclError::Failed(e) => f.write_str(e),
        }
    }
}

/// CubeCL's largest page under cubecl-wgpu's default device properties (128 MiB): a request
/// larger than this is one it refuses, and the only one.
pub fn largest_page() -> u64 {
    wgpu_properties(&wgpu::Limits::default()).max_page_size
}

/// What CubeCL's memory management held replaying a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CubeclReport {
    /// The most bytes the storage held at once.
    pub peak_reserved: u64,
    /// Storage allocations (wgpu buffers) made.
    pub allocations: u64,
}

/// A storage that holds no memory and counts what a wgpu storage would.
struct CountingStorage {
    alignment: usize,
    /// Each allocation held and the bytes it counts for.
    held: HashMap<StorageId, u64>,
    bytes: u64,
    peak: u64,
    allocations: u64,
    /// The first inconsistency seen (a deallocation of what the storage does not hold).
    error: Option<String>,
}

impl ComputeStorage for CountingStorage {
    type Resource = ();

    fn alignment(&self) -> usize {
        self.alignment
    }

    fn get(&mut self, handle: &StorageHandle) -> Result<(), IoError> {
        if self.held.contains_key(&handle.id) {
            Ok(())
        } else {
            Err(IoError::NotFound {
                backtrace: Default::default(),
                reason: format!("{} in the counting storage", handle.id).into(),
            })
        }
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        let id = StorageId::new();
        let counted = size.max(MIN_BUFFER_SIZE);
        self.held.insert(id, counted);
        self.bytes += counted;
        self.peak = self.peak.max(self.bytes);
        self.allocations += 1;
        Ok(StorageHandle::new(id, StorageUtilization { offset: 0, size }))
    }

    fn dealloc(&mut self, id: StorageId) {
        match self.held.remove(&id) {
            Some(counted) if counted <= self.bytes => self.bytes -= counted,
            _ => {
                self.error.get_or_insert_with(|| {
                    format!("{id} deallocated but not held: the counting would go below zero")
                });
            }
        }
    }

    fn flush(&mut self) {}

    fn bytes_allocated(&self) -> u64 {
        self.bytes
    }
}

/// Relocation's copies: there are no bytes to copy, and nothing runs on a device to wait for.
struct NoCopies;

impl CopyQueue<CountingStorage> for NoCopies {
    fn wait_device(&mut self) -> Result<(), ServerError> {
        Ok(())
    }

    fn copy(&mut self, storage: &mut CountingStorage, copy: &StorageCopy) -> Result<(), IoError> {
        // Both ends must be allocations the storage holds, as a real copy needs.
        storage.get(&copy.source)?;
        storage.get(&copy.target)
    }

    fn wait_copies(&mut self) -> Result<(), ServerError> {
        Ok(())
    }
}

/// The device properties cubecl-wgpu derives from `limits` (its `runtime.rs`), no capacity.
fn wgpu_properties(limits: &wgpu::Limits) -> MemoryDeviceProperties {
    MemoryDeviceProperties::new(
        limits.max_storage_buffer_binding_size.min(limits.max_buffer_size),
        u64::from(limits.min_uniform_buffer_offset_alignment.max(limits.min_storage_buffer_offset_alignment)),
    )
}

/// The server's `relocate_when_wanted`, for one memory.
fn relocate_when_wanted(memory: &mut MemoryManagement<CountingStorage>, failures: &mut ErrorGraph) {
    let need = memory.relocation_need();
    if need == RelocationNeed::Nothing {
        return;
    }
    let allocated = memory.bytes_allocated();
    if let Some(reason) = need.reason(|| allocated) {
        memory.relocate(&mut NoCopies, reason, failures);
    }
}

/// The server's `reserve` with no graph recording: relocate when wanted, reserve (which runs
/// the periodic cleanup), and on a refusal that reclaiming may cure, reclaim once and retry.
fn reserve(
    memory: &mut MemoryManagement<CountingStorage>,
    size: u64,
    failures: &mut ErrorGraph,
) -> Result<ManagedMemoryHandle, IoError> {
    relocate_when_wanted(memory, failures);
    match memory.reserve(size, PageUpdate::Allow, failures) {
        Ok(handle) => Ok(handle),
        Err(err) if !err.may_succeed_after_reclaim() => Err(err),
        Err(err) => {
            match err {
                IoError::PageSizesExhausted { .. } => {
                    if memory.has_outdated() {
                        memory.relocate(&mut NoCopies, RelocationReason::ArenaFull, failures);
                    }
                }
                _ => memory_cleanup(memory, failures),
            }
            memory.reserve(size, PageUpdate::Allow, failures)
        }
    }
}

/// The server's `memory_cleanup` (`empty_cache`): empty the outdated pages, then give back
/// every page nothing uses.
fn memory_cleanup(memory: &mut MemoryManagement<CountingStorage>, failures: &mut ErrorGraph) {
    if memory.has_outdated() {
        memory.relocate(&mut NoCopies, RelocationReason::Explicit, failures);
    }
    memory.cleanup(Cleanup::Explicit, failures);
}

/// Replays `trace` through CubeCL's memory management as cubecl-wgpu configures it by default
/// (see the module's documentation for what is modelled), and says what its storage held.
///
/// # Errors
///
/// [`CubeclError::Refused`] for a request larger than CubeCL's largest page (128 MiB), which
/// it refuses; [`CubeclError::Failed`] for any other refusal, the counting storage
/// deallocating what it does not hold, or a peak below the trace's lower bound (each means the
/// model is wrong, not the trace).
pub fn cubecl_replay(trace: &Trace) -> Result<CubeclReport, CubeclError> {
    let limits = wgpu::Limits::default();
    let properties = wgpu_properties(&limits);
    let largest_page = properties.max_page_size;
    let storage = CountingStorage {
        alignment: properties.alignment as usize,
        held: HashMap::new(),
        bytes: 0,
        peak: 0,
        allocations: 0,
        error: None,
    };
    let mut memory = MemoryManagement::from_configuration(
        storage,
        &properties,
        MemoryConfiguration::default(),
        Arc::new(ServerLogger::default()),
        MemoryManagementOptions::new("Main GPU Memory"),
    );
    let mut failures = ErrorGraph::default();
    let mut live: HashMap<u64, ManagedMemoryHandle> = HashMap::new();
    for (i, (step, event)) in trace.events.iter().enumerate() {
        match event {
            TraceEvent::Alloc { id, size, .. } => {
                // An id allocated again replaces what it held.
                drop(live.remove(id));
                let handle = reserve(&mut memory, *size, &mut failures).map_err(|e| match e {
                    // Only a request past the largest page is CubeCL's to refuse.
                    IoError::BufferTooBig { .. } if *size > largest_page => {
                        CubeclError::Refused { step: *step, size: *size, largest_page }
                    }
                    e => CubeclError::Failed(format!(
                        "CubeCL's pool: step {step} (event {i}): {size} bytes refused ({}), where only a \
                         request past its largest page ({largest_page} bytes) is refused: the model is wrong",
                        e.to_string().lines().next().unwrap_or_default()
                    )),
                })?;
                live.insert(*id, handle);
            }
            TraceEvent::Free { id } => drop(live.remove(id)),
            TraceEvent::EmptyCache => memory_cleanup(&mut memory, &mut failures),
        }
        if let Some(e) = memory.storage().error.take() {
            return Err(CubeclError::Failed(format!("CubeCL's pool: step {step} (event {i}): {e}")));
        }
    }
    drop(live);
    let storage = memory.storage();
    let report = CubeclReport { peak_reserved: storage.peak, allocations: storage.allocations };
    let lower_bound = trace.lower_bound();
    if report.peak_reserved < lower_bound {
        return Err(CubeclError::Failed(format!(
            "CubeCL's pool: held at most {} bytes, below the lower bound {lower_bound}: the counting is wrong",
            report.peak_reserved
        )));
    }
    Ok(report)
}
