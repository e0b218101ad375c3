//! The job description an agent is given, and what follows from it: rank placement, the PMI process map.

use std::{fmt, ops::Range};

use greedy_tree::LaunchModel;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Error;

/// The per-job secret every overlay connection proves knowledge of. Never sent, never logged.
#[derive(Clone, PartialEq, Eq)]
pub struct JobSecret(Vec<u8>);

impl JobSecret {
    /// Shortest accepted secret: 16 bytes, so guessing is hopeless.
    pub const MIN_LEN: usize = 16;

    /// A fresh random 32-byte secret from the OS.
    pub fn generate() -> Self {
        let mut bytes = vec![0u8; 32];
        getrandom::fill(&mut bytes).expect("the OS random source is available");
        Self(bytes)
    }

    /// Wraps bytes the launcher already has; `None` when shorter than [`Self::MIN_LEN`].
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        (bytes.len() >= Self::MIN_LEN).then(|| Self(bytes.to_vec()))
    }

    /// Parses the lowercase hex form the launcher passes to agents (`to_hex`).
    pub fn from_hex(hex: &str) -> Option<Self> {
        Self::from_bytes(&crate::auth::from_hex(hex)?)
    }

    /// Lowercase hex, for handing the secret to an agent through a private channel.
    pub fn to_hex(&self) -> String {
        crate::auth::to_hex(&self.0)
    }

    /// Whether `other` is the same secret, in a time that does not depend on where they
    /// differ (a proof someone presents).
    pub fn same_as(&self, other: &JobSecret) -> bool {
        let differ = (self.0.iter().zip(&other.0)).fold(0u8, |acc, (a, b)| acc | (a ^ b));
        self.0.len() == other.0.len() && std::hint::black_box(differ) == 0
    }

    /// The secret itself, for keying other MACs (never send or log it).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Serialised as its bytes, so the launcher hands agents the value itself; deserialising
/// checks [`JobSecret::MIN_LEN`] again.
impl Serialize for JobSecret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for JobSecret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let bytes = Vec::<u8>::deserialize(d)?;
        JobSecret::from_bytes(&bytes).ok_or_else(|| {
            serde::de::Error::custom(format_args!(
                "a job secret of {} bytes (at least {})",
                bytes.len(),
                JobSecret::MIN_LEN
            ))
        })
    }
}

impl fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobSecret(<redacted>)")
    }
}

/// What an agent knows about its job: enough to compute the tree and serve its ranks.
///
/// Every agent of a job gets the same description except for `node_idx`.
#[derive(Debug, Clone)]
pub struct JobSpec {
    /// The job id; also the PMI kvsname and PMI-2 jobid.
    pub job_id: String,
    /// One host name per node, in plan order (node 0 is the tree's root).
    pub hosts: Vec<String>,
    /// This agent's position in `hosts`.
    pub node_idx: usize,
    /// The launch model the tree is computed from; must be the same on every node.
    pub model: LaunchModel,
    /// `ranks[node_idx]` lists the ranks living on that node, ascending.
    pub ranks: Vec<Vec<u32>>,
    /// The per-job secret.
    pub secret: JobSecret,
}

impl JobSpec {
    /// Checks that the description is consistent: one rank list per host, each rank
    /// `0..n_ranks` exactly once, every node holding at least one rank.
    ///
    /// A node without ranks would never enter a PMI fence, so it is refused here rather
    /// than hanging the job later. (A namespace served on an overlay may leave nodes idle:
    /// [`crate::namespace::NamespaceSpec`].)
    pub fn validate(&self) -> Result<(), Error> {
        self.check(false)
    }

