//! The greedy tree is optimal: checked against an exact dynamic program over ordered trees,
//! the DP against exhaustive enumeration, and greedy against every other builder.

use greedy_tree::{LaunchModel, Topology, Tree, greedy, greedy_with_heap};
use proptest::prelude::*;

/// Models with parameters on a 1 µs grid, so nanosecond arithmetic is exact.
fn model(seq_us: u32, rem_us: u32, concurrency: u32) -> LaunchModel {
    LaunchModel::new(seq_us as f64 * 1e-6, rem_us as f64 * 1e-6)
        .unwrap()
        .with_concurrency(concurrency)
        .unwrap()
}

/// The same with no parent launching more than `k` children.
fn capped(seq_us: u32, rem_us: u32, concurrency: u32, k: u32) -> LaunchModel {
    model(seq_us, rem_us, concurrency)
        .with_max_fanout(k)
        .unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(1.0)
}

/// Least launch time of any ordered tree of 1..=n positions: a root with children subtrees of
/// sizes s1, s2, … (launch order) finishes at max_i(offset(i) + best[s_i]), and each subtree
/// is optimal on its own. best[n] = g(n - 1, 1), g(m, i) = min_s max(offset(i) + best[s],
/// g(m - s, i + 1)), g(0, ·) = 0, and g(m > 0, i) = ∞ past the fan-out cap.
fn optimum_by_dp(n: usize, m: &LaunchModel) -> Vec<f64> {
    let mut best = vec![0.0; n + 1];
    for size in 2..=n {
        let rest = size - 1;
        // g[m][i] for the children of a root still to place m positions, next child index i.
        let mut g = vec![vec![0.0f64; rest + 2]; rest + 1];
        let cap = m.max_fanout().map_or(usize::MAX, |k| k as usize);
        for left in 1..=rest {
            for i in (1..=rest).rev() {
                if i > cap {
                    g[left][i] = f64::INFINITY;
                    continue;
                }
                g[left][i] = (1..=left)
                    .map(|s| {
                        let tail = if left == s { 0.0 } else { g[left - s][i + 1] };
                        (m.child_offset(i) + best[s]).max(tail)
                    })
                    .fold(f64::INFINITY, f64::min);
            }
        }
        best[size] = g[rest][1];
    }
    best
}

/// Every ordered tree of `n` positions, as preorder subtree sizes.
fn all_trees(n: usize) -> Vec<Vec<u32>> {
    if n == 1 {
        return vec![vec![1]];
    }
    // The children's subtree sizes are a composition of n - 1.
    let mut out = Vec::new();
    for forest in all_forests(n - 1) {
        let mut sizes = vec![n as u32];
        sizes.extend(forest);
        out.push(sizes);
    }
    out
}

fn all_forests(n: usize) -> Vec<Vec<u32>> {
    if n == 0 {
        return vec![vec![]];
    }
    let mut out = Vec::new();
    for first in 1..=n {
        for head in all_trees(first) {
            for tail in all_forests(n - first) {
                let mut f = head.clone();
                f.extend(tail);
                out.push(f);
            }
        }
    }
    out
}

#[test]
fn dp_equals_exhaustive_search() {
    for (seq, rem, c, k) in [
        (1, 2, 1, 9),
        (3, 2, 1, 9),
        (1, 5, 2, 9),
        (0, 1, 1, 9),
        (7, 172, 1, 9),
        (2, 3, 3, 9),
        (1, 5, 1, 2),
        (0, 3, 2, 3),
    ] {
        let m = capped(seq, rem, c, k);
        let best = optimum_by_dp(10, &m);
        for (n, &dp) in best.iter().enumerate().skip(1) {
            let exhaustive = all_trees(n)
                .into_iter()
                .map(|s| Tree::from_subtree_sizes(s).unwrap())
                .filter(|t| t.max_fanout() <= k as usize)
                .map(|t| t.launch_time(&m))
                .fold(f64::INFINITY, f64::min);
            assert!(
                close(dp, exhaustive),
                "n={n} {m:?}: dp {dp} vs {exhaustive}"
            );
        }
    }
}

