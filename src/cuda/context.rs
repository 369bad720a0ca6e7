//! A device's CUDA context, opened on first use, and the guard that leaves the caller's own
//! current context as it found it.
//!
//! A multi-GPU runtime keeps "its" context current on each thread. cudarc's `bind_to_thread`
//! makes devalloc's current and never restores, and cudarc's stream, event and pinned-memory
//! `Drop`s bind too. So every devalloc entry point, and every drop of a cudarc object, runs
//! inside a [`CtxGuard`], which restores whatever was current before (as PyTorch's device
//! guard does).
#![allow(unsafe_code)] // at the edge: every unsafe block has a SAFETY note

use std::sync::Arc;

use cudarc::driver::sys::CUcontext;
use cudarc::driver::{result, CudaContext, CudaStream};

use super::errors::{driver_error, means_device_unavailable};
use crate::device::Device;
use crate::error::{Error, Result};

/// Makes a context current for its lifetime and restores the one that was current before.
pub(crate) struct CtxGuard {
    previous: Option<CUcontext>,
    changed: bool,
}

impl CtxGuard {
    /// Makes `ctx` current on this thread.
    pub(crate) fn bind(ctx: &CudaContext, device: Device) -> Result<Self> {
        let previous = result::ctx::get_current()
            .map_err(|e| driver_error(device, "reading the current context", e, 0))?;
        let ours = ctx.cu_ctx();
        if previous == Some(ours) {
            return Ok(CtxGuard { previous, changed: false });
        }
        // SAFETY: `ours` is a live context (the CudaContext holds a reference to it).
        unsafe { result::ctx::set_current(ours) }
            .map_err(|e| driver_error(device, "making the context current", e, 0))?;
        Ok(CtxGuard { previous, changed: true })
    }
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        if self.changed {
            let previous = self.previous.unwrap_or(std::ptr::null_mut());
            // SAFETY: `previous` was current on this thread when the guard was made (or null,
            // which unbinds): the caller's context, which the caller keeps alive.
            if let Err(e) = unsafe { result::ctx::set_current(previous) } {
                log::error!("devalloc: could not restore the caller's CUDA context: {e:?}");
            }
        }
    }
}

/// A device's context and devalloc's stream on it.
pub(crate) struct Opened {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
}

impl Opened {
    /// Opens (retains the primary context of) device `ordinal`, leaving the caller's current
    /// context as it was. Code 46 (busy or exclusive-process) makes this one device
    /// unavailable: [`Error::NotFound`].
    pub(crate) fn open(ordinal: usize, device: Device) -> Result<Opened> {
        let previous = result::ctx::get_current()
            .map_err(|e| driver_error(device, "reading the current context", e, 0))?;
        let restore = RestoreOnDrop(previous);
        let ctx = CudaContext::new(ordinal).map_err(|e| {
            if means_device_unavailable(&e) {
                Error::not_found(format!(
                    "{device} is unavailable: the GPU is busy or in exclusive-process mode (CUDA error 46)"
                ))
            } else {
                driver_error(device, "creating a context", e, 0)
            }
        })?;
        let stream = ctx.new_stream().map_err(|e| driver_error(device, "creating a stream", e, 0))?;
        drop(restore);
        Ok(Opened { ctx, stream })
    }
}

/// Restores a context on drop (for cudarc calls that bind without a guard of their own).
pub(crate) struct RestoreOnDrop(pub Option<CUcontext>);

impl Drop for RestoreOnDrop {
    fn drop(&mut self) {
        let previous = self.0.unwrap_or(std::ptr::null_mut());
        // SAFETY: `previous` was the caller's current context (or null) before cudarc bound
        // its own; the caller keeps it alive.
        if let Err(e) = unsafe { result::ctx::set_current(previous) } {
            log::error!("devalloc: could not restore the caller's CUDA context: {e:?}");
        }
    }
}

/// Runs `f` (which drops or uses cudarc objects that bind their context) and restores the
/// caller's current context afterwards.
pub(crate) fn keeping_current<T>(f: impl FnOnce() -> T) -> T {
    let previous = result::ctx::get_current().ok().flatten();
    let _restore = RestoreOnDrop(previous);
    f()
}
