//! The pipeline against a fake device: a DMA engine thread that runs queued copies in order,
//! late, and checks that no buffer is ever touched by the host while a DMA uses it.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::*;
use crate::device::DeviceType;

const DEV: Device = Device::new(DeviceType::Cuda, 0);

/// A device with one DMA queue; buffers are the "pinned" host buffers.
struct FakeDevice {
    memory: Mutex<Vec<u8>>,
    bufs: Vec<Mutex<Vec<u8>>>,
    /// Which chunk each buffer holds (filled for, or downloaded into).
    holds: Vec<Mutex<Option<usize>>>,
    /// DMAs queued and not yet done, per buffer.
    pending: Vec<AtomicUsize>,
    done: (Mutex<()>, Condvar),
    trouble: Mutex<Vec<String>>,
}

enum Op {
    Up(usize, usize, Range<usize>),
    Down(usize, usize, Range<usize>),
}

struct Fake {
    dev: Arc<FakeDevice>,
    engine: Mutex<mpsc::Sender<Op>>,
    chunks: Vec<Range<usize>>,
    src: Vec<u8>,
    dst: Mutex<Vec<u8>>,
    last_queued: Mutex<Option<usize>>,
    fail_host: Option<usize>,
    fail_queue: Option<usize>,
}

impl FakeDevice {
    fn note(&self, s: String) {
        self.trouble.lock().unwrap().push(s);
    }
}

fn engine(dev: Arc<FakeDevice>, ops: mpsc::Receiver<Op>, seed: u64) {
    let mut x = seed | 1;
    for op in ops {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        std::thread::sleep(Duration::from_micros(x % 300));
        let b = match op {
            Op::Up(j, b, r) => {
                if *dev.holds[b].lock().unwrap() != Some(j) {
                    dev.note(format!("DMA of chunk {j} read buffer {b}, which does not hold it"));
                }
                let len = r.len();
                dev.memory.lock().unwrap()[r].copy_from_slice(&dev.bufs[b].lock().unwrap()[..len]);
                b
            }
            Op::Down(j, b, r) => {
                let len = r.len();
                dev.bufs[b].lock().unwrap()[..len].copy_from_slice(&dev.memory.lock().unwrap()[r]);
                *dev.holds[b].lock().unwrap() = Some(j);
                b
            }
        };
        let _g = dev.done.0.lock().unwrap();
        dev.pending[b].fetch_sub(1, Ordering::SeqCst);
        dev.done.1.notify_all();
    }
}

impl Stages for Fake {
    fn host(&self, j: usize, b: usize) -> Result<()> {
        if self.fail_host == Some(j) {
            return Err(Error::backend(DEV, format!("host side of chunk {j} failed")));
        }
        if self.dev.pending[b].load(Ordering::SeqCst) != 0 {
            self.dev.note(format!("host touched buffer {b} (chunk {j}) while a DMA used it"));
        }
        let r = self.chunks[j].clone();
        let len = r.len();
        let mut buf = self.dev.bufs[b].lock().unwrap();
        match self.src.is_empty() {
            false => {
                buf[..len].copy_from_slice(&self.src[r]);
                *self.dev.holds[b].lock().unwrap() = Some(j);
            }
            true => {
                if *self.dev.holds[b].lock().unwrap() != Some(j) {
                    self.dev.note(format!("copied chunk {j} out of buffer {b}, which does not hold it"));
                }
                self.dst.lock().unwrap()[r].copy_from_slice(&buf[..len]);
            }
        }
        Ok(())
    }

    fn wait(&self, b: usize) -> Result<()> {
        let mut g = self.dev.done.0.lock().unwrap();
        while self.dev.pending[b].load(Ordering::SeqCst) != 0 {
            g = self.dev.done.1.wait(g).unwrap();
        }
        Ok(())
    }

    fn queue(&self, j: usize, b: usize) -> Result<()> {
        if self.fail_queue == Some(j) {
            return Err(Error::backend(DEV, format!("queueing chunk {j} failed")));
        }
        let mut last = self.last_queued.lock().unwrap();
        if *last != j.checked_sub(1) {
            self.dev.note(format!("chunk {j} queued after {last:?}"));
        }
        *last = Some(j);
        self.dev.pending[b].fetch_add(1, Ordering::SeqCst);
        let r = self.chunks[j].clone();
        let op = if self.src.is_empty() { Op::Down(j, b, r) } else { Op::Up(j, b, r) };
        self.engine.lock().unwrap().send(op).unwrap();
        Ok(())
    }
}

fn chunks(len: usize, seed: usize) -> Vec<Range<usize>> {
    let (mut at, mut out, mut k) = (0, Vec::new(), seed);
    while at < len {
        k = k.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let n = (1 + (k >> 33) % 5000).min(len - at);
        out.push(at..at + n);
        at += n;
    }
    out
}

