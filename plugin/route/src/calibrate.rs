//! Fitting route/greedy's SEQ and REM to timed `srun` launches under route/default.
//!
//! `srun -N N true` takes a constant overhead (allocation, step creation, task exit) plus the
//! launch RPC's trip down and back up Slurm's forwarding tree. With route/default that tree is
//! known exactly: the sender (srun) splits with [`crate::split::kary_ranges`] and every head re-splits its
//! forward list the same way ([`slurm_tree`]). So a launch's time is modelled as
//! `overhead + T(tree; SEQ, REM)` with T the tree crate's launch time (equation 2). For a
//! fixed ratio SEQ/REM that is linear in (overhead, REM); the ratio is found by a search.
//! Timing TreeWidth ≥ N (flat: SEQ per extra host) and TreeWidth 1 (chain: REM per extra host)
//! at a few sizes separates the two.
//!
//! The measurement-file format (`tests/slurm/route-calibrate.sh` writes it): one launch per
//! line, `TREEWIDTH HOSTS SECONDS`, `#` starts a comment.

use greedy_tree::Tree;
pub use greedy_tree::calibrate::Fit;
use greedy_tree::calibrate::{self, Launch};
use greedy_tree::treewidth::{self, SplitRule};
use thiserror::Error;

/// One timed launch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timed {
    /// The TreeWidth route/default split with.
    pub tree_width: u16,
    /// Hosts the launch reached (srun -N).
    pub hosts: usize,
    /// Wall seconds of the whole srun.
    pub seconds: f64,
}

/// Why no model could be fitted.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum CalibrationError {
    /// A line of the measurements file that does not parse.
    #[error("line {line}: {reason}: {text:?}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// Measurements from which no model can be fitted.
    #[error(transparent)]
    Fit(#[from] greedy_tree::Error),
}

/// The forwarding tree route/default uses to reach `hosts` hosts at `tree_width`: position 0 is
/// the sender, hosts follow in depth-first preorder.
pub fn slurm_tree(hosts: usize, tree_width: u16) -> Tree {
    treewidth::tree(SplitRule::Rounds, hosts, tree_width)
}

/// Parses `TREEWIDTH HOSTS SECONDS` lines.
pub fn parse(text: &str) -> Result<Vec<Timed>, CalibrationError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("");
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.is_empty() {
            continue;
        }
        let bad = |reason| CalibrationError::Line {
            line: i + 1,
            text: raw.to_string(),
            reason,
        };
        let [w, n, s] = words[..] else {
            return Err(bad("expected TREEWIDTH HOSTS SECONDS"));
        };
        let tree_width = w.parse().map_err(|_| bad("TREEWIDTH must be 1..65535"))?;
        let hosts = n.parse().map_err(|_| bad("HOSTS must be a whole number"))?;
        let seconds: f64 = s.parse().map_err(|_| bad("SECONDS must be a number"))?;
        if tree_width == 0 || hosts == 0 || !seconds.is_finite() || seconds <= 0.0 {
            return Err(bad("TREEWIDTH and HOSTS must be ≥ 1, SECONDS > 0"));
        }
        out.push(Timed {
            tree_width,
            hosts,
            seconds,
        });
    }
    Ok(out)
}

/// Least-squares fit of `overhead + T(tree; SEQ, REM)` to the launches, over the trees
/// route/default really used (the tree crate does the fitting).
pub fn fit(timed: &[Timed]) -> Result<Fit, CalibrationError> {
    let launches: Vec<Launch> = timed
        .iter()
        .map(|t| Launch {
            tree: slurm_tree(t.hosts, t.tree_width),
            seconds: t.seconds,
        })
        .collect();
    Ok(calibrate::fit_launches_with_overhead(&launches, 1)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use greedy_tree::LaunchModel;

    #[test]
    fn slurm_tree_shapes() {
        let flat = slurm_tree(16, 50);
        assert_eq!(flat.children(0).count(), 16);
        let chain = slurm_tree(5, 1);
        assert_eq!(chain.depths(), [0, 1, 2, 3, 4, 5]);
        let four = slurm_tree(16, 4);
        let sizes: Vec<usize> = four.children(0).map(|c| four.subtree_len(c)).collect();
        assert_eq!(sizes, [5, 5, 5, 1]);
    }

    #[test]
    fn recovers_a_known_model() {
        let (seq, rem, overhead) = (0.003, 0.045, 0.21);
        let model = LaunchModel::new(seq, rem).unwrap();
        let timed: Vec<Timed> = [(50u16, 2usize), (50, 8), (50, 16), (1, 4), (1, 8), (4, 16)]
            .into_iter()
            .map(|(w, n)| Timed {
                tree_width: w,
                hosts: n,
                seconds: overhead + slurm_tree(n, w).launch_time(&model),
            })
            .collect();
        let f = fit(&timed).unwrap();
        assert!((f.model.seq() - seq).abs() < 2e-4, "{f:?}");
        assert!((f.model.rem() - rem).abs() < 1e-3, "{f:?}");
        assert!((f.overhead - overhead).abs() < 2e-3, "{f:?}");
    }

    #[test]
    fn parse_names_the_line() {
        assert_eq!(parse("# x\n50 16 0.5\n").unwrap().len(), 1);
        let e = parse("50 16\n").unwrap_err().to_string();
        assert!(e.starts_with("line 1:"), "{e}");
        assert!(parse("0 16 1\n").is_err());
    }
}
