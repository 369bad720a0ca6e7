//! Tests of the memory planner through its public API, against checkers and reference
//! implementations written here independently of the library.

use devalloc::plan::{
    check, executorch_greedy, greedy_by_size, lower_bound, one_after_another, plan, MemoryPlan, Strategy,
    TensorLife,
};
use proptest::prelude::prop;
use proptest::strategy::Strategy as Gen;

pub(crate) fn t(size: u64, first: u64, last: u64) -> TensorLife {
    TensorLife { size, first, last }
}

/// Brute force over every step: the largest total size live at one step.
pub(crate) fn brute_lower_bound(tensors: &[TensorLife]) -> u64 {
    let (lo, hi) = step_range(tensors);
    (lo..=hi)
        .map(|s| tensors.iter().filter(|x| x.first <= s && s <= x.last).map(|x| x.size).sum::<u64>())
        .max()
        .unwrap_or(0)
}

pub(crate) fn step_range(tensors: &[TensorLife]) -> (u64, u64) {
    let lo = tensors.iter().map(|x| x.first).min().unwrap_or(0);
    let hi = tensors.iter().map(|x| x.last).max().unwrap_or(0);
    (lo, hi)
}

/// The independent validity check: brute force over steps and pairs, no use of `check`.
pub(crate) fn assert_valid(tensors: &[TensorLife], alignment: u64, p: &MemoryPlan) {
    let offs = p.offsets();
    assert_eq!(offs.len(), tensors.len(), "{}: one offset per tensor", p.method());
    assert_eq!(p.alignment(), alignment);
    let mut top = 0;
    for (i, (x, &o)) in tensors.iter().zip(offs).enumerate() {
        assert_eq!(o % alignment, 0, "{}: tensor {i} offset {o} not aligned to {alignment}", p.method());
        assert!(o + x.size <= p.size(), "{}: tensor {i} ends past the plan size", p.method());
        top = top.max(o + x.size);
    }
    assert_eq!(top, p.size(), "{}: size is the highest end", p.method());
    let (lo, hi) = step_range(tensors);
    for s in lo..=hi {
        let live: Vec<usize> =
            (0..tensors.len()).filter(|&i| tensors[i].first <= s && s <= tensors[i].last).collect();
        for (k, &a) in live.iter().enumerate() {
            for &b in &live[k + 1..] {
                let disjoint = offs[a] + tensors[a].size <= offs[b] || offs[b] + tensors[b].size <= offs[a];
                assert!(disjoint, "{}: tensors {a} and {b} share bytes at step {s}", p.method());
            }
        }
    }
    let lb = brute_lower_bound(tensors);
    assert_eq!(p.lower_bound(), lb);
    assert!(p.size() >= lb);
    if p.size() == lb {
        assert!(p.is_optimal(), "{}: a plan at the lower bound is optimal", p.method());
    }
}

/// Reference greedy-by-size, written from TFLite's description: largest first (ties: longer
/// lifetime, then index), smallest sufficient gap among overlapping placed tensors, else on top.
pub(crate) fn reference_greedy_by_size(tensors: &[TensorLife], alignment: u64) -> Vec<u64> {
    let align = |v: u64| v.div_ceil(alignment) * alignment;
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (tensors[a], tensors[b]);
        y.size.cmp(&x.size).then((y.last - y.first).cmp(&(x.last - x.first))).then(a.cmp(&b))
    });
    let mut offsets = vec![0u64; tensors.len()];
    let mut placed: Vec<usize> = Vec::new(); // by offset, ties in placement order
    for &i in &order {
        let x = tensors[i];
        let (mut prev, mut best): (u64, Option<(u64, u64)>) = (0, None);
        for &j in &placed {
            let y = tensors[j];
            if y.last < x.first || y.first > x.last {
                continue;
            }
            if offsets[j] >= prev {
                let gap = offsets[j] - prev;
                if gap >= x.size && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, prev));
                }
            }
            prev = prev.max(align(offsets[j] + y.size));
        }
        offsets[i] = best.map_or(prev, |(_, o)| o);
        let at = placed.iter().position(|&j| offsets[j] > offsets[i]).unwrap_or(placed.len());
        placed.insert(at, i);
    }
    offsets
}

