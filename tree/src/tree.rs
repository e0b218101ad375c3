//! The launch tree: positions numbered in depth-first preorder, so every subtree owns a
//! contiguous range of the host list.

use crate::{Error, LaunchModel};
use std::ops::Range;
use std::sync::OnceLock;

/// A launch tree over `len()` positions. Position 0 is the root; positions are numbered in
/// depth-first preorder with children visited in launch order, so host `i` of the input list
/// runs at position `i` and the subtree of position `v` is `v..v + subtree_len(v)`.
#[derive(Debug, Clone)]
pub struct Tree {
    /// Subtree size of each position; with preorder numbering this alone fixes the shape.
    sizes: Vec<u32>,
    /// Parent of each position (`u32::MAX` for the root), derived from `sizes` on first use:
    /// building stays one pass over memory, and forwarders never need it.
    parents: OnceLock<Vec<u32>>,
}

/// What a summary of a tree says: [`Tree::shape`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Largest depth (the root has depth 0).
    pub depth: u32,
    /// Largest number of children of any position.
    pub max_fanout: usize,
    /// Launch time of the whole tree, seconds (equation 2).
    pub launch_time: f64,
}

/// One position of a tree as [`Tree::positions`] yields it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Position {
    /// The position (host index) in preorder.
    pub node_idx: usize,
    /// Its parent (`None` for the root).
    pub parent: Option<usize>,
    /// 1-based launch order among its siblings (0 for the root).
    pub child_index: u32,
    /// Depth (the root has depth 0).
    pub depth: u32,
    /// Launch time under the walk's model, seconds (equation 1).
    pub launch_time: f64,
    /// One past the last position of its subtree.
    pub subtree_end: usize,
}

/// The preorder walk of [`Tree::positions`].
#[derive(Debug)]
pub struct Positions<'a> {
    sizes: &'a [u32],
    model: &'a LaunchModel,
    next: usize,
    /// The open path from the root: (position, subtree end, depth, time, children so far).
    path: Vec<(usize, usize, u32, f64, u32)>,
}

