//! Streamed copies: a range of device memory filled from a reader ([`write_from_reader`]) or
//! from a stream of byte chunks ([`write_from_stream`]) through a host window of bounded size,
//! whatever the data's size. Built on the contract's copies, so every allocator has them.
//! The reader's side (a thread reading ahead, natively) is in `reader.rs`; the browser's
//! `ReadableStream` (a `fetch` body) in `web.rs`.
//!
//! ```
//! use devalloc::stream::{write_from_reader, StreamOptions};
//! use devalloc::{DeviceAllocator, HostAllocator, DEFAULT_ALIGNMENT};
//!
//! let alloc = HostAllocator::new();
//! let weights = vec![7u8; 3 << 20]; // a file, a socket, a decompressor: any `Read`
//! let ptr = alloc.allocate(weights.len(), 0, DEFAULT_ALIGNMENT)?;
//! let mut last = 0;
//! let options = StreamOptions::new().window(1 << 20).on_progress(|p| last = p.done);
//! let n = write_from_reader(&alloc, ptr, weights.len(), 0, &mut &weights[..], options)?;
//! assert_eq!((n, last), (3 << 20, 3 << 20));
//! // One byte too many: an error once the range is full, and nothing past it written.
//! let longer = vec![7u8; (3 << 20) + 1];
//! let e = write_from_reader(&alloc, ptr, weights.len(), 0, &mut &longer[..], StreamOptions::new());
//! assert!(matches!(e, Err(devalloc::Error::Stream { landed, .. }) if landed == 3 << 20));
//! # Ok::<(), devalloc::Error>(())
//! ```

use std::pin::Pin;

use futures_core::Stream;

use crate::allocator::DeviceAllocator;
use crate::device::{Device, DeviceIndex};
use crate::error::{BackendSource, Error, Result};
use crate::ptr::DevicePtr;

mod reader;
pub use reader::{write_from_reader, Source};
#[cfg(web)]
mod web;
#[cfg(web)]
pub use web::write_from_readable_stream;

/// The host memory a streamed copy holds by default, beyond what the backend stages: 8 MiB.
pub const DEFAULT_WINDOW: usize = 8 << 20;

/// How far a streamed copy has got: `done` bytes landed of `total` (where it is known).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Bytes handed to the device so far.
    pub done: u64,
    /// Bytes the whole stream holds, where known: the range's length, or the total the caller
    /// gave ([`StreamOptions::total`]).
    pub total: Option<u64>,
}

/// How a streamed copy runs: its host window, what the source holds, and a progress callback.
///
/// ```
/// # use devalloc::stream::{StreamOptions, Progress};
/// let mut seen = 0;
/// let options = StreamOptions::new().window(1 << 20).on_progress(|p: Progress| seen = p.done);
/// # drop(options);
/// ```
pub struct StreamOptions<P = fn(Progress)> {
    window: usize,
    total: Option<u64>,
    short_ok: bool,
    progress: P,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions { window: DEFAULT_WINDOW, total: None, short_ok: false, progress: |_| {} }
    }
}

impl StreamOptions {
    /// The defaults: an 8 MiB window ([`DEFAULT_WINDOW`]), the source must fill the range
    /// exactly, no progress callback.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<P: FnMut(Progress)> StreamOptions<P> {
    /// The most host memory the copy holds at once, beyond the backend's staging (which has a
    /// budget of its own). Larger windows mean fewer, larger copies. Must not be 0.
    pub fn window(mut self, bytes: usize) -> Self {
        self.window = bytes;
        self
    }

    /// How many bytes the source holds, where the caller knows (a file's length): a source that
    /// cannot fit the range, or (by default) falls short of it, is refused before a byte moves,
    /// and progress reports it as the total.
    pub fn total(mut self, bytes: u64) -> Self {
        self.total = Some(bytes);
        self
    }

    /// Lets the source end before the range is full: the copy returns how many bytes landed.
    /// By default a source that ends early is an [`Error::Stream`]. Where [`StreamOptions::total`]
    /// is given, the source must still hold exactly that many.
    pub fn allow_short(mut self) -> Self {
        self.short_ok = true;
        self
    }

    /// Calls `f` after each window lands (once, with 0 done, for an empty copy), on the
    /// caller's thread or task: what a progress bar needs.
    pub fn on_progress<Q: FnMut(Progress)>(self, f: Q) -> StreamOptions<Q> {
        StreamOptions { window: self.window, total: self.total, short_ok: self.short_ok, progress: f }
    }
}

