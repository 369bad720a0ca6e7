//! Streamed copies (`devalloc::stream`), on every allocator: from a reader (native) and from a
//! stream of chunks (everywhere), whole and part-way, and every way a source can go wrong.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use devalloc::stream::{write_from_stream, Progress, StreamOptions};
use devalloc::{DeviceAllocator, DeviceIndex, DevicePtr, Error, DEFAULT_ALIGNMENT};

use super::*;

/// A stream of the given chunks (each an item, errors included), as a network body would give.
struct Chunks(VecDeque<Result<Vec<u8>, io::Error>>);

impl futures_core::Stream for Chunks {
    type Item = Result<Vec<u8>, io::Error>;
    fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Poll::Ready(self.0.pop_front())
    }
}

/// `data` cut at the given sizes, round and round (0-byte chunks included), then the rest.
fn chunks(data: &[u8], sizes: &[usize]) -> Chunks {
    let mut out = VecDeque::new();
    let mut at = 0;
    for &n in sizes.iter().cycle() {
        if at >= data.len() {
            break;
        }
        let end = (at + n).min(data.len());
        out.push_back(Ok(data[at..end].to_vec()));
        at = end;
    }
    Chunks(out)
}

/// The `Error::Stream` of `r`, as (landed, expected, reason); panics on anything else.
fn stream_error(r: devalloc::Result<u64>, what: &str) -> (u64, u64, String) {
    match r {
        Err(Error::Stream { landed, expected, reason, .. }) => (landed, expected, reason),
        other => panic!("{what}: expected Error::Stream, got {other:?}"),
    }
}

