//! Error scopes around devalloc's own wgpu calls, and how what they catch becomes an [`Error`].
//!
//! devalloc never takes an app's uncaptured-error handler: every wgpu call it makes that could
//! raise an error runs inside a validation scope (and, when it makes a buffer, an
//! out-of-memory scope), pushed and popped around that call alone: never left open across an
//! `.await`, which in the browser would swallow the app's own errors. The one call without: a
//! direct-route map of a buffer the app was never given, which cannot raise one
//! (`WgpuStorage::map_block` says why). A scope costs ~40 ns on native. The verdict is there
//! at once on native. In the browser it
//! arrives later and each scope is a round trip into JS, so there devalloc's copies, whose
//! sizes and ranges it checks up front so that wgpu has nothing to refuse, run without scopes:
//! an unexpected error from one would reach the app's uncaptured-error handler. Buffer
//! creation keeps its scopes there, and what they catch is logged.

use super::platform;
use super::storage::WgpuStorage;
use crate::error::{Error, Result};

/// Which errors a wgpu call can raise, and so which scopes it runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Raises {
    /// Making a buffer: validation errors and out of memory.
    ValidationOrOom,
    /// Encoding and submitting copies devalloc checked up front: validation errors only.
    Validation,
}

impl WgpuStorage {
    /// Runs `f` inside error scopes and turns what they caught into a devalloc error (native),
    /// or logs it (browser). `requested`: the bytes an out-of-memory error is about. A loss
    /// recorded earlier is [`Error::DeviceLost`] at once; polling for one is the caller's
    /// (once per devalloc call, at its start).
    pub(crate) fn scoped<T>(
        &self,
        what: &str,
        requested: u64,
        raises: Raises,
        f: impl FnOnce() -> T,
    ) -> Result<T> {
        if self.lost.is_lost() {
            return Err(self.lost.error());
        }
        if raises == Raises::Validation && !platform::SCOPE_CHECKED_WORK {
            return Ok(f());
        }
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let oom = (raises == Raises::ValidationOrOom)
            .then(|| self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory));
        let value = f();
        let oom = oom.map(|g| g.pop());
        let validation = validation.pop();
        let verdict = async move {
            let caught = match oom {
                Some(oom) => oom.await,
                None => None,
            };
            caught.or(validation.await)
        };
        match platform::settle(verdict, self.id, what) {
            None => Ok(value),
            Some(e) => Err(self.caught(what, requested, e)),
        }
    }

    /// The devalloc error for what a scope caught.
    fn caught(&self, what: &str, requested: u64, caught: wgpu::Error) -> Error {
        if self.lost.is_lost() {
            return self.lost.error();
        }
        match caught {
            wgpu::Error::OutOfMemory { .. } => Error::OutOfMemory {
                requested,
                device: self.id,
                detail: format!("wgpu reported out of memory during {what}"),
            },
            e => {
                Error::Backend { device: self.id, message: format!("{what}: {e}"), source: Some(Box::new(e)) }
            }
        }
    }

    /// A backend error without a wgpu error value.
    pub(crate) fn backend_error(&self, what: &str, e: impl std::fmt::Display) -> Error {
        if self.lost.is_lost() {
            return self.lost.error();
        }
        Error::backend(self.id, format!("{what}: {e}"))
    }
}
