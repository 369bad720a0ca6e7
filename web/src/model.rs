//! The page's network (`examples/support/network.rs`), on weights the page makes or on a model
//! file it streamed onto the device (`scripts/make-model` writes one beside the page).

use devalloc::DeviceAllocator;
use js_sys::Promise;
use serde::Serialize;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::args::{address, count, describe, error};
use crate::{js, network, to_js, Devalloc};

/// The page's own network's widths (its weights made by the page).
const WIDTHS: [usize; 5] = [256, 512, 256, 128, 10];
/// The batch both runs use.
const BATCH: usize = 8;

#[derive(Serialize)]
struct Tensor {
    label: String,
    size: u64,
    first: u64,
    last: u64,
    offset: u64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Network {
    max_error: f32,
    planned_bytes: u64,
    unplanned_bytes: u64,
    lower_bound: u64,
    tensors: Vec<Tensor>,
}

fn report(r: network::Report) -> Result<JsValue, JsValue> {
    let tensors = (r.tensors.into_iter().zip(r.plan.offsets()))
        .map(|((label, size, first, last), &offset)| Tensor { label, size, first, last, offset })
        .collect();
    to_js(&Network {
        max_error: r.worst,
        planned_bytes: r.plan.size(),
        unplanned_bytes: r.unplanned,
        lower_bound: r.plan.lower_bound(),
        tensors,
    })
}

#[wasm_bindgen]
impl Devalloc {
    /// Runs a few dense layers of a network in WGSL on devalloc memory (weights and biases in
    /// labelled allocations, activations on a plan from devalloc's planner in one planned
    /// buffer, at bindable offsets); resolves to `{maxError, plannedBytes, unplannedBytes,
    /// lowerBound, tensors}`: max |gpu - cpu|, the activations' buffer, what they would take
    /// one after another, the most bytes of them live at once, and the plan itself, one
    /// `{label, size, first, last, offset}` per activation (live from step `first` to step
    /// `last`, both included, at `offset` bytes into the planned buffer).
    pub fn run_network(&self) -> Promise {
        let a = self.alloc;
        future_to_promise(async move { report(network::run(a, &WIDTHS, BATCH).await.map_err(js)?) })
    }

    /// The same network with layers of `widths` (a JS array of at least two whole numbers),
    /// on a model file already on the device at `model` (laid out as `scripts/make-model`
    /// writes it: each layer's weights then biases, f32, each at a multiple of 256 bytes);
    /// resolves as `run_network` does, the CPU's reference made from the weights read back.
    /// A model allocation shorter than the layout is an exception before anything runs.
    #[wasm_bindgen(js_name = runNetworkOn)]
    pub fn run_network_on(&self, model: JsValue, widths: JsValue) -> Result<Promise, JsValue> {
        let a = self.alloc;
        let model = address(&model, "model")?;
        let array = widths.dyn_ref::<js_sys::Array>().ok_or_else(|| {
            error(format!("widths must be an array of layer widths, got {}", describe(&widths)))
        })?;
        let widths = array.iter().map(|w| count(&w, "widths[i]", "units")).collect::<Result<Vec<_>, _>>()?;
        if widths.len() < 2 || widths.contains(&0) {
            return Err(error(format!("widths must be at least two widths above 0, got {widths:?}")));
        }
        let need = network::model_layout(&widths).1;
        let room = a.bytes_after(model, 0).map_err(js)?;
        if (room as u64) < need {
            return Err(error(format!(
                "the model at {model} has {room} bytes from there, and layers of {widths:?} need {need}"
            )));
        }
        Ok(future_to_promise(async move {
            report(network::run_with(a, &widths, BATCH, Some(model)).await.map_err(js)?)
        }))
    }

    /// The browser's own handles for the allocation at `ptr`, for the page's hand-written peer
    /// of `writeFromStream` (a stream reader feeding `GPUQueue.writeBuffer`):
    /// `{buffer: GPUBuffer, offset, size, queue: GPUQueue}`, or `null` where the device is not
    /// the browser's WebGPU (WebGL2).
    #[wasm_bindgen(js_name = webgpuTarget)]
    pub fn webgpu_target(&self, ptr: JsValue) -> Result<JsValue, JsValue> {
        let a = self.alloc;
        let range = a.buffer(address(&ptr, "ptr")?, 0).map_err(js)?;
        let queue = a.queue(0).map_err(js)?;
        let (Some(buffer), Some(queue)) = (range.buffer.as_webgpu(), queue.as_webgpu()) else {
            return Ok(JsValue::NULL);
        };
        let out = js_sys::Object::new();
        for (key, value) in [
            ("buffer", JsValue::from(buffer.clone())),
            ("offset", JsValue::from(range.range.start as f64)),
            ("size", JsValue::from(range.len() as f64)),
            ("queue", JsValue::from(queue.clone())),
        ] {
            js_sys::Reflect::set(&out, &key.into(), &value)?;
        }
        Ok(out.into())
    }
}
