//! Blocks split into pieces, on storages whose blocks may hold several allocations
//! ([`Storage::splits`](crate::storage::Storage::splits): host memory and CUDA; never wgpu,
//! whose buffers are bound whole). A cached block taken for a smaller request becomes a
//! *segment*: the allocation gets a piece at its start, and the rest stays free in the segment
//! for later requests (best fit over every free range of the same alignment and params). A freed
//! piece merges with its free neighbours; once a segment has no live piece it is one whole
//! cached block again, which the budget, a limit or `empty_cache` can give back.
//!
//! A piece freed while a copy through it still runs (an async copy in flight) is not handed
//! out again: its range stays out of use until the segment empties, and the segment is then
//! dropped rather than cached, as an unsplit block would be. (Copies through other pieces of
//! the block do not count.)

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::cache::{reuse_bound, Cached, Key};
use crate::checks::round_up;

/// What an allocation holds: a whole block, or a piece of a segment.
pub(crate) struct Holder<B> {
    /// The pool's id of the block (of the segment, for a piece).
    pub id: u64,
    pub block: Arc<B>,
    /// Where the allocation starts in the block.
    pub at: u64,
    /// Whether it is a piece of a segment.
    pub piece: bool,
}

impl<B> Holder<B> {
    /// A whole block.
    #[inline]
    pub fn whole(cached: Cached<B>) -> Self {
        Holder { id: cached.id, block: Arc::new(cached.block), at: 0, piece: false }
    }
}

struct Segment<B, P> {
    /// The whole block's key.
    key: Key<P>,
    block: Arc<B>,
    /// Live pieces.
    live: usize,
    /// Free ranges: start -> length.
    free: BTreeMap<u64, u64>,
    /// A piece was freed while someone else held the block: it is dropped once empty.
    orphaned: bool,
    /// Bytes not in live pieces.
    idle: u64,
}

/// What freeing a piece left.
pub(crate) enum Freed<B, P> {
    /// The segment still has live pieces.
    Kept,
    /// The segment emptied: one whole block again, to cache.
    Whole(Key<P>, Cached<B>),
    /// The segment emptied but someone else holds it: its capacity, and the block to drop.
    Dropped(u64, Arc<B>),
}

/// Every segment with a live piece, and an index of their free ranges by (alignment, params,
/// length).
pub(crate) struct Pieces<B, P> {
    segs: BTreeMap<u64, Segment<B, P>>,
    index: BTreeSet<(u64, P, u64, u64, u64)>,
}

/// Where a request's piece is: the free range (segment, start, length) it is carved from, and
/// the piece (start, length).
pub(crate) struct Spot {
    id: u64,
    r_at: u64,
    r_len: u64,
    at: u64,
    len: u64,
}

/// A piece carved out of a segment, at `at`, `len` bytes.
fn carve(r_at: u64, r_len: u64, unit: u64, exact: u64, want: u64) -> Option<(u64, u64)> {
    let end = r_at + r_len;
    let at = round_up(r_at, unit)?;
    let room = end.checked_sub(at)?;
    if room < exact {
        return None;
    }
    // Take the rest whole where it is at most an eighth past the capacity (no sliver left).
    let len = if room <= reuse_bound(want) { room } else { want.max(exact) };
    Some((at, len))
}

impl<B, P: Ord + Clone> Pieces<B, P> {
    pub fn new() -> Self {
        Pieces { segs: BTreeMap::new(), index: BTreeSet::new() }
    }

    /// Bytes in segments not held by live pieces (free or out of use; the pool counts them as
    /// cached, and checks that it does).
    pub fn bytes(&self) -> u64 {
        self.segs.values().map(|s| s.idle).sum()
    }

    fn add_free(&mut self, id: u64, at: u64, len: u64) {
        let seg = self.segs.get_mut(&id).expect("a known segment");
        seg.free.insert(at, len);
        self.index.insert((seg.key.alignment, seg.key.params.clone(), len, id, at));
    }

    fn remove_free(&mut self, id: u64, at: u64) -> u64 {
        let seg = self.segs.get_mut(&id).expect("a known segment");
        let len = seg.free.remove(&at).expect("a free range");
        self.index.remove(&(seg.key.alignment, seg.key.params.clone(), len, id, at));
        len
    }

    /// Splits the whole block `cached` (of `key`) for an allocation of `want` bytes (at least
    /// `exact`): the allocation's piece, at its start; the rest stays free.
    pub fn split(&mut self, key: Key<P>, cached: Cached<B>, exact: u64, want: u64) -> (Holder<B>, u64) {
        let (_, len) = carve(0, key.capacity, 1, exact, want).expect("the block holds the request");
        (self.split_at(key, cached, 0, len), len)
    }

    /// Splits the whole block `cached` (of `key`) for a piece at `at`, `len` bytes (within the
    /// block); the rest stays free.
    pub fn split_at(&mut self, key: Key<P>, cached: Cached<B>, at: u64, len: u64) -> Holder<B> {
        let id = cached.id;
        let capacity = key.capacity;
        let block = Arc::new(cached.block);
        let seg = Segment {
            key,
            block: Arc::clone(&block),
            live: 1,
            free: BTreeMap::new(),
            orphaned: false,
            idle: capacity - len,
        };
        self.segs.insert(id, seg);
        if at > 0 {
            self.add_free(id, 0, at);
        }
        if at + len < capacity {
            self.add_free(id, at + len, capacity - at - len);
        }
        Holder { id, block, at, piece: true }
    }

