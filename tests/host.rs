//! The conformance suite on the host allocator, with and without its cache and limit.
#[macro_use]
mod conformance;

use devalloc::{DeviceAllocator, HostAllocator, PoolConfig};

fn plain() -> Result<Box<dyn DeviceAllocator>, String> {
    Ok(Box::new(HostAllocator::new()))
}

fn cached() -> Result<Box<dyn DeviceAllocator>, String> {
    Ok(Box::new(HostAllocator::with_config(PoolConfig { caching: true, memory_limit: Some(1 << 30) })))
}

mod plain {
    use super::*;
    conformance_tests!(plain, conformance::Need::Always);

    #[test]
    fn model_check() {
        conformance::model_check(plain, 64);
    }
}

mod cached {
    use super::*;
    conformance_tests!(cached, conformance::Need::Always);

    #[test]
    fn model_check() {
        conformance::model_check(cached, 64);
    }
}
