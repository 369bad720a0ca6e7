//! One map request: its outcome, shared by wgpu's callback, the wait, and a guard that unmaps,
//! so that no buffer is ever left mapped behind anyone's back.
//!
//! A guard dropped while its map is pending (an async copy dropped half-way) must not leave the
//! buffer mapped. Unmapping cancels a pending map, but not one that a poll on another thread is
//! carrying out at that moment: wgpu-core 30.0.2 marks the buffer idle while it maps it (an
//! unmap then does nothing), then marks it mapped and calls back with success. And a cancelled
//! map leaves the buffer on wgpu's list of buffers to map, where a later poll finds it while a
//! new mapping of the buffer is in place and marks it idle for a moment: an unmap in that
//! moment (the app's own) does nothing, and the buffer stays mapped. So where waiting is
//! allowed (natively) the guard lets the map finish instead (polling, at most a second) and
//! unmaps then; it cancels only a map that did not finish by then, or that will never finish
//! here ([`MapGuard::cancel`]). In the browser no poll runs beside devalloc's code: a pending
//! map is cancelled at once. And a callback that wgpu drops without calling (another callback
//! of the same batch panicked) says so, instead of leaving a wait pending forever.

use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use futures_channel::oneshot;

use super::gpu::{Gpu, MapResult};
use super::platform::{Current, Platform};
use crate::error::Result;

const PENDING: u8 = 0;
const MAPPED: u8 = 1;
const REFUSED: u8 = 2;
/// wgpu dropped the callback without calling it.
const DROPPED: u8 = 3;

/// Lives inside wgpu's callback: records the outcome; dropped uncalled, records that.
struct Report {
    state: Arc<AtomicU8>,
    tx: Option<oneshot::Sender<()>>,
}

impl Report {
    fn call(mut self, r: MapResult) {
        self.state.store(if r.is_ok() { MAPPED } else { REFUSED }, Ordering::Release);
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        let _ = self.state.compare_exchange(PENDING, DROPPED, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// A map request of `buffer` and the guard that unmaps it (see the module docs).
pub(crate) struct MapGuard<'a> {
    gpu: &'a Gpu,
    buffer: &'a wgpu::Buffer,
    state: Arc<AtomicU8>,
    armed: bool,
}

impl<'a> MapGuard<'a> {
    /// Asks for `buffer[range]` to be mapped, inside an error scope unless `scoped` is false
    /// (see `Gpu::map_then`); the receiver resolves once the callback has run (or was dropped).
    pub fn request(
        gpu: &'a Gpu,
        buffer: &'a wgpu::Buffer,
        mode: wgpu::MapMode,
        range: Range<u64>,
        scoped: bool,
    ) -> Result<(Self, oneshot::Receiver<()>)> {
        let state = Arc::new(AtomicU8::new(PENDING));
        let (tx, rx) = oneshot::channel();
        let report = Report { state: Arc::clone(&state), tx: Some(tx) };
        gpu.map_then(buffer, mode, range, scoped, move |r| report.call(r))?;
        Ok((MapGuard { gpu, buffer, state, armed: true }, rx))
    }

    /// Waits, blocking, for the callback (no channel, no futures).
    pub fn wait_blocking(&self) -> Result<()> {
        self.gpu.wait_blocking(|| match self.state.load(Ordering::Acquire) {
            PENDING => Ok(None),
            DROPPED => Err(()),
            _ => Ok(Some(())),
        })
    }

    /// What came of the map, once the wait (`waited`) is over: `Ok` when mapped, or when wgpu
    /// dropped the callback (it does so only once it has mapped the buffer and another callback
    /// of the same batch panicked: the copy then finds out, as wgpu hands out a view of a mapped
    /// buffer only); a refusal by wgpu (the app had mapped the buffer, say: then its mapping is
    /// not ours to undo) or a failed wait is an error, named a loss where it is one.
    pub fn settle(&mut self, waited: Result<()>) -> Result<()> {
        let r = match (self.state.load(Ordering::Acquire), waited) {
            (MAPPED | DROPPED, _) => Ok(()),
            (_, Err(e)) => Err(e),
            (REFUSED, Ok(())) => {
                self.armed = false;
                Err(self.gpu.backend_error("mapping a buffer", "wgpu refused the map"))
            }
            (_, Ok(())) => Err(self.gpu.backend_error("mapping a buffer", "the map's callback never came")),
        };
        self.gpu.or_lost(r)
    }

    /// The buffer stays mapped, for its owner (the app, after `map_buffer_async`).
    pub fn keep_mapped(mut self) {
        self.armed = false;
    }

    /// Cancels the map now (it will never finish here: the buffer belongs to another device).
    pub fn cancel(&mut self) {
        self.gpu.unmap(self.buffer);
        self.wait_out(100_000);
    }

    /// Waits (natively, polling) until the callback has answered, at most `us` microseconds.
    fn wait_out(&self, us: u64) {
        if !Current::CAN_BLOCK {
            return;
        }
        let deadline = crate::clock::now_us() + us;
        while self.state.load(Ordering::Acquire) == PENDING && crate::clock::now_us() < deadline {
            Current::poll_now(&self.gpu.device);
            std::thread::yield_now();
        }
    }
}

impl Drop for MapGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Let a pending map finish (natively), else cancel it (see the module docs).
        self.wait_out(1_000_000);
        if self.state.load(Ordering::Acquire) == PENDING {
            self.cancel();
        }
        if matches!(self.state.load(Ordering::Acquire), MAPPED | DROPPED) {
            self.gpu.unmap(self.buffer);
        }
    }
}