    /// Whether segment `id` is split (has a live piece).
    pub fn holds(&self, id: u64) -> bool {
        self.segs.contains_key(&id)
    }

    /// The piece of segment `id` at `at`, `len` bytes, where that range is free ([`Pieces::take_at`]
    /// takes it).
    pub fn find_at(&self, id: u64, at: u64, len: u64) -> Option<Spot> {
        let seg = self.segs.get(&id)?;
        let (&r_at, &r_len) = seg.free.range(..=at).next_back()?;
        (r_at + r_len >= at.checked_add(len)?).then_some(Spot { id, r_at, r_len, at, len })
    }

    /// The best-fitting free range of `key`'s alignment and params that holds `key.capacity`
    /// bytes (the exact size; the piece gets `want` where there is room), and the piece it
    /// gives ([`Pieces::take_at`] takes it).
    pub fn find(&self, key: &Key<P>, want: u64) -> Option<Spot> {
        let exact = key.capacity;
        let unit = key.alignment.max(crate::storage::GRANULE);
        let lo = (key.alignment, key.params.clone(), exact, 0, 0);
        let hi = (key.alignment, key.params.clone(), u64::MAX, u64::MAX, u64::MAX);
        self.index.range(lo..=hi).take(64).find_map(|&(_, _, r_len, id, r_at)| {
            carve(r_at, r_len, unit, exact, want).map(|(at, len)| Spot { id, r_at, r_len, at, len })
        })
    }

    /// Takes the piece [`Pieces::find`] found (nothing changed since), and its length.
    pub fn take_at(&mut self, spot: Spot) -> (Holder<B>, u64) {
        let Spot { id, r_at, r_len, at, len } = spot;
        self.remove_free(id, r_at);
        if at > r_at {
            self.add_free(id, r_at, at - r_at);
        }
        if at + len < r_at + r_len {
            self.add_free(id, at + len, r_at + r_len - at - len);
        }
        let seg = self.segs.get_mut(&id).expect("a known segment");
        seg.live += 1;
        seg.idle -= len;
        (Holder { id, block: Arc::clone(&seg.block), at, piece: true }, len)
    }

    /// [`Pieces::find`], then [`Pieces::take_at`].
    #[cfg(test)]
    fn take(&mut self, key: &Key<P>, want: u64) -> Option<(Holder<B>, u64)> {
        self.find(key, want).map(|spot| self.take_at(spot))
    }

    /// (length, count) of the free ranges, and of the ranges out of use (one per segment that
    /// has them), by length: with the whole cached blocks, what the cached bytes are.
    pub fn counts(&self) -> BTreeMap<u64, u64> {
        let mut by = BTreeMap::new();
        for seg in self.segs.values() {
            let free: u64 = seg.free.values().sum();
            for &len in seg.free.values() {
                *by.entry(len).or_default() += 1;
            }
            if seg.idle > free {
                *by.entry(seg.idle - free).or_default() += 1;
            }
        }
        by
    }

    /// Takes segment `id` out, with its free ranges.
    fn remove_segment(&mut self, id: u64) -> Segment<B, P> {
        let seg = self.segs.remove(&id).expect("a known segment");
        for (&r_at, &r_len) in &seg.free {
            self.index.remove(&(seg.key.alignment, seg.key.params.clone(), r_len, id, r_at));
        }
        seg
    }

    /// Forgets every segment whose block `gone` picks (the device refused it): its free ranges
    /// serve nothing more. Returns the bytes not in live pieces (free or out of use), and the
    /// blocks, for the caller to drop outside its lock. The live pieces are the caller's to
    /// forget: they are never freed through here again.
    pub fn forget_where(&mut self, mut gone: impl FnMut(&B) -> bool) -> (u64, Vec<Arc<B>>) {
        let ids: Vec<u64> = self.segs.iter().filter(|(_, s)| gone(&s.block)).map(|(&id, _)| id).collect();
        let (mut bytes, mut blocks) = (0, Vec::new());
        for id in ids {
            let seg = self.remove_segment(id);
            bytes += seg.idle;
            blocks.push(seg.block);
        }
        (bytes, blocks)
    }

