//! The contract's promises under hostile input, through the public API only: each test is
//! named after the behaviour it holds devalloc to. Host memory (and storages of the test's own,
//! through `devalloc::backend`) stand in for devices, so these run everywhere, Miri included.

use crate::conformance;
use crate::pool_policy::Counting;

#[path = "leak_report.rs"]
mod leak_report;

use devalloc::backend::{HostStorage, Pool, PooledAllocator, Storage};
use devalloc::PoolOptions;
use devalloc::{
    Device, DeviceAllocator, DeviceAllocatorRegistry, DeviceIndex, DevicePtr, DeviceType, Error,
    HostAllocator, PointerProblem, Result, DEFAULT_ALIGNMENT,
};

/// Host memory that says it is device `ty:index`: several "devices" of one allocator.
struct Indexed {
    host: HostStorage,
    device: Device,
    max: u64,
}

impl Indexed {
    fn new(ty: DeviceType, index: DeviceIndex) -> Self {
        Indexed { host: HostStorage, device: Device::new(ty, index), max: 1 << 40 }
    }
}

impl Storage for Indexed {
    type Block = <HostStorage as Storage>::Block;
    type Params = ();
    fn device(&self) -> Device {
        self.device
    }
    fn max_block_size(&self) -> u64 {
        self.max
    }
    fn alloc(&self, capacity: u64, alignment: u64, p: &(), l: &str) -> Result<Self::Block> {
        self.host.alloc(capacity, alignment.min(4096), p, l)
    }
    fn write(&self, b: &Self::Block, o: u64, src: &[u8]) -> Result<()> {
        self.host.write(b, o, src)
    }
    fn read(&self, b: &Self::Block, o: u64, dst: &mut [u8]) -> Result<()> {
        self.host.read(b, o, dst)
    }
    fn copy(&self, s: &Self::Block, so: u64, d: &Self::Block, d_o: u64, len: u64) -> Result<()> {
        self.host.copy(s, so, d, d_o, len)
    }
}

fn two_devices(config: PoolOptions) -> PooledAllocator<Indexed> {
    let pools =
        (0..2).map(|i| Pool::new(Indexed::new(DeviceType::Vulkan, i), config.clone()).unwrap()).collect();
    PooledAllocator::from_pools(DeviceType::Vulkan, pools).unwrap()
}

fn two_host_devices() -> conformance::Made {
    conformance::ready(Ok::<_, String>(two_devices(PoolOptions { caching: true, ..PoolOptions::default() })))
}

/// The whole suite on an allocator with two devices: cross-device copies and foreign pointers.
mod two_devices {
    use super::*;
    conformance_tests!(two_host_devices, conformance::Need::Always, conformance::Caching::On);
}

#[test]
fn refused_allocations_leave_the_stats_as_they_were() {
    let a = HostAllocator::new();
    let before = a.stats(0).unwrap();
    assert!(matches!(a.allocate(1 << 62, 0, 256), Err(Error::TooLarge { .. })));
    let e = a.allocate(8, 0, 1 << 62).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "alignment 2^62: {e}");
    assert_eq!(a.stats(0).unwrap(), before, "peak_reserved_bytes or a miss moved on a refusal");
    let cached = HostAllocator::with_options(PoolOptions {
        caching: true,
        memory_limit: Some(4096),
        ..PoolOptions::default()
    })
    .unwrap();
    let p = cached.allocate(3000, 0, 256).unwrap();
    let before = cached.stats(0).unwrap();
    assert!(matches!(cached.allocate(2000, 0, 256), Err(Error::OutOfMemory { .. })));
    assert_eq!(cached.stats(0).unwrap(), before);
    cached.deallocate(p, 0).unwrap();
}

