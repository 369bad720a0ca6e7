//! [`WgpuBlock`]: one wgpu buffer, and the lock that keeps apart what must not overlap on it:
//! mapping it (direct route) and GPU copies queued on it, and two ragged writes that share a
//! word.
//!
//! Async copies hold the lock across their awaits. A blocking call waits for it (polling the
//! device, so that the map callbacks an async holder waits for keep coming), except where it
//! could never get it: when the holder is an async copy that this very thread last drove and
//! has left suspended (it cannot go on while its thread blocks), the call is refused at once
//! instead of hanging; in the browser, where nothing may block, whenever the lock is held.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::gpu::Gpu;
use super::platform::{Current, Platform};
use crate::error::{Error, Result};

/// wgpu's copy alignment.
pub(crate) const COPY_ALIGN: u64 = wgpu::COPY_BUFFER_ALIGNMENT;

/// `v` rounded down to whole words.
pub(crate) fn floor4(v: u64) -> u64 {
    v & !(COPY_ALIGN - 1)
}

/// `v` rounded up to whole words.
pub(crate) fn ceil4(v: u64) -> u64 {
    (v + COPY_ALIGN - 1) & !(COPY_ALIGN - 1)
}

/// Whether `offset..offset + len` is whole 4-byte words.
pub(crate) fn aligned(offset: u64, len: u64) -> bool {
    (offset | len).is_multiple_of(COPY_ALIGN)
}

/// One wgpu buffer and what devalloc keeps about it.
pub struct WgpuBlock {
    pub(crate) buffer: wgpu::Buffer,
    lock: async_lock::Mutex<()>,
    /// The thread (its tag) whose async copy holds the lock, 0 for none or a blocking holder.
    holder: AtomicU64,
    /// The buffer has been handed to the app (`WgpuAllocator::buffer` / `buffer_range`), which
    /// may then map or destroy it itself: from then on devalloc's maps of it run in an error
    /// scope. Never cleared: the app may keep its handle.
    pub(crate) exposed: AtomicBool,
    /// A copy on this exposed buffer failed while the device was fine: the app has destroyed
    /// or mapped it. Freed, it is dropped rather than cached for the next allocation.
    pub(crate) spoiled: AtomicBool,
    /// The browser refused to make the buffer (out of memory), after the allocation returned.
    pub(crate) refused: Arc<AtomicBool>,
    /// Held for writing until the browser's verdict on the buffer is in (set before it is
    /// let go): a copy awaits a read of it first. Free from the start natively.
    pub(crate) verdict: Arc<async_lock::RwLock<()>>,
    /// Where the allocation passed the buffer limit, its buffers after this one, in address
    /// order: this buffer is its first segment (see `segments.rs`). Empty for one buffer.
    pub(crate) rest: Box<[WgpuBlock]>,
}

/// The block's lock, held; forgets its holder when dropped.
pub(crate) struct Held<'a> {
    _guard: async_lock::MutexGuard<'a, ()>,
    block: &'a WgpuBlock,
}

impl Held<'_> {
    /// Notes that the async copy holding the lock runs on this thread now (after an await).
    pub(crate) fn here(&self) {
        self.block.holder.store(thread_tag(), Ordering::Relaxed);
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.block.holder.store(0, Ordering::Relaxed);
    }
}

/// A number for the calling thread, never 0.
fn thread_tag() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static TAG: u64 = NEXT.fetch_add(1, Ordering::Relaxed));
    TAG.with(|t| *t)
}

impl WgpuBlock {
    /// An async copy waits for the browser's verdict on the buffer (there at once natively);
    /// a blocking one (a write the browser allows) cannot, and looks only. `OutOfMemory` where
    /// the browser refused it, so that no copy runs on a buffer that does not exist (a read
    /// would hand out what staging held from another allocation).
    pub(crate) async fn made(
        &self,
        device: crate::device::Device,
        len: u64,
        mode: crate::bounce::Mode,
    ) -> crate::error::Result<()> {
        if mode == crate::bounce::Mode::Async {
            drop(self.verdict.read().await);
        }
        if self.refused.load(Ordering::Acquire) {
            return Err(crate::error::Error::OutOfMemory {
                requested: len,
                device,
                detail: "the browser could not make this allocation's buffer".into(),
            });
        }
        Ok(())
    }

    /// A block around `buffer`.
    pub(crate) fn new(buffer: wgpu::Buffer) -> Self {
        Self::with_flag(buffer, Arc::new(AtomicBool::new(false)), Arc::default())
    }

    /// A block around `buffer`, refused when `refused` is set, its verdict in once `verdict`
    /// can be read (see [`Gpu::create_marked`]).
    pub(crate) fn with_flag(
        buffer: wgpu::Buffer,
        refused: Arc<AtomicBool>,
        verdict: Arc<async_lock::RwLock<()>>,
    ) -> Self {
        WgpuBlock {
            buffer,
            lock: async_lock::Mutex::new(()),
            holder: AtomicU64::new(0),
            exposed: AtomicBool::new(false),
            spoiled: AtomicBool::new(false),
            refused,
            verdict,
            rest: Box::new([]),
        }
    }

    /// Takes the lock in an async copy (this thread is its holder until [`Held::here`] says
    /// otherwise).
    pub(crate) async fn lock_async(&self) -> Held<'_> {
        let guard = self.lock.lock().await;
        let held = Held { _guard: guard, block: self };
        held.here();
        held
    }

    /// Takes the lock in a blocking call (see the module docs).
    pub(crate) fn lock_blocking(&self, gpu: &Gpu) -> Result<Held<'_>> {
        let mut pause = Duration::from_micros(10);
        loop {
            if let Some(guard) = self.lock.try_lock() {
                return Ok(Held { _guard: guard, block: self });
            }
            if !Current::CAN_BLOCK {
                return Err(Error::NotSupported {
                    operation: "a blocking copy on memory an async copy is still using",
                    device_type: gpu.id.device_type,
                    reason: "the browser cannot block: await the async copy first, or use the async form"
                        .into(),
                });
            }
            if self.holder.load(Ordering::Relaxed) == thread_tag() {
                return Err(Error::NotSupported {
                    operation: "a blocking copy on memory an async copy of this thread holds",
                    device_type: gpu.id.device_type,
                    reason: "the async copy was polled on this thread and left suspended, so it cannot finish while this thread blocks: await it (or drop it) first".into(),
                });
            }
            // Another thread's copy: let its callbacks come, and wait.
            gpu.lost.check()?;
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }
}
