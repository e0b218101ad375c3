//! The greedy tree: each next host goes to the free position with the smallest launch time,
//! which is optimal under the model (Goehner et al., Theorem 1). Built in O(n).
//!
//! Ties are broken so that the tree is *canonical*: every position that launches before the
//! tree's launch time `T` is used, and the positions launching at exactly `T` that are still
//! needed are taken in depth-first order. That rule makes every subtree the greedy tree of its
//! own size, so a forwarder that recomputes the tree for its own slice of the host list gets
//! exactly the shape the root planned (see [`crate::Tree::child_ranges`]).
//!
//! The paper places positions one by one from a heap, O(n log n). Two facts make it cheaper:
//! - Launch times are sums `a·SEQ + b·REM`, and the number of positions up at each such time
//!   follows a recurrence over the earlier ones (a child's first wave starts REM after it, a
//!   parent's next wave SEQ after the previous one). So `T` comes from a table of the distinct
//!   times up to `T`, produced in ascending order by two cursors ([`TimeTable`]): far fewer
//!   entries than positions.
//! - A subtree that holds every position up to a time budget is fixed by that budget alone, so
//!   the second subtree of a budget is a copy of the first one's preorder sizes ([`Layout`]).
//!   Only the one root-to-frontier path that takes part of its frontier differs.
//!
//! What remains is writing the n subtree sizes, mostly by `memcpy`. A fan-out cap breaks the
//! recurrence, so capped trees come from the simpler queue builder ([`queue`]), also O(n).
//!
//! The layout tells what it lays out to a [`Sink`]: [`Sizes`] writes the tree, [`ShapeSink`]
//! only its depth, fan-out and launch time ([`shape`], for summaries of 10^7 hosts), so both
//! follow the one layout rule.

mod queue;

use crate::{LaunchModel, Shape, Tree};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

const NO_PARENT: u32 = u32::MAX;

/// The optimal (greedy) launch tree of `n` positions under `model`, in O(n) time.
///
/// ```
/// let model = greedy_tree::LaunchModel::new(0.007, 0.172).unwrap();
/// let tree = greedy_tree::greedy(1000, &model);
/// let flat = greedy_tree::Topology::Flat.build(1000, &model);
/// assert!(tree.launch_time(&model) < flat.launch_time(&model));
/// ```
///
/// # Panics
/// If `n` is `u32::MAX` or more: positions are numbered in 32 bits.
pub fn greedy(n: usize, model: &LaunchModel) -> Tree {
    assert!(n < u32::MAX as usize, "at most 2^32 - 2 positions");
    if is_capped(n, model) {
        // The budget recurrence below assumes unbounded fan-out.
        return queue::canonical(n, model);
    }
    let mut sizes = Sizes {
        sizes: Vec::with_capacity(n),
        starts: Vec::new(),
        first_of_budget: HashMap::new(),
    };
    lay_out(n, model, &mut sizes);
    debug_assert_eq!(sizes.sizes.len(), n);
    Tree::from_valid_sizes(sizes.sizes)
}

/// `greedy(n, model).shape(model)`, equal to the last bit, without laying out the positions:
/// the same layout, told to a [`ShapeSink`] that visits each subtree with children (copies
/// included) and each run of leaf siblings once. Leaves are most positions (about REM/SEQ per
/// parent), so 10^7 positions take ~40 ms and no per-position memory (docs/benchmarks.md).
///
/// Depth and fan-out of a budget's subtree could be remembered per budget, but its launch
/// time could not: `f64` sums along a path round differently from different starting times,
/// and the shape must be the walk's to the bit. A capped model is built and walked.
pub(crate) fn shape(n: usize, model: &LaunchModel) -> Shape {
    assert!(n < u32::MAX as usize, "at most 2^32 - 2 positions");
    if is_capped(n, model) {
        return queue::canonical(n, model).shape(model);
    }
    let mut sink = ShapeSink {
        model,
        path: Vec::new(),
        shape: Shape {
            depth: 0,
            max_fanout: 0,
            launch_time: 0.0,
        },
    };
    lay_out(n, model, &mut sink);
    sink.shape
}

