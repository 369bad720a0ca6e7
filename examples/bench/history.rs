//! What recording history costs: host alloc + free cycles with history off, off after having
//! been on (the same code path: the difference between the two is the run's noise), and on,
//! interleaved.
use devalloc::{DeviceAllocator, HostAllocator, PoolOptions, DEFAULT_ALIGNMENT};

use crate::common::{interleave, Method};

pub fn run(quick: bool) {
    let config = PoolOptions { caching: true, ..PoolOptions::default() };
    let make = || HostAllocator::with_options(config.clone()).unwrap();
    let (off, was_on, on) = (make(), make(), make());
    was_on.record_history(4096).unwrap();
    was_on.record_history(0).unwrap();
    on.record_history(4096).unwrap();
    let cycle = |a: &HostAllocator| {
        let p = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
        a.deallocate(p, 0).unwrap();
    };
    let n = if quick { 2_000 } else { 20_000 };
    let mut methods = vec![
        Method::new("history off", || cycle(&off)),
        Method::new("off after on", || cycle(&was_on)),
        Method::new("history on", || cycle(&on)).ours(),
    ];
    let t = interleave(&mut methods, n);
    let ns = |i: usize| t.median[i].as_nanos();
    println!(
        "\nhistory (host, 4 KiB alloc + free, cached; medians of {n} interleaved cycles): off {} ns, off after on {} ns, on {} ns",
        ns(0),
        ns(1),
        ns(2)
    );
    println!(
        "  off vs off after on: {:.2}x (the noise of this run); on costs {:.2}x off. Off adds one relaxed atomic load per event.",
        t.median[0].as_secs_f64() / t.median[1].as_secs_f64(),
        t.median[2].as_secs_f64() / t.median[0].as_secs_f64()
    );
}
