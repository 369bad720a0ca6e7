//! A hostile review of `stream::write_from_reader` and `DeviceAllocator::fill_in_place`,
//! through the public API only: readers that scribble, fail, re-enter, free the destination,
//! hand off to other threads; odd piece sizes and totals. Host memory here (the windowed
//! route); wgpu's staged route, which fills in place, in `hostile_in_place_gpu.rs`.

use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use devalloc::stream::{write_from_reader, StreamOptions};
use devalloc::{DeviceAllocator, DevicePtr, Error, HostAllocator, DEFAULT_ALIGNMENT};

use crate::util::within;

pub(crate) fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

pub(crate) fn get(a: &dyn DeviceAllocator, p: DevicePtr, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    a.copy_device_to_host(&mut v, p, 0).unwrap();
    v
}

pub(crate) fn landed_of(r: &devalloc::Result<u64>) -> u64 {
    match r {
        Ok(n) => *n,
        Err(Error::Stream { landed, .. }) => *landed,
        Err(e) => panic!("not a stream error: {e}"),
    }
}

pub(crate) fn leak<A: DeviceAllocator + 'static>(a: A) -> &'static A {
    Box::leak(Box::new(a))
}

/// Two allocations of `n` bytes in one host block: a repeating workload leaves a 1 MiB block
/// cached, which the pool splits for both (checked through the snapshot's block ids).
fn same_block_pair(a: &HostAllocator, n: usize) -> (DevicePtr, DevicePtr) {
    crate::split_hostile::repeating(a, 1 << 20);
    let x = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
    let y = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
    let snap = a.snapshot().unwrap();
    let block = |p: DevicePtr| snap.devices[0].live.iter().find(|l| l.addr == p.addr()).unwrap().block;
    assert_eq!(block(x), block(y), "not one block");
    (x, y)
}

/// Gives `ok`'s bytes, then scribbles 0xEE over the whole buffer it is handed and fails (a
/// decoder that wrote its output before its checksum failed: legal for a `Read`).
struct ScribbleThenFail<'d>(&'d [u8]);
impl Read for ScribbleThenFail<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.0.is_empty() {
            buf.fill(0xEE);
            return Err(io::Error::other("checksum mismatch"));
        }
        let n = buf.len().min(self.0.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

/// The same, ending (Ok(0)) instead of failing, with `allow_short`.
struct ScribbleThenEnd<'d>(&'d [u8]);
impl Read for ScribbleThenEnd<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.0.is_empty() {
            buf.fill(0xEE);
            return Ok(0);
        }
        let n = buf.len().min(self.0.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

/// Bytes past what a failing (or ending) reader gave stay unchanged, even where the reader wrote
/// its buffer past the count it returned: from a word's start and inside one, ending on a word
/// and inside one.
pub(crate) fn scribbling_reader_leaves_bytes_past_landed(a: &dyn DeviceAllocator, what: &str) {
    let size = 8192;
    let p = a.allocate(size, 0, DEFAULT_ALIGNMENT).unwrap();
    let before = pattern(size, 1);
    let data = pattern(size, 2);
    let mut bad = Vec::new();
    for off in [0usize, 1, 4] {
        for given in [3000usize, 3001] {
            let dst = p.offset(off).unwrap();
            let len = size - off;
            a.copy_host_to_device(p, &before, 0).unwrap();
            let r = write_from_reader(
                a,
                dst,
                len,
                0,
                &mut ScribbleThenFail(&data[..given]),
                StreamOptions::new().window(4096),
            );
            assert_eq!(landed_of(&r), given as u64, "{what}: {r:?}");
            let got = get(a, p, size);
            assert!(
                got[off..off + given] == data[..given] && got[..off] == before[..off],
                "{what}: landed bytes wrong"
            );
            let moved = got[off + given..].iter().zip(&before[off + given..]).filter(|(g, b)| g != b).count();
            if moved > 0 {
                bad.push(format!(
                    "offset {off}, {given} given, reader failed: {moved} bytes past landed changed"
                ));
            }
            a.copy_host_to_device(p, &before, 0).unwrap();
            let o = StreamOptions::new().window(4096).allow_short();
            let r = write_from_reader(a, dst, len, 0, &mut ScribbleThenEnd(&data[..given]), o);
            assert_eq!(r.unwrap(), given as u64, "{what}");
            let got = get(a, p, size);
            let moved = got[off + given..].iter().zip(&before[off + given..]).filter(|(g, b)| g != b).count();
            if moved > 0 {
                bad.push(format!(
                    "offset {off}, {given} given, reader ended: {moved} bytes past landed changed"
                ));
            }
        }
    }
    a.deallocate(p, 0).unwrap();
    assert!(bad.is_empty(), "{what}: {bad:#?}");
}

#[test]
fn host_a_scribbling_reader_that_fails_leaves_bytes_past_landed() {
    scribbling_reader_leaves_bytes_past_landed(&HostAllocator::new(), "host");
}

/// The progress callback reads what has landed so far (a progress bar that checksums, a
/// verifier): on the windowed route it runs with no lock held; here it runs inside `fill`.
pub(crate) fn progress_reads_destination(a: &dyn DeviceAllocator, what: &str) {
    let size = 1 << 16;
    let p = a.allocate(size, 0, DEFAULT_ALIGNMENT).unwrap();
    let data = pattern(size, 3);
    let mut errors = Vec::new();
    let options = StreamOptions::new().window(4096).on_progress(|pr| {
        let mut back = vec![0u8; pr.done as usize];
        match a.copy_device_to_host(&mut back, p, 0) {
            Err(e) => errors.push(e.to_string()),
            Ok(()) if back[..] != data[..pr.done as usize] => {
                errors.push(format!("{} reported landed, not there", pr.done))
            }
            Ok(()) => {}
        }
    });
    write_from_reader(a, p, size, 0, &mut &data[..], options).unwrap();
    a.deallocate(p, 0).unwrap();
    assert!(
        errors.is_empty(),
        "{what}: {} of the progress callback's reads failed, first: {}",
        errors.len(),
        errors[0]
    );
}

#[test]
fn host_a_progress_callback_that_reads_the_destination_works() {
    progress_reads_destination(&HostAllocator::new(), "host");
}

/// A reader that copies from another allocation (a device-to-device copy through the host, as
/// a `Read` over device memory would do): it worked before on the read-ahead thread.
#[test]
fn host_a_reader_over_another_allocation_of_the_same_block_works() {
    let a = HostAllocator::new();
    let n = 4096;
    let (src, dst) = same_block_pair(&a, n);
    let data = pattern(n, 4);
    a.copy_host_to_device(src, &data, 0).unwrap();
    struct DeviceReader<'a> {
        a: &'a HostAllocator,
        at: DevicePtr,
        left: usize,
    }
    impl Read for DeviceReader<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let k = buf.len().min(self.left);
            self.a.copy_device_to_host(&mut buf[..k], self.at, 0).map_err(io::Error::other)?;
            self.at = self.at.offset(k).unwrap();
            self.left -= k;
            Ok(k)
        }
    }
    let r =
        write_from_reader(&a, dst, n, 0, &mut DeviceReader { a: &a, at: src, left: n }, StreamOptions::new());
    assert!(r.is_ok(), "a reader over another allocation: {r:?}");
    assert_eq!(get(&a, dst, n), data);
}

