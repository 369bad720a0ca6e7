//! A wgpu app adopts devalloc: its device stays its own (error handler, lost callback), a lost
//! device is seen by every call of every allocator on it, bindings are checked against the
//! device's limits, usage and labels are chosen per allocation, async copies do not block, and
//! a debug setting keeps freed buffers from being handed out again. Each test runs on Vulkan
//! (lavapipe) and GL (llvmpipe); under CI=true a missing adapter fails.

use crate::conformance;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use devalloc::wgpu::{BindingKind, BufferRequest, Route, WgpuAllocator, WgpuOptions};
use devalloc::{DeviceAllocator, DeviceMemoryBuffer, Error, PlanLayout, PoolOptions, DEFAULT_ALIGNMENT};

pub(crate) const BACKENDS: [wgpu::Backend; 2] = [wgpu::Backend::Vulkan, wgpu::Backend::Gl];

/// The app's own device and queue on `backend`, as a wgpu app would open them.
fn app_device(backend: wgpu::Backend) -> Option<(wgpu::Device, wgpu::Queue)> {
    conformance::logging::init_for_tests();
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backend.into();
    let instance = wgpu::Instance::new(desc);
    let adapter = match pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions::default()))
    {
        Ok(a) => a,
        Err(e) if conformance::in_ci() => panic!("no {backend:?} adapter under CI: {e}"),
        Err(e) => {
            eprintln!("SKIPPED on {backend:?}: no adapter: {e}");
            return None;
        }
    };
    let desc = wgpu::DeviceDescriptor { required_limits: adapter.limits(), ..Default::default() };
    Some(pollster::block_on(adapter.request_device(&desc)).expect("device"))
}

fn counter() -> (Arc<AtomicUsize>, impl Fn() -> usize) {
    let n = Arc::new(AtomicUsize::new(0));
    let read = Arc::clone(&n);
    (n, move || read.load(Ordering::SeqCst))
}

/// What the app hears from its device: errors in its uncaptured-error handler, and how often
/// its `on_device_lost` handler (given to devalloc) fired.
pub(crate) struct Watched {
    pub(crate) errors: Arc<Mutex<Vec<String>>>,
    pub(crate) fired: Arc<AtomicUsize>,
}

impl Watched {
    /// Installs the app's uncaptured-error handler on `device`.
    pub(crate) fn on(device: &wgpu::Device) -> Self {
        let errors = Arc::new(Mutex::new(Vec::<String>::new()));
        let sink = Arc::clone(&errors);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| sink.lock().unwrap().push(e.to_string())));
        Watched { errors, fired: Arc::new(AtomicUsize::new(0)) }
    }

    /// The app's `on_device_lost` handler, counting.
    pub(crate) fn on_lost(&self) -> devalloc::wgpu::DeviceLostHandler {
        let fired = Arc::clone(&self.fired);
        Arc::new(move |_, _: &str| {
            fired.fetch_add(1, Ordering::SeqCst);
        })
    }

    /// The app heard of the loss once, and no error of devalloc's reached its handler.
    fn heard_once(&self, what: &str) {
        let fired = self.fired.load(Ordering::SeqCst);
        assert_eq!(fired, 1, "{what}: the app's on_device_lost fired {fired} times");
        let leaked = self.errors.lock().unwrap().clone();
        assert!(leaked.is_empty(), "{what}: devalloc's errors reached the app's handler: {leaked:?}");
    }
}

/// The app's device, watched, adopted by an allocator on `route` that gets the app's
/// `on_device_lost`; `None` where the backend has no adapter (or no direct route here).
fn adopt_watched(
    backend: wgpu::Backend,
    route: Route,
) -> Option<(wgpu::Device, wgpu::Queue, WgpuAllocator, Watched)> {
    let (device, queue) = app_device(backend)?;
    let watch = Watched::on(&device);
    let options =
        WgpuOptions { route: Some(route), on_device_lost: Some(watch.on_lost()), ..WgpuOptions::default() };
    match WgpuAllocator::from_device_with_options(device.clone(), queue.clone(), options) {
        Ok(a) => Some((device, queue, a, watch)),
        Err(e) => {
            assert_eq!(route, Route::Direct, "{backend:?}: the staged route is always there: {e}");
            None
        }
    }
}

#[test]
fn the_apps_error_handler_still_fires_after_adoption() {
    for backend in BACKENDS {
        let Some((device, queue)) = app_device(backend) else { continue };
        let errors = Arc::new(Mutex::new(Vec::<String>::new()));
        let sink = Arc::clone(&errors);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| sink.lock().unwrap().push(e.to_string())));
        let a = WgpuAllocator::from_device(device.clone(), queue.clone()).unwrap();
        // devalloc's own work reaches no handler.
        let p = a.allocate(1 << 20, 0, DEFAULT_ALIGNMENT).unwrap();
        a.copy_host_to_device(p, &vec![3u8; 1 << 20], 0).unwrap();
        let mut back = vec![0u8; 1 << 20];
        a.copy_device_to_host(&mut back, p, 0).unwrap();
        assert!(errors.lock().unwrap().is_empty(), "{backend:?}: {:?}", errors.lock().unwrap());
        // The app's own mistake reaches the app's handler, not devalloc's log.
        let bad = wgpu::BufferDescriptor {
            label: Some("app's bad buffer"),
            size: 16,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::MAP_WRITE,
            mapped_at_creation: false,
        };
        let _b = device.create_buffer(&bad);
        let _ = device.poll(wgpu::PollType::Poll);
        let seen = errors.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{backend:?}: {seen:?}");
        assert!(seen[0].contains("app's bad buffer"), "{seen:?}");
        a.deallocate(p, 0).unwrap();
    }
}

