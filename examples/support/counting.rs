//! A storage that holds no memory and only counts (for the replay's `--backend wgpu-policy`):
//! devalloc's pool runs over it exactly as over wgpu's storage (blocks never split, capacities
//! in 4-byte granules, no alignment of their own), so that a history replays under wgpu's
//! policy in milliseconds, without a GPU. Reads and writes are refused: a replay makes none.

use devalloc::backend::{PooledAllocator, Storage};
use devalloc::{Device, DeviceType, Error, PoolOptions, Result};

/// wgpu's policy-relevant properties, nothing else.
pub struct Counting;

impl Storage for Counting {
    type Block = ();
    type Params = ();

    fn device(&self) -> Device {
        Device::new(DeviceType::Vulkan, 0)
    }

    fn name(&self) -> String {
        "counting storage with wgpu's policy (no memory)".into()
    }

    fn granularity(&self) -> u64 {
        4
    }

    fn max_block_size(&self) -> u64 {
        1 << 40
    }

    fn block_alignment(&self, _alignment: u64) -> u64 {
        1
    }

    fn alloc(&self, _capacity: u64, _alignment: u64, _params: &(), _name: &str) -> Result<()> {
        Ok(())
    }

    fn write(&self, _b: &(), _offset: u64, _src: &[u8]) -> Result<()> {
        Err(Error::invalid_argument("the counting storage holds no data"))
    }

    fn read(&self, _b: &(), _offset: u64, _dst: &mut [u8]) -> Result<()> {
        Err(Error::invalid_argument("the counting storage holds no data"))
    }

    fn copy(&self, _s: &(), _so: u64, _d: &(), _do: u64, _len: u64) -> Result<()> {
        Err(Error::invalid_argument("the counting storage holds no data"))
    }
}

/// An allocator over one counting pool, with `options`.
pub fn allocator(options: PoolOptions) -> Result<PooledAllocator<Counting>> {
    let pool = devalloc::backend::Pool::new(Counting, options)?;
    PooledAllocator::from_pools(DeviceType::Vulkan, vec![pool])
}
