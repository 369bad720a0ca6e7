//! Tests of [`AddressWindow`](super::AddressWindow): the reuse rule, quarantine and its lifting.
use super::*;
use crate::device::DeviceType;

fn small(quarantine: u64) -> AddressWindow {
    let mut w = AddressWindow::new(Device::new(DeviceType::Cpu, 0), 1 << 20, quarantine);
    w.cursor = w.start; // the lane of a window made by a test is wherever the count stands
    w
}

#[test]
fn devices_and_types_never_share_addresses() {
    let mut seen = Vec::new();
    for ty in [DeviceType::Cpu, DeviceType::Vulkan, DeviceType::WebGpu] {
        for index in [0, 1, 255] {
            let mut w = AddressWindow::new(Device::new(ty, index), 1 << MAX_WINDOW_BITS, 1 << 32);
            let s = w.reserve(1 << 40, 256).unwrap().span;
            seen.push((s.base, s.hi));
        }
    }
    seen.sort();
    assert!(seen.windows(2).all(|w| w[0].1 <= w[1].0), "{seen:x?}");
}

#[test]
fn addresses_are_aligned_and_do_not_overlap_with_a_guard() {
    let mut w = small(1 << 32);
    let a = w.reserve(100, 256).unwrap().span;
    let b = w.reserve(1, 4096).unwrap().span;
    assert_eq!(b.base % 4096, 0);
    assert!(b.base > a.base + 100, "one past the end of a is not in b");
    let e = w.reserve(1 << 20, 256).unwrap_err();
    assert!(matches!(e, Refused::NeverFits { .. }));
    assert!(matches!(w.reserve(8, 1 << 20), Err(Refused::NeverFits { .. })), "alignment past the window");
}

#[test]
fn freed_ranges_are_not_reused_while_there_is_other_room() {
    // 1 MiB window, 4 KiB allocations: each takes 4 KiB + 256 of addresses.
    let mut w = small(1 << 32);
    let mut freed = Vec::new();
    for _ in 0..200 {
        let s = w.reserve(4096, 256).unwrap().span;
        assert!(!freed.contains(&s.base), "{:#x} handed out again too soon", s.base);
        w.release(s);
        assert!(w.was_freed(s.base) && w.was_freed(s.base + 4096));
        freed.push(s.base);
    }
    // Everything freed so far merged into one quarantine entry.
    assert!(w.quarantined() <= 2, "{}", w.quarantined());
}

#[test]
fn when_the_window_is_full_the_least_recently_freed_goes_first() {
    let mut w = small(1 << 32);
    let per = 4096 + 256;
    let fit = ((1 << 20) - 2 * FIRST) / per;
    let mut order = Vec::new();
    for _ in 0..fit {
        let s = w.reserve(4096, 256).unwrap().span;
        order.push(s);
    }
    // Free them in a shuffled order; the next reservation must take the first freed.
    let shuffled: Vec<Span> = order.iter().rev().step_by(3).copied().collect();
    for s in &shuffled {
        w.release(*s);
    }
    let again = w.reserve(4096, 256).unwrap().span;
    assert_eq!(again.lo, shuffled[0].lo, "reused something other than the least recently freed");
    assert!(!w.was_freed(again.base));
    assert!(w.was_freed(shuffled[1].base), "the others stay quarantined");
}

#[test]
fn quarantine_ends_after_its_count_of_frees() {
    let mut w = small(3);
    let a = w.reserve(64, 256).unwrap().span;
    let _spacer = w.reserve(64, 256).unwrap().span; // keeps later frees from merging with a
    w.release(a);
    for _ in 0..2 {
        let s = w.reserve(64, 256).unwrap().span;
        w.release(s);
    }
    assert!(w.was_freed(a.base));
    let s = w.reserve(64, 256).unwrap().span;
    w.release(s);
    assert!(!w.was_freed(a.base), "3 frees later the quarantine of a has ended");
}

#[test]
fn a_window_of_live_allocations_is_full() {
    let mut w = small(1 << 32);
    let mut n = 0;
    while w.reserve(60_000, 256).is_ok() {
        n += 1;
    }
    assert_eq!(n, ((1 << 20) - 2 * FIRST) / (60_000u64.next_multiple_of(256) + 256));
    assert!(matches!(w.reserve(60_000, 256), Err(Refused::Full)));
}

#[test]
fn a_request_that_cannot_fit_aligned_never_fits_and_lifts_nothing() {
    let mut w = AddressWindow::new(Device::new(DeviceType::Cpu, 0), 1 << 17, 1 << 32);
    let a = w.reserve(4096, 256).unwrap().span;
    w.release(a);
    // 64 KiB aligned to 64 KiB: the first such address leaves no room in a 128 KiB window.
    assert!(matches!(w.reserve(65536, 65536), Err(Refused::NeverFits { .. })));
    assert!(w.was_freed(a.base), "a refused request lifted the quarantine");
}

#[test]
fn a_full_window_of_live_spans_lifts_no_quarantine() {
    let mut w = small(1 << 32);
    let a = w.reserve(4096, 256).unwrap().span;
    w.release(a);
    while w.reserve(60_000, 256).is_ok() {}
    assert!(w.was_freed(a.base) || w.live.contains_key(&a.lo), "a refused request lifted the quarantine");
}

#[test]
fn recent_frees_stay_freed_when_the_window_wraps() {
    // Alloc/free one size over and over: frees merge into one region; when the cursor
    // wraps, only what the next request needs is lifted, from the oldest end.
    let mut w = small(1 << 32);
    let mut recent = Vec::new();
    for _ in 0..1000 {
        let s = w.reserve(4096, 256).unwrap().span;
        w.release(s);
        recent.push(s.base);
        for &b in recent.iter().rev().take(8) {
            assert!(w.was_freed(b) || b == s.base, "{b:#x}, one of the last 8 frees, is no longer freed");
        }
    }
}

#[test]
fn two_windows_of_one_device_hand_out_different_addresses() {
    let d = Device::new(DeviceType::Vulkan, 0);
    let mut a = AddressWindow::new(d, 1 << MAX_WINDOW_BITS, 1 << 32);
    let mut b = AddressWindow::new(d, 1 << MAX_WINDOW_BITS, 1 << 32);
    let (x, y) = (a.reserve(4096, 256).unwrap().span, b.reserve(4096, 256).unwrap().span);
    assert!(x.hi <= y.lo || y.hi <= x.lo, "{:#x} and {:#x} overlap", x.base, y.base);
}

#[test]
fn unreserved_spans_are_not_quarantined() {
    let mut w = small(1 << 32);
    let a = w.reserve(64, 256).unwrap();
    let base = a.span.base;
    w.unreserve(a);
    assert!(!w.was_freed(base));
}

#[test]
fn an_unreserved_span_puts_back_the_quarantine_it_lifted() {
    let mut w = small(1 << 32);
    let mut spans = Vec::new();
    while let Ok(r) = w.reserve(4096, 256) {
        spans.push(r.span);
    }
    for s in &spans {
        w.release(*s);
    }
    let r = w.reserve(4096, 256).unwrap();
    assert!(!r.lifted.is_empty(), "a full window of freed spans lifts some quarantine");
    w.unreserve(r);
    for s in &spans {
        assert!(w.was_freed(s.base), "{:#x} is no longer freed after a reservation was given back", s.base);
    }
}
