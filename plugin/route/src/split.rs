//! The split itself, sans-I/O: how many hosts a sender has to reach, the model and TreeWidth
//! in; the contiguous sub-lists it contacts out.
//!
//! Slurm's forwarding (src/common/forward.c@slurm-22-05-8-1) sorts the host list, asks the
//! route plugin to split it, contacts the head of each sub-list directly and hands it the rest
//! of its sub-list to forward in turn. So the sender is the root of a launch tree over
//! `[sender, hosts…]` and each sub-list is one child's subtree in depth-first preorder: the
//! greedy split is [`greedy_tree::Tree::child_ranges`] of the greedy tree of `n + 1` positions,
//! shifted past the sender. Every subtree of the greedy tree is the greedy tree of its size, so
//! a head that re-splits its own forward list (n' hosts, tree of n' + 1) reproduces exactly its
//! part of the sender's plan: all nodes build one global tree without exchanging anything.
//!
//! TreeWidth rule: no sender or forwarder contacts more than `tree_width` hosts. When the greedy
//! tree wants a wider fan-out, the tree is the greedy tree with fan-out capped at
//! `tree_width` ([`LaunchModel::with_max_fanout`]): the fastest such tree under the model, and
//! still subtree-consistent, so the levels agree.
//!
//! When anything is off (a model Slurm's numbers cannot express, too many hosts, a split that
//! would not be a partition), [`split`] returns Slurm's own TreeWidth split ([`kary_ranges`],
//! what route/default does) with the reason, so the message still reaches every host.

use greedy_tree::LaunchModel;
use greedy_tree::treewidth::{self, SplitRule};
use std::ops::Range;
use thiserror::Error;

/// Largest host list the greedy split accepts; past it, the TreeWidth split is used. The tree
/// crate numbers positions in 32 bits; no Slurm cluster comes near 10 million nodes, so a
/// larger list means a corrupt count rather than a real cluster.
pub const MAX_HOSTS: usize = 10_000_000;

/// Which rule produced a split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// The greedy tree (capped at TreeWidth).
    Greedy,
    /// Slurm's TreeWidth split (route/default), the fallback.
    TreeWidth,
}

/// A split of `0..n`: contiguous, non-empty, in order; each range's first index is a host the
/// sender contacts, the rest of the range is that host's forward list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// The sub-lists, as index ranges into the sorted host list.
    pub ranges: Vec<Range<usize>>,
    /// Which rule made them.
    pub shape: Shape,
}

