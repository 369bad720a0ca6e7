//! Opt-in recording of what happens in a pool: a ring of the newest events, and copy counts.
//! Off by default; off, each event costs one relaxed atomic load.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use super::{lock, Pool};
use crate::clock::now_us;
use crate::snapshot::{CopyCounts, Event, EventKind, HistorySnapshot};
use crate::storage::Storage;

/// The ring of events and the copy counts of one pool.
pub(crate) struct History {
    capacity: usize,
    events: VecDeque<Event>,
    next_seq: u64,
    dropped: u64,
    copies: CopyCounts,
    backtraces: bool,
}

/// A copy's direction, for the counts.
#[derive(Clone, Copy)]
pub(crate) enum CopyKind {
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
}

impl<S: Storage> Pool<S> {
    /// Starts recording the newest `events` events (with a backtrace of each allocation when
    /// `backtraces`, on native: slow), or with 0 stops and forgets what was recorded.
    /// Restarting keeps nothing from before.
    pub fn record_history(&self, events: usize, backtraces: bool) {
        let mut h = lock(&self.history);
        *h = (events > 0).then(|| History {
            capacity: events,
            events: VecDeque::with_capacity(events.min(4096)),
            next_seq: 0,
            dropped: 0,
            copies: CopyCounts::default(),
            backtraces,
        });
        self.recording.store(events > 0, Ordering::Release);
    }

    /// Records the event `make` builds, if recording is on (`make` runs only then).
    pub(crate) fn note(&self, make: impl FnOnce() -> EventKind) {
        if !self.recording.load(Ordering::Relaxed) {
            return;
        }
        let kind = make();
        let time_us = now_us();
        let mut guard = lock(&self.history);
        let Some(h) = guard.as_mut() else { return };
        let kind = match kind {
            EventKind::Alloc { addr, size, capacity, label, from_cache, backtrace: None } if h.backtraces => {
                EventKind::Alloc { addr, size, capacity, label, from_cache, backtrace: backtrace() }
            }
            k => k,
        };
        if h.events.len() == h.capacity {
            h.events.pop_front();
            h.dropped += 1;
        }
        h.events.push_back(Event { seq: h.next_seq, time_us, kind });
        h.next_seq += 1;
    }

    /// Counts a copy of `bytes`, if recording is on.
    pub(crate) fn note_copy(&self, kind: CopyKind, bytes: u64) {
        if !self.recording.load(Ordering::Relaxed) {
            return;
        }
        if let Some(h) = lock(&self.history).as_mut() {
            let c = match kind {
                CopyKind::HostToDevice => &mut h.copies.host_to_device,
                CopyKind::DeviceToHost => &mut h.copies.device_to_host,
                CopyKind::DeviceToDevice => &mut h.copies.device_to_device,
            };
            c.count += 1;
            c.bytes += bytes;
        }
    }

    /// The recorded history, if recording is on.
    pub(crate) fn history_snapshot(&self) -> Option<HistorySnapshot> {
        lock(&self.history).as_ref().map(|h| HistorySnapshot {
            capacity: h.capacity as u64,
            dropped: h.dropped,
            copies: h.copies.clone(),
            events: h.events.iter().cloned().collect(),
        })
    }
}

/// The caller's stack, where the platform can walk it. In wasm it cannot (the standard
/// library's backtrace there is "unsupported"), and linking it would add its symbol demangler
/// (about 25 KB) to every page: the event says so instead.
#[cfg(not(target_arch = "wasm32"))]
fn backtrace() -> Option<String> {
    Some(std::backtrace::Backtrace::force_capture().to_string())
}

#[cfg(target_arch = "wasm32")]
fn backtrace() -> Option<String> {
    Some("backtraces are not available in wasm".into())
}
