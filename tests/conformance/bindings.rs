//! wgpu's binding promise, on every wgpu backend: allocations the app made separately never
//! share a wgpu buffer (wgpu tracks usage per buffer, so two that did could not be bound as
//! read-only and read-write storage, or uniform and read-write storage, in one dispatch),
//! whatever the pool's cache and budget did before. After heavy churn (allocations of many
//! sizes and usages, freed in a scrambled order, so that the cache holds blocks of every size
//! and the budget has given some back), three independent allocations are bound in one
//! dispatch: one read-only storage, one read-write storage and a uniform, inside an error scope
//! that must stay empty, and the kernel's output is checked.

use devalloc::wgpu::{BindingKind, BufferRequest, WgpuAllocator};
use devalloc::{DeviceAllocator, DeviceIndex, DevicePtr};

use super::{d2h, h2d, skip};

const KERNEL: &str = r#"
struct P { scale: f32, add: f32, pad0: f32, pad1: f32 }
@group(0) @binding(0) var<storage, read> input: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> p: P;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&out)) { out[id.x] = input[id.x] * p.scale + p.add; }
}
"#;

/// Allocations of many sizes and both usages, freed in a scrambled order; returns the few it
/// keeps live.
fn churn(a: &WgpuAllocator, i: DeviceIndex) -> Vec<DevicePtr> {
    let mut seed = 0x9e37_79b9_u32;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed
    };
    let mut live: Vec<DevicePtr> = Vec::new();
    let mut kept = Vec::new();
    for round in 0..400 {
        let size = 16 + (next() % 4096) as usize * 4;
        let request = BufferRequest::new(size).label("churn");
        let request = if round % 3 == 0 { request.usage(wgpu::BufferUsages::UNIFORM) } else { request };
        live.push(a.allocate_request(&request, i).unwrap());
        if live.len() > 8 {
            let victim = live.swap_remove(next() as usize % live.len());
            if round % 50 == 0 {
                kept.push(victim);
            } else {
                a.deallocate(victim, i).unwrap();
            }
        }
    }
    for p in live {
        a.deallocate(p, i).unwrap();
    }
    kept
}

/// See the module docs.
pub async fn independent_allocations_bind_together_after_churn(a: &WgpuAllocator, i: DeviceIndex) {
    let kept = churn(a, i);
    assert!(a.stats(i).unwrap().cached_bytes > 0, "the churn leaves blocks cached");
    let n = 256usize;
    let input = a.allocate_request(&BufferRequest::new(n * 4).label("input"), i).unwrap();
    let out = a.allocate_request(&BufferRequest::new(n * 4).label("out"), i).unwrap();
    let params = a
        .allocate_request(&BufferRequest::new(16).usage(wgpu::BufferUsages::UNIFORM).label("params"), i)
        .unwrap();
    let ranges = [a.buffer(input, i).unwrap(), a.buffer(out, i).unwrap(), a.buffer(params, i).unwrap()];
    let slices: Vec<wgpu::BufferSlice<'_>> = ranges.iter().map(|r| r.slice().unwrap()).collect();
    for (x, sx) in slices.iter().enumerate() {
        for sy in &slices[x + 1..] {
            assert!(sx.buffer() != sy.buffer(), "two independent allocations share a wgpu buffer");
        }
    }
    let data: Vec<f32> = (0..n).map(|k| k as f32 - 100.0).collect();
    h2d(a, input, bytemuck::cast_slice(&data), i).await.unwrap();
    h2d(a, params, bytemuck::cast_slice(&[3.0f32, 0.25, 0.0, 0.0]), i).await.unwrap();
    let device = a.device(i).unwrap();
    let limits = device.limits();
    if limits.max_storage_buffers_per_shader_stage < 2 || limits.max_compute_workgroup_size_x < 64 {
        // WebGL2: no compute and no storage buffers, so the conflict cannot arise there; a
        // storage binding is refused by devalloc, naming the limit, before wgpu sees it.
        let e = ranges[0].binding(BindingKind::Storage).unwrap_err();
        assert!(e.to_string().contains("max_storage_buffer_binding_size"), "{e}");
        ranges[2].binding(BindingKind::Uniform).unwrap();
        let why =
            format!("{}:{i} has no compute: the buffers checked apart, not bound together", a.device_type());
        skip("independent_allocations_bind_together_after_churn", &why);
    } else {
        let kinds = [BindingKind::Storage, BindingKind::Storage, BindingKind::Uniform];
        let bindings: Vec<wgpu::BufferBinding<'_>> =
            ranges.iter().zip(kinds).map(|(r, k)| r.binding(k).unwrap()).collect();
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("bindings"),
            source: wgpu::ShaderSource::Wgsl(KERNEL.into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("bindings"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let entries: Vec<wgpu::BindGroupEntry<'_>> = bindings
            .iter()
            .enumerate()
            .map(|(k, b)| wgpu::BindGroupEntry {
                binding: k as u32,
                resource: wgpu::BindingResource::Buffer(b.clone()),
            })
            .collect();
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("bindings"),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let mut enc = device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &group, &[]);
            pass.dispatch_workgroups(n.div_ceil(64) as u32, 1, 1);
        }
        a.queue(i).unwrap().submit([enc.finish()]);
        let error = scope.pop().await;
        assert!(error.is_none(), "wgpu refused the dispatch: {error:?}");
        let mut back = vec![0u8; n * 4];
        d2h(a, &mut back, out, i).await.unwrap();
        let back: &[f32] = bytemuck::cast_slice(&back);
        for (k, v) in back.iter().enumerate() {
            assert_eq!(*v, data[k] * 3.0 + 0.25, "out[{k}]");
        }
    }
    drop(slices);
    for p in [input, out, params].into_iter().chain(kept) {
        a.deallocate(p, i).unwrap();
    }
}