#[test]
fn an_impossible_alignment_is_invalid_not_out_of_memory() {
    let a = HostAllocator::new();
    for shift in [53, 60, 62, 63] {
        let e = a.allocate(8, 0, 1 << shift).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "alignment 2^{shift}: {e}");
        assert!(e.to_string().contains("cannot be honoured"), "{e}");
    }
    let p = a.allocate(8, 0, 1 << 40).unwrap();
    assert_eq!(p.addr() % (1 << 40), 0);
    a.deallocate(p, 0).unwrap();
}

#[test]
fn a_request_that_fits_exactly_is_not_too_large_with_caching_on() {
    let a = HostAllocator::with_options(PoolOptions {
        caching: true,
        memory_limit: Some(1_000_000),
        ..PoolOptions::default()
    })
    .unwrap();
    let p = a.allocate(1_000_000, 0, 256).expect("exactly the limit fits");
    assert!(matches!(a.allocate(1, 0, 256), Err(Error::OutOfMemory { .. })));
    a.deallocate(p, 0).unwrap();
    assert!(matches!(a.allocate(1_000_001, 0, 256), Err(Error::TooLarge { max: 1_000_000, .. })));
    let mut s = Indexed::new(DeviceType::Gl, 0);
    s.max = 1_000_000;
    let pool = Pool::new(s, PoolOptions { caching: true, ..PoolOptions::default() }).unwrap();
    let p = pool.allocate(1_000_000, 256).expect("exactly the device's largest block fits");
    pool.deallocate(p).unwrap();
}

#[test]
fn bounced_copies_are_whole_or_nothing() {
    let registry = DeviceAllocatorRegistry::new();
    let host: &'static HostAllocator = Box::leak(Box::new(HostAllocator::new()));
    let dev: &'static PooledAllocator<Indexed> = Box::leak(Box::new(two_devices(PoolOptions::default())));
    registry.register_allocator(host).unwrap();
    registry.register_allocator(dev).unwrap();
    // 8 "MiB" spans two 4 MiB bounce chunks; under Miri (minutes per MiB) one small chunk.
    let mib = if cfg!(miri) { 1 << 10 } else { 1 << 20 };
    let src = host.allocate(8 * mib, 0, 256).unwrap();
    host.copy_host_to_device(src, &vec![7u8; 8 * mib], 0).unwrap();
    let dst = dev.allocate(6 * mib, 0, 256).unwrap();
    dev.copy_host_to_device(dst, &vec![1u8; 6 * mib], 0).unwrap();
    let (cpu, vk0, vk1) = (
        Device::new(DeviceType::Cpu, 0),
        Device::new(DeviceType::Vulkan, 0),
        Device::new(DeviceType::Vulkan, 1),
    );
    let e = registry.copy(vk0, dst, cpu, src, 8 * mib).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    let e = pollster::block_on(registry.copy_async(vk0, dst, cpu, src, 8 * mib)).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    // Across two devices of one allocator, blocking and async.
    let far = dev.allocate(8 * mib, 1, 256).unwrap();
    // 8 "MiB" into a 6 "MiB" destination: out of bounds, both ways.
    let e = dev.copy_device_to_device(dst, 0, far, 1, 8 * mib).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    let e = pollster::block_on(dev.copy_device_to_device_async(dst, 0, far, 1, 8 * mib)).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    let mut back = vec![0u8; 6 * mib];
    dev.copy_device_to_host(&mut back, dst, 0).unwrap();
    assert!(back.iter().all(|&b| b == 1), "a refused copy wrote part of the destination");
    // A stale source is refused before anything moves too.
    host.deallocate(src, 0).unwrap();
    assert!(matches!(
        registry.copy(vk1, far, cpu, src, 16),
        Err(Error::InvalidPointer { problem: PointerProblem::Freed, .. })
    ));
}

