//! Allocation that waits for the device's verdict ([`Pool::allocate_params_async`]: the
//! browser's WebGPU says only later whether it could make a buffer), and the one retry after
//! the device ran out of memory that both kinds of allocation make.

use super::{lock, Pool, Prepared, Source};
use crate::error::{Error, Result};
use crate::ptr::DevicePtr;
use crate::snapshot::EventKind;
use crate::storage::Storage;

impl<S: Storage> Pool<S> {
    /// [`Pool::allocate_params`], waiting for the device's verdict where it comes only later
    /// (the browser's WebGPU): out of memory there is [`Error::OutOfMemory`] here, after the
    /// cache was given back and the exact size tried once more, as native allocations do.
    pub async fn allocate_params_async(
        &self,
        nbytes: usize,
        alignment: usize,
        label: Option<&str>,
        params: S::Params,
    ) -> Result<DevicePtr> {
        let r = async {
            let (mut plan, source, reservation) = self.start(nbytes, alignment, params)?;
            let made = match source {
                Source::Cached(c) => {
                    return Ok(self.record(plan, c, false, reservation.map(|r| r.span), label))
                }
                Source::Fresh(id) => (id, self.alloc_block_async(&mut plan, id).await),
            };
            self.finish(plan, made, reservation, label)
        }
        .await;
        if let Err(Error::OutOfMemory { requested, detail, .. }) = &r {
            self.note(|| EventKind::OutOfMemory { requested: *requested, detail: detail.clone() });
        }
        r
    }

    /// Async twin of [`Pool::alloc_block`] (the storage's verdict awaited).
    async fn alloc_block_async(&self, plan: &mut Prepared<S::Params>, id: u64) -> Result<S::Block> {
        let (alignment, params) = (plan.key.alignment, plan.key.params.clone());
        let capacity = plan.block;
        match self.storage.alloc_async(capacity, alignment, &params, &block_name(id, capacity)).await {
            Err(Error::OutOfMemory { .. }) => {
                self.retry_exact(plan);
                let name = block_name(id, plan.exact);
                let made = self.storage.alloc_async(plan.exact, alignment, &params, &name).await;
                self.second_try(plan, made)
            }
            other => other,
        }
    }

    /// The device ran out: gives the whole cache back (noted as an eviction, if any) and makes
    /// the request the exact size for the one retry.
    pub(super) fn retry_exact(&self, plan: &mut Prepared<S::Params>) {
        let (freed, blocks) = {
            let mut state = lock(&self.state);
            let bytes = state.cache.bytes();
            let blocks = Self::take_cache(&mut state);
            if bytes > 0 {
                self.note(|| EventKind::Evict { bytes });
            }
            // The retry asks for the exact size: what is pending shrinks with it.
            state.pending -= plan.block - plan.exact;
            (bytes, blocks)
        };
        drop(blocks);
        log::debug!("devalloc: {} out of memory; emptied {freed} cached bytes and retrying", self.device);
        plan.key.capacity = plan.exact;
        plan.block = plan.exact;
        // A block of the request's own size: no planned arena or slot (see `settle.rs`).
        (plan.at, plan.slot) = (None, None);
    }

    /// The retry's result: out of memory again is the pool's out-of-memory error.
    pub(super) fn second_try(&self, plan: &Prepared<S::Params>, made: Result<S::Block>) -> Result<S::Block> {
        made.map_err(|e| match e {
            Error::OutOfMemory { detail, .. } => self.out_of_memory(&lock(&self.state), plan.size, detail),
            e => e,
        })
    }
}

/// How a block names itself to the device (wgpu's messages show it).
pub(super) fn block_name(id: u64, capacity: u64) -> String {
    format!("devalloc block {id} ({capacity} bytes)")
}
