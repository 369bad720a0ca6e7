//! The pool's cache of freed blocks, keyed by what a block can be reused for, and its size
//! classes.

use std::collections::BTreeMap;

use crate::checks::round_up;

/// What a cached block can serve: the alignment the block itself has, the backend's params,
/// and its capacity. Ordered by (alignment, params, capacity), so that the blocks that can
/// serve one request are one range, smallest first.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Key<P> {
    pub alignment: u64,
    pub params: P,
    pub capacity: u64,
}

/// A block in the cache, with the pool's id for it and whether the workload has come back to
/// it (reused it, or asked again for its size after the budget gave one back).
pub(crate) struct Cached<B> {
    pub id: u64,
    pub block: B,
    pub proven: bool,
}

/// Freed blocks by [`Key`] (each with the order it was cached in), the same blocks in the
/// order the budget gives them back (unproven before proven, oldest first), and the bytes they
/// hold.
pub(crate) struct BlockCache<B, P> {
    blocks: BTreeMap<Key<P>, Vec<(u64, Cached<B>)>>,
    by_age: BTreeMap<(bool, u64), Key<P>>,
    next_seq: u64,
    bytes: u64,
    proven_bytes: u64,
}

impl<B, P: Ord + Clone> BlockCache<B, P> {
    pub fn new() -> Self {
        BlockCache {
            blocks: BTreeMap::new(),
            by_age: BTreeMap::new(),
            next_seq: 0,
            bytes: 0,
            proven_bytes: 0,
        }
    }

    /// Takes the newest block of `key` out (the caller has checked there is one).
    fn pop(&mut self, key: &Key<P>) -> Option<Cached<B>> {
        let list = self.blocks.get_mut(key)?;
        let (seq, cached) = list.pop()?;
        if list.is_empty() {
            self.blocks.remove(key);
        }
        self.by_age.remove(&(cached.proven, seq));
        self.forget(key.capacity, cached.proven);
        Some(cached)
    }

    fn forget(&mut self, capacity: u64, proven: bool) {
        self.bytes -= capacity;
        if proven {
            self.proven_bytes -= capacity;
        }
    }

    /// The smallest cached block for `key`'s alignment and params whose capacity lies in
    /// `key.capacity..=max`, with its key (best fit).
    pub fn take_fit(&mut self, key: &Key<P>, max: u64) -> Option<(Key<P>, Cached<B>)> {
        let hi = Key { capacity: max, ..key.clone() };
        let found = self.blocks.range(key..=&hi).next().map(|(k, _)| k.clone())?;
        let cached = self.pop(&found)?;
        Some((found, cached))
    }

