//! Small helpers of the hostile tests: a deadline for work that could hang, a panic caught as a
//! value, and an async call polled by hand.

use std::future::Future;
use std::sync::mpsc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Runs `f` on a thread of its own and waits at most `secs` for it: `None` when it ran past that
/// (a hang; the thread is left running, and the test fails anyway). A panic in `f` fails the test.
pub fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => Some(v),
        Err(mpsc::RecvTimeoutError::Timeout) => None,
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the work panicked"),
    }
}

/// Runs `f`; `Err(its message)` when it panicked, instead of unwinding the test.
pub fn no_panic<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic without a message".into())
    })
}

/// Polls `fut` once with a waker that does nothing.
#[cfg_attr(not(feature = "wgpu"), allow(dead_code))]
pub fn poll_once<F: Future + ?Sized>(fut: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

/// Polls `fut` up to `polls` times (a waker that does nothing, 100 µs apart), then drops it:
/// `None` when it was dropped before it was ready.
#[cfg_attr(not(feature = "wgpu"), allow(dead_code))]
pub fn poll_some<F: Future>(fut: F, polls: usize) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    for _ in 0..polls {
        if let Poll::Ready(v) = poll_once(fut.as_mut()) {
            return Some(v);
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    None
}
