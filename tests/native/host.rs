//! The conformance suite and the hostile model check on the host allocator, with and without
//! its cache, under a tiny memory limit, and with a tiny address window.

use crate::conformance;

use devalloc::{DeviceAllocator, HostAllocator, PoolOptions, DEFAULT_ALIGNMENT};

fn host(config: PoolOptions) -> conformance::Made {
    conformance::ready(HostAllocator::with_options(config))
}

fn plain() -> conformance::Made {
    host(PoolOptions { caching: false, ..PoolOptions::default() })
}

fn cached() -> conformance::Made {
    host(PoolOptions { caching: true, memory_limit: Some(1 << 30), ..PoolOptions::default() })
}

/// 64 KiB of memory and a 128 KiB address window: limits and address reuse are hit often.
fn cramped() -> conformance::Made {
    host(PoolOptions {
        caching: true,
        memory_limit: Some(64 << 10),
        address_window: 1 << 17,
        ..PoolOptions::default()
    })
}

fn cases(native: u32) -> u32 {
    if cfg!(miri) {
        2
    } else {
        native
    }
}

mod plain {
    use super::*;
    conformance_tests!(plain, conformance::Need::Always, conformance::Caching::Off);

    #[test]
    fn model_check() {
        conformance::model::model_check(plain, cases(64));
    }
}

mod cached {
    use super::*;
    conformance_tests!(cached, conformance::Need::Always, conformance::Caching::On);

    #[test]
    fn model_check() {
        conformance::model::model_check(cached, cases(64));
    }
}

mod cramped {
    use super::*;

    #[test]
    fn model_check() {
        conformance::model::model_check(cramped, cases(64));
    }
}

/// An async copy gives its executor back every 4 MiB (the host storage's async chunk): 64 MiB
/// uploads, downloads and copies (overlapping ones included) return `Pending` at least 15 times,
/// and every byte arrives.
#[test]
#[cfg_attr(miri, ignore = "64 MiB copies take hours under Miri")]
fn an_async_copy_does_at_most_one_chunk_of_work_per_poll() {
    let a = HostAllocator::new();
    let n = 64 << 20;
    let data = conformance::pattern(n, 5);
    let p = a.allocate(n + 4096, 0, DEFAULT_ALIGNMENT).unwrap();
    let (r, polls) = conformance::polls_until_ready(a.copy_host_to_device_async(p, &data, 0), || {});
    r.unwrap();
    assert!(polls >= 15, "a 64 MiB upload was Pending only {polls} times");
    let mut back = vec![0u8; n];
    let (r, polls) = conformance::polls_until_ready(a.copy_device_to_host_async(&mut back, p, 0), || {});
    r.unwrap();
    assert!(polls >= 15, "a 64 MiB download was Pending only {polls} times");
    assert!(back == data, "the download differs");
    // Overlapping, the destination above the source: piece by piece from the end.
    let (r, polls) = conformance::polls_until_ready(
        a.copy_device_to_device_async(p.offset(4096).unwrap(), 0, p, 0, n),
        || {},
    );
    r.unwrap();
    assert!(polls >= 15, "a 64 MiB copy was Pending only {polls} times");
    a.copy_device_to_host(&mut back, p.offset(4096).unwrap(), 0).unwrap();
    assert!(back == data, "the overlapping copy differs");
    a.deallocate(p, 0).unwrap();
}

/// The same for ragged copies between two allocations and within one (overlapping, the
/// destination five bytes above the source): each 64 MiB copy returns `Pending` at least 15
/// times, and the overlapping one moves the bytes as memmove would.
#[test]
#[cfg_attr(miri, ignore = "64 MiB copies take hours under Miri")]
fn ragged_async_copies_between_and_within_allocations_yield_every_4_mib() {
    let a = HostAllocator::new();
    let n = 64 << 20;
    let data = conformance::pattern(n, 9);
    let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
    let q = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
    a.copy_host_to_device(p, &data, 0).unwrap();
    let between = a.copy_device_to_device_async(q.offset(1).unwrap(), 0, p.offset(3).unwrap(), 0, n - 8);
    let (r, polls) = conformance::polls_until_ready(between, || {});
    r.unwrap();
    assert!(polls >= 15, "a ragged copy between allocations was Pending only {polls} times");
    let mut back = vec![0u8; n - 8];
    a.copy_device_to_host(&mut back, q.offset(1).unwrap(), 0).unwrap();
    assert!(back[..] == data[3..n - 5], "the ragged copy between allocations differs");
    let within = a.copy_device_to_device_async(p.offset(5).unwrap(), 0, p, 0, n - 5);
    let (r, polls) = conformance::polls_until_ready(within, || {});
    r.unwrap();
    assert!(polls >= 15, "an overlapping ragged copy was Pending only {polls} times");
    let mut back = vec![0u8; n - 5];
    a.copy_device_to_host(&mut back, p.offset(5).unwrap(), 0).unwrap();
    assert!(back[..] == data[..n - 5], "an overlapping async copy lost data");
    a.deallocate(p, 0).unwrap();
    a.deallocate(q, 0).unwrap();
}

#[test]
fn fresh_blocks_read_as_zero_and_their_memory_is_aligned() {
    // Fresh host memory is zeroed (the docs' promise), at every size the system allocator
    // serves differently: from its heap, and as fresh pages (past its mmap threshold, 32 MiB at
    // most), beside a block freed dirty. And the memory behind an allocation is aligned to a
    // cache line, however the system allocator aligned the block.
    let a = HostAllocator::with_options(PoolOptions { caching: false, ..PoolOptions::default() }).unwrap();
    // (Under Miri, which runs this module, the small sizes only: 40 MiB would take it minutes.)
    let sizes: &[usize] = if cfg!(miri) { &[1, 4096 + 3] } else { &[1, 4096 + 3, 1 << 20, 40 << 20] };
    for &n in sizes {
        let dirty = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
        a.copy_host_to_device(dirty, &vec![0xa5u8; n], 0).unwrap();
        a.deallocate(dirty, 0).unwrap();
        let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
        let mut back = vec![1u8; n];
        a.copy_device_to_host(&mut back, p, 0).unwrap();
        assert!(back.iter().all(|&b| b == 0), "{n} bytes: fresh memory holds old bytes");
        let at = a.host_address(p, n, 0).unwrap().as_ptr() as usize;
        assert_eq!(at % 64, 0, "{n} bytes at {at:#x}");
        a.deallocate(p, 0).unwrap();
    }
}
