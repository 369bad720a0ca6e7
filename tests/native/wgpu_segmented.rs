//! Allocations past one buffer (issue 40): with `WgpuOptions::max_buffer_size` lowered, every
//! allocation of the conformance suite and the model check past it is several buffers, on
//! Vulkan (staged and direct) and GL; and the hostile cases of the seams themselves.
//!
//! Segments of 1 KiB on the direct route and in the seams' own tests; 64 KiB for the staged
//! suites, where each piece of a ragged copy is a staged round trip (the suite's 9 MiB ragged
//! copies took 41 s on 1 KiB segments, and real segments are 128 MiB and more).

use crate::conformance;
use crate::wgpu::vulkan;

use devalloc::wgpu::{Bind, BindTarget, Route, WgpuAllocator, WgpuOptions};
use devalloc::{DeviceAllocator, Error, PointerProblem};

/// 1 KiB buffers, 4 KiB staging chunks.
fn segmented(route: Option<Route>) -> WgpuOptions {
    sized(route, 1024)
}

/// Buffers of at most `max` bytes, 4 KiB staging chunks.
fn sized(route: Option<Route>, max: u64) -> WgpuOptions {
    WgpuOptions { max_buffer_size: Some(max), staging_chunk: Some(4096), route, ..WgpuOptions::default() }
}

fn open(backend: wgpu::Backend, options: WgpuOptions) -> conformance::Made {
    conformance::ready(WgpuAllocator::with_options(backend, options))
}

fn vulkan_staged() -> conformance::Made {
    open(wgpu::Backend::Vulkan, sized(Some(Route::Staged), 64 << 10))
}

fn vulkan_direct() -> conformance::Made {
    open(wgpu::Backend::Vulkan, segmented(None))
}

fn gl() -> conformance::Made {
    open(wgpu::Backend::Gl, sized(None, 64 << 10))
}

mod segmented_vulkan_staged {
    use super::*;
    conformance_tests!(vulkan_staged, conformance::Need::InCi, conformance::Caching::On);

    #[test]
    fn model_check() {
        conformance::model::model_check(vulkan_staged, 8);
    }
}

mod segmented_vulkan_direct {
    use super::*;
    conformance_tests!(vulkan_direct, conformance::Need::InCi, conformance::Caching::On);

    #[test]
    fn model_check() {
        conformance::model::model_check(vulkan_direct, 8);
    }
}

mod segmented_gl {
    use super::*;
    conformance_tests!(gl, conformance::Need::InCi, conformance::Caching::On);
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed)).collect()
}

fn read(a: &WgpuAllocator, p: devalloc::DevicePtr, off: usize, n: usize) -> Vec<u8> {
    let mut back = vec![0u8; n];
    a.copy_device_to_host(&mut back, p.offset(off).unwrap(), 0).unwrap();
    back
}

/// Ranges that start, end on or straddle a seam, ragged and whole-word, in every direction, and
/// copies that overlap within one segmented allocation both ways: each against a CPU model.
#[test]
fn ranges_across_seams_match_a_cpu_model() {
    for route in [Route::Staged, Route::Direct] {
        let Some(a) = vulkan(segmented(Some(route))) else { return };
        let n = 5000;
        let (p, q) = (a.allocate(n, 0, 256).unwrap(), a.allocate(n, 0, 256).unwrap());
        let mut model = pattern(n, 1);
        a.copy_host_to_device(p, &model, 0).unwrap();
        for (off, len) in
            [(0, 1024), (1020, 8), (1023, 2), (1024, 1), (1000, 3000), (1, 4998), (2047, 1026), (4095, 905)]
        {
            let bytes = pattern(len, off as u8);
            a.copy_host_to_device(p.offset(off).unwrap(), &bytes, 0).unwrap();
            model[off..off + len].copy_from_slice(&bytes);
            assert!(read(&a, p, 0, n) == model, "{route:?}: write of {len} at {off}");
            assert!(read(&a, p, off, len) == bytes, "{route:?}: read of {len} at {off}");
        }
        // Device copies: to another allocation at a different phase, and within one, overlapping.
        a.copy_device_to_device(q.offset(3).unwrap(), 0, p.offset(1021).unwrap(), 0, 2500).unwrap();
        assert!(read(&a, q, 3, 2500) == model[1021..3521], "{route:?}: copy between allocations");
        for (from, to, len) in [(100, 1100, 3000), (2100, 96, 2800), (8, 12, 4000), (1030, 1023, 3900)] {
            a.copy_device_to_device(p.offset(to).unwrap(), 0, p.offset(from).unwrap(), 0, len).unwrap();
            model.copy_within(from..from + len, to);
            assert!(read(&a, p, 0, n) == model, "{route:?}: overlapping copy of {len} from {from} to {to}");
        }
        a.deallocate(p, 0).unwrap();
        a.deallocate(q, 0).unwrap();
    }
}

