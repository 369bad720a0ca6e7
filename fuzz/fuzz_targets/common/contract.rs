//! The contract model shared by `contract_host` and `contract_wgpu`: a sequence of contract
//! calls decoded from the fuzzer's bytes (any sizes, alignments, pointers, offsets, indices,
//! frees, copies, planned buffers, limits) run on device 0 of an allocator beside a model of
//! what each call must do. Each call must give the model's answer (Ok, or the error kind the
//! contract names); a refused call must leave the stats as they were (an out-of-memory one may
//! only have given cache back); the stats must match the model after every call; and every
//! allocation the model knows must read back the bytes written to it.
use devalloc::{AllocatorStats, DeviceAllocator, DevicePtr, Error, PointerProblem};

#[path = "ops.rs"]
mod ops;
pub use ops::Op;
use ops::Target;

/// An allocation the model knows: its base, the bytes it holds, and whether it may be a piece
/// of a split block (it was served from the cache, on an allocator whose blocks split: the
/// model cannot tell a whole cached block from a free range of a split one).
struct Block {
    base: u64,
    bytes: Vec<u8>,
    piece: bool,
}

/// What the model says about an address.
enum Place {
    /// In the model's block, at this offset.
    In(Kind, usize, usize),
    Freed,
    Null,
    Unknown,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Live,
    Planned,
}

/// The model of device 0. Its counters start from the stats' when the run began, as an
/// allocator may be reused across runs (`contract_wgpu`).
pub struct Model<'a> {
    a: &'a dyn DeviceAllocator,
    set_limit: &'a dyn Fn(u64),
    limit: u64,
    live: Vec<Block>,
    planned: Vec<(u32, Block)>,
    /// Planned buffers the caller freed behind the plan's back (id, base, size): the plan
    /// still knows them, and `release_buffers` reports the stale one.
    orphans: Vec<(u32, u64, usize)>,
    freed: Vec<u64>,
    allocations: u64,
    deallocations: u64,
    /// Whether the allocator may hold staging buffers (`staging_bytes` > 0: wgpu).
    wide: bool,
    /// Whether its cached blocks split (host memory and CUDA; never wgpu, so there every cached
    /// byte is a whole block that `empty_cache` gives back).
    splits: bool,
    /// The allocation the last call made, to be marked a piece or not once its stats are read.
    made: Option<(Kind, usize)>,
    /// Whether the last call freed allocations, none of them a possible piece.
    freed_whole: bool,
    /// Bytes of whole blocks known to be cached: blocks of allocations that were no piece, freed
    /// into the cache since the cache last served a request or gave anything back (after which
    /// the model no longer knows which blocks are there). `empty_cache` gives at least these back.
    whole_cached: u64,
}

/// Whether an error is the one the contract names for a call.
type ErrorCheck = fn(&Error) -> bool;

fn pattern(n: usize, seed: u64) -> Vec<u8> {
    (0..n).map(|i| (i as u64).wrapping_mul(0x9e37_79b9).wrapping_add(seed).to_le_bytes()[3]).collect()
}

fn problem(e: &Error) -> Option<PointerProblem> {
    match e {
        Error::InvalidPointer { problem, .. } => Some(*problem),
        _ => None,
    }
}

impl<'a> Model<'a> {
    /// A model of device 0 of `a`, whose memory limit `set_limit` sets (starting at `limit`).
    pub fn new(a: &'a dyn DeviceAllocator, set_limit: &'a dyn Fn(u64), limit: u64, wide: bool) -> Self {
        set_limit(limit);
        let s = a.stats(0).expect("stats of device 0");
        assert_eq!(s.live_allocations, 0, "the allocator starts with allocations live: {s:?}");
        let (allocations, deallocations) = (s.allocations, s.deallocations);
        Model {
            a,
            set_limit,
            limit,
            live: vec![],
            planned: vec![],
            orphans: vec![],
            freed: vec![],
            allocations,
            deallocations,
            wide,
            splits: matches!(a.device_type(), devalloc::DeviceType::Cpu | devalloc::DeviceType::Cuda),
            made: None,
            freed_whole: false,
            whole_cached: 0,
        }
    }

    /// Whether a live or planned allocation may be a piece of a split block (whose free ranges
    /// `empty_cache` cannot give back).
    fn any_piece(&self) -> bool {
        self.live.iter().chain(self.planned.iter().map(|(_, b)| b)).any(|b| b.piece)
    }

    fn block(&self, kind: Kind, i: usize) -> &Block {
        if kind == Kind::Live {
            &self.live[i]
        } else {
            &self.planned[i].1
        }
    }

    fn block_mut(&mut self, kind: Kind, i: usize) -> &mut Block {
        if kind == Kind::Live {
            &mut self.live[i]
        } else {
            &mut self.planned[i].1
        }
    }

