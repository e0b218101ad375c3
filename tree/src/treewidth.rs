//! Slurm's TreeWidth fan-out: how srun, slurmctld and slurmd split a forward list when no
//! plugin shapes it, per release, and the greedy plan where a release fixes srun's first split.
//!
//! Slurm forwards a message by splitting the sorted host list into at most TreeWidth contiguous
//! sub-lists, contacting the first host of each and handing it the rest of its sub-list, which
//! it splits the same way. So the sender is position 0 of a tree over `[sender, hosts…]` and
//! each sub-list is one child's subtree in depth-first preorder. Two rules have been used:
//! - [`SplitRule::Rounds`] (`set_span` in src/common/slurm_protocol_api.c, up to 24.05.4):
//!   heads' lists grow by TreeWidth hosts per round, head after head, and the last round hands
//!   out what is left.
//! - [`SplitRule::Levels`] (24.05.5 on; `_set_span` in src/common/hostlist.c from 25.05): whole
//!   levels of the k-ary tree are given to every branch alike while they fit, and the hosts
//!   left are shared evenly, the remainder to the first branches.
//!
//! With route/greedy (22.05) or topology/greedy (23.11 to 24.11) every split, srun's included,
//! is the plugin's. From 25.05 srun splits its first level with the plain rule and only the
//! slurmd hops ask the plugin ([`SlurmRelease::plugin_splits_srun`]), so the best plan is the
//! greedy tree below that fixed first level ([`greedy_below`]).

use crate::{Error, LaunchModel, Tree, greedy};
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

/// A Slurm release, `YY.MM` (e.g. `26.05`): what decides its fan-out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlurmRelease {
    /// The year part (`26` of 26.05).
    pub major: u16,
    /// The month part (`5` of 26.05).
    pub minor: u16,
}

/// One of Slurm's rules for sizing the sub-lists of a split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitRule {
    /// `set_span` of 22.05–24.05.4.
    Rounds,
    /// `_set_span` of 24.05.5 and later.
    Levels,
}

impl SlurmRelease {
    /// The release `major.minor`.
    pub const fn new(major: u16, minor: u16) -> SlurmRelease {
        SlurmRelease { major, minor }
    }

    /// The rule of this release's plain TreeWidth split (24.05 is taken as 24.05.5 or later).
    pub fn split_rule(self) -> SplitRule {
        if self >= SlurmRelease::new(24, 5) {
            SplitRule::Levels
        } else {
            SplitRule::Rounds
        }
    }

    /// Whether srun's own first split goes through the route/topology plugin (before 25.05).
    pub fn plugin_splits_srun(self) -> bool {
        self < SlurmRelease::new(25, 5)
    }

    /// slurm.conf's TreeWidth when it is not set: 50 until 23.02, 16 from 23.11.
    pub fn default_tree_width(self) -> u16 {
        if self >= SlurmRelease::new(23, 11) {
            16
        } else {
            50
        }
    }

    /// The tree a launch of `hosts` hosts follows at `tree_width` when every slurmd hop splits
    /// with the greedy plugin (greedy.conf's `model`), position 0 being srun.
    pub fn greedy_plan(self, hosts: usize, tree_width: u16, model: &LaunchModel) -> Tree {
        let model = capped(model, tree_width);
        if self.plugin_splits_srun() {
            greedy(hosts + 1, &model)
        } else {
            let first: Vec<usize> = split(self.split_rule(), hosts, tree_width)
                .iter()
                .map(|r| r.len())
                .collect();
            greedy_below(&first, &model)
        }
    }
}

impl fmt::Display for SlurmRelease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:02}", self.major, self.minor)
    }
}

impl FromStr for SlurmRelease {
    type Err = Error;
    fn from_str(s: &str) -> Result<SlurmRelease, Error> {
        let refuse = || Error::Release {
            name: s.to_string(),
        };
        let (major, minor) = s.split_once('.').ok_or_else(refuse)?;
        let number = |t: &str| {
            (t.len() == 2 && t.bytes().all(|b| b.is_ascii_digit()))
                .then(|| t.parse::<u16>().ok())
                .flatten()
        };
        match (number(major), number(minor)) {
            (Some(major), Some(minor @ 1..=12)) => Ok(SlurmRelease { major, minor }),
            _ => Err(refuse()),
        }
    }
}

