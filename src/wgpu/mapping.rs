//! The one way the wgpu backend maps a buffer: a [`Map`] request, whose outcome wgpu's callback
//! records (with one rule for a callback wgpu drops uncalled: see [`Map::outcome`]), and the
//! wait for it. Staging buffers, which devalloc alone holds and drops, are mapped by a bare
//! [`Map`] (the belt keeps an upload buffer's re-map beside it, and reads its outcome when it
//! takes the buffer again); a buffer that outlives the copy (a block on the direct route, the
//! app's own) is mapped under a [`MapGuard`], which unmaps it on drop, so that no buffer is ever
//! left mapped behind anyone's back. Every unmap is `Gpu::unmap`.

use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use futures_channel::oneshot;

use super::gpu::{Gpu, MapResult};
use super::platform::{Current, Platform};
use super::workarounds;
use crate::bounce::Mode;
use crate::error::Result;

const PENDING: u8 = 0;
const MAPPED: u8 = 1;
const REFUSED: u8 = 2;
/// wgpu dropped the callback without calling it.
const DROPPED: u8 = 3;

/// Lives inside wgpu's callback: records the outcome; dropped uncalled, records that (which
/// [`Map::outcome`] counts as mapped: item 3 of `workarounds.rs`).
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

/// What came of a map so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The callback has not run.
    Pending,
    /// Mapped; or wgpu dropped the callback uncalled (see [`Report`]).
    Mapped,
    /// wgpu refused the map (a lost device, a buffer the app mapped or destroyed).
    Refused,
}

/// One map request of a buffer: what wgpu's callback said, and the wait for it.
pub(crate) struct Map {
    state: Arc<AtomicU8>,
    /// Resolves once the callback has run (or was dropped); taken by the first wait.
    rx: Option<oneshot::Receiver<()>>,
}

impl Map {
    /// Asks for `buffer[range]` to be mapped, inside an error scope unless `scoped` is false
    /// (see `Gpu::map_then`).
    pub fn request(
        gpu: &Gpu,
        buffer: &wgpu::Buffer,
        mode: wgpu::MapMode,
        range: Range<u64>,
        scoped: bool,
    ) -> Result<Map> {
        let state = Arc::new(AtomicU8::new(PENDING));
        let (tx, rx) = oneshot::channel();
        let report = Report { state: Arc::clone(&state), tx: Some(tx) };
        gpu.map_then(buffer, mode, range, scoped, move |r| report.call(r))?;
        Ok(Map { state, rx: Some(rx) })
    }

    /// What came of the map so far. The one rule for a callback wgpu drops uncalled: mapped
    /// (item 3 of `workarounds.rs`).
    pub fn outcome(&self) -> Outcome {
        match self.state.load(Ordering::Acquire) {
            PENDING => Outcome::Pending,
            REFUSED => Outcome::Refused,
            DROPPED if !workarounds::DROPPED_CALLBACK_IS_MAPPED => Outcome::Refused,
            _ => Outcome::Mapped,
        }
    }

    /// Waits for the callback (blocking or not, as `mode` says); what the wait itself said, to
    /// be [`Map::settle`]d. `index`: the submission the map waits for, if known;
    /// `idle_gives_up`: see `Gpu::wait`.
    pub async fn waited(
        &mut self,
        gpu: &Gpu,
        index: Option<wgpu::SubmissionIndex>,
        mode: Mode,
        idle_gives_up: bool,
    ) -> Result<()> {
        match self.rx.take() {
            Some(rx) => gpu.wait(rx, index, mode, idle_gives_up).await,
            None => Ok(()),
        }
    }

    /// Waits, blocking, for the callback (no channel, no futures); what the wait said.
    pub fn waited_blocking(&self, gpu: &Gpu) -> Result<()> {
        gpu.wait_blocking(|| match self.state.load(Ordering::Acquire) {
            PENDING => Ok(None),
            DROPPED => Err(()),
            _ => Ok(Some(())),
        })
    }

    /// What came of the map, once the wait (`waited`) is over: `Ok` when mapped (or the
    /// callback was dropped); a refusal by wgpu or a failed wait is an error, named a loss
    /// where it is one.
    pub fn settle(&self, gpu: &Gpu, waited: Result<()>) -> Result<()> {
        let r = match (self.outcome(), waited) {
            (Outcome::Mapped, _) => Ok(()),
            (_, Err(e)) => Err(e),
            (Outcome::Refused, Ok(())) => Err(gpu.backend_error("mapping a buffer", "wgpu refused the map")),
            (Outcome::Pending, Ok(())) => {
                Err(gpu.backend_error("mapping a buffer", "the map's callback never came"))
            }
        };
        gpu.or_lost(r)
    }

    /// [`Map::waited`], then [`Map::settle`]d.
    pub async fn wait(&mut self, gpu: &Gpu, index: Option<wgpu::SubmissionIndex>, mode: Mode) -> Result<()> {
        let waited = self.waited(gpu, index, mode, false).await;
        self.settle(gpu, waited)
    }
}

/// A [`Map`] of a buffer that outlives the copy, and the guard that unmaps it (see the module
/// docs).
///
/// A guard dropped while its map is pending (an async copy dropped half-way) must not leave the
/// buffer mapped, and an unmap does not always cancel a pending map (item 4 of
/// `workarounds.rs`): so natively the guard lets the map finish (polling, at most a second) and
/// unmaps then; it cancels only a map that did not finish by then, or that will never finish
/// here ([`MapGuard::cancel`]). In the browser no poll runs beside devalloc's code: a pending
/// map is cancelled at once.
pub(crate) struct MapGuard<'a> {
    gpu: &'a Gpu,
    buffer: &'a wgpu::Buffer,
    map: Map,
    armed: bool,
}

impl<'a> MapGuard<'a> {
    /// Asks for `buffer[range]` to be mapped (see [`Map::request`]).
    pub fn request(
        gpu: &'a Gpu,
        buffer: &'a wgpu::Buffer,
        mode: wgpu::MapMode,
        range: Range<u64>,
        scoped: bool,
    ) -> Result<Self> {
        let map = Map::request(gpu, buffer, mode, range, scoped)?;
        Ok(MapGuard { gpu, buffer, map, armed: true })
    }

    /// Waits for the callback ([`Map::waited`]).
    pub async fn waited(&mut self, mode: Mode, idle_gives_up: bool) -> Result<()> {
        self.map.waited(self.gpu, None, mode, idle_gives_up).await
    }

    /// Waits, blocking, for the callback ([`Map::waited_blocking`]).
    pub fn waited_blocking(&self) -> Result<()> {
        self.map.waited_blocking(self.gpu)
    }

    /// What came of the map ([`Map::settle`]). A buffer wgpu refused to map is not the guard's
    /// to unmap (the app had mapped it, say: its mapping is not ours to undo).
    pub fn settle(&mut self, waited: Result<()>) -> Result<()> {
        let r = self.map.settle(self.gpu, waited);
        if self.map.outcome() == Outcome::Refused {
            self.armed = false;
        }
        r
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
        while self.map.outcome() == Outcome::Pending && crate::clock::now_us() < deadline {
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
        // Let a pending map finish (natively), else cancel it (see the type's docs).
        self.wait_out(workarounds::LET_A_MAP_FINISH_US);
        if self.map.outcome() == Outcome::Pending {
            self.cancel();
        }
        if self.map.outcome() == Outcome::Mapped {
            self.gpu.unmap(self.buffer);
        }
    }
}
