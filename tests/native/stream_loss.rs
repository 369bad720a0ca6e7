//! Streamed copies when the device goes away part-way: a reader that destroys the app's device
//! after some bytes (as a driver reset would, mid-load). The stream stops with `Error::Stream`,
//! whole windows landed before it, the device's `DeviceLost` as its source; no panic, no hang;
//! the allocator's bookkeeping still works. On Vulkan (lavapipe) and GL (llvmpipe), on both
//! routes where the adapter has them. And a reader that panics.

use std::io::Read;

use devalloc::stream::{write_from_reader, write_from_stream, StreamOptions};
use devalloc::wgpu::Route;
use devalloc::{DeviceAllocator, Error, DEFAULT_ALIGNMENT};

use crate::wgpu_app::{adopt_watched, BACKENDS};

/// Gives `len` bytes, destroying `device` once `at` bytes have been given.
struct DestroyAt {
    given: usize,
    len: usize,
    at: usize,
    device: Option<wgpu::Device>,
}

impl Read for DestroyAt {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.given >= self.at {
            if let Some(d) = self.device.take() {
                d.destroy();
            }
        }
        // Up to `at` first, so that the loss comes exactly there; then the rest.
        let end = if self.given < self.at { self.at } else { self.len };
        let n = buf.len().min(end - self.given);
        buf[..n].fill(0x5A);
        self.given += n;
        Ok(n)
    }
}

/// Checks a stream that the device's loss stopped: landed is whole windows, short of the end,
/// and the source is `DeviceLost`.
fn lost_part_way(r: devalloc::Result<u64>, len: usize, half: usize, what: &str) {
    match r {
        Err(ref e @ Error::Stream { landed, .. }) => {
            assert!(landed < len as u64 && landed % half as u64 == 0, "{what}: {landed} landed: {e}");
            let source = std::error::Error::source(e).and_then(|s| s.downcast_ref::<Error>());
            assert!(
                matches!(source, Some(Error::DeviceLost { .. })),
                "{what}: the source is {source:?}: {e}"
            );
        }
        other => panic!("{what}: a stream the device's loss stopped: {other:?}"),
    }
}

#[test]
fn a_device_destroyed_mid_stream_stops_it_with_what_landed_and_device_lost() {
    const LEN: usize = 4 << 20;
    const WINDOW: usize = 256 << 10;
    for backend in BACKENDS {
        for route in [Route::Staged, Route::Direct] {
            let what = format!("{backend:?} {route:?}");
            let Some((device, _queue, a, _watch)) = adopt_watched(backend, route) else { continue };
            let ptr = a.allocate(LEN, 0, DEFAULT_ALIGNMENT).unwrap();
            let mut reader = DestroyAt { given: 0, len: LEN, at: LEN / 2, device: Some(device) };
            let r = write_from_reader(&a, ptr, LEN, 0, &mut reader, StreamOptions::new().window(WINDOW));
            lost_part_way(r, LEN, WINDOW / 2, &what);
            // The async form on the lost device: refused at the range check or the first copy.
            let chunks = futures_core_stream(vec![vec![1u8; 4096]; 4]);
            let r = pollster::block_on(write_from_stream(&a, ptr, 4 * 4096, 0, chunks, StreamOptions::new()));
            assert!(
                matches!(r, Err(Error::DeviceLost { .. } | Error::Stream { landed: 0, .. })),
                "{what}: {r:?}"
            );
            a.deallocate(ptr, 0).unwrap();
        }
    }
}

/// A ready stream of `chunks`.
fn futures_core_stream(
    chunks: Vec<Vec<u8>>,
) -> impl futures_core::Stream<Item = std::io::Result<Vec<u8>>> + Unpin {
    struct It(std::vec::IntoIter<Vec<u8>>);
    impl futures_core::Stream for It {
        type Item = std::io::Result<Vec<u8>>;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            std::task::Poll::Ready(self.0.next().map(Ok))
        }
    }
    It(chunks.into_iter())
}

/// A reader that panics (on the reading thread) panics the caller with its own message, and
/// the allocator stays usable.
#[test]
fn a_reader_that_panics_panics_the_caller_with_its_own_message() {
    struct Panics;
    impl Read for Panics {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            panic!("the reader's own panic");
        }
    }
    let a = devalloc::HostAllocator::new();
    let ptr = a.allocate(64, 0, DEFAULT_ALIGNMENT).unwrap();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        write_from_reader(&a, ptr, 64, 0, &mut Panics, StreamOptions::new())
    }));
    let payload = caught.expect_err("the reader's panic reaches the caller");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"the reader's own panic"));
    a.copy_host_to_device(ptr, &[1u8; 64], 0).unwrap();
    a.deallocate(ptr, 0).unwrap();
}