#[test]
fn every_call_after_destroy_is_device_lost_for_every_allocator_and_the_app_hears_once() {
    for backend in BACKENDS {
        let Some((device, queue)) = app_device(backend) else { continue };
        let (fired, fired_count) = counter();
        let reasons = Arc::new(Mutex::new(Vec::new()));
        let r2 = Arc::clone(&reasons);
        let on_lost: devalloc::wgpu::DeviceLostHandler = Arc::new(move |reason, msg: &str| {
            fired.fetch_add(1, Ordering::SeqCst);
            r2.lock().unwrap().push(format!("{reason:?}: {msg}"));
        });
        let options = WgpuOptions { on_device_lost: Some(on_lost), ..WgpuOptions::default() };
        let first = WgpuAllocator::from_device_with_options(device.clone(), queue.clone(), options).unwrap();
        let second = WgpuAllocator::from_device(device.clone(), queue.clone()).unwrap();
        let again = WgpuOptions { on_device_lost: Some(Arc::new(|_, _: &str| {})), ..WgpuOptions::default() };
        let e = WgpuAllocator::from_device_with_options(device.clone(), queue.clone(), again).err().unwrap();
        assert!(e.to_string().contains("give it once"), "{e}");
        let p1 = first.allocate(256, 0, DEFAULT_ALIGNMENT).unwrap();
        let p2 = second.allocate(256, 0, DEFAULT_ALIGNMENT).unwrap();
        let q2 = second.allocate(256, 0, DEFAULT_ALIGNMENT).unwrap();
        device.destroy(); // no poll in between
        for (name, a, p, q) in [("first", &first, p1, p1), ("second", &second, p2, q2)] {
            let lost = |what: &str, r: devalloc::Result<()>| {
                assert!(matches!(r, Err(Error::DeviceLost { .. })), "{backend:?} {name}: {what}: {r:?}")
            };
            lost("allocate", a.allocate(64, 0, DEFAULT_ALIGNMENT).map(drop));
            lost("allocate_zeroed", a.allocate_zeroed(64, 0, DEFAULT_ALIGNMENT).map(drop));
            lost("allocate_with", a.allocate_request(&BufferRequest::new(64).label("x"), 0).map(drop));
            lost("init_buffer", a.init_buffer(9, 64, 0).map(drop));
            lost("aligned write", a.copy_host_to_device(p, &[1u8; 64], 0));
            lost("ragged write", a.copy_host_to_device(p.offset(1).unwrap(), &[1u8; 3], 0));
            lost("read", a.copy_device_to_host(&mut [0u8; 64], p, 0));
            lost("async read", pollster::block_on(a.copy_device_to_host_async(&mut [0u8; 64], p, 0)));
            lost("d2d", a.copy_device_to_device(q, 0, p, 0, 64));
            lost("synchronize", a.synchronize(0));
            lost("synchronize_async", pollster::block_on(a.synchronize_async(0)));
            // Bookkeeping still works: pointers can be freed.
            a.deallocate(p, 0).unwrap();
        }
        second.deallocate(q2, 0).unwrap();
        assert_eq!(fired_count(), 1, "{backend:?}: the app's on_device_lost fired {} times", fired_count());
        assert!(reasons.lock().unwrap()[0].starts_with("Destroyed"), "{:?}", reasons.lock().unwrap());
    }
}

#[test]
fn synchronize_as_the_first_call_after_destroy_is_device_lost() {
    for backend in BACKENDS {
        let Some((device, queue)) = app_device(backend) else { continue };
        let a = WgpuAllocator::from_device(device.clone(), queue).unwrap();
        device.destroy();
        let r = a.synchronize(0);
        assert!(matches!(r, Err(Error::DeviceLost { .. })), "{backend:?}: {r:?}");
    }
}

/// Uploads skip the poll other calls make up front (they notice a loss through wgpu's refusal
/// instead), and direct-route maps of a buffer the app was never given run without an error
/// scope: as the very first call after `destroy()`, on both routes, small and chunked, with and
/// without work still queued, an upload must still say DeviceLost, the app hear of it once,
/// and no error reach the app's uncaptured-error handler.
#[test]
fn an_upload_as_the_first_call_after_destroy_is_device_lost() {
    for backend in BACKENDS {
        for route in [Route::Staged, Route::Direct] {
            for (size, queued) in [(4usize, false), (4096, true), (64 << 10, false), (3 << 20, true)] {
                let Some((device, queue, a, watch)) = adopt_watched(backend, route) else { continue };
                let p = a.allocate(size, 0, DEFAULT_ALIGNMENT).unwrap();
                if queued {
                    // The app's own work, still in the queue when it destroys the device.
                    let b = device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("app work"),
                        size: 1 << 20,
                        usage: wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    });
                    let mut enc = device.create_command_encoder(&Default::default());
                    enc.clear_buffer(&b, 0, None);
                    queue.submit([enc.finish()]);
                }
                device.destroy();
                let r = a.copy_host_to_device(p, &vec![7u8; size], 0);
                let what = format!("{backend:?} {route:?} {size} bytes, work queued: {queued}");
                assert!(matches!(r, Err(Error::DeviceLost { .. })), "{what}: {r:?}");
                a.deallocate(p, 0).unwrap();
                let _ = device.poll(wgpu::PollType::Poll);
                watch.heard_once(&what);
            }
        }
    }
}

