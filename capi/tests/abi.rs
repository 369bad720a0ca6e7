//! The C ABI called as C calls it, on host memory, by a hostile caller: null, foreign,
//! interior and freed pointers, bad device types and indices, huge sizes, double frees, a
//! panic behind the boundary. Every refusal must leave the stats as they were. Runs under
//! Miri too (`cargo +nightly miri test -p devalloc-capi --no-default-features`).
#![allow(unsafe_code)] // calls the extern "C" functions, which take raw pointers
#![allow(clippy::undocumented_unsafe_blocks)] // every pointer passed below is a live local

use std::ffi::CStr;
use std::sync::{Mutex, MutexGuard};

use devalloc_c::raw::{RawDeviceType, RawStatus};
use devalloc_c::*;

const CPU: RawDeviceType = RawDeviceType(DevallocDeviceType::Cpu as i32);
const OK: DevallocStatus = DevallocStatus::Ok;

/// The tests share the process's CPU allocator: each takes this lock, so stats stay theirs.
fn cpu() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(devalloc_open(CPU), OK);
    guard
}

fn last_error() -> String {
    unsafe { CStr::from_ptr(devalloc_last_error()) }.to_string_lossy().into_owned()
}

fn stats() -> DevallocStats {
    let mut s = DevallocStats::default();
    assert_eq!(unsafe { devalloc_stats(CPU, 0, &mut s) }, OK);
    s
}

fn alloc(nbytes: usize) -> u64 {
    let mut p = 0;
    assert_eq!(unsafe { devalloc_allocate(CPU, 0, nbytes, 256, &mut p) }, OK, "{}", last_error());
    assert_ne!(p, 0);
    p
}

/// `status`, and that it left the stats as `before` (but for nothing at all).
fn refused(status: DevallocStatus, want: DevallocStatus, before: DevallocStats, what: &str) {
    assert_eq!(status, want, "{what}: {}", last_error());
    assert!(!last_error().is_empty(), "{what}: no message");
    assert_eq!(stats(), before, "{what} changed the stats");
}

#[test]
fn round_trips_through_interior_pointers() {
    let _cpu = cpu();
    let before = stats();
    let p = alloc(1000);
    let data: Vec<u8> = (0..200).map(|i| i as u8).collect();
    assert_eq!(unsafe { devalloc_copy_host_to_device(CPU, 0, p + 100, data.as_ptr().cast(), 200) }, OK);
    let mut back = vec![0u8; 200];
    assert_eq!(unsafe { devalloc_copy_device_to_host(CPU, 0, back.as_mut_ptr().cast(), p + 100, 200) }, OK);
    assert_eq!(back, data);
    // Device to device, between two allocations and inside one.
    let q = alloc(300);
    assert_eq!(devalloc_copy_device_to_device(CPU, 0, q + 50, CPU, 0, p + 150, 100), OK);
    let mut moved = vec![0u8; 100];
    assert_eq!(unsafe { devalloc_copy_device_to_host(CPU, 0, moved.as_mut_ptr().cast(), q + 50, 100) }, OK);
    assert_eq!(moved, data[50..150]);
    // Overlapping ranges of one allocation move as memmove does.
    assert_eq!(devalloc_copy_device_to_device(CPU, 0, p + 101, CPU, 0, p + 100, 200), OK);
    assert_eq!(unsafe { devalloc_copy_device_to_host(CPU, 0, back.as_mut_ptr().cast(), p + 101, 200) }, OK);
    assert_eq!(back, data);
    // To a type nobody opened: NOT_FOUND, and nothing moved.
    let vulkan = RawDeviceType::from(DevallocDeviceType::Vulkan);
    assert_eq!(devalloc_copy_device_to_device(vulkan, 0, 0x1000, CPU, 0, p, 8), DevallocStatus::NotFound);
    let after = stats();
    assert_eq!(after.allocations - before.allocations, 2);
    assert_eq!(after.allocated_bytes - before.allocated_bytes, 1300);
    assert_eq!(devalloc_deallocate(CPU, 0, p), OK);
    assert_eq!(devalloc_deallocate(CPU, 0, q), OK);
    assert_eq!(stats().allocated_bytes, before.allocated_bytes);
}

