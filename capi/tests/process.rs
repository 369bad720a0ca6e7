//! The C ABI where a fresh process is the point: what `devalloc_log_to_stderr` writes to the
//! process's stderr, several threads installing the logger at once, and `devalloc_open` racing
//! `devalloc_open_available` while nothing is open yet (the two fixes of the C ABI's hostile
//! review). Each test runs itself again as a child process (this test binary, that one test,
//! with libtest's capture off so that stderr is the process's own) and checks what the child
//! wrote and how it ended.
#![allow(unsafe_code)] // calls the extern "C" functions, which take raw pointers
#![allow(clippy::undocumented_unsafe_blocks)] // every pointer passed below is a live local

use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Barrier;

use devalloc_c::raw::{RawDeviceType, RawLogLevel};
use devalloc_c::*;

const OK: DevallocStatus = DevallocStatus::Ok;
/// Set in the child: the test it runs.
const CHILD: &str = "DEVALLOC_CAPI_CHILD";

/// Whether this process is the child running `test`.
fn is_child(test: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|t| t == test)
}

/// Runs `test` alone in a child process and returns its output, having checked it passed.
fn child(test: &str) -> Output {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, test)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(out.status.success(), "the child running {test} failed: {}", text(&out));
    out
}

fn text(out: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The log at a level on stderr: what the level lets through appears there, in the logger's
/// `[LEVEL target] message` form, and nothing of it on stdout; what it holds back, and
/// everything once the log is off, appears nowhere. devalloc's own records (a panic caught at
/// the boundary, at ERROR) come through as the program's do.
#[test]
#[cfg_attr(miri, ignore = "runs a child process")]
fn the_log_goes_to_stderr_at_a_level() {
    const TEST: &str = "the_log_goes_to_stderr_at_a_level";
    if is_child(TEST) {
        assert_eq!(devalloc_log_to_stderr(RawLogLevel(6)), DevallocStatus::InvalidArgument);
        assert_eq!(devalloc_log_to_stderr(RawLogLevel(-1)), DevallocStatus::InvalidArgument);
        assert_eq!(devalloc_log_to_stderr(DevallocLogLevel::Error.into()), OK);
        log::error!(target: "c-program", "mark-1 an error");
        log::warn!(target: "c-program", "mark-2 a warning below the level");
        assert_eq!(devalloc_selftest_panic(), DevallocStatus::Internal);
        assert_eq!(devalloc_log_to_stderr(DevallocLogLevel::Warn.into()), OK);
        log::warn!(target: "c-program", "mark-3 a warning at the level");
        log::info!(target: "c-program", "mark-4 news below the level");
        assert_eq!(devalloc_log_to_stderr(DevallocLogLevel::Off.into()), OK);
        log::error!(target: "c-program", "mark-5 an error with the log off");
        return;
    }
    let out = child(TEST);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    for shown in [
        "[ERROR c-program] mark-1 an error",
        "[ERROR devalloc_c::status] devalloc: a panic was caught at the C boundary in devalloc_selftest_panic",
        "[WARN c-program] mark-3 a warning at the level",
    ] {
        assert!(stderr.contains(shown), "stderr lacks {shown:?}: {}", text(&out));
    }
    for held in ["mark-2", "mark-4", "mark-5"] {
        assert!(!stderr.contains(held), "{held} is below the level or the log is off: {}", text(&out));
    }
    assert!(!stdout.contains("mark-"), "the log reached stdout: {}", text(&out));
}

/// Eight threads of a fresh process set the log's level at once: every one succeeds (the logger
/// is installed once, under a lock: threads at once used to get NOT_SUPPORTED), and the log
/// then reaches stderr.
#[test]
#[cfg_attr(miri, ignore = "runs a child process")]
fn threads_send_the_log_to_stderr_at_once() {
    const TEST: &str = "threads_send_the_log_to_stderr_at_once";
    const THREADS: usize = 7;
    if is_child(TEST) {
        // The threads spin until all are there, and this one joins them as it lets them go, so
        // that the calls come as close together as the cores allow.
        let (ready, go) = (AtomicUsize::new(0), AtomicBool::new(false));
        let statuses: Vec<DevallocStatus> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (ready, go) = (&ready, &go);
                    s.spawn(move || {
                        ready.fetch_add(1, Ordering::SeqCst);
                        while !go.load(Ordering::Acquire) {
                            std::hint::spin_loop();
                        }
                        devalloc_log_to_stderr(RawLogLevel(1 + t as i32 % 5))
                    })
                })
                .collect();
            while ready.load(Ordering::SeqCst) < THREADS {
                std::hint::spin_loop();
            }
            go.store(true, Ordering::Release);
            let mine = devalloc_log_to_stderr(DevallocLogLevel::Warn.into());
            hs.into_iter().map(|h| h.join().unwrap()).chain([mine]).collect()
        });
        assert!(statuses.iter().all(|&s| s == OK), "{statuses:?}");
        assert_eq!(devalloc_log_to_stderr(DevallocLogLevel::Warn.into()), OK);
        log::warn!(target: "c-program", "mark-after-the-race");
        return;
    }
    // Fifty fresh processes: the race is in the first install, once per process. With the
    // install unlocked (as before the fix), about one process in eleven saw NOT_SUPPORTED on the
    // 2-core machine, so fifty miss it about once in a hundred runs.
    for _ in 0..50 {
        let out = child(TEST);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("[WARN c-program] mark-after-the-race"), "{}", text(&out));
    }
}

