//! The planner's search, through its public API: every plan valid on random instances
//! (proptest, checked here independently), optimal against brute force on small ones, and the
//! lower bound reached on instances built to reach it (perfect tilings and packings, chains).

use devalloc::plan::{executorch_greedy, greedy_by_size, lower_bound, plan, Strategy, TensorLife};
use proptest::prelude::{prop, prop_assert, prop_assert_eq, proptest, ProptestConfig};

use crate::plan::{
    all_plans, assert_valid, brute_lower_bound, instance, reference_executorch, reference_greedy_by_size, t,
};
proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn every_plan_is_valid(tensors in instance(18, 300), shift in 0u32..=8) {
        let alignment = 1u64 << shift;
        let plans = all_plans(&tensors, alignment, 5);
        for p in &plans {
            assert_valid(&tensors, alignment, p);
        }
        let (gbs, fast, search) = (&plans[1], &plans[3], &plans[4]);
        prop_assert!(fast.size() <= gbs.size(), "Fast {} worse than greedy-by-size {}", fast.size(), gbs.size());
        prop_assert!(search.size() <= fast.size(), "Search {} worse than Fast {}", search.size(), fast.size());
        prop_assert_eq!(lower_bound(&tensors).unwrap(), brute_lower_bound(&tensors));
    }

    #[test]
    fn peers_match_their_references(tensors in instance(30, 1000), shift in 0u32..=8) {
        let alignment = 1u64 << shift;
        let gbs = greedy_by_size(&tensors, alignment).unwrap();
        prop_assert_eq!(gbs.offsets(), &reference_greedy_by_size(&tensors, alignment)[..]);
        let et = executorch_greedy(&tensors, alignment).unwrap();
        prop_assert_eq!(et.offsets(), &reference_executorch(&tensors, alignment)[..]);
    }

    #[test]
    fn fast_is_deterministic(tensors in instance(30, 1000), seed in 0u64..4) {
        // A quarter of the cases is enough for determinism (Fast runs its full work budget on
        // instances it cannot solve, which is slow in debug builds).
        if seed != 0 {
            return Ok(());
        }
        let a = plan(&tensors, 8, Strategy::Fast).unwrap();
        let b = plan(&tensors, 8, Strategy::Fast).unwrap();
        prop_assert_eq!(a.offsets(), b.offsets());
    }
}

/// The true optimum of a tiny instance by brute force: some optimal plan is first-fit in some
/// order (place each tensor at the lowest aligned offset where it fits), so try every order.
fn brute_optimum(tensors: &[TensorLife], alignment: u64) -> u64 {
    fn first_fit(tensors: &[TensorLife], alignment: u64, order: &[usize]) -> u64 {
        let mut placed: Vec<(usize, u64)> = Vec::new();
        let mut top = 0;
        for &i in order {
            let x = tensors[i];
            let clash = |o: u64, j: usize, oj: u64| {
                let y = tensors[j];
                x.first <= y.last && y.first <= x.last && o < oj + y.size && oj < o + x.size
            };
            let mut spots: Vec<u64> = placed
                .iter()
                .map(|&(j, oj)| (oj + tensors[j].size).div_ceil(alignment) * alignment)
                .collect();
            spots.push(0);
            spots.sort_unstable();
            let o = spots.into_iter().find(|&o| placed.iter().all(|&(j, oj)| !clash(o, j, oj))).unwrap_or(0);
            placed.push((i, o));
            top = top.max(o + x.size);
        }
        top
    }
    fn permute(k: usize, order: &mut Vec<usize>, best: &mut u64, f: &dyn Fn(&[usize]) -> u64) {
        if k == order.len() {
            *best = (*best).min(f(order));
            return;
        }
        for i in k..order.len() {
            order.swap(k, i);
            permute(k + 1, order, best, f);
            order.swap(k, i);
        }
    }
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    let mut best = u64::MAX;
    permute(0, &mut order, &mut best, &|o: &[usize]| first_fit(tensors, alignment, o));
    if tensors.is_empty() {
        0
    } else {
        best
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn search_finds_the_true_optimum_of_tiny_instances(
        v in prop::collection::vec((1u64..=12, 0u64..6, 0u64..4), 1..=6),
        shift in 0u32..=3,
    ) {
        let tensors: Vec<TensorLife> = v.into_iter().map(|(size, first, len)| t(size, first, first + len)).collect();
        let alignment = 1u64 << shift;
        let optimum = brute_optimum(&tensors, alignment);
        let search = plan(&tensors, alignment, Strategy::Search { budget_ms: 2_000 }).unwrap();
        prop_assert_eq!(search.size(), optimum);
        prop_assert!(search.is_optimal(), "the search proves optimality of tiny instances");
        let fast = plan(&tensors, alignment, Strategy::Fast).unwrap();
        prop_assert!(fast.size() >= optimum);
        prop_assert!(!fast.is_optimal() || fast.size() == optimum, "Fast claimed optimality wrongly");
    }
}

/// A random guillotine partition of the rectangle `steps x height` (time x bytes): every step is
/// covered exactly up to `height`, so the lower bound is `height` and a plan of that size exists.
/// Heights are multiples of `unit`. The tensors come back shuffled.
fn perfect_packing(seed: u64, steps: u64, height: u64, unit: u64, pieces: usize) -> Vec<TensorLife> {
    let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
    let mut rnd = move |n: u64| {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % n.max(1)
    };
    // Rectangles as (t0, t1, y0, y1), half-open.
    let mut rects = vec![(0u64, steps, 0u64, height / unit)];
    while rects.len() < pieces {
        let k = rnd(rects.len() as u64) as usize;
        let (t0, t1, y0, y1) = rects[k];
        let cut_time = rnd(2) == 0;
        if cut_time && t1 - t0 >= 2 {
            let c = t0 + 1 + rnd(t1 - t0 - 1);
            rects[k] = (t0, c, y0, y1);
            rects.push((c, t1, y0, y1));
        } else if y1 - y0 >= 2 {
            let c = y0 + 1 + rnd(y1 - y0 - 1);
            rects[k] = (t0, t1, y0, c);
            rects.push((t0, t1, c, y1));
        } else if rects.iter().all(|&(a, b, c, d)| b - a < 2 && d - c < 2) {
            break;
        }
    }
    let mut tensors: Vec<TensorLife> =
        rects.iter().map(|&(t0, t1, y0, y1)| t((y1 - y0) * unit, t0, t1 - 1)).collect();
    for i in (1..tensors.len()).rev() {
        let j = rnd(i as u64 + 1) as usize;
        tensors.swap(i, j);
    }
    tensors
}

/// A random perfect packing of `steps x height` unit cells, not limited to guillotine cuts:
/// cells are filled in (step, offset) order, each free cell starting a tensor of random height
/// and lifetime that only covers free cells. Every step ends up exactly full, so the lower bound
/// is `height * unit` and a plan of that size exists. The tensors come back shuffled.
fn perfect_tiling(seed: u64, steps: usize, height: usize, unit: u64) -> Vec<TensorLife> {
    let mut state = seed ^ 0x9e37_79b9_7f4a_7c15;
    let mut rnd = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n.max(1) as u64) as usize
    };
    let mut used = vec![vec![false; height]; steps];
    let mut tensors = Vec::new();
    for s in 0..steps {
        for y in 0..height {
            if used[s][y] {
                continue;
            }
            let free_up = (y..height).take_while(|&k| !used[s][k]).count();
            let h = 1 + rnd(free_up.min(6));
            let max_d = (s..steps).take_while(|&k| (y..y + h).all(|j| !used[k][j])).count();
            let d = 1 + rnd(max_d.min(8));
            for row in used.iter_mut().skip(s).take(d) {
                for cell in row.iter_mut().skip(y).take(h) {
                    *cell = true;
                }
            }
            tensors.push(t(h as u64 * unit, s as u64, (s + d - 1) as u64));
        }
    }
    for i in (1..tensors.len()).rev() {
        let j = rnd(i + 1);
        tensors.swap(i, j);
    }
    tensors
}

