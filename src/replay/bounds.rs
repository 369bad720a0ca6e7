//! What no allocator that never shares a block can beat: the least it must hold to serve a
//! history again and again without asking the device for anything (wgpu's case: two
//! allocations never share a buffer).

use std::collections::{BTreeMap, HashMap};

use super::{Trace, TraceEvent};
use crate::storage::default_size_class;

impl Trace {
    /// A floor under what an allocator that never shares a block (each block serves one
    /// allocation at a time) must hold to serve every step of this history again and again
    /// without asking the device for anything, with blocks at least the capacity devalloc gives a
    /// request (512-byte granules): at each step the live requests must fit distinct blocks at
    /// least their size, so the k-th largest block is at least the largest k-th largest live
    /// capacity the history ever has (Hall's condition for blocks nested by size); the floor is
    /// their sum. It is a floor, not always reachable: an allocation keeps its block while it
    /// lives, which the floor does not model. At least [`Trace::lower_bound`] (up to the
    /// granules); `u64::MAX` if it does not fit.
    pub fn unshared_bound(&self) -> u64 {
        let mut live: BTreeMap<u64, u64> = BTreeMap::new();
        let mut caps: HashMap<u64, u64> = HashMap::new();
        let mut best: Vec<u64> = Vec::new();
        let mut at = 0;
        while at < self.events.len() {
            let step = self.events[at].0;
            // Every event of one step, then the live set as it stands.
            while at < self.events.len() && self.events[at].0 == step {
                match &self.events[at].1 {
                    TraceEvent::Alloc { id, size, .. } => {
                        let cap = default_size_class(*size).unwrap_or(u64::MAX);
                        if let Some(old) = caps.insert(*id, cap) {
                            remove(&mut live, old);
                        }
                        *live.entry(cap).or_default() += 1;
                    }
                    TraceEvent::Free { id } => {
                        if let Some(cap) = caps.remove(id) {
                            remove(&mut live, cap);
                        }
                    }
                    TraceEvent::EmptyCache => {}
                }
                at += 1;
            }
            let mut k = 0;
            for (&cap, &n) in live.iter().rev() {
                for _ in 0..n {
                    match best.get_mut(k) {
                        Some(b) if *b >= cap => {}
                        Some(b) => *b = cap,
                        None => best.push(cap),
                    }
                    k += 1;
                }
            }
        }
        best.iter().try_fold(0u64, |sum, &b| sum.checked_add(b)).unwrap_or(u64::MAX)
    }
}

fn remove(live: &mut BTreeMap<u64, u64>, cap: u64) {
    if let Some(n) = live.get_mut(&cap) {
        *n -= 1;
        if *n == 0 {
            live.remove(&cap);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::TensorLife;

    fn trace(t: &[(u64, u64, u64)]) -> Trace {
        let lives: Vec<TensorLife> =
            t.iter().map(|&(size, first, last)| TensorLife { size, first, last }).collect();
        Trace::from_tensors(&lives, None)
    }

    #[test]
    fn sizes_far_apart_at_different_times_need_blocks_of_each() {
        // 1 KiB and 2 KiB live together, then 3 KiB alone: with no block shared, a 3 KiB block
        // (for the 3 KiB) and a 1 KiB one (the second largest, at the first step) are needed.
        let t = trace(&[(1024, 0, 0), (2048, 0, 0), (3072, 1, 1)]);
        assert_eq!(t.lower_bound(), 3072);
        assert_eq!(t.unshared_bound(), 3072 + 1024);
    }

    #[test]
    fn a_history_whose_sizes_repeat_needs_no_more_than_it_holds() {
        let t = trace(&[(4096, 0, 1), (1000, 1, 2), (4096, 2, 3), (1000, 3, 4)]);
        assert_eq!(t.lower_bound(), 5096);
        assert_eq!(t.unshared_bound(), 4096 + 1024, "1000 bytes take a 1024-byte capacity");
        assert_eq!(Trace::default().unshared_bound(), 0);
        assert_eq!(trace(&[(u64::MAX - 10, 0, 0), (u64::MAX - 10, 0, 0)]).unshared_bound(), u64::MAX);
    }

    #[test]
    fn the_bound_is_a_floor_not_always_reachable() {
        // Blocks of 1536 + 512 pass every step taken alone, but the second 512-byte buffer
        // (steps 2-3) must take the 1536-byte block the 1536-byte buffer needs at step 3:
        // the least that works is 2560. The floor says 2048, below it, as a floor may.
        let t = trace(&[(1024, 0, 1), (512, 1, 2), (512, 2, 3), (1536, 3, 3)]);
        assert_eq!(t.unshared_bound(), 1536 + 512);
    }
}
