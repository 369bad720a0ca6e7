//! The polling thread and the waits of native builds.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::Duration;

use futures_channel::oneshot;

use crate::bounce::Mode;
use crate::error::{Error, Result};
use crate::sync::{lock, Unpoisoned};
use crate::wgpu::platform::{LossSignal, On};
use crate::wgpu::workarounds;

/// The polling thread's first pause between two polls; the pause doubles up to [`MAX_PAUSE`]
/// while nothing new arrives, and starts again at this when a new wait does.
pub(super) const MIN_PAUSE: Duration = Duration::from_micros(10);
/// The longest pause of the polling thread between two polls.
pub(super) const MAX_PAUSE: Duration = workarounds::POLL_PAUSE;

struct PollerState {
    watchers: usize,
    /// The waker of each wait in progress, by its number: removed when the wait ends, so the
    /// list stays as long as the waits in flight.
    wakers: Vec<(u64, Waker)>,
    /// Waiters that give up once the device has been idle twice without their callback.
    idle_wakers: Vec<Waker>,
    /// A wait arrived since the last poll: poll again soon.
    fresh: bool,
    stop: bool,
}

struct PollerShared {
    device: wgpu::Device,
    lost: Arc<dyn LossSignal>,
    state: Mutex<PollerState>,
    cv: Condvar,
    /// Polls that found the queue empty so far.
    idle_polls: AtomicU64,
}

