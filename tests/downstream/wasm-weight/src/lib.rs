//! One browser app, on plain wgpu or (feature `devalloc`) on devalloc: two 1 MiB buffers
//! uploaded, doubled by a WGSL kernel, read back and checked, and a read past the end refused.
//! `run()` resolves to how many floats it checked, or rejects with what went wrong.
use wasm_bindgen::prelude::*;

const DOUBLE: &str = "@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&b)) { b[id.x] = a[id.x] * 2.0; }
}";
const N: usize = 1 << 18; // 1 MiB of f32

fn input() -> Vec<f32> {
    (0..N).map(|i| i as f32 - 1000.0).collect()
}

/// The kernel's pipeline, on `device`.
fn pipeline(device: &wgpu::Device) -> wgpu::ComputePipeline {
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: None,
        source: wgpu::ShaderSource::Wgsl(DOUBLE.into()),
    });
    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: None,
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    })
}

/// A command encoder with the kernel dispatched over `n` floats.
fn dispatch(
    device: &wgpu::Device,
    pipeline: &wgpu::ComputePipeline,
    group: &wgpu::BindGroup,
    n: usize,
) -> wgpu::CommandEncoder {
    let mut enc = device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, group, &[]);
        pass.dispatch_workgroups(n.div_ceil(64) as u32, 1, 1);
    }
    enc
}

fn check(out: &[f32], input: &[f32]) -> Result<usize, JsValue> {
    if out.len() != input.len() || out.iter().zip(input).any(|(o, i)| *o != i * 2.0) {
        return Err(JsValue::from_str("the kernel's output is not the input doubled"));
    }
    Ok(out.len())
}

#[cfg(feature = "devalloc")]
mod app;
#[cfg(not(feature = "devalloc"))]
#[path = "plain.rs"]
mod app;

/// Runs the app; resolves to the number of floats checked.
#[wasm_bindgen]
pub async fn run() -> Result<usize, JsValue> {
    app::run().await
}

/// The app runs in headless Chromium and checks its own output (`scripts/wasm-weight --check`),
/// so that the sizes reported are of an app that works.
#[cfg(test)]
mod tests {
    use wasm_bindgen_test::wasm_bindgen_test;

    wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

    #[wasm_bindgen_test]
    async fn the_app_doubles_a_mebibyte_and_refuses_a_read_past_the_end() {
        let checked = super::run().await.unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(checked, super::N);
    }
}
