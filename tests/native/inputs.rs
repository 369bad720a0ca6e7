//! The planner's front ends under hostile input: MiniMalloc CSV files (`Instance::from_csv`),
//! traces replayed through an allocator (`devalloc::replay`), and the planner itself at its
//! edges (search budgets of 0 and `u64::MAX`, tensors of `u64::MAX` bytes, identical tensors,
//! plans made on several threads, the empty plan's memory). Never a panic or a hang; every
//! error names what is wrong.

use devalloc::plan::{check, executorch_greedy, greedy_by_size, one_after_another, plan, Instance};
use devalloc::plan::{MemoryPlan, Strategy, TensorLife};
use devalloc::replay::{find_min_limit, replay, Trace, TraceEvent};
use devalloc::snapshot::{Event, EventKind, HistorySnapshot};
use devalloc::{DeviceAllocator, Error, HostAllocator, PlannedMemory, PoolOptions};

use crate::util::{no_panic, within};

fn read(text: &str) -> Result<Instance, String> {
    no_panic(|| Instance::from_csv("f.csv", text))
        .unwrap_or_else(|p| panic!("from_csv panicked on {text:?}: {p}"))
        .map_err(|e| e.to_string())
}

/// Malformed files the CSV reader's own tests do not try: each is an error that names the file
/// and the line.
#[test]
fn malformed_csv_files_are_errors_naming_file_and_line() {
    let cases: &[(&str, &str)] = &[
        ("\n\n   \n", "f.csv:1"),
        ("id,lower,upper\n", "f.csv:1"),
        ("lower,upper,size\n", "f.csv:1"),
        ("id,lower,upper,size\n0,0,4,1\n1,a,4,1\n", "f.csv:3"),
        ("id,lower,upper,size\n0,-1,4,1\n", "f.csv:2"),
        ("id,lower,upper,size\n0,0,4,1.5\n", "f.csv:2"),
        ("id,lower,upper,size\n0,0,4,1e3\n", "f.csv:2"),
        ("id,lower,upper,size\n0,0,18446744073709551616,1\n", "f.csv:2"),
        ("id,lower,upper,size\r\n0,0,4\r\n", "f.csv:2"),
        ("id,lower,upper,size\n\"0,0\",0,4,1\n", "f.csv:2"),
    ];
    for (text, want) in cases {
        let e = read(text).expect_err(text);
        assert!(e.contains(want), "{text:?}: {e} does not name {want}");
    }
}

#[test]
fn a_csv_header_alone_is_an_empty_instance() {
    assert_eq!(read("id,lower,upper,size\n").unwrap(), Instance::default());
}

/// Whitespace around fields, unknown and empty columns, blank lines, reordered columns, steps up
/// to `u64::MAX`; and what `to_csv` writes reads back as the same instance.
#[test]
fn padded_extra_and_reordered_csv_columns_are_read_and_to_csv_round_trips() {
    let i =
        read("  size , upper,lower , id ,offset,x\r\n 8 , 9 , 1 , a ,0,zz\r\n\r\n16,3,2,b,,\r\n").unwrap();
    assert_eq!(i.ids, ["a", "b"]);
    assert_eq!(
        i.tensors,
        [TensorLife { size: 8, first: 1, last: 8 }, TensorLife { size: 16, first: 2, last: 2 }]
    );
    let i = read("id,lower,upper,size\n0,18446744073709551614,18446744073709551615,1\n").unwrap();
    assert_eq!(i.tensors[0].last, u64::MAX - 1);
    let i = read("id,lower,upper,size\nx,0,4,100\ny,2,3,5\n").unwrap();
    assert_eq!(read(&i.to_csv(&[0, 100])).unwrap(), i);
}

fn host() -> devalloc::Result<HostAllocator> {
    HostAllocator::with_options(PoolOptions::default())
}

fn alloc(id: u64, size: u64) -> TraceEvent {
    TraceEvent::Alloc { id, size, label: None }
}

#[test]
fn an_empty_trace_replays_and_its_limit_is_found() {
    assert_eq!(Trace::default().lower_bound(), 0);
    let r = replay(&host().unwrap(), &Trace::default(), 0).unwrap();
    assert!(r.failure.is_none());
    let l = within(30, || find_min_limit(host, &Trace::default(), 0)).expect("find_min_limit hangs");
    assert!(matches!(l, Ok(Some(_))), "{l:?}");
}