const STALE_KERNEL: &str = r#"
struct P { x: vec4<f32> }
@group(0) @binding(0) var<uniform> p: P;
@compute @workgroup_size(1)
fn main() { _ = p.x; }
@vertex
fn vs(@builtin(vertex_index) i: u32) -> @builtin(position) vec4<f32> {
    return vec4<f32>(p.x.x + f32(i) * 0.0, 0.0, 0.0, 1.0);
}
@fragment
fn fs() -> @location(0) vec4<f32> { return p.x; }
"#;

/// A bind group the app keeps past the free of the allocation it binds, then submits: with
/// `PoolOptions::reuse_freed` off the submit is a validation error naming the destroyed block
/// (what the docs promise); with reuse on (the default) it runs silently on the old buffer,
/// the bug that setting exists to show. Through a compute dispatch where the device has
/// compute, a render pass to a 1x1 texture elsewhere (WebGL2). Returns wgpu's error.
pub async fn stale_bind_group(a: &WgpuAllocator, i: DeviceIndex) -> Option<wgpu::Error> {
    let device = a.device(i).unwrap();
    let params = a
        .allocate_request(&BufferRequest::new(16).usage(wgpu::BufferUsages::UNIFORM).label("params"), i)
        .unwrap();
    h2d(a, params, bytemuck::cast_slice(&[0.5f32, 0.5, 0.5, 1.0]), i).await.unwrap();
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("stale"),
        source: wgpu::ShaderSource::Wgsl(STALE_KERNEL.into()),
    });
    let compute = device.limits().max_compute_workgroup_size_x > 0;
    let mut enc = device.create_command_encoder(&Default::default());
    let range = a.buffer(params, i).unwrap();
    let entries = [wgpu::BindGroupEntry {
        binding: 0,
        resource: wgpu::BindingResource::Buffer(range.binding(BindingKind::Uniform).unwrap()),
    }];
    if compute {
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("stale"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let layout = pipeline.get_bind_group_layout(0);
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &layout,
            entries: &entries,
        });
        drop(range);
        a.deallocate(params, i).unwrap();
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(1, 1, 1);
    } else {
        let format = wgpu::TextureFormat::Rgba8Unorm;
        let target = device.create_texture(&wgpu::TextureDescriptor {
            label: Some("stale"),
            size: wgpu::Extent3d { width: 1, height: 1, depth_or_array_layers: 1 },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format,
            usage: wgpu::TextureUsages::RENDER_ATTACHMENT,
            view_formats: &[],
        });
        let view = target.create_view(&Default::default());
        let pipeline = device.create_render_pipeline(&wgpu::RenderPipelineDescriptor {
            label: Some("stale"),
            layout: None,
            vertex: wgpu::VertexState {
                module: &module,
                entry_point: Some("vs"),
                compilation_options: Default::default(),
                buffers: &[],
            },
            primitive: Default::default(),
            depth_stencil: None,
            multisample: Default::default(),
            fragment: Some(wgpu::FragmentState {
                module: &module,
                entry_point: Some("fs"),
                compilation_options: Default::default(),
                targets: &[Some(format.into())],
            }),
            multiview_mask: None,
            cache: None,
        });
        let layout = pipeline.get_bind_group_layout(0);
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &layout,
            entries: &entries,
        });
        drop(range);
        a.deallocate(params, i).unwrap();
        let mut pass = enc.begin_render_pass(&wgpu::RenderPassDescriptor {
            label: Some("stale"),
            color_attachments: &[Some(wgpu::RenderPassColorAttachment {
                view: &view,
                depth_slice: None,
                resolve_target: None,
                ops: wgpu::Operations {
                    load: wgpu::LoadOp::Clear(wgpu::Color::BLACK),
                    store: wgpu::StoreOp::Store,
                },
            })],
            depth_stencil_attachment: None,
            timestamp_writes: None,
            occlusion_query_set: None,
            multiview_mask: None,
        });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.draw(0..3, 0..1);
    }
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    a.queue(i).unwrap().submit([enc.finish()]);
    scope.pop().await
}