#[test]
fn stale_pointers_never_reach_a_newer_allocation_while_the_window_has_room() {
    // The case that broke the old 2^48 window: 256 rounds of 1 TiB (weightless blocks).
    let pool = Pool::new(Counting::new(), PoolOptions::default()).unwrap();
    let mut stale = Vec::new();
    for _ in 0..300 {
        let p = pool.allocate(1 << 40, 256).unwrap();
        assert!(!stale.contains(&p), "{p} handed out again");
        pool.deallocate(p).unwrap();
        stale.push(p);
    }
    for p in &stale {
        assert!(
            matches!(pool.write(*p, &[1]), Err(Error::InvalidPointer { problem: PointerProblem::Freed, .. })),
            "{p}"
        );
    }
}

#[test]
fn in_a_full_small_window_the_least_recently_freed_range_is_reused_first() {
    let config = PoolOptions { address_window: 1 << 17, ..PoolOptions::default() };
    let pool = Pool::new(Counting::new(), config).unwrap();
    // Fill the window (64 KiB usable: 15 x 4 KiB spans), then free in a scrambled order.
    let mut ptrs = Vec::new();
    while let Ok(p) = pool.allocate(4000, 256) {
        ptrs.push(p);
    }
    assert!(ptrs.len() >= 10, "{}", ptrs.len());
    let order: Vec<DevicePtr> = ptrs.iter().rev().step_by(2).copied().collect();
    for p in &order {
        pool.deallocate(*p).unwrap();
    }
    let again = pool.allocate(4000, 256).unwrap();
    assert_eq!(again, order[0], "the least recently freed range should go first");
    for p in &order[1..] {
        assert!(matches!(
            pool.write(*p, &[1]),
            Err(Error::InvalidPointer { problem: PointerProblem::Freed, .. })
        ));
    }
}

#[test]
fn a_device_index_past_255_is_refused() {
    let e = Pool::new(Indexed::new(DeviceType::Vulkan, 256), PoolOptions::default()).err().unwrap();
    assert!(e.to_string().contains("256"), "{e}");
    assert!(Pool::new(Indexed::new(DeviceType::Vulkan, 255), PoolOptions::default()).is_ok());
}

#[test]
fn pools_must_be_for_their_own_index() {
    let pools = vec![
        Pool::new(HostStorage, PoolOptions::default()).unwrap(),
        Pool::new(HostStorage, PoolOptions::default()).unwrap(),
    ];
    let e = PooledAllocator::from_pools(DeviceType::Cpu, pools).err().unwrap();
    assert!(e.to_string().contains("is for cpu:0, not cpu:1"), "{e}");
    let wrong_type = vec![Pool::new(Indexed::new(DeviceType::Gl, 0), PoolOptions::default()).unwrap()];
    let e = PooledAllocator::from_pools(DeviceType::Vulkan, wrong_type).err().unwrap();
    assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("not vulkan:0"), "{e}");
}

#[test]
fn a_foreign_source_pointer_is_named_as_another_devices() {
    let a = two_devices(PoolOptions::default());
    let mine = a.allocate(64, 0, DEFAULT_ALIGNMENT).unwrap();
    let theirs = a.allocate(64, 1, DEFAULT_ALIGNMENT).unwrap();
    let e = a.copy_device_to_device(mine, 0, theirs, 0, 8).unwrap_err();
    assert!(
        matches!(e, Error::InvalidPointer { problem: PointerProblem::OtherDevice(d), .. } if d.index == 1),
        "{e}"
    );
}

#[test]
fn an_out_of_memory_error_names_the_largest_live_allocations() {
    let a =
        HostAllocator::with_options(PoolOptions { memory_limit: Some(1 << 20), ..PoolOptions::default() })
            .unwrap();
    let big = a.allocate_labeled(700_000, 0, 256, "kv-cache").unwrap();
    let small = a.allocate_labeled(1000, 0, 256, "bias").unwrap();
    let e = a.allocate(500_000, 0, 256).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::OutOfMemory { .. }), "{msg}");
    assert!(msg.contains("kv-cache (700000 bytes") && msg.contains("limit of 1048576"), "{msg}");
    assert!(msg.find("kv-cache") < msg.find("bias"), "largest first: {msg}");
    a.deallocate(big, 0).unwrap();
    a.deallocate(small, 0).unwrap();
}

