//! How much the cache may hold without a memory limit. The pool's *budget* is the most bytes
//! its live blocks have held at once (the live high-water mark), plus a headroom of
//! [`PoolOptions::cache_headroom`](super::PoolOptions::cache_headroom) of that mark (1/16 by
//! default), plus the *proven* blocks in the cache, up to another sixteenth of the mark. A block
//! is proven when it was made for a size the workload asked for again after the budget had
//! given a block of that size back (a *ghost* hit), and stays so while it is reused. A fresh
//! block that would take the pool past its budget first gives back cached blocks, unproven
//! before proven, each kind freed longest ago first.
//!
//! Where a fresh block would pass the budget for a size the budget gave back before (the
//! workload is coming back to it: it repeats), the smallest larger cached block serves
//! instead, whatever its size, as long as live blocks stay within the budget with it: a
//! repeating workload settles on fewer, larger blocks rather than asking the device for the
//! same sizes every repetition. This may happen within a single pass too (any size given back
//! and asked for again), and a block so used may be many times its request while it is live.
//! Under a memory limit it happens only where the limit is at least twice the budget and has
//! room for another block of that size: near a limit, the limit's own eviction decides.
//!
//! Where blocks split (host memory, CUDA: see `pieces.rs` and `larger.rs`), such a size first
//! gets a fresh block where it fits as a proven one (a proven block being made counts as proven
//! cached), and otherwise a piece of the larger block, whose rest stays free: nothing is
//! wasted while it is live, and a repeating workload settles close to what it holds at once.
//!
//! So a workload that moves on (a growing KV cache, shapes that vary) holds at most an eighth
//! more than its high-water mark, and one that repeats settles with the blocks it reuses kept,
//! on larger blocks where its sizes add up to more than that eighth.

use std::collections::VecDeque;

use super::cache::Key;

/// Most budget evictions remembered as ghosts.
const GHOSTS: usize = 4096;
/// Proven blocks cached count towards the budget up to the high-water mark over this.
const PROVEN_DIV: u64 = 16;

/// The cache's budget of one pool; see the module docs.
pub(crate) struct Budget<P> {
    /// Most capacity live blocks have held at once.
    peak_live: u64,
    /// Keys of blocks the budget gave back, newest last.
    ghosts: VecDeque<Key<P>>,
}

impl<P: Ord + Clone> Budget<P> {
    pub fn new() -> Self {
        Budget { peak_live: 0, ghosts: VecDeque::new() }
    }

    /// Notes that live blocks hold `live` bytes now.
    pub fn live(&mut self, live: u64) {
        self.peak_live = self.peak_live.max(live);
    }

    /// The most the pool may hold while `live` bytes are live (a block being made included),
    /// with a headroom of `fraction` of the high-water mark and `proven` bytes of proven blocks
    /// cached.
    pub fn limit(&self, live: u64, fraction: f64, proven: u64) -> u64 {
        let mark = self.peak_live.max(live);
        let headroom = (mark as f64 * fraction.clamp(0.0, 1.0)) as u64;
        mark.saturating_add(headroom).saturating_add(proven.min(mark / PROVEN_DIV))
    }

    /// A request for `key` (capacities from `key.capacity` to `max`) missed the cache: whether
    /// a ghost would have served it (the ghost is then forgotten, and the block made for the
    /// request is proven).
    pub fn missed(&mut self, key: &Key<P>, max: u64) -> bool {
        match self.ghost(key, max) {
            Some(at) => {
                self.ghosts.remove(at);
                true
            }
            None => false,
        }
    }

    /// Whether a ghost would serve a request for `key` (capacities from `key.capacity` to
    /// `max`): the workload is coming back to a size the budget gave back.
    pub fn remembers(&self, key: &Key<P>, max: u64) -> bool {
        self.ghost(key, max).is_some()
    }

    /// The newest ghost that serves `key` (capacities up to `max`).
    fn ghost(&self, key: &Key<P>, max: u64) -> Option<usize> {
        let served = |g: &Key<P>| {
            g.alignment == key.alignment
                && g.params == key.params
                && (key.capacity..=max).contains(&g.capacity)
        };
        self.ghosts.iter().rposition(served)
    }

    /// Remembers blocks the budget gave back.
    pub fn gave_back(&mut self, keys: impl IntoIterator<Item = Key<P>>) {
        for key in keys {
            if self.ghosts.len() == GHOSTS {
                self.ghosts.pop_front();
            }
            self.ghosts.push_back(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(capacity: u64) -> Key<()> {
        Key { alignment: 256, params: (), capacity }
    }

    #[test]
    fn the_limit_is_the_high_water_mark_plus_headroom_plus_proven_blocks() {
        let mut b: Budget<()> = Budget::new();
        b.live(1000);
        b.live(400);
        assert_eq!(b.peak_live, 1000);
        assert_eq!(b.limit(500, 0.0625, 0), 1062);
        assert_eq!(b.limit(2000, 0.0, 0), 2000, "a new high-water mark");
        assert_eq!(b.limit(500, 5.0, 0), 2000, "the fraction is at most 1");
        assert_eq!(b.limit(500, 0.0, 50), 1050, "proven blocks cached");
        assert_eq!(b.limit(500, 0.0, 3000), 1062, "at most a sixteenth of the mark of them");
        assert_eq!(b.limit(u64::MAX, 1.0, u64::MAX), u64::MAX);
    }

    #[test]
    fn a_miss_that_a_ghost_would_have_served_is_a_ghost_hit_once() {
        let mut b: Budget<()> = Budget::new();
        b.gave_back([key(300), key(64)]);
        assert!(!b.missed(&key(100), 120), "no ghost of that size");
        assert!(!b.missed(&Key { alignment: 512, params: (), capacity: 250 }, 310), "another alignment");
        assert!(b.missed(&key(250), 310), "the 300-byte ghost would have served it");
        assert!(!b.missed(&key(250), 310), "each ghost counts once");
        assert!(b.remembers(&key(60), 64) && b.remembers(&key(60), 64), "looking does not forget");
        assert!(!b.remembers(&key(60), 63));
        b.gave_back((0..GHOSTS + 10).map(|_| key(200)));
        assert_eq!(b.ghosts.len(), GHOSTS, "the oldest are forgotten");
        assert!(!b.missed(&key(64), 64), "forgotten");
    }
}
