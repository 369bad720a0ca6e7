//! Storage apart from policy: a [`Storage`] trait for raw device memory, and the generic
//! [`Pool`] that every built-in allocator runs on top of it.
//!
//! The pool owns the policy: address bookkeeping (virtual addresses per device, or the
//! storage's real ones), bounds checks, a size-class cache of freed blocks, a memory limit,
//! statistics, planned pools and the leak report. A backend only says how to allocate, read,
//! write and copy one block. The pool logic is tested on host memory, without a GPU.
//!
//! Addresses: a storage without real addresses (host, wgpu) gets virtual ones from a window of
//! 2^48 bytes per device, `((type + 1) << 56) | ((index & 0xff) << 48)`; bases are at least
//! 256-byte aligned, 256 bytes of unused gap separate allocations, and a freed address is not
//! handed out again until the window wraps, so use-after-free and double free are reported as
//! such. A cached block gets a fresh address when it is reused.
#![deny(unsafe_code)]

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::allocator::{check_request, round_up, AllocatorStats, BoxFuture, DEFAULT_ALIGNMENT};
use crate::device::Device;
use crate::error::{Error, PointerProblem, Result};
use crate::planned::PlanTable;
use crate::ptr::DevicePtr;
use crate::WasmNotSendSync;

/// Raw device storage: how one backend allocates, reads, writes and copies a block.
///
/// The [`Pool`] above it checks every pointer, offset and length before calling in, so a
/// storage sees only in-bounds requests on blocks it made.
pub trait Storage: WasmNotSendSync {
    /// One block of device memory; dropping it frees it.
    type Block: WasmNotSendSync;

    /// The device this storage allocates on.
    fn device(&self) -> Device;

    /// Block sizes are multiples of this (wgpu: 4).
    fn granularity(&self) -> u64 {
        1
    }

    /// The largest block the device allows.
    fn max_block_size(&self) -> u64;

    /// Allocates a block of `capacity` bytes whose start honours `alignment`. Running out of
    /// device memory must be [`Error::OutOfMemory`] (the pool then empties its cache and tries
    /// once more).
    fn alloc(&self, capacity: u64, alignment: u64) -> Result<Self::Block>;

    /// The block's real device address, for storages that have them (CUDA). `None` (the
    /// default) makes the pool hand out virtual addresses.
    fn address(&self, block: &Self::Block) -> Option<u64> {
        let _ = block;
        None
    }

    /// A short human name of the device (adapter or GPU name).
    fn name(&self) -> String {
        self.device().to_string()
    }

    /// Writes `src` at `offset` in `block`.
    fn write(&self, block: &Self::Block, offset: u64, src: &[u8]) -> Result<()>;

    /// Reads `dst.len()` bytes at `offset` in `block`.
    fn read(&self, block: &Self::Block, offset: u64, dst: &mut [u8]) -> Result<()>;

    /// Async twin of [`Storage::write`] for backends that must not block (the browser).
    /// Default: the blocking write.
    fn write_async<'a>(
        &'a self,
        block: &'a Self::Block,
        offset: u64,
        src: &'a [u8],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(std::future::ready(self.write(block, offset, src)))
    }

    /// Async twin of [`Storage::read`]. Default: the blocking read.
    fn read_async<'a>(
        &'a self,
        block: &'a Self::Block,
        offset: u64,
        dst: &'a mut [u8],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(std::future::ready(self.read(block, offset, dst)))
    }

    /// Copies `len` bytes between two blocks of this storage (possibly the same block, with
    /// ranges that may overlap: the result must be as if through a temporary).
    fn copy(
        &self,
        src: &Self::Block,
        src_offset: u64,
        dst: &Self::Block,
        dst_offset: u64,
        len: u64,
    ) -> Result<()>;

    /// Async twin of [`Storage::copy`]. Default: the blocking copy.
    fn copy_async<'a>(
        &'a self,
        src: &'a Self::Block,
        src_offset: u64,
        dst: &'a Self::Block,
        dst_offset: u64,
        len: u64,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(std::future::ready(self.copy(src, src_offset, dst, dst_offset, len)))
    }
}

