//! `snapshot`: the snapshot reader (`snapshot::Snapshot::from_json`) on arbitrary bytes, then
//! replay of what it read. It must never panic; an accepted snapshot must write back
//! (`to_json`) as JSON that reads as the same snapshot; and for every device with a history,
//! `replay::Trace::from_history` and `replay::replay` on a fresh `HostAllocator` under a
//! 1 MiB memory limit (so a hostile history cannot eat memory) must return a report, free
//! everything it allocated, stay under the limit, and, where nothing failed, peak at exactly
//! the trace's lower bound. The PyTorch peer model (`pytorch_replay`) runs the same trace.
#![no_main]

use devalloc::replay::{pytorch_replay, replay, Trace};
use devalloc::snapshot::Snapshot;
use devalloc::{DeviceAllocator, HostAllocator, PoolOptions};
use libfuzzer_sys::fuzz_target;

const LIMIT: u64 = 1 << 20;

fn replay_on_host(trace: &Trace) {
    let options = PoolOptions { memory_limit: Some(LIMIT), ..PoolOptions::default() };
    let host = HostAllocator::with_options(options).expect("valid pool options");
    let report = replay(&host, trace, 0).unwrap_or_else(|e| panic!("replay of a history failed: {e}"));
    let stats = host.stats(0).expect("stats of device 0");
    assert_eq!(stats.live_allocations, 0, "replay left allocations live: {stats:?}");
    assert_eq!(stats.allocated_bytes, 0, "{stats:?}");
    assert!(report.peak_reserved <= LIMIT && stats.peak_reserved_bytes <= LIMIT, "{report:?} {stats:?}");
    assert!(report.peak_live <= report.peak_reserved, "{report:?}");
    if report.failure.is_none() {
        assert_eq!(report.peak_live, trace.lower_bound(), "{report:?}");
    } else {
        assert!(report.peak_live <= trace.lower_bound(), "{report:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(snap) = Snapshot::from_json(&text) else { return };
    let json = snap.to_json();
    let back =
        Snapshot::from_json(&json).unwrap_or_else(|e| panic!("to_json wrote what from_json refuses: {e}"));
    assert_eq!(back, snap, "to_json does not round-trip");
    for dev in &snap.devices {
        let Some(history) = &dev.history else { continue };
        let trace = Trace::from_history(history);
        replay_on_host(&trace);
        if trace.events.len() <= 64 {
            if let Some(twice) = trace.repeated(2) {
                replay_on_host(&twice);
            }
        }
        let _ = pytorch_replay(&trace, Some(8 * LIMIT));
    }
});