    /// [`JobSpec::validate`], accepting nodes without ranks when `idle_nodes` (at least one
    /// rank overall still).
    pub(crate) fn check(&self, idle_nodes: bool) -> Result<(), Error> {
        let bad = |reason: String| Error::InvalidJob {
            job: self.job_id.clone(),
            reason,
        };
        // The job id is the PMI-1 kvsname and PMI-2 jobid: it travels inside `key=value`
        // lines (space-separated) and `;`-separated PMI-2 frames, so it must not hold those.
        if self.job_id.is_empty()
            || self.job_id.len() > crate::pmi1::KVSNAME_MAX
            || !self
                .job_id
                .chars()
                .all(|c| c.is_ascii_graphic() && !"=;".contains(c))
        {
            return Err(bad(format!(
                "job id {:?} is not a PMI kvsname (1 to {} printable ASCII characters, no '=' or ';')",
                self.job_id,
                crate::pmi1::KVSNAME_MAX
            )));
        }
        if self.hosts.is_empty() {
            return Err(bad("no hosts".into()));
        }
        if self.hosts.len() != self.ranks.len() {
            return Err(bad(format!(
                "{} hosts but {} rank lists",
                self.hosts.len(),
                self.ranks.len()
            )));
        }
        if self.node_idx >= self.hosts.len() {
            return Err(bad(format!(
                "node_idx {} but {} hosts",
                self.node_idx,
                self.hosts.len()
            )));
        }
        let n_ranks = self.n_ranks();
        let mut seen = vec![false; n_ranks as usize];
        for (node_idx, ranks) in self.ranks.iter().enumerate() {
            if ranks.is_empty() && !idle_nodes {
                return Err(bad(format!(
                    "node {node_idx} ({}) has no ranks",
                    self.hosts[node_idx]
                )));
            }
            for &rank in ranks {
                let slot = seen.get_mut(rank as usize).ok_or_else(|| {
                    bad(format!(
                        "node {node_idx}: rank {rank} out of range 0..{n_ranks}"
                    ))
                })?;
                if std::mem::replace(slot, true) {
                    return Err(bad(format!("rank {rank} placed twice")));
                }
            }
        }
        if n_ranks == 0 {
            return Err(bad("no ranks".into()));
        }
        Ok(())
    }

    /// Number of nodes.
    pub fn n_nodes(&self) -> usize {
        self.hosts.len()
    }

    /// Number of ranks in the whole job.
    pub fn n_ranks(&self) -> u32 {
        self.ranks.iter().map(|r| r.len() as u32).sum()
    }

    /// The ranks on this node.
    pub fn local_ranks(&self) -> &[u32] {
        &self.ranks[self.node_idx]
    }

    /// The node a rank lives on.
    pub fn node_of_rank(&self, rank: u32) -> Option<usize> {
        self.ranks.iter().position(|r| r.contains(&rank))
    }

    /// `rank → node_idx` for every rank.
    pub fn rank_to_node(&self) -> Vec<usize> {
        let mut map = vec![0; self.n_ranks() as usize];
        for (node_idx, ranks) in self.ranks.iter().enumerate() {
            for &rank in ranks {
                if let Some(slot) = map.get_mut(rank as usize) {
                    *slot = node_idx;
                }
            }
        }
        map
    }

    /// The PMI `PMI_process_mapping` value: `(vector,(start_node,num_nodes,ranks_per_node),...)`.
    ///
    /// Blocks are emitted in rank order; each covers `num_nodes` consecutive nodes holding
    /// `ranks_per_node` consecutive ranks each (research/pmix-pmi.md §3). Block placement of
    /// 4×4 gives `(vector,(0,4,4))`, cyclic gives `(vector,(0,4,1),(0,4,1),(0,4,1),(0,4,1))`.
    pub fn process_mapping(&self) -> String {
        let nodes = self.rank_to_node();
        // Runs of equal node: (node, count).
        let mut runs: Vec<(usize, u32)> = Vec::new();
        for node in nodes {
            match runs.last_mut() {
                Some((n, c)) if *n == node => *c += 1,
                _ => runs.push((node, 1)),
            }
        }
        // Merge runs on consecutive nodes with the same count into blocks.
        let mut blocks: Vec<(usize, usize, u32)> = Vec::new();
        for (node, count) in runs {
            match blocks.last_mut() {
                Some((start, n, c)) if *c == count && *start + *n == node => *n += 1,
                _ => blocks.push((node, 1, count)),
            }
        }
        let mut out = String::from("(vector");
        for (start, n, c) in blocks {
            out.push_str(&format!(",({start},{n},{c})"));
        }
        out.push(')');
        out
    }

    /// Renders a set of nodes for an error message: indices, hosts and their ranks.
    pub fn describe_nodes(&self, nodes: &[usize]) -> String {
        if nodes.is_empty() {
            return "no node".into();
        }
        let mut ranks: Vec<u32> = nodes
            .iter()
            .filter_map(|&n| self.ranks.get(n))
            .flatten()
            .copied()
            .collect();
        ranks.sort_unstable();
        let hosts: Vec<&str> = nodes
            .iter()
            .filter_map(|&n| self.hosts.get(n))
            .map(String::as_str)
            .collect();
        format!(
            "nodes {} (hosts {}; ranks {})",
            render_ranges(nodes.iter().map(|&n| n as u64)),
            hosts.join(","),
            render_ranges(ranks.iter().map(|&r| u64::from(r)))
        )
    }
}

