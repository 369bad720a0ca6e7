//! [`AddressWindow`]: the virtual addresses a pool hands out for storages without real ones.
//!
//! Layout of an address: bits 63..60 hold the device type + 1 (room for 15 device types; 7
//! exist), bits 59..52 the device index (so at most 256 devices of a type), bits 51..0 the
//! offset in the device's window, which is 2^52 bytes (4 PiB) unless configured smaller. No two
//! devices share an address, and a null or small integer is never a valid address.
//!
//! Reuse rule: a cursor walks the window forward (next fit), so each allocation gets
//! addresses no one had before, until the cursor wraps around. A freed range is then kept out
//! of use (*quarantined*) for `quarantine_frees` later frees (2^32 by default): a stale pointer
//! into it is reported as freed, and can never reach a newer allocation. Only when the window
//! has no other room is quarantine lifted: from the region whose latest free is the oldest,
//! and only as many bytes as the request needs, from its low end (where, with a forward
//! cursor, the earliest allocations lay). A request that could not fit even with every
//! quarantine lifted fails without lifting any. Neighbouring freed ranges merge, so the
//! quarantine holds at most about one entry per live allocation.
//!
//! Pools of one device with the full-size window and the same quarantine share one window
//! (see [`AddressWindow::shared`]): two allocators on one device (two pools of `vulkan:0`,
//! say) never hold the same address at once, so one's pointer is refused by the other (as
//! unknown, or as freed when the range was freed). Windows made one after another (another
//! quarantine, or a device's window made again after its pools were all dropped) start their
//! cursors in lanes 2^44 bytes apart, which keeps them apart until one has handed out 16 TiB.
//! A smaller window (a test setting) is its pool's own: another pool's pointers may be valid
//! addresses in it.
//!
//! So: no range is handed out again within 2^32 frees, unless more than the whole window
//! (4 PiB, less what is live) has been freed meanwhile; with allocations of 2 MiB - 512 bytes
//! or less (each span takes its size rounded up to 256 bytes, plus a 256-byte guard) that
//! takes more than 2^32 frees anyway. No 64-bit scheme can promise more for every size: 2^32
//! frees of 2^40 bytes need 2^72 bytes of distinct addresses.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

use crate::checks::round_up;
use crate::device::Device;
use crate::sync::Unpoisoned;

/// Bits of the per-device window in an address.
pub(crate) const MAX_WINDOW_BITS: u32 = 52;
/// Where the device type (+ 1) starts in an address: 4 bits, so up to 15 types.
const TYPE_SHIFT: u32 = 60;
/// Devices of one type that addresses can tell apart.
pub(crate) const MAX_DEVICES: u32 = 256;
/// Unused bytes after every allocation, so that an end pointer is never in the next one.
const GUARD: u64 = 256;
/// Offsets below this are never handed out.
const FIRST: u64 = 0x1000;
/// Distance between the cursors of two windows of one device.
const LANE: u64 = 1 << 44;
/// Windows made so far (each takes the next lane).
static WINDOWS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A window shared by the pools of one device with the same settings.
pub(crate) type SharedWindow = Arc<Mutex<AddressWindow>>;

/// The full-size windows in use, by device and settings (size, quarantine).
type Key = (Device, u64, u64);
static SHARED: Mutex<Vec<(Key, Weak<Mutex<AddressWindow>>)>> = Mutex::new(Vec::new());

/// A range handed out: the address and the span it holds (padding and guard included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    /// The address handed out.
    pub base: u64,
    lo: u64,
    hi: u64,
}

/// Why a reservation failed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The request (with its guard) is larger than the window: it never fits.
    NeverFits { max: u64 },
    /// Live allocations fill the window.
    Full,
}

/// One device's window of virtual addresses; see the module docs.
pub(crate) struct AddressWindow {
    start: u64,
    end: u64,
    cursor: u64,
    /// Live spans: lo -> hi.
    live: BTreeMap<u64, u64>,
    /// Quarantined spans: lo -> (hi, sequence number of the latest free in it).
    quarantine: BTreeMap<u64, (u64, u64)>,
    frees: u64,
    quarantine_frees: u64,
}

impl AddressWindow {
    /// The window of `device`, `size` bytes (a power of two, 2^17..=2^52).
    pub fn new(device: Device, size: u64, quarantine_frees: u64) -> Self {
        debug_assert!(size.is_power_of_two() && (2 * FIRST..=1 << MAX_WINDOW_BITS).contains(&size));
        debug_assert!(device.index < MAX_DEVICES);
        let base =
            ((device.device_type as u64 + 1) << TYPE_SHIFT) | (u64::from(device.index) << MAX_WINDOW_BITS);
        let lane = WINDOWS.fetch_add(1, std::sync::atomic::Ordering::Relaxed).wrapping_mul(LANE) % (size / 2);
        AddressWindow {
            start: base + FIRST,
            // The last bytes stay unused too, so that the top window's end fits in 64 bits.
            end: base + (size - FIRST),
            cursor: base + FIRST + lane,
            live: BTreeMap::new(),
            quarantine: BTreeMap::new(),
            frees: 0,
            quarantine_frees,
        }
    }

