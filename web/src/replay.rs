//! "Would it fit?" in the page: a device's recorded history from a snapshot, replayed under a
//! memory limit through devalloc's pool on host memory (`devalloc::replay`), as
//! `cargo run --example replay` does natively.
use devalloc::replay::{replay, Trace};
use devalloc::snapshot::Snapshot;
use devalloc::{HostAllocator, PoolOptions};
use serde::Serialize;
use wasm_bindgen::prelude::*;

use crate::args::{count, error};
use crate::{js, to_js};

/// Where a replay first failed.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FailureJs {
    /// The history event's number (`seq`: the viewer's x axis).
    step: u64,
    /// Its position among the replayed allocations and frees.
    event: usize,
    /// The allocation that failed, as the history recorded it.
    size: Option<u64>,
    label: Option<String>,
    /// devalloc's error.
    error: String,
}

/// What a replay saw.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReplayJs {
    device: String,
    limit: Option<u64>,
    /// Allocations, frees and cache releases replayed (the history's other events are not).
    events: usize,
    /// The most bytes live at once in the whole history: no allocator can do with less.
    lower_bound: u64,
    /// Frees of allocations made before the history's first event (left out).
    orphan_frees: u64,
    peak_live: u64,
    peak_reserved: u64,
    device_allocations: u64,
    cache_hits: u64,
    steady_after: Option<u64>,
    failure: Option<FailureJs>,
}

/// Replays the history of device `device` (its position in the snapshot) of the snapshot
/// `json` under `limit` bytes (`null` or `undefined`: no limit), through devalloc's pool on
/// host memory with caching on (as every built-in allocator runs by default). Resolves the
/// peak live and reserved bytes, the device allocations, and the first failing event if one
/// failed.
#[wasm_bindgen]
pub fn replay_snapshot(json: &str, device: JsValue, limit: JsValue) -> Result<JsValue, JsValue> {
    let snap = Snapshot::from_json(json).map_err(js)?;
    let at = count(&device, "device", "devices")?;
    let Some(dev) = snap.devices.get(at) else {
        return Err(error(format!("device must be below {}, got {at}", snap.devices.len())));
    };
    let Some(history) = dev.history.as_ref() else {
        return Err(error(format!("{} has no recorded history to replay", dev.device)));
    };
    let limit = if limit.is_undefined() || limit.is_null() {
        None
    } else {
        Some(count(&limit, "limit", "bytes")? as u64)
    };
    let trace = Trace::from_history(history);
    let host =
        HostAllocator::with_options(PoolOptions { caching: true, ..PoolOptions::default() }).map_err(js)?;
    host.set_memory_limit(limit, 0).map_err(js)?;
    let report = replay(&host, &trace, 0).map_err(js)?;
    let failure = report.failure.map(|f| {
        let (size, label) = match trace.events.get(f.event) {
            Some((_, devalloc::replay::TraceEvent::Alloc { size, label, .. })) => {
                (Some(*size), label.clone())
            }
            _ => (None, None),
        };
        FailureJs { step: f.step, event: f.event, size, label, error: f.error.to_string() }
    });
    to_js(&ReplayJs {
        device: dev.device.clone(),
        limit,
        events: trace.events.len(),
        lower_bound: trace.lower_bound(),
        orphan_frees: trace.orphan_frees,
        peak_live: report.peak_live,
        peak_reserved: report.peak_reserved,
        device_allocations: report.device_allocations,
        cache_hits: report.cache_hits,
        steady_after: report.steady_after,
        failure,
    })
}