    fn addr(&self, t: Target) -> u64 {
        let pick = |v: &[u64], k: u8| if v.is_empty() { 0 } else { v[usize::from(k) % v.len()] };
        let live: Vec<u64> = self.live.iter().map(|b| b.base).collect();
        match t {
            Target::Live(k) => pick(&live, k),
            Target::Stale(k) => pick(&self.freed, k),
            Target::Planned(k) => pick(&self.planned.iter().map(|(_, b)| b.base).collect::<Vec<_>>(), k),
            Target::Near { k, delta } => pick(&live, k).wrapping_add(delta as i64 as u64),
            Target::Far { k, off } => pick(&live, k).wrapping_add(off),
            Target::Raw(v) => v,
        }
    }

    fn place(&self, addr: u64) -> Place {
        if addr == 0 {
            return Place::Null;
        }
        let within = |b: &Block| addr >= b.base && addr - b.base < b.bytes.len() as u64;
        if let Some(i) = self.live.iter().position(within) {
            return Place::In(Kind::Live, i, (addr - self.live[i].base) as usize);
        }
        if let Some(i) = self.planned.iter().position(|(_, b)| within(b)) {
            return Place::In(Kind::Planned, i, (addr - self.planned[i].1.base) as usize);
        }
        if self.freed.contains(&addr) {
            Place::Freed
        } else {
            Place::Unknown
        }
    }

    /// The contract's answer for `len` bytes at `addr`: the block and offset, or an error
    /// check on what the allocator said.
    fn range(&self, addr: u64, len: usize) -> Result<(Kind, usize, usize), ErrorCheck> {
        match self.place(addr) {
            Place::In(k, i, off) if len <= self.block(k, i).bytes.len() - off => Ok((k, i, off)),
            Place::In(..) => Err(|e| matches!(e, Error::OutOfBounds { .. })),
            Place::Freed => {
                Err(|e| matches!(problem(e), Some(PointerProblem::Freed | PointerProblem::Unknown)))
            }
            Place::Null => Err(|e| problem(e) == Some(PointerProblem::Null)),
            Place::Unknown => Err(|e| problem(e).is_some() || matches!(e, Error::OutOfBounds { .. })),
        }
    }

    /// Whether an allocation of `size` aligned to `align` must succeed: small, and far below
    /// the limit whatever the rounding and the cache hold.
    /// Whether a request must succeed: a small one, with what the model's allocations hold
    /// (each counted as whole 16 KiB slots, block rounding and alignment included) and a slot
    /// for it within half the limit. (A live block larger than its request, served from the
    /// cache for a size the budget gave back, is kept within the budget, itself within half
    /// the limit there.)
    fn must_fit(&self, size: usize, align: usize) -> bool {
        const SLOT: u64 = 16384;
        let held: u64 = self
            .live
            .iter()
            .chain(self.planned.iter().map(|(_, b)| b))
            .map(|b| (b.bytes.len() as u64).div_ceil(SLOT).max(1) * SLOT)
            .sum();
        size <= 4096 && align <= 4096 && held + SLOT <= self.limit / 2
    }

    fn write_init(&mut self, kind: Kind, i: usize) {
        let b = self.block(kind, i);
        let init = pattern(b.bytes.len(), b.base);
        if !init.is_empty() {
            self.a
                .copy_host_to_device(DevicePtr::new(b.base), &init, 0)
                .expect("first write of a new allocation");
        }
        self.block_mut(kind, i).bytes = init;
    }

    fn verify(&self, kind: Kind, i: usize) {
        let b = self.block(kind, i);
        let mut back = vec![0u8; b.bytes.len()];
        if !back.is_empty() {
            self.a
                .copy_device_to_host(&mut back, DevicePtr::new(b.base), 0)
                .expect("reading an allocation back");
        }
        assert!(back == b.bytes, "the allocation at {:#x} lost its bytes", b.base);
    }

    /// Checks every allocation's bytes.
    pub fn verify_all(&self) {
        (0..self.live.len()).for_each(|i| self.verify(Kind::Live, i));
        (0..self.planned.len()).for_each(|i| self.verify(Kind::Planned, i));
    }

    fn check_stats(&self, s: &AllocatorStats) {
        let live = (self.live.len() + self.planned.len()) as u64;
        let bytes: u64 =
            self.live.iter().chain(self.planned.iter().map(|(_, b)| b)).map(|b| b.bytes.len() as u64).sum();
        assert_eq!((s.live_allocations, s.allocated_bytes), (live, bytes), "live count / bytes: {s:?}");
        assert_eq!((s.allocations, s.deallocations), (self.allocations, self.deallocations), "{s:?}");
        assert!(s.reserved_bytes >= s.allocated_bytes && s.cached_bytes <= s.reserved_bytes, "{s:?}");
        assert!(
            s.peak_reserved_bytes >= s.reserved_bytes && s.peak_allocated_bytes >= s.allocated_bytes,
            "{s:?}"
        );
        assert!(self.wide || s.staging_bytes == 0, "{s:?}");
    }

