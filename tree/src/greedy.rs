//! The greedy tree: each next host goes to the free position with the smallest launch time,
//! which is optimal under the model (Goehner et al., Theorem 1). Built in linear time.
//!
//! Positions become free in non-decreasing launch-time order, so no heap is needed. Every
//! placed position `v` at time `t` frees exactly two positions: its first child at `t + REM`,
//! and its next sibling at `t + SEQ` (or at `t` when the parent still has a launch slot free in
//! the same wave). Each of those three kinds of freed positions is produced in placement order,
//! hence in non-decreasing time; the smallest free position is the smallest of three queue
//! heads, and the queues are just cursors into the placement list.
//!
//! Ties are broken so that the tree is *canonical*: every position launched before the tree's
//! launch time `T` is used, and the positions at exactly `T` that are still needed are taken in
//! depth-first order. That rule makes every subtree the greedy tree of its own size, so a
//! forwarder that recomputes the tree for its own slice of the host list gets exactly the
//! shape the root planned (see [`crate::Tree::child_ranges`]).

use crate::{LaunchModel, Tree};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

const NO_PARENT: u32 = u32::MAX;

/// The optimal (greedy) launch tree of `n` positions under `model`, in O(n) time.
///
/// ```
/// let model = greedy_tree::LaunchModel::new(0.007, 0.172).unwrap();
/// let tree = greedy_tree::greedy(1000, &model);
/// let flat = greedy_tree::Topology::Flat.build(1000, &model);
/// assert!(tree.launch_time(&model) < flat.launch_time(&model));
/// ```
pub fn greedy(n: usize, model: &LaunchModel) -> Tree {
    if n <= 1 {
        return Tree::from_subtree_sizes(vec![1; n]).expect("zero or one position");
    }
    let placed = place_in_time_order(n, model);
    let frontier_time = placed.time[n - 1];
    // Positions strictly before the frontier: all of them belong to the tree.
    let m0 = placed.time.partition_point(|&t| t < frontier_time);
    layout_with_frontier(&placed, m0, n, frontier_time, model)
}

/// Positions in the order the greedy algorithm fills them (parent in this order, launch time).
struct Placed {
    parent: Vec<u32>,
    child_index: Vec<u32>,
    time: Vec<u64>,
}

/// Where the next free position comes from.
#[derive(Clone, Copy)]
enum Queue {
    /// The first child of a placed position.
    FirstChild,
    /// The next sibling of a placed position, one SEQ later.
    NewWave,
    /// The next sibling of a placed position, in the same wave.
    SameWave,
}

/// Phase 1: the first `n` positions in non-decreasing launch-time order, in O(n).
fn place_in_time_order(n: usize, model: &LaunchModel) -> Placed {
    let (seq, rem) = (model.seq_ns(), model.rem_ns());
    let c = model.concurrency();
    let mut p = Placed {
        parent: Vec::with_capacity(n),
        child_index: Vec::with_capacity(n),
        time: Vec::with_capacity(n),
    };
    p.parent.push(NO_PARENT);
    p.child_index.push(0);
    p.time.push(0);
    // Cursors: next position whose first child is free; next one whose next sibling starts a
    // new wave (SEQ later); next one whose next sibling shares its wave (same time).
    let (mut first_child, mut new_wave, mut same_wave) = (0usize, 1usize, 1usize);
    while p.time.len() < n {
        let len = p.time.len();
        while new_wave < len && !p.child_index[new_wave].is_multiple_of(c) {
            new_wave += 1;
        }
        while same_wave < len && p.child_index[same_wave].is_multiple_of(c) {
            same_wave += 1;
        }
        // Strict comparisons: on a tie the earlier queue wins, which phase 2 makes irrelevant.
        let mut best = (p.time[first_child] + rem, Queue::FirstChild);
        if new_wave < len && p.time[new_wave] + seq < best.0 {
            best = (p.time[new_wave] + seq, Queue::NewWave);
        }
        if same_wave < len && p.time[same_wave] < best.0 {
            best = (p.time[same_wave], Queue::SameWave);
        }
        let (parent, child_index) = match best.1 {
            Queue::FirstChild => {
                first_child += 1;
                (first_child as u32 - 1, 1)
            }
            Queue::NewWave => {
                new_wave += 1;
                (p.parent[new_wave - 1], p.child_index[new_wave - 1] + 1)
            }
            Queue::SameWave => {
                same_wave += 1;
                (p.parent[same_wave - 1], p.child_index[same_wave - 1] + 1)
            }
        };
        p.time.push(best.0);
        p.parent.push(parent);
        p.child_index.push(child_index);
    }
    p
}

