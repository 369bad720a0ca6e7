//! The CUDA backend's block policy, kept apart from the driver so that it is tested without a
//! GPU: which capacity a request gets, and how an alignment past the driver's is honoured.
//!
//! - **Capacities.** Below 2 MiB, the pool's (the size rounded up to 512 bytes; a 1.1 MiB
//!   request does not take 2 MiB). From 2 MiB, whole
//!   2 MiB pages (as PyTorch rounds large blocks): the driver backs large allocations with
//!   2 MiB pages, so the page a class rounds up to is memory the allocation takes anyway, and at
//!   GiB sizes a quarter-step class would waste up to 25% of the card.
//! - **Alignment.** `cuMemAlloc` returns 256-byte aligned pointers, and large allocations start
//!   on their 2 MiB page. A block is asked for at its capacity first; only if that pointer does
//!   not honour the alignment is it freed and the capacity asked again with `alignment - 256`
//!   bytes of room to align within. So an 8 MiB block aligned to 4 KiB takes 8 MiB, not 10.

use crate::checks::round_up;
use crate::error::Result;

/// The driver's base alignment of allocations.
pub(crate) const DRIVER_ALIGNMENT: u64 = 256;
/// The page of large allocations.
pub(crate) const PAGE: u64 = 2 << 20;

/// The capacity of a cached block for `size` bytes (see the module docs); `None` on overflow.
pub(crate) fn size_class(size: u64) -> Option<u64> {
    if size < PAGE {
        crate::storage::default_size_class(size)
    } else {
        round_up(size, PAGE)
    }
}

/// A block as the driver gave it: its raw pointer, the aligned start, and the bytes asked for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Raw {
    pub raw: u64,
    pub addr: u64,
    pub bytes: u64,
}

