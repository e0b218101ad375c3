//! One split: the greedy plan for a forward list of `n` hosts under greedy.conf's `Route*`
//! model and TreeWidth, with the same rule as route/greedy ([`route_greedy::split`]), or why it
//! cannot be used (then the delegate splits, as Slurm would without this plugin).

use route_greedy::split::{self as rule, Shape, Split};
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

/// The plan for `n` hosts, or why the delegate splits instead: the line to log, or `None`
/// when greedy.conf could not be used (said once, when it was loaded: `log` receives it if
/// this is the first load). A greedy.conf that was ignored leaves every split to the delegate,
/// as Slurm would split without this plugin, rather than planning with defaults nobody chose.
pub fn plan(n: usize, tree_width: u16, log: impl Fn(&str)) -> Result<Plan, Option<String>> {
    let (cfg, fault) = state::current();
    if let Some(line) = fault {
        log(&format!(
            "topology/greedy: {line}; the delegate splits every host list"
        ));
    }
    if state::file_was_ignored() {
        return Err(None);
    }
    rule::greedy_plan(n, &cfg.model, tree_width)
        .map(|(ranges, depth)| Plan { ranges, depth })
        .map_err(|why| {
            Some(format!(
                "topology/greedy: {why}; the delegate splits these {n} hosts"
            ))
        })
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

    // One test: the configuration is process-wide, and tests run on parallel threads.
    #[test]
    fn plans_with_greedy_conf_and_leaves_splits_to_the_delegate_when_it_is_ignored() {
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

        let dir = std::env::temp_dir().join(format!("topology-split-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("greedy.conf");
        std::fs::write(&bad, "RouteSeq=fast\n").unwrap();
        let (fault, _) = state::reload_from(&bad);
        assert!(fault.unwrap().contains("RouteSeq"));
        assert_eq!(plan(16, 16, |_| {}), Err(None));
        state::reload_from(&dir.join("absent.conf"));
        assert!(plan(16, 16, |_| {}).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