/// Runs one copy of `len` bytes through `n` buffers on `threads` threads; returns the result,
/// what ended up where it was sent, what was sent, and any trouble the fake saw.
fn copy(
    way: Way,
    len: usize,
    n: usize,
    threads: usize,
    fail: (Option<usize>, Option<usize>),
    seed: usize,
) -> (Result<()>, bool, Vec<String>) {
    let data: Vec<u8> = (0..len).map(|i| (i * 31 + seed) as u8).collect();
    let chunks = chunks(len, seed);
    let max = chunks.iter().map(Range::len).max().unwrap_or(0);
    let dev = Arc::new(FakeDevice {
        memory: Mutex::new(if way == Way::Down { data.clone() } else { vec![0; len] }),
        bufs: (0..n).map(|_| Mutex::new(vec![0; max])).collect(),
        holds: (0..n).map(|_| Mutex::new(None)).collect(),
        pending: (0..n).map(|_| AtomicUsize::new(0)).collect(),
        done: (Mutex::new(()), Condvar::new()),
        trouble: Mutex::new(Vec::new()),
    });
    let (tx, rx) = mpsc::channel();
    let d = Arc::clone(&dev);
    let dma = std::thread::spawn(move || engine(d, rx, seed as u64));
    let fake = Fake {
        dev: Arc::clone(&dev),
        engine: Mutex::new(tx),
        src: if way == Way::Up { data.clone() } else { Vec::new() },
        dst: Mutex::new(vec![0; len]),
        last_queued: Mutex::new(None),
        fail_host: fail.0,
        fail_queue: fail.1,
        chunks,
    };
    let pool = rayon::ThreadPoolBuilder::new().num_threads(4).build().unwrap();
    let r = run(way, fake.chunks.len(), n, &pool, threads, &fake, DEV);
    // As the lease does: wait for whatever is still queued before looking.
    (0..n).for_each(|b| fake.wait(b).unwrap());
    let ok = match way {
        Way::Up => *dev.memory.lock().unwrap() == data,
        Way::Down => *fake.dst.lock().unwrap() == data,
    };
    drop(fake);
    dma.join().unwrap();
    let trouble = dev.trouble.lock().unwrap().clone();
    (r, ok, trouble)
}

/// `copy` on another thread, failing if it does not return in time (a hang is a failure).
fn copy_in_time(
    way: Way,
    len: usize,
    n: usize,
    threads: usize,
    fail: (Option<usize>, Option<usize>),
    seed: usize,
) -> (Result<()>, bool, Vec<String>) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(copy(way, len, n, threads, fail, seed)).unwrap());
    rx.recv_timeout(Duration::from_secs(60)).expect("the pipeline hung")
}

#[test]
fn every_byte_arrives_and_no_buffer_is_touched_while_a_dma_uses_it() {
    for way in [Way::Up, Way::Down] {
        for (n, threads) in [(2, 4), (3, 2), (6, 4), (4, 1), (2, 1), (5, 8)] {
            for (seed, len) in [(1, 0), (2, 1), (3, 4999), (4, 60_000), (5, 150_001)] {
                let (r, ok, trouble) = copy_in_time(way, len, n, threads, (None, None), seed);
                let what = format!("{way:?} {len} bytes, {n} buffers, {threads} threads");
                assert!(r.is_ok(), "{what}: {:?}", r.err());
                assert!(trouble.is_empty(), "{what}: {trouble:?}");
                assert!(ok, "{what}: the data differ");
            }
        }
    }
}

#[test]
fn a_failure_anywhere_stops_the_copy_and_every_thread_returns() {
    for way in [Way::Up, Way::Down] {
        for threads in [1, 4] {
            for fail in [(Some(0), None), (Some(7), None), (None, Some(0)), (None, Some(9))] {
                let (r, _, trouble) = copy_in_time(way, 100_000, 3, threads, fail, 11);
                let what = format!("{way:?}, {threads} threads, failing at {fail:?}");
                let e = r.expect_err(&what);
                assert!(e.to_string().contains("failed"), "{what}: {e}");
                assert!(trouble.is_empty(), "{what}: {trouble:?}");
            }
        }
    }
}

#[test]
fn a_step_that_panics_fails_the_copy_instead_of_hanging() {
    struct Panics;
    impl Stages for Panics {
        fn host(&self, j: usize, _b: usize) -> Result<()> {
            if j == 3 {
                // A panic that prints nothing (the hook is not run): this test's, on purpose.
                std::panic::resume_unwind(Box::new("a bug in chunk 3"));
            }
            Ok(())
        }
        fn wait(&self, _b: usize) -> Result<()> {
            Ok(())
        }
        fn queue(&self, _j: usize, _b: usize) -> Result<()> {
            Ok(())
        }
    }
    for (way, threads) in [(Way::Up, 4), (Way::Down, 4), (Way::Up, 1), (Way::Down, 1)] {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(4).build().unwrap();
            tx.send(run(way, 10, 3, &pool, threads, &Panics, DEV)).unwrap();
        });
        let r = rx.recv_timeout(Duration::from_secs(30)).expect("the pipeline hung after a panic");
        let e = r.expect_err("a panic is an error");
        assert!(e.to_string().contains("panicked"), "{e}");
    }
}
