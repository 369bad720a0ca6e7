//! What recording history costs: host alloc + free cycles with history off, off after having
//! been on, and on (interleaved). Off must cost nothing measurable.
use devalloc::{DeviceAllocator, HostAllocator, PoolConfig, DEFAULT_ALIGNMENT};

use crate::common::{interleave, Method};

pub fn run(quick: bool) {
    let config = PoolConfig { caching: true, ..PoolConfig::default() };
    let (off, on) =
        (HostAllocator::with_config(config.clone()).unwrap(), HostAllocator::with_config(config).unwrap());
    on.record_history(4096).unwrap();
    let cycle = |a: &HostAllocator| {
        let p = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
        a.deallocate(p, 0).unwrap();
    };
    let n = if quick { 2_000 } else { 20_000 };
    let mut methods =
        vec![Method::new("history off", || cycle(&off)), Method::new("history on", || cycle(&on)).ours()];
    let t = interleave(&mut methods, n);
    let ns = |i: usize| t.median[i].as_nanos();
    println!(
        "\nhistory (host, 4 KiB alloc + free, cached): off {} ns, on {} ns per cycle; off costs one atomic load per event",
        ns(0),
        ns(1)
    );
}
