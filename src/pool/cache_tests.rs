//! The block cache's unit tests (`cache.rs`).
use super::*;

#[test]
fn the_reuse_bound_is_an_eighth_more() {
    assert_eq!(reuse_bound(800), 900);
    assert_eq!(reuse_bound(u64::MAX), u64::MAX);
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
    assert_eq!((k.key.capacity, got.block), (512, 2));
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
fn the_budget_gives_back_the_oldest_first_and_keeps_those_from_keep_from() {
    let mut c: BlockCache<u32, ()> = BlockCache::new();
    for (cap, block) in [(4096, 100), (1024, 0), (512, 1), (1024, 2), (2048, 3)] {
        put(&mut c, cap, block);
    }
    // Taking the newest 1024 (block 2) leaves its age entry stale.
    assert_eq!(c.take_fit(&key(1024), 1024).unwrap().1.block, 2);
    let (freed, out) = c.evict_oldest(u64::MAX, |freed| freed < 1200);
    let got: Vec<(u64, u32)> = out.into_iter().map(|(k, b)| (k.capacity, b)).collect();
    assert_eq!((freed, got), (4096, vec![(4096, 100)]));
    assert_eq!((c.bytes(), c.counts()), (3584, vec![(512, 1), (1024, 1), (2048, 1)]));
    // Blocks cached from sequence number 4 on are kept (block 2's stale entry is skipped).
    let (freed, out) = c.evict_oldest(4, |_| true);
    let got: Vec<(u64, u32)> = out.into_iter().map(|(k, b)| (k.capacity, b)).collect();
    assert_eq!((freed, got, c.bytes()), (1536, vec![(1024, 0), (512, 1)], 2048));
    let (freed, out) = c.evict_oldest(u64::MAX, |_| true);
    assert_eq!((freed, out.len(), c.bytes()), (2048, 1, 0));
    assert!(c.take_fit(&key(1), u64::MAX).is_none());
}

#[test]
fn a_block_put_back_is_as_it_was_and_stale_ages_are_dropped() {
    let mut c: BlockCache<u32, ()> = BlockCache::new();
    put(&mut c, 512, 0);
    put(&mut c, 1024, 1);
    let (taken, got) = c.take_fit(&key(512), 512).unwrap();
    c.put_back(taken, got);
    // Still the oldest: the budget gives it back first.
    let (_, out) = c.evict_oldest(u64::MAX, |freed| freed == 0);
    assert_eq!(out[0].1, 0);
    // A hot cycle of one size leaves at most a bounded number of stale entries behind.
    for round in 0..10_000u32 {
        put(&mut c, 4096, round % 7);
        c.take_fit(&key(4096), 4096).unwrap();
    }
    assert!(c.ages.len() <= 2 * c.count + 1024, "{}", c.ages.len());
    assert_eq!((c.bytes(), c.counts()), (1024, vec![(1024, 1)]));
    // Many sizes cached and taken leave their empty lists to be pruned.
    for size in 1..2000u64 {
        put(&mut c, size * 512, 1);
    }
    let (freed, out) = c.evict_oldest(u64::MAX, |_| true);
    assert_eq!((out.len(), c.bytes()), (2000, 0), "{freed}");
    assert!(c.blocks.len() <= 64, "{} lists left", c.blocks.len());
}
