//! "Would it fit?": an allocation history replayed through a real allocator, under a memory
//! limit or none, and the smallest limit under which all of it fits.
//!
//! A [`Trace`] is a history of allocations and frees in order, each at a step: a devalloc
//! snapshot's recorded history ([`Trace::from_history`], one step per event) or buffers with
//! lifetimes ([`Trace::from_tensors`], e.g. MiniMalloc's instances: each allocated at its first
//! step and freed after its last, frees of a step before its allocations). [`replay`] runs it
//! through an allocator of devalloc's (any [`Pooled`] one: host memory, wgpu, CUDA) and says
//! what the allocator held and did; [`find_min_limit`] bisects the memory limit. The lower
//! bound of a trace is the most bytes live at once: no allocator can do with less.
//!
//! The peer: [`pytorch_replay`] and [`pytorch_min_limit`] run the same trace through a model
//! of PyTorch's CUDA caching allocator with its default settings (what the model follows is
//! on [`pytorch_replay`]), so that a replay says how devalloc's pool compares with the policy
//! most ML users know.

use std::collections::HashMap;

use crate::allocator::{DeviceAllocator, DEFAULT_ALIGNMENT};
use crate::device::DeviceIndex;
use crate::error::{Error, Result};
use crate::plan::TensorLife;
use crate::pooled_allocator::Pooled;
use crate::ptr::DevicePtr;
use crate::snapshot::{EventKind, HistorySnapshot};
use crate::storage::Storage;

mod bounds;
mod pytorch;
pub use pytorch::{pytorch_min_limit, pytorch_replay, PyTorchReport};

/// One thing a trace does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceEvent {
    /// Allocate `size` bytes, known as `id` to later frees.
    Alloc {
        /// Its id in the trace.
        id: u64,
        /// Bytes.
        size: u64,
        /// A label for people, if the history had one.
        label: Option<String>,
    },
    /// Free what `id` allocated.
    Free {
        /// The id of the allocation.
        id: u64,
    },
    /// Give the cache back (the program called `empty_cache`).
    EmptyCache,
}

/// An allocation history: events in order, each with its step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// The events and the step of each.
    pub events: Vec<(u64, TraceEvent)>,
    /// Frees of allocations the trace never made (a history whose oldest events were dropped).
    pub orphan_frees: u64,
}

impl Trace {
    /// Each tensor allocated at its first step and freed after its last; at each step the
    /// frees come before the allocations. `labels`, if given, name the tensors (one per tensor).
    pub fn from_tensors(tensors: &[TensorLife], labels: Option<&[String]>) -> Trace {
        let mut events: Vec<(u64, u8, u64, TraceEvent)> = Vec::with_capacity(tensors.len() * 2);
        for (i, t) in tensors.iter().enumerate() {
            let id = i as u64;
            let label = labels.and_then(|l| l.get(i)).cloned();
            events.push((t.first, 1, id, TraceEvent::Alloc { id, size: t.size, label }));
            events.push((t.last.saturating_add(1), 0, id, TraceEvent::Free { id }));
        }
        events.sort_by_key(|(step, order, id, _)| (*step, *order, *id));
        Trace { events: events.into_iter().map(|(s, _, _, e)| (s, e)).collect(), orphan_frees: 0 }
    }

    /// A device's recorded history (its allocations, frees and `empty_cache` calls; each event
    /// is a step). Frees of addresses the history never saw allocated (its oldest events were
    /// dropped) are counted in `orphan_frees` and left out.
    pub fn from_history(history: &HistorySnapshot) -> Trace {
        let mut trace = Trace::default();
        let mut live: HashMap<u64, u64> = HashMap::new();
        for (n, e) in history.events.iter().enumerate() {
            let id = n as u64;
            match &e.kind {
                EventKind::Alloc { addr, size, label, .. } => {
                    live.insert(*addr, id);
                    trace.events.push((e.seq, TraceEvent::Alloc { id, size: *size, label: label.clone() }));
                }
                EventKind::Free { addr, .. } => match live.remove(addr) {
                    Some(id) => trace.events.push((e.seq, TraceEvent::Free { id })),
                    None => trace.orphan_frees += 1,
                },
                EventKind::EmptyCache { .. } => trace.events.push((e.seq, TraceEvent::EmptyCache)),
                _ => {}
            }
        }
        trace
    }

