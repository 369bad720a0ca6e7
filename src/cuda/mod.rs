//! [`CudaAllocator`]: CUDA device memory through `cudarc` (feature `cuda`).
//!
//! The driver is loaded at run time, so the crate builds without a CUDA toolkit and runs on
//! machines without a GPU: [`CudaAllocator::new`] first probes for `libcuda` (cudarc's own
//! loader panics when it is missing) and returns [`Error::NotFound`] when there is no driver or
//! no device. Device indices are CUDA ordinals; a [`DevicePtr`] is the real device address.
//!
//! Memory comes from cudarc's safe layer (stream-ordered `cuMemAllocAsync` where the device
//! supports it; freed on drop) under devalloc's pool: size-class cache, memory limit, stats,
//! planned pools. Alignments above the driver's 256 bytes are met by over-allocating and
//! offsetting. Because addresses are real, a cached block is handed out again at the same
//! address, so a double free after that reuse frees the new allocation, as with CUDA itself.
//!
//! Copies: below [`PINNED_THRESHOLD`] bytes straight from pageable memory; above it through
//! two reused pinned staging buffers, so the host copy of chunk i+1 overlaps the DMA of chunk
//! i. Copies between two CUDA devices bounce through the host.
#![warn(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{
    result, CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr as _, DriverError, PinnedHostSlice,
};

use crate::checks::round_up;
use crate::device::{Device, DeviceIndex, DeviceType};
use crate::error::{Error, Result};
use crate::pool::{Pool, PoolConfig};
use crate::pooled_allocator::PooledAllocator;
#[allow(unused_imports)] // named in the docs
use crate::ptr::DevicePtr;
use crate::storage::Storage;

/// Copies of at least this many bytes go through pinned staging buffers.
pub const PINNED_THRESHOLD: usize = 1 << 20;
/// Size of one pinned staging buffer (one chunk of a large copy).
pub const STAGING_CHUNK: usize = 8 << 20;
/// The driver's base alignment of allocations.
const DRIVER_ALIGNMENT: u64 = 256;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether the CUDA driver library can be loaded here; never panics.
pub fn driver_present() -> bool {
    // SAFETY: `is_culib_present` only tries to dlopen the driver's library names and closes
    // what it opened; it touches no CUDA state.
    unsafe { sys::is_culib_present() }
}

/// The driver's message for `e`, or its code where there is no driver to ask (cudarc's
/// `Display` and `Debug` call the driver, whose loader panics when it is missing).
fn describe(e: &DriverError) -> String {
    if driver_present() {
        e.to_string()
    } else {
        format!("{:?}", e.0)
    }
}

/// Maps a driver error to devalloc's enum, keeping the driver's message.
fn driver_error(device: Device, what: &str, e: DriverError, requested: u64) -> Error {
    let msg = format!("{what}: {}", describe(&e));
    match e.0 {
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => Error::OutOfMemory { requested, device, detail: msg },
        CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
        | CUresult::CUDA_ERROR_LAUNCH_FAILED
        | CUresult::CUDA_ERROR_ECC_UNCORRECTABLE
        | CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR
        | CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION
        | CUresult::CUDA_ERROR_MISALIGNED_ADDRESS => Error::DeviceLost { device, reason: msg },
        // The driver's error is kept as the source only where it can describe itself.
        _ => Error::Backend {
            device,
            message: msg,
            source: driver_present().then(|| Box::new(e) as crate::error::BackendSource),
        },
    }
}

/// One allocation: cudarc owns (and frees) the memory; `addr` is its aligned start.
pub struct CudaBlock {
    _mem: CudaSlice<u8>,
    addr: u64,
    len: u64,
}

/// Two pinned buffers and the events that say when the DMA using each is done.
struct Staging {
    bufs: Vec<(PinnedHostSlice<u8>, CudaEvent)>,
}

/// CUDA memory of one device, as a [`Storage`] for the generic pool.
pub struct CudaStorage {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    id: Device,
    name: String,
    total: u64,
    upload: Mutex<Staging>,
    download: Mutex<Staging>,
}

