//! For writing a backend of your own: the pieces every built-in allocator is made of.
//!
//! devalloc keeps *storage apart from policy*. A backend writes a [`Storage`]: how to
//! allocate, read, write and copy one block of its memory. The generic [`Pool`] runs the
//! policy over it (addresses, bounds checks, the size-class cache, the memory limit, stats,
//! planned buffers, leak reports; see [`Pool`]'s module docs for the rules), and
//! [`PooledAllocator`] turns one pool per device into a [`crate::DeviceAllocator`]. Every
//! [`Pooled`] type (a built-in allocator, or a type of your own around a `PooledAllocator`) is
//! a `DeviceAllocator`, and `pooled()` reaches its pools: `use devalloc::backend::Pooled;
//! host.pooled().pool(0)?.storage()`.
//!
//! ```
//! use devalloc::backend::{Pool, PooledAllocator, Storage};
//! use devalloc::PoolOptions;
//! use devalloc::{Device, DeviceAllocator, DeviceType, Result};
//! use std::sync::Mutex;
//!
//! /// Memory in a `Vec`, claiming to be device `gl:0` (a toy, for the example).
//! struct VecStorage;
//!
//! impl Storage for VecStorage {
//!     type Block = Mutex<Vec<u8>>;
//!     type Params = ();
//!     fn device(&self) -> Device { Device::new(DeviceType::Gl, 0) }
//!     fn max_block_size(&self) -> u64 { 1 << 30 }
//!     fn alloc(&self, capacity: u64, _: u64, _: &(), _: &str) -> Result<Self::Block> {
//!         Ok(Mutex::new(vec![0; capacity as usize]))
//!     }
//!     fn write(&self, b: &Self::Block, offset: u64, src: &[u8]) -> Result<()> {
//!         let o = offset as usize;
//!         b.lock().unwrap()[o..o + src.len()].copy_from_slice(src);
//!         Ok(())
//!     }
//!     fn read(&self, b: &Self::Block, offset: u64, dst: &mut [u8]) -> Result<()> {
//!         let o = offset as usize;
//!         dst.copy_from_slice(&b.lock().unwrap()[o..o + dst.len()]);
//!         Ok(())
//!     }
//!     fn copy(&self, s: &Self::Block, so: u64, d: &Self::Block, d_o: u64, len: u64) -> Result<()> {
//!         let mut tmp = vec![0; len as usize];
//!         self.read(s, so, &mut tmp)?;
//!         self.write(d, d_o, &tmp)
//!     }
//! }
//!
//! let pool = Pool::new(VecStorage, PoolOptions { caching: true, ..PoolOptions::default() })?;
//! let alloc = PooledAllocator::from_pools(DeviceType::Gl, vec![pool])?;
//! let p = alloc.allocate(100, 0, 64)?;
//! alloc.copy_host_to_device(p.offset(10)?, b"hi", 0)?;
//! assert!(alloc.copy_host_to_device(p.offset(99)?, b"hi", 0).is_err()); // the pool checked it
//! # Ok::<(), devalloc::Error>(())
//! ```

#[cfg(all(feature = "cuda", native))]
pub use crate::cuda::storage::{CudaBlock, CudaStorage};
pub use crate::host::HostStorage;
pub use crate::pool::{BlockRef, Pool};
pub use crate::pooled_allocator::{Pooled, PooledAllocator};
pub use crate::storage::Storage;
#[cfg(feature = "wgpu")]
pub use crate::wgpu::{
    block::WgpuBlock,
    storage::{WgpuParams, WgpuStorage},
};