/// Each segment is its own buffer: `segments` lists them in order, `buffer_range` serves a
/// range within one and refuses one across a seam, and an app's own buffer copies both ways
/// across the seams. What the pool holds is the allocation's capacity, not a multiple of it.
#[test]
fn segments_are_listed_bound_and_not_doubled() {
    let Some(a) = vulkan(segmented(Some(Route::Staged))) else { return };
    let before = a.stats(0).unwrap().reserved_bytes;
    let p = a.allocate(3000, 0, 256).unwrap();
    let held = a.stats(0).unwrap().reserved_bytes - before;
    assert!((3000..=3072).contains(&held), "a 3000-byte segmented allocation holds {held} bytes");
    let parts = a.segments(p, 3000, 0).unwrap();
    let ranges: Vec<_> = parts.iter().map(|r| r.range.clone()).collect();
    assert_eq!(ranges, [0..1024, 0..1024, 0..952], "{parts:?}");
    assert!(parts[0].buffer != parts[1].buffer && parts[1].buffer != parts[2].buffer);
    let inner = a.segments(p.offset(1100).unwrap(), 900, 0).unwrap();
    assert_eq!((inner.len(), inner[0].range.clone()), (1, 76..976), "{inner:?}");
    assert_eq!(a.buffer_range(p.offset(1024).unwrap(), 1024, 0).unwrap().range, 0..1024);
    let e = a.buffer_range(p.offset(1000).unwrap(), 100, 0).unwrap_err();
    assert!(e.to_string().contains("segments"), "{e}");
    assert!(a.buffer(p, 0).is_err(), "buffer() from the start spans three buffers");
    // The snapshot lists the allocation once, with its three buffers; a one-buffer one with none.
    let small = a.allocate(100, 0, 256).unwrap();
    let snap = a.snapshot().unwrap();
    let live = &snap.devices[0].live;
    let (big, one) = (
        live.iter().find(|l| l.addr == p.addr()).unwrap(),
        live.iter().find(|l| l.addr == small.addr()).unwrap(),
    );
    let spans: Vec<(u64, u64)> = big.segments.iter().map(|s| (s.offset, s.size)).collect();
    assert_eq!(spans, [(0, 1024), (1024, 1024), (2048, big.capacity - 2048)], "{big:?}");
    assert!(one.segments.is_empty(), "{one:?}");
    let json = snap.to_json();
    assert!(json.contains(r#""segments":[{"offset":0,"size":1024},{"offset":1024,"#), "{json}");
    assert_eq!(devalloc::snapshot::Snapshot::from_json(&json).unwrap(), snap, "segments read back");
    a.deallocate(small, 0).unwrap();
    assert_eq!(a.buffer(p.offset(2100).unwrap(), 0).unwrap().range, 52..952);
    // An app buffer, both ways across the seams.
    let device = a.device(0).unwrap();
    let usage = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let app = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 4096,
        usage,
        mapped_at_creation: false,
    });
    let data = pattern(3000, 5);
    a.copy_host_to_device(p, &data, 0).unwrap();
    a.copy_to_buffer(p.offset(20).unwrap(), &app, 8, 2800, 0).unwrap();
    a.copy_from_buffer(p.offset(4).unwrap(), &app, 8, 2800, 0).unwrap();
    assert!(read(&a, p, 4, 2800) == data[20..2820], "through an app buffer and back");
    a.deallocate(p, 0).unwrap();
    let e = a.deallocate(p, 0).unwrap_err();
    assert!(matches!(e, Error::InvalidPointer { problem: PointerProblem::Freed, .. }), "double free: {e}");
}

/// A write whose second segment fails (the app destroyed that buffer, which it got from
/// `segments`) lands the first piece, writes nothing after, and says how far it got; the
/// allocation's first segment keeps its new bytes and the third its old ones.
#[test]
fn a_failure_on_the_second_segment_says_how_far_the_copy_got() {
    let Some(a) = vulkan(segmented(Some(Route::Staged))) else { return };
    let p = a.allocate(3072, 0, 256).unwrap();
    let old = pattern(3072, 2);
    a.copy_host_to_device(p, &old, 0).unwrap();
    let parts = a.segments(p, 3072, 0).unwrap();
    parts[1].buffer.destroy();
    let new = pattern(3072, 77);
    let e = a.copy_host_to_device(p, &new, 0).unwrap_err();
    let m = e.to_string();
    assert!(m.contains("1024 of 3072 bytes landed") && m.contains("piece 2"), "{m}");
    assert!(read(&a, p, 0, 1024) == new[..1024], "the first segment's piece landed");
    assert!(read(&a, p, 2048, 1024) == old[2048..], "nothing after the failed piece was written");
    a.deallocate(p, 0).unwrap();
    // The spoiled block is not handed out again: a fresh allocation works whole.
    let q = a.allocate(3072, 0, 256).unwrap();
    a.copy_host_to_device(q, &new, 0).unwrap();
    assert!(read(&a, q, 0, 3072) == new);
    a.deallocate(q, 0).unwrap();
}