    /// Keeps `block` for reuse under `key`.
    pub fn put(&mut self, key: Key<P>, cached: Cached<B>) {
        self.bytes += key.capacity;
        if cached.proven {
            self.proven_bytes += key.capacity;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.by_age.insert((cached.proven, seq), key.clone());
        self.blocks.entry(key).or_default().push((seq, cached));
    }

    /// Gives back blocks while `more(bytes given back so far, proven bytes still cached)` says
    /// so: unproven blocks before proven ones, each kind oldest first (what the workload stopped
    /// asking for). The caller drops the blocks (outside its lock).
    pub fn evict_oldest(&mut self, mut more: impl FnMut(u64, u64) -> bool) -> (u64, Vec<(Key<P>, B)>) {
        let mut freed = 0;
        let mut out = Vec::new();
        while more(freed, self.proven_bytes) {
            let Some(((proven, seq), key)) = self.by_age.pop_first() else { break };
            let list = self.blocks.get_mut(&key).expect("every aged block is listed");
            let at = list.iter().position(|(s, _)| *s == seq).expect("listed under its key");
            let (_, cached) = list.remove(at);
            if list.is_empty() {
                self.blocks.remove(&key);
            }
            self.forget(key.capacity, proven);
            freed += key.capacity;
            out.push((key, cached.block));
        }
        (freed, out)
    }

    /// Gives back at least `bytes` (or everything, if the cache holds less), touching as few
    /// blocks as it can: the smallest single block that is enough, else the largest blocks
    /// until enough. The caller drops the blocks (outside its lock).
    pub fn evict(&mut self, bytes: u64) -> (u64, Vec<B>) {
        if bytes >= self.bytes {
            let all = self.bytes;
            return (all, self.take_all());
        }
        let mut by_size: Vec<(u64, Key<P>)> = self.blocks.keys().map(|k| (k.capacity, k.clone())).collect();
        by_size.sort_by_key(|(c, _)| *c);
        let pick: Vec<Key<P>> = match by_size.iter().find(|(c, _)| *c >= bytes) {
            Some((_, k)) => vec![k.clone()],
            None => {
                let mut got = 0;
                let mut keys = Vec::new();
                for (c, k) in by_size.iter().rev() {
                    let n = self.blocks[k].len() as u64;
                    for _ in 0..n {
                        if got >= bytes {
                            break;
                        }
                        got += c;
                        keys.push(k.clone());
                    }
                }
                keys
            }
        };
        let mut freed = 0;
        let mut out = Vec::new();
        for k in pick {
            if let Some(c) = self.pop(&k) {
                freed += k.capacity;
                out.push(c.block);
            }
        }
        (freed, out)
    }

    /// Empties the cache; the caller drops the blocks (outside its lock).
    pub fn take_all(&mut self) -> Vec<B> {
        self.bytes = 0;
        self.proven_bytes = 0;
        self.by_age.clear();
        std::mem::take(&mut self.blocks).into_values().flatten().map(|(_, c)| c.block).collect()
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// (capacity, number of blocks) of what is cached, by capacity.
    pub fn counts(&self) -> Vec<(u64, u64)> {
        let mut by: BTreeMap<u64, u64> = BTreeMap::new();
        for (k, list) in &self.blocks {
            *by.entry(k.capacity).or_default() += list.len() as u64;
        }
        by.into_iter().collect()
    }
}

/// Capacity of a block for a request of `size` bytes: the size rounded up to 512 bytes; `None`
/// on overflow.
pub(crate) fn size_class(size: u64) -> Option<u64> {
    round_up(size.max(1), GRANULE)
}

/// What a block's capacity is a multiple of by default (as PyTorch rounds small requests).
pub(crate) const GRANULE: u64 = 512;

/// The largest cached block a request of `capacity` takes: an eighth more (the most a reuse
/// wastes).
pub(crate) fn reuse_bound(capacity: u64) -> u64 {
    capacity.saturating_add(capacity / 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_round_to_512_bytes() {
        assert_eq!(size_class(1), Some(512));
        assert_eq!(size_class(512), Some(512));
        assert_eq!(size_class(513), Some(1024));
        assert_eq!(size_class(1 << 20), Some(1 << 20));
        assert_eq!(size_class((1 << 20) + 1), Some((1 << 20) + 512));
        for s in (1..5000u64).chain([12345, 1 << 30, (1 << 30) + 7, 3 << 40]) {
            let c = size_class(s).unwrap();
            assert!(c >= s && c.is_multiple_of(512) && c - s < 512, "{s} -> {c}");
        }
        assert_eq!(size_class(u64::MAX), None);
        assert_eq!(reuse_bound(800), 900);
        assert_eq!(reuse_bound(u64::MAX), u64::MAX);
    }

    fn key(capacity: u64) -> Key<()> {
        Key { capacity, alignment: 1, params: () }
    }

    fn put(c: &mut BlockCache<u32, ()>, capacity: u64, block: u32) {
        c.put(key(capacity), Cached { id: u64::from(block), block, proven: block >= 100 });
    }

    #[test]
    fn cache_counts_bytes_and_takes_the_best_fit() {
        let mut c: BlockCache<u32, ()> = BlockCache::new();
        put(&mut c, 512, 1);
        put(&mut c, 512, 2);
        put(&mut c, 1024, 3);
        assert_eq!(c.bytes(), 2048);
        let (k, got) = c.take_fit(&key(400), 640).unwrap();
        assert_eq!((k.capacity, got.block), (512, 2));
        assert!(c.take_fit(&key(600), 1000).is_none(), "1024 is past the bound");
        assert!(
            c.take_fit(&Key { capacity: 100, alignment: 2, params: () }, 4096).is_none(),
            "another alignment"
        );
        assert_eq!(c.bytes(), 1536);
        assert_eq!(c.counts(), vec![(512, 1), (1024, 1)]);
        assert_eq!(c.take_all().len(), 2);
        assert_eq!(c.bytes(), 0);
    }

    #[test]
    fn eviction_gives_back_enough_with_the_fewest_blocks() {
        let mut c: BlockCache<u32, ()> = BlockCache::new();
        for (i, cap) in [256, 512, 4096, 8192, 8192].into_iter().enumerate() {
            put(&mut c, cap, i as u32);
        }
        // One block is enough: the smallest that is.
        let (freed, blocks) = c.evict(3000);
        assert_eq!((freed, blocks.len()), (4096, 1));
        // No single block is enough: the largest first.
        let (freed, blocks) = c.evict(10_000);
        assert_eq!((freed, blocks.len()), (16384, 2));
        assert_eq!(c.bytes(), 768);
        // More than everything: everything.
        let (freed, blocks) = c.evict(1 << 20);
        assert_eq!((freed, blocks.len(), c.bytes()), (768, 2, 0));
    }

    #[test]
    fn the_budget_gives_back_unproven_blocks_first_each_kind_oldest_first() {
        let mut c: BlockCache<u32, ()> = BlockCache::new();
        // Blocks 100 and up are proven (see `put`).
        for (cap, block) in [(4096, 100), (1024, 0), (512, 1), (1024, 2), (2048, 3)] {
            put(&mut c, cap, block);
        }
        // Taking the newest 1024 (block 2) leaves block 0 the oldest unproven one.
        assert_eq!(c.take_fit(&key(1024), 1024).unwrap().1.block, 2);
        let (freed, out) = c.evict_oldest(|freed, _| freed < 1200);
        let got: Vec<(u64, u32)> = out.into_iter().map(|(k, b)| (k.capacity, b)).collect();
        assert_eq!((freed, got), (1536, vec![(1024, 0), (512, 1)]));
        assert_eq!((c.bytes(), c.counts()), (6144, vec![(2048, 1), (4096, 1)]));
        // The proven block goes last, and the callback sees the proven bytes left.
        let mut seen = Vec::new();
        let (freed, out) = c.evict_oldest(|_, proven| {
            seen.push(proven);
            true
        });
        assert_eq!((freed, out.len(), c.bytes()), (6144, 2, 0));
        assert_eq!(seen, [4096, 4096, 0]);
        assert!(c.take_fit(&key(1), u64::MAX).is_none());
    }
}
