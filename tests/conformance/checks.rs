//! The checks of the conformance suite (see the parent module).
use devalloc::{DeviceAllocator, DeviceIndex, DevicePtr, Error, PointerProblem, DEFAULT_ALIGNMENT};

pub use super::in_place::fill_in_place;
pub use super::memory::{history_and_snapshot, repeating_sizes_far_apart, steady_state};
pub use super::streaming::streaming;
use super::*;

fn sizes() -> Vec<usize> {
    let mut s: Vec<usize> = (1..=67).collect();
    s.extend([127, 128, 129, 255, 256, 257, 1000, 4095, 4096, 4097]);
    if !cfg!(miri) {
        // Multi-MiB copies take minutes under Miri.
        s.extend([65_535, 65_537, (1 << 20) - 1, (1 << 20) + 3, (3 << 20) + 1]);
    }
    s
}

/// Round trips of every size from 1 byte to 3 MiB, odd ones included; 0 bytes is refused.
pub async fn round_trips(a: &'static dyn DeviceAllocator, i: DeviceIndex) {
    assert!(matches!(a.allocate(0, i, DEFAULT_ALIGNMENT), Err(Error::InvalidArgument { .. })));
    for (n, size) in sizes().into_iter().enumerate() {
        let ptr = a.allocate(size, i, DEFAULT_ALIGNMENT).unwrap_or_else(|e| panic!("allocate {size}: {e}"));
        assert!(!ptr.is_null());
        let data = pattern(size, n as u64 + 1);
        h2d(a, ptr, &data, i).await.unwrap_or_else(|e| panic!("upload {size}: {e}"));
        assert!(read(a, ptr, size, i).await == data, "round trip of {size} bytes differs");
        // 0-byte copies are fine anywhere, and do nothing.
        h2d(a, ptr, &[], i).await.unwrap();
        d2h(a, &mut [], ptr, i).await.unwrap();
        h2d(a, DevicePtr::NULL, &[], i).await.unwrap();
        a.deallocate(ptr, i).unwrap();
    }
}

/// Sub-range copies through offset pointers, at ragged offsets and lengths, touch nothing else.
pub async fn sub_ranges(a: &'static dyn DeviceAllocator, i: DeviceIndex) {
    let size = 4096 + 13;
    let base = a.allocate(size, i, DEFAULT_ALIGNMENT).unwrap();
    let mut model = pattern(size, 7);
    h2d(a, base, &model, i).await.unwrap();
    let mut seed = 100;
    for off in [0usize, 1, 2, 3, 4, 5, 7, 8, 9, 255, 256, 1001, 4096, size - 8] {
        for len in [1usize, 2, 3, 4, 5, 7, 8, 13, 100] {
            if off + len > size {
                continue;
            }
            seed += 1;
            let chunk = pattern(len, seed);
            h2d(a, base.offset(off).unwrap(), &chunk, i).await.unwrap();
            model[off..off + len].copy_from_slice(&chunk);
            assert_eq!(read(a, base.offset(off).unwrap(), len, i).await, chunk, "sub-range {off}+{len}");
        }
    }
    assert!(read(a, base, size, i).await == model, "a sub-range write touched bytes outside its range");
    // Ragged reads of the final contents.
    for (off, len) in [(1, 1), (3, 6), (5, 4091), (size - 1, 1), (2, size - 2)] {
        assert!(
            read(a, base.offset(off).unwrap(), len, i).await == model[off..off + len],
            "read {off}+{len}"
        );
    }
    a.deallocate(base, i).unwrap();
}

/// Every power-of-two alignment up to 64 KiB is honoured.
pub async fn alignment(a: &'static dyn DeviceAllocator, i: DeviceIndex) {
    let mut ptrs = Vec::new();
    for shift in 0..=16 {
        let align = 1usize << shift;
        for size in [1usize, 3, 1000] {
            let p =
                a.allocate(size, i, align).unwrap_or_else(|e| panic!("allocate {size} aligned {align}: {e}"));
            assert_eq!(p.addr() % align as u64, 0, "{p} is not aligned to {align}");
            let data = pattern(size, (shift * 10 + size) as u64);
            h2d(a, p, &data, i).await.unwrap();
            ptrs.push((p, data));
        }
    }
    for (p, data) in &ptrs {
        assert!(read(a, *p, data.len(), i).await == *data, "an aligned allocation lost its contents");
    }
    for (p, _) in ptrs {
        a.deallocate(p, i).unwrap();
    }
}