/// Reference ExecuTorch `greedy` (exir/memory_planning.py, allow_overlapping_allocations=True),
/// transcribed step by step from the Python.
pub(crate) fn reference_executorch(tensors: &[TensorLife], alignment: u64) -> Vec<u64> {
    struct Obj {
        size: u64,
        allocs: Vec<(usize, u64)>,
    }
    let mem: Vec<u64> = tensors.iter().map(|x| x.size.div_ceil(alignment) * alignment).collect();
    let overlap =
        |a: usize, b: usize| !(tensors[a].last < tensors[b].first || tensors[a].first > tensors[b].last);
    // bisect.insort by size (after equal keys), then reverse.
    let mut sorted: Vec<usize> = Vec::new();
    for i in 0..tensors.len() {
        let at = sorted.iter().position(|&j| mem[j] > mem[i]).unwrap_or(sorted.len());
        sorted.insert(at, i);
    }
    sorted.reverse();
    let mut objs: Vec<Obj> = Vec::new();
    let mut home = vec![(0usize, 0u64); tensors.len()];
    for &i in &sorted {
        let mut picked = None;
        for (k, o) in objs.iter().enumerate() {
            if o.allocs.iter().all(|&(m, _)| !overlap(i, m)) {
                picked = Some((k, 0));
                break;
            }
        }
        if picked.is_none() {
            for (k, o) in objs.iter().enumerate() {
                let max_offset = o
                    .allocs
                    .iter()
                    .filter(|&&(m, _)| overlap(i, m))
                    .map(|&(m, off)| off + mem[m])
                    .max()
                    .unwrap_or(0);
                if max_offset > 0 && max_offset + mem[i] <= o.size {
                    picked = Some((k, max_offset));
                    break;
                }
            }
        }
        let (k, off) = picked.unwrap_or_else(|| {
            objs.push(Obj { size: mem[i], allocs: Vec::new() });
            (objs.len() - 1, 0)
        });
        objs[k].allocs.push((i, off));
        home[i] = (k, off);
    }
    let mut base = Vec::new();
    let mut total = 0;
    for o in &objs {
        base.push(total);
        total += o.size;
    }
    home.iter().map(|&(k, off)| base[k] + off).collect()
}

pub(crate) fn all_plans(tensors: &[TensorLife], alignment: u64, budget_ms: u64) -> Vec<MemoryPlan> {
    vec![
        one_after_another(tensors, alignment).unwrap(),
        greedy_by_size(tensors, alignment).unwrap(),
        executorch_greedy(tensors, alignment).unwrap(),
        plan(tensors, alignment, Strategy::Fast).unwrap(),
        plan(tensors, alignment, Strategy::Search { budget_ms }).unwrap(),
    ]
}

pub(crate) fn instance(max_n: usize, max_size: u64) -> impl Gen<Value = Vec<TensorLife>> {
    prop::collection::vec((1..=max_size, 0u64..24, 0u64..8), 0..=max_n)
        .prop_map(|v| v.into_iter().map(|(size, first, len)| t(size, first, first + len)).collect())
}

#[test]
fn empty_input_gives_an_empty_plan() {
    for p in all_plans(&[], 1, 10) {
        assert_eq!(p.size(), 0);
        assert!(p.offsets().is_empty());
        assert!(p.is_optimal());
    }
    assert_eq!(lower_bound(&[]).unwrap(), 0);
    assert!(check(&[], 1, &[], 0).is_ok());
}

fn expect_err(r: Result<MemoryPlan, devalloc::Error>, needle: &str) {
    match r {
        Ok(p) => panic!("expected an error mentioning {needle:?}, got a plan of size {}", p.size()),
        Err(e) => assert!(e.to_string().contains(needle), "error {e:?} does not mention {needle:?}"),
    }
}