    /// Runs one call, checks its answer, the stats and the bytes it touched.
    pub fn step(&mut self, op: &Op) {
        let before = self.a.stats(0).expect("stats");
        (self.made, self.freed_whole) = (None, false);
        let refused = self.apply(op);
        let after = self.a.stats(0).expect("stats");
        self.track_cache(&before, &after);
        let plain = |s: &AllocatorStats| {
            let mut s = *s;
            s.staging_bytes = 0;
            s
        };
        match refused {
            Refused::No => {}
            Refused::Yes => assert!(
                plain(&after) == plain(&before),
                "{op:?} was refused but changed the stats: {before:?} -> {after:?}"
            ),
            Refused::OutOfMemory => {
                let given =
                    before.cached_bytes.checked_sub(after.cached_bytes).expect("an OOM added to the cache");
                let mut like = plain(&after);
                (like.reserved_bytes, like.cached_bytes) =
                    (after.reserved_bytes + given, before.cached_bytes);
                assert!(
                    like == plain(&before),
                    "{op:?} ran out of memory but changed the stats: {before:?} -> {after:?}"
                );
            }
        }
        if refused != Refused::No {
            assert!(after.staging_bytes <= before.staging_bytes, "a refused call took staging: {op:?}");
        }
        if after.reserved_bytes > before.reserved_bytes && !matches!(op, Op::SetLimit(_)) {
            assert!(
                after.reserved_bytes <= self.limit,
                "{op:?} took the pool past its limit {}: {after:?}",
                self.limit
            );
        }
        self.check_stats(&after);
    }

    /// After a call (stats `before` and `after` it): marks the allocation it made a possible
    /// piece if the cache served it, and keeps `whole_cached` to what the model knows.
    fn track_cache(&mut self, before: &AllocatorStats, after: &AllocatorStats) {
        let hit = after.cache_hits > before.cache_hits;
        if let Some((kind, i)) = self.made.take() {
            self.block_mut(kind, i).piece = self.splits && hit;
        }
        // Whole blocks went to the cache, and nothing else moved: the cache grew by exactly what
        // stopped being live, and nothing was given back.
        let live = |s: &AllocatorStats| s.reserved_bytes - s.cached_bytes;
        let grew = after.cached_bytes.checked_sub(before.cached_bytes);
        if self.freed_whole
            && after.reserved_bytes == before.reserved_bytes
            && grew == live(before).checked_sub(live(after))
        {
            self.whole_cached += grew.unwrap_or(0);
        } else if hit || after.cached_bytes != before.cached_bytes {
            // A cached block served a request, some were given back (the budget, a limit), or a
            // piece's range went back to its block: which blocks are whole now, the model cannot say.
            self.whole_cached = 0;
        }
    }

    fn alloc_result(
        &mut self,
        r: devalloc::Result<DevicePtr>,
        size: usize,
        align: usize,
        valid: bool,
        kind: Kind,
        id: u32,
    ) -> Refused {
        match r {
            Ok(p) => {
                assert!(valid, "allocate({size}, align {align}) should be refused, got {p}");
                assert!(p.addr() % align as u64 == 0, "{p} is not aligned to {align}");
                for b in self.live.iter().chain(self.planned.iter().map(|(_, b)| b)) {
                    let apart = p.addr() >= b.base + b.bytes.len() as u64 || b.base >= p.addr() + size as u64;
                    assert!(apart, "{p} ({size} bytes) overlaps the allocation at {:#x}", b.base);
                }
                self.allocations += 1;
                let block = Block { base: p.addr(), bytes: vec![0; size], piece: false };
                if kind == Kind::Live {
                    self.live.push(block)
                } else {
                    self.planned.push((id, block))
                }
                let i = if kind == Kind::Live { self.live.len() } else { self.planned.len() } - 1;
                self.made = Some((kind, i));
                self.write_init(kind, i);
                Refused::No
            }
            Err(Error::OutOfMemory { .. }) if valid => {
                assert!(
                    !self.must_fit(size, align),
                    "allocate({size}, align {align}) ran out of memory with room"
                );
                Refused::OutOfMemory
            }
            Err(Error::TooLarge { .. }) if valid => {
                assert!(!self.must_fit(size, align), "allocate({size}, align {align}) is too large?");
                Refused::Yes
            }
            Err(Error::InvalidArgument { .. } | Error::TooLarge { .. }) if !valid => Refused::Yes,
            // An impossible size or alignment (one that overflows when rounded) may be either.
            Err(Error::InvalidArgument { .. }) if size > 1 << 40 || align > 1 << 40 => Refused::Yes,
            Err(e) => panic!("allocate({size}, align {align}): unexpected {e}"),
        }
    }

    /// Frees what the run left (and checks the allocator is back to nothing live).
    pub fn finish(mut self) {
        self.verify_all();
        for b in std::mem::take(&mut self.live) {
            self.a.deallocate(DevicePtr::new(b.base), 0).expect("freeing what the run left");
        }
        let released = self.a.release_buffers(0);
        assert_eq!(released.is_ok(), self.orphans.is_empty(), "release_buffers at the end: {released:?}");
        let s = self.a.stats(0).expect("stats");
        assert_eq!((s.live_allocations, s.allocated_bytes), (0, 0), "{s:?}");
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Refused {
    No,
    Yes,
    OutOfMemory,
}