/// Stats follow allocations and frees.
pub async fn stats(a: &'static dyn DeviceAllocator, i: DeviceIndex) {
    let s0 = a.stats(i).unwrap();
    let sizes = [100usize, 4096, 12345];
    let ptrs: Vec<_> = sizes.iter().map(|&s| a.allocate(s, i, DEFAULT_ALIGNMENT).unwrap()).collect();
    let s1 = a.stats(i).unwrap();
    let total: u64 = sizes.iter().map(|&s| s as u64).sum();
    assert_eq!(s1.live_allocations, s0.live_allocations + 3);
    assert_eq!(s1.allocated_bytes, s0.allocated_bytes + total);
    assert!(s1.peak_allocated_bytes >= s1.allocated_bytes);
    assert!(
        s1.reserved_bytes >= s1.allocated_bytes,
        "reserved {} < allocated {}",
        s1.reserved_bytes,
        s1.allocated_bytes
    );
    assert!(s1.peak_reserved_bytes >= s1.reserved_bytes);
    assert_eq!(s1.allocations, s0.allocations + 3);
    assert_eq!(s1.cache_hits + s1.cache_misses, s0.cache_hits + s0.cache_misses + 3);
    a.deallocate(ptrs[1], i).unwrap();
    let s2 = a.stats(i).unwrap();
    assert_eq!(s2.allocated_bytes, s1.allocated_bytes - 4096);
    assert_eq!(s2.peak_allocated_bytes, s1.peak_allocated_bytes);
    assert_eq!(s2.deallocations, s1.deallocations + 1);
    // A failed call changes nothing.
    let e = a.deallocate(ptrs[1], i).unwrap_err();
    assert!(
        matches!(e, Error::InvalidPointer { problem: PointerProblem::Freed | PointerProblem::Unknown, .. }),
        "double free: {e}"
    );
    let e = a.allocate(0, i, DEFAULT_ALIGNMENT).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "0 bytes: {e}");
    let e = a.allocate(usize::MAX / 2, i, DEFAULT_ALIGNMENT).unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. } | Error::InvalidArgument { .. }), "usize::MAX / 2 bytes: {e}");
    let s3 = a.stats(i).unwrap();
    assert_eq!(s3, s2, "a failed call changed the stats");
    a.deallocate(ptrs[0], i).unwrap();
    a.deallocate(ptrs[2], i).unwrap();
    let s4 = a.stats(i).unwrap();
    assert_eq!(s4.allocated_bytes, s0.allocated_bytes);
    assert_eq!(s4.live_allocations, s0.live_allocations);
    assert!(s4.reserved_bytes >= s4.cached_bytes);
}

fn is_invalid_ptr(r: devalloc::Result<()>) -> bool {
    matches!(r, Err(Error::InvalidPointer { .. }))
}

