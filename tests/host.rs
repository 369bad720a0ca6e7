//! The conformance suite on the host allocator, with and without its cache and limit.
#![cfg(not(target_arch = "wasm32"))]

#[macro_use]
mod conformance;

use devalloc::{HostAllocator, PoolConfig};

fn plain() -> conformance::Made {
    conformance::ready(Ok::<_, String>(HostAllocator::new()))
}

fn cached() -> conformance::Made {
    conformance::ready(Ok::<_, String>(HostAllocator::with_config(PoolConfig {
        caching: true,
        memory_limit: Some(1 << 30),
    })))
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