/// Why the greedy split was not used.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SplitError {
    /// The model from greedy.conf is not valid (the tree crate's reason).
    #[error("model: {0}")]
    Model(#[from] greedy_tree::Error),
    /// More hosts than [`MAX_HOSTS`].
    #[error("{n} hosts: more than the {MAX_HOSTS} the greedy split accepts")]
    TooManyHosts {
        /// Hosts in the list.
        n: usize,
    },
    /// The computed split is not a partition of the host list into at most TreeWidth
    /// non-empty sub-lists (a bug; never sent to Slurm).
    #[error("{n} hosts, TreeWidth {tree_width}: split {ranges:?} is not a partition: {reason}")]
    NotAPartition {
        /// Hosts in the list.
        n: usize,
        /// The TreeWidth in force.
        tree_width: u16,
        /// The rejected split.
        ranges: Vec<Range<usize>>,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// The greedy split of `n` sorted hosts under `model`, at most `tree_width` sub-lists
/// (0 = no cap). Falls back to [`kary_ranges`] and says why when the greedy split cannot be
/// used.
pub fn split(
    n: usize,
    model: Result<LaunchModel, SplitError>,
    tree_width: u16,
) -> (Split, Option<SplitError>) {
    match model.and_then(|m| greedy_ranges(n, &m, tree_width)) {
        Ok(ranges) => (
            Split {
                ranges,
                shape: Shape::Greedy,
            },
            None,
        ),
        Err(reason) => (
            Split {
                ranges: kary_ranges(n, tree_width),
                shape: Shape::TreeWidth,
            },
            Some(reason),
        ),
    }
}

/// The greedy split, checked to be a partition of `0..n` into at most `tree_width` sub-lists.
pub fn greedy_ranges(
    n: usize,
    model: &LaunchModel,
    tree_width: u16,
) -> Result<Vec<Range<usize>>, SplitError> {
    greedy_plan(n, model, tree_width).map(|(ranges, _)| ranges)
}

/// [`greedy_ranges`] and the depth of the tree below the sender (its levels of forwarding:
/// 1 when the sender contacts every host itself), what a topology plugin's split returns.
pub fn greedy_plan(
    n: usize,
    model: &LaunchModel,
    tree_width: u16,
) -> Result<(Vec<Range<usize>>, u32), SplitError> {
    if n > MAX_HOSTS {
        return Err(SplitError::TooManyHosts { n });
    }
    if n == 0 {
        return Ok((Vec::new(), 0));
    }
    let model = if tree_width > 0 {
        model.with_max_fanout(u32::from(tree_width))?
    } else {
        *model
    };
    // Position 0 is the sender, which is not in the list.
    let tree = greedy_tree::greedy(n + 1, &model);
    let ranges: Vec<_> = tree
        .child_ranges(0..n + 1)
        .into_iter()
        .map(|r| r.start - 1..r.end - 1)
        .collect();
    check_partition(&ranges, n, tree_width)?;
    let depth = tree.depths().into_iter().max().unwrap_or(0);
    Ok((ranges, depth))
}

/// Slurm 22.05's own TreeWidth split, what route/default does: greedy-tree's
/// [`treewidth::split`] under [`SplitRule::Rounds`]. `tree_width` 0 contacts every host directly.
pub fn kary_ranges(n: usize, tree_width: u16) -> Vec<Range<usize>> {
    treewidth::split(SplitRule::Rounds, n, tree_width)
}

/// Checks that `ranges` are contiguous, non-empty, in order, cover `0..n`, and are at most
/// `tree_width` (when non-zero).
pub fn check_partition(
    ranges: &[Range<usize>],
    n: usize,
    tree_width: u16,
) -> Result<(), SplitError> {
    let refuse = |reason| SplitError::NotAPartition {
        n,
        tree_width,
        ranges: ranges.to_vec(),
        reason,
    };
    let mut next = 0;
    for r in ranges {
        if r.start != next {
            return Err(refuse("gap or overlap"));
        }
        if r.is_empty() {
            return Err(refuse("empty sub-list"));
        }
        next = r.end;
    }
    if next != n {
        return Err(refuse("does not cover the list"));
    }
    if tree_width > 0 && ranges.len() > usize::from(tree_width) {
        return Err(refuse("more sub-lists than TreeWidth"));
    }
    Ok(())
}

/// One log line for a split, parsed by tests/slurm/route.sh: the sender's list and, per
/// sub-list, its head and how many hosts the head forwards to.
///
/// `route/greedy: split 16 hosts n1..n16 tree_width 50 greedy into 3: n1+0 n2+2 n5+11`
/// (`plugin` is the first word: route/greedy or topology/greedy).
pub fn render<S: AsRef<str>>(plugin: &str, hosts: &[S], tree_width: u16, split: &Split) -> String {
    use std::fmt::Write;
    let (first, last) = match (hosts.first(), hosts.last()) {
        (Some(f), Some(l)) => (f.as_ref(), l.as_ref()),
        _ => ("", ""),
    };
    let shape = match split.shape {
        Shape::Greedy => "greedy",
        Shape::TreeWidth => "treewidth",
    };
    let mut line = format!(
        "{plugin}: split {} hosts {first}..{last} tree_width {tree_width} {shape} into {}:",
        hosts.len(),
        split.ranges.len()
    );
    for r in &split.ranges {
        let head = hosts.get(r.start).map_or("?", |h| h.as_ref());
        let _ = write!(line, " {head}+{}", r.len().saturating_sub(1));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use greedy_tree::Tree;

    fn model(seq: f64, rem: f64) -> LaunchModel {
        LaunchModel::new(seq, rem).unwrap()
    }

    /// Parents of hosts 1..=n (0 = sender) when every level re-splits its own forward list, as
    /// slurmd does.
    fn forwarded_parents(
        n: usize,
        split_fn: &dyn Fn(usize) -> Vec<Range<usize>>,
    ) -> Vec<Option<usize>> {
        let mut parent = vec![None; n + 1];
        // (sender position, first host position of its list, list length)
        let mut work = vec![(0usize, 1usize, n)];
        while let Some((sender, first, len)) = work.pop() {
            let ranges = split_fn(len);
            check_partition(&ranges, len, 0).unwrap();
            for r in ranges {
                let head = first + r.start;
                parent[head] = Some(sender);
                if r.len() > 1 {
                    work.push((head, head + 1, r.len() - 1));
                }
            }
        }
        parent
    }

    fn parents(tree: &Tree) -> Vec<Option<usize>> {
        (0..tree.len()).map(|v| tree.parent(v)).collect()
    }

    #[test]
    fn every_level_resplitting_reproduces_the_global_greedy_tree() {
        let models = [
            model(0.015, 0.227),
            model(0.001, 0.040),
            model(0.010, 0.030),
            model(0.002, 0.002),
            model(0.050, 0.010),
            model(0.0, 0.1),
            model(0.003, 0.05).with_concurrency(3).unwrap(),
        ];
        for m in models {
            for tree_width in [0u16, 1, 2, 3, 4, 16, 50] {
                let capped = if tree_width > 0 {
                    m.with_max_fanout(u32::from(tree_width)).unwrap()
                } else {
                    m
                };
                for n in (0..=200).chain([255, 256, 257, 511, 1000, 1023]) {
                    let got =
                        forwarded_parents(n, &|len| greedy_ranges(len, &m, tree_width).unwrap());
                    let want = parents(&greedy_tree::greedy(n + 1, &capped));
                    assert_eq!(got, want, "n {n} tree_width {tree_width} model {m:?}");
                }
            }
        }
    }

    #[test]
    fn greedy_respects_treewidth() {
        let m = model(0.001, 0.2);
        for w in [1u16, 2, 4, 16] {
            for n in 1..=300 {
                let r = greedy_ranges(n, &m, w).unwrap();
                assert!(r.len() <= usize::from(w), "n {n} w {w}: {r:?}");
            }
        }
    }

    #[test]
    fn falls_back_to_treewidth_with_the_reason() {
        let bad = LaunchModel::new(0.01, -1.0).map_err(SplitError::from);
        let (s, why) = split(16, bad, 4);
        assert_eq!(s.shape, Shape::TreeWidth);
        assert_eq!(s.ranges, kary_ranges(16, 4));
        assert!(why.unwrap().to_string().contains("rem"));
        let (s, why) = split(MAX_HOSTS + 1, Ok(model(0.01, 0.1)), 50);
        assert_eq!((s.shape, s.ranges.len()), (Shape::TreeWidth, 50));
        assert!(matches!(why, Some(SplitError::TooManyHosts { .. })));
    }

    #[test]
    fn check_partition_names_the_fault() {
        let why = |r: &[Range<usize>], n, w| check_partition(r, n, w).unwrap_err().to_string();
        assert!(why(&[0..2, 1..3], 3, 0).contains("overlap"));
        assert!(why(&[0..1, 1..1, 1..3], 3, 0).contains("empty"));
        assert!(why(&[0..1, 1..2], 3, 0).contains("cover"));
        assert!(why(&[0..1, 1..2, 2..3], 3, 2).contains("TreeWidth"));
    }

    #[test]
    fn render_names_heads_and_forward_counts() {
        let hosts: Vec<String> = (1..=6).map(|i| format!("n{i}")).collect();
        let s = Split {
            ranges: vec![0..1, 1..3, 3..6],
            shape: Shape::Greedy,
        };
        assert_eq!(
            render("route/greedy", &hosts, 50, &s),
            "route/greedy: split 6 hosts n1..n6 tree_width 50 greedy into 3: n1+0 n2+1 n4+2"
        );
    }
}
