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

/// A block in the cache, with the pool's id for it.
pub(crate) struct Cached<B> {
    pub id: u64,
    pub block: B,
}

/// Freed blocks by [`Key`], and the bytes they hold.
pub(crate) struct BlockCache<B, P> {
    blocks: BTreeMap<Key<P>, Vec<Cached<B>>>,
    bytes: u64,
}

impl<B, P: Ord + Clone> BlockCache<B, P> {
    pub fn new() -> Self {
        BlockCache { blocks: BTreeMap::new(), bytes: 0 }
    }

    /// The smallest cached block for `key`'s alignment and params whose capacity lies in
    /// `key.capacity..=max`, with its key (best fit).
    pub fn take_fit(&mut self, key: &Key<P>, max: u64) -> Option<(Key<P>, Cached<B>)> {
        let hi = Key { capacity: max, ..key.clone() };
        let found = self.blocks.range(key..=&hi).next().map(|(k, _)| k.clone())?;
        let list = self.blocks.get_mut(&found)?;
        let cached = list.pop()?;
        if list.is_empty() {
            self.blocks.remove(&found);
        }
        self.bytes -= found.capacity;
        Some((found, cached))
    }

    /// Keeps `block` for reuse under `key`.
    pub fn put(&mut self, key: Key<P>, cached: Cached<B>) {
        self.bytes += key.capacity;
        self.blocks.entry(key).or_default().push(cached);
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
            if let Some(list) = self.blocks.get_mut(&k) {
                if let Some(c) = list.pop() {
                    freed += k.capacity;
                    out.push(c.block);
                }
                if list.is_empty() {
                    self.blocks.remove(&k);
                }
            }
        }
        self.bytes -= freed;
        (freed, out)
    }

    /// Empties the cache; the caller drops the blocks (outside its lock).
    pub fn take_all(&mut self) -> Vec<B> {
        self.bytes = 0;
        std::mem::take(&mut self.blocks).into_values().flatten().map(|c| c.block).collect()
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

/// Size class of a request: four classes per power of two (at most 25% more than asked),
/// 256 bytes at least; `None` on overflow.
pub(crate) fn size_class(size: u64) -> Option<u64> {
    if size <= 256 {
        return Some(256);
    }
    let pow = 63 - (size - 1).leading_zeros(); // 2^pow < size <= 2^(pow+1)
    let step = 1u64 << (pow - 2);
    round_up(size, step)
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

    fn key(capacity: u64) -> Key<()> {
        Key { capacity, alignment: 1, params: () }
    }

    fn put(c: &mut BlockCache<u32, ()>, capacity: u64, block: u32) {
        c.put(key(capacity), Cached { id: u64::from(block), block });
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
}