/// The app destroys its device with heavy work still queued: wgpu marks the device invalid at
/// once but reports the loss only once that work is done. Every devalloc call that needs an
/// answer from the device (reads, writes small and large and ragged, device-to-device copies
/// through the host, synchronize) must still be DeviceLost, never a backend error, with the
/// app's handler told once and nothing reaching its uncaptured-error handler.
#[test]
fn with_work_queued_at_destroy_every_call_that_needs_the_device_is_device_lost() {
    for backend in BACKENDS {
        for route in [Route::Staged, Route::Direct] {
            for op in [
                "read",
                "async read",
                "small write",
                "large write",
                "ragged write",
                "ragged d2d",
                "synchronize",
            ] {
                let Some((device, queue, a, watch)) = adopt_watched(backend, route) else { continue };
                let p = a.allocate(3 << 20, 0, DEFAULT_ALIGNMENT).unwrap();
                let q = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
                a.copy_host_to_device(p, &[1u8; 4096], 0).unwrap();
                a.synchronize(0).unwrap();
                // The app's heavy work: clears of a 128 MiB buffer, still running at destroy().
                let heavy = device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("the app's heavy work"),
                    size: 128 << 20,
                    usage: wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                for _ in 0..4 {
                    let mut enc = device.create_command_encoder(&Default::default());
                    enc.clear_buffer(&heavy, 0, None);
                    queue.submit([enc.finish()]);
                }
                device.destroy();
                let mut buf = [0u8; 16];
                let r = match op {
                    "read" => a.copy_device_to_host(&mut buf, p, 0),
                    "async read" => pollster::block_on(a.copy_device_to_host_async(&mut buf, p, 0)),
                    "small write" => a.copy_host_to_device(p, &[9u8; 64], 0),
                    "large write" => a.copy_host_to_device(p, &vec![9u8; 3 << 20], 0),
                    "ragged write" => a.copy_host_to_device(p.offset(3).unwrap(), &[9u8], 0),
                    "ragged d2d" => a.copy_device_to_device(q.offset(1).unwrap(), 0, p, 0, 5),
                    _ => a.synchronize(0),
                };
                let what = format!("{backend:?} {route:?} {op}");
                assert!(matches!(r, Err(Error::DeviceLost { .. })), "{what}: {r:?}");
                let _ = device.poll(wgpu::PollType::wait_indefinitely());
                watch.heard_once(&what);
            }
        }
    }
}

/// A buffer the app got from `buffer()` and then destroyed (its own misuse) fails devalloc's
/// copies with an error; freed, it must not go back to the cache and break the next allocation.
#[test]
fn a_buffer_the_app_destroyed_is_not_handed_out_again() {
    for backend in BACKENDS {
        for route in [Route::Staged, Route::Direct] {
            let Some((device, queue)) = app_device(backend) else { continue };
            let errors = Arc::new(Mutex::new(Vec::<String>::new()));
            let sink = Arc::clone(&errors);
            device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                sink.lock().unwrap().push(e.to_string())
            }));
            let options = WgpuOptions { route: Some(route), ..WgpuOptions::default() };
            let Ok(a) = WgpuAllocator::from_device_with_options(device.clone(), queue, options) else {
                continue;
            };
            let p = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
            a.buffer(p, 0).unwrap().buffer.destroy();
            let what = format!("{backend:?} {route:?}");
            assert!(
                a.copy_host_to_device(p, &[1u8; 64], 0).is_err(),
                "{what}: a write into a destroyed buffer"
            );
            a.deallocate(p, 0).unwrap();
            let fresh = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
            a.copy_host_to_device(fresh, &[5u8; 4096], 0).unwrap_or_else(|e| {
                panic!("{what}: the next allocation inherited the destroyed buffer: {e}")
            });
            let mut back = vec![0u8; 4096];
            a.copy_device_to_host(&mut back, fresh, 0).unwrap();
            assert_eq!(back, vec![5u8; 4096], "{what}");
            let _ = device.poll(wgpu::PollType::Poll);
            assert!(errors.lock().unwrap().is_empty(), "{what}: {:?}", errors.lock().unwrap());
        }
    }
}

