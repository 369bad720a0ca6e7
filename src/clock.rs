//! The crate's clock, at the bottom of its layers: the planner's deadlines, the wgpu backend's
//! waits, the pool's history and the snapshot's timestamps read it, and it imports nothing from
//! the crate.

/// Microseconds since the first call in this process.
#[cfg(native)]
pub(crate) fn now_us() -> u64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// Microseconds since the first call in this process (the page's clock in the browser).
#[cfg(web)]
pub(crate) fn now_us() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static START: AtomicU64 = AtomicU64::new(0);
    let now = (js_sys::Date::now() * 1000.0) as u64;
    let start = match START.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => now,
        Err(s) => s,
    };
    now.saturating_sub(start)
}