/// A hand-made trace that allocates an id that is still live is `InvalidArgument`, and the
/// replay gives back everything it allocated first. (The unit test in `src/replay.rs` checks
/// the message; this checks the variant and the bytes, through the public API.)
#[test]
fn a_trace_that_allocates_a_live_id_again_is_invalid_and_frees_everything() {
    let a = host().unwrap();
    let trace = Trace {
        events: vec![(0, alloc(1, 1000)), (1, alloc(1, 2000)), (2, TraceEvent::Free { id: 1 })],
        orphan_frees: 0,
    };
    let e = replay(&a, &trace, 0).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    let s = a.stats(0).unwrap();
    assert_eq!((s.live_allocations, s.allocated_bytes), (0, 0), "the replay left memory live");
}

/// Frees of unknown ids and double frees are ignored; a trace that fails under any limit (a
/// zero-size or impossibly large allocation) has no minimum limit, found without hanging.
#[test]
fn frees_of_unknown_ids_double_frees_and_traces_that_always_fail() {
    let a = host().unwrap();
    let trace = Trace {
        events: vec![
            (0, TraceEvent::Free { id: 42 }),
            (1, alloc(1, 100)),
            (2, TraceEvent::Free { id: 1 }),
            (3, TraceEvent::Free { id: 1 }),
            (4, TraceEvent::EmptyCache),
        ],
        orphan_frees: 0,
    };
    assert!(replay(&a, &trace, 0).unwrap().failure.is_none());
    assert_eq!(a.stats(0).unwrap().live_allocations, 0);
    let zero = Trace { events: vec![(0, alloc(1, 0))], orphan_frees: 0 };
    assert!(replay(&host().unwrap(), &zero, 0).unwrap().failure.is_some());
    let l = within(30, move || find_min_limit(host, &zero, 0)).expect("find_min_limit hangs");
    assert!(matches!(l, Ok(None)), "{l:?}");
    let huge = Trace { events: vec![(0, alloc(1, 1 << 60))], orphan_frees: 0 };
    let l = within(30, move || find_min_limit(host, &huge, 0)).expect("find_min_limit hangs");
    assert!(matches!(l, Ok(None)), "{l:?}");
}

/// A history whose oldest events were dropped: frees of addresses it never saw allocated are
/// counted as orphans and left out, and the rest replays.
#[test]
fn a_history_with_dropped_events_counts_orphan_frees() {
    let ev = |seq, kind| Event { seq, time_us: seq, kind };
    let free = |addr| EventKind::Free { addr, size: 10, capacity: 256, to_cache: true };
    let al = |addr, size| EventKind::Alloc {
        addr,
        size,
        capacity: 256,
        label: Some("x".into()),
        from_cache: false,
        backtrace: None,
    };
    let h = HistorySnapshot {
        capacity: 4,
        dropped: 10,
        copies: Default::default(),
        events: vec![
            ev(10, free(0x1000)),
            ev(11, al(0x2000, 100)),
            ev(12, free(0x2000)),
            ev(13, free(0x2000)),
        ],
    };
    let trace = Trace::from_history(&h);
    assert_eq!(trace.orphan_frees, 2);
    assert!(replay(&host().unwrap(), &trace, 0).unwrap().failure.is_none());
}

/// The limit `find_min_limit` finds for an irregular trace is one under which it replays.
#[test]
fn find_min_limit_is_a_limit_under_which_it_replays() {
    let tensors: Vec<_> = (0..50u64)
        .map(|i| TensorLife { size: 1000 + (i * 7919) % 50_000, first: i, last: i + (i % 5) })
        .collect();
    let trace = Trace::from_tensors(&tensors, None);
    let l = find_min_limit(host, &trace, 0).unwrap().unwrap();
    assert!(l >= trace.lower_bound());
    let a = host().unwrap();
    a.set_memory_limit(Some(l), 0).unwrap();
    assert!(replay(&a, &trace, 0).unwrap().failure.is_none(), "it does not replay under {l}");
}

fn t(size: u64, first: u64, last: u64) -> TensorLife {
    TensorLife { size, first, last }
}