#[test]
fn greedy_equals_exhaustive_search_up_to_12() {
    for (seq, rem, c) in [(1, 2, 1), (2, 3, 2), (5, 1, 1)] {
        let m = model(seq, rem, c);
        for n in 1..=12 {
            let exhaustive = all_trees(n)
                .into_iter()
                .map(|s| Tree::from_subtree_sizes(s).unwrap().launch_time(&m))
                .fold(f64::INFINITY, f64::min);
            let g = greedy(n, &m).launch_time(&m);
            assert!(
                close(g, exhaustive),
                "n={n} {m:?}: greedy {g} vs {exhaustive}"
            );
        }
    }
}

/// The greedy tree of each subtree's size has the subtree's exact shape.
fn assert_subtrees_are_greedy(tree: &Tree, m: &LaunchModel) {
    for v in 0..tree.len() {
        let range = tree.subtree_range(v);
        let own = greedy(range.len(), m);
        assert_eq!(
            own.subtree_sizes(),
            &tree.subtree_sizes()[range.clone()],
            "subtree of node {v} ({range:?}) under {m:?}"
        );
        let from_range = own.child_ranges(range.clone());
        let planned: Vec<_> = tree.children(v).map(|c| tree.subtree_range(c)).collect();
        assert_eq!(from_range, planned, "children of node {v}");
    }
}

#[test]
fn every_subtree_of_a_greedy_tree_is_the_greedy_tree_of_its_size() {
    for (seq, rem, c) in [
        (7_000, 172_000, 1),
        (1, 2, 1),
        (1, 3, 1),
        (0, 5, 1),
        (2, 3, 4),
    ] {
        let m = model(seq, rem, c);
        for n in [1, 2, 5, 17, 64, 100, 257, 1000] {
            assert_subtrees_are_greedy(&greedy(n, &m), &m);
        }
    }
}

/// `Topology::shape` is the walk's shape of the built tree, to the last bit of the launch
/// time (the summary prints it in full).
fn assert_shape_is_the_walks(t: Topology, n: usize, m: &LaunchModel) -> Result<(), String> {
    let fast = t.shape(n, m);
    let walked = t.build(n, m).shape(m);
    if (fast.depth, fast.max_fanout, fast.launch_time.to_bits())
        == (
            walked.depth,
            walked.max_fanout,
            walked.launch_time.to_bits(),
        )
    {
        Ok(())
    } else {
        Err(format!("{t} n={n} {m:?}: {fast:?} vs walked {walked:?}"))
    }
}

