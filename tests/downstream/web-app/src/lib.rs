//! A tiny app on devalloc: scales floats on the GPU with a WGSL kernel.
use devalloc::wgpu::api as wgpu;
use devalloc::{DEFAULT_ALIGNMENT, DeviceAllocator};
use devalloc::wgpu::{BindingKind, WgpuAllocator};

const SCALE: &str = "@group(0) @binding(0) var<storage, read_write> v: array<f32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&v)) { v[id.x] = v[id.x] * 3.0; }
}";

/// `values` times 3, computed on device 0 of `alloc`.
pub async fn triple(alloc: &WgpuAllocator, values: &[f32]) -> devalloc::Result<Vec<f32>> {
    let p = alloc.allocate(values.len() * 4, 0, DEFAULT_ALIGNMENT)?;
    alloc.copy_host_to_device_async(p, bytemuck::cast_slice(values), 0).await?;
    let device = alloc.device(0)?;
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor { label: None, source: wgpu::ShaderSource::Wgsl(SCALE.into()) });
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
        pass.dispatch_workgroups(values.len().div_ceil(64) as u32, 1, 1);
    }
    alloc.queue(0)?.submit([enc.finish()]);
    let mut out = vec![0f32; values.len()];
    alloc.copy_device_to_host_async(bytemuck::cast_slice_mut(&mut out), p, 0).await?;
    alloc.deallocate(p, 0)?;
    Ok(out)
}