    /// This trace `times` times in a row (a training or serving loop that repeats it): each
    /// repetition's ids and steps follow the last one's. An allocation the trace never frees
    /// stays live through the repetitions after it. `None` when the ids or steps would not fit
    /// in 64 bits.
    pub fn repeated(&self, times: u64) -> Option<Trace> {
        let id = |e: &TraceEvent| match e {
            TraceEvent::Alloc { id, .. } | TraceEvent::Free { id } => Some(*id),
            TraceEvent::EmptyCache => None,
        };
        let ids =
            self.events.iter().filter_map(|(_, e)| id(e)).max().map_or(Some(0), |m| m.checked_add(1))?;
        let steps = self.events.iter().map(|(s, _)| *s).max().map_or(Some(0), |m| m.checked_add(1))?;
        let mut events = Vec::with_capacity(self.events.len().saturating_mul(times as usize));
        for r in 0..times {
            let (id_base, step_base) = (ids.checked_mul(r)?, steps.checked_mul(r)?);
            for (step, e) in &self.events {
                let step = step.checked_add(step_base)?;
                events.push((
                    step,
                    match e {
                        TraceEvent::Alloc { id, size, label } => TraceEvent::Alloc {
                            id: id.checked_add(id_base)?,
                            size: *size,
                            label: label.clone(),
                        },
                        TraceEvent::Free { id } => TraceEvent::Free { id: id.checked_add(id_base)? },
                        TraceEvent::EmptyCache => TraceEvent::EmptyCache,
                    },
                ));
            }
        }
        Some(Trace { events, orphan_frees: self.orphan_frees.checked_mul(times)? })
    }

    /// The most bytes live at once (`u64::MAX` if that does not fit in 64 bits).
    pub fn lower_bound(&self) -> u64 {
        let mut sizes = HashMap::new();
        let (mut live, mut peak) = (0u128, 0u128);
        for (_, e) in &self.events {
            match e {
                TraceEvent::Alloc { id, size, .. } => {
                    // An id allocated again replaces what it held.
                    live -= sizes.insert(*id, u128::from(*size)).unwrap_or(0);
                    live += u128::from(*size);
                    peak = peak.max(live);
                }
                TraceEvent::Free { id } => live -= sizes.remove(id).unwrap_or(0),
                TraceEvent::EmptyCache => {}
            }
        }
        u64::try_from(peak).unwrap_or(u64::MAX)
    }
}

/// Where a replay stopped.
#[derive(Debug)]
pub struct ReplayFailure {
    /// The step of the event that failed.
    pub step: u64,
    /// Its position among the trace's events.
    pub event: usize,
    /// The allocator's error (out of memory, under a limit).
    pub error: Error,
}

/// What a replay saw.
#[derive(Debug, Default)]
pub struct ReplayReport {
    /// The most bytes live at once (as replayed: up to a failure).
    pub peak_live: u64,
    /// The most bytes devalloc held from the device (live and cached).
    pub peak_reserved: u64,
    /// The most the backend itself said it held, where it says (wgpu's allocator report on
    /// Vulkan, DX12, Metal), read whenever devalloc's reserved reached a new peak.
    pub backend_peak_reserved: Option<u64>,
    /// Blocks asked of the device (cache misses).
    pub device_allocations: u64,
    /// Allocations served from the cache.
    pub cache_hits: u64,
    /// The step of the last device allocation: after it, none happens.
    pub steady_after: Option<u64>,
    /// The first event that failed, if one did (the replay stops there).
    pub failure: Option<ReplayFailure>,
}

/// Replays `trace` on device `index` of `alloc` (a fresh allocator, or one whose stats count
/// from zero: the report reads them), under whatever memory limit it has. Stops at the first
/// failure, which it reports; every allocation it made is freed before it returns, on every
/// path. A trace that allocates an id that is still live is an [`Error::InvalidArgument`].
pub fn replay<T: Pooled>(alloc: &T, trace: &Trace, index: DeviceIndex) -> Result<ReplayReport> {
    let mut ptrs: HashMap<u64, DevicePtr> = HashMap::new();
    let run = replay_events(alloc, trace, index, &mut ptrs);
    // Whatever happened, what the replay allocated goes back.
    let mut freed = Ok(());
    for (_, p) in ptrs {
        if let Err(e) = alloc.deallocate(p, index) {
            freed = freed.and(Err(e));
        }
    }
    let mut report = run?;
    freed?;
    let s = alloc.pooled().pool(index)?.stats();
    report.device_allocations = s.cache_misses;
    report.cache_hits = s.cache_hits;
    Ok(report)
}

