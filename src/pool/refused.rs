//! Allocations the device refused after they were returned: the browser's WebGPU says that it
//! could not make a buffer (out of memory) only later, asynchronously, when `allocate` has
//! already handed out its pointer. The storage marks such a block ([`Storage::refused`]); the
//! pool then stops counting its allocation (stats, live list, history: a free and an
//! out-of-memory event) and remembers it, so that every later use of its pointer (copies,
//! buffers, bindings, `deallocate`) is [`Error::OutOfMemory`] naming it, never a backend error.
//! `allocate_async` waits for the verdict instead, and fails as native allocations do.

use super::address::Span;
use super::{lock, Pool, State};
use crate::error::{Error, Result};
use crate::ptr::DevicePtr;
use crate::snapshot::EventKind;
use crate::storage::Storage;

/// What the pool remembers of a refused allocation.
pub(super) struct Refusal {
    size: u64,
    label: Option<Box<str>>,
    span: Option<Span>,
}

impl<S: Storage> Pool<S> {
    /// Takes the allocations whose blocks the storage refused out of the live ones (looked for
    /// only when the storage's count of refusals has moved).
    pub(super) fn sweep_refused(&self, state: &mut State<S>) {
        let count = self.storage.refusals();
        if count == state.refusals_seen {
            return;
        }
        state.refusals_seen = count;
        // A block freed before its verdict came is in the cache: given back, never served.
        let (bytes, blocks) = state.cache.take_where(|b| self.storage.refused(b));
        if bytes > 0 {
            state.stats.reserved_bytes -= bytes;
            state.stats.cached_bytes -= bytes;
            self.note(|| EventKind::Evict { bytes });
        }
        drop(blocks);
        // So are the free ranges of a refused split block (its live pieces go below).
        let (bytes, blocks) = state.pieces.forget_where(|b| self.storage.refused(b));
        if bytes > 0 {
            state.stats.reserved_bytes -= bytes;
            state.stats.cached_bytes -= bytes;
            self.note(|| EventKind::Evict { bytes });
        }
        drop(blocks);
        let gone: Vec<u64> =
            state.live.iter().filter(|(_, l)| self.storage.refused(&l.block)).map(|(&a, _)| a).collect();
        for addr in gone {
            let Some(live) = state.live.remove(&addr) else { continue };
            let (size, capacity) = (live.size, live.key.capacity);
            let stats = &mut state.stats;
            stats.live_allocations -= 1;
            stats.allocated_bytes -= size;
            stats.reserved_bytes -= capacity;
            let refusal = Refusal { size, label: live.label.clone(), span: live.span };
            let detail = self.refused_detail(addr, &refusal);
            state.refused.insert(addr, refusal);
            self.note(|| EventKind::Free { addr, size, capacity, to_cache: false });
            self.note(|| EventKind::OutOfMemory { requested: size, detail });
        }
    }

    /// After a copy through `block` (the allocation at or around `ptr`): where the device
    /// refused the block meanwhile (the verdict came while the copy ran), the refusal, whatever
    /// the copy said; else `r`.
    pub(super) fn unless_refused(&self, block: &S::Block, ptr: DevicePtr, r: Result<()>) -> Result<()> {
        if !self.storage.refused(block) {
            return r;
        }
        let mut state = lock(&self.state);
        self.sweep_refused(&mut state);
        Err(self.refusal(&state, ptr).unwrap_or_else(|| Error::OutOfMemory {
            requested: 0,
            device: self.device,
            detail: "the browser could not make this allocation's buffer, after allocate had returned it"
                .into(),
        }))
    }

    /// The error for a use of `ptr` in an allocation the device refused, if it is in one.
    pub(super) fn refusal(&self, state: &State<S>, ptr: DevicePtr) -> Option<Error> {
        let (&base, r) = state.refused.range(..=ptr.addr()).next_back()?;
        (ptr.addr() <= base.saturating_add(r.size)).then(|| Error::OutOfMemory {
            requested: r.size,
            device: self.device,
            detail: self.refused_detail(base, r),
        })
    }

    /// `deallocate` of a refused allocation: forgotten (its addresses go back), and the
    /// refusal is the answer.
    pub(super) fn forget_refused(&self, state: &mut State<S>, ptr: DevicePtr) -> Option<Error> {
        let e = self.refusal(state, ptr)?;
        if let Some(r) = state.refused.remove(&ptr.addr()) {
            if let (Some(w), Some(span)) = (state.window.as_ref(), r.span) {
                lock(w).release(span);
            }
        }
        Some(e)
    }

    fn refused_detail(&self, base: u64, r: &Refusal) -> String {
        let name = r.label.as_deref().map_or(String::new(), |l| format!("'{l}', "));
        format!(
            "the browser could not make the buffer of the allocation {name}of {} bytes at {}, after allocate had returned it; it holds nothing and is no longer counted (allocate_async reports this when it allocates)",
            r.size,
            DevicePtr::new(base)
        )
    }
}
