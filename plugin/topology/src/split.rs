//! One split: the greedy plan for a forward list of `n` hosts under greedy.conf's `Route*`
//! model and TreeWidth, with the same rule as route/greedy ([`route_greedy::split`]), or why it
//! cannot be used (then the delegate splits, as Slurm would without this plugin).

use route_greedy::split::{self as rule, Shape, Split, SplitError};
use route_greedy::state;
use std::ops::Range;

/// The greedy split of one forward list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Sub-lists as index ranges into the list, in order; each range's first host is contacted.
    pub ranges: Vec<Range<usize>>,
    /// Levels of forwarding below the sender (what `topology_p_split_hostlist` returns).
    pub depth: u32,
}

/// The plan for `n` hosts, or the line to log before falling back to the delegate's split;
/// `log` receives greedy.conf's fault, once per load.
pub fn plan(n: usize, tree_width: u16, log: impl Fn(&str)) -> Result<Plan, String> {
    let (cfg, fault) = state::current();
    if let Some(line) = fault {
        log(&format!("topology/greedy: {line}"));
    }
    cfg.model()
        .map_err(SplitError::from)
        .and_then(|m| rule::greedy_plan(n, &m, tree_width))
        .map(|(ranges, depth)| Plan { ranges, depth })
        .map_err(|why| format!("topology/greedy: {why}; the delegate splits these {n} hosts"))
}

/// The line `RouteLogSplits=yes` logs for a split of `names` (route/greedy's format).
pub fn describe<S: AsRef<str>>(names: &[S], tree_width: u16, plan: &Plan) -> Option<String> {
    let (cfg, _) = state::current();
    cfg.log_splits.then(|| {
        let split = Split {
            ranges: plan.ranges.clone(),
            shape: Shape::Greedy,
        };
        rule::render("topology/greedy", names, tree_width, &split)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_hosts_are_a_partition_with_the_trees_depth() {
        let p = plan(16, 16, |_| {}).unwrap();
        assert_eq!(p.ranges.iter().map(|r| r.len()).sum::<usize>(), 16);
        assert_eq!(p.ranges[0].start, 0);
        assert!(
            p.depth >= 2,
            "16 hosts under the default model forward at least once"
        );
        // TreeWidth 16 with 16 hosts could be flat; the greedy tree is not.
        assert!(p.ranges.len() < 16);
        let one = plan(1, 16, |_| {}).unwrap();
        assert_eq!(one.ranges.len(), 1);
        assert_eq!((one.ranges[0].clone(), one.depth), (0..1, 1));
    }
}