/// Every bad input is a clear error, and the allocator and its other allocations survive it.
pub async fn bad_inputs(a: &'static dyn DeviceAllocator, i: DeviceIndex) {
    let keep_data = pattern(1000, 42);
    let keep = a.allocate(1000, i, DEFAULT_ALIGNMENT).unwrap();
    h2d(a, keep, &keep_data, i).await.unwrap();

    // Sizes and alignments.
    assert!(matches!(a.allocate(0, i, DEFAULT_ALIGNMENT), Err(Error::InvalidArgument { .. })));
    let e = a.allocate(usize::MAX - 10, i, 4096).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "overflowing rounding: {e}");
    for bad in [0usize, 3, 24, 1000] {
        let e = a.allocate(64, i, bad).unwrap_err();
        assert!(e.to_string().contains("power of two"), "alignment {bad}: {e}");
    }
    let e = a.allocate(usize::MAX / 2, i, DEFAULT_ALIGNMENT).unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "half the address space can never fit: {e}");

    // Out-of-bounds copies, also through offset pointers; the data stay as they were.
    let p = a.allocate(100, i, DEFAULT_ALIGNMENT).unwrap();
    let before = pattern(100, 9);
    h2d(a, p, &before, i).await.unwrap();
    let e = h2d(a, p, &[1u8; 101], i).await.unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    let e = h2d(a, p.offset(98).unwrap(), &[1u8; 3], i).await.unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    let mut big = vec![0u8; 5];
    let e = d2h(a, &mut big, p.offset(96).unwrap(), i).await.unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    assert_eq!(read(a, p, 100, i).await, before, "a refused copy changed the data");
    assert_eq!(read(a, p.offset(96).unwrap(), 4, i).await, &before[96..]);

    // Unknown, freed and double-freed pointers.
    let e = h2d(a, DevicePtr::new(0x1234), &[1], i).await.unwrap_err();
    assert!(matches!(e, Error::InvalidPointer { .. }), "unknown pointer: {e}");
    assert!(is_invalid_ptr(a.deallocate(DevicePtr::new(0x1234), i)));
    assert!(is_invalid_ptr(a.deallocate(DevicePtr::NULL, i)));
    assert!(is_invalid_ptr(a.deallocate(p.offset(4).unwrap(), i)), "freeing an interior pointer");
    a.deallocate(p, i).unwrap();
    assert!(is_invalid_ptr(a.deallocate(p, i)), "double free");
    assert!(is_invalid_ptr(h2d(a, p, &[1], i).await), "write after free");
    let mut one = [0u8];
    assert!(is_invalid_ptr(d2h(a, &mut one, p, i).await), "read after free");

    // Wrong device index.
    let n = a.device_count() as DeviceIndex;
    assert!(matches!(a.allocate(8, n, DEFAULT_ALIGNMENT), Err(Error::NoSuchDevice { .. })));
    assert!(matches!(a.deallocate(keep, n), Err(Error::NoSuchDevice { .. })));
    assert!(matches!(a.copy_host_to_device(keep, &[1], n), Err(Error::NoSuchDevice { .. })));
    assert!(matches!(a.copy_device_to_host(&mut one, keep, n), Err(Error::NoSuchDevice { .. })));
    assert!(matches!(a.stats(n), Err(Error::NoSuchDevice { .. })));

    // A pointer of another device of the same allocator.
    if let Some(other) = other_device(a, i, "bad_inputs: a pointer of another device") {
        let q = a.allocate(16, other, DEFAULT_ALIGNMENT).unwrap();
        assert!(is_invalid_ptr(h2d(a, q, &[1], i).await), "pointer of device {other} used on {i}");
        assert!(is_invalid_ptr(a.deallocate(q, i)));
        a.deallocate(q, other).unwrap();
    }

    // Planned memory: unknown id, out-of-bounds offsets.
    assert!(matches!(a.get_offset_address(77, 0, 1, i), Err(Error::NotFound { .. })));
    a.init_buffer(77, 128, i).unwrap();
    assert!(matches!(a.get_offset_address(77, 100, 29, i), Err(Error::OutOfBounds { .. })));
    assert!(matches!(a.get_offset_address(77, usize::MAX, 2, i), Err(Error::OutOfBounds { .. })));
    a.release_buffers(i).unwrap();

    // The allocator still works, and the kept allocation is intact.
    assert_eq!(read(a, keep, 1000, i).await, keep_data, "an error disturbed another allocation");
    let q = a.allocate(64, i, DEFAULT_ALIGNMENT).unwrap();
    h2d(a, q, &[5u8; 64], i).await.unwrap();
    assert_eq!(read(a, q, 64, i).await, vec![5u8; 64]);
    a.deallocate(q, i).unwrap();
    a.deallocate(keep, i).unwrap();
}

/// Memory-planned pools: init, offset addresses, copies through them, release.
pub async fn planned(a: &'static dyn DeviceAllocator, i: DeviceIndex) {
    let b0 = a.init_buffer(0, 4096, i).unwrap();
    let b1 = a.init_buffer(1, 1000, i).unwrap();
    assert!(a.init_buffer(1, 10, i).unwrap_err().to_string().contains("already initialised"));
    let t = a.get_offset_address(0, 1024, 512, i).unwrap();
    assert_eq!(t.offset_from(b0), Some(1024));
    let data = pattern(512, 3);
    h2d(a, t, &data, i).await.unwrap();
    assert_eq!(read(a, b0.offset(1024).unwrap(), 512, i).await, data);
    let end = a.get_offset_address(1, 1000, 0, i).unwrap();
    assert_eq!(end.offset_from(b1), Some(1000));
    assert!(matches!(a.get_offset_address(1, 999, 2, i), Err(Error::OutOfBounds { .. })));
    a.release_buffers(i).unwrap();
    assert!(matches!(a.get_offset_address(0, 0, 1, i), Err(Error::NotFound { .. })));
    assert!(is_invalid_ptr(h2d(a, t, &[1], i).await), "a released planned pool is still usable");
    // The plan can be loaded again.
    a.init_buffer(0, 64, i).unwrap();
    a.release_buffers(i).unwrap();
}

