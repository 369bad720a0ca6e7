//! The browser runs out of memory (WebGPU suite; shared with the page's own check). A real
//! exhaustion cannot be provoked safely, so a fault injector wraps the page's `GPUDevice`:
//! chosen `createBuffer` calls return an invalid buffer and put a `GPUOutOfMemoryError` in
//! the innermost `out-of-memory` error scope pushed around them, as WebGPU specifies for a
//! buffer it could not make. Then:
//! - `allocate_async` is `Error::OutOfMemory` (the cache given back and the exact size tried
//!   once more first, as natively), and leaves the stats as they were;
//! - one refusal then success on the retry is an allocation that works;
//! - `allocate`, which cannot wait, returns; once the verdict is in, the pool no longer counts
//!   it and every use of it (copies, `buffer`, `deallocate`) is `OutOfMemory` naming it.

use devalloc::wgpu::WgpuAllocator;
use devalloc::{DeviceAllocator, Error, DEFAULT_ALIGNMENT};

use super::browser_loss::next_task;

/// The injector (`oom_injector.js`, shared with the page's e2e run), installed once per page.
const INJECTOR: &str = include_str!("oom_injector.js");

fn eval(code: &str) -> wasm_bindgen::JsValue {
    js_sys::eval(code).unwrap_or_else(|e| panic!("{code}: {e:?}"))
}

/// Installs the injector and makes the next `n` buffer creations fail.
fn fail_next(n: u32) {
    eval(INJECTOR);
    eval(&format!("globalThis.__devallocFault.failNext = {n}"));
}

/// Failures injected so far, and those with no out-of-memory scope to catch them.
fn injected() -> (u32, u32) {
    let n = |k: &str| eval(&format!("globalThis.__devallocFault.{k}")).as_f64().unwrap() as u32;
    (n("injected"), n("uncaptured"))
}

fn is_oom(r: &devalloc::Result<impl std::fmt::Debug>) -> bool {
    matches!(r, Err(Error::OutOfMemory { .. }))
}

/// See the module docs. `a` should be fresh: its stats are compared.
pub async fn out_of_memory_in_the_browser(a: &WgpuAllocator) {
    let kept = a.allocate(256, 0, DEFAULT_ALIGNMENT).unwrap();
    let before = a.stats(0).unwrap();
    fail_next(0);
    let (base, _) = injected();

    // The async path: refused twice (the try and the retry): OutOfMemory, stats as they were.
    fail_next(2);
    let r = a.allocate_async(1 << 20, 0, DEFAULT_ALIGNMENT).await;
    assert!(is_oom(&r), "{r:?}");
    let message = r.unwrap_err().to_string();
    assert!(message.contains("out of memory") && message.contains("1048576"), "{message}");
    assert_eq!(injected().0, base + 2, "the try and the one retry");
    assert_eq!(a.stats(0).unwrap(), before, "a failed allocation changes nothing");

    // Refused once, made on the retry: an allocation that works.
    fail_next(1);
    let p = a.allocate_async(4096, 0, DEFAULT_ALIGNMENT).await.expect("the retry makes it");
    a.copy_host_to_device_async(p, &[7u8; 64], 0).await.unwrap();
    let mut back = [0u8; 64];
    a.copy_device_to_host_async(&mut back, p, 0).await.unwrap();
    assert_eq!(back, [7u8; 64]);
    a.deallocate(p, 0).unwrap();
    a.empty_cache();
    let before = a.stats(0).unwrap();

    // The sync path: allocate returns at once; once the verdict is in, the allocation is not
    // counted and every use of it is OutOfMemory naming it.
    fail_next(1);
    let p = a.allocate_labeled(8192, 0, DEFAULT_ALIGNMENT, "doomed").unwrap();
    for _ in 0..50 {
        next_task().await;
        if a.stats(0).unwrap().live_allocations == before.live_allocations {
            break;
        }
    }
    let after = a.stats(0).unwrap();
    assert_eq!(
        (after.live_allocations, after.allocated_bytes),
        (before.live_allocations, before.allocated_bytes)
    );
    assert_eq!(after.reserved_bytes, before.reserved_bytes, "the refused buffer is not counted");
    let write = a.copy_host_to_device_async(p, &[1u8; 16], 0).await;
    assert!(is_oom(&write), "{write:?}");
    let message = write.unwrap_err().to_string();
    assert!(message.contains("'doomed'") && message.contains("8192"), "{message}");
    let mut back = [0u8; 16];
    assert!(is_oom(&a.copy_device_to_host_async(&mut back, p, 0).await));
    assert!(is_oom(&a.buffer(p, 0)), "buffer");
    assert!(is_oom(&a.deallocate(p, 0)), "deallocate");
    assert!(
        matches!(a.deallocate(p, 0), Err(Error::InvalidPointer { .. })),
        "forgotten after its deallocate"
    );
    assert_eq!(injected().1, 0, "every injected failure met an out-of-memory scope");

    // The allocator goes on: the kept allocation and new ones work.
    let q = a.allocate_async(8192, 0, DEFAULT_ALIGNMENT).await.unwrap();
    a.copy_device_to_device_async(q, 0, kept, 0, 256).await.unwrap();
    a.deallocate(q, 0).unwrap();
    a.deallocate(kept, 0).unwrap();
}