impl Iterator for Positions<'_> {
    type Item = Position;

    fn next(&mut self) -> Option<Position> {
        let v = self.next;
        let size = *self.sizes.get(v)? as usize;
        self.next += 1;
        while self.path.last().is_some_and(|o| o.1 <= v) {
            self.path.pop();
        }
        let (parent, child_index, depth, time) = match self.path.last_mut() {
            None => (None, 0, 0, 0.0),
            Some(open) => {
                open.4 += 1;
                let time = open.3 + self.model.child_offset(open.4 as usize);
                (Some(open.0), open.4, open.2 + 1, time)
            }
        };
        self.path.push((v, v + size, depth, time, 0));
        Some(Position {
            node_idx: v,
            parent,
            child_index,
            depth,
            launch_time: time,
            subtree_end: v + size,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.sizes.len() - self.next;
        (left, Some(left))
    }
}

impl PartialEq for Tree {
    fn eq(&self, other: &Tree) -> bool {
        self.sizes == other.sizes
    }
}

impl Eq for Tree {}

const NO_PARENT: u32 = u32::MAX;

impl Tree {
    /// The tree whose position `v` has subtree size `sizes[v]` in depth-first preorder.
    pub fn from_subtree_sizes(sizes: Vec<u32>) -> Result<Tree, Error> {
        let n = sizes.len();
        if n > (u32::MAX - 1) as usize {
            return Err(Error::Layout {
                node_idx: 0,
                reason: "more than 2^32 - 2 positions",
            });
        }
        let mut parents = vec![NO_PARENT; n];
        // Ends of the open subtrees, innermost last.
        let mut open: Vec<(u32, usize)> = Vec::new();
        for (v, &size) in sizes.iter().enumerate() {
            while open.last().is_some_and(|&(_, end)| end <= v) {
                open.pop();
            }
            let end = v + size as usize;
            let reason = if size == 0 {
                Some("size 0")
            } else if v == 0 && size as usize != n {
                Some("the root must span every position")
            } else if v > 0 && open.is_empty() {
                Some("lies outside the root's subtree")
            } else if open.last().is_some_and(|&(_, parent_end)| end > parent_end) {
                Some("extends past its parent's subtree")
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(Error::Layout {
                    node_idx: v,
                    reason,
                });
            }
            if let Some(&(parent, _)) = open.last() {
                parents[v] = parent;
            }
            open.push((v as u32, end));
        }
        Ok(Tree {
            sizes,
            parents: OnceLock::from(parents),
        })
    }

    /// A tree from sizes its builder guarantees to be a preorder layout (checked in debug
    /// builds only).
    pub(crate) fn from_valid_sizes(sizes: Vec<u32>) -> Tree {
        debug_assert!(Tree::from_subtree_sizes(sizes.clone()).is_ok());
        Tree {
            sizes,
            parents: OnceLock::new(),
        }
    }

    fn parents(&self) -> &[u32] {
        self.parents.get_or_init(|| {
            let mut parents = vec![NO_PARENT; self.len()];
            for v in 0..self.len() {
                for c in self.children(v) {
                    parents[c] = v as u32;
                }
            }
            parents
        })
    }

    /// Builds a tree from a parent array in which every position's parent comes before it
    /// and siblings appear in launch order (e.g. heap numbering, or the order positions were
    /// filled), and renumbers it in depth-first preorder.
    pub(crate) fn from_launch_order_parents(parents: &[u32]) -> Tree {
        let n = parents.len();
        if n == 0 {
            return Tree::empty();
        }
        // Children lists in compressed form: counting sort by parent keeps launch order.
        let mut first = vec![0u32; n + 1];
        for &p in &parents[1..] {
            first[p as usize + 1] += 1;
        }
        for v in 0..n {
            first[v + 1] += first[v];
        }
        let mut fill = first.clone();
        let mut kids = vec![0u32; n.saturating_sub(1)];
        for (v, &p) in parents.iter().enumerate().skip(1) {
            debug_assert!((p as usize) < v, "parents come first");
            kids[fill[p as usize] as usize] = v as u32;
            fill[p as usize] += 1;
        }
        let mut sizes = vec![0u32; n];
        let mut subtree = vec![1u32; n];
        for v in (1..n).rev() {
            subtree[parents[v] as usize] += subtree[v];
        }
        // Iterative preorder walk: (original position, next child slot).
        let mut stack = vec![(0u32, first[0])];
        let mut next_idx = 0usize;
        sizes[next_idx] = subtree[0];
        next_idx += 1;
        while let Some((v, slot)) = stack.last_mut() {
            if *slot == first[*v as usize + 1] {
                stack.pop();
                continue;
            }
            let child = kids[*slot as usize];
            *slot += 1;
            sizes[next_idx] = subtree[child as usize];
            next_idx += 1;
            stack.push((child, first[child as usize]));
        }
        Tree::from_valid_sizes(sizes)
    }

    /// The tree with no position.
    pub fn empty() -> Tree {
        Tree::from_valid_sizes(Vec::new())
    }

    /// Number of positions (the paper's n: every process, the root included).
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    /// Whether the tree has no position.
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    /// The parent of `node_idx`, `None` for the root.
    pub fn parent(&self, node_idx: usize) -> Option<usize> {
        match self.parents()[node_idx] {
            NO_PARENT => None,
            p => Some(p as usize),
        }
    }

    /// The children of `node_idx`, in launch order.
    pub fn children(&self, node_idx: usize) -> Children<'_> {
        Children {
            sizes: &self.sizes,
            next: node_idx + 1,
            end: node_idx + self.sizes[node_idx] as usize,
        }
    }

    /// Number of positions in the subtree of `node_idx`, itself included.
    pub fn subtree_len(&self, node_idx: usize) -> usize {
        self.sizes[node_idx] as usize
    }

    /// The positions (= host list indices) of the subtree rooted at `node_idx`.
    pub fn subtree_range(&self, node_idx: usize) -> Range<usize> {
        node_idx..node_idx + self.sizes[node_idx] as usize
    }

    /// The subtree sizes in preorder, the tree's whole description.
    pub fn subtree_sizes(&self) -> &[u32] {
        &self.sizes
    }

    /// 1-based launch order of each position among its siblings (0 for the root).
    pub fn child_indices(&self) -> Vec<u32> {
        let mut index = vec![0u32; self.len()];
        for v in 0..self.len() {
            for (i, c) in self.children(v).enumerate() {
                index[c] = i as u32 + 1;
            }
        }
        index
    }

    /// Depth of each position (the root has depth 0).
    pub fn depths(&self) -> Vec<u32> {
        let mut depth = vec![0u32; self.len()];
        for v in 1..self.len() {
            depth[v] = depth[self.parents()[v] as usize] + 1;
        }
        depth
    }

    /// Largest number of children of any position.
    pub fn max_fanout(&self) -> usize {
        (0..self.len())
            .map(|v| self.children(v).count())
            .max()
            .unwrap_or(0)
    }

    /// Launch time of each position under `model` (equation 1), in seconds.
    pub fn launch_times(&self, model: &LaunchModel) -> Vec<f64> {
        let mut time = vec![0.0; self.len()];
        // Preorder: a parent's time is known before its children's.
        for v in 0..self.len() {
            let t = time[v];
            for (i, c) in self.children(v).enumerate() {
                time[c] = t + model.child_offset(i + 1);
            }
        }
        time
    }

    /// Launch time of the whole tree under `model` (equation 2: the latest position), seconds.
    pub fn launch_time(&self, model: &LaunchModel) -> f64 {
        self.shape(model).launch_time
    }

    /// Depth, largest fan-out and launch time, from one pass of [`Tree::positions`] (memory
    /// in the depth, not the size: a summary of 10^7 positions needs no per-position arrays).
    /// [`crate::Topology::shape`] gives the same without building the greedy tree.
    pub fn shape(&self, model: &LaunchModel) -> Shape {
        self.positions(model).fold(
            Shape {
                depth: 0,
                max_fanout: 0,
                launch_time: 0.0,
            },
            |s, p| Shape {
                depth: s.depth.max(p.depth),
                // A parent's last child carries its number of children.
                max_fanout: s.max_fanout.max(p.child_index as usize),
                launch_time: s.launch_time.max(p.launch_time),
            },
        )
    }

    /// Every position in preorder with its parent, child index, depth and launch time under
    /// `model`, computed on the way: the walk keeps only the open path, so printing a plan of
    /// any size needs no per-position arrays.
    pub fn positions<'a>(&'a self, model: &'a LaunchModel) -> Positions<'a> {
        Positions {
            sizes: &self.sizes,
            model,
            next: 0,
            path: Vec::new(),
        }
    }

    /// The children of the root of this tree laid over `range` of a host list: each child's
    /// host is the first of its range, the rest of the range is that child's subtree. This is
    /// what a forwarding node needs to pass its part of the launch on.
    pub fn child_ranges(&self, range: Range<usize>) -> Vec<Range<usize>> {
        assert_eq!(range.len(), self.len(), "range must cover the tree");
        if self.is_empty() {
            return Vec::new();
        }
        self.children(0)
            .map(|c| {
                let r = self.subtree_range(c);
                range.start + r.start..range.start + r.end
            })
            .collect()
    }
}

