//! A device's context, opened on first use ([`Lazy`], [`Opened`]), and devalloc's streams on
//! it ([`Streams`], lent one per copy).
//!
//! - **Opening never waits for the program's work.** cudarc's `new_stream` runs
//!   `cuCtxSynchronize` on the primary context the first time (its event tracking), which inside
//!   a busy program (PyTorch's) would wait for everything queued. devalloc creates its streams
//!   with `cuStreamCreate` itself, and `CudaContext::new` only retains the primary context.
//! - **Only "unavailable" is kept.** Code 46 (busy, or exclusive-process and taken) makes the
//!   index unavailable for good ([`Error::NotFound`]); any other failure to open (out of
//!   memory while creating the context, a sticky error, 999) is returned as what it is, and the
//!   next call tries again.
//! - **One stream per copy in flight.** A copy borrows a stream of its own from [`Streams`]
//!   (non-blocking, created on demand, kept for reuse), so uploads and downloads overlap and a
//!   small copy never waits behind another caller's large one; the [`Lease`] synchronises once,
//!   when the copy finishes, or on drop if it did not (an error half-way).
#![allow(unsafe_code)] // at the edge: every unsafe block has a SAFETY note

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::CUstream;
use cudarc::driver::{result, CudaContext};

use super::context::keeping_current;
use super::errors::{copy_error, driver_error, means_device_unavailable};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::sync::lock;

/// Why a device could not be opened.
pub(crate) enum OpenFailure {
    /// For good (code 46): the index stays unavailable.
    Unavailable(String),
    /// This time: returned as it is, and the next call tries again.
    Failed(Error),
}

/// A value opened on first use; a failure is kept only if it says so ([`OpenFailure`]).
pub(crate) struct Lazy<T> {
    value: OnceLock<T>,
    unavailable: OnceLock<String>,
    opening: Mutex<()>,
}

impl<T> Default for Lazy<T> {
    fn default() -> Self {
        Lazy { value: OnceLock::new(), unavailable: OnceLock::new(), opening: Mutex::new(()) }
    }
}

impl<T> Lazy<T> {
    /// The value, opened by `open` if it is not yet (by one thread at a time).
    pub(crate) fn get_or_open(
        &self,
        open: impl FnOnce() -> std::result::Result<T, OpenFailure>,
    ) -> Result<&T> {
        if let Some(v) = self.value.get() {
            return Ok(v);
        }
        let _opening = lock(&self.opening);
        if let Some(v) = self.value.get() {
            return Ok(v);
        }
        if let Some(why) = self.unavailable.get() {
            return Err(Error::not_found(why.clone()));
        }
        match open() {
            Ok(v) => Ok(self.value.get_or_init(|| v)),
            Err(OpenFailure::Unavailable(why)) => {
                Err(Error::not_found(self.unavailable.get_or_init(|| why).clone()))
            }
            Err(OpenFailure::Failed(e)) => Err(e),
        }
    }

    /// The value, if it was opened.
    pub(crate) fn get(&self) -> Option<&T> {
        self.value.get()
    }

    /// Takes the value out (on drop of the owner).
    pub(crate) fn take(&mut self) -> Option<T> {
        self.value.take()
    }
}

/// A device's context and devalloc's streams on it. Dropped with the context current (the
/// storage's `Drop` binds it), streams first.
pub(crate) struct Opened {
    pub streams: Streams,
    pub ctx: Arc<CudaContext>,
}

impl Opened {
    /// Retains the primary context of device `ordinal`, leaving the caller's current context
    /// as it was; waits for nothing the program queued.
    pub(crate) fn open(ordinal: usize, device: Device) -> std::result::Result<Opened, OpenFailure> {
        keeping_current(|| {
            let ctx = CudaContext::new(ordinal).map_err(|e| {
                if means_device_unavailable(&e) {
                    OpenFailure::Unavailable(format!(
                        "{device} is unavailable: the GPU is busy or in exclusive-process mode (CUDA error 46)"
                    ))
                } else {
                    OpenFailure::Failed(driver_error(device, "opening the device's context", e, 0))
                }
            })?;
            Ok(Opened { streams: Streams::new(device), ctx })
        })
    }
}

/// devalloc's non-blocking streams on one context, lent one per copy.
pub(crate) struct Streams {
    idle: Mutex<Vec<CUstream>>,
    device: Device,
}

// SAFETY: a CUstream is a handle the driver lets any thread use; the list is behind a mutex,
// and each stream is used by one copy at a time (the one holding its lease).
unsafe impl Send for Streams {}
// SAFETY: as above.
unsafe impl Sync for Streams {}

impl Streams {
    fn new(device: Device) -> Self {
        Streams { idle: Mutex::new(Vec::new()), device }
    }

