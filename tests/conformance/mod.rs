//! The conformance suite: written once, run on every allocator (host, wgpu native and in the
//! browser, CUDA).
//!
//! Each check (in `checks.rs`; history, snapshots and steady state in `memory.rs`) is an
//! `async fn(&dyn DeviceAllocator, DeviceIndex)` that panics on failure. It reads and writes through [`h2d`] / [`d2h`], which alternate between the
//! blocking and the async copies on native (so both are exercised) and use only the async ones
//! in the browser, where nothing may block. `model.rs` is the hostile model check: random
//! sequences of valid and invalid operations against a plain model. [`conformance_tests!`]
//! turns the checks into `#[test]`s (native) or `#[wasm_bindgen_test]`s (wasm) for one
//! allocator factory, run on every device it has.

#[cfg(feature = "wgpu")]
pub mod bind_helper;
#[cfg(feature = "wgpu")]
pub mod bindings;
#[cfg(target_arch = "wasm32")]
pub mod browser_loss;
#[cfg(target_arch = "wasm32")]
pub mod browser_oom;
#[cfg(target_arch = "wasm32")]
pub mod browser_stream;
pub mod checks;
pub mod in_place;
#[cfg(not(target_arch = "wasm32"))]
#[path = "../../examples/support/logging.rs"]
pub mod logging;
pub mod memory;
pub mod model;
pub mod streaming;

use std::sync::atomic::{AtomicUsize, Ordering};

use devalloc::{DeviceAllocator, DeviceIndex, DevicePtr};

/// A fresh allocator, or why none can be made on this machine.
pub type Made = devalloc::BoxFuture<'static, Result<Box<dyn DeviceAllocator>, String>>;

/// Makes a fresh allocator (async: in the browser an adapter can only be opened so).
pub type Factory = fn() -> Made;

/// A [`Made`] from an allocator made without waiting.
pub fn ready<A: DeviceAllocator + 'static>(made: Result<A, impl std::fmt::Display>) -> Made {
    let made = made.map(|a| Box::new(a) as Box<dyn DeviceAllocator>).map_err(|e| e.to_string());
    Box::pin(std::future::ready(made))
}

/// When a missing allocator fails the test rather than skipping it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Always there (host memory).
    Always,
    /// There on CI machines (lavapipe, llvmpipe, the browser's adapter): a failure under
    /// `CI=true`, a skip that says why elsewhere.
    InCi,
    /// Only on some machines (CUDA): a skip that says why, everywhere.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Optional,
}

/// Whether this run is under CI (`CI=true`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Whether the GPU bundle's run asks that every allocator exist (`DEVALLOC_REQUIRE_ALL=1`).
pub fn require_all() -> bool {
    std::env::var("DEVALLOC_REQUIRE_ALL").is_ok_and(|v| v == "1")
}

/// How many devices of `device_type` this machine has, where the run says
/// (`DEVALLOC_EXPECT_CUDA_DEVICES=2`: the GPU bundle sets it from `nvidia-smi -L`).
pub fn expected_devices(device_type: devalloc::DeviceType) -> Option<usize> {
    let name = format!("DEVALLOC_EXPECT_{}_DEVICES", device_type.to_string().to_uppercase());
    std::env::var(name).ok()?.trim().parse().ok()
}

/// Another device of `a` than `i`, for a check's cross-device part; `None` after saying that
/// part did not run. On a machine that should have had a second device (`DEVALLOC_REQUIRE_ALL`
/// and [`expected_devices`] of 2 or more) a missing one is a failure, not a skip.
pub fn other_device(a: &dyn DeviceAllocator, i: DeviceIndex, what: &str) -> Option<DeviceIndex> {
    let n = a.device_count() as DeviceIndex;
    if n >= 2 {
        return Some((i + 1) % n);
    }
    let expected = expected_devices(a.device_type());
    if require_all() && expected.is_some_and(|e| e >= 2) {
        panic!("{what}: this machine has {expected:?} {} devices, the allocator sees {n}", a.device_type());
    }
    skip(what, &format!("{what}: needs two {} devices, the allocator has {n}", a.device_type()));
    None
}