#[test]
fn bad_pointers_are_refused_and_change_nothing() {
    let _cpu = cpu();
    let p = alloc(512);
    let before = stats();
    let invalid = DevallocStatus::InvalidPointer;
    refused(devalloc_deallocate(CPU, 0, 0), invalid, before, "free(null)");
    refused(devalloc_deallocate(CPU, 0, 0x1234), invalid, before, "free(foreign)");
    refused(devalloc_deallocate(CPU, 0, p + 8), invalid, before, "free(interior)");
    refused(devalloc_deallocate(CPU, 0, u64::MAX), invalid, before, "free(u64::MAX)");
    let mut buf = [0u8; 16];
    let status = unsafe { devalloc_copy_device_to_host(CPU, 0, buf.as_mut_ptr().cast(), 0x1234, 16) };
    refused(status, invalid, before, "read(foreign)");
    let status = unsafe { devalloc_copy_host_to_device(CPU, 0, p + 500, buf.as_ptr().cast(), 16) };
    refused(status, DevallocStatus::OutOfBounds, before, "write past the end");
    let status = devalloc_copy_device_to_device(CPU, 0, p, CPU, 0, p + 256, 512);
    refused(status, DevallocStatus::OutOfBounds, before, "d2d past the end");
    // Freed: a double free, and a use after free.
    assert_eq!(devalloc_deallocate(CPU, 0, p), OK);
    let freed = stats();
    refused(devalloc_deallocate(CPU, 0, p), invalid, freed, "double free");
    assert!(last_error().contains("freed"), "{}", last_error());
    let status = unsafe { devalloc_copy_host_to_device(CPU, 0, p, buf.as_ptr().cast(), 16) };
    refused(status, invalid, freed, "write after free");
}

#[test]
fn bad_arguments_are_refused_and_change_nothing() {
    let _cpu = cpu();
    let p = alloc(64);
    let before = stats();
    let invalid = DevallocStatus::InvalidArgument;
    let mut out = 7u64;
    unsafe {
        refused(devalloc_allocate(CPU, 0, 0, 256, &mut out), invalid, before, "0 bytes");
        refused(devalloc_allocate(CPU, 0, 64, 3, &mut out), invalid, before, "alignment 3");
        refused(devalloc_allocate(CPU, 0, 64, 0, &mut out), invalid, before, "alignment 0");
        refused(devalloc_allocate(CPU, 0, 64, 256, std::ptr::null_mut()), invalid, before, "null out_ptr");
        let huge = devalloc_allocate(CPU, 0, usize::MAX, 256, &mut out);
        assert!(matches!(huge, DevallocStatus::TooLarge | DevallocStatus::InvalidArgument), "{huge:?}");
        refused(huge, huge, before, "usize::MAX bytes");
        refused(devalloc_allocate(CPU, 1, 64, 256, &mut out), DevallocStatus::NoSuchDevice, before, "cpu:1");
        refused(
            devalloc_allocate(CPU, u32::MAX, 64, 256, &mut out),
            DevallocStatus::NoSuchDevice,
            before,
            "cpu:max",
        );
        for junk in [-1, 7, 99, i32::MIN].map(RawDeviceType) {
            refused(devalloc_allocate(junk, 0, 64, 256, &mut out), invalid, before, "a junk device type");
            refused(devalloc_open(junk), invalid, before, "open(junk)");
        }
        for alignment in [1usize << 63, usize::MAX, 6] {
            let status = devalloc_allocate(CPU, 0, 64, alignment, &mut out);
            assert!(!matches!(status, OK | DevallocStatus::Internal), "alignment {alignment}: {status:?}");
            refused(status, status, before, "a huge or odd alignment");
        }
        assert_eq!(out, 7, "a failed allocation wrote its out-parameter");
        // Host buffers: null with bytes to move, more than a host buffer can hold.
        refused(devalloc_copy_host_to_device(CPU, 0, p, std::ptr::null(), 8), invalid, before, "null src");
        let null = std::ptr::null_mut();
        refused(devalloc_copy_device_to_host(CPU, 0, null, p, 8), invalid, before, "null dst");
        let mut b = [0u8; 8];
        let status = devalloc_copy_device_to_host(CPU, 0, b.as_mut_ptr().cast(), p, usize::MAX);
        refused(status, invalid, before, "usize::MAX bytes read");
        // 0 bytes: Ok without looking at either pointer.
        assert_eq!(devalloc_copy_host_to_device(CPU, 0, p, std::ptr::null(), 0), OK);
        assert_eq!(devalloc_copy_device_to_host(CPU, 0, null, 0, 0), OK);
        refused(devalloc_stats(CPU, 0, std::ptr::null_mut()), invalid, before, "null stats");
        refused(
            devalloc_stats(CPU, 3, &mut DevallocStats::default()),
            DevallocStatus::NoSuchDevice,
            before,
            "stats",
        );
        let label = c"x".as_ptr();
        refused(
            devalloc_allocate_labeled(CPU, 0, 8, 8, std::ptr::null(), &mut out),
            invalid,
            before,
            "label",
        );
        refused(devalloc_allocate_labeled(CPU, 0, 8, 8, label, std::ptr::null_mut()), invalid, before, "out");
        refused(devalloc_snapshot_to_file(CPU, std::ptr::null()), invalid, before, "null path");
    }
    assert_eq!(devalloc_deallocate(CPU, 0, p), OK);
}

