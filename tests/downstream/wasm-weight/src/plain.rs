//! The same app on plain wgpu, as a careful user writes it: its own device, `write_buffer`, a
//! `MAP_READ` buffer for the read-back, an error scope for the read past the end.
use wasm_bindgen::JsValue;
use wgpu::util::DeviceExt;

fn js(e: impl std::fmt::Display) -> JsValue {
    JsValue::from_str(&e.to_string())
}

pub async fn run() -> Result<usize, JsValue> {
    let instance = wgpu::Instance::default();
    let adapter = instance.request_adapter(&Default::default()).await.map_err(js)?;
    let (device, queue) = adapter.request_device(&Default::default()).await.map_err(js)?;
    let input = super::input();
    let bytes = (input.len() * 4) as u64;
    let storage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC;
    let a = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: bytemuck::cast_slice(&input),
        usage: storage,
    });
    let b = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: bytes,
        usage: storage,
        mapped_at_creation: false,
    });
    let read = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: bytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let pipeline = super::pipeline(&device);
    let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry { binding: 0, resource: a.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 1, resource: b.as_entire_binding() },
        ],
    });
    let mut enc = super::dispatch(&device, &pipeline, &group, input.len());
    enc.copy_buffer_to_buffer(&b, 0, &read, 0, bytes);
    queue.submit([enc.finish()]);
    let (tx, rx) = futures_channel::oneshot::channel();
    read.slice(..).map_async(wgpu::MapMode::Read, move |r| drop(tx.send(r)));
    rx.await.map_err(js)?.map_err(js)?;
    let out: Vec<f32> = bytemuck::cast_slice(&read.slice(..).get_mapped_range().map_err(js)?).to_vec();
    read.unmap();
    // A read one float past the end is refused (a validation error, caught in a scope).
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let mut enc = device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(&b, 0, &read, 0, bytes + 4);
    queue.submit([enc.finish()]);
    if scope.pop().await.is_none() {
        return Err(JsValue::from_str("a read past the end was not refused"));
    }
    super::check(&out, &input)
}