/// The events of [`replay`], leaving what is live in `ptrs`.
fn replay_events<T: Pooled>(
    alloc: &T,
    trace: &Trace,
    index: DeviceIndex,
    ptrs: &mut HashMap<u64, DevicePtr>,
) -> Result<ReplayReport> {
    let pool = alloc.pooled().pool(index)?;
    let mut report = ReplayReport::default();
    let mut misses = pool.stats().cache_misses;
    for (n, (step, e)) in trace.events.iter().enumerate() {
        match e {
            TraceEvent::Alloc { id, size, label } => {
                if ptrs.contains_key(id) {
                    return Err(Error::invalid_argument(format!(
                        "the trace allocates id {id} again at step {step} (event {n}) while it is live"
                    )));
                }
                let nbytes =
                    usize::try_from(*size).map_err(|_| Error::invalid_argument("a size past usize"))?;
                let made = match label {
                    Some(l) => alloc.allocate_labeled(nbytes, index, DEFAULT_ALIGNMENT, l),
                    None => alloc.allocate(nbytes, index, DEFAULT_ALIGNMENT),
                };
                match made {
                    Ok(p) => {
                        ptrs.insert(*id, p);
                    }
                    Err(error) => {
                        report.failure = Some(ReplayFailure { step: *step, event: n, error });
                        break;
                    }
                }
                let s = pool.stats();
                if s.cache_misses > misses {
                    misses = s.cache_misses;
                    report.steady_after = Some(*step);
                }
                report.peak_live = report.peak_live.max(s.allocated_bytes);
                if s.reserved_bytes > report.peak_reserved {
                    report.peak_reserved = s.reserved_bytes;
                    let backend = pool.storage().device_memory().and_then(|m| m.backend_reserved_bytes);
                    if let Some(b) = backend {
                        report.backend_peak_reserved = Some(report.backend_peak_reserved.unwrap_or(0).max(b));
                    }
                }
            }
            TraceEvent::Free { id } => {
                if let Some(p) = ptrs.remove(id) {
                    alloc.deallocate(p, index)?;
                }
            }
            TraceEvent::EmptyCache => {
                pool.empty_cache();
            }
        }
    }
    Ok(report)
}

/// The smallest memory limit (to within `lower_bound / 1000`, at least 256 bytes) under which
/// all of `trace` replays on a fresh allocator from `make` without an error; bisected between
/// the trace's lower bound and the peak reserved of an unlimited replay. `None` when even the
/// unlimited replay fails. The bisection takes a limit to fit whenever a smaller one does, which
/// a caching policy need not honour on every trace (see [`pytorch_min_limit`]): what is
/// returned always fits.
pub fn find_min_limit<T: Pooled>(
    mut make: impl FnMut() -> Result<T>,
    trace: &Trace,
    index: DeviceIndex,
) -> Result<Option<u64>> {
    let free_run = replay(&make()?, trace, index)?;
    if free_run.failure.is_some() {
        return Ok(None);
    }
    let fits = |limit: u64| -> Result<bool> {
        let a = make()?;
        a.pooled().set_memory_limit(Some(limit), index)?;
        Ok(replay(&a, trace, index)?.failure.is_none())
    };
    bisect_limit(trace.lower_bound(), free_run.peak_reserved, fits).map(Some)
}