impl CudaStorage {
    fn open(ordinal: usize) -> Result<Self> {
        let id = Device::new(DeviceType::Cuda, ordinal as DeviceIndex);
        let err = |what: &str, e| driver_error(id, what, e, 0);
        let ctx = CudaContext::new(ordinal).map_err(|e| err("creating a context", e))?;
        let stream = ctx.new_stream().map_err(|e| err("creating a stream", e))?;
        let name = ctx.name().map_err(|e| err("reading the device name", e))?;
        let total = ctx.total_mem().map_err(|e| err("reading the memory size", e))? as u64;
        Ok(CudaStorage {
            ctx,
            stream,
            id,
            name,
            total,
            upload: Mutex::new(Staging { bufs: Vec::new() }),
            download: Mutex::new(Staging { bufs: Vec::new() }),
        })
    }

    fn err(&self, what: &str, e: DriverError) -> Error {
        driver_error(self.id, what, e, 0)
    }

    /// Makes sure `staging` holds two pinned buffers. Upload buffers are write-combined (fast
    /// for the host to write, the DMA to read); download ones are not (the host reads them).
    fn ensure(&self, staging: &mut Staging, write_combined: bool) -> Result<()> {
        while staging.bufs.len() < 2 {
            let flags = if write_combined { sys::CU_MEMHOSTALLOC_WRITECOMBINED } else { 0 };
            // SAFETY: the buffer is only read by the host after a DMA into it completed, or
            // written before a DMA from it: never read while uninitialised.
            let buf = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(STAGING_CHUNK, flags) }
                .map_err(|e| self.err("allocating pinned staging", e))?;
            let ev = self.ctx.new_event(None).map_err(|e| self.err("creating an event", e))?;
            staging.bufs.push((buf, ev));
        }
        Ok(())
    }

    fn write_pinned(&self, dst: u64, src: &[u8]) -> Result<()> {
        let mut staging = lock(&self.upload);
        self.ensure(&mut staging, true)?;
        for (i, chunk) in src.chunks(STAGING_CHUNK).enumerate() {
            let (buf, ev) = &mut staging.bufs[i % 2];
            // Wait until the DMA that last read this buffer is done, then fill it.
            ev.synchronize().map_err(|e| self.err("waiting for staging", e))?;
            let host = buf.as_mut_slice().map_err(|e| self.err("pinned staging", e))?;
            host[..chunk.len()].copy_from_slice(chunk);
            let at = dst + (i * STAGING_CHUNK) as u64;
            // SAFETY: `at..at + chunk.len()` lies in a live allocation (the pool checked the
            // range and holds the block); the source is pinned memory owned by `staging`, which
            // is not touched again before `ev` (recorded right after) has completed.
            unsafe { result::memcpy_htod_async(at, &host[..chunk.len()], self.stream.cu_stream()) }
                .map_err(|e| self.err("copying to the device", e))?;
            ev.record(&self.stream).map_err(|e| self.err("recording an event", e))?;
        }
        Ok(())
    }

    fn read_pinned(&self, dst: &mut [u8], src: u64) -> Result<()> {
        let mut staging = lock(&self.download);
        self.ensure(&mut staging, false)?;
        let n = dst.len().div_ceil(STAGING_CHUNK);
        let issue = |staging: &mut Staging, i: usize, dst_len: usize| -> Result<()> {
            let len = (dst_len - i * STAGING_CHUNK).min(STAGING_CHUNK);
            let (buf, ev) = &mut staging.bufs[i % 2];
            let host = buf.as_mut_slice().map_err(|e| self.err("pinned staging", e))?;
            // SAFETY: the device range lies in a live allocation (checked by the pool); the
            // destination is pinned memory we own and read only after `ev` completes.
            unsafe {
                result::memcpy_dtoh_async(
                    &mut host[..len],
                    src + (i * STAGING_CHUNK) as u64,
                    self.stream.cu_stream(),
                )
            }
            .map_err(|e| self.err("copying to the host", e))?;
            ev.record(&self.stream).map_err(|e| self.err("recording an event", e))
        };
        // Two chunks in flight: while the host copies chunk i out, the DMA fills chunk i+1.
        issue(&mut staging, 0, dst.len())?;
        for i in 0..n {
            if i + 1 < n {
                issue(&mut staging, i + 1, dst.len())?;
            }
            let (buf, ev) = &staging.bufs[i % 2];
            ev.synchronize().map_err(|e| self.err("waiting for the copy", e))?;
            let host = buf.as_slice().map_err(|e| self.err("pinned staging", e))?;
            let total = dst.len();
            let part = &mut dst[i * STAGING_CHUNK..((i + 1) * STAGING_CHUNK).min(total)];
            let len = part.len();
            part.copy_from_slice(&host[..len]);
        }
        Ok(())
    }
}

