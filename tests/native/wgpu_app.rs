//! A wgpu app adopts devalloc: its device stays its own (error handler), bindings are checked
//! against the device's limits, usage and labels are chosen per allocation, and a debug setting
//! keeps freed buffers from being handed out again. Lost devices are `wgpu_app_loss`, async
//! copies `wgpu_copies`. Each test runs on Vulkan (lavapipe) and GL (llvmpipe); under CI=true
//! a missing adapter fails.

use crate::conformance;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use devalloc::wgpu::{BindingKind, BufferRequest, Route, WgpuAllocator, WgpuOptions};
use devalloc::{DeviceAllocator, DeviceMemoryBuffer, PlanLayout, PoolOptions, DEFAULT_ALIGNMENT};

pub(crate) const BACKENDS: [wgpu::Backend; 2] = [wgpu::Backend::Vulkan, wgpu::Backend::Gl];

/// The app's own device and queue on `backend`, as a wgpu app would open them.
pub(crate) fn app_device(backend: wgpu::Backend) -> Option<(wgpu::Device, wgpu::Queue)> {
    open_app_device(backend, wgpu::Features::empty())
}

/// A device opened with MAPPABLE_PRIMARY_BUFFERS where the adapter offers it (the direct route
/// on lavapipe), else a plain one.
pub(crate) fn app_device_mappable(backend: wgpu::Backend) -> Option<(wgpu::Device, wgpu::Queue)> {
    open_app_device(backend, wgpu::Features::MAPPABLE_PRIMARY_BUFFERS)
}

/// A device of `backend` with those of `features` the adapter offers; `None`, saying so, where
/// the backend has no adapter (under CI=true a failure).
fn open_app_device(backend: wgpu::Backend, features: wgpu::Features) -> Option<(wgpu::Device, wgpu::Queue)> {
    conformance::logging::init_for_tests();
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backend.into();
    let instance = wgpu::Instance::new(desc);
    let adapter = match pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions::default()))
    {
        Ok(a) => a,
        Err(e) if conformance::in_ci() => panic!("no {backend:?} adapter under CI: {e}"),
        Err(e) => {
            conformance::skip("a wgpu app test", &format!("no {backend:?} adapter: {e}"));
            return None;
        }
    };
    let desc = wgpu::DeviceDescriptor {
        required_features: adapter.features() & features,
        required_limits: adapter.limits(),
        ..Default::default()
    };
    Some(pollster::block_on(adapter.request_device(&desc)).expect("device"))
}

pub(crate) fn counter() -> (Arc<AtomicUsize>, impl Fn() -> usize) {
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
    pub(crate) fn heard_once(&self, what: &str) {
        let fired = self.fired.load(Ordering::SeqCst);
        assert_eq!(fired, 1, "{what}: the app's on_device_lost fired {fired} times");
        let leaked = self.errors.lock().unwrap().clone();
        assert!(leaked.is_empty(), "{what}: devalloc's errors reached the app's handler: {leaked:?}");
    }
}

/// The app's device, watched, adopted by an allocator on `route` that gets the app's
/// `on_device_lost`; `None` where the backend has no adapter (or no direct route here: see
/// `wgpu_hostile::on_route`).
pub(crate) fn adopt_watched(
    backend: wgpu::Backend,
    route: Route,
) -> Option<(wgpu::Device, wgpu::Queue, WgpuAllocator, Watched)> {
    // Mappable where the adapter allows: else the direct route would never be taken.
    let (device, queue) = app_device_mappable(backend)?;
    let watch = Watched::on(&device);
    let options =
        WgpuOptions { route: Some(route), on_device_lost: Some(watch.on_lost()), ..WgpuOptions::default() };
    let made = WgpuAllocator::from_device_with_options(device.clone(), queue.clone(), options);
    crate::wgpu_hostile::on_route(backend, route, made).map(|a| (device, queue, a, watch))
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
