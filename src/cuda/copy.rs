//! Device-to-device copies: on one device, overlapping ranges included; between two devices,
//! as peer copies with peer access enabled where the driver says it can be.
//!
//! One thing split for length with `storage.rs` (ARCHITECTURE.md's table): these are
//! `CudaStorage`'s copy methods, and the two files import each other.
//!
//! - **Overlap.** `cuMemcpy` does not handle overlapping ranges. Ranges at least
//!   [`MIN_DIRECT`] apart go in direct pieces as long as that distance, in the safe direction
//!   (front first when the destination is below the source, back first above): no piece's
//!   destination overlaps a source not yet copied. Closer ones go through a device temporary of
//!   [`TEMP`] bytes, piece by piece in the same safe order: never a temporary as long as the
//!   copy. The temporary is made on first need and kept (counted in `staging_bytes`), so that
//!   no copy calls `cuMemFree`, which waits for the whole device (a busy program's work too).
//! - **Peers.** Without `cuCtxEnablePeerAccess`, `cuMemcpyPeer` goes through host memory.
//!   Before the first copy between two devices, access is enabled both ways where
//!   `cuDeviceCanAccessPeer` says so (already enabled, as PyTorch may have done in the same
//!   primary contexts, counts as enabled); where it cannot be, the copy still works, staged
//!   by the driver.
#![allow(unsafe_code)] // at the edge: every unsafe block has a SAFETY note

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use cudarc::driver::{result, sys};

use super::context::CtxGuard;
use super::errors::{code, copy_error};
use super::open::Opened;
use super::policy;
use super::storage::{CudaBlock, CudaStorage};
use crate::error::Result;
use crate::storage::Storage;
use crate::sync::lock;

/// Overlapping copies at least this far apart go in direct pieces.
pub(crate) const MIN_DIRECT: u64 = 1 << 20;
/// The device temporary of closer overlapping copies.
pub(crate) const TEMP: u64 = 4 << 20;

/// One device-side copy of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    pub src: u64,
    pub dst: u64,
    pub len: u64,
    /// Through the temporary (`src` -> temporary -> `dst`), not directly.
    pub via_temp: bool,
}

/// The steps of a copy of `len` bytes from `s` to `d`, in order (see the module docs).
pub(crate) fn steps(s: u64, d: u64, len: u64) -> Vec<Step> {
    steps_with(s, d, len, MIN_DIRECT, TEMP)
}

pub(crate) fn steps_with(s: u64, d: u64, len: u64, min_direct: u64, temp: u64) -> Vec<Step> {
    if len == 0 || s == d {
        return Vec::new();
    }
    let overlap = s < d.saturating_add(len) && d < s.saturating_add(len);
    if !overlap {
        return vec![Step { src: s, dst: d, len, via_temp: false }];
    }
    let distance = s.abs_diff(d);
    let (piece, via_temp) = if distance >= min_direct { (distance, false) } else { (temp.min(len), true) };
    let n = len.div_ceil(piece);
    (0..n)
        .map(|k| {
            let i = if d < s { k } else { n - 1 - k };
            let at = i * piece;
            Step { src: s + at, dst: d + at, len: piece.min(len - at), via_temp }
        })
        .collect()
}

/// Peer access already settled from this storage's device to others: ordinal -> enabled.
#[derive(Default)]
pub(crate) struct Peers(Mutex<HashMap<usize, bool>>);

/// The device temporary of close overlapping copies, made on first need and kept; one copy
/// uses it at a time.
#[derive(Default)]
pub(crate) struct Temp {
    block: Mutex<Option<CudaBlock>>,
    bytes: AtomicU64,
}

impl Temp {
    /// Bytes held; never waits for a copy.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

impl CudaStorage {
    /// Copies on this device (the context is current).
    pub(crate) fn copy_on_device(&self, o: &Opened, s: u64, d: u64, len: u64) -> Result<()> {
        let plan = steps(s, d, len);
        if plan.is_empty() {
            return Ok(());
        }
        // Held for the whole copy (declared before the lease, so released after the stream
        // was waited for, on an error path too).
        let mut temp = None;
        if plan.iter().any(|p| p.via_temp) {
            let mut held = lock(&self.temp.block);
            if held.is_none() {
                *held = Some(self.alloc(
                    TEMP,
                    policy::DRIVER_ALIGNMENT,
                    &(),
                    "devalloc overlapping-copy temporary",
                )?);
                self.temp.bytes.store(TEMP, Ordering::Relaxed);
            }
            temp = Some(held);
        }
        let tmp = temp.as_ref().and_then(|t| t.as_ref()).map_or(0, CudaBlock::addr);
        let lease = o.streams.lease()?;
        let stream = lease.stream();
        for p in plan {
            let n = p.len as usize;
            // SAFETY: every range lies in a live allocation (the pool checked the copy; the
            // temporary, held by this copy alone, is as long as the longest piece); a direct piece's ranges do not overlap (the
            // plan's promise), and the steps run in stream order, so each reads what the steps
            // before it left.
            unsafe {
                if p.via_temp {
                    result::memcpy_dtod_async(tmp, p.src, n, stream)
                        .and_then(|()| result::memcpy_dtod_async(p.dst, tmp, n, stream))
                } else {
                    result::memcpy_dtod_async(p.dst, p.src, n, stream)
                }
            }
            .map_err(|e| copy_error(self.device(), "copying on the device", e))?;
        }
        lease.finish("copying on the device")
    }

