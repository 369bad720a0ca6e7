//! When a test may take `OutOfMemory` for an answer: only under a memory limit, and only where
//! the request really would pass that limit. Alone ([`refused_alone`]) that is checked at once,
//! against the stats before the call and again with the cache given back; among threads
//! ([`Gate`]) every refusal is judged with the other threads stopped, where a request that fits
//! must then be served. Counted ([`Refusals`]), so that a test can say how many it took.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use devalloc::{AllocatorStats, DeviceAllocator, DevicePtr, Error};

/// Whether `e` is the pool's refusal under its memory limit (not the device's, nor the address
/// window's: nothing in these tests makes those right).
fn is_limit_refusal(e: &Error) -> bool {
    matches!(e, Error::OutOfMemory { detail, .. } if detail.contains("memory limit"))
}

/// An allocation of `size` bytes that `a` refused with `e`, in a test with one thread, whose
/// stats were `before` the call and whose memory limit is `limit`: panics unless it was the
/// limit's refusal of a request that would pass it, as held before the call (the pool takes a
/// fresh block whenever the exact size fits beside what it holds) and as held once every
/// cached block is given back (the pool gives back what makes room before it refuses). The
/// second check gives the cache back (`empty_cache`). Host memory's sizes are exact (a granule
/// of one byte).
pub fn refused_alone<A: DeviceAllocator + ?Sized>(
    a: &A,
    e: &Error,
    size: usize,
    limit: Option<u64>,
    before: &AllocatorStats,
) {
    let Some(limit) = limit else { panic!("allocate({size}) was refused with no memory limit set: {e}") };
    assert!(is_limit_refusal(e), "allocate({size}) under a limit of {limit}: {e}");
    assert!(
        before.reserved_bytes + size as u64 > limit,
        "allocate({size}) was refused with room under the limit of {limit}: {before:?}: {e}"
    );
    a.empty_cache();
    let s = a.stats(0).unwrap();
    assert!(
        s.reserved_bytes + size as u64 > limit,
        "allocate({size}) was refused although it fits under the limit of {limit} with the cache given back: \
         {s:?}: {e}"
    );
}

/// Valid allocations made and refused, counted from any thread.
#[derive(Default)]
pub struct Refusals {
    made: AtomicU64,
    refused: AtomicU64,
    retried: AtomicU64,
}

impl Refusals {
    /// Counts an allocation made.
    pub fn made(&self) {
        self.made.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a refusal judged right.
    pub fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// (made, refused, refused at first and served once the other threads had stopped).
    pub fn counts(&self) -> (u64, u64, u64) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        (get(&self.made), get(&self.refused), get(&self.retried))
    }
}

/// Threads that allocate against a memory limit: each call runs beside the others under a
/// shared lock ([`Gate::call`]); a refusal is judged under the exclusive lock, every other
/// thread stopped between calls ([`Gate::refused`]).
#[derive(Default)]
pub struct Gate {
    lock: RwLock<()>,
    /// What was made and refused.
    pub count: Refusals,
}

impl Gate {
    /// Runs `f` (one call to the allocator) beside the other threads' calls.
    pub fn call<T>(&self, f: impl FnOnce() -> T) -> T {
        let _shared = self.lock.read().unwrap_or_else(|e| e.into_inner());
        f()
    }

    /// `a` refused `size` bytes aligned to `align` with `e`, under a memory limit of `limit`.
    /// With the other threads stopped and the cache given back, the request either still would
    /// pass the limit (the refusal stands: `None`), or fits, and must then be served (`Some`:
    /// the caller owns it). Panics if it is refused then, or if `e` is not the limit's refusal.
    pub fn refused<A: DeviceAllocator + ?Sized>(
        &self,
        a: &A,
        e: &Error,
        size: usize,
        align: usize,
        limit: u64,
    ) -> Option<DevicePtr> {
        assert!(is_limit_refusal(e), "allocate({size}) under a limit of {limit}: {e}");
        let _alone = self.lock.write().unwrap_or_else(|e| e.into_inner());
        a.empty_cache();
        let s = a.stats(0).unwrap();
        if s.reserved_bytes + size as u64 > limit {
            self.count.refused();
            return None;
        }
        let p = a.allocate(size, 0, align).unwrap_or_else(|again| {
            panic!(
                "allocate({size}) was refused ({e}), and again with every other thread stopped and {} of \
                 {limit} bytes held: {again}",
                s.reserved_bytes
            )
        });
        self.count.retried.fetch_add(1, Ordering::Relaxed);
        self.count.made();
        Some(p)
    }
}