    /// The window of `device` with these settings that pools in use share, or a new one.
    pub fn shared(device: Device, size: u64, quarantine_frees: u64) -> SharedWindow {
        if size < 1 << MAX_WINDOW_BITS {
            // A test setting: exclusive, so that what the test sees is its own pool's doing.
            return Arc::new(Mutex::new(AddressWindow::new(device, size, quarantine_frees)));
        }
        let key = (device, size, quarantine_frees);
        let mut shared = SHARED.lock().unpoisoned();
        shared.retain(|(_, w)| w.strong_count() > 0);
        if let Some(w) = shared.iter().find(|(k, _)| *k == key).and_then(|(_, w)| w.upgrade()) {
            return w;
        }
        let w = Arc::new(Mutex::new(AddressWindow::new(device, size, quarantine_frees)));
        shared.push((key, Arc::downgrade(&w)));
        w
    }

    /// The largest alignment an address in this window can have.
    pub fn max_alignment(&self) -> u64 {
        (self.end - self.start + 2 * FIRST) / 2
    }

    /// Reserves addresses for `size` bytes aligned to `alignment`.
    pub fn reserve(&mut self, size: u64, alignment: u64) -> Result<Span, Refused> {
        // The largest size whose span (rounded to the guard, plus the guard) fits an empty window.
        let max = self.end - self.start - GUARD;
        let need = round_up(size, GUARD).and_then(|n| n.checked_add(GUARD));
        // The request must fit an empty window, at its first aligned address.
        let first_end = round_up(self.start, alignment).and_then(|b| b.checked_add(need?));
        let need = match need {
            Some(n) if alignment <= self.max_alignment() && first_end.is_some_and(|e| e <= self.end) => n,
            _ => return Err(Refused::NeverFits { max }),
        };
        if let Some(span) = self.next_fit(need, alignment, true) {
            return Ok(self.take(span));
        }
        // No room outside quarantine. Would there be any with all of it lifted? If not, fail
        // without lifting any: a refused request changes nothing.
        if self.next_fit(need, alignment, false).is_none() {
            return Err(Refused::Full);
        }
        while self.lift_oldest_quarantine(need + alignment) {
            if let Some(span) = self.next_fit(need, alignment, true) {
                return Ok(self.take(span));
            }
        }
        Err(Refused::Full)
    }

    fn take(&mut self, span: Span) -> Span {
        self.cursor = span.hi;
        self.live.insert(span.lo, span.hi);
        span
    }

    /// Next fit from the cursor, wrapping around once; past quarantined spans too unless
    /// `respect_quarantine` is false.
    fn next_fit(&mut self, need: u64, alignment: u64, respect_quarantine: bool) -> Option<Span> {
        let mut lo = self.cursor;
        let mut wrapped = false;
        loop {
            let fits = round_up(lo, alignment).and_then(|base| Some((base, base.checked_add(need)?)));
            let (base, hi) = match fits {
                Some((base, hi)) if hi <= self.end => (base, hi),
                _ if wrapped => return None,
                _ => {
                    wrapped = true;
                    lo = self.start;
                    continue;
                }
            };
            match self.conflict(lo, hi, respect_quarantine) {
                Some(past) => lo = past,
                None => return Some(Span { base, lo, hi }),
            }
        }
    }

    /// The end of a live (or, if `quarantine`, quarantined) span that overlaps `lo..hi`, if
    /// any; expired quarantine entries met on the way are dropped.
    fn conflict(&mut self, lo: u64, hi: u64, quarantine: bool) -> Option<u64> {
        if let Some((_, &l_hi)) = self.live.range(..hi).next_back() {
            if l_hi > lo {
                return Some(l_hi);
            }
        }
        if !quarantine {
            return None;
        }
        while let Some((&q_lo, &(q_hi, seq))) = self.quarantine.range(..hi).next_back() {
            if q_hi <= lo {
                return None;
            }
            if self.frees - seq < self.quarantine_frees {
                return Some(q_hi);
            }
            self.quarantine.remove(&q_lo);
        }
        None
    }

    /// Lifts the quarantine of up to `bytes` at the low end of the region whose latest free
    /// is the oldest; false when nothing is quarantined.
    fn lift_oldest_quarantine(&mut self, bytes: u64) -> bool {
        let oldest = self.quarantine.iter().min_by_key(|(_, &(_, seq))| seq).map(|(&lo, &v)| (lo, v));
        let Some((lo, (hi, seq))) = oldest else { return false };
        self.quarantine.remove(&lo);
        let cut = lo.saturating_add(bytes);
        if cut < hi {
            self.quarantine.insert(cut, (hi, seq));
        }
        true
    }