/// Streams a pattern into an interior range of an allocation, in chunks of every awkward size,
/// with a window that is no multiple of 4; the bytes around the range stay as they were; then
/// every source that goes wrong: too long, too short, failing half-way, into a bad range.
pub async fn streaming(a: &'static dyn DeviceAllocator, i: DeviceIndex) {
    const WINDOW: usize = 1001;
    let (size, off, len) = (8192usize, 13usize, 5000usize);
    let ptr = a.allocate(size, i, DEFAULT_ALIGNMENT).unwrap();
    let other = a.allocate(64, i, DEFAULT_ALIGNMENT).unwrap();
    h2d(a, other, &[7u8; 64], i).await.unwrap();
    let before = pattern(size, 1);
    h2d(a, ptr, &before, i).await.unwrap();
    let dst = ptr.offset(off).unwrap();
    let data = pattern(len, 2);
    let mut expect = before.clone();
    expect[off..off + len].copy_from_slice(&data);

    // How far a copy from an address may run (what the browser's writeFromStream fills).
    assert_eq!(a.bytes_after(dst, i).unwrap(), size - off);
    assert_eq!(a.bytes_after(ptr.offset(size).unwrap(), i).unwrap(), 0);
    assert!(matches!(a.bytes_after(DevicePtr::NULL, i), Err(Error::InvalidPointer { .. })));
    // Whole, in chunks of 0, 1, 3 and 4097 bytes; progress rises to the total.
    let mut seen: Vec<Progress> = Vec::new();
    let options = StreamOptions::new().window(WINDOW).on_progress(|p| seen.push(p));
    let n = write_from_stream(a, dst, len, i, chunks(&data, &[0, 1, 3, 4097]), options).await.unwrap();
    assert_eq!(n, len as u64);
    assert!(read(a, ptr, size, i).await == expect, "streamed bytes differ, or the bytes around them moved");
    assert!(seen.windows(2).all(|w| w[0].done < w[1].done), "progress must rise: {seen:?}");
    assert_eq!(seen.last(), Some(&Progress { done: len as u64, total: Some(len as u64) }));
    // A window gathered from small chunks, 3,100 bytes straight from a large chunk, the rest.
    assert!(seen.len() >= 3, "one progress call per copy: {seen:?}");
    let stats = a.stats(i).ok();

    // One byte too many: the range is written, the byte past it is not.
    h2d(a, ptr, &before, i).await.unwrap();
    let mut long = data.clone();
    long.push(0xAB);
    let r =
        write_from_stream(a, dst, len, i, chunks(&long, &[700]), StreamOptions::new().window(WINDOW)).await;
    let (landed, _, reason) = stream_error(r, "a stream one byte too long");
    assert_eq!(landed, len as u64, "{reason}");
    assert!(read(a, ptr, size, i).await == expect, "a too-long stream wrote past its range");
    // Known to be too long: refused before a byte moves.
    h2d(a, ptr, &before, i).await.unwrap();
    let options = StreamOptions::new().total(len as u64 + 1);
    let (landed, ..) =
        stream_error(write_from_stream(a, dst, len, i, chunks(&long, &[64]), options).await, "total");
    assert_eq!(landed, 0);
    assert!(read(a, ptr, size, i).await == before, "a refused stream wrote");

    // Short: an error that says how much landed, or with allow_short the count.
    let r =
        write_from_stream(a, dst, len, i, chunks(&data[..3000], &[999]), StreamOptions::new().window(WINDOW))
            .await;
    let (landed, expected, reason) = stream_error(r, "a short stream");
    assert_eq!((landed, expected), (3000, len as u64), "{reason}");
    let mut short = before.clone();
    short[off..off + 3000].copy_from_slice(&data[..3000]);
    assert!(read(a, ptr, size, i).await == short, "a short stream's bytes differ");
    let options = StreamOptions::new().allow_short();
    assert_eq!(write_from_stream(a, dst, len, i, chunks(&data[..3000], &[1]), options).await.unwrap(), 3000);

    // A stream that fails half-way: what it gave before lands, the error is the stream's.
    h2d(a, ptr, &before, i).await.unwrap();
    let mut failing = chunks(&data[..2500], &[500]);
    failing.0.push_back(Err(io::Error::other("the network went away")));
    failing.0.push_back(Ok(data[2500..].to_vec()));
    match write_from_stream(a, dst, len, i, failing, StreamOptions::new().window(WINDOW)).await {
        Err(e @ Error::Stream { landed, .. }) => {
            assert_eq!(landed, 2500, "what the stream gave lands before the failure: {e}");
            let source = std::error::Error::source(&e).expect("the stream's error is the source");
            assert!(source.to_string().contains("the network went away"), "{source}");
        }
        other => panic!("a failing stream: {other:?}"),
    }
    let got = read(a, ptr, size, i).await;
    assert!(got[off..off + 2500] == data[..2500] && got[off + 2500..] == before[off + 2500..]);

    // A stream that fails after giving everything: what it gave lands (as from a reader).
    h2d(a, ptr, &before, i).await.unwrap();
    let mut failing = chunks(&data, &[400]);
    failing.0.push_back(Err(io::Error::other("late")));
    let r = write_from_stream(a, dst, len, i, failing, StreamOptions::new().window(WINDOW)).await;
    assert_eq!(stream_error(r, "a stream failing at its end").0, len as u64);
    assert!(read(a, ptr, size, i).await == expect);
    // A known total with allow_short: exactly that many, no more.
    let options = StreamOptions::new().total(100).allow_short();
    let r = write_from_stream(a, dst, len, i, chunks(&data[..101], &[7]), options).await;
    let (landed, expected, reason) = stream_error(r, "one byte past a stated total");
    assert_eq!((landed, expected), (100, 100), "{reason}");

    // Bad ranges and windows are refused before the source is touched.
    let mut untouched = chunks(&data, &[10]);
    let past = write_from_stream(a, dst, size, i, &mut untouched, StreamOptions::new()).await;
    assert!(matches!(past, Err(Error::OutOfBounds { .. })), "{past:?}");
    let zero = write_from_stream(a, dst, len, i, &mut untouched, StreamOptions::new().window(0)).await;
    assert!(matches!(zero, Err(Error::InvalidArgument { .. })), "{zero:?}");
    assert_eq!(untouched.0.len(), len.div_ceil(10), "a refused call read from the stream");
    // 0 bytes from an empty stream is fine anywhere; from a non-empty one it is too long.
    assert_eq!(
        write_from_stream(a, DevicePtr::NULL, 0, i, chunks(&[], &[1]), StreamOptions::new()).await.unwrap(),
        0
    );
    assert!(write_from_stream(a, dst, 0, i, chunks(&[1], &[1]), StreamOptions::new()).await.is_err());
    let bad_index =
        write_from_stream(a, DevicePtr::NULL, 0, 99, chunks(&[], &[1]), StreamOptions::new()).await;
    assert!(matches!(bad_index, Err(Error::NoSuchDevice { .. })), "{bad_index:?}");
    if let Some(stats) = stats {
        assert_eq!(
            a.stats(i).unwrap().allocated_bytes,
            stats.allocated_bytes,
            "failed streams moved the stats"
        );
    }

    #[cfg(not(target_arch = "wasm32"))]
    from_a_reader(a, i, ptr, &before).await;
    a.deallocate(ptr, i).unwrap();
    // A freed range is refused before the source is read.
    let freed = write_from_stream(a, dst, 8, i, &mut untouched, StreamOptions::new()).await;
    assert!(matches!(freed, Err(Error::InvalidPointer { .. })), "{freed:?}");
    assert!(matches!(a.bytes_after(dst, i), Err(Error::InvalidPointer { .. })));
    assert_eq!(read(a, other, 64, i).await, [7u8; 64], "another allocation changed");
    a.deallocate(other, i).unwrap();
}