#[test]
fn freed_blocks_are_never_reused_with_the_debug_setting() {
    let a = HostAllocator::with_options(PoolOptions {
        caching: true,
        reuse_freed: false,
        ..PoolOptions::default()
    })
    .unwrap();
    for _ in 0..5 {
        let p = a.allocate(5000, 0, 256).unwrap();
        a.deallocate(p, 0).unwrap();
    }
    let s = a.stats(0).unwrap();
    assert_eq!((s.cache_hits, s.cache_misses, s.cached_bytes, s.reserved_bytes), (0, 5, 0, 0), "{s:?}");
}

#[test]
fn invalid_pool_settings_are_refused() {
    for window in [0, 3 << 20, 1 << 16, 1 << 54] {
        let c = PoolOptions { address_window: window, ..PoolOptions::default() };
        let e = HostAllocator::with_options(c).err().unwrap();
        assert!(matches!(e, Error::InvalidArgument { .. }), "window {window}: {e}");
    }
}

/// Host memory whose allocations take a while (so that threads overlap inside them) and come
/// in 4-byte granules (as wgpu's).
struct Slow(HostStorage);

impl Storage for Slow {
    type Block = <HostStorage as Storage>::Block;
    type Params = ();
    fn device(&self) -> Device {
        Device::new(DeviceType::Gl, 0)
    }
    fn granularity(&self) -> u64 {
        4
    }
    fn max_block_size(&self) -> u64 {
        1 << 30
    }
    fn alloc(&self, capacity: u64, alignment: u64, p: &(), l: &str) -> Result<Self::Block> {
        std::thread::sleep(std::time::Duration::from_millis(if cfg!(miri) { 1 } else { 20 }));
        self.0.alloc(capacity, alignment.min(4096), p, l)
    }
    fn write(&self, b: &Self::Block, o: u64, src: &[u8]) -> Result<()> {
        self.0.write(b, o, src)
    }
    fn read(&self, b: &Self::Block, o: u64, dst: &mut [u8]) -> Result<()> {
        self.0.read(b, o, dst)
    }
    fn copy(&self, s: &Self::Block, so: u64, d: &Self::Block, d_o: u64, len: u64) -> Result<()> {
        self.0.copy(s, so, d, d_o, len)
    }
}

fn slow(config: PoolOptions) -> PooledAllocator<Slow> {
    PooledAllocator::from_pools(DeviceType::Gl, vec![Pool::new(Slow(HostStorage), config).unwrap()]).unwrap()
}

#[test]
fn concurrent_inits_of_one_memory_id_allocate_once() {
    let a = slow(PoolOptions { caching: true, ..PoolOptions::default() });
    let barrier = std::sync::Barrier::new(6);
    let results: Vec<Result<DevicePtr>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..6)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    a.init_buffer(7, 1 << 16, 0)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1, "{results:?}");
    for r in results.iter().filter(|r| r.is_err()) {
        assert!(r.as_ref().unwrap_err().to_string().contains("already initialised"), "{r:?}");
    }
    let s = a.stats(0).unwrap();
    assert_eq!((s.allocations, s.deallocations, s.cache_misses, s.live_allocations), (1, 0, 1, 1), "{s:?}");
    a.release_buffers(0).unwrap();
}

#[test]
fn a_refused_plan_allocates_nothing() {
    let h = HostAllocator::new();
    let before = h.stats(0).unwrap();
    let e = devalloc::PlannedMemory::new(&h, &[4096, 0, usize::MAX], 0).err().unwrap();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert!(matches!(devalloc::PlannedMemory::new(&h, &[4096], 3), Err(Error::NoSuchDevice { .. })));
    assert_eq!(h.stats(0).unwrap(), before);
}