/// Zeroed memory is zero in every segment, also on a reused block; a lost device with a
/// segmented allocation live fails its copies as lost and still frees it.
#[test]
fn zeroed_segments_and_a_lost_device() {
    let Some(a) = vulkan(segmented(Some(Route::Staged))) else { return };
    let p = a.allocate(4000, 0, 256).unwrap();
    a.copy_host_to_device(p, &[9u8; 4000], 0).unwrap();
    a.deallocate(p, 0).unwrap();
    let z = a.allocate_zeroed(4000, 0, 256).unwrap();
    assert_eq!(a.stats(0).unwrap().cache_hits, 1, "the freed block was reused");
    assert!(read(&a, z, 0, 4000).iter().all(|&b| b == 0), "a reused segmented block reads as zeros");
    a.device(0).unwrap().destroy();
    let e = a.copy_host_to_device(z, &[1u8; 4000], 0).unwrap_err();
    assert!(matches!(e, Error::DeviceLost { .. }), "{e}");
    a.deallocate(z, 0).unwrap();
}

/// Past what segments serve is `TooLarge`, naming the limit; a setting under a segment's least
/// size is refused before a device is opened.
#[test]
fn limits_of_segmented_memory() {
    let Some(a) = vulkan(segmented(Some(Route::Staged))) else { return };
    let max = a.max_allocation(0).unwrap();
    assert_eq!(max, 1024 << 16, "1 KiB segments, at most 65536 of them");
    let e = a.allocate(max as usize + 1, 0, 256).unwrap_err();
    assert!(matches!(e, Error::TooLarge { max: m, .. } if m == max), "{e}");
    let e = WgpuAllocator::with_options(
        wgpu::Backend::Vulkan,
        WgpuOptions { max_buffer_size: Some(100), ..WgpuOptions::default() },
    )
    .err()
    .expect("a 100-byte buffer limit");
    assert!(e.to_string().contains("max_buffer_size"), "{e}");
}

/// A segmented bind fills its slots from the range's parts: more parts than slots, a
/// `read_write` bind with fewer, a plain bind across a seam and slots past the last binding
/// number are errors that say what to do; a `read` bind with fewer parts repeats its last.
#[test]
fn segmented_binds_fill_their_slots_or_say_why_not() {
    let Some(a) = vulkan(segmented(Some(Route::Staged))) else { return };
    let p = a.allocate(3000, 0, 256).unwrap();
    let b = a.bindings(&[Bind::read(2, BindTarget::segments(p, 3000, 5))], 0).unwrap();
    let got: Vec<_> = b.entries().iter().map(|e| e.binding).collect();
    assert_eq!(got, [2, 3, 4, 5, 6], "five slots from binding 2");
    for (bind, says) in [
        (Bind::read(0, BindTarget::segments(p, 3000, 2)), "declare 3"),
        (Bind::read_write(0, BindTarget::segments(p, 3000, 4)), "exactly one slot per part"),
        (Bind::read(0, BindTarget::segments(p, 3000, 0)), "0 slot"),
        (Bind::read(u32::MAX - 1, BindTarget::segments(p, 3000, 3)), "run past binding"),
        (Bind::read(0, (p, 3000)), "segments"),
    ] {
        let e = a.bindings(&[bind], 0).unwrap_err();
        assert!(e.to_string().contains(says), "{says:?}: {e}");
    }
    let q = a.allocate(500, 0, 256).unwrap();
    let e = a.bindings(&[Bind::read(0, BindTarget::segments(p, 3000, 3)), Bind::read(2, q)], 0).unwrap_err();
    assert!(e.to_string().contains("twice"), "{e}");
    a.deallocate(p, 0).unwrap();
    a.deallocate(q, 0).unwrap();
}

