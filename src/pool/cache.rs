//! The pool's cache of freed blocks, keyed by what a block can be reused for, and its size
//! classes.

use std::collections::BTreeMap;

use crate::checks::round_up;

/// What a cached block can serve: its capacity, the alignment the block itself has, the
/// backend's params and (for storages that fix labels) its label.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Key<P> {
    pub capacity: u64,
    pub alignment: u64,
    pub params: P,
    pub label: Option<Box<str>>,
}

/// Freed blocks by [`Key`], and the bytes they hold.
pub(crate) struct BlockCache<B, P> {
    blocks: BTreeMap<Key<P>, Vec<B>>,
    bytes: u64,
}

impl<B, P: Ord> BlockCache<B, P> {
    pub fn new() -> Self {
        BlockCache { blocks: BTreeMap::new(), bytes: 0 }
    }

    /// A block for `key`, if one is cached.
    pub fn take(&mut self, key: &Key<P>) -> Option<B> {
        let list = self.blocks.get_mut(key)?;
        let block = list.pop()?;
        if list.is_empty() {
            self.blocks.remove(key);
        }
        self.bytes -= key.capacity;
        Some(block)
    }

    /// Keeps `block` for reuse under `key`.
    pub fn put(&mut self, key: Key<P>, block: B) {
        self.bytes += key.capacity;
        self.blocks.entry(key).or_default().push(block);
    }

    /// Empties the cache; the caller drops the blocks (outside its lock).
    pub fn take_all(&mut self) -> Vec<B> {
        self.bytes = 0;
        std::mem::take(&mut self.blocks).into_values().flatten().collect()
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// (capacity, number of blocks) of what is cached, by capacity.
    pub fn counts(&self) -> Vec<(u64, u64)> {
        let mut by: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
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

    #[test]
    fn cache_counts_bytes_by_key() {
        let mut c: BlockCache<u32, ()> = BlockCache::new();
        let k = |capacity| Key { capacity, alignment: 1, params: (), label: None };
        c.put(k(512), 1);
        c.put(k(512), 2);
        c.put(k(1024), 3);
        assert_eq!(c.bytes(), 2048);
        assert_eq!(c.take(&k(512)), Some(2));
        assert_eq!(c.take(&k(256)), None);
        assert_eq!(c.bytes(), 1536);
        assert_eq!(c.take_all().len(), 2);
        assert_eq!(c.bytes(), 0);
    }
}