/// Device-to-device copies: between allocations, within one (overlapping), across devices.
pub async fn device_to_device(a: &'static dyn DeviceAllocator, i: DeviceIndex) {
    let n = 10_000;
    let src = a.allocate(n, i, DEFAULT_ALIGNMENT).unwrap();
    let dst = a.allocate(n, i, DEFAULT_ALIGNMENT).unwrap();
    let data = pattern(n, 11);
    h2d(a, src, &data, i).await.unwrap();
    h2d(a, dst, &vec![0u8; n], i).await.unwrap();
    d2d(a, dst, i, src, i, n).await.unwrap();
    assert!(read(a, dst, n, i).await == data);
    // Ragged sub-range.
    d2d(a, dst.offset(3).unwrap(), i, src.offset(101).unwrap(), i, 777).await.unwrap();
    let mut model = data.clone();
    model[3..780].copy_from_slice(&data[101..878]);
    assert!(read(a, dst, n, i).await == model, "ragged d2d");
    // Overlapping, within one allocation: as if through a temporary.
    d2d(a, src.offset(10).unwrap(), i, src, i, 5000).await.unwrap();
    let mut m2 = data.clone();
    m2.copy_within(0..5000, 10);
    assert!(read(a, src, n, i).await == m2, "overlapping d2d");
    // Overlapping, ragged and longer than a host bounce chunk (4 MiB), both ways: as memmove.
    let big = if cfg!(miri) { 20_000 } else { 9 << 20 };
    let b = a.allocate(big, i, DEFAULT_ALIGNMENT).unwrap();
    let mut model = pattern(big, 12);
    h2d(a, b, &model, i).await.unwrap();
    let len = big - 4099;
    for (from, to) in [(1usize, 4098usize), (4097, 2)] {
        d2d(a, b.offset(to).unwrap(), i, b.offset(from).unwrap(), i, len).await.unwrap();
        model.copy_within(from..from + len, to);
        assert!(read(a, b, big, i).await == model, "overlapping ragged d2d of {len} bytes, {from} -> {to}");
    }
    a.deallocate(b, i).unwrap();
    // Out of bounds and 0 bytes.
    let e = d2d(a, dst.offset(n - 4).unwrap(), i, src, i, 5).await.unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    d2d(a, DevicePtr::NULL, i, DevicePtr::NULL, i, 0).await.unwrap();
    // Across devices of this allocator.
    if let Some(j) = other_device(a, i, "device_to_device: across devices") {
        let far = a.allocate(n, j, DEFAULT_ALIGNMENT).unwrap();
        d2d(a, far, j, src, i, n).await.unwrap();
        assert!(read(a, far, n, j).await == m2, "d2d across devices");
        a.deallocate(far, j).unwrap();
    }
    a.deallocate(src, i).unwrap();
    a.deallocate(dst, i).unwrap();
}