/// Whether `model`'s fan-out cap shapes the tree of `n` positions.
fn is_capped(n: usize, model: &LaunchModel) -> bool {
    n >= 2 && model.max_fanout().is_some_and(|k| (k as usize) < n - 1)
}

/// Tells `sink` the canonical greedy tree of `n` positions (fan-out unbounded) in preorder.
fn lay_out(n: usize, model: &LaunchModel, sink: &mut impl Sink) {
    if n == 0 {
        return;
    }
    if n == 1 || model.seq_ns() == 0 {
        // With SEQ 0 a parent launches any number of children at once: the flat tree is
        // optimal.
        sink.open(0);
        sink.leaves(1, n - 1);
        sink.close(None);
        return;
    }
    let times = TimeTable::up_to(n as u64, model);
    let frontier_time = times.last();
    let frontier_positions = n as u64 - times.through(frontier_time - 1);
    let mut layout = Layout {
        model,
        times: &times,
        sink,
    };
    layout.lay_out(frontier_time, frontier_positions);
}

/// What a layout produces, told in preorder: a tree's subtree sizes ([`Sizes`]) or only its
/// shape ([`ShapeSink`]). Child indices are 1-based, 0 for the root.
trait Sink {
    /// A subtree with children or a frontier to fill opens as child `child_index` of the
    /// innermost open one.
    fn open(&mut self, child_index: usize);
    /// The innermost open subtree is complete; `Some(budget)` when it holds every position up
    /// to `budget` after its root.
    fn close(&mut self, budget: Option<u64>);
    /// Leaf children `first..first + count` of the innermost open subtree.
    fn leaves(&mut self, first: usize, count: usize);
    /// Child `child_index` holds every position up to `budget` after it: whether the sink
    /// wrote it at once (a copy of an earlier one); if not, the layout opens and fills it.
    fn complete(&mut self, child_index: usize, budget: u64) -> bool;
}

/// The subtree sizes of a [`Tree`].
struct Sizes {
    sizes: Vec<u32>,
    /// Where each open subtree starts in `sizes`, innermost last.
    starts: Vec<usize>,
    /// Where the first complete subtree of each budget was laid out: later ones are copies.
    first_of_budget: HashMap<u64, (usize, usize)>,
}

impl Sink for Sizes {
    fn open(&mut self, _: usize) {
        self.starts.push(self.sizes.len());
        self.sizes.push(0);
    }

    fn close(&mut self, budget: Option<u64>) {
        let start = self.starts.pop().expect("a subtree to close");
        let len = self.sizes.len() - start;
        self.sizes[start] = len as u32;
        if let Some(budget) = budget {
            self.first_of_budget.insert(budget, (start, len));
        }
    }

    fn leaves(&mut self, _: usize, count: usize) {
        self.sizes.resize(self.sizes.len() + count, 1);
    }

    fn complete(&mut self, _: usize, budget: u64) -> bool {
        match self.first_of_budget.get(&budget) {
            Some(&(start, len)) => {
                self.sizes.extend_from_within(start..start + len);
                true
            }
            None => false,
        }
    }
}

/// A tree's [`Shape`], computed as [`Tree::shape`] computes it: each position's launch time is
/// its parent's plus [`LaunchModel::child_offset`], in `f64`.
struct ShapeSink<'a> {
    model: &'a LaunchModel,
    /// Launch times of the open subtrees' roots, the root first.
    path: Vec<f64>,
    shape: Shape,
}

impl ShapeSink<'_> {
    /// Counts a position at `depth`, `child_index` of its parent, launched at `time`.
    fn visit(&mut self, depth: usize, child_index: usize, time: f64) {
        self.shape.depth = self.shape.depth.max(depth as u32);
        self.shape.max_fanout = self.shape.max_fanout.max(child_index);
        self.shape.launch_time = self.shape.launch_time.max(time);
    }
}

