//! Registry (which gives allocators back as their own types, a wrapper of one's own included),
//! RAII buffer, cross-device copies and the host allocator's own promises (caching by default).

use std::sync::atomic::{AtomicUsize, Ordering};

use devalloc::{
    DeviceAllocator, DeviceAllocatorRegistry, DeviceIndex, DeviceMemoryBuffer, DevicePtr, DeviceType, Error,
    HostAllocator, PlannedMemory, PointerProblem, PoolOptions, DEFAULT_ALIGNMENT,
};

/// An outside allocator that writes only the five required methods: host memory that claims
/// another device type, so that copies between "devices" of two types can be tested here.
struct Relabel {
    inner: HostAllocator,
    ty: DeviceType,
}

impl DeviceAllocator for Relabel {
    fn device_type(&self) -> DeviceType {
        self.ty
    }
    fn allocate(&self, nbytes: usize, index: DeviceIndex, alignment: usize) -> devalloc::Result<DevicePtr> {
        self.inner.allocate(nbytes, index, alignment)
    }
    fn deallocate(&self, ptr: DevicePtr, index: DeviceIndex) -> devalloc::Result<()> {
        self.inner.deallocate(ptr, index)
    }
    fn copy_host_to_device(&self, dst: DevicePtr, src: &[u8], index: DeviceIndex) -> devalloc::Result<()> {
        self.inner.copy_host_to_device(dst, src, index)
    }
    fn copy_device_to_host(
        &self,
        dst: &mut [u8],
        src: DevicePtr,
        index: DeviceIndex,
    ) -> devalloc::Result<()> {
        self.inner.copy_device_to_host(dst, src, index)
    }
}

fn leak<T: DeviceAllocator + 'static>(a: T) -> &'static T {
    Box::leak(Box::new(a))
}

fn relabel(ty: DeviceType) -> &'static Relabel {
    leak(Relabel { inner: HostAllocator::new(), ty })
}

#[test]
fn unregistered_types_are_not_found() {
    let r = DeviceAllocatorRegistry::new();
    for &t in DeviceType::ALL {
        assert!(r.get_allocator(t).is_none());
    }
    let e = DeviceMemoryBuffer::create_in(&r, 16, DeviceType::Vulkan, 0, DEFAULT_ALIGNMENT).unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("no allocator is registered for vulkan"), "{e}");
}

#[test]
fn second_registration_is_refused_and_the_first_stays() {
    let r = DeviceAllocatorRegistry::new();
    let first = relabel(DeviceType::Cuda);
    r.register_allocator(first).unwrap();
    let e = r.register_allocator(relabel(DeviceType::Cuda)).unwrap_err();
    assert!(matches!(e, Error::AlreadyRegistered { device_type: DeviceType::Cuda }));
    assert!(e.to_string().contains("already registered"), "{e}");
    let got = r.get_allocator(DeviceType::Cuda).unwrap();
    assert!(
        std::ptr::addr_eq(got, first as &dyn DeviceAllocator),
        "the second registration replaced the first"
    );
    assert_eq!(r.allocators().count(), 1);
}

