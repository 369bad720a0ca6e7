//! The order of a staged copy's steps, apart from CUDA (so that it is tested without a GPU):
//! chunk `j` uses buffer `j % n`; the host side of a chunk (fill, or copy out) runs on copy
//! threads, each a whole chunk at a time, while the calling thread queues the device side (the
//! DMA) in chunk order.
//!
//! - Upload: a copy thread takes the next chunk, waits until the DMA that last read its buffer
//!   is done, fills it; the caller queues each chunk's DMA once it is filled.
//! - Download: the caller queues DMAs as buffers come free; a copy thread takes the next chunk,
//!   waits until its DMA is done, copies it out.
//!
//! There are no fork/joins per chunk: up to `n - 1` chunks are being filled (or emptied)
//! while one moves. Every wait is on an earlier chunk, taken by a running thread, so the
//! pipeline always moves; a failure anywhere stops it, and every thread returns.
//! With no copy threads (one thread asked for, or a caller that is itself a rayon worker,
//! which must not block on its pool) the caller does the host side itself, in order: the DMA of
//! one chunk still overlaps the host side of the next.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::sync::{lock, Unpoisoned};

/// The steps of one staged copy.
pub(crate) trait Stages: Sync {
    /// The host side of chunk `j` in buffer `b`: fill it (upload) or copy it out (download).
    /// Called on any thread.
    fn host(&self, j: usize, b: usize) -> Result<()>;
    /// Waits until the device side last queued on buffer `b` is done (at once if none was).
    /// Called on any thread.
    fn wait(&self, b: usize) -> Result<()>;
    /// Queues the device side of chunk `j` on buffer `b`. Called on the calling thread only.
    fn queue(&self, j: usize, b: usize) -> Result<()>;
}

/// Which way the data go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Way {
    Up,
    Down,
}

/// Shared progress of one copy.
struct Progress {
    host_done: Vec<bool>,
    queued: usize,
    failed: Option<Error>,
}

struct Shared {
    progress: Mutex<Progress>,
    changed: Condvar,
    next: AtomicUsize,
}

impl Shared {
    /// Waits until `ready` holds; `Err(())` once the copy failed.
    fn wait_until(&self, ready: impl Fn(&Progress) -> bool) -> std::result::Result<(), ()> {
        let mut p = lock(&self.progress);
        loop {
            if p.failed.is_some() {
                return Err(());
            }
            if ready(&p) {
                return Ok(());
            }
            p = self.changed.wait(p).unpoisoned();
        }
    }

    fn update(&self, f: impl FnOnce(&mut Progress)) {
        f(&mut lock(&self.progress));
        self.changed.notify_all();
    }

    fn fail(&self, e: Error) {
        self.update(|p| {
            p.failed.get_or_insert(e);
        });
    }
}

/// A step that panicked (a bug) fails the copy instead of leaving the other threads waiting.
fn guarded<T>(device: Device, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(Error::backend(device, "a staged copy's step panicked (a devalloc bug)")))
}

/// Runs a copy of `count` chunks through `buffers` buffers, the host side on up to `threads`
/// threads of `pool` (see the module docs).
pub(crate) fn run(
    way: Way,
    count: usize,
    buffers: usize,
    pool: &rayon::ThreadPool,
    threads: usize,
    stages: &dyn Stages,
    device: Device,
) -> Result<()> {
    let n = buffers.max(1);
    let workers = threads.min(count);
    if workers <= 1 || rayon::current_thread_index().is_some() {
        return guarded(device, || inline(way, count, n, stages));
    }
    let shared = Shared {
        progress: Mutex::new(Progress { host_done: vec![false; count], queued: 0, failed: None }),
        changed: Condvar::new(),
        next: AtomicUsize::new(0),
    };
    pool.in_place_scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|_| worker(way, count, n, &shared, stages, device));
        }
        let issued = match way {
            Way::Up => (0..count).try_for_each(|k| {
                shared.wait_until(|p| p.host_done[k])?;
                guarded(device, || stages.queue(k, k % n)).map_err(|e| shared.fail(e))?;
                shared.update(|p| p.queued = k + 1);
                Ok(())
            }),
            Way::Down => (0..count)
                .try_for_each(|k| {
                    if k >= n {
                        shared.wait_until(|p| p.host_done[k - n])?;
                    }
                    guarded(device, || stages.queue(k, k % n)).map_err(|e| shared.fail(e))?;
                    shared.update(|p| p.queued = k + 1);
                    Ok(())
                })
                .and_then(|()| shared.wait_until(|p| p.host_done.iter().all(|&d| d))),
        };
        // On a failure every worker sees it and returns; the scope waits for them.
        let _ = issued;
    });
    match shared.progress.into_inner().unpoisoned().failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// One copy thread: takes chunks in order until none is left or the copy failed.
fn worker(way: Way, count: usize, n: usize, shared: &Shared, stages: &dyn Stages, device: Device) {
    loop {
        let j = shared.next.fetch_add(1, Ordering::Relaxed);
        if j >= count {
            return;
        }
        let b = j % n;
        // The buffer's previous use must be queued (upload: the DMA of chunk j - n) or this
        // chunk's own DMA queued (download), then done on the device.
        let queued = match way {
            Way::Up if j < n => Ok(()),
            Way::Up => shared.wait_until(|p| p.queued > j - n),
            Way::Down => shared.wait_until(|p| p.queued > j),
        };
        if queued.is_err() {
            return;
        }
        if let Err(e) = guarded(device, || stages.wait(b).and_then(|()| stages.host(j, b))) {
            shared.fail(e);
            return;
        }
        shared.update(|p| p.host_done[j] = true);
    }
}

/// The same on the calling thread alone.
fn inline(way: Way, count: usize, n: usize, stages: &dyn Stages) -> Result<()> {
    match way {
        Way::Up => (0..count).try_for_each(|k| {
            if k >= n {
                stages.wait(k % n)?;
            }
            stages.host(k, k % n)?;
            stages.queue(k, k % n)
        }),
        Way::Down => {
            (0..count.min(n)).try_for_each(|k| stages.queue(k, k))?;
            (0..count).try_for_each(|k| {
                stages.wait(k % n)?;
                stages.host(k, k % n)?;
                if k + n < count {
                    stages.queue(k + n, k % n)?;
                }
                Ok(())
            })
        }
    }
}

#[cfg(test)]
#[path = "pipeline_tests.rs"]
mod tests;