/// What lets async waits on native return `Pending` and be woken: a thread per device,
/// started on the first async wait, that polls with short timeouts while anyone waits. Map
/// callbacks and the app's `on_device_lost` then run on it.
pub(crate) struct Waiter {
    shared: Arc<PollerShared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Waiter {
    pub(crate) fn new(device: &wgpu::Device, lost: Arc<dyn LossSignal>) -> Self {
        let state = PollerState {
            watchers: 0,
            wakers: Vec::new(),
            idle_wakers: Vec::new(),
            fresh: false,
            stop: false,
        };
        let shared = PollerShared {
            device: device.clone(),
            lost,
            state: Mutex::new(state),
            cv: Condvar::new(),
            idle_polls: AtomicU64::new(0),
        };
        Waiter { shared: Arc::new(shared), thread: Mutex::new(None) }
    }

    fn watch(&self, id: u64, waker: &Waker, first: bool, on_idle: bool) {
        {
            let mut st = lock(&self.shared.state);
            if first {
                st.watchers += 1;
                st.fresh = true;
            }
            match st.wakers.iter_mut().find(|(i, _)| *i == id) {
                Some((_, w)) if w.will_wake(waker) => {}
                Some((_, w)) => *w = waker.clone(),
                None => st.wakers.push((id, waker.clone())),
            }
            if on_idle && !st.idle_wakers.iter().any(|w| w.will_wake(waker)) {
                st.idle_wakers.push(waker.clone());
            }
        }
        self.shared.cv.notify_one();
        let mut thread = lock(&self.thread);
        if thread.is_none() {
            let shared = Arc::clone(&self.shared);
            let spawned =
                std::thread::Builder::new().name("devalloc-poll".into()).spawn(move || poll_loop(&shared));
            match spawned {
                Ok(handle) => *thread = Some(handle),
                Err(e) => self.shared.lost.mark(&format!("could not start devalloc's polling thread: {e}")),
            }
        }
    }

    fn unwatch(&self, id: u64) {
        let mut st = lock(&self.shared.state);
        st.watchers -= 1;
        st.wakers.retain(|(i, _)| *i != id);
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        lock(&self.shared.state).stop = true;
        self.shared.cv.notify_all();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

/// The polling thread: while anyone waits, polls without blocking (`PollType::Poll`) and
/// pauses between polls, from [`MIN_PAUSE`] doubling to [`MAX_PAUSE`].
///
/// Never a `PollType::Wait`: see item 1 of `wgpu/workarounds.rs` (a timed wait can panic on a
/// healthy device; a non-blocking poll never asserts, and holds no lock of the device while
/// the thread pauses).
fn poll_loop(shared: &PollerShared) {
    let mut pause = MIN_PAUSE;
    loop {
        {
            let mut st = lock(&shared.state);
            while st.watchers == 0 && !st.stop {
                st = shared.cv.wait(st).unpoisoned();
            }
            if st.stop {
                return;
            }
            if std::mem::take(&mut st.fresh) {
                pause = MIN_PAUSE;
            }
        }
        let polled = {
            let _polling = super::POLLS.read().unpoisoned();
            catch_unwind(AssertUnwindSafe(|| shared.device.poll(wgpu::PollType::Poll)))
        };
        match polled {
            Err(_) => shared.lost.after_panic("polling the device"),
            Ok(Ok(wgpu::PollStatus::QueueEmpty)) => {
                shared.idle_polls.fetch_add(1, Ordering::Relaxed);
                let idle = std::mem::take(&mut lock(&shared.state).idle_wakers);
                idle.into_iter().for_each(Waker::wake);
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => log::warn!("devalloc: polling a device: {e}"),
        }
        if shared.lost.is_lost() {
            let wakers = std::mem::take(&mut lock(&shared.state).wakers);
            wakers.into_iter().for_each(|(_, w)| w.wake());
        }
        let st = lock(&shared.state);
        if st.watchers > 0 && !st.stop && !st.fresh {
            drop(shared.cv.wait_timeout(st, pause).unpoisoned());
        }
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// Waits made so far (each takes the next number).
static WAITS: AtomicU64 = AtomicU64::new(0);

/// How a wait ended without its value.
enum Ended {
    /// The device is lost, or wgpu dropped the callback.
    Gone,
    /// The device went idle (twice) and the callback never came.
    Idle,
}

/// A wait for a callback's value, woken by the callback, or by the polling thread on a loss
/// (and, with `idle_gives_up`, when the device is idle).
struct Waiting<'a, T> {
    /// This wait's number, for its entry in the waker list.
    id: u64,
    rx: oneshot::Receiver<T>,
    waiter: &'a Waiter,
    watching: bool,
    idle_gives_up: bool,
    idle_at_start: u64,
}

impl<T> Future for Waiting<'_, T> {
    type Output = std::result::Result<T, Ended>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let idle_now = self.waiter.shared.idle_polls.load(Ordering::Relaxed);
        if !self.watching {
            self.idle_at_start = idle_now;
        }
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Ready(v) => return Poll::Ready(v.map_err(|_| Ended::Gone)),
            Poll::Pending if self.waiter.shared.lost.is_lost() => return Poll::Ready(Err(Ended::Gone)),
            Poll::Pending if self.idle_gives_up && idle_now >= self.idle_at_start + 2 => {
                return Poll::Ready(Err(Ended::Idle))
            }
            Poll::Pending => {}
        }
        let first = !self.watching;
        self.watching = true;
        self.waiter.watch(self.id, cx.waker(), first, self.idle_gives_up);
        Poll::Pending
    }
}

impl<T> Drop for Waiting<'_, T> {
    fn drop(&mut self) {
        if self.watching {
            self.waiter.unwatch(self.id);
        }
    }
}

/// Waits until `rx` has its value: blocking polls inline; async ones return `Pending` and are
/// woken through the polling thread. `index`: the submission the value waits for, if known.
/// `idle_gives_up`: fail (rather than wait forever) once the device has gone idle twice without
/// the callback, as for a map of a buffer that belongs to another device (which only that
/// device's polls would complete).
pub(super) async fn wait<T>(
    s: On<'_, Waiter>,
    mut rx: oneshot::Receiver<T>,
    index: Option<wgpu::SubmissionIndex>,
    mode: Mode,
    idle_gives_up: bool,
) -> Result<T> {
    let got = match mode {
        Mode::Async => {
            let id = WAITS.fetch_add(1, Ordering::Relaxed);
            Waiting { id, rx, waiter: s.waiter, watching: false, idle_gives_up, idle_at_start: 0 }.await
        }
        Mode::Blocking => block_until(&s, index, idle_gives_up, || rx.try_recv().map_err(drop)),
    };
    ended_error(&s, got)
}

/// Polls the device inline until `take` has the value (`Err`: it never will), the device is
/// lost, or (with `idle_gives_up`) the device has gone idle twice without it.
fn block_until<T>(
    s: &On<'_, Waiter>,
    index: Option<wgpu::SubmissionIndex>,
    idle_gives_up: bool,
    mut take: impl FnMut() -> std::result::Result<Option<T>, ()>,
) -> std::result::Result<T, Ended> {
    let mut idle = 0;
    loop {
        match take() {
            Ok(Some(v)) => return Ok(v),
            Err(()) => return Err(Ended::Gone),
            Ok(None) if s.lost.is_lost() => return Err(Ended::Gone),
            Ok(None) if idle_gives_up && idle >= 2 => return Err(Ended::Idle),
            Ok(None) => {}
        }
        // Without a timeout (item 1 of `workarounds.rs`).
        let wait = workarounds::wait_until(index.clone());
        match catch_unwind(AssertUnwindSafe(|| s.device.poll(wait))) {
            Err(_) => s.lost.after_panic("waiting for the device"),
            Ok(Err(e)) => {
                log::error!("devalloc: polling {}: {e}", s.id);
                return take().ok().flatten().ok_or(Ended::Gone);
            }
            Ok(Ok(wgpu::PollStatus::QueueEmpty)) => idle += 1,
            Ok(Ok(_)) => {}
        }
    }
}

/// Waits, blocking, until `take` has the value (`Err`: it never will): the blocking half of
/// [`wait`] for a caller with a callback slot of its own (no channel).
pub(super) fn wait_blocking<T>(
    s: On<'_, Waiter>,
    take: impl FnMut() -> std::result::Result<Option<T>, ()>,
) -> Result<T> {
    ended_error(&s, block_until(&s, None, false, take))
}

/// The error for a wait that ended without its value.
fn ended_error<T>(s: &On<'_, Waiter>, got: std::result::Result<T, Ended>) -> Result<T> {
    got.map_err(|ended| match ended {
        Ended::Gone if s.lost.is_lost() => s.lost.error(),
        Ended::Gone => Error::backend(s.id, "wgpu dropped a callback devalloc was waiting for"),
        Ended::Idle => Error::invalid_argument(format!(
            "the buffer never mapped although {} is idle: it belongs to another device (or the app keeps it mapped)",
            s.id
        )),
    })
}
