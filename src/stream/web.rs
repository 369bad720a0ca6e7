//! Streamed copies in the browser: a range filled from a JS `ReadableStream` (a `fetch` body),
//! through the window, without the stream's bytes ever being in wasm memory at once.

use std::fmt;

use futures_core::Stream;
use wasm_bindgen::JsCast;

use super::{write_from_stream, Progress, StreamOptions};
use crate::allocator::DeviceAllocator;
use crate::device::DeviceIndex;
use crate::error::Result;
use crate::ptr::DevicePtr;

/// A JS stream's failure: what it rejected with, as text.
#[derive(Debug)]
struct JsStreamError(String);

impl fmt::Display for JsStreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for JsStreamError {}

/// `value` as text for an error: an `Error`'s message, a string, or what JS prints.
fn js_text(value: &wasm_bindgen::JsValue) -> String {
    if let Some(e) = value.dyn_ref::<js_sys::Error>() {
        return String::from(e.message());
    }
    value.as_string().unwrap_or_else(|| format!("{value:?}"))
}

/// [`write_from_stream`] over a JS `ReadableStream` of `Uint8Array` chunks (a `fetch` body, a
/// `Blob`'s stream): each chunk is copied into wasm memory only as it comes, so the module's
/// memory grows by the window, not by the data. A stream that errors is an
/// [`crate::Error::Stream`] naming its reason; a chunk that is not a `Uint8Array` is one too;
/// a stream already locked to another reader is refused before anything is read. However the
/// copy ends early, the stream is cancelled and its lock released.
pub async fn write_from_readable_stream<P: FnMut(Progress)>(
    alloc: &dyn DeviceAllocator,
    dst: DevicePtr,
    len: usize,
    index: DeviceIndex,
    stream: web_sys::ReadableStream,
    options: StreamOptions<P>,
) -> Result<u64> {
    let chunks = wasm_streams::ReadableStream::from_raw(stream).try_into_stream().map_err(|(e, _)| {
        crate::error::Error::invalid_argument(format!(
            "the ReadableStream cannot be read: {} (is it locked to another reader?)",
            String::from(e.message())
        ))
    })?;
    write_from_stream(alloc, dst, len, index, Chunks(chunks), options).await
}

/// The stream's chunks as bytes.
struct Chunks<S>(S);

impl<S> Stream for Chunks<S>
where
    S: Stream<Item = std::result::Result<wasm_bindgen::JsValue, wasm_bindgen::JsValue>> + Unpin,
{
    type Item = std::result::Result<Vec<u8>, JsStreamError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        std::pin::Pin::new(&mut self.0).poll_next(cx).map(|item| {
            item.map(|r| match r {
                Ok(chunk) => match chunk.dyn_into::<js_sys::Uint8Array>() {
                    Ok(bytes) => Ok(bytes.to_vec()),
                    Err(other) => Err(JsStreamError(format!(
                        "a chunk of the stream is not a Uint8Array but {}",
                        js_text(&other.js_typeof())
                    ))),
                },
                Err(e) => Err(JsStreamError(format!("the stream errored: {}", js_text(&e)))),
            })
        })
    }
}
