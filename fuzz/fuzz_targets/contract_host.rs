//! `contract_host`: a sequence of contract calls (any sizes, alignments, pointers, offsets,
//! indices, frees, copies, planned buffers, limits; see `common/contract.rs`) on a fresh
//! `HostAllocator` per input, under a memory limit of 64 KiB to 8 MiB (so that no call can
//! ask the system for more) and pool settings the input picks, against a model of what each
//! call must do: the answer, unchanged stats after a refusal, stats equal to the model's, and
//! every allocation's bytes as written.
#![no_main]

#[path = "common/contract.rs"]
mod contract;

use arbitrary::Arbitrary;
use devalloc::{HostAllocator, PoolOptions};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    limit: u32,
    caching: bool,
    reuse_freed: bool,
    headroom: Option<u8>,
    ops: Vec<contract::Op>,
}

fuzz_target!(|input: Input| {
    let limit = (64 << 10) + u64::from(input.limit) % (8 << 20);
    let options = PoolOptions {
        caching: input.caching,
        reuse_freed: input.reuse_freed,
        cache_headroom: input.headroom.map(|h| f64::from(h) / 255.0),
        memory_limit: Some(limit),
        ..PoolOptions::default()
    };
    let host = HostAllocator::with_options(options).expect("valid pool options");
    let set_limit = |l: u64| host.set_memory_limit(Some(l), 0).expect("set_memory_limit");
    let mut model = contract::Model::new(&host, &set_limit, limit, false);
    for op in input.ops.iter().take(64) {
        model.step(op);
    }
    model.finish();
});
