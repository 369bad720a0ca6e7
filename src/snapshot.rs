//! [`Snapshot`]: what every device of an allocator holds, and what happened to it, as one
//! documented, versioned JSON document, the same from every backend.
//!
//! # Format (`"format": "devalloc-snapshot"`, `"version": 1`)
//!
//! ```text
//! {
//!   "format": "devalloc-snapshot", "version": 1, "taken_us": 1234,
//!   "devices": [{
//!     "device": "vulkan:0", "name": "llvmpipe ...",
//!     "stats": { "allocated_bytes": .., "reserved_bytes": .., "cached_bytes": .., ... },   // AllocatorStats
//!     "memory_limit": 1048576 | null,
//!     "device_memory": { "total_bytes": .., "free_bytes": .., "backend_allocated_bytes": .., "backend_reserved_bytes": .. } | null,
//!     "live": [{ "addr": .., "size": .., "capacity": .., "label": "kv-cache" | null }],
//!     "cached": [{ "capacity": .., "count": .. }],
//!     "planned": [{ "memory_id": 0, "addr": .., "size": .. }],
//!     "history": null | {
//!       "capacity": 4096, "dropped": 0,
//!       "copies": { "host_to_device": { "count": .., "bytes": .. }, "device_to_host": {..}, "device_to_device": {..} },
//!       "events": [{ "seq": 0, "time_us": 12, "kind": "alloc", "addr": .., "size": .., "capacity": .., "label": .., "from_cache": false, "backtrace": null }, ...]
//!     }
//!   }]
//! }
//! ```
//!
//! Event kinds: `alloc` (addr, size, capacity, label, from_cache, backtrace), `free` (addr, size,
//! capacity, to_cache), `out_of_memory` (requested, detail), `evict` (bytes: the cache emptied
//! to stay under the memory limit), `empty_cache` (bytes), `planned_buffer` (memory_id, addr,
//! size), `release_buffers` (count). Times are microseconds since the process first asked
//! devalloc for the time. Addresses are devalloc's (virtual for host and wgpu, real for CUDA).
//! Readers should ignore fields they do not know; a new version number means a field changed
//! meaning.
#![deny(unsafe_code)]

use serde::{Deserialize, Serialize};

use crate::allocator::AllocatorStats;
use crate::error::{Error, Result};

/// The format name every snapshot carries.
pub const SNAPSHOT_FORMAT: &str = "devalloc-snapshot";
/// The version of the format this build writes.
pub const SNAPSHOT_VERSION: u32 = 1;

/// Every device of one or more allocators; see the module docs for the JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Always [`SNAPSHOT_FORMAT`].
    pub format: String,
    /// [`SNAPSHOT_VERSION`] when written by this build.
    pub version: u32,
    /// When it was taken (microseconds, same clock as the events).
    pub taken_us: u64,
    /// One entry per device.
    pub devices: Vec<DeviceSnapshot>,
}

impl Snapshot {
    /// An empty snapshot taken now.
    pub fn new(devices: Vec<DeviceSnapshot>) -> Self {
        Snapshot {
            format: SNAPSHOT_FORMAT.into(),
            version: SNAPSHOT_VERSION,
            taken_us: crate::pool::now_us(),
            devices,
        }
    }

    /// The JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":{:?}}}", e.to_string()))
    }

    /// A snapshot read back from JSON; an error names what does not fit the format.
    pub fn from_json(text: &str) -> Result<Self> {
        let s: Snapshot = serde_json::from_str(text)
            .map_err(|e| Error::invalid_argument(format!("not a devalloc snapshot: {e}")))?;
        if s.format != SNAPSHOT_FORMAT {
            return Err(Error::invalid_argument(format!("not a devalloc snapshot: format {:?}", s.format)));
        }
        Ok(s)
    }

    /// Writes the JSON to `path` (native).
    #[cfg(native)]
    pub fn write(&self, path: impl AsRef<std::path::Path>) -> std::io::Result<()> {
        std::fs::write(path, self.to_json())
    }
}