    /// Frees the piece of segment `id` at `at`, `len` bytes (the caller has dropped its holder
    /// of the block); `in_use`: someone else still holds the block, so the range stays out of
    /// use.
    pub fn free(&mut self, id: u64, at: u64, len: u64, in_use: bool) -> Freed<B, P> {
        let seg = self.segs.get_mut(&id).expect("a known segment");
        seg.live -= 1;
        seg.idle += len;
        seg.orphaned |= in_use;
        if seg.live == 0 {
            let seg = self.remove_segment(id);
            return match (seg.orphaned, Arc::try_unwrap(seg.block)) {
                (false, Ok(block)) => Freed::Whole(seg.key, Cached { id, block }),
                (_, Ok(block)) => Freed::Dropped(seg.key.capacity, Arc::new(block)),
                (_, Err(block)) => Freed::Dropped(seg.key.capacity, block),
            };
        }
        if in_use {
            return Freed::Kept;
        }
        // Merge with the free neighbours.
        let (mut at, mut len) = (at, len);
        let before = seg.free.range(..at).next_back().map(|(&a, &l)| (a, l));
        if let Some((b_at, b_len)) = before.filter(|(a, l)| a + l == at) {
            self.remove_free(id, b_at);
            at = b_at;
            len += b_len;
        }
        let seg = &self.segs[&id];
        if let Some(&a_len) = seg.free.get(&(at + len)) {
            self.remove_free(id, at + len);
            len += a_len;
        }
        self.add_free(id, at, len);
        Freed::Kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(capacity: u64) -> Key<()> {
        Key { alignment: 64, params: (), capacity }
    }

    #[test]
    fn pieces_split_merge_and_come_back_whole() {
        let mut p: Pieces<u32, ()> = Pieces::new();
        let (a, _) = p.split(key(8192), Cached { id: 7, block: 70 }, 1000, 1024);
        assert_eq!((a.id, a.at, p.bytes()), (7, 0, 7168));
        let (b, b_len) = p.take(&key(2000), 2048).unwrap();
        assert_eq!((b.at, b_len, p.bytes()), (1024, 2048, 5120));
        // What is left (5120 bytes) is within an eighth of 4608: taken whole.
        let (c, c_len) = p.take(&key(4608), 4608).unwrap();
        assert_eq!((c.at, c_len, p.bytes()), (3072, 5120, 0));
        assert!(p.take(&key(1), 512).is_none(), "nothing free");
        assert!(p.take(&Key { alignment: 128, params: (), capacity: 1 }, 512).is_none());
        drop((a.block, c.block));
        assert!(matches!(p.free(7, 0, 1024, false), Freed::Kept));
        assert!(matches!(p.free(7, 3072, 5120, false), Freed::Kept));
        assert_eq!(p.bytes(), 6144);
        // The two free ranges do not touch: a request of 4096 fits only in the second.
        let (d, _) = p.take(&key(4096), 4096).unwrap();
        assert_eq!(d.at, 3072);
        drop(d.block);
        assert!(matches!(p.free(7, 3072, 4096, false), Freed::Kept));
        drop(b.block);
        match p.free(7, 1024, 2048, false) {
            Freed::Whole(k, c) => assert_eq!((k.capacity, c.id, c.block), (8192, 7, 70)),
            _ => panic!("the segment emptied"),
        }
        assert_eq!((p.bytes(), p.index.len(), p.segs.len()), (0, 0, 0));
    }

    #[test]
    fn a_piece_freed_while_held_stays_out_of_use_and_the_segment_is_dropped() {
        let mut p: Pieces<u32, ()> = Pieces::new();
        let (a, _) = p.split(key(4096), Cached { id: 1, block: 10 }, 512, 512);
        let (b, _) = p.take(&key(512), 512).unwrap();
        let held = Arc::clone(&a.block);
        drop(a.block);
        assert!(matches!(p.free(1, 0, 512, true), Freed::Kept));
        // Its range is not handed out: the next piece comes after b.
        let (c, _) = p.take(&key(512), 512).unwrap();
        assert_eq!(c.at, 1024);
        drop((b.block, c.block));
        assert!(matches!(p.free(1, 512, 512, false), Freed::Kept));
        match p.free(1, 1024, 512, false) {
            Freed::Dropped(capacity, _) => assert_eq!(capacity, 4096),
            _ => panic!("dropped, not cached"),
        }
        drop(held);
        assert_eq!(p.bytes(), 0);
    }

    #[test]
    fn a_refused_segment_is_forgotten_with_its_free_ranges() {
        let mut p: Pieces<u32, ()> = Pieces::new();
        let _a = p.split(key(4096), Cached { id: 1, block: 10 }, 512, 1024);
        let _b = p.split(key(8192), Cached { id: 2, block: 20 }, 512, 1024);
        assert_eq!(p.bytes(), 3072 + 7168);
        let (bytes, blocks) = p.forget_where(|&b| b == 20);
        assert_eq!((bytes, blocks.len(), p.bytes()), (7168, 1, 3072));
        let (c, _) = p.take(&key(512), 512).unwrap();
        assert_eq!(c.id, 1, "only the other block serves");
        assert!(p.take(&key(4096), 4096).is_none());
    }

    #[test]
    fn pieces_honour_alignment() {
        let mut p: Pieces<u32, ()> = Pieces::new();
        let k = Key { alignment: 4096, params: (), capacity: 16384 };
        let _a = p.split(k.clone(), Cached { id: 1, block: 1 }, 600, 1024);
        let (b, len) = p.take(&Key { capacity: 1000, ..k }, 1024).unwrap();
        assert_eq!((b.at, len), (4096, 1024));
        assert_eq!(p.bytes(), 16384 - 2048);
    }
}