#[test]
fn a_memory_limit_refuses_and_lifts() {
    let _cpu = cpu();
    let before = stats();
    assert_eq!(unsafe { devalloc_empty_cache(CPU, std::ptr::null_mut()) }, OK);
    let held = stats().reserved_bytes;
    assert_eq!(devalloc_set_memory_limit(CPU, 0, held + 4096), OK);
    let mut p = 0;
    let status = unsafe { devalloc_allocate(CPU, 0, 1 << 20, 256, &mut p) };
    assert!(matches!(status, DevallocStatus::OutOfMemory | DevallocStatus::TooLarge), "{status:?}");
    assert!(last_error().contains("1048576"), "{}", last_error());
    assert_eq!(devalloc_set_memory_limit(CPU, 0, DEVALLOC_NO_LIMIT), OK);
    let p = alloc(1 << 20);
    assert_eq!(devalloc_deallocate(CPU, 0, p), OK);
    assert_eq!(devalloc_set_memory_limit(CPU, 2, 0), DevallocStatus::NoSuchDevice);
    // A limit of 0 bytes refuses everything, and lifts like any other.
    assert_eq!(devalloc_set_memory_limit(CPU, 0, 0), OK);
    let mut q = 0;
    let status = unsafe { devalloc_allocate(CPU, 0, 1, 1, &mut q) };
    assert!(matches!(status, DevallocStatus::OutOfMemory | DevallocStatus::TooLarge), "{status:?}");
    assert_eq!(devalloc_set_memory_limit(CPU, 0, DEVALLOC_NO_LIMIT), OK);
    assert_eq!(stats().allocated_bytes, before.allocated_bytes);
}

#[test]
fn a_panic_behind_the_boundary_is_an_error_code() {
    let _cpu = cpu();
    assert_eq!(devalloc_selftest_panic(), DevallocStatus::Internal);
    assert!(last_error().contains("on purpose"), "{}", last_error());
    // And the library still works afterwards.
    let p = alloc(16);
    assert_eq!(devalloc_deallocate(CPU, 0, p), OK);
}

#[test]
fn the_last_error_belongs_to_its_thread() {
    let _cpu = cpu();
    assert_eq!(devalloc_deallocate(CPU, 0, 0x99), DevallocStatus::InvalidPointer);
    let here = last_error();
    let there = std::thread::spawn(|| {
        let fresh = last_error();
        assert_eq!(devalloc_open(RawDeviceType(-5)), DevallocStatus::InvalidArgument);
        (fresh, last_error())
    })
    .join()
    .unwrap();
    assert_eq!(there.0, "", "a new thread starts with no error");
    assert!(there.1.contains("-5"), "{}", there.1);
    assert_eq!(last_error(), here, "another thread's failure changed this thread's message");
    // A success leaves the last failure's message in place (as errno).
    let p = alloc(8);
    assert_eq!(devalloc_deallocate(CPU, 0, p), OK);
    assert_eq!(last_error(), here);
}

