//! The conformance suite on every CUDA device, where there is one. Without a driver (CI, this
//! project's machines) the suite says it did not run and why, and the test below checks that
//! construction fails cleanly and the rest of the registry still works.
#![cfg(feature = "cuda")]

#[macro_use]
mod conformance;

use devalloc::{CudaAllocator, DeviceAllocatorRegistry, DeviceType, Error, Outcome, PoolConfig};

fn cuda() -> conformance::Made {
    conformance::ready(CudaAllocator::new())
}

fn cuda_uncached() -> conformance::Made {
    conformance::ready(CudaAllocator::with_config(PoolConfig::default()))
}

mod cached {
    use super::*;
    conformance_tests!(cuda, conformance::Need::Optional);

    #[test]
    fn model_check() {
        if CudaAllocator::new().is_ok() {
            conformance::model::model_check(cuda, 32);
        } else {
            eprintln!("SKIPPED model_check: did not run: no CUDA driver or device");
        }
    }
}

mod uncached {
    use super::*;
    conformance_tests!(cuda_uncached, conformance::Need::Optional);
}

#[test]
fn without_a_driver_construction_fails_and_the_registry_still_works() {
    let registry = DeviceAllocatorRegistry::new();
    let lines = devalloc::register_available(&registry);
    let cuda =
        lines.iter().find(|l| l.device_type == DeviceType::Cuda).expect("register_available reports CUDA");
    let cuda_line = cuda.to_string();
    match CudaAllocator::new() {
        Ok(_) => {
            assert!(registry.get_allocator(DeviceType::Cuda).is_some(), "{cuda_line}");
            eprintln!("a CUDA device is present: {cuda_line}");
        }
        Err(e) => {
            assert!(matches!(e, Error::NotFound { .. }), "{e}");
            assert!(matches!(&cuda.outcome, Outcome::Unavailable(Error::NotFound { .. })), "{cuda_line}");
            assert!(cuda_line.contains("not available") && cuda_line.contains("no CUDA"), "{cuda_line}");
            assert!(registry.get_allocator(DeviceType::Cuda).is_none());
            eprintln!("SKIPPED CUDA conformance here: {e}");
        }
    }
    // The rest of the registry works either way.
    let host = registry.get_allocator(DeviceType::Cpu).expect("host is always registered");
    let p = host.allocate(64, 0, 64).unwrap();
    host.copy_host_to_device(p, &[9u8; 64], 0).unwrap();
    let mut back = [0u8; 64];
    host.copy_device_to_host(&mut back, p, 0).unwrap();
    assert_eq!(back, [9u8; 64]);
    host.deallocate(p, 0).unwrap();
}