/// 8 threads allocate, write, copy, check and free at random; every buffer keeps its contents.
#[cfg(not(target_arch = "wasm32"))]
pub async fn threads(a: &'static dyn DeviceAllocator, i: DeviceIndex) {
    let before = a.stats(i).unwrap();
    std::thread::scope(|s| {
        for t in 0..if cfg!(miri) { 3 } else { 8u64 } {
            s.spawn(move || {
                let mut rng = Rng(0x5eed + t * 7919);
                let mut mine: Vec<(DevicePtr, Vec<u8>)> = Vec::new();
                for step in 0..if cfg!(miri) { 20 } else { 150 } {
                    match rng.below(5) {
                        0 | 1 if mine.len() < 12 => {
                            let big = rng.below(8) == 0;
                            let size = 1 + rng.below(if big && !cfg!(miri) { 1 << 20 } else { 5000 });
                            let p = a.allocate(size, i, 1 << rng.below(10)).unwrap();
                            let data = pattern(size, t * 1000 + step);
                            a.copy_host_to_device(p, &data, i).unwrap();
                            mine.push((p, data));
                        }
                        2 if !mine.is_empty() => {
                            let (p, data) = mine.swap_remove(rng.below(mine.len()));
                            let mut back = vec![0u8; data.len()];
                            a.copy_device_to_host(&mut back, p, i).unwrap();
                            assert!(back == data, "thread {t}: contents changed before free");
                            a.deallocate(p, i).unwrap();
                        }
                        3 if mine.len() >= 2 => {
                            let (x, y) = (rng.below(mine.len()), rng.below(mine.len()));
                            if x != y {
                                let n = mine[x].1.len().min(mine[y].1.len());
                                a.copy_device_to_device(mine[y].0, i, mine[x].0, i, n).unwrap();
                                let src = mine[x].1[..n].to_vec();
                                mine[y].1[..n].copy_from_slice(&src);
                            }
                        }
                        _ if !mine.is_empty() => {
                            let k = rng.below(mine.len());
                            let (p, data) = &mine[k];
                            let off = rng.below(data.len());
                            let len = 1 + rng.below(data.len() - off);
                            let mut back = vec![0u8; len];
                            a.copy_device_to_host(&mut back, p.offset(off).unwrap(), i).unwrap();
                            assert!(back == data[off..off + len], "thread {t}: sub-range read differs");
                        }
                        _ => {}
                    }
                }
                for (p, data) in mine {
                    let mut back = vec![0u8; data.len()];
                    a.copy_device_to_host(&mut back, p, i).unwrap();
                    assert!(back == data, "thread {t}: contents changed");
                    a.deallocate(p, i).unwrap();
                }
            });
        }
    });
    let after = a.stats(i).unwrap();
    assert_eq!(after.live_allocations, before.live_allocations);
    assert_eq!(after.allocated_bytes, before.allocated_bytes);
}

/// A `DeviceMemoryBuffer` over the allocator frees exactly once and round-trips typed data.
pub async fn raii_buffer(a: &'static dyn DeviceAllocator, i: DeviceIndex) {
    use devalloc::DeviceMemoryBuffer;
    let live0 = a.stats(i).unwrap().live_allocations;
    {
        let mut buf = DeviceMemoryBuffer::create_on(a, 4 * 1000, i, DEFAULT_ALIGNMENT).unwrap();
        let values: Vec<f32> = (0..1000).map(|v| v as f32 * 0.5).collect();
        buf.write_pod(&values).unwrap();
        assert_eq!(buf.to_vec_async::<f32>().await.unwrap(), values);
        let e = buf.to_vec_async::<[u8; 3]>().await.unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "4000 bytes are not whole 3-byte values: {e}");
        assert_eq!(a.stats(i).unwrap().live_allocations, live0 + 1);
        let moved = buf; // move-only: the moved-to value owns it
        assert_eq!(moved.size(), 4000);
    }
    assert_eq!(a.stats(i).unwrap().live_allocations, live0, "drop did not free exactly once");
    // Allocate-and-fill: the values are there; an empty slice is refused and allocates nothing.
    {
        let values: Vec<u32> = (0..777).map(|v| v * 3 + 1).collect();
        let buf = DeviceMemoryBuffer::from_pod_on_async(a, &values, i).await.unwrap();
        assert_eq!((buf.size(), buf.to_vec_async::<u32>().await.unwrap()), (777 * 4, values.clone()));
        #[cfg(not(target_arch = "wasm32"))]
        {
            let again = DeviceMemoryBuffer::from_pod_on(a, &values[..5], i).unwrap();
            assert_eq!(again.to_vec::<u32>().unwrap(), values[..5]);
        }
        let e = DeviceMemoryBuffer::from_pod_on_async::<u32>(a, &[], i).await.err().unwrap();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        assert_eq!(a.stats(i).unwrap().live_allocations, live0 + 1);
    }
    assert_eq!(a.stats(i).unwrap().live_allocations, live0, "drop did not free exactly once");
}