/// `0,1,2,5,7,8` → `0-2,5,7-8`.
pub(crate) fn render_ranges(values: impl IntoIterator<Item = u64>) -> String {
    let mut ranges: Vec<Range<u64>> = Vec::new();
    for v in values {
        match ranges.last_mut() {
            Some(r) if r.end == v => r.end = v + 1,
            _ => ranges.push(v..v + 1),
        }
    }
    ranges
        .iter()
        .map(|r| {
            if r.end - r.start == 1 {
                r.start.to_string()
            } else {
                format!("{}-{}", r.start, r.end - 1)
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_the_same_as_its_copy_only() {
        let s = JobSecret::from_bytes(&[7; 32]).unwrap();
        assert!(s.same_as(&JobSecret::from_hex(&s.to_hex()).unwrap()));
        let mut other = [7; 32];
        other[31] = 8;
        assert!(!s.same_as(&JobSecret::from_bytes(&other).unwrap()));
        assert!(!s.same_as(&JobSecret::from_bytes(&[7; 16]).unwrap()));
    }

    fn spec(ranks: Vec<Vec<u32>>) -> JobSpec {
        JobSpec {
            job_id: "j1".into(),
            hosts: (0..ranks.len()).map(|i| format!("n{i}")).collect(),
            node_idx: 0,
            model: LaunchModel::default(),
            ranks,
            secret: JobSecret::generate(),
        }
    }

    fn check_mapping(ranks: Vec<Vec<u32>>, expect: &str) {
        assert_eq!(spec(ranks).process_mapping(), expect);
    }

    #[test]
    fn process_mapping() {
        check_mapping(vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]], "(vector,(0,2,4))");
        check_mapping(vec![vec![0, 2], vec![1, 3]], "(vector,(0,2,1),(0,2,1))");
        check_mapping(vec![vec![0, 1, 2], vec![3]], "(vector,(0,1,3),(1,1,1))");
        check_mapping(vec![vec![0]], "(vector,(0,1,1))");
        check_mapping(vec![vec![1], vec![0]], "(vector,(1,1,1),(0,1,1))");
    }

    fn check_invalid(ranks: Vec<Vec<u32>>, expect: &str) {
        let err = spec(ranks).validate().unwrap_err().to_string();
        assert_eq!(err, expect);
    }

    #[test]
    fn validation() {
        check_invalid(
            vec![vec![0], vec![]],
            "job j1: invalid job description: node 1 (n1) has no ranks",
        );
        check_invalid(
            vec![vec![0, 0]],
            "job j1: invalid job description: rank 0 placed twice",
        );
        check_invalid(
            vec![vec![0, 5]],
            "job j1: invalid job description: node 0: rank 5 out of range 0..2",
        );
        assert!(spec(vec![vec![0, 2], vec![1]]).validate().is_ok());
        let mut s = spec(vec![vec![0]]);
        s.job_id = "a b".into();
        assert_eq!(
            s.validate().unwrap_err().to_string(),
            "job a b: invalid job description: job id \"a b\" is not a PMI kvsname (1 to 256 printable ASCII characters, no '=' or ';')"
        );
        s.job_id = "1234.0".into();
        assert!(s.validate().is_ok());
    }

    #[test]
    fn describe() {
        let s = spec(vec![vec![0, 1], vec![2, 3], vec![4, 5]]);
        assert_eq!(
            s.describe_nodes(&[1, 2]),
            "nodes 1-2 (hosts n1,n2; ranks 2-5)"
        );
        assert_eq!(render_ranges([0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
    }

    #[test]
    fn secret_hex_roundtrip_and_redaction() {
        let s = JobSecret::generate();
        assert_eq!(JobSecret::from_hex(&s.to_hex()), Some(s.clone()));
        assert_eq!(format!("{s:?}"), "JobSecret(<redacted>)");
        assert_eq!(JobSecret::from_hex("abcd"), None);
        assert_eq!(JobSecret::from_hex("zz"), None);
    }
}
