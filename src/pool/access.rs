//! The pool's data path: copies through checked pointers to the storage's blocks.

use super::history::CopyKind;
use super::Pool;
use crate::checks::len64;
use crate::error::Result;
use crate::ptr::DevicePtr;
use crate::storage::Storage;

impl<S: Storage> Pool<S> {
    /// Writes `src` at `dst`. 0 bytes: Ok without looking at `dst`.
    pub fn write(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let r = self.block_at(dst, len64(src.len()))?;
        self.storage.write(&r.block, r.offset, src)?;
        self.note_copy(CopyKind::HostToDevice, len64(src.len()));
        Ok(())
    }

    /// Async twin of [`Pool::write`].
    pub async fn write_async(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let r = self.block_at(dst, len64(src.len()))?;
        self.storage.write_async(&r.block, r.offset, src).await?;
        self.note_copy(CopyKind::HostToDevice, len64(src.len()));
        Ok(())
    }

    /// Reads `dst.len()` bytes at `src`. 0 bytes: Ok without looking at `src`.
    pub fn read(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let r = self.block_at(src, len64(dst.len()))?;
        self.storage.read(&r.block, r.offset, dst)?;
        self.note_copy(CopyKind::DeviceToHost, len64(dst.len()));
        Ok(())
    }

    /// Async twin of [`Pool::read`].
    pub async fn read_async(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let r = self.block_at(src, len64(dst.len()))?;
        self.storage.read_async(&r.block, r.offset, dst).await?;
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
        self.storage.copy(&s.block, s.offset, &d.block, d.offset, len64(nbytes))?;
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
        self.storage.copy_async(&s.block, s.offset, &d.block, d.offset, len64(nbytes)).await?;
        self.note_copy(CopyKind::DeviceToDevice, len64(nbytes));
        Ok(())
    }
}
