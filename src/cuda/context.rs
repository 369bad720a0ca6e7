//! The guard that leaves the caller's own current context as it found it.
//!
//! A multi-GPU runtime keeps "its" context current on each thread. cudarc's `bind_to_thread`
//! makes devalloc's current and never restores, and cudarc's context `Drop` binds too. So
//! every devalloc entry point, and every drop of a cudarc object, runs inside a [`CtxGuard`]
//! (or [`keeping_current`]), which restores whatever was current before (as PyTorch's device
//! guard does): another context, devalloc's own (then nothing changes), or none (then none is
//! current afterwards). The driver's two calls sit behind [`CurrentApi`], so that this logic is
//! tested without a driver.
#![allow(unsafe_code)] // at the edge: every unsafe block has a SAFETY note

use std::marker::PhantomData;

use cudarc::driver::sys::CUcontext;
use cudarc::driver::{result, CudaContext, DriverError};

use super::errors::driver_error;
use crate::device::Device;
use crate::error::Result;

/// Reading and setting this thread's current context.
pub(crate) trait CurrentApi {
    /// The current context, if any.
    fn get() -> std::result::Result<Option<CUcontext>, DriverError>;
    /// Makes `ctx` current (null: none).
    ///
    /// # Safety
    /// `ctx` is null or a live context.
    unsafe fn set(ctx: CUcontext) -> std::result::Result<(), DriverError>;
}

/// The driver's `cuCtxGetCurrent` / `cuCtxSetCurrent`.
pub(crate) struct Driver;

impl CurrentApi for Driver {
    fn get() -> std::result::Result<Option<CUcontext>, DriverError> {
        result::ctx::get_current()
    }
    unsafe fn set(ctx: CUcontext) -> std::result::Result<(), DriverError> {
        // SAFETY: the caller's promise (null or live).
        unsafe { result::ctx::set_current(ctx) }
    }
}

/// Makes a context current for its lifetime and restores the one that was current before.
pub(crate) struct Guard<A: CurrentApi = Driver> {
    previous: Option<CUcontext>,
    changed: bool,
    api: PhantomData<A>,
}

/// The guard on the real driver.
pub(crate) type CtxGuard = Guard<Driver>;

impl CtxGuard {
    /// Makes `ctx` current on this thread.
    pub(crate) fn bind(ctx: &CudaContext, device: Device) -> Result<Self> {
        // SAFETY: the CudaContext holds a reference to its context, which is therefore live.
        unsafe { Self::bind_raw(ctx.cu_ctx(), device) }
    }
}

impl<A: CurrentApi> Guard<A> {
    /// Makes `ours` current on this thread; on failure nothing changed.
    ///
    /// # Safety
    /// `ours` is a live context, for as long as the guard lives.
    pub(crate) unsafe fn bind_raw(ours: CUcontext, device: Device) -> Result<Self> {
        let previous = A::get().map_err(|e| driver_error(device, "reading the current context", e, 0))?;
        if previous == Some(ours) {
            return Ok(Guard { previous, changed: false, api: PhantomData });
        }
        // SAFETY: `ours` is live (the caller's promise).
        unsafe { A::set(ours) }.map_err(|e| driver_error(device, "making the context current", e, 0))?;
        Ok(Guard { previous, changed: true, api: PhantomData })
    }
}

impl<A: CurrentApi> Drop for Guard<A> {
    fn drop(&mut self) {
        if self.changed {
            let previous = self.previous.unwrap_or(std::ptr::null_mut());
            // SAFETY: `previous` was current on this thread when the guard was made (or null,
            // which unbinds): the caller's context, which the caller keeps alive.
            if let Err(e) = unsafe { A::set(previous) } {
                log::error!("devalloc: could not restore the caller's CUDA context: {e:?}");
            }
        }
    }
}

/// Restores on drop what was current when it was made; does nothing if that could not be read
/// (unbinding the caller's context on a guess would be worse than leaving devalloc's).
pub(crate) struct Restore<A: CurrentApi = Driver>(Option<Option<CUcontext>>, PhantomData<A>);

impl<A: CurrentApi> Restore<A> {
    pub(crate) fn now() -> Self {
        Restore(A::get().ok(), PhantomData)
    }
}

impl<A: CurrentApi> Drop for Restore<A> {
    fn drop(&mut self) {
        let Some(previous) = self.0 else { return };
        if A::get().ok() == Some(previous) {
            return;
        }
        let previous = previous.unwrap_or(std::ptr::null_mut());
        // SAFETY: `previous` was the caller's current context (or null) before cudarc bound
        // its own; the caller keeps it alive.
        if let Err(e) = unsafe { A::set(previous) } {
            log::error!("devalloc: could not restore the caller's CUDA context: {e:?}");
        }
    }
}

