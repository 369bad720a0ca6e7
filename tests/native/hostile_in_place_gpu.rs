//! The hostile review of `hostile_in_place.rs` on wgpu's staged route (GL, and Vulkan with
//! `Route::Staged`), where `write_from_reader` fills in place: a mapped staging buffer handed to
//! the reader, piece by piece. Plus what only a GPU has: a fill that panics with the staging
//! mapped, a fill that re-enters the allocator, the device destroyed inside a fill.

use devalloc::stream::{write_from_reader, StreamOptions};
use devalloc::{DeviceAllocator, DEFAULT_ALIGNMENT};

use crate::hostile_in_place::{
    concurrent_others, get, leak, pattern, progress_reads_destination, reader_frees_destination,
    scribbling_reader_leaves_bytes_past_landed,
};
use crate::hostile_stream_progress::progress_checks;
use crate::util::{no_panic, within};

use devalloc::wgpu::{Route, WgpuAllocator, WgpuOptions};

/// Pieces of 0, 1, 3 and huge; nbytes 0 and huge: what `fill` is handed and what lands.
fn odd_pieces(a: &dyn DeviceAllocator, what: &str) {
    let size = 4096;
    let p = a.allocate(size, 0, DEFAULT_ALIGNMENT).unwrap();
    let before = pattern(size, 7);
    let mut over = Vec::new();
    for piece in [0usize, 1, 3, 5, 4097, usize::MAX] {
        a.copy_host_to_device(p, &before, 0).unwrap();
        let mut sizes = Vec::new();
        let mut fill = |b: &mut [u8]| {
            sizes.push(b.len());
            b.fill(0x11);
            b.len()
        };
        let len = 103;
        let Some((landed, r)) = a.fill_in_place(p.offset(8).unwrap(), len, 0, piece, &mut fill) else {
            eprintln!("{what}: no in-place route");
            return;
        };
        r.unwrap();
        assert_eq!(landed, len as u64, "{what} piece {piece}");
        let max = sizes.iter().max().copied().unwrap_or(0);
        if max > piece.max(1) {
            over.push(format!("piece {piece}: handed up to {max} bytes ({} calls)", sizes.len()));
        }
        let got = get(a, p, size);
        assert!(
            got[..8] == before[..8] && got[8..111].iter().all(|&b| b == 0x11) && got[111..] == before[111..]
        );
    }
    // nbytes 0: fill never called; nbytes huge: refused, never called.
    let mut called = false;
    let mut never = |_: &mut [u8]| {
        called = true;
        0
    };
    if let Some((l, r)) = a.fill_in_place(p, 0, 0, 64, &mut never) {
        assert!(l == 0 && r.is_ok(), "{what}: 0 bytes: {l} {r:?}");
    }
    if let Some((l, r)) = a.fill_in_place(p, usize::MAX, 0, 64, &mut never) {
        assert!(l == 0 && r.is_err(), "{what}: huge: {l} {r:?}");
    }
    assert!(!called, "{what}");
    a.deallocate(p, 0).unwrap();
    assert!(over.is_empty(), "{what}: fill handed more than the piece: {over:?}");
}

fn open(backend: wgpu::Backend, route: Option<Route>) -> Option<&'static WgpuAllocator> {
    let o = WgpuOptions { staging_chunk: Some(64 << 10), route, ..WgpuOptions::default() };
    match WgpuAllocator::with_options(backend, o) {
        Ok(a) => Some(leak(a)),
        Err(e) => {
            eprintln!("no {backend:?}: {e}");
            None
        }
    }
}