/// Settings of a [`Pool`].
#[derive(Clone, Debug, Default)]
pub struct PoolConfig {
    /// Keep freed blocks by size class and reuse them. Sizes are then rounded up to a size
    /// class (at most 25% more: four classes per power of two, 256 bytes at least).
    pub caching: bool,
    /// Most bytes the pool may hold from the device (live and cached). Past it an allocation
    /// is [`Error::OutOfMemory`] (or [`Error::TooLarge`] when it alone exceeds the limit),
    /// before the device runs out.
    pub memory_limit: Option<u64>,
}

/// The block behind a pointer, and the pointer's offset in it.
pub struct Resolved<B> {
    /// The block (kept alive while the caller uses it, even if freed meanwhile).
    pub block: Arc<B>,
    /// Offset of the pointer from the block's start.
    pub offset: u64,
}

/// A live allocation, as reported by [`Pool::live_allocations`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocationInfo {
    /// Its address.
    pub ptr: DevicePtr,
    /// Bytes requested.
    pub size: u64,
    /// Bytes held for it.
    pub capacity: u64,
    /// Its label, if it was given one.
    pub label: Option<String>,
}

struct Live<B> {
    size: u64,
    capacity: u64,
    alignment: u64,
    block: Arc<B>,
    label: Option<Box<str>>,
}

struct State<B> {
    live: BTreeMap<u64, Live<B>>,
    /// (capacity, alignment) -> freed blocks.
    cache: BTreeMap<(u64, u64), Vec<B>>,
    cursor: u64,
    wrapped: bool,
    freed: VecDeque<(u64, u64)>,
    stats: AllocatorStats,
    plans: PlanTable,
}

const WINDOW_BITS: u32 = 48;
const GUARD: u64 = 256;
const FREED_REMEMBERED: usize = 4096;

/// Generic allocation policy over a [`Storage`]; see the module docs.
pub struct Pool<S: Storage> {
    storage: S,
    device: Device,
    config: Mutex<PoolConfig>,
    state: Mutex<State<S::Block>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere while holding the lock cannot leave the bookkeeping half-updated in a
    // way that matters more than refusing every later call would, so poisoning is ignored.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Size class of a request: four classes per power of two, 256 bytes at least.
pub fn size_class(size: u64) -> Option<u64> {
    if size <= 256 {
        return Some(256);
    }
    let pow = 63 - (size - 1).leading_zeros(); // 2^pow < size <= 2^(pow+1)
    let step = 1u64 << (pow - 2);
    round_up(size, step)
}

impl<S: Storage> Pool<S> {
    /// A pool over `storage`.
    pub fn new(storage: S, config: PoolConfig) -> Self {
        let device = storage.device();
        let window = Self::window_start(device);
        Pool {
            storage,
            device,
            config: Mutex::new(config),
            state: Mutex::new(State {
                live: BTreeMap::new(),
                cache: BTreeMap::new(),
                cursor: window + 0x1_0000,
                wrapped: false,
                freed: VecDeque::new(),
                stats: AllocatorStats::default(),
                plans: PlanTable::new(),
            }),
        }
    }

    fn window_start(device: Device) -> u64 {
        ((device.device_type as u64 + 1) << 56) | ((u64::from(device.index) & 0xff) << WINDOW_BITS)
    }