/// A refused request changes nothing, stats included, and says the right thing: an impossible
/// size or alignment "can never fit" / "invalid", never "out of memory now".
pub async fn refusals_change_nothing(a: &'static dyn DeviceAllocator, i: DeviceIndex) {
    let keep = a.allocate(300, i, DEFAULT_ALIGNMENT).unwrap();
    let before = a.stats(i).unwrap();
    let huge = usize::try_from(1u64 << 62).unwrap_or(usize::MAX / 4 * 3);
    for (size, align) in [(huge, 256usize), (usize::MAX / 2, 256), (usize::MAX, 1)] {
        let e = a.allocate(size, i, align).unwrap_err();
        assert!(matches!(e, Error::TooLarge { .. } | Error::InvalidArgument { .. }), "{size} bytes: {e}");
    }
    if let Ok(align) = usize::try_from(1u64 << 62) {
        let e = a.allocate(8, i, align).unwrap_err();
        assert!(matches!(e, Error::TooLarge { .. } | Error::InvalidArgument { .. }), "alignment 2^62: {e}");
        assert!(!matches!(e, Error::OutOfMemory { .. }));
    }
    for bad in [0usize, 3, 12] {
        let e = a.allocate(8, i, bad).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "alignment {bad}: {e}");
    }
    let e = a.allocate(0, i, DEFAULT_ALIGNMENT).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "0 bytes: {e}");
    let e = a.deallocate(keep.offset(1).unwrap(), i).unwrap_err();
    assert!(
        matches!(e, Error::InvalidPointer { problem: PointerProblem::NotAllocationStart, .. }),
        "an interior pointer: {e}"
    );
    let e = a.copy_host_to_device(keep, &[0u8; 301], i).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "301 bytes into 300: {e}");
    assert_eq!(a.stats(i).unwrap(), before, "a refused call changed the stats");
    a.deallocate(keep, i).unwrap();
}

/// `release_buffers` frees every planned buffer even when freeing one fails (here: the caller
/// freed it behind the plan's back), and reports that failure.
pub async fn planned_release_frees_all_after_a_failure(a: &'static dyn DeviceAllocator, i: DeviceIndex) {
    let live0 = a.stats(i).unwrap().live_allocations;
    let bases: Vec<DevicePtr> = (0..4).map(|id| a.init_buffer(id, 1000 + id as usize, i).unwrap()).collect();
    a.deallocate(bases[1], i).unwrap();
    let e = a.release_buffers(i).unwrap_err();
    // `Freed` where the backend's addresses come from devalloc's window (a freed range is
    // remembered); `Unknown` where they are the driver's own (CUDA may reuse the address).
    assert!(
        matches!(e, Error::InvalidPointer { problem: PointerProblem::Freed | PointerProblem::Unknown, .. }),
        "{e}"
    );
    assert_eq!(
        a.stats(i).unwrap().live_allocations,
        live0,
        "release_buffers leaked the other planned buffers"
    );
    for (id, b) in bases.iter().enumerate() {
        let e = a.deallocate(*b, i).unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidPointer { problem: PointerProblem::Freed | PointerProblem::Unknown, .. }
            ),
            "planned buffer {id} is still live, or refused for another reason: {e}"
        );
    }
    a.init_buffer(0, 64, i).unwrap();
    a.release_buffers(i).unwrap();
}

/// A pointer of another device is refused as that device's, as destination and as source of a
/// device-to-device copy; `check_range` agrees with what a copy would say.
pub async fn foreign_pointers_on_either_end(a: &'static dyn DeviceAllocator, i: DeviceIndex) {
    let mine = a.allocate(64, i, DEFAULT_ALIGNMENT).unwrap();
    a.check_range(mine, 64, i).unwrap();
    a.check_range(mine.offset(63).unwrap(), 1, i).unwrap();
    assert!(matches!(a.check_range(mine, 65, i), Err(Error::OutOfBounds { .. })));
    a.check_range(DevicePtr::NULL, 0, i).unwrap();
    if let Some(j) = other_device(a, i, "foreign_pointers_on_either_end: another device's pointer") {
        let theirs = a.allocate(64, j, DEFAULT_ALIGNMENT).unwrap();
        let other = |r: devalloc::Result<()>| {
            matches!(r, Err(Error::InvalidPointer { problem: PointerProblem::OtherDevice(_), .. }))
        };
        assert!(other(d2d(a, mine, i, theirs, i, 8).await), "foreign source");
        assert!(other(d2d(a, theirs, i, mine, i, 8).await), "foreign destination");
        assert!(other(a.check_range(theirs, 8, i)));
        a.deallocate(theirs, j).unwrap();
    }
    a.deallocate(mine, i).unwrap();
}