/// Every planner on `tensors`: never a panic; each `Ok` plan passes `check`.
fn every_planner(tensors: &[TensorLife], alignment: u64) -> Vec<(&'static str, Result<u64, String>)> {
    type Planner = fn(&[TensorLife], u64) -> devalloc::Result<MemoryPlan>;
    let planners: [(&str, Planner); 5] = [
        ("one_after_another", one_after_another),
        ("greedy_by_size", greedy_by_size),
        ("executorch_greedy", executorch_greedy),
        ("fast", |t, a| plan(t, a, Strategy::Fast)),
        ("search0", |t, a| plan(t, a, Strategy::Search { budget_ms: 0 })),
    ];
    let run = |(name, f): (&'static str, Planner)| {
        let r = no_panic(|| f(tensors, alignment)).unwrap_or_else(|p| panic!("{name} panicked: {p}"));
        let r = r.map(|p| {
            check(tensors, alignment, p.offsets(), p.size())
                .unwrap_or_else(|e| panic!("{name} returned an invalid plan: {e}"));
            p.size()
        });
        (name, r.map_err(|e| e.to_string()))
    };
    planners.into_iter().map(run).collect()
}

/// Tensors of `u64::MAX` bytes never live at once (the last at step `u64::MAX`) share the
/// buffer; only one after another cannot place them.
#[test]
fn tensors_of_u64_max_bytes_at_disjoint_steps_share_the_buffer() {
    let tensors = [t(u64::MAX, 0, 0), t(u64::MAX, 1, 1), t(u64::MAX, u64::MAX, u64::MAX)];
    for (name, r) in every_planner(&tensors, 1) {
        if name == "one_after_another" {
            assert!(r.is_err(), "one after another cannot fit 3 x u64::MAX");
        } else {
            assert_eq!(r, Ok(u64::MAX), "{name}");
        }
    }
}

/// 64 identical tensors pack exactly; tensors that never overlap need only the largest.
#[test]
fn identical_tensors_pack_exactly_and_disjoint_ones_share() {
    let dup = vec![t(1000, 3, 7); 64];
    for (name, r) in every_planner(&dup, 64) {
        assert!(r.is_ok(), "{name}: {r:?}");
    }
    assert_eq!(plan(&dup, 64, Strategy::Fast).unwrap().size(), 63 * 1024 + 1000);
    let none: Vec<_> = (0..1000).map(|i| t(1 + i % 97, i, i)).collect();
    assert_eq!(plan(&none, 1, Strategy::Fast).unwrap().size(), 97);
}

/// A search with a budget of 0 ms or `u64::MAX` ms ends on small inputs; the unbounded one
/// proves its plan optimal.
#[test]
fn search_with_budget_zero_and_max_ends_on_small_inputs() {
    let mut rng = crate::conformance::Rng(3);
    for case in 0..40u64 {
        let n = 2 + rng.below(9);
        let tensors: Vec<_> = (0..n)
            .map(|_| {
                let first = rng.below(6) as u64;
                t(1 + rng.below(100) as u64, first, first + rng.below(4) as u64)
            })
            .collect();
        for budget_ms in [0, u64::MAX] {
            let tt = tensors.clone();
            let r = within(30, move || plan(&tt, 1 << (case % 4), Strategy::Search { budget_ms }))
                .unwrap_or_else(|| {
                    panic!("Search {{ budget_ms: {budget_ms} }} ran past 30 s on {tensors:?}")
                });
            let p = r.unwrap();
            assert!(
                budget_ms != u64::MAX || p.is_optimal(),
                "an unbounded search of {n} tensors ended unproven"
            );
        }
    }
}

#[test]
fn fast_gives_the_same_plan_on_every_thread() {
    let mut rng = crate::conformance::Rng(99);
    let tensors: Vec<_> = (0..400)
        .map(|_| {
            let first = rng.below(300) as u64;
            t(1 + rng.below(10_000) as u64, first, first + rng.below(40) as u64)
        })
        .collect();
    let first = plan(&tensors, 16, Strategy::Fast).unwrap().offsets().to_vec();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let tt = tensors.clone();
            std::thread::spawn(move || plan(&tt, 16, Strategy::Fast).unwrap().offsets().to_vec())
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), first, "Fast gave another plan on another thread");
    }
}

#[test]
fn the_memory_of_an_empty_plan_holds_no_tensor() {
    let host = HostAllocator::new();
    let p = plan(&[], 64, Strategy::Fast).unwrap();
    assert_eq!(p.size(), 0);
    let mem = PlannedMemory::from_plan(&host, &p, 0).unwrap();
    assert!(mem.tensor(0).is_err());
    drop(mem);
    assert_eq!(host.stats(0).unwrap().live_allocations, 0);
}
