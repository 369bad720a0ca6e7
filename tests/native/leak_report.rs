//! The leak report an allocator logs when it is dropped with allocations live, read back from
//! the log. A process has one logger, and this binary's other tests install `env_logger` first,
//! so each test here runs itself again as a child process (this test binary, this one test):
//! there a logger that keeps every record is the process's logger; the child drops an
//! allocator holding a labelled allocation and writes the records to a file, which the parent
//! reads and checks for a warning naming the allocation (its device, size, address and label).

use std::sync::Mutex;

use devalloc::{DeviceAllocator, HostAllocator, DEFAULT_ALIGNMENT};

/// Set in the child: the name of the test it runs.
const CHILD: &str = "DEVALLOC_LEAK_REPORT_CHILD";
/// Set in the child: where it writes the records it kept.
const OUT: &str = "DEVALLOC_LEAK_REPORT_OUT";

/// A logger that keeps every record as `LEVEL target: message`.
struct Keep(Mutex<Vec<String>>);

impl log::Log for Keep {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        let line = format!("{} {}: {}", r.level(), r.target(), r.args());
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    }
    fn flush(&self) {}
}

static KEPT: Keep = Keep(Mutex::new(Vec::new()));

/// Runs `body` in a child process running the test `name` alone, and returns what `body`
/// returned there (a line: here the leaked address) and the log records the child kept.
/// In the child itself (the environment says so), runs `body` with the keeping logger
/// installed, writes the line and the records, and returns `None`.
fn in_child(name: &str, body: impl FnOnce() -> String) -> Option<(String, Vec<String>)> {
    if std::env::var(CHILD).is_ok_and(|n| n == name) {
        log::set_logger(&KEPT).expect("the child's first logger");
        log::set_max_level(log::LevelFilter::Trace);
        let line = body();
        let kept = KEPT.0.lock().unwrap().join("\n");
        std::fs::write(std::env::var(OUT).unwrap(), format!("{line}\n{kept}\n")).unwrap();
        return None;
    }
    let out = std::env::temp_dir().join(format!("devalloc-leak-report-{}-{name}.log", std::process::id()));
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--test-threads=1"])
        .env(CHILD, name)
        .env(OUT, &out)
        .output()
        .unwrap();
    let text = std::fs::read_to_string(&out).unwrap_or_else(|e| {
        panic!(
            "the child running {name} wrote no records ({e}); it said: {}{}",
            String::from_utf8_lossy(&child.stdout),
            String::from_utf8_lossy(&child.stderr)
        )
    });
    std::fs::remove_file(&out).unwrap();
    assert!(child.status.success(), "the child running {name}: {}", String::from_utf8_lossy(&child.stdout));
    let mut lines = text.lines().map(str::to_owned);
    let line = lines.next().unwrap_or_default();
    Some((line, lines.collect()))
}

/// The name libtest gives the test function `f` of this module (`contract::leak_report::f`:
/// the module's path without the crate's name).
fn this_test(f: &str) -> String {
    let path = module_path!();
    format!("{}::{f}", path.split_once("::").map_or(path, |(_, rest)| rest))
}

/// Checks that `records` hold the drop-time report of `device` for one leaked allocation of
/// 4096 bytes labelled `kv-cache` at `addr`, as warnings.
fn names_the_leak(records: &[String], device: &str, addr: &str) {
    let all = records.join("\n");
    let summary = format!("devalloc: {device} dropped with 1 live allocation(s), 4096 bytes; freeing them");
    let leak = format!("devalloc: leak on {device}: 4096 bytes at {addr} (kv-cache)");
    for want in [summary, leak] {
        assert!(
            records.iter().any(|r| r.starts_with("WARN ") && r.ends_with(&want)),
            "no warning \"{want}\" in the records the drop logged:\n{all}"
        );
    }
}

#[test]
#[cfg_attr(miri, ignore = "runs a child process")]
fn a_host_allocator_dropped_with_a_live_allocation_reports_it() {
    let Some((addr, records)) =
        in_child(&this_test("a_host_allocator_dropped_with_a_live_allocation_reports_it"), || {
            let a = HostAllocator::new();
            let p = a.allocate_labeled(4096, 0, DEFAULT_ALIGNMENT, "kv-cache").unwrap();
            drop(a);
            format!("{:#x}", p.addr())
        })
    else {
        return;
    };
    names_the_leak(&records, "cpu:0", &addr);
}

/// The same on Vulkan (lavapipe in CI): the pool under a `WgpuAllocator` reports it on drop.
#[cfg(feature = "wgpu")]
#[test]
#[cfg_attr(miri, ignore = "runs a child process")]
fn a_vulkan_allocator_dropped_with_a_live_allocation_reports_it() {
    use devalloc::wgpu::{WgpuAllocator, WgpuOptions};
    let Some((addr, records)) =
        in_child(&this_test("a_vulkan_allocator_dropped_with_a_live_allocation_reports_it"), || {
            match WgpuAllocator::with_options(wgpu::Backend::Vulkan, WgpuOptions::default()) {
                Ok(a) => {
                    let p = a.allocate_labeled(4096, 0, DEFAULT_ALIGNMENT, "kv-cache").unwrap();
                    drop(a);
                    format!("{:#x}", p.addr())
                }
                Err(e) => format!("none: {e}"),
            }
        })
    else {
        return;
    };
    if let Some(why) = addr.strip_prefix("none: ") {
        assert!(!crate::conformance::in_ci(), "no Vulkan adapter under CI: {why}");
        crate::conformance::skip("leak report on Vulkan", &format!("no Vulkan adapter: {why}"));
        return;
    }
    names_the_leak(&records, "vulkan:0", &addr);
}