#[test]
fn a_refused_adoption_leaves_the_devices_lost_callback_to_the_app() {
    for backend in BACKENDS {
        let Some((device, queue)) = app_device(backend) else { continue };
        let handler: devalloc::wgpu::DeviceLostHandler = Arc::new(|_, _: &str| {});
        for bad in [
            WgpuOptions {
                pool: PoolOptions { address_window: 12345, ..PoolOptions::default() },
                on_device_lost: Some(Arc::clone(&handler)),
                ..WgpuOptions::default()
            },
            WgpuOptions {
                usage: wgpu::BufferUsages::MAP_READ,
                on_device_lost: Some(Arc::clone(&handler)),
                ..WgpuOptions::default()
            },
        ] {
            let e =
                WgpuAllocator::from_device_with_options(device.clone(), queue.clone(), bad).err().unwrap();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{backend:?}: {e}");
        }
        // Had a refused adoption taken the callback, this one would be told "give it once".
        let good = WgpuOptions { on_device_lost: Some(handler), ..WgpuOptions::default() };
        WgpuAllocator::from_device_with_options(device, queue, good)
            .expect("the callback was still the app's");
    }
}

#[test]
fn a_misaligned_binding_is_a_devalloc_error_naming_the_limit() {
    for backend in BACKENDS {
        let Some((device, queue)) = app_device(backend) else { continue };
        let a = WgpuAllocator::from_device(device.clone(), queue).unwrap();
        let align = a.binding_alignment(0).unwrap() as u64;
        let p = a.init_buffer(0, 4096, 0).unwrap();
        let t = a.get_offset_address(0, 4, 64, 0).unwrap(); // valid for copies, not for bindings
        a.copy_host_to_device(t, &[1u8; 64], 0).unwrap();
        let e = a.buffer_range(t, 64, 0).unwrap().binding(BindingKind::Storage).unwrap_err();
        assert!(e.to_string().contains("min_storage_buffer_offset_alignment"), "{backend:?}: {e}");
        let e = a.buffer_range(t, 64, 0).unwrap().binding(BindingKind::Uniform).unwrap_err();
        assert!(e.to_string().contains("UNIFORM"), "{backend:?}: {e}");
        let e = a.buffer_range(p, 6, 0).unwrap().binding(BindingKind::Storage).unwrap_err();
        assert!(e.to_string().contains("multiple of 4"), "{e}");
        let big = device.limits().max_storage_buffer_binding_size + 4;
        if big <= a.max_allocation(0).unwrap() {
            let q = a.allocate(big as usize, 0, DEFAULT_ALIGNMENT).unwrap();
            let e = a.buffer(q, 0).unwrap().binding(BindingKind::Storage).unwrap_err();
            assert!(e.to_string().contains("max_storage_buffer_binding_size"), "{e}");
            a.deallocate(q, 0).unwrap();
        }
        // A plan laid out at the binding alignment binds every tensor.
        let mut layout = PlanLayout::new(align as usize).unwrap();
        let offs: Vec<usize> = [100, 4, 1000].iter().map(|&n| layout.place(n).unwrap()).collect();
        let base = a.init_buffer(1, layout.size(), 0).unwrap();
        for (&o, n) in offs.iter().zip([100u64, 4, 1000]) {
            a.buffer_range(base.offset(o).unwrap(), n, 0).unwrap().binding(BindingKind::Storage).unwrap();
        }
        a.release_buffers(0).unwrap();
    }
}

const UNIFORM_KERNEL: &str = r#"
struct P { scale: f32, add: f32, pad0: f32, pad1: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&out)) { out[id.x] = f32(id.x) * p.scale + p.add; }
}
"#;

#[test]
fn a_uniform_allocation_binds_as_a_uniform_in_a_real_kernel() {
    for backend in BACKENDS {
        let Some((device, queue)) = app_device(backend) else { continue };
        let a = WgpuAllocator::from_device(device.clone(), queue.clone()).unwrap();
        let params = a
            .allocate_request(&BufferRequest::new(16).usage(wgpu::BufferUsages::UNIFORM).label("params"), 0)
            .unwrap();
        let out = a.allocate_request(&BufferRequest::new(256 * 4).label("out"), 0).unwrap();
        a.copy_host_to_device(params, bytemuck::cast_slice(&[2.0f32, 0.5, 0.0, 0.0]), 0).unwrap();
        let e = a.buffer(out, 0).unwrap().binding(BindingKind::Uniform).unwrap_err();
        assert!(e.to_string().contains("UNIFORM"), "a storage-only buffer binds as uniform: {e}");
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: None,
            source: wgpu::ShaderSource::Wgsl(UNIFORM_KERNEL.into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: None,
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let (pb, ob) = (a.buffer(params, 0).unwrap(), a.buffer(out, 0).unwrap());
        let bg = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(pb.binding(BindingKind::Uniform).unwrap()),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: wgpu::BindingResource::Buffer(ob.binding(BindingKind::Storage).unwrap()),
                },
            ],
        });
        let mut enc = device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bg, &[]);
            pass.dispatch_workgroups(4, 1, 1);
        }
        queue.submit([enc.finish()]);
        let mut back = vec![0f32; 256];
        a.copy_device_to_host(bytemuck::cast_slice_mut(&mut back), out, 0).unwrap();
        for (i, v) in back.iter().enumerate() {
            assert_eq!(*v, i as f32 * 2.0 + 0.5, "{backend:?}: out[{i}]");
        }
    }
}