/// Says that a test, or a part of one, did not run, and why: a `SKIPPED <test>: <why>` line on
/// stderr (libtest shows a passing test's stderr only with `--nocapture`) and, on native where
/// `DEVALLOC_SKIP_LOG` names a file, the same line appended to it, so that the run's summary
/// counts and lists every skip (`scripts/test` does, and under CI fails on one it does not
/// expect). The test is named by its libtest thread where there is one (its whole path, as
/// `wgpu::gl::steady_state`, which tells the allocators apart), else by `test`. A skip that
/// cannot be recorded fails the test rather than go unseen.
pub fn skip(test: &str, why: &str) {
    let thread = std::thread::current();
    let test = thread.name().filter(|n| *n != "main").unwrap_or(test);
    // One line each, whatever an error message holds.
    let line = format!("SKIPPED {test}: {}", why.replace('\n', " "));
    eprintln!("{line}");
    #[cfg(not(target_arch = "wasm32"))]
    if let Some(path) = std::env::var_os("DEVALLOC_SKIP_LOG") {
        use std::io::Write;
        // A single write to a file opened for appending: lines of tests running in parallel
        // (threads and processes) never interleave.
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = written {
            panic!("{line}; recording it in DEVALLOC_SKIP_LOG={}: {e}", path.display());
        }
    }
}

/// Whether a factory's allocator caches freed blocks (`PoolOptions::caching`, on by default):
/// what the steady-state checks hold it to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caching {
    /// Freed blocks are cached and reused: the steady-state checks run, and fail if a step that
    /// freed everything left nothing cached.
    On,
    /// Made with caching off: the checks assert that nothing was cached, and skip the steady
    /// state, saying so.
    Off,
}

/// Runs `check` on every device of a fresh allocator from `make` (one that reports no device
/// fails); a missing allocator fails or skips as `need` says.
pub async fn on_every_device<F, Fut>(name: &str, make: Factory, need: Need, check: F)
where
    F: Fn(&'static dyn DeviceAllocator, DeviceIndex) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let alloc: &'static dyn DeviceAllocator = match make().await {
        Ok(a) => Box::leak(a),
        Err(why) => {
            // scripts/gpu/run (the GPU bundle) sets DEVALLOC_REQUIRE_ALL=1: there, every allocator must exist.
            if need == Need::Always || (need == Need::InCi && in_ci()) || require_all() {
                panic!("{name}: no allocator on this machine, and it is required here: {why}");
            }
            skip(name, &format!("did not run: {why}"));
            return;
        }
    };
    // A check that ran on no device would pass having checked nothing.
    assert!(alloc.device_count() > 0, "{name}: the {} allocator reports no device", alloc.device_type());
    for index in 0..alloc.device_count() as DeviceIndex {
        log::info!("{name} on {}:{index}", alloc.device_type());
        check(alloc, index).await;
    }
}

static FLIP: AtomicUsize = AtomicUsize::new(0);

fn use_async() -> bool {
    cfg!(target_arch = "wasm32") || FLIP.fetch_add(1, Ordering::Relaxed) % 2 == 1
}

/// Host -> device, blocking or async (see the module docs).
pub async fn h2d(
    a: &dyn DeviceAllocator,
    dst: DevicePtr,
    src: &[u8],
    i: DeviceIndex,
) -> devalloc::Result<()> {
    if use_async() {
        a.copy_host_to_device_async(dst, src, i).await
    } else {
        a.copy_host_to_device(dst, src, i)
    }
}

/// Device -> host, blocking or async (see the module docs).
pub async fn d2h(
    a: &dyn DeviceAllocator,
    dst: &mut [u8],
    src: DevicePtr,
    i: DeviceIndex,
) -> devalloc::Result<()> {
    if use_async() {
        a.copy_device_to_host_async(dst, src, i).await
    } else {
        a.copy_device_to_host(dst, src, i)
    }
}

/// Device -> device, blocking or async (see the module docs).
pub async fn d2d(
    a: &dyn DeviceAllocator,
    dst: DevicePtr,
    di: DeviceIndex,
    src: DevicePtr,
    si: DeviceIndex,
    n: usize,
) -> devalloc::Result<()> {
    if use_async() {
        a.copy_device_to_device_async(dst, di, src, si, n).await
    } else {
        a.copy_device_to_device(dst, di, src, si, n)
    }
}

/// Reads `len` bytes at `src`.
pub async fn read(a: &dyn DeviceAllocator, src: DevicePtr, len: usize, i: DeviceIndex) -> Vec<u8> {
    let mut v = vec![0u8; len];
    d2h(a, &mut v, src, i).await.unwrap_or_else(|e| panic!("reading {len} bytes at {src}: {e}"));
    v
}