impl Storage for CudaStorage {
    type Block = CudaBlock;
    type Params = ();

    fn device(&self) -> Device {
        self.id
    }

    fn name(&self) -> String {
        format!("{} ({} GiB)", self.name, self.total >> 30)
    }

    fn max_block_size(&self) -> u64 {
        self.total
    }

    fn has_real_addresses(&self) -> bool {
        true
    }

    fn alloc(&self, capacity: u64, alignment: u64, _params: &(), _label: Option<&str>) -> Result<CudaBlock> {
        let extra = alignment.saturating_sub(DRIVER_ALIGNMENT);
        let bytes = capacity.checked_add(extra).filter(|&b| b <= self.total).ok_or(Error::TooLarge {
            requested: capacity,
            max: self.total.saturating_sub(extra),
            device: self.id,
        })?;
        let mem = self
            .stream
            .alloc_zeros::<u8>(bytes as usize)
            .map_err(|e| driver_error(self.id, "allocating device memory", e, capacity))?;
        let (base, sync) = mem.device_ptr(&self.stream);
        drop(sync);
        let addr = round_up(base, alignment).ok_or_else(|| Error::invalid_argument("address overflows"))?;
        Ok(CudaBlock { _mem: mem, addr, len: capacity })
    }

    fn address(&self, block: &CudaBlock) -> Option<u64> {
        Some(block.addr)
    }

    fn write(&self, block: &CudaBlock, offset: u64, src: &[u8]) -> Result<()> {
        debug_assert!(offset + src.len() as u64 <= block.len);
        self.ctx.bind_to_thread().map_err(|e| self.err("binding the context", e))?;
        let dst = block.addr + offset;
        if src.len() >= PINNED_THRESHOLD {
            return self.write_pinned(dst, src);
        }
        // SAFETY: in bounds (the pool checked it, the block is alive); from pageable memory the
        // driver copies `src` out before returning, so `src` may be reused afterwards.
        unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }
            .map_err(|e| self.err("copying to the device", e))
    }

    fn read(&self, block: &CudaBlock, offset: u64, dst: &mut [u8]) -> Result<()> {
        debug_assert!(offset + dst.len() as u64 <= block.len);
        self.ctx.bind_to_thread().map_err(|e| self.err("binding the context", e))?;
        let src = block.addr + offset;
        if dst.len() >= PINNED_THRESHOLD {
            return self.read_pinned(dst, src);
        }
        // SAFETY: in bounds (checked by the pool); `dst` is an exclusive borrow that outlives
        // the copy because the stream is synchronised before returning.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
            .map_err(|e| self.err("copying to the host", e))?;
        self.stream.synchronize().map_err(|e| self.err("waiting for the copy", e))
    }

    fn copy(
        &self,
        src: &CudaBlock,
        src_offset: u64,
        dst: &CudaBlock,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| self.err("binding the context", e))?;
        let (s, d) = (src.addr + src_offset, dst.addr + dst_offset);
        let overlap = s < d + len && d < s + len;
        let stream = self.stream.cu_stream();
        if overlap {
            // cuMemcpy does not handle overlapping ranges: go through a temporary.
            let tmp = self.alloc(len, DRIVER_ALIGNMENT, &(), None)?;
            // SAFETY: all three ranges are in bounds of live allocations; the copies are
            // stream-ordered, and `tmp` is freed stream-ordered after them when dropped.
            unsafe {
                result::memcpy_dtod_async(tmp.addr, s, len as usize, stream)
                    .and_then(|()| result::memcpy_dtod_async(d, tmp.addr, len as usize, stream))
            }
            .map_err(|e| self.err("copying on the device", e))?;
            return Ok(());
        }
        // SAFETY: both ranges are in bounds of live allocations (checked by the pool) and do
        // not overlap; the copy is ordered on the stream before any later copy.
        unsafe { result::memcpy_dtod_async(d, s, len as usize, stream) }
            .map_err(|e| self.err("copying on the device", e))
    }
}