/// The same reader, but reading on another thread (a pipe fed by a producer that reads device
/// memory): the in-place route holds the block's write lock while the reader waits for the
/// producer, whose read waits for that lock. Before, the reader ran with no lock held.
#[test]
fn host_a_reader_fed_by_another_thread_reading_the_same_block_does_not_deadlock() {
    let a = leak(HostAllocator::new());
    let n = 1 << 16;
    let (src, dst) = same_block_pair(a, n);
    let data = pattern(n, 5);
    a.copy_host_to_device(src, &data, 0).unwrap();
    let done = within(20, move || {
        let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(1);
        let producer = std::thread::spawn(move || {
            for k in (0..n).step_by(4096) {
                let mut chunk = vec![0u8; 4096];
                a.copy_device_to_host(&mut chunk, src.offset(k).unwrap(), 0).unwrap();
                if tx.send(chunk).is_err() {
                    return;
                }
            }
        });
        struct Pipe(mpsc::Receiver<Vec<u8>>, Vec<u8>);
        impl Read for Pipe {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.1.is_empty() {
                    match self.0.recv() {
                        Ok(c) => self.1 = c,
                        Err(_) => return Ok(0),
                    }
                }
                let k = buf.len().min(self.1.len());
                buf[..k].copy_from_slice(&self.1[..k]);
                self.1.drain(..k);
                Ok(k)
            }
        }
        let r = write_from_reader(a, dst, n, 0, &mut Pipe(rx, Vec::new()), StreamOptions::new());
        producer.join().unwrap();
        r
    });
    let r = done.expect(
        "deadlock: the stream into dst and the producer reading src (same block) wait for each other",
    );
    assert_eq!(r.unwrap(), n as u64);
    assert_eq!(get(a, dst, n), data);
}

/// Host memory fills nothing in place (a reader there would run under the block's lock, which
/// other threads' copies wait for): `None`, and `fill` never runs, whatever the range.
#[test]
fn host_memory_has_no_in_place_route() {
    let a = HostAllocator::new();
    let p = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
    let called = std::cell::Cell::new(false);
    let mut fill = |b: &mut [u8]| {
        called.set(true);
        b.len()
    };
    assert!(a.fill_in_place(p, 4096, 0, 1024, &mut fill).is_none());
    // A bad range is still refused as a copy would be.
    let (landed, r) = a.fill_in_place(p, 4097, 0, 1024, &mut fill).unwrap();
    assert!(landed == 0 && matches!(r, Err(Error::OutOfBounds { .. })), "{r:?}");
    assert!(!called.get(), "fill ran on host memory");
}

