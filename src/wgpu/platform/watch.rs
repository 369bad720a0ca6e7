//! The browser's watch on a device: what tells at once that the browser took it away (see
//! `web.rs`'s module docs, "When the browser takes the device away"): devalloc's sentinel
//! buffer on WebGPU, the context and its `webglcontextlost` listener on WebGL2.

use std::sync::Weak;

#[cfg(feature = "webgl")]
use wasm_bindgen::closure::Closure;
#[cfg(feature = "webgl")]
use wasm_bindgen::JsCast;

use super::Record;

/// What tells at once that the browser took a device away (see the module docs).
pub(super) enum Watch {
    /// WebGPU: devalloc's sentinel buffer, mapped at creation and never unmapped.
    #[cfg(feature = "webgpu")]
    Sentinel { buffer: wgpu::Buffer, unmapped: wasm_bindgen::JsValue },
    /// WebGL2: the context, and the `webglcontextlost` listener on its canvas.
    #[cfg(feature = "webgl")]
    Context { gl: web_sys::WebGl2RenderingContext, listening: Option<Listening> },
    /// Nothing to watch (the device is of neither kind).
    None,
}

impl Watch {
    /// The watch of `device`, whose loss is recorded in `record`.
    pub(super) fn of(device: &wgpu::Device, record: Weak<dyn Record>) -> Watch {
        let _ = &record;
        match device.adapter_info().backend {
            #[cfg(feature = "webgpu")]
            wgpu::Backend::BrowserWebGpu => {
                // MAP_WRITE alone, 4 bytes, mapped at creation: nothing WebGPU could refuse.
                let buffer = device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("devalloc loss sentinel"),
                    size: 4,
                    usage: wgpu::BufferUsages::MAP_WRITE,
                    mapped_at_creation: true,
                });
                Watch::Sentinel { buffer, unmapped: "unmapped".into() }
            }
            #[cfg(feature = "webgl")]
            wgpu::Backend::Gl => match webgl2_context(device) {
                Some(gl) => {
                    let listening = listen_for_loss(&gl, record);
                    Watch::Context { gl, listening }
                }
                None => Watch::None,
            },
            _ => Watch::None,
        }
    }

    /// `Some` once the device is gone: its reason and message.
    pub(super) fn gone(&self) -> Option<(wgpu::DeviceLostReason, &'static str)> {
        match self {
            #[cfg(feature = "webgpu")]
            Watch::Sentinel { buffer, unmapped } => {
                let raw = buffer.as_webgpu()?;
                let state = js_sys::Reflect::get(raw.as_ref(), &"mapState".into()).ok()?;
                (&state == unmapped).then_some((
                    wgpu::DeviceLostReason::Destroyed,
                    "GPUDevice.destroy() was called (it unmapped devalloc's sentinel buffer)",
                ))
            }
            #[cfg(feature = "webgl")]
            Watch::Context { gl, .. } => {
                gl.is_context_lost().then_some((wgpu::DeviceLostReason::Unknown, CONTEXT_LOST))
            }
            Watch::None => None,
        }
    }
}

#[cfg(feature = "webgl")]
impl Drop for Watch {
    fn drop(&mut self) {
        if let Watch::Context { listening: Some((canvas, listener)), .. } = self {
            let _ = canvas
                .remove_event_listener_with_callback("webglcontextlost", listener.as_ref().unchecked_ref());
        }
    }
}

/// A canvas and the `webglcontextlost` listener devalloc put on it (removed on drop).
#[cfg(feature = "webgl")]
type Listening = (web_sys::EventTarget, Closure<dyn FnMut(web_sys::Event)>);

/// The message of a lost WebGL2 context.
#[cfg(feature = "webgl")]
const CONTEXT_LOST: &str = "the browser lost the WebGL2 context";

/// The WebGL2 context wgpu's GL backend draws with on `device`.
#[cfg(feature = "webgl")]
#[allow(unsafe_code)]
fn webgl2_context(device: &wgpu::Device) -> Option<web_sys::WebGl2RenderingContext> {
    // SAFETY: only the context's JS handle is cloned out of the hal device, and the guard is
    // dropped at once: nothing is called on the hal device, so none of wgpu-hal's rules can be
    // broken.
    let hal = unsafe { device.as_hal::<wgpu::hal::api::Gles>() }?;
    Some(hal.context().webgl2_context.clone())
}

/// A `webglcontextlost` listener on the canvas of `gl` that records the loss in `record`.
#[cfg(feature = "webgl")]
fn listen_for_loss(gl: &web_sys::WebGl2RenderingContext, record: Weak<dyn Record>) -> Option<Listening> {
    let canvas: web_sys::EventTarget = gl.canvas()?.dyn_into().ok()?;
    let listener = Closure::<dyn FnMut(web_sys::Event)>::new(move |_| {
        if let Some(record) = record.upgrade() {
            record.mark_lost(Some(wgpu::DeviceLostReason::Unknown), CONTEXT_LOST);
        }
    });
    canvas.add_event_listener_with_callback("webglcontextlost", listener.as_ref().unchecked_ref()).ok()?;
    Some((canvas, listener))
}