/// CUDA device memory behind the [`crate::DeviceAllocator`] contract; see the module docs.
pub type CudaAllocator = PooledAllocator<CudaStorage>;

impl PooledAllocator<CudaStorage> {
    /// Opens every CUDA device with a caching pool and no limit.
    pub fn new() -> Result<Self> {
        Self::with_config(PoolConfig { caching: true, ..PoolConfig::default() })
    }

    /// Opens every CUDA device with these pool settings (the limit applies per device).
    /// [`Error::NotFound`] when there is no driver or no device.
    pub fn with_config(config: PoolConfig) -> Result<Self> {
        if !driver_present() {
            return Err(Error::not_found("no CUDA driver: libcuda could not be loaded"));
        }
        // cudarc panics on some loader failures; keep them from escaping devalloc.
        let count = std::panic::catch_unwind(CudaContext::device_count)
            .map_err(|_| Error::not_found("no CUDA driver: the driver library failed to load"))?;
        let count = match count {
            Ok(n) if n > 0 => n as usize,
            Ok(_) | Err(DriverError(CUresult::CUDA_ERROR_NO_DEVICE)) => {
                return Err(Error::not_found("no CUDA device: the driver reports none"))
            }
            Err(e) => return Err(driver_error(Device::new(DeviceType::Cuda, 0), "counting devices", e, 0)),
        };
        let pools = (0..count)
            .map(|i| Pool::new(CudaStorage::open(i)?, config.clone()))
            .collect::<Result<Vec<_>>>()?;
        PooledAllocator::from_pools(DeviceType::Cuda, pools)
    }

    /// Waits for every copy queued on device `index`.
    pub fn synchronize(&self, index: DeviceIndex) -> Result<()> {
        let s = self.pool(index)?.storage();
        s.stream.synchronize().map_err(|e| s.err("synchronising", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_construction_is_a_clear_error() {
        match CudaAllocator::new() {
            Ok(a) => eprintln!(
                "a CUDA driver is present here ({} device(s)); nothing to check",
                crate::DeviceAllocator::device_count(&a)
            ),
            Err(e) => {
                assert!(matches!(e, Error::NotFound { .. }), "{e}");
                assert!(e.to_string().contains("no CUDA"), "{e}");
                eprintln!("CUDA not available here, as expected on this machine: {e}");
            }
        }
    }

    #[test]
    fn driver_errors_map_to_the_enum() {
        let d = Device::new(DeviceType::Cuda, 0);
        let oom = driver_error(d, "alloc", DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY), 64);
        assert!(matches!(oom, Error::OutOfMemory { requested: 64, .. }));
        let lost = driver_error(d, "copy", DriverError(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS), 0);
        assert!(matches!(lost, Error::DeviceLost { .. }));
        let other = driver_error(d, "copy", DriverError(CUresult::CUDA_ERROR_INVALID_VALUE), 0);
        let Error::Backend { message, source, .. } = &other else { panic!("not a backend error") };
        assert_eq!(source.is_some(), driver_present());
        assert!(message.starts_with("copy: "), "{message}");
        if !driver_present() {
            assert!(message.contains("CUDA_ERROR_INVALID_VALUE"), "{message}");
        }
    }
}