/// The blocking twin, from `std::io::Read` sources (native: the browser must not block).
#[cfg(not(target_arch = "wasm32"))]
async fn from_a_reader(a: &'static dyn DeviceAllocator, i: DeviceIndex, ptr: DevicePtr, before: &[u8]) {
    use devalloc::stream::write_from_reader;
    use std::io::Read;
    let size = before.len();
    let data = pattern(size, 3);
    let options = StreamOptions::new().window(4093);
    assert_eq!(
        write_from_reader(a, ptr, size, i, &mut io::Cursor::new(&data), options).unwrap(),
        size as u64
    );
    assert!(read(a, ptr, size, i).await == data);

    /// Gives `ok` bytes a few at a time, then fails.
    struct Failing<'d>(&'d [u8]);
    impl Read for Failing<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.0.is_empty() {
                return Err(io::Error::other("disk read error"));
            }
            let n = buf.len().min(self.0.len()).min(300);
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }
    h2d(a, ptr, before, i).await.unwrap();
    let r =
        write_from_reader(a, ptr, size, i, &mut Failing(&data[..5000]), StreamOptions::new().window(2048));
    let (landed, _, reason) = stream_error(r, "a failing reader");
    // What it gave before it failed lands, to the byte (5,000 is no multiple of a window's half).
    assert_eq!(landed, 5000, "{reason}");
    assert!(reason.contains("disk read error"), "{reason}");
    let got = read(a, ptr, size, i).await;
    assert!(got[..5000] == data[..5000] && got[5000..] == before[5000..], "bytes past what landed moved");
    // The same on a range that starts and ends inside a word, failing inside one.
    h2d(a, ptr, before, i).await.unwrap();
    let r = write_from_reader(
        a,
        ptr.offset(3).unwrap(),
        4001,
        i,
        &mut Failing(&data[..2999]),
        StreamOptions::new(),
    );
    assert_eq!(stream_error(r, "a failing reader, ragged").0, 2999);
    let got = read(a, ptr, size, i).await;
    assert!(
        got[..3] == before[..3] && got[3..3002] == data[..2999] && got[3002..] == before[3002..],
        "a ragged fill"
    );
    // From a word's start, failing inside a word (wgpu's staged route fills in place, then
    // writes the last ragged bytes as a ragged copy does).
    h2d(a, ptr, before, i).await.unwrap();
    let r =
        write_from_reader(a, ptr, 4001, i, &mut Failing(&data[..2999]), StreamOptions::new().window(1024));
    assert_eq!(stream_error(r, "a failing reader, word-aligned").0, 2999);
    let got = read(a, ptr, size, i).await;
    assert!(got[..2999] == data[..2999] && got[2999..] == before[2999..], "a fill ending inside a word");

    // Too long by one byte; with a known total, refused up front.
    let mut long = data.clone();
    long.push(1);
    let r = write_from_reader(a, ptr, size, i, &mut io::Cursor::new(&long), StreamOptions::new());
    assert_eq!(stream_error(r, "a long reader").0, size as u64);
    let mut cursor = io::Cursor::new(&long);
    let r = write_from_reader(a, ptr, size, i, &mut cursor, StreamOptions::new().total(long.len() as u64));
    assert_eq!((stream_error(r, "a known-long reader").0, cursor.position()), (0, 0));
    // A broken reader that claims more bytes than it was given: an error, never a byte past.
    struct Liar(usize);
    impl Read for Liar {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.0 += 1;
            buf.fill(self.0 as u8);
            Ok(if self.0 == 2 { buf.len() + 1 } else { buf.len() })
        }
    }
    h2d(a, ptr, before, i).await.unwrap();
    let r = write_from_reader(a, ptr.offset(16).unwrap(), 7, i, &mut Liar(0), StreamOptions::new().window(8));
    assert!(stream_error(r, "a lying reader").2.contains("said it read"));
    assert!(read(a, ptr, size, i).await[23..] == before[23..], "a lying reader's byte landed past the range");
    // A reader ending on a window's edge: no progress call repeats.
    let mut seen = Vec::new();
    let options = StreamOptions::new().window(10).allow_short().on_progress(|p| seen.push(p.done));
    write_from_reader(a, ptr, 100, i, &mut &data[..5], options).unwrap();
    assert_eq!(seen, [5]);

    // Through the RAII buffer, from an offset to its end.
    let mut buf = devalloc::DeviceMemoryBuffer::create_on(a, 3000, i, DEFAULT_ALIGNMENT).unwrap();
    let n = buf.write_from_reader(1000, &mut io::Cursor::new(&data[..2000]), StreamOptions::new()).unwrap();
    assert_eq!(n, 2000);
    let mut back = vec![0u8; 2000];
    buf.read_at(1000, &mut back).unwrap();
    assert!(back == data[..2000]);
    let past = buf.write_from_reader(3001, &mut io::Cursor::new(&data[..1]), StreamOptions::new());
    assert!(matches!(past, Err(Error::OutOfBounds { .. })), "{past:?}");
}