/// The model with at most `tree_width` children a parent (0: no cap), as a split honours it.
fn capped(model: &LaunchModel, tree_width: u16) -> LaunchModel {
    match tree_width {
        0 => *model,
        // with_max_fanout only refuses 0.
        k => model.with_max_fanout(u32::from(k)).unwrap_or(*model),
    }
}

/// Slurm's split of `n` sorted hosts into at most `tree_width` contiguous sub-lists (0: every
/// host its own), each range's first host being contacted directly.
pub fn split(rule: SplitRule, n: usize, tree_width: u16) -> Vec<Range<usize>> {
    let width = usize::from(tree_width);
    if width == 0 || n <= width {
        return (0..n).map(|i| i..i + 1).collect();
    }
    let lens = match rule {
        SplitRule::Rounds => rounds(n, width),
        SplitRule::Levels => levels(n, width),
    };
    let mut start = 0;
    lens.into_iter()
        .filter(|&len| len > 0)
        .map(|len| {
            let r = start..start + len;
            start += len;
            r
        })
        .collect()
}

/// Sub-list lengths (head included) under [`SplitRule::Rounds`], for `n > width`.
fn rounds(n: usize, width: usize) -> Vec<usize> {
    // Forward-list length of each head; a head not yet given hosts still counts as unplaced.
    let mut extra = vec![0usize; width];
    let mut left = n;
    'rounds: while left > 0 {
        for (i, head) in extra.iter_mut().enumerate() {
            let head_unplaced = usize::from(*head == 0);
            if width - i >= left {
                // The rest fit as heads of their own: one per remaining slot.
                if *head != 0 {
                    *head += left;
                }
                break 'rounds;
            }
            if left <= width {
                // The last round: this head takes everything left (itself included).
                *head += left - head_unplaced;
                break 'rounds;
            }
            left -= head_unplaced;
            *head += width;
            left -= width;
        }
    }
    let mut lens = Vec::with_capacity(width);
    let mut placed = 0;
    for e in extra {
        if placed == n {
            break;
        }
        let len = (1 + e).min(n - placed);
        lens.push(len);
        placed += len;
    }
    lens
}

/// Sub-list lengths (head included) under [`SplitRule::Levels`], for `n > width`.
fn levels(n: usize, width: usize) -> Vec<usize> {
    let mut lens = vec![0usize; width];
    let mut left = n;
    // Hosts one branch gains from the next level, and the level's size over all branches.
    let (mut per_branch, mut level) = (1usize, width);
    while left > 0 {
        if level <= left {
            lens.iter_mut().for_each(|l| *l += per_branch);
            left -= level;
        } else {
            let even = left / width;
            lens.iter_mut().for_each(|l| *l += even);
            left -= even * width;
            lens.iter_mut().take(left).for_each(|l| *l += 1);
            left = 0;
        }
        per_branch = per_branch.saturating_mul(width);
        level = level.saturating_mul(width);
    }
    lens
}

/// The whole forwarding tree over `[sender, hosts…]` when every hop splits with `rule`.
pub fn tree(rule: SplitRule, hosts: usize, tree_width: u16) -> Tree {
    let mut sizes = vec![0u32; hosts + 1];
    // (position, forward-list length); a position's subtree is itself plus its list.
    let mut work = vec![(0usize, hosts)];
    while let Some((pos, list)) = work.pop() {
        sizes[pos] = (list + 1) as u32;
        for r in split(rule, list, tree_width) {
            work.push((pos + 1 + r.start, r.len() - 1));
        }
    }
    Tree::from_valid_sizes(sizes)
}