/// A slow reader fills one allocation while other threads copy into and out of other
/// allocations (of the same block, where the pool splits one): every byte right.
pub(crate) fn concurrent_others(a: &'static dyn DeviceAllocator, what: &str) {
    let n = 1 << 16;
    let dst = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
    let others: Vec<_> = (0..4).map(|_| a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap()).collect();
    let data = pattern(n, 11);
    let stop = Arc::new(AtomicBool::new(false));
    struct Slow<'d>(&'d [u8]);
    impl Read for Slow<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            std::thread::sleep(Duration::from_millis(2));
            let k = buf.len().min(self.0.len()).min(1024);
            buf[..k].copy_from_slice(&self.0[..k]);
            self.0 = &self.0[k..];
            Ok(k)
        }
    }
    let r = within(60, {
        let stop = Arc::clone(&stop);
        let others = others.clone();
        let data = data.clone();
        move || {
            std::thread::scope(|s| {
                for (k, &o) in others.iter().enumerate() {
                    let stop = &stop;
                    s.spawn(move || {
                        let mut round = 0u8;
                        while !stop.load(Ordering::Relaxed) {
                            let v = vec![round.wrapping_add(k as u8); 4096];
                            a.copy_host_to_device(o, &v, 0).unwrap();
                            let mut back = vec![0u8; 4096];
                            a.copy_device_to_host(&mut back, o, 0).unwrap();
                            assert_eq!(back, v);
                            round = round.wrapping_add(1);
                        }
                    });
                }
                let r = write_from_reader(a, dst, n, 0, &mut Slow(&data), StreamOptions::new().window(8192));
                stop.store(true, Ordering::Relaxed);
                r
            })
        }
    });
    let r = r.unwrap_or_else(|| panic!("{what}: hang"));
    assert_eq!(r.unwrap(), n as u64, "{what}");
    assert_eq!(get(a, dst, n), data, "{what}");
}

#[test]
fn host_concurrent_copies_while_a_slow_reader_fills() {
    let a = leak(HostAllocator::new());
    // A cached 1 MiB block the pool splits, so that the allocations below are pieces of one block.
    crate::split_hostile::repeating(a, 1 << 20);
    concurrent_others(a, "host");
    let snap = a.snapshot().unwrap();
    let blocks: std::collections::BTreeSet<u64> = snap.devices[0].live.iter().map(|l| l.block).collect();
    eprintln!("host concurrent: blocks of the live allocations: {blocks:?}");
}

/// The reader frees the destination part-way, and allocates another of the same size (which
/// the pool may place where the freed one was). Every other allocation stays as it was; where
/// `caught` (the in-place route, which checks that each piece still lies in the block it began
/// in) the stream stops with an error and the new allocation is not written. The windowed
/// route's copies see only an address, which a same-size allocation in the same place makes
/// live again (as for any copy through a stale pointer).
pub(crate) fn reader_frees_destination(a: &'static dyn DeviceAllocator, what: &str, caught: bool) {
    let n = 1 << 14;
    let dst = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
    let keep = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
    a.copy_host_to_device(keep, &vec![0x22; n], 0).unwrap();
    struct Freer {
        a: &'static dyn DeviceAllocator,
        dst: DevicePtr,
        given: usize,
        new: Option<DevicePtr>,
    }
    impl Read for Freer {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.given >= 4096 && self.new.is_none() {
                self.a.deallocate(self.dst, 0).unwrap();
                self.new = Some(self.a.allocate(1 << 14, 0, DEFAULT_ALIGNMENT).unwrap());
            }
            let k = buf.len().min((1 << 14) - self.given);
            buf[..k].fill(0x77);
            self.given += k;
            Ok(k)
        }
    }
    let mut reader = Freer { a, dst, given: 0, new: None };
    let r = within(30, move || {
        let r = write_from_reader(a, dst, n, 0, &mut reader, StreamOptions::new().window(4096));
        (r.map_err(|e| e.to_string()), reader.new)
    });
    let (r, new) = r.unwrap_or_else(|| panic!("{what}: hang"));
    let new = new.unwrap();
    eprintln!("{what}: a stream whose destination was freed mid-way: {r:?}");
    // The new allocation: not written by a stream to a freed pointer.
    let got = get(a, new, n);
    let hit = got.iter().filter(|&&b| b == 0x77).count();
    assert_eq!(get(a, keep, n), vec![0x22; n], "{what}: another allocation changed");
    if caught {
        assert!(r.is_err(), "{what}: a stream into a freed range succeeded");
        assert!(hit < 4096, "{what}: {hit} bytes of a new allocation carry the freed stream's bytes");
    }
    a.copy_host_to_device(new, &vec![1; n], 0).unwrap();
    a.deallocate(new, 0).unwrap();
    a.deallocate(keep, 0).unwrap();
}

#[test]
fn host_a_reader_that_frees_the_destination() {
    reader_frees_destination(leak(HostAllocator::new()), "host", false);
    // And with the destination a piece of a split block.
    let a = leak(HostAllocator::new());
    crate::split_hostile::repeating(a, 1 << 20);
    reader_frees_destination(a, "host, split block", false);
}