#[test]
fn bad_input_is_an_error_naming_the_tensor() {
    let zero = [t(8, 0, 1), t(0, 1, 2)];
    let backwards = [t(8, 0, 1), t(8, 1, 2), t(8, 5, 3)];
    type Planner = Box<dyn Fn(&[TensorLife], u64) -> Result<MemoryPlan, devalloc::Error>>;
    let planners: Vec<Planner> = vec![
        Box::new(one_after_another),
        Box::new(greedy_by_size),
        Box::new(executorch_greedy),
        Box::new(|x, a| plan(x, a, Strategy::Fast)),
        Box::new(|x, a| plan(x, a, Strategy::Search { budget_ms: 10 })),
    ];
    for f in &planners {
        expect_err(f(&zero, 1), "tensor 1");
        expect_err(f(&backwards, 1), "tensor 2");
        expect_err(f(&[t(8, 0, 1)], 0), "alignment 0");
        expect_err(f(&[t(8, 0, 1)], 3), "alignment 3");
        expect_err(f(&[t(8, 0, 1)], 48), "alignment 48");
        // Totals past u64: two huge tensors live at once.
        expect_err(f(&[t(u64::MAX / 2 + 1, 0, 1), t(u64::MAX / 2 + 1, 1, 2)], 1), "tensor 1");
    }
    assert!(lower_bound(&zero).unwrap_err().to_string().contains("tensor 1"));
    assert!(lower_bound(&backwards).unwrap_err().to_string().contains("tensor 2"));
    // A huge tensor whose aligned size would pass u64 is refused, not wrapped.
    expect_err(executorch_greedy(&[t(u64::MAX - 1, 0, 1)], 1 << 20), "tensor 0");
    // One huge tensor alone is fine (no overflow): its plan is just the tensor.
    let p = plan(&[t(u64::MAX, 3, 9)], 1, Strategy::Fast).unwrap();
    assert_eq!(p.size(), u64::MAX);
}

#[test]
fn huge_alignment_and_sizes_do_not_wrap() {
    let big = 1u64 << 63;
    let tensors = [t(10, 0, 1), t(10, 1, 2)];
    for p in [
        one_after_another(&tensors, big).unwrap(),
        greedy_by_size(&tensors, big).unwrap(),
        plan(&tensors, big, Strategy::Fast).unwrap(),
        plan(&tensors, big, Strategy::Search { budget_ms: 10 }).unwrap(),
    ] {
        assert_valid(&tensors, big, &p);
        assert_eq!(p.size(), big + 10);
    }
    // ExecuTorch rounds every size up to the alignment first: 2 * 2^63 does not fit in u64.
    expect_err(executorch_greedy(&tensors, big), "past u64");
    // Three such tensors live at once cannot be placed at all.
    let three = [t(10, 0, 1), t(10, 1, 2), t(10, 1, 1)];
    expect_err(plan(&three, big, Strategy::Fast), "past u64");
    expect_err(greedy_by_size(&three, big), "past u64");
}

#[test]
fn check_refuses_bad_placements() {
    let tensors = [t(10, 0, 2), t(10, 2, 4), t(10, 5, 6)];
    assert!(check(&tensors, 2, &[0, 10, 0], 20).is_ok());
    let err = |offsets: &[u64], size: u64, align: u64| {
        check(&tensors, align, offsets, size).unwrap_err().to_string()
    };
    // Overlap: tensors 0 and 1 share step 2 and bytes 5..10.
    let e = err(&[0, 5, 0], 20, 1);
    assert!(e.contains("tensors 0 and 1"), "{e}");
    // Unaligned.
    let e = err(&[0, 12, 0], 30, 8);
    assert!(e.contains("tensor 1") && e.contains("alignment 8"), "{e}");
    // Past the size.
    let e = err(&[0, 10, 15], 20, 1);
    assert!(e.contains("tensor 2"), "{e}");
    // Length mismatch.
    let e = err(&[0, 10], 20, 1);
    assert!(e.contains("2 entries for 3 tensors"), "{e}");
    // Offset + size past u64.
    let e = err(&[0, 10, u64::MAX - 3], u64::MAX, 1);
    assert!(e.contains("tensor 2"), "{e}");
    // Bad alignment and bad tensors are refused by check too.
    assert!(check(&tensors, 6, &[0, 10, 0], 20).is_err());
    assert!(check(&[t(0, 0, 0)], 1, &[0], 20).unwrap_err().to_string().contains("tensor 0"));
    // Same offset, disjoint lifetimes: fine. Same offset, touching lifetimes: refused.
    assert!(check(&[t(4, 0, 1), t(4, 2, 3)], 1, &[0, 0], 4).is_ok());
    assert!(check(&[t(4, 0, 2), t(4, 2, 3)], 1, &[0, 0], 4).is_err());
}

