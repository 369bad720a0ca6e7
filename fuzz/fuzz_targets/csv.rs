//! `csv`: MiniMalloc's CSV reader (`plan::Instance::from_csv`) on arbitrary bytes (as UTF-8, or
//! lossily converted when they are not). It must never panic; what it accepts must be a valid
//! planning problem (one unique id per tensor, sizes >= 1, `first <= last`, sizes adding up
//! within 64 bits), `to_csv` must read back as the same instance, and the lower bound of the
//! replay trace made from it must equal the planner's.
#![no_main]

use devalloc::plan::{lower_bound, Instance};
use devalloc::replay::Trace;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(inst) = Instance::from_csv("fuzz.csv", &text) else { return };
    assert_eq!(inst.ids.len(), inst.tensors.len());
    let mut ids = std::collections::HashSet::new();
    let mut total = 0u64;
    for (id, t) in inst.ids.iter().zip(&inst.tensors) {
        assert!(ids.insert(id.as_str()), "id {id:?} accepted twice");
        assert!(t.size >= 1 && t.first <= t.last && t.last < u64::MAX, "{t:?}");
        total = total.checked_add(t.size).expect("the sizes add up past 64 bits yet were accepted");
    }
    let offsets: Vec<u64> = (0..inst.tensors.len() as u64).collect();
    let written = inst.to_csv(&offsets);
    let back = Instance::from_csv("back.csv", &written)
        .unwrap_or_else(|e| panic!("to_csv wrote what from_csv refuses: {e}\n{written}"));
    assert_eq!(back, inst, "to_csv does not round-trip");
    let bound = lower_bound(&inst.tensors).expect("an accepted instance has a lower bound");
    assert!(bound <= total);
    assert_eq!(Trace::from_tensors(&inst.tensors, Some(&inst.ids)).lower_bound(), bound);
});