#[test]
fn wgpus_messages_name_the_block_and_a_freed_block_serves_any_label() {
    for backend in BACKENDS {
        let Some((device, queue)) = app_device(backend) else { continue };
        let a = WgpuAllocator::from_device(device.clone(), queue).unwrap();
        let p = a.allocate_request(&BufferRequest::new(1024).label("layer1.weights"), 0).unwrap();
        let r = a.buffer(p, 0).unwrap();
        // The app binds it wrongly by hand (a storage-only buffer as a uniform), inside its own
        // error scope.
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: None,
            entries: &[wgpu::BindGroupLayoutEntry {
                binding: 0,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Uniform,
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            }],
        });
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let _bg = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &layout,
            entries: &[wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &r.buffer,
                    offset: 0,
                    size: wgpu::BufferSize::new(64),
                }),
            }],
        });
        let err = pollster::block_on(scope.pop()).expect("wgpu refuses a storage buffer as a uniform");
        // wgpu names the buffer by its block; devalloc's records tie the block to the label.
        let live = a.live_allocations(0).unwrap();
        let mine = live.iter().find(|l| l.ptr() == p).expect("listed");
        assert_eq!(mine.label.as_deref(), Some("layer1.weights"));
        let name = format!("devalloc block {} (", mine.block);
        assert!(format!("{err}").contains(&name), "{backend:?}: {err} does not name {name}");
        // Freed, then the same size under another label: the same buffer (labels are for
        // people, not part of the cache's key), and the records say the new label.
        let first = r.buffer.clone();
        drop(r);
        a.deallocate(p, 0).unwrap();
        let q = a.allocate_request(&BufferRequest::new(1024).label("layer2.weights"), 0).unwrap();
        assert_eq!(
            a.buffer(q, 0).unwrap().buffer,
            first,
            "{backend:?}: a freed buffer was not reused for another label"
        );
        let live = a.live_allocations(0).unwrap();
        let reused = live.iter().find(|l| l.ptr() == q).expect("listed");
        assert_eq!((reused.label.as_deref(), reused.block), (Some("layer2.weights"), mine.block));
        assert!(a.report().contains("layer2.weights"), "{}", a.report());
        // Usage stays in the key: a uniform of the same size does not take that buffer.
        a.deallocate(q, 0).unwrap();
        let u = a.allocate_request(&BufferRequest::new(1024).usage(wgpu::BufferUsages::UNIFORM), 0).unwrap();
        assert_ne!(a.buffer(u, 0).unwrap().buffer, first, "{backend:?}: usage is part of the key");
        a.deallocate(u, 0).unwrap();
        assert!(a.allocate_request(&BufferRequest::new(8).usage(wgpu::BufferUsages::MAP_READ), 0).is_err());
    }
}