/// Iterator over a position's children in launch order.
#[derive(Debug, Clone)]
pub struct Children<'a> {
    sizes: &'a [u32],
    next: usize,
    end: usize,
}

impl Iterator for Children<'_> {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        if self.next >= self.end {
            return None;
        }
        let c = self.next;
        self.next += self.sizes[c] as usize;
        Some(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_layout(sizes: &[u32], parents: &[Option<usize>]) {
        let t = Tree::from_subtree_sizes(sizes.to_vec()).unwrap();
        let got: Vec<_> = (0..t.len()).map(|v| t.parent(v)).collect();
        assert_eq!(got, parents, "sizes {sizes:?}");
    }

    #[test]
    fn parents_from_sizes() {
        check_layout(&[1], &[None]);
        check_layout(&[3, 1, 1], &[None, Some(0), Some(0)]);
        check_layout(&[3, 2, 1], &[None, Some(0), Some(1)]);
        check_layout(
            &[6, 3, 1, 1, 2, 1],
            &[None, Some(0), Some(1), Some(1), Some(0), Some(4)],
        );
    }

    #[test]
    fn rejects_inconsistent_sizes() {
        for (sizes, node, reason) in [
            (vec![2, 1, 1], 0, "root"),
            (vec![3, 0, 1], 1, "size 0"),
            (vec![3, 3, 1], 1, "past its parent"),
        ] {
            let err = Tree::from_subtree_sizes(sizes.clone()).unwrap_err();
            assert!(
                matches!(&err, Error::Layout { node_idx, .. } if *node_idx == node)
                    && err.to_string().contains(reason),
                "{sizes:?}: {err}"
            );
        }
    }

    #[test]
    fn renumbers_launch_order_parents_in_preorder() {
        // Heap-numbered binary tree of 6: 0→(1,2), 1→(3,4), 2→(5).
        let t = Tree::from_launch_order_parents(&[u32::MAX, 0, 0, 1, 1, 2]);
        assert_eq!(t.subtree_sizes(), [6, 3, 1, 1, 2, 1]);
    }

    #[test]
    fn equation_1_by_hand() {
        // Root launches 1 then 4; 1 launches 2 then 3; 4 launches 5. SEQ 1, REM 10.
        let t = Tree::from_subtree_sizes(vec![6, 3, 1, 1, 2, 1]).unwrap();
        let m = LaunchModel::new(1.0, 10.0).unwrap();
        assert_eq!(t.launch_times(&m), [0.0, 10.0, 20.0, 21.0, 11.0, 21.0]);
        assert_eq!(t.launch_time(&m), 21.0);
        assert_eq!(t.child_indices(), [0, 1, 1, 2, 2, 1]);
        assert_eq!(t.depths(), [0, 1, 2, 2, 1, 2]);
        assert_eq!(t.max_fanout(), 2);
        assert_eq!(t.child_ranges(10..16), [11..14, 14..16]);
    }
}
