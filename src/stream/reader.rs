//! [`write_from_reader`]: a range filled from a `std::io::Read` through the window, with a
//! thread that reads one half of it while the caller's copies the other (natively).

use std::io::{ErrorKind, Read};

use super::{Fill, Progress, StreamOptions};
use crate::allocator::DeviceAllocator;
use crate::device::DeviceIndex;
use crate::error::Result;
use crate::ptr::DevicePtr;

/// What [`write_from_reader`] reads from: any `std::io::Read` that is `Send` on native (a
/// thread reads ahead of the copies), any `Read` in the browser.
#[cfg(native)]
pub trait Source: Read + Send {}
#[cfg(native)]
impl<T: Read + Send + ?Sized> Source for T {}
/// What [`write_from_reader`] reads from: any `std::io::Read` that is `Send` on native (a
/// thread reads ahead of the copies), any `Read` in the browser.
#[cfg(web)]
pub trait Source: Read {}
#[cfg(web)]
impl<T: Read + ?Sized> Source for T {}

/// Fills `len` bytes of device memory from `dst` with the bytes `reader` gives, and returns how
/// many landed (`len`, unless [`StreamOptions::allow_short`]). Where the allocator fills its
/// memory in place ([`DeviceAllocator::fill_in_place`]: wgpu's staged route), the reader
/// reads straight into the backend's staging, a piece of the window's size at a time, on the
/// caller's thread, while the GPU copies the piece before. Elsewhere it goes through a host
/// window of `options`' size: a thread reads one half while the caller's copies the other to
/// the device, so reading overlaps copying. The reader must be `Send`; the progress callback
/// runs on the caller's thread.
///
/// The range is checked first: a bad pointer or range is its own error, and nothing is read.
/// A reader that fails, ends early, or holds more than the range, and a copy that fails
/// part-way, are an [`crate::Error::Stream`] saying how many bytes landed (everything a failing
/// reader gave before it failed); nothing past the range is ever written, and every other
/// allocation is untouched.
///
/// Once the range is full it reads once more, to tell a longer source: a source that stays
/// open after its last byte (a socket kept alive) holds the call until it ends or fails; give
/// it `reader.take(len)` to stop at the range. A copy that fails returns once the read under
/// way (if any) returns.
#[cfg(native)]
pub fn write_from_reader<R: Source + ?Sized, P: FnMut(Progress)>(
    alloc: &dyn DeviceAllocator,
    dst: DevicePtr,
    len: usize,
    index: DeviceIndex,
    reader: &mut R,
    mut options: StreamOptions<P>,
) -> Result<u64> {
    use std::sync::mpsc::sync_channel;
    let mut fill = Fill::start(alloc, dst, len, index, &options)?;
    // In place where the allocator can: the reader reads straight into its staging.
    if let Some(r) = in_place(alloc, &mut fill, index, reader, &mut options) {
        return r.and_then(|()| fill.finish(&mut options.progress));
    }
    // Two halves of the window: a thread reads into one while this one copies the other.
    let half = fill.chunk.div_ceil(2);
    let (full_tx, full_rx) = sync_channel::<Read_>(2);
    let (empty_tx, empty_rx) = sync_channel::<Vec<u8>>(2);
    for _ in 0..2 {
        let mut buf = Vec::new();
        buf.try_reserve_exact(half).map_err(|e| {
            fill.stopped(&format!("no host memory for a {half}-byte half of the window: {e}"), None)
        })?;
        buf.resize(half, 0);
        // Room for two: the receiver is here.
        let _ = empty_tx.send(buf);
    }
    let len = fill.len;
    std::thread::scope(|scope| {
        let reading = std::thread::Builder::new()
            .name("devalloc stream reader".into())
            .spawn_scoped(scope, move || read_ahead(reader, len, empty_rx, full_tx))
            .map_err(|e| fill.stopped(&format!("could not start the reading thread: {e}"), None))?;
        let r = loop {
            match full_rx.recv() {
                Ok(Read_::Data(buf, n)) => {
                    let copied = fill.at().and_then(|at| alloc.copy_host_to_device(at, &buf[..n], index));
                    if let Err(e) = fill.land(copied, n, &mut options.progress) {
                        break Err(e);
                    }
                    // The reader may have finished: then nobody needs the buffer back.
                    let _ = empty_tx.send(buf);
                }
                Ok(Read_::Failed(e)) => break Err(fill.read_failed(e)),
                Ok(Read_::Longer) => break Err(fill.too_long()),
                Ok(Read_::End) | Err(_) => break Ok(()),
            }
        };
        // Dropping the channels stops the reader at its next send (a read under way ends first).
        drop((full_rx, empty_tx));
        if let Err(panic) = reading.join() {
            // The reader panicked: the caller sees its panic, not the scope's.
            std::panic::resume_unwind(panic);
        }
        r
    })?;
    fill.finish(&mut options.progress)
}

/// What the reading thread of [`write_from_reader`] hands over, in order.
#[cfg(native)]
enum Read_ {
    /// A buffer and how many of its bytes were read.
    Data(Vec<u8>, usize),
    /// The reader failed (after every `Data` before it).
    Failed(std::io::Error),
    /// The range is full and the reader had more.
    Longer,
    /// The reader ended (the range full, or short of it).
    End,
}