#[test]
fn concurrent_registration_and_lookup() {
    let r: &'static DeviceAllocatorRegistry = Box::leak(Box::new(DeviceAllocatorRegistry::new()));
    let wins = AtomicUsize::new(0);
    let seen = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..16 {
            let (wins, seen) = (&wins, &seen);
            s.spawn(move || {
                let ty = DeviceType::ALL[t % DeviceType::ALL.len()];
                if r.register_allocator(relabel(ty)).is_ok() {
                    wins.fetch_add(1, Ordering::SeqCst);
                }
                for _ in 0..10_000 {
                    if let Some(a) = r.get_allocator(ty) {
                        assert_eq!(a.device_type(), ty);
                        seen.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    // Exactly one registration per type won, and every lookup after it saw the winner.
    assert_eq!(wins.load(Ordering::SeqCst), DeviceType::ALL.len());
    assert_eq!(seen.load(Ordering::Relaxed), 16 * 10_000);
}

#[test]
fn local_registries_are_independent_of_the_global_one() {
    let local = DeviceAllocatorRegistry::new();
    local.register_allocator(relabel(DeviceType::Metal)).unwrap();
    assert!(devalloc::get_device_allocator(DeviceType::Metal).is_none());
    assert!(DeviceAllocatorRegistry::instance().get_allocator(DeviceType::Metal).is_none());
    let other = DeviceAllocatorRegistry::new();
    assert!(other.get_allocator(DeviceType::Metal).is_none());
}

#[test]
fn global_registry_and_raii_buffers() {
    // The only test in this binary that touches the global registry.
    devalloc::register_device_allocator(leak(HostAllocator::new())).unwrap();
    assert!(matches!(
        devalloc::register_device_allocator(leak(HostAllocator::new())),
        Err(Error::AlreadyRegistered { .. })
    ));
    let host = devalloc::get_device_allocator(DeviceType::Cpu).unwrap();
    let mut buf = DeviceMemoryBuffer::create(64, DeviceType::Cpu, 0).unwrap();
    assert_eq!(buf.ptr().addr() % DEFAULT_ALIGNMENT as u64, 0);
    let aligned = DeviceMemoryBuffer::create_aligned(10, DeviceType::Cpu, 0, 4096).unwrap();
    assert_eq!(aligned.ptr().addr() % 4096, 0);
    assert_eq!(host.stats(0).unwrap().live_allocations, 2);
    buf.write_pod(&[7u64; 8]).unwrap();
    buf.write_at(60, &[1, 2, 3, 4]).unwrap();
    assert!(matches!(buf.write_at(61, &[1, 2, 3, 4]), Err(Error::OutOfBounds { .. })));
    let v = buf.to_vec::<u32>().unwrap();
    assert_eq!(v[..14], [7, 0].repeat(7)[..]);
    assert_eq!(v[15], u32::from_le_bytes([1, 2, 3, 4]));
    let ptr = buf.ptr();
    drop(buf);
    drop(aligned);
    assert_eq!(host.stats(0).unwrap().live_allocations, 0);
    assert!(host.deallocate(ptr, 0).is_err(), "the buffer was freed once; a second free must fail");
    assert!(matches!(DeviceMemoryBuffer::create(0, DeviceType::Cpu, 0), Err(Error::InvalidArgument { .. })));
    assert!(matches!(DeviceMemoryBuffer::create(8, DeviceType::Cpu, 1), Err(Error::NoSuchDevice { .. })));

    // Default: empty, nothing to free.
    let empty = DeviceMemoryBuffer::default();
    assert!(empty.is_empty() && empty.ptr().is_null() && empty.size() == 0);
    assert!(empty.to_vec::<u8>().is_err());
    drop(empty);
    // into_raw hands ownership out.
    let (p, n) = DeviceMemoryBuffer::create(32, DeviceType::Cpu, 0).unwrap().into_raw();
    assert_eq!(n, 32);
    host.deallocate(p, 0).unwrap();
}

#[test]
fn defaults_of_an_outside_allocator() {
    let a = relabel(DeviceType::Dx12);
    let p = a.allocate(8, 0, 8).unwrap();
    assert!(matches!(a.copy_device_to_device(p, 0, p, 0, 8), Err(Error::NotSupported { .. })));
    assert!(matches!(a.init_buffer(0, 8, 0), Err(Error::NotSupported { .. })));
    assert!(matches!(a.stats(0), Err(Error::NotSupported { .. })));
    assert_eq!(a.device_count(), 1);
    let mut back = [0u8; 8];
    a.copy_host_to_device(p, b"asyncdef", 0).unwrap();
    pollster::block_on(a.copy_device_to_host_async(&mut back, p, 0)).unwrap();
    assert_eq!(&back, b"asyncdef");
    a.deallocate(p, 0).unwrap();
}

#[test]
fn copies_between_device_types_bounce_through_the_host_in_chunks() {
    let r = DeviceAllocatorRegistry::new();
    let host = leak(HostAllocator::new());
    let cuda = relabel(DeviceType::Cuda);
    let vk = relabel(DeviceType::Vulkan);
    r.register_allocator(host).unwrap();
    r.register_allocator(cuda).unwrap();
    r.register_allocator(vk).unwrap();
    let n = 9 << 20 | 5; // more than two bounce chunks, ragged end
    let data: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
    let h = host.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
    let c = cuda.allocate(n + 1, 0, DEFAULT_ALIGNMENT).unwrap();
    let v = vk.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
    host.copy_host_to_device(h, &data, 0).unwrap();
    let cpu0 = "cpu:0".parse().unwrap();
    let cuda0 = "cuda:0".parse().unwrap();
    let vk0 = "vulkan:0".parse().unwrap();
    r.copy(cuda0, c.offset(1).unwrap(), cpu0, h, n).unwrap();
    r.copy(vk0, v, cuda0, c.offset(1).unwrap(), n).unwrap();
    let mut back = vec![0u8; n];
    vk.copy_device_to_host(&mut back, v, 0).unwrap();
    assert!(back == data, "bounced copy differs");
    // Same type: the allocator's own d2d.
    let h2 = host.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
    r.copy(cpu0, h2, cpu0, h, n).unwrap();
    // A bad range fails before a byte moves, an unregistered type is NotFound.
    assert!(matches!(r.copy(vk0, v, cuda0, c, n + 2), Err(Error::OutOfBounds { .. })));
    assert!(matches!(r.copy("metal:0".parse().unwrap(), v, cuda0, c, 1), Err(Error::NotFound { .. })));
    // An outside allocator without d2d says so.
    assert!(matches!(r.copy(cuda0, c, cuda0, c, 1), Err(Error::NotSupported { .. })));
    for (a, p) in [(host as &dyn DeviceAllocator, h), (host, h2), (cuda, c), (vk, v)] {
        a.deallocate(p, 0).unwrap();
    }
}

#[test]
fn host_reports_freed_pointers_as_freed() {
    let a = HostAllocator::new();
    let p = a.allocate(100, 0, DEFAULT_ALIGNMENT).unwrap();
    a.deallocate(p, 0).unwrap();
    for r in [a.deallocate(p, 0), a.copy_host_to_device(p.offset(50).unwrap(), &[1], 0)] {
        match r {
            Err(Error::InvalidPointer { problem: PointerProblem::Freed, .. }) => {}
            other => panic!("expected a 'freed' pointer error, got {other:?}"),
        }
    }
    let e = a.deallocate(DevicePtr::new(0x1234), 0).unwrap_err();
    assert!(e.to_string().contains("no live allocation"), "{e}");
    let q = a.allocate(100, 0, DEFAULT_ALIGNMENT).unwrap();
    assert_ne!(q, p, "a freed address was handed out again");
    let e = a.deallocate(q.offset(1).unwrap(), 0).unwrap_err();
    assert!(matches!(e, Error::InvalidPointer { problem: PointerProblem::NotAllocationStart, .. }), "{e}");
    a.deallocate(q, 0).unwrap();
}

#[test]
fn cache_limit_and_report() {
    let a = HostAllocator::with_options(PoolOptions {
        caching: true,
        memory_limit: Some(1 << 20),
        ..PoolOptions::default()
    })
    .unwrap();
    let p = a.allocate(1000, 0, DEFAULT_ALIGNMENT).unwrap();
    a.deallocate(p, 0).unwrap();
    let s = a.stats(0).unwrap();
    assert_eq!((s.cache_hits, s.cache_misses), (0, 1));
    assert_eq!(s.cached_bytes, 1024);
    let q = a.allocate(1010, 0, DEFAULT_ALIGNMENT).unwrap(); // same size class
    let s = a.stats(0).unwrap();
    assert_eq!((s.cache_hits, s.cached_bytes, s.reserved_bytes), (1, 0, 1024));
    // The limit: can never fit vs. not now.
    assert!(matches!(a.allocate(2 << 20, 0, DEFAULT_ALIGNMENT), Err(Error::TooLarge { max: 1048576, .. })));
    let big = a.allocate(800 << 10, 0, DEFAULT_ALIGNMENT).unwrap();
    let before = a.stats(0).unwrap();
    let e = a.allocate(300 << 10, 0, DEFAULT_ALIGNMENT).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { .. }) && e.to_string().contains("limit"), "{e}");
    assert_eq!(a.stats(0).unwrap(), before, "a refused allocation changed the stats");
    // Freeing makes room again; the cache is emptied before an allocation is refused.
    a.deallocate(big, 0).unwrap();
    let r = a.allocate(300 << 10, 0, DEFAULT_ALIGNMENT).unwrap();
    assert_eq!(a.stats(0).unwrap().cached_bytes, 0, "the cached 800 KiB block should have been evicted");
    let labeled = a.allocate_labeled(77, 0, DEFAULT_ALIGNMENT, "weights").unwrap();
    let report = a.report();
    assert!(report.contains("3 live allocation(s)") && report.contains("weights"), "{report}");
    a.deallocate(labeled, 0).unwrap();
    a.deallocate(r, 0).unwrap();
    a.deallocate(q, 0).unwrap();
    assert!(a.empty_cache() > 0);
    assert_eq!(a.stats(0).unwrap().reserved_bytes, 0);
}

#[test]
fn planned_memory_owns_its_pools() {
    let a = HostAllocator::new();
    {
        let plan = PlannedMemory::new(&a, &[0, 4096, 64], 0).unwrap();
        assert_eq!(plan.num_buffers(), 3);
        assert_eq!(a.stats(0).unwrap().live_allocations, 2, "empty ids take no memory");
        let t = plan.get_offset_address(1, 1024, 512).unwrap();
        a.copy_host_to_device(t, &[9u8; 512], 0).unwrap();
        assert!(plan.get_offset_address(0, 0, 0).unwrap().is_null());
        assert!(matches!(plan.get_offset_address(0, 0, 1), Err(Error::OutOfBounds { .. })));
        assert!(matches!(plan.get_offset_address(3, 0, 1), Err(Error::NotFound { .. })));
    }
    assert_eq!(a.stats(0).unwrap().live_allocations, 0, "the plan's pools were not freed on drop");
    // A failing plan frees what it had made.
    let limited =
        HostAllocator::with_options(PoolOptions { memory_limit: Some(10_000), ..PoolOptions::default() })
            .unwrap();
    assert!(PlannedMemory::new(&limited, &[4096, 4096, 4096], 0).is_err());
    assert_eq!(limited.stats(0).unwrap().live_allocations, 0);
}

/// A plan's buffers that `PlannedMemory` keeps show in the history as planned buffers, with
/// their memory ids, as the allocator's own `init_buffer` ones do.
#[test]
fn planned_memory_buffers_are_recorded_as_planned() {
    use devalloc::snapshot::EventKind;
    let a = HostAllocator::new();
    a.record_history(64).unwrap();
    let plan = PlannedMemory::new(&a, &[4096, 0, 64], 0).unwrap();
    let snap = a.snapshot().unwrap();
    let events = &snap.devices[0].history.as_ref().unwrap().events;
    let planned: Vec<u32> = events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::PlannedBuffer { memory_id, .. } => Some(memory_id),
            _ => None,
        })
        .collect();
    assert_eq!(planned, [0, 2], "the empty buffer 1 allocates nothing");
    drop(plan);
    assert_eq!(a.stats(0).unwrap().live_allocations, 0);
}

/// Every built-in allocator caches by default: a freed block serves the next request of its
/// size class, whatever its label.
#[test]
fn every_built_in_allocator_caches_by_default() {
    assert!(PoolOptions::default().caching);
    let a = HostAllocator::new();
    let p = a.allocate(1000, 0, 256).unwrap();
    a.deallocate(p, 0).unwrap();
    let q = a.allocate_labeled(900, 0, 256, "another").unwrap();
    assert_eq!(a.stats(0).unwrap().cache_hits, 1);
    a.deallocate(q, 0).unwrap();
    assert!(a.empty_cache() > 0);
    #[cfg(feature = "wgpu")]
    assert!(devalloc::wgpu::WgpuOptions::default().pool.caching);
    #[cfg(feature = "cuda")]
    assert!(devalloc::cuda::CudaOptions::default().pool.caching);
}

/// A type of one's own around a `PooledAllocator` is a `DeviceAllocator` through `Pooled`, and
/// a registry gives it back as that type (not as the built-in allocator of its device type).
struct MyHost(devalloc::backend::PooledAllocator<devalloc::backend::HostStorage>);

impl devalloc::backend::Pooled for MyHost {
    type Storage = devalloc::backend::HostStorage;
    fn pooled(&self) -> &devalloc::backend::PooledAllocator<devalloc::backend::HostStorage> {
        &self.0
    }
}

#[test]
fn the_registry_gives_back_concrete_types() {
    use devalloc::backend::{HostStorage, Pool, PooledAllocator};
    let r = DeviceAllocatorRegistry::new();
    let pool = Pool::new(HostStorage, PoolOptions::default()).unwrap();
    let mine = leak(MyHost(PooledAllocator::from_pools(DeviceType::Cpu, vec![pool]).unwrap()));
    r.register_allocator(mine).unwrap();
    assert!(r.get::<MyHost>(DeviceType::Cpu).is_some());
    assert!(r.get::<HostAllocator>(DeviceType::Cpu).is_none());
    let r2 = DeviceAllocatorRegistry::new();
    r2.register_allocator(leak(HostAllocator::new())).unwrap();
    assert!(r2.get::<HostAllocator>(DeviceType::Cpu).is_some());
    assert!(r2.get::<MyHost>(DeviceType::Cpu).is_none());
    let p = mine.allocate(10, 0, 256).unwrap();
    mine.deallocate(p, 0).unwrap();
}
