//! The one lock helper: every `Mutex` in devalloc is locked through [`lock`].
#![deny(unsafe_code)]

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, carrying on past poisoning: devalloc updates what its locks guard in steps that
/// never panic half-way, so a panic elsewhere while one was held leaves the data consistent.
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
