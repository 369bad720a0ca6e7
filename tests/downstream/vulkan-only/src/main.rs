//! A dependent of devalloc built for Vulkan alone: doubles floats in WGSL on devalloc memory.
//! It names wgpu only through `devalloc::wgpu::api`, so its wgpu is devalloc's.
use devalloc::wgpu::api as wgpu;
use devalloc::{DEFAULT_ALIGNMENT, DeviceAllocator};
use devalloc::wgpu::{BindingKind, WgpuAllocator};

const DOUBLE: &str = "@group(0) @binding(0) var<storage, read_write> v: array<f32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&v)) { v[id.x] = v[id.x] * 2.0; }
}";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let alloc = WgpuAllocator::new(wgpu::Backend::Vulkan)?;
    let values: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    let p = alloc.allocate(values.len() * 4, 0, DEFAULT_ALIGNMENT)?;
    alloc.copy_host_to_device(p, bytemuck::cast_slice(&values), 0)?;
    let device = alloc.device(0)?;
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor { label: None, source: wgpu::ShaderSource::Wgsl(DOUBLE.into()) });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: None,
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let range = alloc.buffer(p, 0)?;
    let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry { binding: 0, resource: wgpu::BindingResource::Buffer(range.binding(BindingKind::Storage)?) }],
    });
    let mut enc = device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(16, 1, 1);
    }
    alloc.queue(0)?.submit([enc.finish()]);
    let mut back = vec![0f32; values.len()];
    alloc.copy_device_to_host(bytemuck::cast_slice_mut(&mut back), p, 0)?;
    alloc.deallocate(p, 0)?;
    if back.iter().zip(&values).any(|(b, v)| *b != v * 2.0) {
        return Err("the kernel's output differs".into());
    }
    println!("vulkan-only: doubled {} floats on {}", values.len(), alloc.device_name(0));
    Ok(())
}