#[test]
fn check_finds_an_overlap_among_many_tensors() {
    // 20,000 tensors one after another, then one pair broken deep inside.
    let tensors: Vec<TensorLife> = (0..20_000u64).map(|i| t(16, i % 97, i % 97 + 50)).collect();
    let good = one_after_another(&tensors, 16).unwrap();
    assert!(check(&tensors, 16, good.offsets(), good.size()).is_ok());
    let mut bad = good.offsets().to_vec();
    bad[12_345] = bad[12_346];
    let e = check(&tensors, 16, &bad, good.size()).unwrap_err().to_string();
    assert!(e.contains("12345") && e.contains("12346"), "{e}");
}

#[test]
fn peers_on_hand_examples() {
    // ExecuTorch: a tensor joins an object above the member it overlaps.
    let x = [t(100, 0, 1), t(60, 2, 3), t(30, 2, 3)];
    let p = executorch_greedy(&x, 1).unwrap();
    assert_eq!(p.offsets(), &[0, 0, 60]);
    assert_eq!(p.size(), 100);
    // ExecuTorch: objects never grow, so a tensor that does not fit opens a new object.
    let y = [t(100, 0, 1), t(60, 2, 3), t(50, 0, 3)];
    assert_eq!(executorch_greedy(&y, 1).unwrap().offsets(), &[0, 0, 100]);
    // Greedy by size takes the smallest gap that fits.
    let z = [t(100, 0, 9), t(40, 0, 9), t(10, 0, 0), t(30, 0, 9), t(20, 1, 9), t(25, 0, 0)];
    let p = greedy_by_size(&z, 1).unwrap();
    assert_eq!(p.offsets(), reference_greedy_by_size(&z, 1));
    assert_eq!(one_after_another(&z, 8).unwrap().offsets(), &[0, 104, 144, 160, 192, 216]);
}

/// MiniMalloc's challenging instances (tests/data/minimalloc): the fast mode, whose budget is
/// a count of work rather than time (so the same plan on any machine), places each within
/// 1.10x its lower bound and never worse than greedy by size. (The search's 10 s goal is the
/// plan example's to measure: `cargo run --release --example plan -- tests/data/minimalloc/*.csv`.)
#[test]
fn the_fast_mode_is_within_ten_percent_on_minimallocs_instances() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/minimalloc");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "csv") {
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let inst =
            devalloc::plan::Instance::from_csv(&name, &std::fs::read_to_string(&path).unwrap()).unwrap();
        let fast = plan(&inst.tensors, 1, Strategy::Fast).unwrap();
        assert_valid(&inst.tensors, 1, &fast);
        assert!(
            fast.size() * 10 <= fast.lower_bound() * 11,
            "{name}: Fast {} over {}",
            fast.size(),
            fast.lower_bound()
        );
        assert!(fast.size() <= greedy_by_size(&inst.tensors, 1).unwrap().size(), "{name}");
        seen += 1;
    }
    assert_eq!(seen, 11, "MiniMalloc's 11 instances");
}

/// A plan's buffer keeps the plan's alignment: every tensor's address is a multiple of it, and a
/// tensor the plan does not have is an error, not a panic.
#[test]
fn planned_memory_from_a_plan_keeps_its_alignment() {
    let host = devalloc::HostAllocator::new();
    let tensors = [t(100, 0, 1), t(5000, 1, 2), t(300, 2, 3)];
    let p = plan(&tensors, 4096, Strategy::Fast).unwrap();
    let memory = devalloc::PlannedMemory::from_plan(&host, &p, 0).unwrap();
    for (i, life) in tensors.iter().enumerate() {
        let t = memory.tensor(i).unwrap();
        let addr = t.ptr.addr();
        assert_eq!(addr % 4096, 0, "tensor {i} at {addr:#x}");
        assert_eq!((t.len, t.index, t.label), (life.size, i, None));
    }
    let e = memory.tensor(usize::MAX).unwrap_err().to_string();
    assert!(e.contains("the plan has 3 tensors"), "{e}");
    assert_eq!(memory.num_tensors(), 3);
    // Memory made from sizes has no tensors.
    let sized = devalloc::PlannedMemory::new(&host, &[64], 0).unwrap();
    assert!(sized.tensor(0).is_err());
}