/// Reads `len` bytes ahead of the copies, into the buffers `empty` gives back, then looks for
/// a byte more; stops when the other side hangs up.
#[cfg(native)]
fn read_ahead<R: Read + ?Sized>(
    reader: &mut R,
    len: u64,
    empty: std::sync::mpsc::Receiver<Vec<u8>>,
    full: std::sync::mpsc::SyncSender<Read_>,
) {
    let mut read = 0u64;
    while read < len {
        let Ok(mut buf) = empty.recv() else { return };
        let want = (len - read).min(buf.len() as u64) as usize;
        let (n, failed) = read_full(reader, &mut buf[..want]);
        read += n as u64;
        // What it gave before it ended or failed lands first.
        if n > 0 && full.send(Read_::Data(buf, n)).is_err() {
            return;
        }
        if let Some(e) = failed {
            let _ = full.send(Read_::Failed(e));
            return;
        }
        if n < want {
            let _ = full.send(Read_::End);
            return;
        }
    }
    // Full: one byte more means the source is longer than the range.
    let msg = match one_more(reader) {
        Ok(false) => Read_::End,
        Ok(true) => Read_::Longer,
        Err(e) => Read_::Failed(e),
    };
    let _ = full.send(msg);
}

/// [`write_from_reader`] in the browser: one window, read then copied in turn (no threads).
#[cfg(web)]
pub fn write_from_reader<R: Source + ?Sized, P: FnMut(Progress)>(
    alloc: &dyn DeviceAllocator,
    dst: DevicePtr,
    len: usize,
    index: DeviceIndex,
    reader: &mut R,
    mut options: StreamOptions<P>,
) -> Result<u64> {
    let mut fill = Fill::start(alloc, dst, len, index, &options)?;
    if let Some(r) = in_place(alloc, &mut fill, index, reader, &mut options) {
        return r.and_then(|()| fill.finish(&mut options.progress));
    }
    let mut buf = vec![0u8; fill.chunk];
    loop {
        let want = fill.room().min(buf.len() as u64) as usize;
        let (n, failed) = read_full(reader, &mut buf[..want]);
        if n > 0 {
            fill.land(alloc.copy_host_to_device(fill.at()?, &buf[..n], index), n, &mut options.progress)?;
        }
        if let Some(e) = failed {
            return Err(fill.read_failed(e));
        }
        if n < want || want == 0 {
            break;
        }
    }
    if fill.room() == 0 && one_more(reader).map_err(|e| fill.read_failed(e))? {
        // Full, and one byte more: the source is longer than the range.
        return Err(fill.too_long());
    }
    fill.finish(&mut options.progress)
}

/// Reads until `buf` is full or the reader ends: the bytes read (fewer only at the end), and
/// the reader's error if it failed (after those bytes, which land: what a reader gave before
/// it failed is as good as what it gave before it ended).
fn read_full<R: Read + ?Sized>(reader: &mut R, buf: &mut [u8]) -> (usize, Option<std::io::Error>) {
    let mut n = 0;
    while n < buf.len() {
        match reader.read(&mut buf[n..]) {
            Ok(0) => break,
            // A `Read` that claims more than it was given (a broken one): its bytes cannot be
            // trusted, and counting them would run past the buffer.
            Ok(k) if k > buf.len() - n => {
                let e = std::io::Error::new(
                    ErrorKind::InvalidData,
                    format!("the reader said it read {k} bytes into a buffer of {}", buf.len() - n),
                );
                return (n, Some(e));
            }
            Ok(k) => n += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return (n, Some(e)),
        }
    }
    (n, None)
}

/// Whether the source holds a byte more once the range is full (`Err`: the reader failed).
fn one_more<R: Read + ?Sized>(reader: &mut R) -> std::io::Result<bool> {
    match read_full(reader, &mut [0u8; 1]) {
        (0, None) => Ok(false),
        (0, Some(e)) => Err(e),
        _ => Ok(true),
    }
}

/// [`write_from_reader`] where the allocator fills its memory in place
/// ([`DeviceAllocator::fill_in_place`]: wgpu's staged route): the reader reads straight into
/// each piece, no window of the caller's between. `None` where it does not.
fn in_place<R: Read + ?Sized, P: FnMut(Progress)>(
    alloc: &dyn DeviceAllocator,
    fill: &mut Fill,
    index: DeviceIndex,
    reader: &mut R,
    options: &mut StreamOptions<P>,
) -> Option<Result<()>> {
    if fill.len == 0 {
        return None;
    }
    let (dst, len, piece) = (fill.dst, usize::try_from(fill.len).ok()?, fill.chunk);
    let progress = &mut options.progress;
    let (mut given, mut failed) = (0u64, None);
    let mut step = |buf: &mut [u8]| {
        // Handed a piece: the one before has landed.
        if given > fill.done {
            let _ = fill.land(Ok(()), (given - fill.done) as usize, progress);
        }
        let (n, e) = read_full(reader, buf);
        failed = e;
        given += n as u64;
        n
    };
    let (landed, copied) = alloc.fill_in_place(dst, len, index, piece, &mut step)?;
    // What landed since the last progress call, then a failed copy's error.
    if landed > fill.done {
        let _ = fill.land(Ok(()), (landed - fill.done) as usize, progress);
    }
    if let Err(e) = copied {
        let n = given.saturating_sub(landed).max(1) as usize;
        return Some(fill.land(Err(e), n, progress));
    }
    if let Some(e) = failed {
        return Some(Err(fill.read_failed(e)));
    }
    if fill.room() == 0 {
        match one_more(reader) {
            Ok(false) => {}
            Ok(true) => return Some(Err(fill.too_long())),
            Err(e) => return Some(Err(fill.read_failed(e))),
        }
    }
    Some(Ok(()))
}