/// An app that opens its own device with lowered limits (4 MiB per buffer, 2 MiB per binding)
/// and adopts it: devalloc reads the device's own limits, a 10 MiB allocation works through the
/// plain contract with every copy across the seams, and its parts bind within 2 MiB each.
#[test]
fn an_adopted_device_with_lowered_limits_is_segmented_by_its_own_limits() {
    for backend in [wgpu::Backend::Vulkan, wgpu::Backend::Gl] {
        conformance::logging::init_for_tests();
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = backend.into();
        let instance = wgpu::Instance::new(desc);
        let adapter = match pollster::block_on(instance.request_adapter(&Default::default())) {
            Ok(a) => a,
            Err(e) if conformance::in_ci() => panic!("no {backend:?} adapter under CI: {e}"),
            Err(e) => return conformance::skip("an adopted segmented device", &e.to_string()),
        };
        let limits = wgpu::Limits {
            max_buffer_size: 4 << 20,
            max_storage_buffer_binding_size: 2 << 20,
            ..adapter.limits()
        };
        let desc = wgpu::DeviceDescriptor { required_limits: limits, ..Default::default() };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc)).unwrap();
        let a = WgpuAllocator::from_device(device, queue).unwrap();
        let n = 10 << 20;
        let (p, q) = (a.allocate(n, 0, 256).unwrap(), a.allocate(n, 0, 256).unwrap());
        let data = pattern(n, 3);
        a.copy_host_to_device(p, &data, 0).unwrap();
        a.copy_device_to_device(q, 0, p, 0, n).unwrap();
        assert!(read(&a, q, 0, n) == data, "{backend:?}: 10 MiB across 4 MiB buffers");
        let parts = a.segments(p, n as u64, 0).unwrap();
        let sizes: Vec<u64> = parts.iter().map(|r| r.len()).collect();
        assert_eq!(sizes, [2 << 20; 5], "{backend:?}: three buffers (4, 4, 2 MiB), bound in 2 MiB parts");
        a.deallocate(p, 0).unwrap();
        a.deallocate(q, 0).unwrap();
    }
}

/// A plan laid out with the allocator's segment size keeps each tensor within one buffer unless
/// it is larger than one, so that each binds on its own; without it, one would straddle.
#[test]
fn a_plan_laid_out_by_segments_binds_every_tensor_that_fits_one_buffer() {
    let Some(a) = vulkan(segmented(Some(Route::Staged))) else { return };
    let (align, seg) = (a.binding_alignment(0).unwrap(), a.segment_size(0).unwrap() as usize);
    assert_eq!(seg, 1024);
    let sizes = [700usize, 600, 1024, 100, 2500, 8];
    let mut layout = devalloc::PlanLayout::with_segments(align, seg).unwrap();
    let offsets: Vec<usize> = sizes.iter().map(|&n| layout.place(n).unwrap()).collect();
    let p = a.allocate(layout.size(), 0, 256).unwrap();
    for (&off, &n) in offsets.iter().zip(&sizes) {
        let at = p.offset(off).unwrap();
        let parts = a.segments(at, n as u64, 0).unwrap().len();
        assert_eq!(parts, n.div_ceil(seg), "{n} bytes at {off}: {parts} buffers");
        if n <= seg {
            a.buffer_range(at, n as u64, 0).unwrap();
        }
    }
    a.deallocate(p, 0).unwrap();
    let mut plain = devalloc::PlanLayout::new(align).unwrap();
    let (first, second) = (plain.place(700).unwrap(), plain.place(600).unwrap());
    assert!(first / seg != (second + 599) / seg, "without segments the second tensor straddles");
    assert!(devalloc::PlanLayout::with_segments(256, 1000).is_err());
    // The planner's own plans, laid out by the allocator's segments: the same for tensors with
    // lifetimes, each in one buffer unless larger than one (then from a seam).
    let t = |size, first, last| devalloc::plan::TensorLife { size, first, last };
    let tensors =
        [t(700, 0, 2), t(600, 1, 3), t(1024, 2, 4), t(100, 0, 5), t(2500, 3, 5), t(8, 4, 5), t(900, 5, 6)];
    let free = devalloc::plan::plan(&tensors, align as u64, devalloc::plan::Strategy::Fast).unwrap();
    assert!(devalloc::plan::check_segments(&tensors, free.offsets(), seg as u64).is_err(), "one straddles");
    let planned =
        devalloc::plan::plan_segmented(&tensors, align as u64, seg as u64, devalloc::plan::Strategy::Fast)
            .unwrap();
    let memory = devalloc::PlannedMemory::from_plan(&a, &planned, 0).unwrap();
    for (i, x) in tensors.iter().enumerate() {
        let tensor = memory.tensor(i).unwrap();
        assert_eq!(
            a.segments(tensor.ptr, x.size, 0).unwrap().len() as u64,
            x.size.div_ceil(seg as u64),
            "{i}"
        );
        if x.size <= seg as u64 {
            a.buffer_range(tensor.ptr, x.size, 0).unwrap();
        }
    }
}
