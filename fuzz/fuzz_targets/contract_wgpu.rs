//! `contract_wgpu`: the calls of `contract_host` (see `common/contract.rs`) on device 0 of one
//! Vulkan `WgpuAllocator` (lavapipe in CI), made on the first input and reused by every later
//! one (opening a device per input would be all the fuzzer does), under a memory limit of
//! 64 KiB to 8 MiB, at most 16 calls per input, against the same model: the answer,
//! unchanged stats after a refusal (staging may only shrink), stats equal to the model's, every
//! allocation's bytes as written, and (wgpu's blocks never split, which the model knows from the
//! device type) every cached byte given back by `empty_cache`. Each input frees what it made, so
//! the next starts clean. Buffers are at most 1 KiB, so that every allocation past it is
//! several buffers (segments) and the calls cross their seams.
#![no_main]

#[path = "common/contract.rs"]
mod contract;

use std::sync::OnceLock;

use arbitrary::Arbitrary;
use devalloc::wgpu::{api, WgpuAllocator, WgpuOptions};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    limit: u32,
    ops: Vec<contract::Op>,
}

fn allocator() -> &'static WgpuAllocator {
    static ALLOC: OnceLock<WgpuAllocator> = OnceLock::new();
    ALLOC.get_or_init(|| {
        // Small staging chunks, so that copies of a few KiB already move in several steps;
        // 1 KiB buffers, so that larger allocations are segmented.
        let options =
            WgpuOptions { staging_chunk: Some(4 << 10), max_buffer_size: Some(1 << 10), ..WgpuOptions::default() };
        WgpuAllocator::with_options(api::Backend::Vulkan, options)
            .unwrap_or_else(|e| panic!("no Vulkan adapter (is lavapipe installed?): {e}"))
    })
}

fuzz_target!(|input: Input| {
    let a = allocator();
    let limit = (64 << 10) + u64::from(input.limit) % (8 << 20);
    let set_limit = |l: u64| a.set_memory_limit(Some(l), 0).expect("set_memory_limit");
    let mut model = contract::Model::new(a, &set_limit, limit, true);
    for op in input.ops.iter().take(16) {
        model.step(op);
    }
    model.finish();
});
