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

use devalloc::snapshot::TensorNote;
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

/// Lets the browser's verdicts in: tasks until `done` (which may look at devalloc), at most
/// 200 of them.
async fn settle(mut done: impl FnMut() -> bool) {
    for _ in 0..200 {
        if done() {
            return;
        }
        next_task().await;
    }
}

/// A hostile review's cases (see the module docs for the promise): a refused buffer freed
/// before its verdict is never served from the cache; a read started before the verdict never
/// returns what staging held from another allocation; `label_tensors` and the snapshot's
/// planned buffers know a refusal. `a` should be fresh.
pub async fn refusals_reach_the_cache_reads_and_names(a: &WgpuAllocator) {
    // Freed before the verdict: into the cache, then out again when the verdict comes.
    fail_next(1);
    let p = a.allocate(8192, 0, DEFAULT_ALIGNMENT).unwrap();
    a.deallocate(p, 0).unwrap();
    settle(|| a.stats(0).unwrap().cached_bytes == 0).await;
    let s = a.stats(0).unwrap();
    assert_eq!((s.reserved_bytes, s.cached_bytes), (0, 0), "the refused block left the cache: {s:?}");
    let q = a.allocate_async(8192, 0, DEFAULT_ALIGNMENT).await.expect("a new buffer");
    let data: Vec<u8> = (0..256).map(|i| (i * 7 + 3) as u8).collect();
    a.copy_host_to_device_async(q, &data, 0).await.unwrap();
    let mut back = vec![0u8; 256];
    a.copy_device_to_host_async(&mut back, q, 0).await.unwrap();
    assert_eq!(back, data, "a block the browser made");

    // A read started before the verdict: staging holds `q`'s bytes from the read above; the
    // refused allocation's read must not hand them out.
    fail_next(1);
    let r = a.allocate(8192, 0, DEFAULT_ALIGNMENT).unwrap();
    let mut out = vec![0xEEu8; 256];
    let read = a.copy_device_to_host_async(&mut out, r, 0).await;
    assert!(is_oom(&read), "{read:?}");
    assert_eq!(out, vec![0xEEu8; 256], "nothing reached the caller's slice");
    assert!(is_oom(&a.deallocate(r, 0)));

    // label_tensors, and a refused planned buffer in the snapshot.
    fail_next(1);
    let live = a.stats(0).unwrap().live_allocations;
    let named = a.allocate_labeled(4096, 0, DEFAULT_ALIGNMENT, "doomed").unwrap();
    settle(|| a.stats(0).unwrap().live_allocations == live).await;
    let notes = [TensorNote { label: "t".into(), offset: 0, size: 16 }];
    let r = a.label_tensors(named, 0, &notes);
    assert!(is_oom(&r), "{r:?}");
    assert!(is_oom(&a.deallocate(named, 0)));
    fail_next(1);
    a.init_buffer(7, 4096, 0).unwrap();
    settle(|| a.stats(0).unwrap().live_allocations == live).await;
    let snap = a.snapshot().unwrap();
    assert!(snap.devices[0].planned.is_empty(), "{:?}", snap.devices[0].planned);
    assert!(is_oom(&a.release_buffers(0)));
    a.init_buffer(7, 4096, 0).expect("the id is free again");
    a.release_buffers(0).unwrap();
    a.deallocate(q, 0).unwrap();
    assert_eq!(injected().1, 0, "every injected failure met an out-of-memory scope");
}