#[test]
fn names_versions_counts_and_other_types() {
    let _cpu = cpu();
    let name =
        |s: i32| unsafe { CStr::from_ptr(devalloc_status_name(RawStatus(s))) }.to_str().unwrap().to_owned();
    assert_eq!(name(DevallocStatus::OutOfMemory as i32), "OUT_OF_MEMORY");
    assert_eq!(name(0), "OK");
    assert_eq!(name(-1), "UNKNOWN");
    assert_eq!(name(1000), "UNKNOWN");
    assert_eq!(unsafe { CStr::from_ptr(devalloc_version()) }.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    let mut count = 0;
    assert_eq!(unsafe { devalloc_device_count(CPU, &mut count) }, OK);
    assert_eq!(count, 1);
    assert_eq!(devalloc_open(RawDeviceType::from(DevallocDeviceType::Webgpu)), DevallocStatus::NotSupported);
    // Nothing opened WebGPU, so nothing can be asked of it.
    let mut out = 0;
    let webgpu = RawDeviceType::from(DevallocDeviceType::Webgpu);
    assert_eq!(unsafe { devalloc_allocate(webgpu, 0, 8, 8, &mut out) }, DevallocStatus::NotFound);
    assert!(last_error().contains("devalloc_open"), "{}", last_error());
    assert_eq!(devalloc_deallocate(webgpu, 0, 8), DevallocStatus::NotFound);
}

#[test]
#[cfg_attr(miri, ignore = "opens a driver library")]
fn cuda_opens_or_says_why_not() {
    let cuda = RawDeviceType::from(DevallocDeviceType::Cuda);
    match devalloc_open(cuda) {
        DevallocStatus::Ok => {
            let mut count = 0;
            assert_eq!(unsafe { devalloc_device_count(cuda, &mut count) }, OK);
            assert!(count >= 1);
        }
        DevallocStatus::NotFound => {
            let why = last_error();
            assert!(why.contains("cuda") || why.contains("CUDA"), "{why}");
            println!("cuda did not open here: {why}");
        }
        other => panic!("devalloc_open(cuda) = {other:?}: {}", last_error()),
    }
}

#[test]
#[cfg_attr(miri, ignore = "writes a file")]
fn a_snapshot_names_the_labeled_allocation() {
    let _cpu = cpu();
    assert_eq!(devalloc_record_history(CPU, 64), OK);
    let mut p = 0;
    let label = c"executorch weights".as_ptr();
    assert_eq!(unsafe { devalloc_allocate_labeled(CPU, 0, 4096, 64, label, &mut p) }, OK);
    let path = std::env::temp_dir().join(format!("devalloc-capi-{}.json", std::process::id()));
    let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { devalloc_snapshot_to_file(DevallocDeviceType::All.into(), c_path.as_ptr()) }, OK);
    let json = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(json.contains("executorch weights"), "the snapshot lacks the label");
    let missing = c"/nonexistent-dir/x.json".as_ptr();
    assert_eq!(unsafe { devalloc_snapshot_to_file(CPU, missing) }, DevallocStatus::Io);
    assert!(last_error().contains("nonexistent-dir"), "{}", last_error());
    assert_eq!(devalloc_deallocate(CPU, 0, p), OK);
    assert_eq!(devalloc_record_history(CPU, 0), OK);
}

/// `devalloc_host_pointer` on CPU: the host address of the bytes a copy reaches, at any address
/// inside the allocation, range-checked as a copy is; a failure writes nothing and changes
/// nothing.
#[test]
fn a_host_pointer_reaches_the_bytes_and_is_checked() {
    let _cpu = cpu();
    let p = alloc(256);
    let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
    assert_eq!(unsafe { devalloc_host_pointer(CPU, 0, p + 16, 32, &mut host) }, OK, "{}", last_error());
    assert!(!host.is_null());
    // Written through the pointer, read through a copy; and the other way.
    unsafe { std::ptr::copy_nonoverlapping(b"through the host pointer".as_ptr(), host.cast::<u8>(), 24) };
    let mut back = [0u8; 24];
    assert_eq!(unsafe { devalloc_copy_device_to_host(CPU, 0, back.as_mut_ptr().cast(), p + 16, 24) }, OK);
    assert_eq!(&back, b"through the host pointer");
    assert_eq!(unsafe { devalloc_copy_host_to_device(CPU, 0, p + 20, b"ABCD".as_ptr().cast(), 4) }, OK);
    let seen = unsafe { std::slice::from_raw_parts(host.cast::<u8>().add(4), 4) };
    assert_eq!(seen, b"ABCD");
    // Its own bytes as the host side of a copy of them: refused, nothing moves; apart, they go.
    let before = stats();
    let status = unsafe { devalloc_copy_host_to_device(CPU, 0, p + 16, host, 24) };
    refused(status, DevallocStatus::InvalidArgument, before, "a host buffer that is the destination");
    assert!(last_error().contains("own memory"), "{}", last_error());
    let status = unsafe { devalloc_copy_device_to_host(CPU, 0, host.cast::<u8>().add(1).cast(), p + 16, 8) };
    refused(status, DevallocStatus::InvalidArgument, before, "a host buffer overlapping the source");
    assert_eq!(unsafe { devalloc_copy_host_to_device(CPU, 0, p + 100, host, 24) }, OK, "{}", last_error());
    let mut apart = [0u8; 24];
    assert_eq!(unsafe { devalloc_copy_device_to_host(CPU, 0, apart.as_mut_ptr().cast(), p + 100, 24) }, OK);
    assert_eq!(&apart[..4], b"thro");
    // The whole allocation from its start is one range; past its end is not.
    let mut whole: *mut std::ffi::c_void = std::ptr::null_mut();
    assert_eq!(unsafe { devalloc_host_pointer(CPU, 0, p, 256, &mut whole) }, OK);
    assert_eq!(unsafe { whole.cast::<u8>().add(16) }, host.cast::<u8>());
    assert_eq!(whole as usize % 64, 0, "an allocation's start is 64-byte aligned in host memory");
    let before = stats();
    let mut out: *mut std::ffi::c_void = std::ptr::dangling_mut();
    let kept = out;
    let status = unsafe { devalloc_host_pointer(CPU, 0, p + 16, 241, &mut out) };
    refused(status, DevallocStatus::OutOfBounds, before, "a host pointer past the end");
    assert!(last_error().starts_with("devalloc_host_pointer: "), "{}", last_error());
    for (bad, what) in [(0, "null"), (0x1234, "foreign"), (u64::MAX, "u64::MAX")] {
        let status = unsafe { devalloc_host_pointer(CPU, 0, bad, 1, &mut out) };
        refused(status, DevallocStatus::InvalidPointer, before, what);
    }
    let status = unsafe { devalloc_host_pointer(CPU, 1, p, 1, &mut out) };
    refused(status, DevallocStatus::NoSuchDevice, before, "cpu:1");
    let status = unsafe { devalloc_host_pointer(CPU, 0, p, 1, std::ptr::null_mut()) };
    refused(status, DevallocStatus::InvalidArgument, before, "a null out");
    assert_eq!(out, kept, "a refused call wrote its out-parameter");
    // Freed: no longer a live allocation.
    assert_eq!(devalloc_deallocate(CPU, 0, p), OK);
    let freed = stats();
    let status = unsafe { devalloc_host_pointer(CPU, 0, p, 1, &mut out) };
    refused(status, DevallocStatus::InvalidPointer, freed, "a freed allocation");
    // A device type whose memory is not host memory is NOT_SUPPORTED where open, and NOT_FOUND
    // here, where nothing opened it.
    let vulkan = RawDeviceType::from(DevallocDeviceType::Vulkan);
    assert!(matches!(
        unsafe { devalloc_host_pointer(vulkan, 0, p, 1, &mut out) },
        DevallocStatus::NotFound | DevallocStatus::NotSupported
    ));
}