#[test]
fn search_reaches_the_lower_bound_of_perfect_tilings() {
    for seed in 0..10u64 {
        let (unit, align) = if seed % 2 == 0 { (32, 32) } else { (7, 1) };
        let tensors = perfect_tiling(seed, 24, 16, unit);
        assert_eq!(lower_bound(&tensors).unwrap(), 16 * unit);
        let p = plan(&tensors, align, Strategy::Search { budget_ms: 20_000 }).unwrap();
        assert_valid(&tensors, align, &p);
        assert_eq!(p.size(), 16 * unit, "seed {seed}: search missed the perfect tiling");
        assert!(p.is_optimal());
    }
}

#[test]
fn search_reaches_the_lower_bound_of_perfect_packings() {
    for seed in 0..12u64 {
        let (unit, align) = if seed % 3 == 0 { (16, 16) } else { (1, 1) };
        let tensors = perfect_packing(seed, 60, 256 * unit, unit, 24 + (seed as usize % 4) * 12);
        assert_eq!(lower_bound(&tensors).unwrap(), 256 * unit);
        let p = plan(&tensors, align, Strategy::Search { budget_ms: 20_000 }).unwrap();
        assert_valid(&tensors, align, &p);
        assert_eq!(p.size(), 256 * unit, "seed {seed}: search missed the perfect packing");
        assert!(p.is_optimal());
    }
}

#[test]
fn chains_reach_the_lower_bound() {
    // A chain: each tensor feeds the next, so only neighbours overlap.
    let chain: Vec<TensorLife> = (0..50u64).map(|i| t(100 + (i * 37) % 400, i, i + 1)).collect();
    let lb = lower_bound(&chain).unwrap();
    for strategy in [Strategy::Fast, Strategy::Search { budget_ms: 1000 }] {
        let p = plan(&chain, 1, strategy).unwrap();
        assert_valid(&chain, 1, &p);
        assert_eq!(p.size(), lb);
        assert!(p.is_optimal());
    }
    // Disjoint lifetimes reuse one slot.
    let disjoint: Vec<TensorLife> = (0..20u64).map(|i| t(64, 2 * i, 2 * i + 1)).collect();
    let p = plan(&disjoint, 64, Strategy::Fast).unwrap();
    assert_eq!(p.size(), 64);
    assert!(p.offsets().iter().all(|&o| o == 0));
}

#[test]
fn search_proves_optimality_above_the_lower_bound() {
    // Two 3-byte tensors live together at step 1, at alignment 4: their offsets must be 0 and 4,
    // so 7 bytes, while the (unrounded) bound is 6; the search must prove 7 optimal.
    let tensors = [t(3, 0, 1), t(3, 1, 2)];
    let p = plan(&tensors, 4, Strategy::Search { budget_ms: 1000 }).unwrap();
    assert_eq!(p.lower_bound(), 6);
    assert_eq!(p.size(), 7);
    assert!(p.is_optimal(), "7 is optimal: nothing smaller fits at alignment 4");
}
