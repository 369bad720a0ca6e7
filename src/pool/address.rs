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
//! quarantine lifted fails without lifting any, and one whose device allocation then fails puts
//! back what it lifted. Neighbouring freed ranges merge, so the quarantine holds at most about
//! one entry per live allocation.
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

/// A span just reserved, with the quarantined pieces lifted to make room for it (put back
/// by [`AddressWindow::unreserve`] if the allocation then fails: a failed call changes nothing).
#[derive(Debug)]
pub(crate) struct Reservation {
    /// The span reserved.
    pub span: Span,
    lifted: Vec<(u64, u64, u64)>,
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
    pub fn reserve(&mut self, size: u64, alignment: u64) -> Result<Reservation, Refused> {
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
            return Ok(Reservation { span: self.take(span), lifted: Vec::new() });
        }
        // No room outside quarantine. Would there be any with all of it lifted? If not, fail
        // without lifting any: a refused request changes nothing.
        if self.next_fit(need, alignment, false).is_none() {
            return Err(Refused::Full);
        }
        let mut lifted = Vec::new();
        while let Some(piece) = self.lift_oldest_quarantine(need + alignment) {
            lifted.push(piece);
            if let Some(span) = self.next_fit(need, alignment, true) {
                return Ok(Reservation { span: self.take(span), lifted });
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
    /// is the oldest: the piece lifted (`lo, hi, seq`), or `None` when nothing is quarantined.
    fn lift_oldest_quarantine(&mut self, bytes: u64) -> Option<(u64, u64, u64)> {
        let oldest = self.quarantine.iter().min_by_key(|(_, &(_, seq))| seq).map(|(&lo, &v)| (lo, v));
        let (lo, (hi, seq)) = oldest?;
        self.quarantine.remove(&lo);
        let cut = lo.saturating_add(bytes);
        if cut < hi {
            self.quarantine.insert(cut, (hi, seq));
        }
        Some((lo, cut.min(hi), seq))
    }

    /// Gives back a span that was never handed out (its allocation failed): no quarantine of
    /// its own, and the quarantine lifted for it is put back where no live span took it since.
    pub fn unreserve(&mut self, reservation: Reservation) {
        self.live.remove(&reservation.span.lo);
        for (lo, hi, seq) in reservation.lifted.into_iter().rev() {
            let overlaps = |m: Option<u64>| m.is_some_and(|m_hi| m_hi > lo);
            let live = self.live.range(..hi).next_back().map(|(_, &l_hi)| l_hi);
            let quarantined = self.quarantine.range(..hi).next_back().map(|(_, &(q_hi, _))| q_hi);
            if !overlaps(live) && !overlaps(quarantined) {
                self.quarantine.insert(lo, (hi, seq));
            }
        }
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
#[path = "address_tests.rs"]
mod tests;