/// Allocates `capacity` bytes aligned to `alignment` through `malloc` (and `free`, for a first
/// pointer that does not honour it): see the module docs.
pub(crate) fn aligned_alloc(
    capacity: u64,
    alignment: u64,
    mut malloc: impl FnMut(u64) -> Result<u64>,
    mut free: impl FnMut(u64),
) -> Result<Raw> {
    let alignment = alignment.max(DRIVER_ALIGNMENT);
    let raw = malloc(capacity)?;
    if raw.is_multiple_of(alignment) {
        return Ok(Raw { raw, addr: raw, bytes: capacity });
    }
    free(raw);
    let bytes = capacity.saturating_add(alignment - DRIVER_ALIGNMENT);
    let raw = malloc(bytes)?;
    let addr =
        round_up(raw, alignment).ok_or_else(|| crate::error::Error::invalid_argument("address overflows"))?;
    Ok(Raw { raw, addr, bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn requests_below_2_mib_round_to_512_bytes_not_a_page() {
        assert_eq!(size_class(MIB + 1), Some(MIB + 512));
        assert_eq!(size_class(3 * MIB / 2 + 1), Some(3 * MIB / 2 + 512));
        assert_eq!(size_class(2 * MIB - 1), Some(2 * MIB));
        for s in (1..2 * MIB).step_by(4099) {
            let c = size_class(s).unwrap();
            assert!(c >= s && c - s < 512, "{s} -> {c}");
        }
        assert_eq!(size_class(2 * MIB), Some(2 * MIB));
        assert_eq!(size_class(2 * MIB + 1), Some(4 * MIB));
        assert_eq!(size_class((1 << 30) + 5), Some((1 << 30) + PAGE));
        assert_eq!(size_class(u64::MAX), None);
    }

    /// A fake driver: hands out pointers from `next`, aligned to 2 MiB for large blocks and to
    /// 256 bytes (but never to more) for small ones, and records what it was asked for.
    struct Driver {
        next: u64,
        asked: Vec<u64>,
        freed: Vec<u64>,
    }

    impl Driver {
        fn new() -> Self {
            Driver { next: 0x7f00_0000_0000, asked: Vec::new(), freed: Vec::new() }
        }
        fn malloc(&mut self, n: u64) -> Result<u64> {
            self.asked.push(n);
            let p = if n >= PAGE {
                round_up(self.next, PAGE).unwrap()
            } else {
                round_up(self.next, 512).unwrap() + 256
            };
            self.next = p + n;
            Ok(p)
        }
    }

    fn alloc(d: &mut Driver, capacity: u64, alignment: u64) -> Raw {
        let cell = std::cell::RefCell::new(d);
        let raw = aligned_alloc(
            capacity,
            alignment,
            |n| cell.borrow_mut().malloc(n),
            |p| cell.borrow_mut().freed.push(p),
        )
        .unwrap();
        assert!(raw.addr.is_multiple_of(alignment) && raw.addr >= raw.raw);
        assert!(raw.addr + capacity <= raw.raw + raw.bytes, "the block fits in what was asked");
        raw
    }

    #[test]
    fn an_aligned_pointer_from_the_driver_costs_no_padding() {
        let mut d = Driver::new();
        let r = alloc(&mut d, 8 * MIB, 4096);
        assert_eq!((r.bytes, d.asked.clone(), d.freed.len()), (8 * MIB, vec![8 * MIB], 0));
        let r = alloc(&mut d, 4096, 256);
        assert_eq!(r.bytes, 4096);
        assert_eq!(d.asked.len(), 2, "asked once per block");
    }

    #[test]
    fn a_misaligned_pointer_is_given_back_and_asked_again_with_room() {
        let mut d = Driver::new();
        let r = alloc(&mut d, 4096, 4096);
        assert_eq!(d.asked, vec![4096, 4096 + 4096 - 256]);
        assert_eq!((d.freed.len(), r.bytes), (1, 4096 + 3840));
    }

    /// The pool's policy over the CUDA backend's block policy and the fake driver: blocks hold
    /// their driver pointer and give it back on drop.
    struct FakeCuda(std::sync::Arc<std::sync::Mutex<Driver>>);

    struct Block {
        raw: Raw,
        driver: std::sync::Arc<std::sync::Mutex<Driver>>,
    }

    impl Drop for Block {
        fn drop(&mut self) {
            self.driver.lock().unwrap_or_else(|e| e.into_inner()).freed.push(self.raw.raw);
        }
    }

    impl crate::storage::Storage for FakeCuda {
        type Block = Block;
        type Params = ();
        fn device(&self) -> crate::Device {
            crate::Device::new(crate::DeviceType::Cuda, 0)
        }
        fn max_block_size(&self) -> u64 {
            1 << 40
        }
        fn size_class(&self, size: u64) -> Option<u64> {
            size_class(size)
        }
        fn has_real_addresses(&self) -> bool {
            true
        }
        fn splits(&self) -> bool {
            true
        }
        fn alloc(&self, capacity: u64, alignment: u64, _: &(), _: &str) -> Result<Block> {
            let raw = alloc(&mut self.0.lock().unwrap(), capacity, alignment);
            Ok(Block { raw, driver: self.0.clone() })
        }
        fn address(&self, block: &Block) -> Option<u64> {
            Some(block.raw.addr)
        }
        fn write(&self, _: &Block, _: u64, _: &[u8]) -> Result<()> {
            Ok(())
        }
        fn read(&self, _: &Block, _: u64, _: &mut [u8]) -> Result<()> {
            Ok(())
        }
        fn copy(&self, _: &Block, _: u64, _: &Block, _: u64, _: u64) -> Result<()> {
            Ok(())
        }
    }

    /// A decode loop (weights, a KV cache that grows by 96 KiB a step, an activation) on a
    /// fresh pool with `options`: (the pool's stats, its peak live capacity, blocks freed).
    fn decode(options: crate::PoolOptions) -> (crate::AllocatorStats, u64, usize) {
        let driver = std::sync::Arc::new(std::sync::Mutex::new(Driver::new()));
        let pool = crate::pool::Pool::new(FakeCuda(driver.clone()), options).unwrap();
        let weights = pool.allocate(64 * MIB as usize, 256).unwrap();
        let (mut kv, mut peak_live) = (None, 0);
        for step in 0..200usize {
            let next = pool.allocate(3 * MIB as usize + step * (96 << 10), 256).unwrap();
            let act = pool.allocate(1 << 20, 256).unwrap();
            let s = pool.stats();
            peak_live = peak_live.max(s.reserved_bytes - s.cached_bytes);
            pool.deallocate(act).unwrap();
            if let Some(old) = kv.replace(next) {
                pool.deallocate(old).unwrap();
            }
        }
        let freed = driver.lock().unwrap().freed.len();
        assert!(
            driver.lock().unwrap().asked.iter().skip(1).all(|&n| n < PAGE || n % PAGE == 0),
            "whole pages"
        );
        pool.deallocate(kv.unwrap()).unwrap();
        pool.deallocate(weights).unwrap();
        (pool.stats(), peak_live, freed)
    }

    #[test]
    fn cuda_blocks_follow_the_pools_budget_and_go_back_to_the_driver() {
        let (s, peak_live, freed) = decode(crate::PoolOptions::default());
        assert!(s.peak_reserved_bytes * 8 <= peak_live * 9, "{s:?} over a peak live of {peak_live}");
        assert!(freed > 0, "old KV blocks go back to the driver");
        // Without the budget every page size the KV cache passed through stays cached.
        let unbounded = crate::PoolOptions { cache_headroom: None, ..Default::default() };
        let (s, peak_live, freed) = decode(unbounded);
        assert_eq!(freed, 0);
        assert!(s.peak_reserved_bytes > 2 * peak_live, "{s:?} over a peak live of {peak_live}");
        // A workload that repeats asks the driver for nothing after its first step.
        let driver = std::sync::Arc::new(std::sync::Mutex::new(Driver::new()));
        let pool = crate::pool::Pool::new(FakeCuda(driver.clone()), crate::PoolOptions::default()).unwrap();
        let mut after = Vec::new();
        for _ in 0..4 {
            let ptrs: Vec<_> =
                [5 * MIB as usize, 700 << 10, 3000].iter().map(|&n| pool.allocate(n, 256).unwrap()).collect();
            ptrs.into_iter().for_each(|p| pool.deallocate(p).unwrap());
            after.push(driver.lock().unwrap().asked.len());
        }
        assert!(after.iter().all(|&n| n == after[0]), "driver allocations after each step: {after:?}");
    }

    #[test]
    fn a_cached_cuda_block_is_split_for_smaller_requests_at_aligned_device_addresses() {
        let driver = std::sync::Arc::new(std::sync::Mutex::new(Driver::new()));
        let pool = crate::pool::Pool::new(FakeCuda(driver.clone()), crate::PoolOptions::default()).unwrap();
        // Blocks split for a workload that repeats: a step that holds 8 MiB while 31 one-byte
        // temporaries come and go, twice (the pool's policy), leaves both blocks cached.
        let mut base = 0;
        for _ in 0..2 {
            let big = pool.allocate(8 * MIB as usize, 256).unwrap();
            base = big.addr();
            for _ in 0..31 {
                let t = pool.allocate(1, 256).unwrap();
                pool.deallocate(t).unwrap();
            }
            pool.deallocate(big).unwrap();
        }
        let small = pool.stats().reserved_bytes - 8 * MIB;
        assert_eq!(driver.lock().unwrap().asked.len(), 2);
        // Three smaller requests (the repetition goes on while they are live), none that the
        // temporaries' block holds: pieces of the 8 MiB block, at real addresses inside it,
        // aligned; the driver is not asked again.
        let n = small as usize + 1;
        let a = pool.allocate(3 * MIB as usize, 256).unwrap();
        let b = pool.allocate(n, 256).unwrap();
        let c = pool.allocate(MIB as usize, 256).unwrap();
        assert_eq!(driver.lock().unwrap().asked.len(), 2);
        let mut at: Vec<u64> = [a, b, c].iter().map(|p| p.addr()).collect();
        assert!(at.iter().all(|&x| (base..base + 8 * MIB).contains(&x)), "{at:x?} in {base:#x}");
        assert!(at.iter().all(|&x| x % 256 == 0), "{at:x?}");
        at.sort_unstable();
        assert!(at[0] + 3 * MIB <= at[1] || at[0] + n as u64 <= at[1], "no overlap: {at:x?}");
        let s = pool.stats();
        assert_eq!((s.reserved_bytes, s.live_allocations), (8 * MIB + small, 3), "{s:?}");
        let live: u64 = pool.live_allocations().iter().map(|l| l.capacity).sum();
        assert_eq!(s.reserved_bytes, live + s.cached_bytes, "{s:?}");
        // A piece is freed once; a second free is refused and changes nothing.
        pool.deallocate(b).unwrap();
        assert!(pool.deallocate(b).is_err());
        assert_eq!(pool.stats().live_allocations, 2);
        // Freed, the pieces merge: the whole block is cached again, and goes back whole.
        pool.deallocate(c).unwrap();
        pool.deallocate(a).unwrap();
        assert_eq!(pool.stats().cached_bytes, 8 * MIB + small);
        assert_eq!(pool.empty_cache(), 8 * MIB + small);
        assert_eq!(driver.lock().unwrap().freed.len(), 2);
        assert_eq!(pool.stats().reserved_bytes, 0);
    }
}
