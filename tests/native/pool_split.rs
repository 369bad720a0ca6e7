//! Split blocks on host memory, through the public API: a cached block serves smaller requests
//! as pieces of it, each with its own bytes and bounds, and comes back whole once they are all
//! freed (wgpu never splits: its binding tests are in `wgpu_memory`).

use devalloc::{DeviceAllocator, DevicePtr, Error, HostAllocator, PointerProblem};

use super::split_hostile::{host_adds_up, repeating, EXTRA};

const KIB: usize = 1 << 10;

fn fill(a: &HostAllocator, p: DevicePtr, n: usize, seed: u8) {
    let bytes: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
    a.copy_host_to_device(p, &bytes, 0).unwrap();
}

fn holds(a: &HostAllocator, p: DevicePtr, n: usize, seed: u8) -> bool {
    let mut got = vec![0u8; n];
    a.copy_device_to_host(&mut got, p, 0).unwrap();
    got.iter().enumerate().all(|(i, &b)| b == (i as u8).wrapping_mul(31).wrapping_add(seed))
}

#[test]
fn pieces_of_one_cached_block_keep_their_own_bytes_and_bounds() {
    let _ = env_logger::builder().is_test(true).try_init();
    let a = HostAllocator::new();
    repeating(&a, 1024 * KIB);
    // Pieces of the cached block (the pool repeats, see `repeating`).
    let sizes = [300 * KIB, 400 * KIB + 7, 200 * KIB];
    let ptrs: Vec<DevicePtr> = sizes.iter().map(|&n| a.allocate(n, 0, 256).unwrap()).collect();
    let s = host_adds_up(&a);
    assert_eq!(
        (s.reserved_bytes, s.cache_misses),
        (1024 * KIB as u64 + EXTRA, 2),
        "pieces of the one block: {s:?}"
    );
    let blocks: Vec<u64> = a.live_allocations(0).unwrap().iter().map(|l| l.block).collect();
    assert!(blocks.windows(2).all(|w| w[0] == w[1]), "one block: {blocks:?}");
    for (k, (&p, &n)) in ptrs.iter().zip(&sizes).enumerate() {
        fill(&a, p, n, k as u8);
    }
    for (k, (&p, &n)) in ptrs.iter().zip(&sizes).enumerate() {
        assert!(holds(&a, p, n, k as u8), "piece {k} kept its bytes");
    }
    // A piece's bounds are its own, not its block's: a write past its end is refused and
    // changes nothing.
    let past = a.copy_host_to_device(ptrs[0].offset(1).unwrap(), &vec![9u8; sizes[0]], 0);
    assert!(matches!(past, Err(Error::OutOfBounds { .. })), "{past:?}");
    assert!(holds(&a, ptrs[1], sizes[1], 1), "the next piece is untouched");
    // Copies between pieces of one block.
    a.copy_device_to_device(ptrs[2], 0, ptrs[0], 0, 100 * KIB).unwrap();
    assert!(holds(&a, ptrs[2], 100 * KIB, 0) && holds(&a, ptrs[0], sizes[0], 0));
    // Interior, stale and double frees are refused and change nothing.
    let interior = a.deallocate(ptrs[1].offset(512).unwrap(), 0);
    assert!(
        matches!(interior, Err(Error::InvalidPointer { problem: PointerProblem::NotAllocationStart, .. })),
        "{interior:?}"
    );
    a.deallocate(ptrs[1], 0).unwrap();
    let before = host_adds_up(&a);
    let twice = a.deallocate(ptrs[1], 0);
    assert!(matches!(twice, Err(Error::InvalidPointer { problem: PointerProblem::Freed, .. })), "{twice:?}");
    assert!(matches!(a.copy_host_to_device(ptrs[1], &[1], 0), Err(Error::InvalidPointer { .. })));
    assert_eq!(host_adds_up(&a), before);
    // The freed middle piece is reused for a request that fits in it, at a fresh address.
    let again = a.allocate(250 * KIB, 0, 256).unwrap();
    assert_ne!(again, ptrs[1]);
    assert_eq!(host_adds_up(&a).cache_misses, 2);
    fill(&a, again, 250 * KIB, 7);
    assert!(holds(&a, ptrs[0], sizes[0], 0) && holds(&a, ptrs[2], 100 * KIB, 0));
    // While a piece is live its block cannot go back; once all are freed it goes back whole.
    a.deallocate(ptrs[0], 0).unwrap();
    a.deallocate(again, 0).unwrap();
    assert_eq!(a.empty_cache(), EXTRA, "the block still holds a live piece (the temporaries' block goes)");
    a.deallocate(ptrs[2], 0).unwrap();
    let s = host_adds_up(&a);
    assert_eq!((s.cached_bytes, s.live_allocations), (1024 * KIB as u64, 0));
    assert_eq!(a.empty_cache(), 1024 * KIB as u64);
    assert_eq!(host_adds_up(&a).reserved_bytes, 0);
}

#[test]
fn a_workload_that_repeats_settles_on_split_blocks() {
    // Sizes that add up to more than the workload holds at once (the pattern that never
    // settled on whole blocks): 56 KiB and 84 KiB together, then 100 KiB, then 106 KiB, eight
    // times in a step that holds a 4 KiB input throughout (33 allocations).
    let a = HostAllocator::new();
    let mut misses = Vec::new();
    for _ in 0..6 {
        let input = a.allocate(4 * KIB, 0, 256).unwrap();
        for _ in 0..8 {
            let x = a.allocate(56 * KIB, 0, 256).unwrap();
            let y = a.allocate(84 * KIB, 0, 256).unwrap();
            a.deallocate(x, 0).unwrap();
            a.deallocate(y, 0).unwrap();
            let z = a.allocate(100 * KIB, 0, 256).unwrap();
            a.deallocate(z, 0).unwrap();
            let w = a.allocate(106 * KIB, 0, 256).unwrap();
            a.deallocate(w, 0).unwrap();
        }
        a.deallocate(input, 0).unwrap();
        misses.push(host_adds_up(&a).cache_misses);
    }
    // Planned after the second step, its arena made in the third: nothing asked of the device
    // from the fourth on, and never more held than the 144 KiB it holds at once.
    assert!(misses[3..].iter().all(|&m| m == misses[2]), "device allocations after each step: {misses:?}");
    let s = host_adds_up(&a);
    assert!(s.peak_reserved_bytes <= 144 * KIB as u64, "{s:?}");
}
