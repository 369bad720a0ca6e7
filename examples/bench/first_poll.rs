//! Async copies never block their executor: how long the first `poll` of an async download and
//! upload takes, per size, beside the whole copy and how many polls it took (each poll does at
//! most one staging chunk of work). Medians of a few runs; every result verified.
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use devalloc::{DeviceAllocator, DEFAULT_ALIGNMENT};

use crate::common::{human, MIB};

/// Times each poll of the future it wraps.
struct Counted<F> {
    inner: Pin<Box<F>>,
    polls: usize,
    first: Duration,
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let t = Instant::now();
        let r = self.inner.as_mut().poll(cx);
        if self.polls == 0 {
            self.first = t.elapsed();
        }
        self.polls += 1;
        r
    }
}

/// (first poll, whole copy, polls) of one run of `fut`.
fn measure<F: Future<Output = devalloc::Result<()>>>(fut: F) -> (Duration, Duration, usize) {
    let t = Instant::now();
    let mut c = Counted { inner: Box::pin(fut), polls: 0, first: Duration::ZERO };
    pollster::block_on(&mut c).expect("async copy");
    (c.first, t.elapsed(), c.polls)
}

fn median<T: Ord + Copy>(mut v: Vec<T>) -> T {
    v.sort_unstable();
    v[v.len() / 2]
}

/// The table for one allocator (device 0), sizes from 1 MiB up to `max`.
pub fn run(label: &str, a: &dyn DeviceAllocator, max: u64, quick: bool) {
    println!(
        "\nasync copies, {label}: the first poll (us), the whole copy (ms) and the polls it took (medians)"
    );
    println!(
        "  {:>6} {:>12} {:>10} {:>7} | {:>12} {:>10} {:>7}",
        "size", "down: first", "whole", "polls", "up: first", "whole", "polls"
    );
    let sizes = [MIB, 16 * MIB, 64 * MIB, 256 * MIB];
    for &n in sizes.iter().take(if quick { 2 } else { 4 }).filter(|&&n| n as u64 <= max) {
        let reps = if n >= 64 * MIB { 3 } else { 7 };
        // Two data sets, alternating: an upload that did nothing leaves the other one, and the
        // download after it (into a cleared buffer) shows it.
        let data: [Vec<u8>; 2] =
            [13u8, 29].map(|k| (0..n).map(|i| (i as u8).wrapping_mul(k) ^ (i >> 16) as u8).collect());
        let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).expect("allocate");
        let mut back = vec![0u8; n];
        let (mut down, mut up) = (Vec::new(), Vec::new());
        for rep in 0..reps {
            let sent = &data[rep % 2];
            up.push(measure(a.copy_host_to_device_async(p, sent, 0)));
            back.fill(0);
            down.push(measure(a.copy_device_to_host_async(&mut back, p, 0)));
            assert!(back == *sent, "{label}: an async round trip of {} differs", human(n));
        }
        a.deallocate(p, 0).expect("free");
        let col = |v: &[(Duration, Duration, usize)]| {
            let first = median(v.iter().map(|x| x.0).collect());
            let whole = median(v.iter().map(|x| x.1).collect());
            let polls = median(v.iter().map(|x| x.2).collect());
            format!("{:>12.1} {:>10.2} {:>7}", first.as_secs_f64() * 1e6, whole.as_secs_f64() * 1e3, polls)
        };
        println!("  {:>6} {} | {}", human(n), col(&down), col(&up));
    }
}