    /// The storage under the pool.
    pub fn storage(&self) -> &S {
        &self.storage
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Sets (or with `None` lifts) the memory limit; blocks already held are not freed.
    pub fn set_memory_limit(&self, limit: Option<u64>) {
        lock(&self.config).memory_limit = limit;
    }

    /// The memory limit.
    pub fn memory_limit(&self) -> Option<u64> {
        lock(&self.config).memory_limit
    }

    /// Allocates `nbytes` aligned to `alignment`.
    pub fn allocate(&self, nbytes: usize, alignment: usize) -> Result<DevicePtr> {
        self.allocate_labeled(nbytes, alignment, None)
    }

    /// Allocates like [`Pool::allocate`], with a label shown in the leak report.
    pub fn allocate_labeled(
        &self,
        nbytes: usize,
        alignment: usize,
        label: Option<&str>,
    ) -> Result<DevicePtr> {
        let device = self.device;
        check_request(nbytes, alignment, device)?;
        let size = nbytes as u64;
        let alignment = (alignment as u64).max(DEFAULT_ALIGNMENT as u64);
        let config = lock(&self.config).clone();
        let too_large = |max| Error::TooLarge { requested: size, max, device };
        let capacity = if config.caching { size_class(size) } else { Some(size) }
            .and_then(|c| round_up(c, self.storage.granularity()))
            .ok_or_else(|| too_large(self.storage.max_block_size()))?;
        let max = self.storage.max_block_size();
        if capacity > max {
            return Err(too_large(max));
        }
        if let Some(limit) = config.memory_limit {
            if capacity > limit {
                return Err(too_large(limit));
            }
        }

        let mut state = lock(&self.state);
        let cached = if config.caching {
            state.cache.get_mut(&(capacity, alignment)).and_then(Vec::pop)
        } else {
            None
        };
        let block = match cached {
            Some(block) => {
                state.stats.cache_hits += 1;
                state.stats.cached_bytes -= capacity;
                block
            }
            None => {
                let mut evicted = Vec::new();
                if let Some(limit) = config.memory_limit {
                    if state.stats.reserved_bytes + capacity > limit {
                        evicted = Self::take_cache(&mut state);
                    }
                    if state.stats.reserved_bytes + capacity > limit {
                        let in_use = state.stats.reserved_bytes;
                        return Err(Error::OutOfMemory {
                            requested: size,
                            device,
                            detail: format!("devalloc memory limit of {limit} bytes, {in_use} bytes in use"),
                        });
                    }
                }
                // Hold the bytes while the device allocates, without holding the lock.
                Self::add_reserved(&mut state.stats, capacity);
                drop(state);
                drop(evicted);
                let block = match self.storage.alloc(capacity, alignment) {
                    Err(Error::OutOfMemory { .. }) => {
                        let freed = self.empty_cache();
                        log::debug!(
                            "devalloc: {device} out of memory; emptied {freed} cached bytes and retrying"
                        );
                        self.storage.alloc(capacity, alignment)
                    }
                    other => other,
                };
                state = lock(&self.state);
                match block {
                    Ok(block) => {
                        // A miss counts once the device has handed out the memory.
                        state.stats.cache_misses += 1;
                        block
                    }
                    Err(e) => {
                        state.stats.reserved_bytes -= capacity;
                        return Err(e);
                    }
                }
            }
        };

        let base = match self.storage.address(&block) {
            Some(addr) => addr,
            None => match Self::reserve_virtual(&mut state, device, capacity, alignment) {
                Some(addr) => addr,
                None => {
                    state.stats.reserved_bytes -= capacity;
                    return Err(Error::OutOfMemory {
                        requested: size,
                        device,
                        detail: "devalloc's virtual address window is full".into(),
                    });
                }
            },
        };
        let live = Live { size, capacity, alignment, block: Arc::new(block), label: label.map(Into::into) };
        state.live.insert(base, live);
        let stats = &mut state.stats;
        stats.allocations += 1;
        stats.live_allocations += 1;
        stats.allocated_bytes += size;
        stats.peak_allocated_bytes = stats.peak_allocated_bytes.max(stats.allocated_bytes);
        Ok(DevicePtr::new(base))
    }

    fn add_reserved(stats: &mut AllocatorStats, bytes: u64) {
        stats.reserved_bytes += bytes;
        stats.peak_reserved_bytes = stats.peak_reserved_bytes.max(stats.reserved_bytes);
    }

    /// Next-fit in the device's virtual window; wraps around once before giving up.
    fn reserve_virtual(
        state: &mut State<S::Block>,
        device: Device,
        capacity: u64,
        alignment: u64,
    ) -> Option<u64> {
        let start = Self::window_start(device) + 0x1_0000;
        let end = Self::window_start(device) + (1u64 << WINDOW_BITS);
        let span = round_up(capacity, GUARD)? + GUARD;
        let mut candidate = round_up(state.cursor, alignment)?;
        let mut wrapped_now = false;
        loop {
            if candidate.checked_add(span).is_none_or(|e| e > end) {
                if wrapped_now {
                    return None;
                }
                wrapped_now = true;
                state.wrapped = true;
                candidate = round_up(start, alignment)?;
                continue;
            }
            // The live allocation at or below the candidate must end before it, and the next
            // one must start after the candidate's span.
            let below = state.live.range(..=candidate).next_back();
            if let Some((&b, l)) = below {
                let l_end = b + round_up(l.capacity, GUARD)? + GUARD;
                if l_end > candidate {
                    candidate = round_up(l_end, alignment)?;
                    continue;
                }
            }
            if let Some((&b, l)) = state.live.range(candidate..).next() {
                if b < candidate + span {
                    candidate = round_up(b + round_up(l.capacity, GUARD)? + GUARD, alignment)?;
                    continue;
                }
            }
            break;
        }
        state.cursor = candidate + span;
        if state.wrapped {
            state.freed.retain(|&(b, e)| e <= candidate || b >= candidate + span);
        }
        Some(candidate)
    }

    /// Frees the allocation that starts at `ptr`.
    pub fn deallocate(&self, ptr: DevicePtr) -> Result<()> {
        let mut state = lock(&self.state);
        let Some(live) = state.live.remove(&ptr.addr()) else {
            let problem = self.pointer_problem(&state, ptr);
            let problem = match problem {
                PointerProblem::Unknown if Self::find(&state, ptr.addr()).is_some() => {
                    PointerProblem::NotAllocationStart
                }
                p => p,
            };
            return Err(Error::InvalidPointer { ptr, device: self.device, problem });
        };
        let caching = lock(&self.config).caching;
        let stats = &mut state.stats;
        stats.deallocations += 1;
        stats.live_allocations -= 1;
        stats.allocated_bytes -= live.size;
        if state.freed.len() == FREED_REMEMBERED {
            state.freed.pop_front();
        }
        state.freed.push_back((ptr.addr(), ptr.addr() + live.capacity.max(1)));
        let to_drop = match (caching, Arc::try_unwrap(live.block)) {
            (true, Ok(block)) => {
                state.stats.cached_bytes += live.capacity;
                state.cache.entry((live.capacity, live.alignment)).or_default().push(block);
                None
            }
            (_, block) => {
                state.stats.reserved_bytes -= live.capacity;
                Some(block)
            }
        };
        drop(state);
        drop(to_drop);
        Ok(())
    }

    fn find(state: &State<S::Block>, addr: u64) -> Option<(u64, &Live<S::Block>)> {
        state.live.range(..=addr).next_back().filter(|(&b, l)| addr <= b + l.size).map(|(&b, l)| (b, l))
    }

    fn pointer_problem(&self, state: &State<S::Block>, ptr: DevicePtr) -> PointerProblem {
        let a = ptr.addr();
        if ptr.is_null() {
            PointerProblem::Null
        } else if state.freed.iter().any(|&(b, e)| b <= a && a < e) {
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
    pub fn resolve(&self, ptr: DevicePtr, len: u64) -> Result<Resolved<S::Block>> {
        let state = lock(&self.state);
        let Some((base, live)) = Self::find(&state, ptr.addr()) else {
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
        Ok(Resolved { block: Arc::clone(&live.block), offset })
    }

    /// Writes `src` at `dst`. 0 bytes: Ok without looking at `dst`.
    pub fn write(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let r = self.resolve(dst, src.len() as u64)?;
        self.storage.write(&r.block, r.offset, src)
    }

    /// Reads `dst.len()` bytes at `src`. 0 bytes: Ok without looking at `src`.
    pub fn read(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let r = self.resolve(src, dst.len() as u64)?;
        self.storage.read(&r.block, r.offset, dst)
    }

    /// Copies `nbytes` from `src` to `dst`, both in this pool (overlap allowed).
    pub fn copy(&self, dst: DevicePtr, src: DevicePtr, nbytes: usize) -> Result<()> {
        if nbytes == 0 {
            return Ok(());
        }
        let s = self.resolve(src, nbytes as u64)?;
        let d = self.resolve(dst, nbytes as u64)?;
        self.storage.copy(&s.block, s.offset, &d.block, d.offset, nbytes as u64)
    }

    /// Async twin of [`Pool::copy`].
    pub async fn copy_async(&self, dst: DevicePtr, src: DevicePtr, nbytes: usize) -> Result<()> {
        if nbytes == 0 {
            return Ok(());
        }
        let s = self.resolve(src, nbytes as u64)?;
        let d = self.resolve(dst, nbytes as u64)?;
        self.storage.copy_async(&s.block, s.offset, &d.block, d.offset, nbytes as u64).await
    }

    fn take_cache(state: &mut State<S::Block>) -> Vec<S::Block> {
        let blocks: Vec<S::Block> = std::mem::take(&mut state.cache).into_values().flatten().collect();
        state.stats.reserved_bytes -= state.stats.cached_bytes;
        state.stats.cached_bytes = 0;
        blocks
    }

    /// Frees every cached block; returns the bytes given back to the device.
    pub fn empty_cache(&self) -> u64 {
        let mut state = lock(&self.state);
        let bytes = state.stats.cached_bytes;
        let blocks = Self::take_cache(&mut state);
        drop(state);
        drop(blocks);
        bytes
    }

    /// The pool's statistics.
    pub fn stats(&self) -> AllocatorStats {
        lock(&self.state).stats
    }

    /// Every live allocation, in address order.
    pub fn live_allocations(&self) -> Vec<AllocationInfo> {
        lock(&self.state)
            .live
            .iter()
            .map(|(&b, l)| AllocationInfo {
                ptr: DevicePtr::new(b),
                size: l.size,
                capacity: l.capacity,
                label: l.label.as_deref().map(Into::into),
            })
            .collect()
    }

    /// A readable summary: stats, then each live allocation.
    pub fn report(&self) -> String {
        let s = self.stats();
        let mut out = format!(
            "{}: {} live allocation(s), {} bytes allocated (peak {}), {} reserved (peak {}), {} cached; {} hits / {} misses\n",
            self.device,
            s.live_allocations,
            s.allocated_bytes,
            s.peak_allocated_bytes,
            s.reserved_bytes,
            s.peak_reserved_bytes,
            s.cached_bytes,
            s.cache_hits,
            s.cache_misses
        );
        for a in self.live_allocations() {
            let _ = writeln!(
                out,
                "  {} {} bytes ({})",
                a.ptr,
                a.size,
                a.label.as_deref().unwrap_or("unlabelled")
            );
        }
        out
    }

    /// Allocates planned pool `memory_id` (see [`crate::planned`]).
    pub fn init_buffer(&self, memory_id: u32, nbytes: usize) -> Result<DevicePtr> {
        if lock(&self.state).plans.contains(memory_id) {
            return Err(PlanTable::already_initialised(self.device, memory_id));
        }
        let label = format!("planned buffer {memory_id}");
        let base = self.allocate_labeled(nbytes, DEFAULT_ALIGNMENT, Some(&label))?;
        let inserted = lock(&self.state).plans.insert(self.device, memory_id, base, nbytes as u64);
        if let Err(e) = inserted {
            // Another thread initialised the same id meanwhile.
            self.deallocate(base)?;
            return Err(e);
        }
        Ok(base)
    }

    /// `pool(memory_id) + offset`, bounds-checked for `nbytes`.
    pub fn get_offset_address(&self, memory_id: u32, offset: usize, nbytes: usize) -> Result<DevicePtr> {
        lock(&self.state).plans.offset_address(self.device, memory_id, offset, nbytes)
    }

    /// Frees every planned pool.
    pub fn release_buffers(&self) -> Result<()> {
        let pools = lock(&self.state).plans.take_all();
        pools.into_iter().try_for_each(|(_, base)| self.deallocate(base))
    }
}

impl<S: Storage> Drop for Pool<S> {
    fn drop(&mut self) {
        let state = lock(&self.state);
        if state.live.is_empty() {
            return;
        }
        log::warn!(
            "devalloc: {} dropped with {} live allocation(s), {} bytes; freeing them",
            self.device,
            state.live.len(),
            state.stats.allocated_bytes
        );
        for (&base, l) in &state.live {
            log::warn!(
                "devalloc: leak on {}: {} bytes at {:#x} ({})",
                self.device,
                l.size,
                base,
                l.label.as_deref().unwrap_or("unlabelled")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_waste_at_most_a_quarter() {
        assert_eq!(size_class(1), Some(256));
        assert_eq!(size_class(256), Some(256));
        assert_eq!(size_class(257), Some(320));
        assert_eq!(size_class(1 << 20), Some(1 << 20));
        assert_eq!(size_class((1 << 20) + 1), Some((1 << 20) + (1 << 18)));
        for s in (1..5000u64).chain([12345, 1 << 30, (1 << 30) + 7, 3 << 40]) {
            let c = size_class(s).unwrap();
            assert!(c >= s && c.is_multiple_of(4) && (c <= 256 || c * 4 <= s * 5 + 4 * 256), "{s} -> {c}");
        }
        assert_eq!(size_class(u64::MAX), None);
    }
}