/// Polls `fut` once with a waker that does nothing.
fn poll_once<F: Future + ?Sized>(fut: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn an_async_download_returns_pending_and_its_data_arrive() {
    for backend in BACKENDS {
        for route in [Some(Route::Staged), None] {
            let Some((device, queue)) = app_device(backend) else { continue };
            let a = WgpuAllocator::from_device_with_options(
                device,
                queue,
                WgpuOptions { route, ..WgpuOptions::default() },
            )
            .unwrap();
            let n = 64 << 20;
            let data = conformance::pattern(n, 77);
            let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
            a.copy_host_to_device(p, &data, 0).unwrap();
            let mut back = vec![0u8; n];
            {
                let mut fut = std::pin::pin!(a.copy_device_to_host_async(&mut back, p, 0));
                let first = poll_once(fut.as_mut());
                assert!(first.is_pending(), "{backend:?} {route:?}: the first poll did the whole download");
                pollster::block_on(fut).unwrap();
            }
            assert!(back == data, "{backend:?} {route:?}: the data differ");
            a.deallocate(p, 0).unwrap();
        }
    }
}

/// No async copy does more than one chunk of work per poll, even where the device has finished
/// everything by the next poll (as lavapipe has): with 1 MiB staging chunks, 16 MiB uploads,
/// downloads and ragged copies (through the host) return `Pending` at least 15 times, on both
/// routes, Vulkan and GL, and every byte arrives.
#[test]
fn an_async_copy_does_at_most_one_chunk_of_work_per_poll() {
    for backend in BACKENDS {
        for route in [Route::Staged, Route::Direct] {
            let Some((device, queue)) = app_device_mappable(backend) else { continue };
            let options =
                WgpuOptions { route: Some(route), staging_chunk: Some(1 << 20), ..WgpuOptions::default() };
            let Ok(a) = WgpuAllocator::from_device_with_options(device, queue, options) else { continue };
            let what = format!("{backend:?} {route:?}");
            let n = 16 << 20;
            let data = conformance::pattern(n, 21);
            let p = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
            let q = a.allocate(n, 0, DEFAULT_ALIGNMENT).unwrap();
            let (r, polls) = conformance::polls_until_ready(a.copy_host_to_device_async(p, &data, 0));
            r.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(polls >= 15, "{what}: a 16 MiB upload was Pending only {polls} times");
            let mut back = vec![0u8; n];
            let (r, polls) = conformance::polls_until_ready(a.copy_device_to_host_async(&mut back, p, 0));
            r.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(polls >= 15, "{what}: a 16 MiB download was Pending only {polls} times");
            assert!(back == data, "{what}: the download differs");
            let ragged =
                a.copy_device_to_device_async(q.offset(1).unwrap(), 0, p.offset(3).unwrap(), 0, n - 8);
            let (r, polls) = conformance::polls_until_ready(ragged);
            r.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(polls >= 15, "{what}: a 16 MiB ragged copy was Pending only {polls} times");
            a.copy_device_to_host(&mut back[..n - 8], q.offset(1).unwrap(), 0).unwrap();
            assert!(back[..n - 8] == data[3..n - 5], "{what}: the ragged copy differs");
        }
    }
}

#[test]
fn with_the_debug_setting_a_freed_buffer_is_never_handed_out_again() {
    for backend in BACKENDS {
        let Some((device, queue)) = app_device(backend) else { continue };
        let pool = PoolOptions { caching: true, reuse_freed: false, ..PoolOptions::default() };
        let a = WgpuAllocator::from_device_with_options(
            device,
            queue,
            WgpuOptions { pool, ..WgpuOptions::default() },
        )
        .unwrap();
        let mut seen: Vec<wgpu::Buffer> = Vec::new();
        for _ in 0..20 {
            let p = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
            let b = a.buffer(p, 0).unwrap().buffer;
            assert!(!seen.contains(&b), "{backend:?}: a freed buffer was handed out again");
            seen.push(b);
            a.deallocate(p, 0).unwrap();
        }
        assert_eq!(a.stats(0).unwrap().cache_hits, 0);
    }
}

#[test]
fn the_small_frictions_are_smooth() {
    for backend in BACKENDS {
        let Some((device, queue)) = app_device(backend) else { continue };
        // An allocator on the stack, no Box::leak: RAII buffers borrow it.
        let a = WgpuAllocator::from_device(device.clone(), queue.clone()).unwrap();
        let mut buf = DeviceMemoryBuffer::create_on(&a, 1000, 0, DEFAULT_ALIGNMENT).unwrap();
        buf.write_pod(&[7u32; 250]).unwrap();
        // The whole allocation without restating its length.
        assert_eq!(a.buffer(buf.ptr(), 0).unwrap().len(), 1000);
        // devalloc copies into and out of the app's own buffers, queue-ordered.
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        let app_buf = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("app"),
            size: 1024,
            usage,
            mapped_at_creation: false,
        });
        a.copy_to_buffer(buf.ptr(), &app_buf, 24, 1000, 0).unwrap();
        let other = DeviceMemoryBuffer::create_on(&a, 1000, 0, DEFAULT_ALIGNMENT).unwrap();
        a.copy_from_buffer(other.ptr(), &app_buf, 24, 1000, 0).unwrap();
        assert_eq!(other.to_vec::<u32>().unwrap(), vec![7u32; 250]);
        assert!(a.copy_to_buffer(buf.ptr(), &app_buf, 25, 8, 0).unwrap_err().to_string().contains("4-byte"));
        assert!(a
            .copy_to_buffer(buf.ptr(), &app_buf, 1020, 8, 0)
            .unwrap_err()
            .to_string()
            .contains("run past"));
        let no_dst = device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: 64,
            usage: wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        assert!(a.copy_to_buffer(buf.ptr(), &no_dst, 0, 8, 0).unwrap_err().to_string().contains("COPY_DST"));
        drop(buf);
        drop(other);
        assert_eq!(a.stats(0).unwrap().live_allocations, 0);
    }
}

/// A device opened with MAPPABLE_PRIMARY_BUFFERS where the adapter offers it (the direct route
/// on lavapipe), else a plain one; `None`, saying so, where the backend has no adapter (under
/// CI=true a failure).
pub(crate) fn app_device_mappable(backend: wgpu::Backend) -> Option<(wgpu::Device, wgpu::Queue)> {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backend.into();
    let instance = wgpu::Instance::new(desc);
    let adapter = match pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions::default()))
    {
        Ok(a) => a,
        Err(e) if conformance::in_ci() => panic!("no {backend:?} adapter under CI: {e}"),
        Err(e) => {
            eprintln!("SKIPPED on {backend:?}: no adapter: {e}");
            return None;
        }
    };
    let features = adapter.features() & wgpu::Features::MAPPABLE_PRIMARY_BUFFERS;
    let desc = wgpu::DeviceDescriptor {
        required_features: features,
        required_limits: adapter.limits(),
        ..Default::default()
    };
    Some(pollster::block_on(adapter.request_device(&desc)).expect("device"))
}

#[test]
fn a_dropped_async_copy_leaves_the_buffer_usable_on_every_route() {
    for backend in BACKENDS {
        for route in [None, Some(Route::Staged)] {
            let Some((device, queue)) = app_device_mappable(backend) else { continue };
            let a = WgpuAllocator::from_device_with_options(
                device,
                queue,
                WgpuOptions { route, ..WgpuOptions::default() },
            )
            .unwrap();
            let what = format!("{backend:?} {:?}", a.route(0).unwrap());
            let p = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
            let q = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
            a.copy_host_to_device(p, &[5u8; 4096], 0).unwrap();
            let mut buf = vec![0u8; 4096];
            {
                let mut f = a.copy_device_to_host_async(&mut buf, p, 0);
                let _ = poll_once(f.as_mut());
            }
            {
                let data = [6u8; 4096];
                let mut f = a.copy_host_to_device_async(q, &data, 0);
                let _ = poll_once(f.as_mut());
            }
            {
                let mut f =
                    a.copy_device_to_device_async(q.offset(1).unwrap(), 0, p.offset(3).unwrap(), 0, 100);
                let _ = poll_once(f.as_mut());
            }
            a.synchronize(0).unwrap();
            a.copy_host_to_device(p, &[7u8; 4096], 0).unwrap_or_else(|e| panic!("{what}: {e}"));
            a.copy_device_to_host(&mut buf, p, 0).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(buf, vec![7u8; 4096], "{what}");
            a.copy_device_to_device(q, 0, p, 0, 4096).unwrap_or_else(|e| panic!("{what}: {e}"));
            a.deallocate(p, 0).unwrap();
            let r = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap(); // the cached buffer
            a.copy_host_to_device(r, &[8u8; 4096], 0)
                .unwrap_or_else(|e| panic!("{what}: the next allocation inherited it: {e}"));
        }
    }
}

