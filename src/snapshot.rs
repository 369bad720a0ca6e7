//! [`Snapshot`]: what every device of an allocator holds, and what happened to it, as one
//! documented, versioned JSON document, the same from every backend.
//!
//! # Format (`"format": "devalloc-snapshot"`, `"version": 2`)
//!
//! ```text
//! {
//!   "format": "devalloc-snapshot", "version": 2, "taken_us": 1234,
//!   "devices": [{
//!     "device": "vulkan:0", "name": "llvmpipe ...",
//!     "stats": { "allocated_bytes": .., "reserved_bytes": .., "cached_bytes": .., ... },   // AllocatorStats
//!     "memory_limit": 1048576 | null,
//!     "device_memory": { "total_bytes": .., "free_bytes": .., "backend_allocated_bytes": .., "backend_reserved_bytes": .. } | null,
//!     "live": [{ "addr": "0x2000000000001000", "size": .., "capacity": .., "label": "kv-cache" | null, "block": 17,
//!                "tensors": [{ "label": .., "offset": .., "size": .. }],     // where named, else absent
//!                "segments": [{ "offset": 0, "size": .. }, ..] }],          // several buffers, else absent
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
//! capacity, to_cache), `out_of_memory` (requested, detail), `evict` (bytes: cached memory given
//! back: by the budget, to stay under the memory limit, before retrying after the device ran out,
//! or a split block emptied while a copy still held it), `empty_cache` (bytes), `planned_buffer` (memory_id, addr,
//! size), `release_buffers` (count). Times are microseconds since the process first asked
//! devalloc for the time. Addresses are devalloc's (virtual for host and wgpu, real for CUDA),
//! written as hex strings (`"0x…"`): they pass 2^53, where a JSON number read by JavaScript
//! loses its low bits (version 1 wrote numbers). Readers should ignore fields they do not know;
//! a new version number means a field changed meaning, and [`Snapshot::from_json`] reads this
//! version only.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ptr::DevicePtr;
use crate::stats::AllocatorStats;

/// Addresses as `"0x…"` strings in JSON (see the module docs).
mod hex_addr {
    use serde::{de::Error as _, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(addr: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{addr:#x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let text = String::deserialize(d)?;
        text.strip_prefix("0x")
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
            .ok_or_else(|| D::Error::custom(format!("address {text:?} is not a 0x-prefixed hex u64")))
    }
}

/// The format name every snapshot carries.
pub const FORMAT: &str = "devalloc-snapshot";
/// The version of the format this build writes.
pub const VERSION: u32 = 2;

/// Every device of one or more allocators; see the module docs for the JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`VERSION`] when written by this build.
    pub version: u32,
    /// When it was taken (microseconds, same clock as the events).
    pub taken_us: u64,
    /// One entry per device.
    pub devices: Vec<DeviceSnapshot>,
}

impl Snapshot {
    /// A snapshot of `devices`, stamped with the time now.
    pub fn new(devices: Vec<DeviceSnapshot>) -> Self {
        Snapshot { format: FORMAT.into(), version: VERSION, taken_us: crate::clock::now_us(), devices }
    }

    /// The JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":{:?}}}", e.to_string()))
    }