impl Sink for ShapeSink<'_> {
    fn open(&mut self, child_index: usize) {
        let time = match self.path.last() {
            None => 0.0,
            Some(parent) => parent + self.model.child_offset(child_index),
        };
        self.visit(self.path.len(), child_index, time);
        self.path.push(time);
    }

    fn close(&mut self, _: Option<u64>) {
        self.path.pop();
    }

    fn leaves(&mut self, first: usize, count: usize) {
        if count == 0 {
            return;
        }
        // Offsets grow with the child index and f64 addition is monotone: the last leaf of
        // the run is its latest, as the walk would find.
        let last = first + count - 1;
        let parent = *self.path.last().expect("leaves have a parent");
        let time = parent + self.model.child_offset(last);
        self.visit(self.path.len(), last, time);
    }

    fn complete(&mut self, _: usize, _: u64) -> bool {
        false
    }
}

/// The distinct launch times of the unbounded greedy tree, ascending, up to the first time by
/// which `n` positions are up, with how many positions are up by each.
struct TimeTable {
    time: Vec<u64>,
    /// Positions launched at or before `time[k]`.
    through: Vec<u64>,
}

impl TimeTable {
    /// Needs `seq > 0`. Launches come in waves of `concurrency` children of one parent, all at
    /// one time. Waves starting at `t` = first waves of the positions up at `t - REM` + next
    /// waves after those that started at `t - SEQ`; positions up at `t` = waves × concurrency.
    fn up_to(n: u64, model: &LaunchModel) -> TimeTable {
        let (seq, rem) = (model.seq_ns(), model.rem_ns());
        let concurrency = u64::from(model.concurrency());
        let mut table = TimeTable {
            time: vec![0],
            through: vec![1],
        };
        // Per time: waves starting then, and positions up then (the root at 0).
        let (mut waves, mut up) = (vec![0u64], vec![1u64]);
        // Next time whose REM successor, and whose SEQ successor, is not in the table yet.
        // Only times with waves have SEQ successors: every time but 0.
        let (mut by_rem, mut by_seq) = (0usize, 1usize);
        while table.through[table.through.len() - 1] < n {
            let after_rem = table.time[by_rem] + rem;
            let after_seq = table.time.get(by_seq).map(|t| t + seq);
            let t = after_seq.map_or(after_rem, |s| s.min(after_rem));
            let mut starting = 0;
            if after_rem == t {
                starting += up[by_rem];
                by_rem += 1;
            }
            if after_seq == Some(t) {
                starting += waves[by_seq];
                by_seq += 1;
            }
            let launched = starting * concurrency;
            table.time.push(t);
            table
                .through
                .push(table.through[table.through.len() - 1] + launched);
            waves.push(starting);
            up.push(launched);
        }
        table
    }

    /// The launch time by which `n` positions are up: the tree's launch time.
    fn last(&self) -> u64 {
        self.time[self.time.len() - 1]
    }

    /// Positions of a subtree launched at most `budget` after its root (`budget` ≤ `last`).
    fn through(&self, budget: u64) -> u64 {
        match self.time.partition_point(|&t| t <= budget) {
            0 => 0,
            k => self.through[k - 1],
        }
    }
}

/// A subtree being laid out: its budget and which children are still due.
#[derive(Clone, Copy)]
struct Frame {
    /// Time from this root's launch to the tree's launch time.
    budget: u64,
    /// 1-based index of the next child to lay out.
    next_child: usize,
    /// `None`: every position up to `budget` belongs to the subtree. `Some(q)`: every position
    /// before `budget` does, and only the first `q` (depth-first) of those at exactly `budget`.
    frontier_left: Option<u64>,
}

/// Tells a [`Sink`] the canonical greedy tree in preorder.
struct Layout<'a, S> {
    model: &'a LaunchModel,
    times: &'a TimeTable,
    sink: &'a mut S,
}