    /// Copies `len` bytes to another device (a peer copy).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn copy_to_peer(
        &self,
        src: &CudaBlock,
        src_offset: u64,
        dst_storage: &CudaStorage,
        dst: &CudaBlock,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        let (so, dst_o) = (self.opened()?, dst_storage.opened()?);
        let _g = CtxGuard::bind(&so.ctx, self.device())?;
        self.enable_peer_access(so, dst_storage, dst_o);
        let lease = so.streams.lease()?;
        // SAFETY: both ranges are in bounds of live allocations of their devices (checked by
        // their pools, which hold the blocks until this returns); the stream is waited for
        // before returning.
        unsafe {
            result::memcpy_peer_async(
                dst_o.ctx.cu_ctx(),
                dst.addr() + dst_offset,
                so.ctx.cu_ctx(),
                src.addr() + src_offset,
                len as usize,
                lease.stream(),
            )
        }
        .map_err(|e| copy_error(self.device(), "copying between GPUs", e))?;
        lease.finish("copying between GPUs")
    }

    /// Enables peer access between the two devices, both ways, once (this device's context is
    /// current). Failures are logged: the copy then goes through the host, still right.
    fn enable_peer_access(&self, mine: &Opened, other: &CudaStorage, theirs: &Opened) {
        let key = other.ordinal();
        if lock(&self.peers.0).contains_key(&key) {
            return;
        }
        let there = {
            let enabled = enable_one_way(mine, theirs);
            let back = CtxGuard::bind(&theirs.ctx, other.device()).map(|_g| enable_one_way(theirs, mine));
            (enabled, back.unwrap_or(false))
        };
        match there {
            (true, true) => log::info!("devalloc: peer access enabled between {} and {}", self.device(), other.device()),
            _ => log::info!(
                "devalloc: peer access between {} and {} not (fully) enabled ({:?}): copies go through the host",
                self.device(),
                other.device(),
                there
            ),
        }
        lock(&self.peers.0).insert(key, there.0);
    }
}

/// Enables access from `from`'s context (current) to `to`'s memory where the devices allow it.
fn enable_one_way(from: &Opened, to: &Opened) -> bool {
    let mut can = 0;
    // SAFETY: plain queries of two valid device handles.
    let asked =
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, from.ctx.cu_device(), to.ctx.cu_device()) }.result();
    if asked.is_err() || can == 0 {
        return false;
    }
    // SAFETY: `to`'s context is live (held by `to`); `from`'s is current.
    match unsafe { sys::cuCtxEnablePeerAccess(to.ctx.cu_ctx(), 0) }.result() {
        Ok(()) => true,
        Err(e) if code(&e) == 704 => true, // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        Err(e) => {
            log::warn!("devalloc: cuCtxEnablePeerAccess: {e:?}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a plan on host memory as the device would, checking its promises.
    fn apply(mem: &mut [u8], plan: &[Step], temp: u64) {
        for p in plan {
            let (s, d, n) = (p.src as usize, p.dst as usize, p.len as usize);
            if p.via_temp {
                assert!(p.len <= temp, "{p:?}: the temporary is {temp} bytes");
                let tmp = mem[s..s + n].to_vec();
                mem[d..d + n].copy_from_slice(&tmp);
            } else {
                assert!(s + n <= d || d + n <= s, "{p:?}: a direct piece overlaps itself");
                let (src, dst) = if s < d {
                    let (a, b) = mem.split_at_mut(d);
                    (&a[s..s + n], &mut b[..n])
                } else {
                    let (a, b) = mem.split_at_mut(s);
                    (&b[..n], &mut a[d..d + n])
                };
                dst.copy_from_slice(src);
            }
        }
    }

    #[test]
    fn overlapping_copies_end_as_if_through_a_temporary() {
        let (min_direct, temp) = (64u64, 256u64);
        let size = 4096usize;
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let mut cases =
            vec![(0, 1, 4095), (1, 0, 4095), (0, 63, 1000), (63, 0, 1000), (0, 64, 2000), (100, 37, 7)];
        for _ in 0..400 {
            let len = 1 + next(2000);
            cases.push((next(size as u64 - len), next(size as u64 - len), len));
        }
        for (s, d, len) in cases {
            let mut mem: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
            let mut model = mem.clone();
            model.copy_within(s as usize..(s + len) as usize, d as usize);
            let plan = steps_with(s, d, len, min_direct, temp);
            apply(&mut mem, &plan, temp);
            assert!(mem == model, "copy of {len} bytes from {s} to {d}: {plan:?}");
            assert!(plan.iter().map(|p| p.len).sum::<u64>() == len || s == d, "{plan:?}");
        }
    }

    #[test]
    fn the_temporary_is_bounded_and_far_copies_need_none() {
        let mib = 1u64 << 20;
        // A 1 GiB copy one byte up: pieces through a 4 MiB temporary, not a 1 GiB one.
        let plan = steps(4096, 4097, 1 << 30);
        assert!(plan.iter().all(|p| p.via_temp && p.len <= TEMP), "{:?}", plan.first());
        assert_eq!(plan.len(), 256);
        // 8 MiB apart: direct pieces of 8 MiB.
        let plan = steps(0, 8 * mib, 100 * mib);
        assert!(plan.iter().all(|p| !p.via_temp && p.len <= 8 * mib));
        // Apart: one direct copy; nothing to do.
        assert_eq!(steps(0, 10, 10), vec![Step { src: 0, dst: 10, len: 10, via_temp: false }]);
        assert!(steps(5, 5, 100).is_empty() && steps(0, 9, 0).is_empty());
    }
}