/// One device: stats, live allocations, the cache, planned buffers, and its history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceSnapshot {
    /// `type:index`, e.g. `cuda:0`.
    pub device: String,
    /// The adapter's or GPU's name.
    pub name: String,
    /// The allocator's stats.
    pub stats: AllocatorStats,
    /// The memory limit, if one is set.
    pub memory_limit: Option<u64>,
    /// The device's own numbers, where the backend can say them.
    pub device_memory: Option<DeviceMemory>,
    /// Live allocations, in address order.
    pub live: Vec<LiveAllocation>,
    /// Cached blocks by capacity.
    pub cached: Vec<CachedBlocks>,
    /// Planned buffers by memory id.
    pub planned: Vec<PlannedBuffer>,
    /// The recorded history, if recording is on.
    pub history: Option<HistorySnapshot>,
}

/// What the device (not devalloc) says about its memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceMemory {
    /// The device's memory size (CUDA).
    pub total_bytes: Option<u64>,
    /// Free on the device now, every process counted (CUDA `cuMemGetInfo`).
    pub free_bytes: Option<u64>,
    /// Bytes the backend's own allocator has handed out (wgpu's allocator report, where the
    /// backend has one).
    pub backend_allocated_bytes: Option<u64>,
    /// Bytes the backend's own allocator holds in memory blocks (wgpu's allocator report).
    pub backend_reserved_bytes: Option<u64>,
}

/// A live allocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveAllocation {
    /// Its address.
    pub addr: u64,
    /// Bytes asked for.
    pub size: u64,
    /// Bytes held for it.
    pub capacity: u64,
    /// Its label.
    pub label: Option<String>,
}

/// Cached blocks of one capacity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedBlocks {
    /// Their capacity.
    pub capacity: u64,
    /// How many.
    pub count: u64,
}

/// A planned buffer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedBuffer {
    /// Its memory id.
    pub memory_id: u32,
    /// Its base address.
    pub addr: u64,
    /// Its size.
    pub size: u64,
}

/// The recorded history of one device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HistorySnapshot {
    /// Most events kept (older ones are dropped first).
    pub capacity: u64,
    /// Events dropped because the ring was full.
    pub dropped: u64,
    /// Copies counted since recording started.
    pub copies: CopyCounts,
    /// The newest events, oldest first.
    pub events: Vec<Event>,
}

/// Copies by direction.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyCounts {
    /// Host to device.
    pub host_to_device: Count,
    /// Device to host.
    pub device_to_host: Count,
    /// Device to device.
    pub device_to_device: Count,
}

/// A count of copies and their bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Count {
    /// Copies.
    pub count: u64,
    /// Bytes.
    pub bytes: u64,
}

/// One recorded event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Its number, counting from 0 when recording started.
    pub seq: u64,
    /// When (microseconds).
    pub time_us: u64,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What an [`Event`] records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// An allocation.
    Alloc {
        /// Its address.
        addr: u64,
        /// Bytes asked for.
        size: u64,
        /// Bytes held.
        capacity: u64,
        /// Its label.
        label: Option<String>,
        /// Whether a cached block served it (a cache hit).
        from_cache: bool,
        /// Where it was made (native, when backtraces are recorded).
        backtrace: Option<String>,
    },
    /// A free.
    Free {
        /// The address.
        addr: u64,
        /// Bytes it had asked for.
        size: u64,
        /// Bytes it held.
        capacity: u64,
        /// Whether its block went to the cache (else back to the device).
        to_cache: bool,
    },
    /// A refused allocation: out of memory.
    OutOfMemory {
        /// Bytes asked for.
        requested: u64,
        /// What the error said.
        detail: String,
    },
    /// The cache emptied to make room under the memory limit.
    Evict {
        /// Bytes given back.
        bytes: u64,
    },
    /// `empty_cache`.
    EmptyCache {
        /// Bytes given back.
        bytes: u64,
    },
    /// A planned buffer made (after its `alloc` event).
    PlannedBuffer {
        /// Its memory id.
        memory_id: u32,
        /// Its address.
        addr: u64,
        /// Its size.
        size: u64,
    },
    /// `release_buffers`.
    ReleaseBuffers {
        /// Planned buffers released.
        count: u64,
    },
}
