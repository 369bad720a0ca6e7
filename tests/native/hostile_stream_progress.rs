//! Progress and totals of `stream::write_from_reader` under every short source (part of the
//! hostile review in `hostile_in_place.rs`): the callback strictly increasing, its last value
//! what landed, the landed bytes right and those past them untouched, on host memory here and
//! on wgpu's staged route in `hostile_in_place_gpu.rs`.

use devalloc::stream::{write_from_reader, StreamOptions};
use devalloc::{DeviceAllocator, Error, HostAllocator, DEFAULT_ALIGNMENT};

use crate::hostile_in_place::{get, landed_of, pattern};

/// Progress: monotonic, no repeats, last is what landed; with short readers of many lengths,
/// stated totals and allow_short. `all`: every window and length below (host memory, fast);
/// else a few of each (wgpu, where each case is a few device round trips).
pub(crate) fn progress_checks(a: &dyn DeviceAllocator, what: &str, all: bool) {
    let size = 5000;
    let p = a.allocate(size, 0, DEFAULT_ALIGNMENT).unwrap();
    let data = pattern(size, 9);
    let windows: &[usize] = if all { &[1, 3, 4, 7, 1000, 4096, 1 << 20] } else { &[3, 1000, 1 << 20] };
    let lengths: &[usize] =
        if all { &[0, 1, 3, 4, 999, 1000, 1001, 4999, 5000] } else { &[0, 3, 1001, 5000] };
    for &window in windows {
        for &given in lengths {
            for (total, short) in
                [(None, true), (None, false), (Some(given as u64), true), (Some(4000), true)]
            {
                if window < 8 && given > 4 {
                    continue;
                }
                let before = pattern(size, 10);
                a.copy_host_to_device(p, &before, 0).unwrap();
                let mut seen = Vec::new();
                let mut o = StreamOptions::new().window(window).on_progress(|pr| seen.push(pr.done));
                if let Some(t) = total {
                    o = o.total(t);
                }
                if short {
                    o = o.allow_short();
                }
                let r = write_from_reader(a, p, size, 0, &mut &data[..given], o);
                let ctx = format!(
                    "{what}: window {window} given {given} total {total:?} short {short}: {r:?} {seen:?}"
                );
                if let Err(Error::Stream { landed: 0, ref reason, .. }) = r {
                    if reason.contains("nothing was written") {
                        assert!(seen.is_empty(), "{ctx}");
                        assert_eq!(get(a, p, size), before, "{ctx}");
                        continue;
                    }
                }
                let landed = landed_of(&r);
                assert!(seen.windows(2).all(|w| w[0] < w[1]), "not strictly increasing: {ctx}");
                if landed > 0 {
                    assert_eq!(seen.last().copied(), Some(landed), "{ctx}");
                }
                let got = get(a, p, size);
                let l = landed as usize;
                assert!(got[..l] == data[..l], "landed bytes: {ctx}");
                assert!(got[l..] == before[l..], "bytes past landed changed: {ctx}");
                let want_ok = match total {
                    Some(t) => t == given as u64,
                    None => short || given == size,
                };
                assert_eq!(r.is_ok(), want_ok, "{ctx}");
                if r.is_ok() {
                    assert_eq!(landed, given as u64, "{ctx}");
                }
            }
        }
    }
    a.deallocate(p, 0).unwrap();
}

#[test]
fn host_progress_and_totals() {
    progress_checks(&HostAllocator::new(), "host", true);
}