/// Labels: the planned buffer's is its allocation's (stats, snapshots), each tensor's is in
/// its `PlannedTensor`; a wrong number of tensor labels is refused before anything is made.
#[test]
fn planned_memory_labels_its_buffer_and_tensors() {
    use devalloc::backend::Pooled;
    use devalloc::DeviceAllocator;
    let host = devalloc::HostAllocator::new();
    let tensors = [t(100, 0, 1), t(5000, 1, 2), t(300, 2, 3)];
    let p = plan(&tensors, 256, Strategy::Fast).unwrap();
    let e =
        devalloc::PlannedMemory::from_plan_labeled(&host, &p, 0, Some("acts"), &["a", "b"]).err().unwrap();
    assert!(e.to_string().contains("2 tensor labels for a plan of 3"), "{e}");
    assert_eq!(host.stats(0).unwrap().allocations, 0, "nothing was allocated");
    let memory =
        devalloc::PlannedMemory::from_plan_labeled(&host, &p, 0, Some("acts"), &["in", "hidden", "out"])
            .unwrap();
    let t1 = memory.tensor(1).unwrap();
    assert_eq!((t1.label.as_deref(), t1.buffer.as_deref()), (Some("hidden"), Some("acts")));
    assert_eq!(t1.name(), "tensor 'hidden' (planned buffer 'acts')");
    let live = host.pooled().pool(0).unwrap().live_allocations();
    assert_eq!(live.len(), 1);
    assert_eq!((live[0].label.as_deref(), live[0].size), (Some("acts"), p.size()));
    let names: Vec<(&str, u64, u64)> =
        live[0].tensors.iter().map(|t| (t.label.as_str(), t.offset, t.size)).collect();
    let planned: Vec<(u64, u64)> = (0..3).map(|i| p.tensor(i).unwrap()).collect();
    assert_eq!(
        names,
        [("in", planned[0].0, 100), ("hidden", planned[1].0, 5000), ("out", planned[2].0, 300)]
    );
    let snap = host.snapshot().unwrap().to_json();
    assert!(
        snap.contains("\"acts\"") && snap.contains("\"hidden\""),
        "the snapshot names the buffer and tensors: {snap}"
    );
}

/// `label_tensors` refuses what is not a live allocation's start and ranges outside it,
/// changing nothing; names given again replace the old ones; the history notes them.
#[test]
fn tensor_names_are_checked_and_recorded() {
    use devalloc::snapshot::{EventKind, TensorNote};
    use devalloc::DeviceAllocator;
    let host = devalloc::HostAllocator::new();
    host.record_history(16).unwrap();
    let p = host.allocate(1000, 0, 256).unwrap();
    let note = |label: &str, offset, size| TensorNote { label: label.into(), offset, size };
    let live = || host.live_allocations(0).unwrap()[0].tensors.clone();
    let bad = [
        (p.offset(8).unwrap(), vec![note("a", 0, 8)]),
        (p, vec![note("a", 0, 8), note("past", 996, 5)]),
        (p, vec![note("wrap", u64::MAX, 2)]),
        (devalloc::DevicePtr::new(0xdead_0000), vec![note("a", 0, 8)]),
    ];
    for (ptr, notes) in bad {
        assert!(host.label_tensors(ptr, 0, &notes).is_err(), "{ptr} {notes:?}");
        assert!(live().is_empty(), "a refused call named nothing");
    }
    host.label_tensors(p, 0, &[note("a", 0, 500), note("b", 500, 500)]).unwrap();
    host.label_tensors(p, 0, &[note("whole", 0, 1000)]).unwrap();
    assert_eq!(live(), [note("whole", 0, 1000)]);
    let snap = host.snapshot().unwrap();
    let events = &snap.devices[0].history.as_ref().unwrap().events;
    let named = events.iter().filter(|e| matches!(e.kind, EventKind::Tensors { .. })).count();
    assert_eq!(named, 2);
    host.deallocate(p, 0).unwrap();
    assert!(host.label_tensors(p, 0, &[note("a", 0, 1)]).is_err(), "a freed allocation");
}
