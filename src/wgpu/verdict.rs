//! Buffers whose out-of-memory verdict the browser gives only later: made in error scopes
//! whose verdict is either handed on ([`Gpu::create_marked`]) or awaited
//! ([`Gpu::create_async`]).

use std::future::Future;

use super::gpu::Gpu;
use super::platform::{Current, Platform};
use crate::error::Result;

impl Gpu {
    /// The buffer, made inside a validation and an out-of-memory scope, and the verdict of
    /// those scopes (an error, or `None`), to be awaited or handed on.
    fn create_in_scopes(
        &self,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<(wgpu::Buffer, impl Future<Output = Option<wgpu::Error>> + 'static)> {
        if self.lost.is_lost() {
            return Err(self.lost.error());
        }
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage,
            mapped_at_creation: false,
        });
        let (oom, validation) = (oom.pop(), validation.pop());
        Ok((buffer, async move { oom.await.or(validation.await) }))
    }

    /// [`Gpu::create`] where an out-of-memory verdict may come only later (the browser): it
    /// then runs `refused`, and the buffer returned is unusable. `refused` is dropped, unrun,
    /// once a verdict that is not out of memory is in (at once natively).
    pub fn create_marked(
        &self,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
        refused: Box<dyn FnOnce() + 'static>,
    ) -> Result<wgpu::Buffer> {
        let (buffer, verdict) = self.create_in_scopes(label, size, usage)?;
        match Current::settle_buffer(verdict, self.id, label, refused) {
            None => Ok(buffer),
            Some(e) => Err(self.caught(label, size, e)),
        }
    }

    /// [`Gpu::create`], waiting for the verdict of its scopes even in the browser: an
    /// out-of-memory there is [`Error::OutOfMemory`](crate::Error::OutOfMemory) here, not a
    /// warning later.
    pub async fn create_async(
        &self,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer> {
        let (buffer, verdict) = self.create_in_scopes(label, size, usage)?;
        match verdict.await {
            None => Ok(buffer),
            Some(e) => Err(self.caught(label, size, e)),
        }
    }
}
