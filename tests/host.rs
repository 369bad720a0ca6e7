//! The conformance suite and the hostile model check on the host allocator, with and without
//! its cache, under a tiny memory limit, and with a tiny address window.
#![cfg(not(target_arch = "wasm32"))]

#[macro_use]
mod conformance;

use devalloc::{HostAllocator, PoolConfig};

fn host(config: PoolConfig) -> conformance::Made {
    conformance::ready(HostAllocator::with_config(config))
}

fn plain() -> conformance::Made {
    host(PoolConfig::default())
}

fn cached() -> conformance::Made {
    host(PoolConfig { caching: true, memory_limit: Some(1 << 30), ..PoolConfig::default() })
}

/// 64 KiB of memory and a 128 KiB address window: limits and address reuse are hit often.
fn cramped() -> conformance::Made {
    host(PoolConfig {
        caching: true,
        memory_limit: Some(64 << 10),
        address_window: 1 << 17,
        ..PoolConfig::default()
    })
}

fn cases(native: u32) -> u32 {
    if cfg!(miri) {
        2
    } else {
        native
    }
}

mod plain {
    use super::*;
    conformance_tests!(plain, conformance::Need::Always);

    #[test]
    fn model_check() {
        conformance::model::model_check(plain, cases(64));
    }
}

mod cached {
    use super::*;
    conformance_tests!(cached, conformance::Need::Always);

    #[test]
    fn model_check() {
        conformance::model::model_check(cached, cases(64));
    }
}

mod cramped {
    use super::*;

    #[test]
    fn model_check() {
        conformance::model::model_check(cramped, cases(64));
    }
}
