//! Streamed copies from JS `ReadableStream`s (`devalloc::stream::write_from_readable_stream`),
//! in the browser: whole, from an interior address, failing part-way, locked, of the wrong
//! chunk type, too long, and 512 MiB through a 64 MiB allocation with the module's memory flat.

use devalloc::stream::{write_from_readable_stream, StreamOptions};
use devalloc::{DeviceAllocator, DeviceIndex, Error, DEFAULT_ALIGNMENT};
use wasm_bindgen::{JsCast, JsValue};

use super::*;

/// A JS stream of `chunks` (any JS values) that then closes, or errors with `fail`.
fn js_stream(chunks: &[JsValue], fail: Option<&str>) -> web_sys::ReadableStream {
    let make = js_sys::Function::new_with_args(
        "chunks, fail",
        // Pulled one at a time: an error in `start` would drop the chunks still queued.
        "let i = 0; return new ReadableStream({ pull(c) { if (i < chunks.length) c.enqueue(chunks[i++]); \
         else if (fail) c.error(new Error(fail)); else c.close(); } })",
    );
    let array: js_sys::Array = chunks.iter().collect();
    let fail = fail.map_or(JsValue::UNDEFINED, JsValue::from);
    make.call2(&JsValue::UNDEFINED, &array, &fail).unwrap().unchecked_into()
}

/// `data` as `Uint8Array` chunks of `n` bytes.
fn byte_chunks(data: &[u8], n: usize) -> Vec<JsValue> {
    data.chunks(n).map(|c| js_sys::Uint8Array::from(c).into()).collect()
}

/// The module's memory now, in bytes.
fn wasm_memory() -> f64 {
    let memory: js_sys::WebAssembly::Memory = wasm_bindgen::memory().unchecked_into();
    memory.buffer().unchecked_into::<js_sys::ArrayBuffer>().byte_length() as f64
}

pub async fn readable_streams(a: &'static dyn DeviceAllocator, i: DeviceIndex) {
    let (size, off, len) = (4096usize, 12usize, 3000usize);
    let ptr = a.allocate(size, i, DEFAULT_ALIGNMENT).unwrap();
    let before = pattern(size, 5);
    h2d(a, ptr, &before, i).await.unwrap();
    let dst = ptr.offset(off).unwrap();
    let data = pattern(len, 6);
    let mut expect = before.clone();
    expect[off..off + len].copy_from_slice(&data);
    let mut seen = Vec::new();
    let options = StreamOptions::new().window(1000).on_progress(|p| seen.push(p.done));
    let n =
        write_from_readable_stream(a, dst, len, i, js_stream(&byte_chunks(&data, 333), None), options).await;
    assert_eq!(n.unwrap(), len as u64);
    assert!(read(a, ptr, size, i).await == expect);
    assert_eq!(seen.last(), Some(&(len as u64)));

    // Errors part-way: what it gave before landed, the reason is JS's.
    h2d(a, ptr, &before, i).await.unwrap();
    let stream = js_stream(&byte_chunks(&data[..2500], 500), Some("the network went away"));
    let r = write_from_readable_stream(a, dst, len, i, stream, StreamOptions::new().window(1000)).await;
    match r {
        Err(e @ Error::Stream { landed: 2500, .. }) => {
            assert!(e.to_string().contains("the network went away"), "{e}")
        }
        other => panic!("an erroring stream: {other:?}"),
    }
    let got = read(a, ptr, size, i).await;
    assert!(got[off..off + 2500] == data[..2500] && got[off + 2500..] == before[off + 2500..]);
    // A chunk that is not bytes; a stream locked to another reader (nothing read or written).
    let r = write_from_readable_stream(
        a,
        dst,
        len,
        i,
        js_stream(&[JsValue::from("text")], None),
        StreamOptions::new(),
    )
    .await;
    assert!(
        matches!(&r, Err(Error::Stream { landed: 0, reason, .. }) if reason.contains("Uint8Array")),
        "{r:?}"
    );
    let locked = js_stream(&byte_chunks(&data, 100), None);
    let _reader = locked.get_reader();
    let r = write_from_readable_stream(a, dst, len, i, locked, StreamOptions::new()).await;
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    // One byte too long: the range is written, nothing past it.
    h2d(a, ptr, &before, i).await.unwrap();
    let mut long = data.clone();
    long.push(9);
    let r = write_from_readable_stream(
        a,
        dst,
        len,
        i,
        js_stream(&byte_chunks(&long, 1024), None),
        StreamOptions::new(),
    )
    .await;
    assert!(matches!(r, Err(Error::Stream { landed: 3000, .. })), "{r:?}");
    assert!(read(a, ptr, size, i).await == expect, "a too-long stream wrote past its range");
    a.deallocate(ptr, i).unwrap();
}

/// 512 MiB of 1 MiB chunks made in JS as they are pulled, through one 64 MiB allocation eight
/// times: the module's memory grows by the window and a chunk, not by the data.
pub async fn half_a_gib_with_memory_flat(a: &'static dyn DeviceAllocator, i: DeviceIndex) {
    const MIB: usize = 1 << 20;
    let ptr = a.allocate(64 * MIB, i, DEFAULT_ALIGNMENT).unwrap();
    let make = js_sys::Function::new_with_args(
        "mib, tag",
        "let sent = 0; return new ReadableStream({ pull(c) { if (sent === mib) { c.close(); return; } \
         const b = new Uint8Array(1 << 20); b.fill((sent * 7 + tag) & 255); c.enqueue(b); sent += 1; } })",
    );
    let start = wasm_memory();
    let mut grew = 0f64;
    for round in 0..8u32 {
        let stream = make.call2(&JsValue::UNDEFINED, &JsValue::from(64), &JsValue::from(round)).unwrap();
        let n =
            write_from_readable_stream(a, ptr, 64 * MIB, i, stream.unchecked_into(), StreamOptions::new())
                .await;
        assert_eq!(n.unwrap(), (64 * MIB) as u64);
        grew = grew.max(wasm_memory() - start);
        // The first and last MiB of this round's data.
        for k in [0usize, 63] {
            let got = read(a, ptr.offset(k * MIB).unwrap(), MIB, i).await;
            let want = ((k * 7 + round as usize) & 255) as u8;
            assert!(got.iter().all(|&b| b == want), "round {round}, MiB {k}: the bytes differ");
        }
    }
    a.deallocate(ptr, i).unwrap();
    wasm_bindgen_test::console_log!("streamed 512 MiB; the module's memory grew by {grew} bytes");
    assert!(grew <= (12 * MIB) as f64, "the module's memory grew by {grew} bytes while 512 MiB streamed");
}
