//! What wgpu holds beneath devalloc's pool: independent allocations never share a buffer (the
//! binding check of the conformance suite, on Vulkan's two routes and GL), the memory hints
//! devalloc gives a device it opens keep wgpu's own allocator close to what the pool holds, and
//! with `reuse_freed` off a freed buffer is destroyed, so a stale bind group shows at its submit.

use crate::conformance::{self, bindings};

use devalloc::plan::{Instance, TensorLife};
use devalloc::replay::{replay, Trace};
use devalloc::wgpu::{Route, WgpuAllocator, WgpuOptions};

/// An allocator on `backend`, or `None` (saying why) where this machine has no such adapter;
/// under CI a missing adapter fails.
fn open(backend: wgpu::Backend, options: WgpuOptions) -> Option<WgpuAllocator> {
    let route = options.route;
    match WgpuAllocator::with_options(backend, options) {
        Ok(a) => Some(a),
        Err(e) if conformance::in_ci() => panic!("no {backend:?} adapter under CI: {e}"),
        Err(e) => {
            conformance::skip(
                "a wgpu memory test",
                &format!("no {backend:?} allocator (route {route:?}): {e}"),
            );
            None
        }
    }
}

#[test]
fn independent_allocations_bind_together_after_churn() {
    for (backend, route) in [
        (wgpu::Backend::Vulkan, Route::Staged),
        (wgpu::Backend::Vulkan, Route::Direct),
        (wgpu::Backend::Gl, Route::Staged),
    ] {
        let Some(a) = open(backend, WgpuOptions { route: Some(route), ..WgpuOptions::default() }) else {
            continue;
        };
        pollster::block_on(bindings::independent_allocations_bind_together_after_churn(&a, 0));
    }
}

#[test]
fn bindings_in_one_call() {
    for (backend, route) in [
        (wgpu::Backend::Vulkan, Route::Staged),
        (wgpu::Backend::Vulkan, Route::Direct),
        (wgpu::Backend::Gl, Route::Staged),
    ] {
        let Some(a) = open(backend, WgpuOptions { route: Some(route), ..WgpuOptions::default() }) else {
            continue;
        };
        pollster::block_on(conformance::bind_helper::bindings_in_one_call(&a, 0));
    }
}

/// The model histories of `tests/data/traces` (each peaks at 15-150 MB live).
fn traces() -> Vec<(String, Trace)> {
    ["convnet", "decode", "large", "mlp_train", "transformer"]
        .iter()
        .map(|name| {
            let path = format!("{}/tests/data/traces/{name}.csv", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).unwrap();
            let inst = Instance::from_csv(name, &text).unwrap();
            (name.to_string(), Trace::from_tensors(&inst.tensors, None))
        })
        .collect()
}

/// Forty tensors of 2.1-4 MiB (wgpu's worst case: each takes most of a 4 MiB block of its
/// own), eight live at a time.
fn adversarial() -> Trace {
    let tensors: Vec<TensorLife> = (0..40u64)
        .map(|k| TensorLife { size: (2 << 20) + 4096 + (k * 7919 % 31) * (60 << 10), first: k, last: k + 7 })
        .collect();
    Trace::from_tensors(&tensors, None)
}

/// The most wgpu's allocator report said it held while `trace` replayed, and the pool's peak.
fn held(options: WgpuOptions, trace: &Trace) -> Option<(u64, u64)> {
    let a = open(wgpu::Backend::Vulkan, options)?;
    let r = replay(&a, trace, 0).unwrap();
    let backend =
        r.backend_peak_reserved.unwrap_or_else(|| panic!("Vulkan keeps an allocator report: {r:?}"));
    Some((backend, r.peak_reserved))
}