fn each(f: impl Fn(&'static WgpuAllocator, &str)) {
    for (b, r) in [(wgpu::Backend::Gl, None), (wgpu::Backend::Vulkan, Some(Route::Staged))] {
        if let Some(a) = open(b, r) {
            f(a, &format!("{b:?} {r:?}"));
        }
    }
}

#[test]
fn wgpu_a_scribbling_reader_that_fails_leaves_bytes_past_landed() {
    each(|a, w| scribbling_reader_leaves_bytes_past_landed(a, w));
}

#[test]
fn wgpu_a_progress_callback_that_reads_the_destination_works() {
    each(|a, w| progress_reads_destination(a, w));
}

#[test]
fn wgpu_odd_pieces() {
    each(|a, w| odd_pieces(a, w));
}

#[test]
fn wgpu_progress_and_totals() {
    each(|a, w| progress_checks(a, w, false));
}

#[test]
fn wgpu_concurrent_copies_while_a_slow_reader_fills() {
    each(|a, w| concurrent_others(a, w));
}

#[test]
fn wgpu_a_reader_that_frees_the_destination() {
    each(|a, w| reader_frees_destination(a, w, true));
}

/// A fill that panics with the staging mapped: many times, then a stream still works and
/// the staging held stays bounded.
#[test]
fn wgpu_a_panicking_fill_leaves_the_allocator_usable() {
    each(|a, w| {
        let p = a.allocate(1 << 16, 0, DEFAULT_ALIGNMENT).unwrap();
        for _ in 0..20 {
            let e = no_panic(|| {
                a.fill_in_place(p, 1 << 16, 0, 4096, &mut |_: &mut [u8]| panic!("fill's own panic"))
            });
            assert_eq!(e.unwrap_err(), "fill's own panic", "{w}");
        }
        let staging = a.stats(0).unwrap().staging_bytes;
        let data = pattern(1 << 16, 12);
        let r = within(30, move || {
            write_from_reader(a, p, 1 << 16, 0, &mut &data[..], StreamOptions::new().window(8192)).map(|_| ())
        });
        r.unwrap_or_else(|| panic!("{w}: hang after panics")).unwrap();
        assert_eq!(get(a, p, 1 << 16), pattern(1 << 16, 12), "{w}");
        eprintln!("{w}: staging after 20 panics: {staging}, now {}", a.stats(0).unwrap().staging_bytes);
        a.deallocate(p, 0).unwrap();
    });
}

/// A fill that re-enters: streams into another allocation, copies to and from the
/// destination, frees the cache: no hang, bytes right.
#[test]
fn wgpu_a_reentrant_fill() {
    each(|a, w| {
        let p = a.allocate(1 << 16, 0, DEFAULT_ALIGNMENT).unwrap();
        let q = a.allocate(1 << 16, 0, DEFAULT_ALIGNMENT).unwrap();
        let r = within(60, move || {
            let mut depth = 0;
            let mut fill = |b: &mut [u8]| {
                depth += 1;
                let inner = pattern(1 << 16, depth as u8);
                write_from_reader(a, q, 1 << 16, 0, &mut &inner[..], StreamOptions::new().window(4096))
                    .unwrap();
                a.copy_host_to_device(p.offset(60000).unwrap(), &[5u8; 16], 0).unwrap();
                a.empty_cache();
                b.fill(depth as u8);
                b.len()
            };
            a.fill_in_place(p, 40000, 0, 4096, &mut fill).map(|(l, r)| (l, r.map_err(|e| e.to_string())))
        });
        let out = r.unwrap_or_else(|| panic!("{w}: hang"));
        if let Some((l, r)) = out {
            r.unwrap();
            assert_eq!(l, 40000, "{w}");
            let got = get(a, p, 1 << 16);
            assert!(got[..4096].iter().all(|&b| b == 1), "{w}");
            assert!(got[60000..60016].iter().all(|&b| b == 5), "{w}");
        }
        a.deallocate(p, 0).unwrap();
        a.deallocate(q, 0).unwrap();
    });
}

/// Device destroyed inside `fill` (staging mapped), on GL and Vulkan's staged route: an
/// error with what landed, no panic, no hang; the allocator still answers.
#[test]
fn wgpu_device_destroyed_inside_fill() {
    for backend in crate::wgpu_app::BACKENDS {
        let Some((device, _q, a, _watch)) = crate::wgpu_app::adopt_watched(backend, Route::Staged) else {
            continue;
        };
        let a = leak(a);
        let p = a.allocate(1 << 16, 0, DEFAULT_ALIGNMENT).unwrap();
        let before = pattern(1 << 16, 13);
        a.copy_host_to_device(p, &before, 0).unwrap();
        let r = within(60, move || {
            let mut calls = 0;
            let mut device = Some(device);
            let mut fill = |b: &mut [u8]| {
                calls += 1;
                if calls == 3 {
                    if let Some(d) = device.take() {
                        d.destroy();
                    }
                }
                b.fill(0x44);
                b.len()
            };
            let out = no_panic(|| a.fill_in_place(p, 40000, 0, 4096, &mut fill));
            (out.map(|o| o.map(|(l, r)| (l, r.map_err(|e| e.to_string())))), calls)
        });
        let (out, calls) = r.unwrap_or_else(|| panic!("{backend:?}: hang"));
        eprintln!("{backend:?}: destroyed in fill call 3 of {calls}: {out:?}");
        let out = out.unwrap_or_else(|m| panic!("{backend:?}: panic: {m}"));
        if let Some((l, r)) = out {
            assert!(r.is_err(), "{backend:?}: landed {l} on a destroyed device");
            assert!(l <= 3 * 4096, "{backend:?}: {l}");
        }
        // Still answers (errors, not panics).
        let mut back = vec![0u8; 16];
        let r = no_panic(|| a.copy_device_to_host(&mut back, p, 0));
        assert!(r.is_ok(), "{backend:?}: {r:?}");
        let r = no_panic(|| a.deallocate(p, 0));
        assert!(r.is_ok(), "{backend:?}: {r:?}");
    }
}