/// A deterministic byte pattern, different per seed: eight bytes per xorshift step (under Miri,
/// which runs the host suites in CI's background, a step per byte made this the most of its
/// 20 minutes).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Small xorshift generator for the randomised checks.
pub struct Rng(pub u64);
impl Rng {
    /// Next value below `n`.
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

/// Emits the suite as tests for one allocator factory: `#[test]` on native, with async checks
/// driven by `pollster`; `#[wasm_bindgen_test]` in the browser. `$caching` ([`Caching`]) says
/// whether the factory's allocator caches, as the steady-state checks need to know.
macro_rules! conformance_tests {
    ($make:expr, $need:expr, $caching:expr) => {
        conformance_tests!(@each $make, $need,
            round_trips, sub_ranges, alignment, stats, bad_inputs, refusals_change_nothing, planned,
            planned_release_frees_all_after_a_failure, device_to_device, foreign_pointers_on_either_end,
            raii_buffer, history_and_snapshot, streaming, fill_in_place);
        conformance_tests!(@caching $make, $need, $caching, steady_state, repeating_sizes_far_apart);
        #[cfg(not(target_arch = "wasm32"))]
        #[test]
        fn threads() {
            conformance::logging::init_for_tests();
            pollster::block_on(conformance::on_every_device("threads", $make, $need, conformance::checks::threads));
        }
    };
    (@each $make:expr, $need:expr, $($name:ident),*) => {
        $(
            #[cfg(not(target_arch = "wasm32"))]
            #[test]
            fn $name() {
                conformance::logging::init_for_tests();
                pollster::block_on(conformance::on_every_device(stringify!($name), $make, $need, conformance::checks::$name));
            }
            #[cfg(target_arch = "wasm32")]
            #[wasm_bindgen_test::wasm_bindgen_test]
            async fn $name() {
                conformance::on_every_device(stringify!($name), $make, $need, conformance::checks::$name).await;
            }
        )*
    };
    (@caching $make:expr, $need:expr, $caching:expr, $($name:ident),*) => {
        $(
            #[cfg(not(target_arch = "wasm32"))]
            #[test]
            fn $name() {
                conformance::logging::init_for_tests();
                let check = |a, i| conformance::checks::$name(a, i, $caching);
                pollster::block_on(conformance::on_every_device(stringify!($name), $make, $need, check));
            }
            #[cfg(target_arch = "wasm32")]
            #[wasm_bindgen_test::wasm_bindgen_test]
            async fn $name() {
                let check = |a, i| conformance::checks::$name(a, i, $caching);
                conformance::on_every_device(stringify!($name), $make, $need, check).await;
            }
        )*
    };
}

/// Polls `fut` to the end by hand, as an executor would, and returns its output and how many
/// times it was `Pending`. After every `Pending`, `settle` runs: a wgpu test waits there until
/// the device has finished everything asked of it (`device.poll(PollType::wait_indefinitely())`),
/// the case where a copy that never yields would do all its work in one poll; host memory has
/// no device, nothing to settle. Then the next poll waits for the future to wake its waker: a
/// `Pending` that nothing wakes within 30 s is a lost wake-up, and fails.
#[cfg(not(target_arch = "wasm32"))]
pub fn polls_until_ready<F: std::future::Future>(fut: F, mut settle: impl FnMut()) -> (F::Output, usize) {
    use std::sync::{Arc, Condvar, Mutex};
    use std::task::{Context, Poll, Wake, Waker};
    /// Whether the future woke its waker since it was last polled.
    #[derive(Default)]
    struct Woken(Mutex<bool>, Condvar);
    impl Wake for Woken {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            *self.0.lock().unwrap() = true;
            self.1.notify_all();
        }
    }
    let woken = Arc::new(Woken::default());
    let waker = Waker::from(Arc::clone(&woken));
    let mut fut = std::pin::pin!(fut);
    let mut pending = 0;
    loop {
        *woken.0.lock().unwrap() = false;
        if let Poll::Ready(v) = fut.as_mut().poll(&mut Context::from_waker(&waker)) {
            return (v, pending);
        }
        pending += 1;
        settle();
        let limit = std::time::Duration::from_secs(30);
        let (_woken, waited) = woken.1.wait_timeout_while(woken.0.lock().unwrap(), limit, |w| !*w).unwrap();
        assert!(!waited.timed_out(), "Pending (poll {pending}) and not woken within 30 s: a lost wake-up");
    }
}
