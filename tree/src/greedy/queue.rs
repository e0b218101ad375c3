//! The canonical greedy tree built position by position from three time-ordered queues: O(n)
//! but ~15× slower than the budget layout of [`super::greedy`]. It serves trees whose fan-out
//! is capped (Slurm's TreeWidth), where the budget recurrence does not apply, and is the test
//! oracle the fast builder must match exactly.
//!
//! Positions become free in non-decreasing launch-time order, so no heap is needed. Every
//! placed position at time `t` frees its first child at `t + REM`, and its next sibling at
//! `t + SEQ` (or at `t` when the parent still has a launch slot free in the same wave), unless
//! the parent has reached its fan-out cap. Each of those three kinds of freed positions is
//! produced in placement order, hence in non-decreasing time, so the smallest free position is
//! the smallest of three queue heads, and the queues are cursors into the placement list.

use crate::{LaunchModel, Tree};

const NO_PARENT: u32 = u32::MAX;

/// The canonical greedy tree of `n` ≥ 2 positions under `model`, fan-out cap included.
pub(super) fn canonical(n: usize, model: &LaunchModel) -> Tree {
    let placed = place_in_time_order(n, model);
    let frontier_time = placed.time[n - 1];
    let m0 = placed.time.partition_point(|&t| t < frontier_time);
    layout_with_frontier(&placed, m0, n, frontier_time, model)
}

/// Positions in the order the greedy algorithm fills them.
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
    let cap = model.max_fanout().unwrap_or(u32::MAX);
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
        // A position whose index is the cap has no next sibling.
        while new_wave < len
            && (!p.child_index[new_wave].is_multiple_of(c) || p.child_index[new_wave] >= cap)
        {
            new_wave += 1;
        }
        while same_wave < len
            && (p.child_index[same_wave].is_multiple_of(c) || p.child_index[same_wave] >= cap)
        {
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
        let cap = model.max_fanout().map_or(usize::MAX, |k| k as usize);
        while frontier_left > 0
            && child_index <= cap
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
    Tree::from_valid_sizes(sizes)
}
