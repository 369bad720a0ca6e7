//! The pool's cache of freed blocks, keyed by what a block can be reused for (the default size
//! class is `storage.rs`'s, beside the trait whose `size_class` it is).

use std::collections::{BTreeMap, VecDeque};

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

/// Where a block taken out of the cache was, so that a refused request can put it back as it
/// was (its place in the order the budget gives blocks back included).
pub(crate) struct Taken<P> {
    pub key: Key<P>,
    seq: u64,
}

/// Freed blocks by [`Key`] (each list in the order its blocks were cached), the same blocks in
/// the order the budget gives them back (oldest first), and the
/// bytes they hold.
///
/// Kept cheap for the hot cycle (a free, then an allocation of the same size): a key's list
/// stays in the map while empty (pruned when empty lists outnumber the others), and the age
/// queues are lazy: taking a block leaves its entry, which the budget skips once it finds the
/// block gone (the queues are rebuilt when stale entries outnumber live ones).
pub(crate) struct BlockCache<B, P> {
    blocks: BTreeMap<Key<P>, VecDeque<(u64, Cached<B>)>>,
    /// (seq, key) of the blocks, oldest first; may hold stale entries.
    ages: VecDeque<(u64, Key<P>)>,
    next_seq: u64,
    count: usize,
    empty_lists: usize,
    bytes: u64,
}

impl<B, P: Ord + Clone> BlockCache<B, P> {
    pub fn new() -> Self {
        BlockCache {
            blocks: BTreeMap::new(),
            ages: VecDeque::new(),
            next_seq: 0,
            count: 0,
            empty_lists: 0,
            bytes: 0,
        }
    }

    /// Takes the newest block of `key` out.
    fn pop(&mut self, key: &Key<P>) -> Option<(u64, Cached<B>)> {
        let list = self.blocks.get_mut(key)?;
        let (seq, cached) = list.pop_back()?;
        if list.is_empty() {
            self.empty_lists += 1;
        }
        self.forget(key.capacity);
        Some((seq, cached))
    }

    fn forget(&mut self, capacity: u64) {
        self.count -= 1;
        self.bytes -= capacity;
    }

    /// Files `cached` under `key` at `seq` (the newest of its key when `newest`).
    fn file(&mut self, key: Key<P>, seq: u64, cached: Cached<B>) {
        self.count += 1;
        self.bytes += key.capacity;
        let list = self.blocks.entry(key).or_default();
        if list.is_empty() && list.capacity() > 0 {
            self.empty_lists -= 1;
        }
        list.push_back((seq, cached));
    }

    /// The smallest cached block for `key`'s alignment and params whose capacity lies in
    /// `key.capacity..=max` (best fit), and where it was.
    pub fn take_fit(&mut self, key: &Key<P>, max: u64) -> Option<(Taken<P>, Cached<B>)> {
        let hi = Key { capacity: max, ..key.clone() };
        let (found, list) = self.blocks.range_mut(key..=&hi).find(|(_, l)| !l.is_empty())?;
        let (seq, cached) = list.pop_back()?;
        let emptied = list.is_empty();
        let found = found.clone();
        self.empty_lists += usize::from(emptied);
        self.forget(found.capacity);
        Some((Taken { key: found, seq }, cached))
    }

    /// Puts back a block [`BlockCache::take_fit`] took, exactly as it was.
    pub fn put_back(&mut self, taken: Taken<P>, cached: Cached<B>) {
        self.file(taken.key, taken.seq, cached);
    }

    /// Keeps `block` for reuse under `key`.
    pub fn put(&mut self, key: Key<P>, cached: Cached<B>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.ages.push_back((seq, key.clone()));
        self.file(key, seq, cached);
        if self.ages.len() > 2 * self.count + 1024 {
            self.rebuild_ages();
        }
    }

    /// Takes block `id` out, where it is cached under `key`.
    pub fn take_id(&mut self, key: &Key<P>, id: u64) -> Option<(Taken<P>, Cached<B>)> {
        let list = self.blocks.get_mut(key)?;
        let at = list.iter().position(|(_, c)| c.id == id)?;
        let (seq, cached) = list.remove(at)?;
        self.empty_lists += usize::from(list.is_empty());
        self.forget(key.capacity);
        Some((Taken { key: key.clone(), seq }, cached))
    }

    /// Takes the newest block cached under `key` exactly whose id `keep` does not pick (a plan's
    /// slot without a block yet takes one no other slot keeps, see `settle.rs`).
    pub fn take_unkept(&mut self, key: &Key<P>, keep: impl Fn(u64) -> bool) -> Option<(Taken<P>, Cached<B>)> {
        let id = self.blocks.get(key)?.iter().rev().find(|(_, c)| !keep(c.id))?.1.id;
        self.take_id(key, id)
    }

    /// Gives back every cached block whose id `keep` does not pick (a repeating workload's plan
    /// keeps its slots' blocks, see `settle.rs`). The caller drops the blocks (outside its lock).
    pub fn evict_unkept(&mut self, keep: impl Fn(u64) -> bool) -> (u64, Vec<(Key<P>, B)>) {
        let (mut out, mut gone) = (Vec::new(), Vec::new());
        for (key, list) in &mut self.blocks {
            let before = list.len();
            let mut kept = VecDeque::with_capacity(before);
            for (seq, cached) in list.drain(..) {
                if keep(cached.id) {
                    kept.push_back((seq, cached));
                } else {
                    gone.push(key.capacity);
                    out.push((key.clone(), cached.block));
                }
            }
            self.empty_lists += usize::from(before > 0 && kept.is_empty());
            *list = kept;
        }
        let mut bytes = 0;
        for capacity in gone {
            bytes += capacity;
            self.forget(capacity);
        }
        (bytes, out)
    }

