//! What the fuzz targets (`fuzz/`, `scripts/fuzz`) found, each case kept as a test through the
//! public API before anything about it changed. Each test names the target that found it.
//!
//! - `contract_host`: an allocation whose size overflows when rounded up to its alignment
//!   (`usize::MAX` bytes aligned to 2) is an `InvalidArgument`, not a `TooLarge`; the contract
//!   allows either for an impossible request, and the call changes nothing.
//! - `contract_host`, `contract_wgpu`: a planned buffer (`init_buffer`) freed with
//!   `deallocate` behind the plan's back: the free succeeds; the plan still hands out addresses
//!   in it, which every copy then refuses as freed; its memory id stays taken until
//!   `release_buffers`, which reports the stale buffer and still releases the rest.
//! - `contract_host` and `contract_wgpu` (10-minute runs): a small allocation beside one that
//!   fills a limit just over 64 KiB is `OutOfMemory`. devalloc was right; the model assumed
//!   every allocation took at most 16 KiB, and now counts what each one holds.

use devalloc::{DeviceAllocator, DevicePtr, Error, HostAllocator, PointerProblem, PoolOptions};

fn host() -> HostAllocator {
    let options = PoolOptions { memory_limit: Some(1 << 20), ..PoolOptions::default() };
    HostAllocator::with_options(options).unwrap()
}

#[test]
fn a_size_that_overflows_when_aligned_is_refused_and_changes_nothing() {
    let a = host();
    let keep = a.allocate(100, 0, 64).unwrap();
    let before = a.stats(0).unwrap();
    for (size, align) in
        [(usize::MAX, 2), (usize::MAX - 1, 4), (usize::MAX, 1 << 20), (usize::MAX / 2 + 1, 1)]
    {
        match a.allocate(size, 0, align) {
            Err(Error::InvalidArgument { .. } | Error::TooLarge { .. }) => {}
            other => panic!("allocate({size}, align {align}): {other:?}"),
        }
        assert_eq!(a.stats(0).unwrap(), before, "allocate({size}, align {align}) changed the stats");
    }
    a.deallocate(keep, 0).unwrap();
}

#[test]
fn a_planned_buffer_freed_behind_the_plans_back_is_refused_on_use_and_reported_at_release() {
    let a = host();
    let base = a.init_buffer(0, 64, 0).unwrap();
    let other = a.init_buffer(1, 32, 0).unwrap();
    a.copy_host_to_device(other, &[7; 32], 0).unwrap();
    a.deallocate(base, 0).unwrap();
    let before = a.stats(0).unwrap();
    assert_eq!((before.live_allocations, before.allocated_bytes), (1, 32));

    // The plan still knows memory id 0 and its bounds; what it hands out is refused on use.
    let p = a.get_offset_address(0, 8, 8, 0).unwrap();
    assert_eq!(p, DevicePtr::new(base.addr() + 8));
    assert!(matches!(a.get_offset_address(0, 60, 8, 0), Err(Error::OutOfBounds { .. })));
    let freed = |r: devalloc::Result<()>| {
        matches!(
            r,
            Err(Error::InvalidPointer { problem: PointerProblem::Freed | PointerProblem::Unknown, .. })
        )
    };
    assert!(freed(a.copy_host_to_device(p, &[1; 8], 0)));
    assert!(freed(a.copy_device_to_host(&mut [0; 8], p, 0)));
    assert!(freed(a.copy_device_to_device(other, 0, p, 0, 8)));
    assert!(freed(a.deallocate(base, 0)), "a second free of the planned buffer");
    assert!(matches!(a.init_buffer(0, 16, 0), Err(Error::InvalidArgument { .. })), "id 0 is still taken");
    assert_eq!(a.stats(0).unwrap(), before, "a refused call changed the stats");
    let mut back = [0; 32];
    a.copy_device_to_host(&mut back, other, 0).unwrap();
    assert_eq!(back, [7; 32]);

    // Release reports the stale buffer as freed, and frees the other one all the same.
    let e = a.release_buffers(0).unwrap_err();
    assert!(matches!(e, Error::InvalidPointer { problem: PointerProblem::Freed, .. }), "{e}");
    let s = a.stats(0).unwrap();
    assert_eq!((s.live_allocations, s.allocated_bytes, s.deallocations), (0, 0, 2), "{s:?}");
    assert!(matches!(a.get_offset_address(0, 0, 1, 0), Err(Error::NotFound { .. })));
    a.init_buffer(0, 16, 0).unwrap();
    a.release_buffers(0).unwrap();
}

#[test]
fn a_small_allocation_beside_one_that_fills_the_limit_is_out_of_memory() {
    for (limit, big, small) in [((64 << 10) + 97, 65535, 885), ((64 << 10) + 93, 63241, 4065)] {
        let options = PoolOptions { memory_limit: Some(limit), ..PoolOptions::default() };
        let a = HostAllocator::with_options(options).unwrap();
        let p = a.allocate(big, 0, 1).unwrap();
        let before = a.stats(0).unwrap();
        let r = a.allocate(small, 0, 16);
        assert!(matches!(r, Err(Error::OutOfMemory { .. })), "{r:?}");
        assert_eq!(a.stats(0).unwrap(), before, "a refused allocation changed the stats");
        a.deallocate(p, 0).unwrap();
        a.deallocate(a.allocate(small, 0, 16).unwrap(), 0).unwrap();
    }
}