/// The greedy tree under a fixed first level: the root's children own subtrees of `first`
/// sizes, in that order, and each of them is the greedy tree of its size under `model` (the
/// best a forwarder that re-plans its own list can do).
pub fn greedy_below(first: &[usize], model: &LaunchModel) -> Tree {
    let total = 1 + first.iter().sum::<usize>();
    let mut sizes = Vec::with_capacity(total);
    sizes.push(total as u32);
    for &len in first {
        sizes.extend_from_slice(greedy(len, model).subtree_sizes());
    }
    Tree::from_valid_sizes(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lens(rule: SplitRule, n: usize, w: u16) -> Vec<usize> {
        split(rule, n, w).iter().map(|r| r.len()).collect()
    }

    #[test]
    fn rounds_match_slurm_22_05_set_span_examples() {
        // Worked by hand from set_span (slurm_protocol_api.c:2889@slurm-22-05-8-1).
        let l = |n, w| lens(SplitRule::Rounds, n, w);
        assert_eq!(l(16, 50), vec![1; 16]);
        assert_eq!(l(16, 16), vec![1; 16]);
        assert_eq!(l(16, 4), [5, 5, 5, 1]);
        assert_eq!(l(17, 4), [5, 5, 5, 2]);
        assert_eq!(l(50, 4), [13, 13, 13, 11]);
        assert_eq!(l(5, 4), [5]);
        assert_eq!(l(6, 4), [5, 1]);
        assert_eq!(l(3, 1), [3]);
        assert_eq!(l(0, 4), Vec::<usize>::new());
    }

    #[test]
    fn levels_match_slurm_26_05_set_span_examples() {
        // Worked by hand from _set_span (hostlist.c:2471@slurm-26-05-3-1).
        let l = |n, w| lens(SplitRule::Levels, n, w);
        assert_eq!(l(16, 16), vec![1; 16]);
        assert_eq!(l(16, 4), [4, 4, 4, 4]);
        assert_eq!(l(17, 4), [5, 4, 4, 4]);
        assert_eq!(
            l(20, 16),
            [2, 2, 2, 2].into_iter().chain([1; 12]).collect::<Vec<_>>()
        );
        assert_eq!(l(64, 16), vec![4; 16]);
        // 4 + 16 fill two levels of a 4-ary tree; 10 left: 2 each, 2 more to the first two.
        assert_eq!(l(30, 4), [8, 8, 7, 7]);
        assert_eq!(l(3, 1), [3]);
    }

    #[test]
    fn splits_are_partitions_within_treewidth() {
        for rule in [SplitRule::Rounds, SplitRule::Levels] {
            for w in 0..=40u16 {
                for n in 0..=300 {
                    let s = split(rule, n, w);
                    assert!(w == 0 || s.len() <= usize::from(w), "{rule:?} {n} {w}");
                    assert!(s.iter().all(|r| !r.is_empty()));
                    let mut next = 0;
                    for r in &s {
                        assert_eq!(r.start, next, "{rule:?} {n} {w}: {s:?}");
                        next = r.end;
                    }
                    assert_eq!(next, n, "{rule:?} {n} {w}: {s:?}");
                }
            }
        }
    }

    #[test]
    fn releases_parse_and_pick_their_rules() {
        let r = |s: &str| s.parse::<SlurmRelease>().unwrap();
        assert_eq!(r("26.05").to_string(), "26.05");
        assert!(r("24.11").plugin_splits_srun() && !r("25.05").plugin_splits_srun());
        assert_eq!(r("22.05").split_rule(), SplitRule::Rounds);
        assert_eq!(r("24.11").split_rule(), SplitRule::Levels);
        assert_eq!(
            (
                r("23.02").default_tree_width(),
                r("23.11").default_tree_width()
            ),
            (50, 16)
        );
        for bad in ["26", "26.5", "26.13", "x.05", "26.05.1", "", "+6.05"] {
            let e = bad.parse::<SlurmRelease>().unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }

    #[test]
    fn plans_match_what_each_hop_computes() {
        let m = LaunchModel::new(0.01, 0.03).unwrap();
        // Up to 24.11 the plan is the capped greedy tree, srun's split included.
        let capped16 = m.with_max_fanout(16).unwrap();
        assert_eq!(
            SlurmRelease::new(24, 11).greedy_plan(64, 16, &m),
            greedy(65, &capped16)
        );
        // 26.05: srun's split of 16 hosts at TreeWidth 4 is four lists of 4; each head then
        // plans the greedy tree of its own list.
        let capped4 = m.with_max_fanout(4).unwrap();
        let t = SlurmRelease::new(26, 5).greedy_plan(16, 4, &m);
        let kids: Vec<_> = t.children(0).collect();
        assert_eq!(kids, [1, 5, 9, 13]);
        for k in kids {
            let sub = greedy(4, &capped4);
            assert_eq!(
                t.children(k)
                    .map(|c| t.subtree_range(c))
                    .collect::<Vec<_>>(),
                sub.child_ranges(t.subtree_range(k))
            );
        }
    }

    #[test]
    fn treewidth_trees_recurse_the_split() {
        // 16 hosts at TreeWidth 4 under Levels: srun → 4 heads, each → its 3 hosts.
        let t = tree(SplitRule::Levels, 16, 4);
        assert_eq!(t.children(0).collect::<Vec<_>>(), [1, 5, 9, 13]);
        assert_eq!(t.children(1).collect::<Vec<_>>(), [2, 3, 4]);
        assert_eq!(t.len(), 17);
    }
}