#[test]
fn an_alignment_that_leaves_no_room_in_a_small_window_is_invalid_not_out_of_memory() {
    let a = HostAllocator::with_options(PoolOptions {
        caching: true,
        address_window: 1 << 17,
        ..PoolOptions::default()
    })
    .unwrap();
    let p = a.allocate(4096, 0, 256).unwrap();
    a.deallocate(p, 0).unwrap();
    let before = a.stats(0).unwrap();
    for (size, align) in [(65536usize, 65536usize), (100_000, 65536)] {
        let e = a.allocate(size, 0, align).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{size} aligned {align}: {e}");
    }
    assert_eq!(a.stats(0).unwrap(), before);
    let e = a.deallocate(p, 0).unwrap_err();
    assert!(
        matches!(e, Error::InvalidPointer { problem: PointerProblem::Freed, .. }),
        "a refused request lifted the quarantine: {e}"
    );
}

#[test]
fn stale_pointers_of_recent_frees_stay_freed_in_a_small_window() {
    let a = HostAllocator::with_options(PoolOptions { address_window: 1 << 17, ..PoolOptions::default() })
        .unwrap();
    let mut recent: Vec<DevicePtr> = Vec::new();
    let cycles = if cfg!(miri) { 100 } else { 3000 };
    for _ in 0..cycles {
        let p = a.allocate(4096, 0, 256).unwrap();
        a.deallocate(p, 0).unwrap();
        recent.push(p);
        for q in recent.iter().rev().take(8).filter(|&&q| q != p) {
            let e = a.copy_host_to_device(*q, &[1], 0).unwrap_err();
            assert!(matches!(e, Error::InvalidPointer { problem: PointerProblem::Freed, .. }), "{q}: {e}");
        }
    }
}

#[test]
fn two_allocators_of_one_device_refuse_each_others_pointers() {
    let (a, b) = (HostAllocator::new(), HostAllocator::new());
    let pa = a.allocate(256, 0, 256).unwrap();
    let pb = b.allocate(256, 0, 256).unwrap();
    assert_ne!(pa, pb);
    assert!(matches!(b.copy_host_to_device(pa, &[9; 256], 0), Err(Error::InvalidPointer { .. })));
    assert!(matches!(b.check_range(pa, 8, 0), Err(Error::InvalidPointer { .. })));
    assert!(matches!(b.deallocate(pa, 0), Err(Error::InvalidPointer { .. })));
    a.deallocate(pa, 0).unwrap();
    b.deallocate(pb, 0).unwrap();
}

#[test]
fn two_allocators_of_one_device_never_hold_one_address_however_far_they_go() {
    // Far enough for two separate windows' cursors (2^44 bytes apart at the start) to meet:
    // one allocator takes 2 TiB of addresses a round, the other 1 TiB. The storage holds no
    // memory (addresses only).
    let (a, b) = (
        Pool::new(Counting::new(), PoolOptions::default()).unwrap(),
        Pool::new(Counting::new(), PoolOptions::default()).unwrap(),
    );
    let rounds = if cfg!(miri) { 40 } else { 20_000 };
    for _ in 0..rounds {
        let pa = a.allocate(1 << 41, 256).unwrap();
        let pb = b.allocate(1 << 40, 256).unwrap();
        assert!(!b.contains(pa) && !a.contains(pb), "{pa} and {pb}: one address in two allocators");
        assert!(matches!(b.write(pa, &[1]), Err(Error::InvalidPointer { .. })));
        a.deallocate(pa).unwrap();
        b.deallocate(pb).unwrap();
    }
}

#[test]
fn a_limit_between_granules_allows_the_granules_below_it_and_says_so() {
    let a = slow(PoolOptions { memory_limit: Some(1001), ..PoolOptions::default() });
    let e = a.allocate(1001, 0, 256).unwrap_err();
    assert!(matches!(e, Error::TooLarge { requested: 1001, max: 1000, .. }), "{e}");
    let p = a.allocate(1000, 0, 256).expect("1000 bytes are 250 granules, within the limit");
    a.deallocate(p, 0).unwrap();
}