/// The smallest limit (to within `lower_bound / 1000`, at least 256 bytes) for which `fits`
/// holds, searched from `lower_bound` up, starting from `unlimited_peak` (what the allocator
/// held without a limit, where it must fit unless a limit makes caching want more).
fn bisect_limit(
    lower_bound: u64,
    unlimited_peak: u64,
    mut fits: impl FnMut(u64) -> Result<bool>,
) -> Result<u64> {
    let (mut lo, mut hi) = (lower_bound.saturating_sub(1), unlimited_peak.max(1));
    // Caching can want more than its unlimited peak once the limit makes it evict: widen.
    while !fits(hi)? {
        if hi == u64::MAX {
            return Err(Error::invalid_argument("no memory limit lets the trace replay"));
        }
        lo = hi;
        hi = hi.saturating_mul(2);
    }
    let step = (lower_bound / 1000).max(256);
    while hi - lo > step {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{HostAllocator, PoolOptions};

    fn cached() -> Result<HostAllocator> {
        HostAllocator::with_options(PoolOptions { caching: true, ..PoolOptions::default() })
    }

    #[test]
    fn tensors_become_allocations_and_frees_in_step_order() {
        let t = [TensorLife { size: 10, first: 0, last: 1 }, TensorLife { size: 20, first: 2, last: 3 }];
        let trace = Trace::from_tensors(&t, None);
        let kinds: Vec<_> =
            trace.events.iter().map(|(s, e)| (*s, matches!(e, TraceEvent::Alloc { .. }))).collect();
        // At step 2 the first tensor's free comes before the second's allocation.
        assert_eq!(kinds, [(0, true), (2, false), (2, true), (4, false)]);
        assert_eq!(trace.lower_bound(), 20);
    }

    #[test]
    fn a_repeated_trace_follows_itself_with_new_ids_and_steps() {
        let t = [TensorLife { size: 10, first: 0, last: 1 }, TensorLife { size: 20, first: 1, last: 2 }];
        let trace = Trace::from_tensors(&t, None);
        let twice = trace.repeated(2).unwrap();
        assert_eq!(twice.events.len(), 8);
        assert_eq!(twice.events[..4], trace.events[..]);
        let (step, e) = &twice.events[4];
        assert_eq!((*step, e), (4, &TraceEvent::Alloc { id: 2, size: 10, label: None }));
        assert_eq!(twice.lower_bound(), trace.lower_bound(), "each repetition frees what it made");
        assert_eq!(trace.repeated(0).unwrap().events, []);
        let huge = Trace { events: vec![(u64::MAX / 2, TraceEvent::Free { id: 0 })], orphan_frees: 0 };
        assert!(huge.repeated(3).is_none(), "steps past 64 bits");
        let leak =
            Trace { events: vec![(0, TraceEvent::Alloc { id: 0, size: 5, label: None })], orphan_frees: 0 };
        assert_eq!(leak.repeated(3).unwrap().lower_bound(), 15, "what is never freed stays live");
    }

    #[test]
    fn a_replay_reports_peaks_and_the_smallest_limit_is_found() {
        // Three steps of the same two shapes: one device allocation each, then none.
        let mut tensors = Vec::new();
        for step in 0..3 {
            tensors.push(TensorLife { size: 3000, first: step * 2, last: step * 2 + 1 });
            tensors.push(TensorLife { size: 1000, first: step * 2 + 1, last: step * 2 + 1 });
        }
        let trace = Trace::from_tensors(&tensors, None);
        assert_eq!(trace.lower_bound(), 4000);
        let r = replay(&cached().unwrap(), &trace, 0).unwrap();
        assert!(r.failure.is_none());
        assert_eq!((r.peak_live, r.device_allocations, r.cache_hits), (4000, 2, 4));
        assert_eq!(r.steady_after, Some(1));
        let limit = find_min_limit(cached, &trace, 0).unwrap().unwrap();
        assert!((4000..=4000 + 256).contains(&limit), "{limit}");
        // Under a limit below the lower bound the replay stops, and says where.
        let a = cached().unwrap();
        a.set_memory_limit(Some(3500), 0).unwrap();
        let r = replay(&a, &trace, 0).unwrap();
        let f = r.failure.expect("fails");
        assert!(matches!(f.error, Error::OutOfMemory { .. }), "{:?}", f.error);
        assert_eq!(f.step, 1);
        assert_eq!(a.stats(0).unwrap().live_allocations, 0, "the replay freed what it made");
    }

    #[test]
    fn a_trace_that_allocates_a_live_id_again_is_refused_and_leaves_nothing_behind() {
        let alloc = |id, size| (0, TraceEvent::Alloc { id, size, label: None });
        let trace = Trace {
            events: vec![alloc(1, 1000), alloc(1, 2000), (1, TraceEvent::Free { id: 1 })],
            orphan_frees: 0,
        };
        let a = cached().unwrap();
        let e = replay(&a, &trace, 0).unwrap_err();
        assert!(e.to_string().contains("allocates id 1 again"), "{e}");
        assert_eq!(a.stats(0).unwrap().live_allocations, 0);
        // And a lower bound past 64 bits saturates instead of wrapping.
        let huge =
            [TensorLife { size: u64::MAX, first: 0, last: 1 }, TensorLife { size: 10, first: 1, last: 2 }];
        assert_eq!(Trace::from_tensors(&huge, None).lower_bound(), u64::MAX);
    }
}