/// Runs `f` (which drops or uses cudarc objects that bind their context) and restores the
/// caller's current context afterwards, on every path.
pub(crate) fn keeping_current<T>(f: impl FnOnce() -> T) -> T {
    let _restore = Restore::<Driver>::now();
    f()
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::device::DeviceType;
    use crate::error::Error;

    thread_local! {
        static CURRENT: Cell<CUcontext> = const { Cell::new(std::ptr::null_mut()) };
        static SETS: Cell<usize> = const { Cell::new(0) };
        static FAIL_GET: Cell<bool> = const { Cell::new(false) };
        static FAIL_SET: Cell<bool> = const { Cell::new(false) };
    }

    /// A driver of one thread's current context, that fails on request.
    struct Fake;

    impl CurrentApi for Fake {
        fn get() -> std::result::Result<Option<CUcontext>, DriverError> {
            if FAIL_GET.get() {
                return Err(DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_INITIALIZED));
            }
            let c = CURRENT.get();
            Ok((!c.is_null()).then_some(c))
        }
        unsafe fn set(ctx: CUcontext) -> std::result::Result<(), DriverError> {
            if FAIL_SET.get() {
                return Err(DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_CONTEXT));
            }
            SETS.set(SETS.get() + 1);
            CURRENT.set(ctx);
            Ok(())
        }
    }

    fn ctx(n: usize) -> CUcontext {
        (n * 0x1000) as CUcontext // never dereferenced
    }

    fn reset(current: CUcontext) {
        CURRENT.set(current);
        SETS.set(0);
        FAIL_GET.set(false);
        FAIL_SET.set(false);
    }

    const DEV: Device = Device::new(DeviceType::Cuda, 0);

    fn bind(c: CUcontext) -> Result<Guard<Fake>> {
        // SAFETY: the fake never dereferences a context.
        unsafe { Guard::<Fake>::bind_raw(c, DEV) }
    }

    #[test]
    fn another_context_is_current_again_afterwards() {
        reset(ctx(1));
        let g = bind(ctx(2)).unwrap();
        assert_eq!(CURRENT.get(), ctx(2));
        drop(g);
        assert_eq!((CURRENT.get(), SETS.get()), (ctx(1), 2));
    }

    #[test]
    fn with_no_current_context_none_is_current_afterwards() {
        reset(std::ptr::null_mut());
        let g = bind(ctx(2)).unwrap();
        assert_eq!(CURRENT.get(), ctx(2));
        drop(g);
        assert!(CURRENT.get().is_null(), "devalloc's context was left current");
    }

    #[test]
    fn ours_already_current_changes_nothing() {
        reset(ctx(2));
        let outer = bind(ctx(2)).unwrap();
        let inner = bind(ctx(2)).unwrap();
        drop(inner);
        drop(outer);
        assert_eq!((CURRENT.get(), SETS.get()), (ctx(2), 0), "no call to set");
    }

    #[test]
    fn nested_guards_unwind_in_order() {
        reset(ctx(1));
        let a = bind(ctx(2)).unwrap();
        let b = bind(ctx(3)).unwrap();
        assert_eq!(CURRENT.get(), ctx(3));
        drop(b);
        assert_eq!(CURRENT.get(), ctx(2));
        drop(a);
        assert_eq!(CURRENT.get(), ctx(1));
    }

    #[test]
    fn a_failed_bind_is_an_error_and_changes_nothing() {
        reset(ctx(1));
        FAIL_GET.set(true);
        assert!(matches!(bind(ctx(2)), Err(Error::Backend { .. })));
        FAIL_GET.set(false);
        assert_eq!((CURRENT.get(), SETS.get()), (ctx(1), 0));
        FAIL_SET.set(true);
        assert!(matches!(bind(ctx(2)), Err(Error::Backend { .. })));
        assert_eq!(CURRENT.get(), ctx(1));
    }

    #[test]
    fn a_failed_restore_is_logged_not_a_panic() {
        reset(ctx(1));
        let g = bind(ctx(2)).unwrap();
        FAIL_SET.set(true);
        drop(g);
        assert_eq!(CURRENT.get(), ctx(2));
    }

    #[test]
    fn restore_puts_back_what_cudarc_changed_and_never_guesses() {
        // cudarc bound its own context (a drop, a call without a guard): restored.
        reset(ctx(1));
        {
            let _r = Restore::<Fake>::now();
            CURRENT.set(ctx(9));
        }
        assert_eq!(CURRENT.get(), ctx(1));
        // Nothing changed: no call.
        reset(ctx(1));
        drop(Restore::<Fake>::now());
        assert_eq!(SETS.get(), 0);
        // None was current: none again.
        reset(std::ptr::null_mut());
        {
            let _r = Restore::<Fake>::now();
            CURRENT.set(ctx(9));
        }
        assert!(CURRENT.get().is_null());
        // What was current could not be read: left alone, not unbound.
        reset(ctx(1));
        FAIL_GET.set(true);
        let r = Restore::<Fake>::now();
        FAIL_GET.set(false);
        CURRENT.set(ctx(9));
        drop(r);
        assert_eq!(CURRENT.get(), ctx(9), "a guess unbound the thread's context");
    }
}