/// What wgpu's allocator held over the pool's peak reserved with devalloc's hints (4 MiB
/// blocks), per history and for 2-4 MiB tensors (the worst case), measured on lavapipe (Mesa
/// 22.3): the replay is single-threaded, so there they repeat exactly.
const MEASURED: [(&str, f64); 6] = [
    ("convnet", 1.082),
    ("decode", 1.321),
    ("large", 1.093),
    ("mlp_train", 1.021),
    ("transformer", 1.065),
    ("2-4 MiB tensors", 1.295),
];

/// The margin over [`MEASURED`]: another Vulkan driver aligns and places buffers its own way
/// within the same 4 MiB blocks. 5% (the worst case's bound is then 1.39x).
const MARGIN: f64 = 1.05;

#[test]
fn wgpus_own_blocks_stay_close_to_what_the_pool_holds() {
    let performance =
        || WgpuOptions { memory_hints: wgpu::MemoryHints::Performance, ..WgpuOptions::default() };
    let mut traces = traces();
    traces.push(("2-4 MiB tensors".to_string(), adversarial()));
    for (name, trace) in traces {
        let Some((backend, pool)) = held(WgpuOptions::default(), &trace) else { return };
        let (wgpus, _) = held(performance(), &trace).unwrap();
        let ratio = backend as f64 / pool as f64;
        eprintln!(
            "{name}: wgpu held {backend} bytes beneath a peak reserved of {pool} ({ratio:.3}x); {wgpus} with \
             wgpu's default hints"
        );
        let measured = MEASURED.iter().find(|(n, _)| *n == name).unwrap().1;
        assert!(
            ratio <= measured * MARGIN,
            "{name}: wgpu held {backend} beneath a peak reserved of {pool}: {ratio:.3}x, measured {measured}x"
        );
        // The hints reach wgpu: its default (`Performance`) took blocks of 64 MiB and more on
        // lavapipe, at least 9.5 MiB more than devalloc's on every history; ignored hints would
        // hold the same.
        assert!(
            backend + (4 << 20) <= wgpus,
            "{name}: the hints did not reach wgpu ({backend} bytes with devalloc's, {wgpus} with wgpu's)"
        );
    }
}

#[test]
fn with_reuse_off_a_bind_group_kept_past_the_free_is_reported_at_the_submit() {
    for backend in [wgpu::Backend::Vulkan, wgpu::Backend::Gl] {
        let debug = devalloc::PoolOptions { reuse_freed: false, ..Default::default() };
        let Some(a) = open(backend, WgpuOptions { pool: debug, ..WgpuOptions::default() }) else { continue };
        let error = pollster::block_on(bindings::stale_bind_group(&a, 0)).map(|e| e.to_string());
        let message =
            error.unwrap_or_else(|| panic!("{backend:?}: a destroyed buffer's bind group ran silently"));
        assert!(
            message.contains("destroyed") && message.contains("devalloc block"),
            "{backend:?}: {message}"
        );
        // The default reuses freed buffers: the same bug runs silently (what the setting shows).
        let Some(a) = open(backend, WgpuOptions::default()) else { continue };
        assert!(pollster::block_on(bindings::stale_bind_group(&a, 0)).is_none(), "{backend:?}");
    }
}

/// After `device.destroy()` the one-call bindings are `DeviceLost` even with nothing of
/// devalloc's to bind (a hostile review found them `Ok`), and an index the allocator does not
/// have is refused however few binds there are.
#[test]
fn bindings_on_a_lost_device_are_device_lost() {
    let Some(a) = open(wgpu::Backend::Vulkan, WgpuOptions::default()) else { return };
    let device = a.device(0).unwrap().clone();
    let layout =
        device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: None, entries: &[] });
    a.bind_group(&layout, &[], &[], 0).unwrap();
    assert!(a.bindings(&[], 7).is_err());
    device.destroy();
    let e = a.bind_group(&layout, &[], &[], 0).unwrap_err();
    assert!(matches!(e, devalloc::Error::DeviceLost { .. }), "{e}");
    assert!(matches!(a.bindings(&[], 0), Err(devalloc::Error::DeviceLost { .. })));
}