    /// A snapshot read back from JSON; an error names what does not fit the format.
    pub fn from_json(text: &str) -> Result<Self> {
        let s: Snapshot = serde_json::from_str(text)
            .map_err(|e| Error::invalid_argument(format!("not a devalloc snapshot: {e}")))?;
        if s.format != FORMAT {
            return Err(Error::invalid_argument(format!("not a devalloc snapshot: format {:?}", s.format)));
        }
        if s.version != VERSION {
            return Err(Error::invalid_argument(format!(
                "a devalloc snapshot of version {}: this build reads version {VERSION}",
                s.version
            )));
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
    pub device_memory: Option<MemoryReport>,
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
pub struct MemoryReport {
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

/// A live allocation (in a snapshot, and from `Pool::live_allocations`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveAllocation {
    /// Its address.
    #[serde(with = "hex_addr")]
    pub addr: u64,
    /// Bytes asked for.
    pub size: u64,
    /// Bytes held for it.
    pub capacity: u64,
    /// Its label.
    pub label: Option<String>,
    /// The id of the block that holds it (a block keeps its id while cached and reused; wgpu's
    /// own messages name the buffer `devalloc block <id> (<capacity> bytes)`). On host memory
    /// and CUDA, whose cached blocks are split, several allocations may show one block.
    #[serde(default)]
    pub block: u64,
    /// The tensors inside it, where the program named them (a planned buffer's:
    /// `DeviceAllocator::label_tensors`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensors: Vec<TensorNote>,
    /// The device buffers it lies in, in address order, where it is more than one: an
    /// allocation past one wgpu buffer's limit is several, its segments (empty otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub segments: Vec<SegmentNote>,
}

/// One device buffer of an allocation made of several (see [`LiveAllocation::segments`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentNote {
    /// Where it starts, from the allocation's start.
    pub offset: u64,
    /// Its bytes (the buffer's size: the last one may end past the bytes asked for).
    pub size: u64,
}

/// A named range inside an allocation: a tensor of a planned buffer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorNote {
    /// Its label.
    pub label: String,
    /// Its offset from the allocation's start.
    pub offset: u64,
    /// Its bytes.
    pub size: u64,
}

impl LiveAllocation {
    /// Its address as a [`DevicePtr`].
    pub fn ptr(&self) -> DevicePtr {
        DevicePtr::new(self.addr)
    }
}

/// Cached blocks of one capacity (on host memory and CUDA, also the free ranges of split
/// blocks: together they add up to the cached bytes).
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
    #[serde(with = "hex_addr")]
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
        #[serde(with = "hex_addr")]
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
        #[serde(with = "hex_addr")]
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
    /// The cache given back to make room: under the memory limit, or after the device ran
    /// out of memory (before the one retry).
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
        #[serde(with = "hex_addr")]
        addr: u64,
        /// Its size.
        size: u64,
    },
    /// `release_buffers`.
    ReleaseBuffers {
        /// Planned buffers released.
        count: u64,
    },
    /// The tensors inside a live allocation named (`DeviceAllocator::label_tensors`).
    Tensors {
        /// The allocation's address.
        #[serde(with = "hex_addr")]
        addr: u64,
        /// Its tensors.
        tensors: Vec<TensorNote>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_live(addr: u64) -> Snapshot {
        let dev = DeviceSnapshot {
            device: "cpu:0".into(),
            name: "host".into(),
            stats: AllocatorStats::default(),
            memory_limit: None,
            device_memory: None,
            live: vec![LiveAllocation {
                addr,
                size: 1,
                capacity: 256,
                label: None,
                block: 1,
                tensors: Vec::new(),
                segments: vec![SegmentNote { offset: 0, size: 128 }, SegmentNote { offset: 128, size: 128 }],
            }],
            cached: vec![],
            planned: vec![PlannedBuffer { memory_id: 0, addr, size: 1 }],
            history: None,
        };
        Snapshot::new(vec![dev])
    }

    #[test]
    fn addresses_past_2_pow_53_survive_a_javascript_reader() {
        let addr = (1u64 << 61) | 0x1001; // a JS number would round away the low bits
        let json = one_live(addr).to_json();
        assert!(json.contains(r#""addr":"0x2000000000001001""#), "{json}");
        let back = Snapshot::from_json(&json).unwrap();
        assert_eq!(back.devices[0].live[0].addr, addr);
        assert_eq!(back.devices[0].planned[0].addr, addr);
    }

    #[test]
    fn other_versions_and_bad_addresses_are_refused() {
        let json = one_live(0x1000).to_json();
        assert!(Snapshot::from_json(&json).is_ok());
        let v1 = json.replace(r#""version":2"#, r#""version":1"#);
        assert!(Snapshot::from_json(&v1).unwrap_err().to_string().contains("version 1"));
        let number = json.replacen(r#""addr":"0x1000""#, r#""addr":4096"#, 1);
        assert_ne!(number, json);
        assert!(Snapshot::from_json(&number).is_err());
        let not_hex = json.replacen(r#""addr":"0x1000""#, r#""addr":"0xzz""#, 1);
        assert!(Snapshot::from_json(&not_hex).unwrap_err().to_string().contains("0xzz"));
    }
}
