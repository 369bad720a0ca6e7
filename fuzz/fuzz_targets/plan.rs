//! `plan`: the planner on arbitrary small instances (at most 64 tensors, decoded with
//! `arbitrary`): `plan::plan` (Strategy::Fast, and Strategy::Search with a 0 ms budget) and
//! the peers (`one_after_another`, `greedy_by_size`, `executorch_greedy`). Never a panic; every
//! Ok plan must pass `plan::check` with its own offsets and size, place every tensor, be no
//! smaller than the lower bound, have a size equal to its largest `offset + size`, and (for
//! `plan`) be no larger than greedy-by-size's; an Err only for input that is invalid (size 0,
//! `first > last`, a bad alignment) or whose sizes add up past 64 bits.
#![no_main]

use arbitrary::Arbitrary;
use devalloc::plan::{
    check, executorch_greedy, greedy_by_size, lower_bound, one_after_another, plan, MemoryPlan, Strategy,
    TensorLife,
};
use libfuzzer_sys::fuzz_target;

/// A tensor: small sizes and steps mostly, so that lifetimes overlap; any u64 sometimes.
#[derive(Arbitrary, Debug)]
enum Tensor {
    Small { size: u16, first: u8, len: u8 },
    Wide { size: u32, first: u16, len: u16 },
    Any { size: u64, first: u64, last: u64 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    align_shift: u8,
    search: bool,
    tensors: Vec<Tensor>,
}

fn life(t: &Tensor) -> TensorLife {
    match *t {
        Tensor::Small { size, first, len } => TensorLife {
            size: u64::from(size),
            first: u64::from(first),
            last: u64::from(first) + u64::from(len % 16),
        },
        Tensor::Wide { size, first, len } => TensorLife {
            size: u64::from(size),
            first: u64::from(first),
            last: u64::from(first) + u64::from(len),
        },
        Tensor::Any { size, first, last } => TensorLife { size, first, last },
    }
}

/// Whether `plan` must succeed: valid tensors and alignment, and room to spare in 64 bits
/// (every tensor rounded up to the alignment, one after another, fits in 2^62).
fn must_plan(tensors: &[TensorLife], alignment: u64) -> bool {
    let valid = alignment.is_power_of_two() && tensors.iter().all(|t| t.size >= 1 && t.first <= t.last);
    let total = tensors.iter().try_fold(0u64, |acc, t| {
        let rounded = t.size.checked_add(alignment - 1)? & !(alignment - 1);
        acc.checked_add(rounded)
    });
    valid && total.is_some_and(|t| t < 1 << 62)
}

fn verify(name: &str, tensors: &[TensorLife], alignment: u64, p: &MemoryPlan) {
    assert_eq!(p.len(), tensors.len(), "{name}: plan places {} of {} tensors", p.len(), tensors.len());
    assert_eq!(p.alignment(), alignment, "{name}");
    if let Err(e) = check(tensors, alignment, p.offsets(), p.size()) {
        panic!("{name}: a plan it returned fails check: {e}\n{tensors:?}\n{:?}", p.offsets());
    }
    let end = tensors.iter().zip(p.offsets()).map(|(t, o)| o + t.size).max().unwrap_or(0);
    assert_eq!(p.size(), end, "{name}: size is not the largest offset + size");
    let bound = lower_bound(tensors).expect("a planned instance has a lower bound");
    assert_eq!(p.lower_bound(), bound, "{name}");
    assert!(p.size() >= bound, "{name}: size {} under the lower bound {bound}", p.size());
    for i in 0..tensors.len() {
        assert_eq!(p.tensor(i), Some((p.offsets()[i], tensors[i].size)), "{name}");
    }
}

fuzz_target!(|input: Input| {
    let alignment =
        if input.align_shift >= 64 { u64::from(input.align_shift) } else { 1u64 << (input.align_shift % 13) };
    let tensors: Vec<TensorLife> = input.tensors.iter().take(64).map(life).collect();
    let must = must_plan(&tensors, alignment);
    let strategy = if input.search { Strategy::Search { budget_ms: 0 } } else { Strategy::Fast };
    let greedy = greedy_by_size(&tensors, alignment);
    match plan(&tensors, alignment, strategy) {
        Ok(p) => {
            verify("plan", &tensors, alignment, &p);
            if let Ok(g) = &greedy {
                assert!(p.size() <= g.size(), "plan {} is worse than greedy_by_size {}", p.size(), g.size());
            }
        }
        Err(e) => assert!(!must, "plan refused a valid instance: {e}\n{tensors:?} alignment {alignment}"),
    }
    let peers = [
        ("greedy_by_size", greedy),
        ("one_after_another", one_after_another(&tensors, alignment)),
        ("executorch_greedy", executorch_greedy(&tensors, alignment)),
    ];
    for (name, r) in peers {
        match r {
            Ok(p) => verify(name, &tensors, alignment, &p),
            Err(e) => {
                assert!(!must, "{name} refused a valid instance: {e}\n{tensors:?} alignment {alignment}")
            }
        }
    }
});
