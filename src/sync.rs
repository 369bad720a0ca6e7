//! The one way devalloc takes a lock: past poisoning. devalloc updates what its locks guard in
//! steps that never panic half-way, so a panic elsewhere while a lock was held leaves the data
//! consistent, and the next caller carries on.

use std::sync::{LockResult, Mutex, MutexGuard, PoisonError};

/// A lock's result (`Mutex::lock`, `RwLock::read` / `write`, `Condvar::wait`), poisoned or not.
pub(crate) trait Unpoisoned<G> {
    /// The guard, whether or not a panic poisoned the lock.
    fn unpoisoned(self) -> G;
}

impl<G> Unpoisoned<G> for LockResult<G> {
    fn unpoisoned(self) -> G {
        self.unwrap_or_else(PoisonError::into_inner)
    }
}

/// Locks `m` (see the module docs).
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unpoisoned()
}
