//! The pool's data path: pointers checked against the live allocations, and copies through
//! them to the storage's blocks.

use std::sync::Arc;

use super::history::CopyKind;
use super::{lock, BlockRef, Live, Pool, State};
use crate::checks::len64;
use crate::error::{Error, PointerProblem, Result};
use crate::ptr::DevicePtr;
use crate::storage::Storage;

impl<S: Storage> Pool<S> {
    pub(super) fn find(state: &State<S>, addr: u64) -> Option<(u64, &Live<S>)> {
        state.live.range(..=addr).next_back().filter(|(&b, l)| addr <= b + l.size).map(|(&b, l)| (b, l))
    }

    pub(super) fn pointer_problem(&self, state: &State<S>, ptr: DevicePtr) -> PointerProblem {
        if ptr.is_null() {
            PointerProblem::Null
        } else if state.window.as_ref().is_some_and(|w| lock(w).was_freed(ptr.addr())) {
            PointerProblem::Freed
        } else {
            PointerProblem::Unknown
        }
    }

    /// Whether `ptr` lies in (or at the end of) a live allocation of this pool.
    pub fn contains(&self, ptr: DevicePtr) -> bool {
        Self::find(&lock(&self.state), ptr.addr()).is_some()
    }

    /// The block behind `ptr`, checked so that `len` bytes from `ptr` stay in its allocation.
    pub fn block_at(&self, ptr: DevicePtr, len: u64) -> Result<BlockRef<S::Block>> {
        let mut state = lock(&self.state);
        self.sweep_refused(&mut state);
        let Some((base, live)) = Self::find(&state, ptr.addr()) else {
            if let Some(e) = self.refusal(&state, ptr) {
                return Err(e);
            }
            let problem = self.pointer_problem(&state, ptr);
            return Err(Error::InvalidPointer { ptr, device: self.device, problem });
        };
        let offset = ptr.addr() - base;
        if offset.checked_add(len).is_none_or(|end| end > live.size) {
            return Err(Error::OutOfBounds {
                device: self.device,
                what: "an allocation".into(),
                offset,
                len,
                size: live.size,
            });
        }
        Ok(BlockRef {
            block: Arc::clone(&live.block),
            offset: live.at() + offset,
            available: live.size - offset,
            _piece: live.piece.clone(),
        })
    }

    /// Writes `src` at `dst`. 0 bytes: Ok without looking at `dst`.
    pub fn write(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let r = self.block_at(dst, len64(src.len()))?;
        self.unless_refused(&r.block, dst, self.storage.write(&r.block, r.offset, src))?;
        self.note_copy(CopyKind::HostToDevice, len64(src.len()));
        Ok(())
    }

    /// Async twin of [`Pool::write`].
    pub async fn write_async(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let r = self.block_at(dst, len64(src.len()))?;
        let done = self.storage.write_async(&r.block, r.offset, src).await;
        self.unless_refused(&r.block, dst, done)?;
        self.note_copy(CopyKind::HostToDevice, len64(src.len()));
        Ok(())
    }

    /// Fills `len` bytes at `dst` in place (see `DeviceAllocator::fill_in_place`); `None` where
    /// the storage has no such route. A bad range is `Some` with its error and nothing landed.
    /// Each piece after the first is checked as a copy would be: a range freed (or given to
    /// another block) meanwhile ends the fill with its error, as the next copy of a windowed
    /// stream would.
    pub fn fill_in_place(
        &self,
        dst: DevicePtr,
        len: u64,
        piece: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Option<(u64, Result<()>)> {
        if len == 0 {
            return Some((0, Ok(())));
        }
        let r = match self.block_at(dst, len) {
            Ok(r) => r,
            Err(e) => return Some((0, Err(e))),
        };
        let (mut given, mut stale) = (0u64, None);
        let mut checked = |buf: &mut [u8]| {
            if given > 0 {
                let still = dst.offset_u64(given).and_then(|at| self.block_at(at, len - given));
                match still {
                    Ok(now) if Arc::ptr_eq(&now.block, &r.block) => {}
                    Ok(_) => {
                        stale = Some(Error::invalid_argument(
                            "the range was freed and allocated again while it was being filled",
                        ));
                        return 0;
                    }
                    Err(e) => {
                        stale = Some(e);
                        return 0;
                    }
                }
            }
            let n = fill(buf).min(buf.len());
            given += n as u64;
            n
        };
        let (landed, done) = self.storage.fill_in_place(&r.block, r.offset, len, piece, &mut checked)?;
        let done = match stale {
            Some(e) => done.and(Err(e)),
            None => done,
        };
        let done = self.unless_refused(&r.block, dst, done);
        if landed > 0 {
            self.note_copy(CopyKind::HostToDevice, landed);
        }
        Some((landed, done))
    }

    /// Reads `dst.len()` bytes at `src`. 0 bytes: Ok without looking at `src`.
    pub fn read(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let r = self.block_at(src, len64(dst.len()))?;
        self.unless_refused(&r.block, src, self.storage.read(&r.block, r.offset, dst))?;
        self.note_copy(CopyKind::DeviceToHost, len64(dst.len()));
        Ok(())
    }

    /// Async twin of [`Pool::read`].
    pub async fn read_async(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let r = self.block_at(src, len64(dst.len()))?;
        let done = self.storage.read_async(&r.block, r.offset, dst).await;
        self.unless_refused(&r.block, src, done)?;
        self.note_copy(CopyKind::DeviceToHost, len64(dst.len()));
        Ok(())
    }

    /// Copies `nbytes` from `src` to `dst`, both in this pool (overlap allowed).
    pub fn copy(&self, dst: DevicePtr, src: DevicePtr, nbytes: usize) -> Result<()> {
        if nbytes == 0 {
            return Ok(());
        }
        let s = self.block_at(src, len64(nbytes))?;
        let d = self.block_at(dst, len64(nbytes))?;
        let done = self.storage.copy(&s.block, s.offset, &d.block, d.offset, len64(nbytes));
        self.unless_refused(&d.block, dst, self.unless_refused(&s.block, src, done))?;
        self.note_copy(CopyKind::DeviceToDevice, len64(nbytes));
        Ok(())
    }

    /// Async twin of [`Pool::copy`].
    pub async fn copy_async(&self, dst: DevicePtr, src: DevicePtr, nbytes: usize) -> Result<()> {
        if nbytes == 0 {
            return Ok(());
        }
        let s = self.block_at(src, len64(nbytes))?;
        let d = self.block_at(dst, len64(nbytes))?;
        let done = self.storage.copy_async(&s.block, s.offset, &d.block, d.offset, len64(nbytes)).await;
        self.unless_refused(&d.block, dst, self.unless_refused(&s.block, src, done))?;
        self.note_copy(CopyKind::DeviceToDevice, len64(nbytes));
        Ok(())
    }
}