#[test]
fn destroying_the_device_under_an_async_read_completes_or_is_device_lost_never_a_panic() {
    for backend in BACKENDS {
        let Some((device, queue)) = app_device_mappable(backend) else { continue };
        let errors = Arc::new(Mutex::new(Vec::<String>::new()));
        let sink = Arc::clone(&errors);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| sink.lock().unwrap().push(e.to_string())));
        let a = WgpuAllocator::from_device(device.clone(), queue).unwrap();
        let p = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
        a.copy_host_to_device(p, &[7u8; 4096], 0).unwrap();
        let mut buf = vec![0u8; 4096];
        let r = {
            let mut f = a.copy_device_to_host_async(&mut buf, p, 0);
            let _ = poll_once(f.as_mut());
            device.destroy();
            pollster::block_on(f)
        };
        // The polling thread may have mapped the buffer before destroy() took effect: then the
        // read completes, and must hold the data. Otherwise it is DeviceLost. Never wrong data.
        match r {
            Ok(()) => assert_eq!(buf, vec![7u8; 4096], "{backend:?}: Ok, with wrong data"),
            r => assert!(matches!(r, Err(Error::DeviceLost { .. })), "{backend:?}: {r:?}"),
        }
        let r = a.copy_device_to_host(&mut buf, p, 0);
        assert!(matches!(r, Err(Error::DeviceLost { .. })), "{backend:?}: the next read: {r:?}");
        let _ = device.poll(wgpu::PollType::Poll);
        assert!(
            errors.lock().unwrap().is_empty(),
            "{backend:?}: devalloc's errors reached the app: {:?}",
            errors.lock().unwrap()
        );
    }
}

#[test]
fn mapping_a_destroyed_or_foreign_buffer_is_an_error_not_a_panic_or_a_hang() {
    for backend in BACKENDS {
        let Some((device, queue)) = app_device(backend) else { continue };
        let Some((other, _other_queue)) = app_device(backend) else { continue };
        let errors = Arc::new(Mutex::new(Vec::<String>::new()));
        let sink = Arc::clone(&errors);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| sink.lock().unwrap().push(e.to_string())));
        let a = WgpuAllocator::from_device(device.clone(), queue).unwrap();
        let desc = wgpu::BufferDescriptor {
            label: Some("x"),
            size: 256,
            usage: wgpu::BufferUsages::MAP_READ,
            mapped_at_creation: false,
        };
        let x = device.create_buffer(&desc);
        x.destroy();
        let r = pollster::block_on(a.map_buffer_async(&x, wgpu::MapMode::Read, 0..8, 0));
        assert!(r.is_err(), "{backend:?}: mapping a destroyed buffer: {r:?}");
        let foreign = other.create_buffer(&desc);
        let r = pollster::block_on(a.map_buffer_async(&foreign, wgpu::MapMode::Read, 0..8, 0));
        let e = r.unwrap_err();
        assert!(e.to_string().contains("another device"), "{backend:?}: {e}");
        // Giving up cancelled devalloc's map: the buffer's own device maps it as usual.
        let (tx, rx) = std::sync::mpsc::channel();
        foreign.slice(0..8).map_async(wgpu::MapMode::Read, move |r| tx.send(r).unwrap());
        other.poll(wgpu::PollType::wait_indefinitely()).unwrap();
        let mapped = rx.recv().unwrap();
        assert!(mapped.is_ok(), "{backend:?}: devalloc left its map pending: {mapped:?}");
        assert!(errors.lock().unwrap().is_empty(), "{backend:?}: {:?}", errors.lock().unwrap());
        // The allocator is still fine.
        let p = a.allocate(64, 0, DEFAULT_ALIGNMENT).unwrap();
        a.copy_host_to_device(p, &[1u8; 64], 0).unwrap();
        a.deallocate(p, 0).unwrap();
    }
}