/// The device types a C program may open here (WebGPU exists only in the browser).
const TYPES: [DevallocDeviceType; 6] = [
    DevallocDeviceType::Cpu,
    DevallocDeviceType::Cuda,
    DevallocDeviceType::Vulkan,
    DevallocDeviceType::Metal,
    DevallocDeviceType::Dx12,
    DevallocDeviceType::Gl,
];

/// In a fresh process, threads open each device type while others open every available one, all
/// at once: no call fails but for a device type this machine lacks (`NOT_FOUND`, never
/// `INTERNAL`: they used to race past the registry's lock), every `devalloc_open_available`
/// returns the same mask, a type opens exactly where that mask has it, and each open type
/// then serves an allocation.
#[test]
#[cfg_attr(miri, ignore = "runs a child process and opens drivers")]
fn open_races_open_available() {
    const TEST: &str = "open_races_open_available";
    if is_child(TEST) {
        let barrier = Barrier::new(12);
        let (opened, masks): (Vec<_>, Vec<_>) = std::thread::scope(|s| {
            let hs: Vec<_> = (0..12usize)
                .map(|t| {
                    let barrier = &barrier;
                    s.spawn(move || {
                        barrier.wait();
                        if t % 2 == 0 {
                            let ty = TYPES[(t / 2) % TYPES.len()];
                            (Some((ty, devalloc_open(ty.into()))), None)
                        } else {
                            let mut mask = 0u32;
                            let status = unsafe { devalloc_open_available(&mut mask) };
                            (None, Some((status, mask)))
                        }
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).unzip()
        });
        let masks: Vec<(DevallocStatus, u32)> = masks.into_iter().flatten().collect();
        let mask = masks[0].1;
        assert!(masks.iter().all(|&m| m == (OK, mask)), "devalloc_open_available: {masks:?}");
        assert_ne!(mask & 1, 0, "CPU is always there: {mask:#b}");
        for (ty, status) in opened.into_iter().flatten() {
            let want = if mask & (1 << ty as u32) != 0 { OK } else { DevallocStatus::NotFound };
            assert_eq!(status, want, "devalloc_open({ty:?}) beside devalloc_open_available (mask {mask:#b})");
        }
        for ty in TYPES.into_iter().filter(|&ty| mask & (1 << ty as u32) != 0) {
            let (mut count, mut p) = (0u32, 0u64);
            assert_eq!(unsafe { devalloc_device_count(ty.into(), &mut count) }, OK, "{ty:?}");
            assert!(count >= 1, "{ty:?}");
            assert_eq!(unsafe { devalloc_allocate(ty.into(), 0, 64, 64, &mut p) }, OK, "{ty:?}");
            assert_eq!(devalloc_deallocate(ty.into(), 0, p), OK, "{ty:?}");
        }
        println!("open_races_open_available: mask {mask:#b}");
        return;
    }
    // Five times: each child is a fresh process, where nothing is open when the threads start.
    for _ in 0..5 {
        let out = child(TEST);
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("open_races_open_available: mask"),
            "{}",
            text(&out)
        );
    }
}

/// `devalloc_shutdown` in a fresh process: it frees what is still live (the log names each
/// leak), closes every allocator (later calls are `NOT_FOUND`, naming `devalloc_open`), and a
/// type opens again afterwards, fresh (its old addresses are foreign to it). Vulkan too where
/// lavapipe or a GPU is (under CI it must be), where a CPU address passed to Vulkan is named as
/// CPU's. Threads allocating and copying while another shuts down and opens again (at least 50
/// times, and until they got through 100 times) see `OK`,
/// `NOT_FOUND` or `INVALID_POINTER` (an address of the allocator closed under them), never a
/// crash or `INTERNAL`.
#[test]
#[cfg_attr(miri, ignore = "runs a child process and opens drivers")]
fn shutdown_frees_closes_and_opens_again() {
    const TEST: &str = "shutdown_frees_closes_and_opens_again";
    let cpu = RawDeviceType::from(DevallocDeviceType::Cpu);
    let vulkan = RawDeviceType::from(DevallocDeviceType::Vulkan);
    if is_child(TEST) {
        assert_eq!(devalloc_log_to_stderr(DevallocLogLevel::Warn.into()), OK);
        assert_eq!(devalloc_shutdown(), OK, "nothing open yet");
        assert_eq!(devalloc_open(cpu), OK);
        let (mut kept, mut left, mut stats) = (0u64, 0u64, DevallocStats::default());
        assert_eq!(unsafe { devalloc_allocate(cpu, 0, 4096, 64, &mut kept) }, OK);
        assert_eq!(
            unsafe { devalloc_allocate_labeled(cpu, 0, 1000, 64, c"left behind".as_ptr(), &mut left) },
            OK
        );
        assert_eq!(devalloc_deallocate(cpu, 0, kept), OK);
        let with_vulkan = devalloc_open(vulkan) == OK;
        if with_vulkan {
            let mut v = 0u64;
            assert_eq!(unsafe { devalloc_allocate(vulkan, 0, 1 << 20, 256, &mut v) }, OK);
            // A CPU address given to Vulkan: refused, and named as CPU's.
            assert_eq!(devalloc_deallocate(vulkan, 0, left), DevallocStatus::InvalidPointer);
            let said = last_error();
            assert!(said.contains("cpu:0") && said.contains("DEVALLOC_DEVICE_TYPE_CPU"), "{said}");
            let mut byte = [0u8; 1];
            let status =
                unsafe { devalloc_copy_device_to_host(vulkan, 0, byte.as_mut_ptr().cast(), left, 1) };
            assert_eq!(status, DevallocStatus::InvalidPointer);
            assert!(last_error().contains("cpu:0"), "{}", last_error());
        } else {
            assert!(std::env::var("CI").is_err(), "under CI Vulkan (lavapipe) must open: {}", last_error());
            println!("SKIPPED the Vulkan part: no Vulkan adapter here ({})", last_error());
        }
        assert_eq!(devalloc_shutdown(), OK);
        for t in [cpu, vulkan] {
            assert_eq!(unsafe { devalloc_stats(t, 0, &mut stats) }, DevallocStatus::NotFound);
            assert!(last_error().contains("devalloc_open"), "{}", last_error());
        }
        assert_eq!(devalloc_deallocate(cpu, 0, left), DevallocStatus::NotFound);
        assert_eq!(devalloc_shutdown(), OK, "a second shutdown");
        // Open again: a fresh allocator, to which the old address is foreign.
        assert_eq!(devalloc_open(cpu), OK);
        assert_eq!(unsafe { devalloc_stats(cpu, 0, &mut stats) }, OK);
        assert_eq!((stats.allocated_bytes, stats.live_allocations, stats.allocations), (0, 0, 0));
        assert_eq!(devalloc_deallocate(cpu, 0, left), DevallocStatus::InvalidPointer);
        if with_vulkan {
            let mut v = 0u64;
            assert_eq!(devalloc_open(vulkan), OK, "{}", last_error());
            assert_eq!(unsafe { devalloc_allocate(vulkan, 0, 4096, 256, &mut v) }, OK);
            assert_eq!(
                unsafe { devalloc_copy_host_to_device(vulkan, 0, v, b"again".as_ptr().cast(), 5) },
                OK
            );
            let mut back = [0u8; 5];
            assert_eq!(
                unsafe { devalloc_copy_device_to_host(vulkan, 0, back.as_mut_ptr().cast(), v, 5) },
                OK
            );
            assert_eq!(&back, b"again");
        }
        // Threads at work while the main thread closes and opens CPU, again and again.
        let (stop, oks) = (AtomicBool::new(false), AtomicUsize::new(0));
        let seen = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let mut statuses = Vec::new();
                        while !stop.load(Ordering::Relaxed) {
                            let mut p = 0u64;
                            let a = unsafe { devalloc_allocate(cpu, 0, 256, 64, &mut p) };
                            statuses.push(a);
                            if a == OK {
                                oks.fetch_add(1, Ordering::Relaxed);
                                let c = unsafe {
                                    devalloc_copy_host_to_device(cpu, 0, p, b"x".as_ptr().cast(), 1)
                                };
                                statuses.extend([c, devalloc_deallocate(cpu, 0, p)]);
                            }
                        }
                        statuses
                    })
                })
                .collect();
            // At least 50 rounds, and until the workers got through 100 times (on a loaded
            // machine they may not run at all during the first rounds).
            let start = std::time::Instant::now();
            let mut rounds = 0;
            while rounds < 50 || oks.load(Ordering::Relaxed) < 100 {
                assert!(
                    start.elapsed().as_secs() < 120,
                    "the workers got through {} times",
                    oks.load(Ordering::Relaxed)
                );
                assert_eq!(devalloc_shutdown(), OK);
                assert_eq!(devalloc_open(cpu), OK);
                std::thread::yield_now();
                rounds += 1;
            }
            stop.store(true, Ordering::Relaxed);
            workers.into_iter().flat_map(|w| w.join().unwrap()).collect::<Vec<_>>()
        });
        let allowed = [OK, DevallocStatus::NotFound, DevallocStatus::InvalidPointer];
        assert!(seen.iter().all(|s| allowed.contains(s)), "{:?}", seen.iter().find(|s| !allowed.contains(s)));
        assert_eq!(devalloc_shutdown(), OK);
        println!("shutdown: {} worker calls, vulkan {with_vulkan}", seen.len());
        return;
    }
    let out = child(TEST);
    let err = String::from_utf8_lossy(&out.stderr);
    // The leak is reported, by label, when shutdown frees it.
    assert!(err.contains("leak on cpu:0: 1000 bytes") && err.contains("(left behind)"), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("shutdown: "), "{}", text(&out));
}

fn last_error() -> String {
    unsafe { std::ffi::CStr::from_ptr(devalloc_last_error()) }.to_string_lossy().into_owned()
}
