//! Copies that cross from one allocator (or device) to another through host memory, written
//! once as async code; the blocking form drives the same code with blocking copies.

use crate::allocator::DeviceAllocator;
use crate::device::DeviceIndex;
use crate::error::Result;
use crate::ptr::DevicePtr;

/// Size of the host buffer a cross-device copy bounces through.
pub(crate) const BOUNCE_CHUNK: usize = 4 << 20;

/// How a copy waits for each step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Through the blocking copies: every step is done when its future is first polled.
    Blocking,
    /// Through the `_async` copies (the browser's way; never blocks a thread).
    Async,
}

/// One end of a copy: an allocator, a device index and an address.
#[derive(Clone, Copy)]
pub(crate) struct End<'a> {
    pub alloc: &'a dyn DeviceAllocator,
    pub index: DeviceIndex,
    pub ptr: DevicePtr,
}

/// Copies `nbytes` from `src` to `dst` through a host buffer of at most [`BOUNCE_CHUNK`]
/// bytes, so that a copy of a few GiB never needs a few GiB of host memory. Both ranges are
/// checked before the first byte moves, so a bad range leaves `dst` as it was. A failure of the
/// device itself halfway through (device lost) can leave the chunks before it copied.
pub(crate) async fn bounce(dst: End<'_>, src: End<'_>, nbytes: usize, mode: Mode) -> Result<()> {
    if nbytes == 0 {
        return Ok(());
    }
    src.alloc.check_range(src.ptr, nbytes, src.index)?;
    dst.alloc.check_range(dst.ptr, nbytes, dst.index)?;
    let mut buf = vec![0u8; nbytes.min(BOUNCE_CHUNK)];
    let mut done = 0;
    while done < nbytes {
        let n = (nbytes - done).min(buf.len());
        let (s, d) = (src.ptr.offset(done)?, dst.ptr.offset(done)?);
        match mode {
            Mode::Blocking => src.alloc.copy_device_to_host(&mut buf[..n], s, src.index)?,
            Mode::Async => {
                src.alloc.copy_device_to_host_async(&mut buf[..n], s, src.index).await?;
                yield_now().await;
            }
        }
        match mode {
            Mode::Blocking => dst.alloc.copy_host_to_device(d, &buf[..n], dst.index)?,
            Mode::Async => dst.alloc.copy_host_to_device_async(d, &buf[..n], dst.index).await?,
        }
        done += n;
    }
    Ok(())
}

/// Runs a future built in [`Mode::Blocking`]: every step it awaits is ready at once, so one
/// poll (with a waker that does nothing: no executor to set up) finishes it; were one ever
/// pending (a contended async lock), this blocks (native) until it is done.
pub(crate) fn run_blocking<T>(fut: impl std::future::Future<Output = T>) -> T {
    use std::task::{Context, Poll, Waker};
    let mut fut = std::pin::pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => pollster::block_on(fut),
    }
}

/// Gives the executor back once: wakes its own task and returns `Pending` the first time it is
/// polled, `Ready` the next. An async copy awaits it between chunks, so that one poll of the
/// copy does at most one chunk's work however quickly the device answers.
pub(crate) async fn yield_now() {
    struct YieldNow(bool);
    impl std::future::Future for YieldNow {
        type Output = ();
        fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
            if std::mem::replace(&mut self.0, true) {
                return std::task::Poll::Ready(());
            }
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    }
    YieldNow(false).await
}