#[test]
fn a_buffer_the_app_mapped_itself_is_an_error_for_devalloc_and_stays_the_apps() {
    for backend in BACKENDS {
        let Some((device, queue)) = app_device_mappable(backend) else { continue };
        let a = WgpuAllocator::from_device(device.clone(), queue).unwrap();
        if a.route(0).unwrap() != Route::Direct {
            eprintln!("SKIPPED on {backend:?}: no direct route on this adapter");
            continue;
        }
        let p = a.allocate(256, 0, DEFAULT_ALIGNMENT).unwrap();
        a.copy_host_to_device(p, &[3u8; 256], 0).unwrap();
        let range = a.buffer(p, 0).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        range.buffer.slice(0..256).map_async(wgpu::MapMode::Read, move |r| tx.send(r).unwrap());
        device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
        rx.recv().unwrap().unwrap();
        let view = range.buffer.slice(0..256).get_mapped_range().unwrap();
        // devalloc's map is refused; it must not unmap the app's mapping (with a view alive,
        // wgpu would panic) nor pretend the copy happened.
        let mut back = [0u8; 16];
        assert!(a.copy_device_to_host(&mut back, p, 0).is_err(), "{backend:?}");
        assert!(a.copy_host_to_device(p, &[9u8; 16], 0).is_err(), "{backend:?}");
        assert_eq!(view[..16], [3u8; 16], "{backend:?}: the app's view changed");
        drop(view);
        range.buffer.unmap();
        a.copy_device_to_host(&mut back, p, 0).unwrap();
        assert_eq!(back, [3u8; 16], "{backend:?}");
        a.deallocate(p, 0).unwrap();
    }
}

#[test]
fn after_destroy_range_checks_buffers_and_bindings_are_device_lost_and_bookkeeping_works() {
    for backend in BACKENDS {
        let Some((device, queue)) = app_device(backend) else { continue };
        let a = WgpuAllocator::from_device(device.clone(), queue).unwrap();
        let p = a.allocate(1024, 0, DEFAULT_ALIGNMENT).unwrap();
        let range = a.buffer(p, 0).unwrap();
        a.init_buffer(1, 512, 0).unwrap();
        device.destroy();
        let lost = |what: &str, r: devalloc::Result<()>| {
            assert!(matches!(r, Err(Error::DeviceLost { .. })), "{backend:?} {what}: {r:?}")
        };
        lost("check_range", a.check_range(p, 8, 0));
        lost("buffer", a.buffer(p, 0).map(drop));
        lost("buffer_range", a.buffer_range(p, 8, 0).map(drop));
        lost("binding", range.binding(BindingKind::Storage).map(drop));
        // Bookkeeping keeps working, so that the app can clean up.
        a.get_offset_address(1, 0, 8, 0).unwrap();
        a.stats(0).unwrap();
        a.release_buffers(0).unwrap();
        a.deallocate(p, 0).unwrap();
        a.empty_cache();
        assert_eq!(a.stats(0).unwrap().live_allocations, 0);
    }
}

/// A panic that comes out of wgpu while devalloc polls (here the app's own map callback, which
/// devalloc's poll runs; wgpu-core 30.0.2 also panics on a healthy device when polls race) is
/// not a loss while the device is valid: every call goes on working, and the app hears of no
/// loss. Once the device is destroyed, such a panic (which drops wgpu's own lost callback along
/// with the callbacks after it) is still found to be a loss.
#[test]
fn a_panic_inside_a_poll_is_a_loss_only_once_the_device_is_invalid() {
    for backend in BACKENDS {
        for route in [Route::Staged, Route::Direct] {
            let Some((device, queue)) = app_device_mappable(backend) else { continue };
            let watch = Watched::on(&device);
            let options = WgpuOptions {
                route: Some(route),
                on_device_lost: Some(watch.on_lost()),
                ..WgpuOptions::default()
            };
            let Ok(a) = WgpuAllocator::from_device_with_options(device.clone(), queue, options) else {
                continue;
            };
            let what = format!("{backend:?} {route:?}");
            let p = a.allocate(4096, 0, DEFAULT_ALIGNMENT).unwrap();
            a.copy_host_to_device(p, &[9u8; 4096], 0).unwrap();
            let panicking_map = || {
                let b = device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("app's buffer"),
                    size: 16,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                b.slice(..).map_async(wgpu::MapMode::Read, |_| panic!("the app's map callback panics"));
                b
            };
            // Healthy: the next poll (devalloc's range check) runs the callback, which panics.
            let _b = panicking_map();
            a.check_range(p, 4096, 0).unwrap_or_else(|e| panic!("{what}: after a panic in a poll: {e}"));
            let mut back = vec![0u8; 4096];
            a.copy_device_to_host(&mut back, p, 0).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(back, vec![9u8; 4096], "{what}");
            a.copy_host_to_device(p, &[10u8; 4096], 0).unwrap_or_else(|e| panic!("{what}: {e}"));
            pollster::block_on(a.copy_device_to_host_async(&mut back, p, 0)).unwrap();
            assert_eq!(back, vec![10u8; 4096], "{what}");
            assert_eq!(watch.fired.load(Ordering::SeqCst), 0, "{what}: a healthy device was reported lost");
            // Destroyed: the panic comes in the poll that would have reported the loss.
            let _c = panicking_map();
            device.destroy();
            let r = a.check_range(p, 4096, 0);
            assert!(matches!(r, Err(Error::DeviceLost { .. })), "{what}: after destroy and a panic: {r:?}");
            let r = a.copy_device_to_host(&mut back, p, 0);
            assert!(matches!(r, Err(Error::DeviceLost { .. })), "{what}: a read after it: {r:?}");
            watch.heard_once(&what);
        }
    }
}