    /// Drops the stale entries of the age queues, and the empty lists.
    fn rebuild_ages(&mut self) {
        let mut live: Vec<(u64, Key<P>)> = Vec::with_capacity(self.count);
        for (key, list) in &self.blocks {
            live.extend(list.iter().map(|(seq, _)| (*seq, key.clone())));
        }
        live.sort_by_key(|(seq, _)| *seq);
        self.ages = live.into();
        self.blocks.retain(|_, l| !l.is_empty());
        self.empty_lists = 0;
    }

    /// Gives back blocks, oldest first (what the workload stopped asking for), while
    /// `more(bytes given back so far)` says so and the oldest was cached before `keep_from`.
    /// The caller drops the blocks (outside its lock).
    pub fn evict_oldest(
        &mut self,
        keep_from: u64,
        mut more: impl FnMut(u64) -> bool,
    ) -> (u64, Vec<(Key<P>, B)>) {
        let mut freed = 0u64;
        let mut out = Vec::new();
        while self.count > 0 && more(freed) {
            if self.ages.front().is_some_and(|(seq, _)| *seq >= keep_from) {
                break;
            }
            let Some((seq, key)) = self.ages.pop_front() else { break };
            // A stale entry (the block was taken since) is skipped.
            let Some(list) = self.blocks.get_mut(&key) else { continue };
            let Some(at) = list.iter().position(|(s, _)| *s == seq) else { continue };
            let (_, cached) = list.remove(at).expect("found above");
            if list.is_empty() {
                self.empty_lists += 1;
            }
            self.forget(key.capacity);
            freed = freed.saturating_add(key.capacity);
            out.push((key, cached.block));
        }
        self.prune();
        (freed, out)
    }

    /// Drops empty lists once they outnumber the others.
    fn prune(&mut self) {
        if self.empty_lists > 64 && self.empty_lists > self.blocks.len() / 2 {
            self.blocks.retain(|_, l| !l.is_empty());
            self.empty_lists = 0;
        }
    }

    /// Gives back at least `bytes` (or everything, if the cache holds less), touching as few
    /// blocks as it can: the smallest single block that is enough, else the largest blocks
    /// until enough. The caller drops the blocks (outside its lock).
    pub fn evict(&mut self, bytes: u64) -> (u64, Vec<B>) {
        if bytes >= self.bytes {
            let all = self.bytes;
            return (all, self.take_all());
        }
        let mut by_size: Vec<(u64, Key<P>)> =
            self.blocks.iter().filter(|(_, l)| !l.is_empty()).map(|(k, _)| (k.capacity, k.clone())).collect();
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
            if let Some((_, c)) = self.pop(&k) {
                freed += k.capacity;
                out.push(c.block);
            }
        }
        self.prune();
        (freed, out)
    }

    /// Takes out every block `drop_it` picks (blocks the device refused); returns the bytes
    /// and the blocks, for the caller to drop (outside its lock).
    pub fn take_where(&mut self, mut drop_it: impl FnMut(&B) -> bool) -> (u64, Vec<B>) {
        let (mut bytes, mut out) = (0, Vec::new());
        let mut emptied = 0;
        let mut forgotten = Vec::new();
        for (key, list) in self.blocks.iter_mut() {
            if !list.iter().any(|(_, c)| drop_it(&c.block)) {
                continue;
            }
            let was = list.len();
            for (seq, c) in std::mem::take(list) {
                if drop_it(&c.block) {
                    bytes += key.capacity;
                    forgotten.push(key.capacity);
                    out.push(c.block);
                } else {
                    list.push_back((seq, c));
                }
            }
            emptied += usize::from(was > 0 && list.is_empty());
        }
        self.empty_lists += emptied;
        for capacity in forgotten {
            self.forget(capacity);
        }
        self.prune();
        (bytes, out)
    }

    /// Empties the cache; the caller drops the blocks (outside its lock).
    pub fn take_all(&mut self) -> Vec<B> {
        self.bytes = 0;
        self.count = 0;
        self.empty_lists = 0;
        self.ages = VecDeque::new();
        std::mem::take(&mut self.blocks).into_values().flatten().map(|(_, c)| c.block).collect()
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The sequence number the next cached block gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// (capacity, number of blocks) of what is cached, by capacity.
    pub fn counts(&self) -> Vec<(u64, u64)> {
        let mut by: BTreeMap<u64, u64> = BTreeMap::new();
        for (k, list) in self.blocks.iter().filter(|(_, l)| !l.is_empty()) {
            *by.entry(k.capacity).or_default() += list.len() as u64;
        }
        by.into_iter().collect()
    }
}

/// The largest cached block a request of `capacity` takes: an eighth more (the most a reuse
/// wastes).
pub(crate) fn reuse_bound(capacity: u64) -> u64 {
    capacity.saturating_add(capacity / 8)
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