    /// Gives back a span that was never handed out (its allocation failed): no quarantine.
    pub fn unreserve(&mut self, span: Span) {
        self.live.remove(&span.lo);
    }

    /// Frees a span: it goes into quarantine, merged with freed neighbours.
    pub fn release(&mut self, span: Span) {
        self.live.remove(&span.lo);
        self.frees += 1;
        let (mut lo, mut hi, seq) = (span.lo, span.hi, self.frees);
        if let Some((&p_lo, &(p_hi, _))) = self.quarantine.range(..lo).next_back() {
            if p_hi == lo {
                self.quarantine.remove(&p_lo);
                lo = p_lo;
            }
        }
        if let Some(&(n_hi, _)) = self.quarantine.get(&hi) {
            self.quarantine.remove(&hi);
            hi = n_hi;
        }
        self.quarantine.insert(lo, (hi, seq));
    }

    /// Whether `addr` lies in a quarantined (recently freed) span.
    pub fn was_freed(&self, addr: u64) -> bool {
        self.quarantine
            .range(..=addr)
            .next_back()
            .is_some_and(|(_, &(hi, seq))| addr < hi && self.frees - seq < self.quarantine_frees)
    }

    /// Quarantine entries held (for tests of the memory bound).
    #[cfg(test)]
    fn quarantined(&self) -> usize {
        self.quarantine.len()
    }
}

#[cfg(test)]
mod tests {
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
                let s = w.reserve(1 << 40, 256).unwrap();
                seen.push((s.base, s.hi));
            }
        }
        seen.sort();
        assert!(seen.windows(2).all(|w| w[0].1 <= w[1].0), "{seen:x?}");
    }

    #[test]
    fn addresses_are_aligned_and_do_not_overlap_with_a_guard() {
        let mut w = small(1 << 32);
        let a = w.reserve(100, 256).unwrap();
        let b = w.reserve(1, 4096).unwrap();
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
            let s = w.reserve(4096, 256).unwrap();
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
            let s = w.reserve(4096, 256).unwrap();
            order.push(s);
        }
        // Free them in a shuffled order; the next reservation must take the first freed.
        let shuffled: Vec<Span> = order.iter().rev().step_by(3).copied().collect();
        for s in &shuffled {
            w.release(*s);
        }
        let again = w.reserve(4096, 256).unwrap();
        assert_eq!(again.lo, shuffled[0].lo, "reused something other than the least recently freed");
        assert!(!w.was_freed(again.base));
        assert!(w.was_freed(shuffled[1].base), "the others stay quarantined");
    }

    #[test]
    fn quarantine_ends_after_its_count_of_frees() {
        let mut w = small(3);
        let a = w.reserve(64, 256).unwrap();
        let _spacer = w.reserve(64, 256).unwrap(); // keeps later frees from merging with a
        w.release(a);
        for _ in 0..2 {
            let s = w.reserve(64, 256).unwrap();
            w.release(s);
        }
        assert!(w.was_freed(a.base));
        let s = w.reserve(64, 256).unwrap();
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
        assert_eq!(w.reserve(60_000, 256), Err(Refused::Full));
    }

    #[test]
    fn a_request_that_cannot_fit_aligned_never_fits_and_lifts_nothing() {
        let mut w = AddressWindow::new(Device::new(DeviceType::Cpu, 0), 1 << 17, 1 << 32);
        let a = w.reserve(4096, 256).unwrap();
        w.release(a);
        // 64 KiB aligned to 64 KiB: the first such address leaves no room in a 128 KiB window.
        assert!(matches!(w.reserve(65536, 65536), Err(Refused::NeverFits { .. })));
        assert!(w.was_freed(a.base), "a refused request lifted the quarantine");
    }

    #[test]
    fn a_full_window_of_live_spans_lifts_no_quarantine() {
        let mut w = small(1 << 32);
        let a = w.reserve(4096, 256).unwrap();
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
            let s = w.reserve(4096, 256).unwrap();
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
        let (x, y) = (a.reserve(4096, 256).unwrap(), b.reserve(4096, 256).unwrap());
        assert!(x.hi <= y.lo || y.hi <= x.lo, "{:#x} and {:#x} overlap", x.base, y.base);
    }

    #[test]
    fn unreserved_spans_are_not_quarantined() {
        let mut w = small(1 << 32);
        let a = w.reserve(64, 256).unwrap();
        w.unreserve(a);
        assert!(!w.was_freed(a.base));
    }
}