/// Each message starts with the call's name, and a device-to-device copy that runs past an end
/// says which end and its address.
#[test]
fn messages_name_the_call_and_the_end_at_fault() {
    let _cpu = cpu();
    let (small, big) = (alloc(64), alloc(512));
    let before = stats();
    let status = devalloc_copy_device_to_device(CPU, 0, big, CPU, 0, small, 128);
    refused(status, DevallocStatus::OutOfBounds, before, "the source is short");
    let said = last_error();
    assert!(said.starts_with("devalloc_copy_device_to_device: the source"), "{said}");
    assert!(said.contains(&format!("{small:#x}")), "{said}");
    let status = devalloc_copy_device_to_device(CPU, 0, small, CPU, 0, big, 128);
    refused(status, DevallocStatus::OutOfBounds, before, "the destination is short");
    let said = last_error();
    assert!(said.starts_with("devalloc_copy_device_to_device: the destination"), "{said}");
    assert!(said.contains(&format!("{small:#x}")), "{said}");
    let status = devalloc_copy_device_to_device(CPU, 0, big, CPU, 0, 0x1234, 8);
    refused(status, DevallocStatus::InvalidPointer, before, "a foreign source");
    assert!(last_error().contains("the source (0x1234"), "{}", last_error());
    let status = unsafe { devalloc_copy_host_to_device(CPU, 0, big, std::ptr::null(), 8) };
    refused(status, DevallocStatus::InvalidArgument, before, "a null src");
    assert!(last_error().starts_with("devalloc_copy_host_to_device: src"), "{}", last_error());
    let status = unsafe { devalloc_copy_device_to_host(CPU, 0, std::ptr::null_mut(), big, 8) };
    refused(status, DevallocStatus::InvalidArgument, before, "a null dst");
    assert!(last_error().starts_with("devalloc_copy_device_to_host: dst"), "{}", last_error());
    refused(devalloc_deallocate(CPU, 0, big + 8), DevallocStatus::InvalidPointer, before, "free(interior)");
    assert!(last_error().starts_with("devalloc_deallocate: "), "{}", last_error());
    assert_eq!(devalloc_deallocate(CPU, 0, small), OK);
    assert_eq!(devalloc_deallocate(CPU, 0, big), OK);
}
