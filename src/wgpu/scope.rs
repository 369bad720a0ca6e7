//! Error scopes around devalloc's own wgpu calls, and how what they catch becomes an [`Error`].
//!
//! devalloc never takes an app's uncaptured-error handler: every wgpu call it makes runs inside
//! a validation scope and, nested in it, an out-of-memory scope, pushed and popped around that
//! call alone (never left open across an `.await`, which in the browser would swallow the
//! app's own errors). On native the verdict is there at once; in the browser it arrives later,
//! so the blocking calls log it, and devalloc checks sizes and ranges up front so that wgpu
//! has nothing to refuse.
#![deny(unsafe_code)]

use super::platform;
use super::storage::WgpuStorage;
use crate::error::{Error, Result};

impl WgpuStorage {
    /// Runs `f` inside error scopes and turns what they caught into a devalloc error (native),
    /// or logs it (browser). `requested`: the bytes an out-of-memory error is about.
    pub(crate) fn scoped<T>(&self, what: &str, requested: u64, f: impl FnOnce() -> T) -> Result<T> {
        self.check_lost()?;
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let value = f();
        let oom = oom.pop();
        let validation = validation.pop();
        let verdict = async move { oom.await.or(validation.await) };
        match platform::settle(verdict, self.id, what) {
            None => Ok(value),
            Some(e) => Err(self.caught(what, requested, e)),
        }
    }

    /// The devalloc error for what a scope caught.
    fn caught(&self, what: &str, requested: u64, caught: wgpu::Error) -> Error {
        if self.lost.is_lost() {
            return self.lost.error(self.id);
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
            return self.lost.error(self.id);
        }
        Error::backend(self.id, format!("{what}: {e}"))
    }
}