    /// A stream for one copy; the context must be current (the caller's guard).
    pub(crate) fn lease(&self) -> Result<Lease<'_>> {
        let idle = lock(&self.idle).pop();
        let stream = match idle {
            Some(s) => s,
            None => result::stream::create(result::stream::StreamKind::NonBlocking)
                .map_err(|e| driver_error(self.device, "creating a stream", e, 0))?,
        };
        Ok(Lease { stream, streams: self, finished: false })
    }

    /// Waits for the streams no copy holds (a copy in flight waits for its own before it
    /// returns); the context must be current.
    pub(crate) fn synchronize_idle(&self) -> Result<()> {
        let idle = lock(&self.idle).clone();
        for s in idle {
            // SAFETY: a live stream of this context (destroyed only when `Streams` drops).
            unsafe { result::stream::synchronize(s) }
                .map_err(|e| copy_error(self.device, "waiting for copies", e))?;
        }
        Ok(())
    }
}

impl Drop for Streams {
    fn drop(&mut self) {
        for s in std::mem::take(&mut *lock(&self.idle)) {
            // SAFETY: created by `lease`, idle (no lease holds it), destroyed once; the context
            // is current (`Opened` is dropped under the storage's guard).
            if let Err(e) = unsafe { result::stream::destroy(s) } {
                log::warn!("devalloc: destroying a stream on {}: {e:?}", self.device);
            }
        }
    }
}

/// One copy's stream: synchronised once, by [`Lease::finish`] or, if the copy did not get
/// there (an error half-way), on drop, so that no copy is left running on memory the caller
/// gets back. Raw `cuStreamSynchronize`: cudarc's reports errors stored by earlier drops first.
pub(crate) struct Lease<'a> {
    stream: CUstream,
    streams: &'a Streams,
    finished: bool,
}

impl Lease<'_> {
    pub(crate) fn stream(&self) -> CUstream {
        self.stream
    }

    /// Waits for everything queued on the stream; the context must be current.
    pub(crate) fn finish(mut self, what: &str) -> Result<()> {
        self.finished = true;
        // SAFETY: the stream is live (owned by `streams`, lent to this lease alone).
        unsafe { result::stream::synchronize(self.stream) }
            .map_err(|e| copy_error(self.streams.device, what, e))
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if !self.finished {
            // SAFETY: as in `finish`; the caller's guard keeps the context current.
            if let Err(e) = unsafe { result::stream::synchronize(self.stream) } {
                log::error!("devalloc: waiting for a copy after an error on {}: {e:?}", self.streams.device);
            }
        }
        lock(&self.streams.idle).push(self.stream);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::device::DeviceType;

    const DEV: Device = Device::new(DeviceType::Cuda, 3);

    #[test]
    fn only_unavailable_is_kept_other_failures_are_retried() {
        let lazy = Lazy::<u32>::default();
        let calls = AtomicUsize::new(0);
        let fail = |e: Error| {
            calls.fetch_add(1, Ordering::Relaxed);
            Err(OpenFailure::Failed(e))
        };
        // Out of memory while creating the context: returned as such, not NotFound.
        let oom = Error::OutOfMemory { requested: 0, device: DEV, detail: "context".into() };
        assert!(matches!(lazy.get_or_open(|| fail(oom)), Err(Error::OutOfMemory { .. })));
        // A sticky error: lost, this time.
        let lost = Error::DeviceLost { device: DEV, reason: "719".into() };
        assert!(matches!(lazy.get_or_open(|| fail(lost)), Err(Error::DeviceLost { .. })));
        // 999: a backend error.
        assert!(matches!(lazy.get_or_open(|| fail(Error::backend(DEV, "999"))), Err(Error::Backend { .. })));
        assert_eq!(calls.load(Ordering::Relaxed), 3, "every call tried again");
        // Then it works, and stays open.
        assert_eq!(*lazy.get_or_open(|| Ok(7)).unwrap(), 7);
        assert_eq!(*lazy.get_or_open(|| panic!("opened twice")).unwrap(), 7);
        assert_eq!(lazy.get(), Some(&7));
    }

    #[test]
    fn unavailable_is_for_good() {
        let lazy = Lazy::<u32>::default();
        let e = lazy.get_or_open(|| Err(OpenFailure::Unavailable("busy (46)".into()))).unwrap_err();
        assert!(matches!(&e, Error::NotFound { what } if what.contains("46")), "{e}");
        let again = lazy.get_or_open(|| panic!("tried again after 46")).unwrap_err();
        assert!(matches!(again, Error::NotFound { .. }));
        assert!(lazy.get().is_none());
    }

    #[test]
    fn one_thread_opens_the_others_wait_for_it() {
        let lazy = Lazy::<usize>::default();
        let opened = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let v = lazy.get_or_open(|| {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        Ok(opened.fetch_add(1, Ordering::SeqCst))
                    });
                    assert_eq!(*v.unwrap(), 0);
                });
            }
        });
        assert_eq!(opened.load(Ordering::SeqCst), 1);
    }
}