/// Phase 2: the positions before the frontier, plus the first `n - m0` frontier positions in
/// depth-first order, numbered in preorder.
fn layout_with_frontier(
    placed: &Placed,
    m0: usize,
    n: usize,
    frontier_time: u64,
    model: &LaunchModel,
) -> Tree {
    // Children of each early position, in launch order (placement order is launch order
    // among siblings), as compressed lists.
    let mut first = vec![0u32; m0 + 1];
    for &parent in &placed.parent[1..m0] {
        first[parent as usize + 1] += 1;
    }
    for v in 0..m0 {
        first[v + 1] += first[v];
    }
    let mut fill = first.clone();
    let mut kids = vec![0u32; m0 - 1];
    for v in 1..m0 {
        let parent = placed.parent[v] as usize;
        kids[fill[parent] as usize] = v as u32;
        fill[parent] += 1;
    }

    let mut sizes = vec![0u32; n];
    let mut frontier_left = n - m0;
    let mut next_out = 1usize;
    // (early position, next child slot, its preorder number)
    let mut stack: Vec<(u32, u32, usize)> = vec![(0, first[0], 0)];
    while let Some(top) = stack.last_mut() {
        let (v, slot, out) = (top.0 as usize, top.1, top.2);
        if slot < first[v + 1] {
            top.1 += 1;
            stack.push((
                kids[slot as usize],
                first[kids[slot as usize] as usize],
                next_out,
            ));
            next_out += 1;
            continue;
        }
        // Every early child of v is laid out; its frontier children come next in launch order.
        let mut child_index = (first[v + 1] - first[v]) as usize + 1;
        while frontier_left > 0
            && placed.time[v] + model.child_offset_ns(child_index) == frontier_time
        {
            sizes[next_out] = 1;
            next_out += 1;
            frontier_left -= 1;
            child_index += 1;
        }
        sizes[out] = (next_out - out) as u32;
        stack.pop();
    }
    debug_assert_eq!(next_out, n, "the frontier holds the missing positions");
    Tree::from_subtree_sizes(sizes).expect("the greedy layout is a preorder layout")
}

/// The paper's Figure 3: a heap of free positions, O(n log n). Kept as the reference the
/// linear builder is tested and benchmarked against; both give the optimal launch time, but
/// ties may be broken differently.
pub fn greedy_with_heap(n: usize, model: &LaunchModel) -> Tree {
    if n == 0 {
        return Tree::empty();
    }
    let mut parents = Vec::with_capacity(n);
    let mut times = Vec::with_capacity(n);
    parents.push(NO_PARENT);
    times.push(0u64);
    // (time, order of insertion, parent, 1-based child index); insertion order makes the
    // result deterministic.
    let mut heap = BinaryHeap::new();
    let mut pushed = 0u64;
    heap.push(Reverse((model.rem_ns(), pushed, 0u32, 1usize)));
    while parents.len() < n {
        let Reverse((time, _, parent, index)) = heap.pop().expect("always a free position");
        let v = parents.len() as u32;
        parents.push(parent);
        times.push(time);
        let parent_time = times[parent as usize];
        pushed += 1;
        heap.push(Reverse((
            parent_time + model.child_offset_ns(index + 1),
            pushed,
            parent,
            index + 1,
        )));
        pushed += 1;
        heap.push(Reverse((time + model.rem_ns(), pushed, v, 1)));
    }
    Tree::from_launch_order_parents(&parents)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(n: usize, seq: f64, rem: f64, c: u32) -> Vec<u32> {
        let m = LaunchModel::new(seq, rem)
            .unwrap()
            .with_concurrency(c)
            .unwrap();
        greedy(n, &m).subtree_sizes().to_vec()
    }

    #[test]
    fn small_trees_by_hand() {
        // SEQ 1, REM 2: root launches at 2, 3, 4, …; a child launches its first at +2.
        // n=4: root children at 2 and 3, first child's child at 4 ties the root's third (4):
        // the frontier at 4 is taken depth-first, so the grandchild wins.
        assert_eq!(sizes(1, 1.0, 2.0, 1), [1]);
        assert_eq!(sizes(2, 1.0, 2.0, 1), [2, 1]);
        assert_eq!(sizes(3, 1.0, 2.0, 1), [3, 1, 1]);
        assert_eq!(sizes(4, 1.0, 2.0, 1), [4, 2, 1, 1]);
        assert_eq!(sizes(5, 1.0, 2.0, 1), [5, 2, 1, 1, 1]);
        // SEQ 0: everything hangs off the root (the flat tree is optimal).
        assert_eq!(sizes(4, 0.0, 1.0, 1), [4, 1, 1, 1]);
        // Concurrency 2 behaves like SEQ 0 for the first two children.
        assert_eq!(sizes(3, 1.0, 2.0, 2), [3, 1, 1]);
    }

    #[test]
    fn heap_and_linear_agree_on_launch_time() {
        let m = LaunchModel::new(0.007, 0.172).unwrap();
        for n in [1, 2, 3, 10, 100, 1000, 4097] {
            let a = greedy(n, &m).launch_time(&m);
            let b = greedy_with_heap(n, &m).launch_time(&m);
            assert!((a - b).abs() < 1e-9, "n={n}: {a} vs {b}");
        }
    }
}