#[test]
fn shape_without_the_tree_on_large_trees() {
    // Parameters off the nanosecond grid and a tie-rich one on it.
    let models = [
        LaunchModel::default(),
        LaunchModel::new(0.007, 0.172).unwrap(),
        LaunchModel::new(0.0123456789123, 0.2987654321).unwrap(),
        LaunchModel::new(1.0, 3.0)
            .unwrap()
            .with_concurrency(2)
            .unwrap(),
        LaunchModel::new(0.3, 0.1).unwrap(),
        LaunchModel::new(2e-10, 0.1).unwrap(),
        LaunchModel::default().with_max_fanout(16).unwrap(),
    ];
    for m in &models {
        for n in [0, 1, 2, 3, 1000, 4097, 65_536, 100_003, 300_000] {
            assert_shape_is_the_walks(Topology::Greedy, n, m).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn shape_without_the_tree_is_the_walks(
        n in 0usize..6000,
        seq in prop_oneof![0.0..1.0f64, 0.0..1e-9f64, Just(0.0)],
        rem in 1e-9..2.0f64,
        c in 1u32..5,
        cap in prop::option::of(1u32..40),
        t in 0usize..5,
    ) {
        let mut m = LaunchModel::new(seq, rem).unwrap().with_concurrency(c).unwrap();
        if let Some(k) = cap {
            m = m.with_max_fanout(k).unwrap();
        }
        let topology = [Topology::Greedy, Topology::Greedy, Topology::Greedy, Topology::Flat,
                        Topology::Binomial][t];
        prop_assert!(assert_shape_is_the_walks(topology, n, &m).is_ok(), "{:?}",
                     assert_shape_is_the_walks(topology, n, &m));
    }

    #[test]
    fn shape_equals_the_per_position_arrays(
        n in 1usize..600, seq in 0u32..50, rem in 1u32..200, c in 1u32..4, t in 0usize..6
    ) {
        let m = model(seq, rem, c);
        let topology = ["greedy", "flat", "chain", "binomial", "kary:2", "kary:7"][t];
        let tree = topology.parse::<greedy_tree::Topology>().unwrap().build(n, &m);
        let shape = tree.shape(&m);
        let latest = tree.launch_times(&m).into_iter().fold(0.0, f64::max);
        prop_assert_eq!(shape.depth, tree.depths().into_iter().max().unwrap_or(0));
        prop_assert_eq!(
            shape.max_fanout,
            (0..n).map(|v| tree.children(v).count()).max().unwrap_or(0)
        );
        prop_assert!(shape.launch_time == latest, "{} vs {}", shape.launch_time, latest);
        let (times, index, depth) = (tree.launch_times(&m), tree.child_indices(), tree.depths());
        for p in tree.positions(&m) {
            let v = p.node_idx;
            prop_assert_eq!(p.parent, tree.parent(v));
            prop_assert_eq!((p.child_index, p.depth), (index[v], depth[v]));
            prop_assert!(p.launch_time == times[v]);
            prop_assert_eq!(p.subtree_end, tree.subtree_range(v).end);
        }
        prop_assert_eq!(tree.positions(&m).count(), n);
    }

    #[test]
    fn greedy_is_optimal_against_the_dp(
        n in 1usize..48, seq in 0u32..50, rem in 1u32..200, c in 1u32..4
    ) {
        let m = model(seq, rem, c);
        let dp = optimum_by_dp(n, &m)[n];
        let g = greedy(n, &m).launch_time(&m);
        prop_assert!(close(g, dp), "n={} {:?}: greedy {} vs optimum {}", n, m, g, dp);
    }

    #[test]
    fn capped_greedy_is_optimal_against_the_dp(
        n in 1usize..40, seq in 0u32..50, rem in 1u32..200, c in 1u32..3, k in 1u32..5
    ) {
        let m = capped(seq, rem, c, k);
        let dp = optimum_by_dp(n, &m)[n];
        let tree = greedy(n, &m);
        prop_assert!(tree.max_fanout() <= k as usize, "fan-out {} > cap {}", tree.max_fanout(), k);
        let g = tree.launch_time(&m);
        prop_assert!(close(g, dp), "n={} {:?}: greedy {} vs optimum {}", n, m, g, dp);
    }

    #[test]
    fn capped_subtrees_are_greedy(
        n in 1usize..400, seq in 0u32..1000, rem in 1u32..5000, k in 1u32..8
    ) {
        let m = capped(seq, rem, 1, k);
        assert_subtrees_are_greedy(&greedy(n, &m), &m);
    }

    #[test]
    fn greedy_is_no_slower_than_any_builder(
        n in 1usize..5000, seq in 0u32..100_000, rem in 1u32..2_000_000, c in 1u32..5
    ) {
        let m = model(seq, rem, c);
        let g = greedy(n, &m).launch_time(&m);
        let heap = greedy_with_heap(n, &m).launch_time(&m);
        prop_assert!(close(g, heap), "heap reference {} vs {}", heap, g);
        for t in Topology::default_set() {
            let other = t.build(n, &m).launch_time(&m);
            prop_assert!(g <= other + 1e-9, "{} is faster: {} < {}", t, other, g);
        }
    }

    #[test]
    fn subtrees_of_random_greedy_trees_are_greedy(
        n in 1usize..400, seq in 0u32..1000, rem in 1u32..5000, c in 1u32..4
    ) {
        let m = model(seq, rem, c);
        assert_subtrees_are_greedy(&greedy(n, &m), &m);
    }

    #[test]
    fn every_builder_gives_a_tree_of_n_positions(n in 0usize..3000, k in 1u32..70) {
        let m = LaunchModel::default();
        for t in [Topology::Greedy, Topology::Flat, Topology::Chain, Topology::Binomial,
                  Topology::Kary(k)] {
            let tree = t.build(n, &m);
            prop_assert_eq!(tree.len(), n);
            // Re-validating the sizes proves the layout is a preorder tree.
            prop_assert!(Tree::from_subtree_sizes(tree.subtree_sizes().to_vec()).is_ok());
        }
    }
}
