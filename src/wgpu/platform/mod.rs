//! Everything in the wgpu backend that differs between native and the browser, behind one
//! seam: how to wait for a map callback, how an error scope's verdict arrives, how adapters are
//! found, the table of lost-device records, and which blocking calls are allowed. No other
//! wgpu file names a platform.
//!
//! | | native | browser |
//! |---|---|---|
//! | blocking wait | polls the device inline (`device.poll(Wait)`) | refused: [`crate::Error::NotSupported`] naming the async twin |
//! | async wait | a polling thread per device (short timeouts, `catch_unwind`) wakes the task | WebGPU: the browser's event loop; WebGL2: poll, and yield a browser task (`MessageChannel`) in a loop |
//! | error scope verdict | ready at once: an error is returned | arrives later: logged |
//! | adapters | `enumerate_adapters` | `request_adapter` (WebGL2 with a 1x1 offscreen canvas) |

#[cfg(native)]
mod native;
#[cfg(native)]
pub(crate) use native::*;
#[cfg(web)]
mod web;
#[cfg(web)]
pub(crate) use web::*;

/// A call that on native waits for the GPU, and so in the browser must be made async.
#[derive(Clone, Copy, Debug)]
pub(crate) enum MustWait {
    /// A read of device memory.
    Read,
    /// A write whose range is not 4-byte aligned (the edge words are read first).
    RaggedWrite,
    /// A device-to-device copy whose range is not 4-byte aligned.
    RaggedCopy,
    /// Waiting for all submitted work.
    Synchronize,
}

impl MustWait {
    /// The operation and its async twin, for the error message.
    #[cfg_attr(native, allow(dead_code))]
    pub(crate) fn names(self) -> (&'static str, &'static str) {
        match self {
            MustWait::Read => ("copy_device_to_host", "copy_device_to_host_async"),
            MustWait::RaggedWrite => {
                ("copy_host_to_device of a range not aligned to 4 bytes", "copy_host_to_device_async")
            }
            MustWait::RaggedCopy => {
                ("copy_device_to_device of a range not aligned to 4 bytes", "copy_device_to_device_async")
            }
            MustWait::Synchronize => ("synchronize", "synchronize_async"),
        }
    }
}