/// Async twin of [`write_from_reader`] over a stream of byte chunks (a network body, a
/// decompressor's output), for the browser and async runtimes: chunks of any size (empty,
/// one byte, larger than the window) are gathered into windows and each copied with the
/// allocator's async copy; a chunk at least a window long is copied from where it lies. The
/// same checks and errors as [`write_from_reader`]; a stream's own error becomes the
/// [`Error::Stream`]'s source.
pub async fn write_from_stream<S, B, E, P>(
    alloc: &dyn DeviceAllocator,
    dst: DevicePtr,
    len: usize,
    index: DeviceIndex,
    mut stream: S,
    mut options: StreamOptions<P>,
) -> Result<u64>
where
    S: Stream<Item = std::result::Result<B, E>> + Unpin,
    B: AsRef<[u8]>,
    E: Into<BackendSource>,
    P: FnMut(Progress),
{
    let mut fill = Fill::start(alloc, dst, len, index, &options)?;
    let mut buf: Vec<u8> = Vec::new();
    while let Some(item) = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await {
        let chunk = match item {
            Ok(chunk) => chunk,
            Err(e) => {
                // What the stream gave before it failed lands, as from a reader.
                flush(alloc, &mut fill, &mut buf, index, &mut options.progress).await?;
                let e: BackendSource = e.into();
                return Err(fill.stopped(&format!("the stream failed: {e}"), Some(e)));
            }
        };
        let mut bytes = chunk.as_ref();
        while !bytes.is_empty() {
            let room = fill.room() - buf.len() as u64;
            if room == 0 {
                // Land what fits, then refuse the rest: nothing past the range is written.
                flush(alloc, &mut fill, &mut buf, index, &mut options.progress).await?;
                return Err(fill.too_long());
            }
            let take = (bytes.len() as u64).min(room) as usize;
            let take = if buf.is_empty() && take >= fill.chunk {
                let r = alloc.copy_host_to_device_async(fill.at()?, &bytes[..take], index).await;
                fill.land(r, take, &mut options.progress)?;
                take
            } else {
                let take = take.min(fill.chunk - buf.len());
                buf.reserve_exact(fill.chunk - buf.len());
                buf.extend_from_slice(&bytes[..take]);
                if buf.len() == fill.chunk {
                    flush(alloc, &mut fill, &mut buf, index, &mut options.progress).await?;
                }
                take
            };
            bytes = &bytes[take..];
        }
    }
    flush(alloc, &mut fill, &mut buf, index, &mut options.progress).await?;
    fill.finish(&mut options.progress)
}

/// Copies what `buf` gathered to the device and empties it.
async fn flush(
    alloc: &dyn DeviceAllocator,
    fill: &mut Fill,
    buf: &mut Vec<u8>,
    index: DeviceIndex,
    progress: &mut impl FnMut(Progress),
) -> Result<()> {
    if buf.is_empty() {
        return Ok(());
    }
    let r = alloc.copy_host_to_device_async(fill.at()?, buf, index).await;
    let n = buf.len();
    buf.clear();
    fill.land(r, n, progress)
}

/// Where a streamed copy stands: the range, what landed, what the source must hold.
struct Fill {
    dst: DevicePtr,
    len: u64,
    device: Device,
    /// Bytes landed from the start of the range.
    done: u64,
    /// Bytes the source must hold (None: any count up to `len`).
    expected: Option<u64>,
    /// The window: the most bytes copied at once.
    chunk: usize,
    /// Whether `len` is the caller's stated total rather than the range's length.
    stated: bool,
}

impl Fill {
    /// Checks the window, the range and a known total before anything moves.
    fn start<P>(
        alloc: &dyn DeviceAllocator,
        dst: DevicePtr,
        len: usize,
        index: DeviceIndex,
        options: &StreamOptions<P>,
    ) -> Result<Fill> {
        if options.window == 0 {
            return Err(Error::invalid_argument("a streamed copy's window must be at least 1 byte"));
        }
        // For 0 bytes only the device index is looked at (the pointer is not, as for a copy).
        alloc.check_range(dst, len, index)?;
        let expected = match (options.total, options.short_ok) {
            (Some(t), _) => Some(t),
            (None, true) => None,
            (None, false) => Some(len as u64),
        };
        let device = Device::new(alloc.device_type(), index);
        let chunk = options.window.min(len.max(1));
        let stated = options.total.is_some_and(|t| t < len as u64);
        let mut fill = Fill { dst, len: len as u64, device, done: 0, expected, chunk, stated };
        let r = match expected {
            Some(t) if t > fill.len => Err(fill.stopped(
                &format!("the source holds {t} bytes, more than the range (nothing was written)"),
                None,
            )),
            Some(t) if t < fill.len && !options.short_ok => Err(fill.stopped(
                &format!(
                    "the source holds only {t} bytes (nothing was written; allow_short lets it end early)"
                ),
                None,
            )),
            _ => Ok(()),
        };
        // A source of a known total fills that much of the range: a byte more is too long.
        fill.len = expected.unwrap_or(fill.len);
        r.map(|()| fill)
    }

    /// Bytes the range has left.
    fn room(&self) -> u64 {
        self.len - self.done
    }

    /// The address of the next byte.
    fn at(&self) -> Result<DevicePtr> {
        self.dst.offset_u64(self.done)
    }

    /// Counts `n` landed bytes of a copy that went well, and reports progress; a failed copy is
    /// an [`Error::Stream`] with the copy's error as source.
    fn land(&mut self, copied: Result<()>, n: usize, progress: &mut impl FnMut(Progress)) -> Result<()> {
        if let Err(e) = copied {
            return Err(self.stopped(&format!("a copy of {n} bytes failed: {e}"), Some(Box::new(e))));
        }
        self.done += n as u64;
        progress(Progress { done: self.done, total: self.expected });
        Ok(())
    }

    fn read_failed(&self, e: std::io::Error) -> Error {
        self.stopped(&format!("the reader failed: {e}"), Some(Box::new(e)))
    }

    fn too_long(&self) -> Error {
        let what = if self.stated { "its stated total" } else { "the range holds" };
        self.stopped(&format!("the source has more bytes than {what} (nothing past them was written)"), None)
    }

    /// The end: the source must have held what was expected.
    fn finish(self, progress: &mut impl FnMut(Progress)) -> Result<u64> {
        match self.expected {
            Some(t) if self.done < t => {
                Err(self.stopped(&format!("the source ended {} bytes short", t - self.done), None))
            }
            _ => {
                if self.done == 0 {
                    progress(Progress { done: 0, total: self.expected });
                }
                Ok(self.done)
            }
        }
    }

    fn stopped(&self, reason: &str, source: Option<BackendSource>) -> Error {
        Error::Stream {
            device: self.device,
            landed: self.done,
            expected: self.expected.unwrap_or(self.len),
            reason: reason.to_string(),
            source,
        }
    }
}
