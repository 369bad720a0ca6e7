//! The one-call bindings (`WgpuAllocator::bindings` / `bind_group` with `Bind`), on every wgpu
//! backend: planned tensors and allocations bound in a `let`, checked up front with errors that
//! name the tensor or allocation (wgpu's own would name only `devalloc block N`), and a dispatch
//! through a bind group made in one call, its output checked. WebGL2 has no compute: there the
//! storage refusal and the uniform binding are checked.

use devalloc::plan::{plan, Strategy, TensorLife};
use devalloc::wgpu::{Bind, BufferRequest, WgpuAllocator};
use devalloc::{DeviceAllocator, DeviceIndex, PlannedMemory};

use super::{d2h, h2d};

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

/// See the module docs.
pub async fn bindings_in_one_call(a: &WgpuAllocator, i: DeviceIndex) {
    let n = 256usize;
    let align = a.binding_alignment(i).unwrap() as u64;
    // Three tensors live at once, so the plan puts them apart in one planned buffer.
    let lives = [TensorLife { size: n as u64 * 4, first: 0, last: 1 }; 3];
    let p = plan(&lives, align, Strategy::Fast).unwrap();
    let memory = PlannedMemory::from_plan_labeled(a, &p, i, Some("acts"), &["in", "hidden", "out"]).unwrap();
    let (t_in, t_out) = (memory.tensor(0).unwrap(), memory.tensor(2).unwrap());
    let w = a.allocate_request(&BufferRequest::new(n * 4).label("weights"), i).unwrap();
    let params = a
        .allocate_request(&BufferRequest::new(16).usage(wgpu::BufferUsages::UNIFORM).label("params"), i)
        .unwrap();
    let stats = a.stats(i).unwrap();

    // Refusals, each naming what it is about, and changing nothing.
    let refuse = |binds: &[Bind], wanted: &[&str]| {
        let e = a.bindings(binds, i).err().unwrap_or_else(|| panic!("{binds:?} was allowed")).to_string();
        for w in wanted {
            assert!(e.contains(w), "{w:?} not in: {e}");
        }
    };
    let compute = a.device(i).unwrap().limits().max_storage_buffers_per_shader_stage >= 2;
    if compute {
        refuse(
            &[Bind::read(0, &t_in), Bind::read_write(1, &t_out)],
            &["tensor 'in' (planned buffer 'acts')", "tensor 'out'", "one wgpu buffer", "binding 1"],
        );
        refuse(&[Bind::read_write(0, (w, 64)), Bind::read_write(1, (w, 128))], &["overlapping", "'weights'"]);
        refuse(&[Bind::read(0, w), Bind::read(0, &t_in)], &["binding 0 is given twice"]);
        let inside = w.offset(4).unwrap();
        refuse(&[Bind::read(0, inside)], &["'weights' at", "min_storage_buffer_offset_alignment"]);
        refuse(&[Bind::uniform(0, w)], &["'weights'", "UNIFORM usage"]);
        refuse(&[Bind::read(0, (w, n as u64 * 4 + 4))], &["weights"]);
        // Read-write twice, apart: allowed, in a `let`.
        let both = a.bindings(&[Bind::read_write(0, &t_in), Bind::read_write(1, &t_out)], i).unwrap();
        assert_eq!(both.entries().len(), 2);
    } else {
        refuse(&[Bind::read(0, w)], &["'weights'", "max_storage_buffer_binding_size"]);
    }
    let kept = a.bindings(&[Bind::uniform(2, params)], i).unwrap();
    assert_eq!(kept.entries()[0].binding, 2);
    assert!(a.bindings(&[], 99).is_err(), "a device the allocator does not have");
    assert_eq!(a.stats(i).unwrap(), stats, "checking bindings changes no stats");

    if compute {
        let device = a.device(i).unwrap();
        let data: Vec<f32> = (0..n).map(|k| k as f32 - 7.0).collect();
        h2d(a, w, bytemuck::cast_slice(&data), i).await.unwrap();
        h2d(a, params, bytemuck::cast_slice(&[2.0f32, 0.5, 0.0, 0.0]), i).await.unwrap();
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("bind helper"),
            source: wgpu::ShaderSource::Wgsl(KERNEL.into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("bind helper"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let layout = pipeline.get_bind_group_layout(0);
        if !cfg!(target_arch = "wasm32") {
            // A bind group that does not match its layout: wgpu's message, as an error.
            let e = a.bind_group(&layout, &[Bind::read(0, w)], &[], i).unwrap_err().to_string();
            assert!(e.contains("create_bind_group"), "{e}");
        }
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let binds = [Bind::read(0, w), Bind::read_write(1, &t_out), Bind::uniform(2, params)];
        let group = a.bind_group(&layout, &binds, &[], i).unwrap();
        let mut enc = device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &group, &[]);
            pass.dispatch_workgroups(n.div_ceil(64) as u32, 1, 1);
        }
        a.queue(i).unwrap().submit([enc.finish()]);
        assert!(scope.pop().await.is_none(), "wgpu refused the dispatch");
        let mut back = vec![0u8; n * 4];
        d2h(a, &mut back, t_out.ptr, i).await.unwrap();
        let back: &[f32] = bytemuck::cast_slice(&back);
        for (k, v) in back.iter().enumerate() {
            assert_eq!(*v, data[k] * 2.0 + 0.5, "out[{k}]");
        }
    }
    drop(kept);
    drop(memory);
    a.deallocate(w, i).unwrap();
    a.deallocate(params, i).unwrap();
}