impl<S: Sink> Layout<'_, S> {
    /// Lays out the root with `frontier_positions` of the positions up at exactly `budget`.
    /// An explicit stack, because greedy trees with SEQ ≫ REM are nearly chains.
    fn lay_out(&mut self, budget: u64, frontier_positions: u64) {
        let mut stack = Vec::new();
        self.open(&mut stack, 0, budget, Some(frontier_positions));
        while let Some(&f) = stack.last() {
            let top = stack.len() - 1;
            let offset = self.model.child_offset_ns(f.next_child);
            match f.frontier_left {
                None if offset > f.budget => self.close(&mut stack),
                None if f.budget - offset < self.model.rem_ns() => {
                    // This child and every later one in budget are leaves.
                    let leaves = self.children_within(f.budget) - (f.next_child - 1);
                    self.sink.leaves(f.next_child, leaves);
                    self.close(&mut stack);
                }
                None => {
                    stack[top].next_child += 1;
                    self.open(&mut stack, f.next_child, f.budget - offset, None);
                }
                Some(q) if offset > f.budget || (offset == f.budget && q == 0) => {
                    self.close(&mut stack)
                }
                Some(_) if offset < f.budget && f.budget - offset < self.model.rem_ns() => {
                    // Leaves up to the frontier children (near-flat trees have millions).
                    let leaves = self.children_within(f.budget - 1) - (f.next_child - 1);
                    stack[top].next_child += leaves;
                    self.sink.leaves(f.next_child, leaves);
                }
                Some(q) if offset == f.budget => {
                    stack[top].next_child += 1;
                    stack[top].frontier_left = Some(q - 1);
                    self.sink.leaves(f.next_child, 1);
                }
                Some(q) => {
                    stack[top].next_child += 1;
                    let budget = f.budget - offset;
                    let at_frontier = self.times.through(budget) - self.times.through(budget - 1);
                    if q >= at_frontier {
                        stack[top].frontier_left = Some(q - at_frontier);
                        self.open(&mut stack, f.next_child, budget, None);
                    } else if q == 0 {
                        self.open(&mut stack, f.next_child, budget - 1, None);
                    } else {
                        stack[top].frontier_left = Some(0);
                        self.open(&mut stack, f.next_child, budget, Some(q));
                    }
                }
            }
        }
    }

    /// Starts subtree `child_index` of the innermost open one (0: the root): a leaf or a copy
    /// at once, otherwise a frame to fill.
    fn open(
        &mut self,
        stack: &mut Vec<Frame>,
        child_index: usize,
        budget: u64,
        frontier_left: Option<u64>,
    ) {
        if frontier_left.is_none() {
            if budget < self.model.rem_ns() {
                self.sink.leaves(child_index, 1);
                return;
            }
            if self.sink.complete(child_index, budget) {
                return;
            }
        }
        stack.push(Frame {
            budget,
            next_child: 1,
            frontier_left,
        });
        self.sink.open(child_index);
    }

    fn close(&mut self, stack: &mut Vec<Frame>) {
        let f = stack.pop().expect("a frame to close");
        self.sink
            .close(f.frontier_left.is_none().then_some(f.budget));
    }

    /// Children a parent launches within `budget` of its own launch (SEQ > 0).
    fn children_within(&self, budget: u64) -> usize {
        let (seq, rem) = (self.model.seq_ns(), self.model.rem_ns());
        if budget < rem {
            return 0;
        }
        ((budget - rem) / seq + 1) as usize * self.model.concurrency() as usize
    }
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
        if model.max_fanout().is_none_or(|k| index < k as usize) {
            pushed += 1;
            heap.push(Reverse((
                parent_time + model.child_offset_ns(index + 1),
                pushed,
                parent,
                index + 1,
            )));
        }
        pushed += 1;
        heap.push(Reverse((time + model.rem_ns(), pushed, v, 1)));
    }
    Tree::from_launch_order_parents(&parents)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_trees_as_the_queue_builder() {
        for (seq, rem, c) in [
            (0.007, 0.172, 1),
            (1.0, 2.0, 1),
            (1.0, 3.0, 2),
            (5.0, 1.0, 1),
            (0.001, 1.0, 1),
            (0.3, 0.1, 3),
            (0.1, 0.3, 1),
        ] {
            let m = LaunchModel::new(seq, rem)
                .unwrap()
                .with_concurrency(c)
                .unwrap();
            for n in (2..300).chain([1000, 4097, 20_000]) {
                assert_eq!(greedy(n, &m), queue::canonical(n, &m), "n={n} {m:?}");
            }
        }
    }

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
