//! Which exits before finalize fail a job: the rule both client servers (PMI and PMIx) apply.
//!
//! A rank that exits non-zero (or by a signal) before finalize fails the job, as does a rank
//! that spoke the protocol and then exited without finalizing. A rank that exits 0 without ever
//! speaking it is not a client at all (`srun hostname` under `MpiDefault=greedy`, a setup
//! script): it fails the job only if another rank of its node does speak the protocol, since
//! that rank's fences would wait for it forever. (A rank alone on its node that leaves silently
//! is found by the fence timeout of the others, which names its node.)

use std::collections::{BTreeSet, HashSet};

/// One node's record of who spoke the protocol and who left without a word.
#[derive(Debug, Default)]
pub(crate) struct Departures {
    spoke: HashSet<u32>,
    silent: BTreeSet<u32>,
}

impl Departures {
    /// `rank` exited with `code` (128+signal for a signal) before finalizing; the reason the
    /// job must end, if it must. `finalize` names the call in the message (`PMI finalize`).
    pub(crate) fn exited(&mut self, rank: u32, code: i32, finalize: &str) -> Option<String> {
        if code != 0 || self.spoke.contains(&rank) {
            return Some(format!(
                "rank {rank} exited with code {code} before {finalize}"
            ));
        }
        match self.spoke.iter().min() {
            Some(other) => Some(format!(
                "rank {rank} exited (code 0) without initializing while rank {other} of its node did"
            )),
            None => {
                self.silent.insert(rank);
                None
            }
        }
    }

    /// `rank` sent its first message; the rank and reason that end the job if a rank of this
    /// node left silently before.
    pub(crate) fn spoke(&mut self, rank: u32) -> Option<(u32, String)> {
        self.spoke.insert(rank);
        let gone = *self.silent.iter().next()?;
        Some((
            gone,
            format!(
                "rank {gone} exited (code 0) without initializing while rank {rank} of its node did"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_and_half_finished_ranks_end_the_job() {
        let mut d = Departures::default();
        assert_eq!(
            d.exited(3, 7, "PMI finalize").as_deref(),
            Some("rank 3 exited with code 7 before PMI finalize")
        );
        assert!(d.exited(4, 139, "PMI finalize").is_some(), "a signal");
        assert!(d.spoke(5).is_none());
        assert_eq!(
            d.exited(5, 0, "PMI finalize").as_deref(),
            Some("rank 5 exited with code 0 before PMI finalize")
        );
    }

    #[test]
    fn silent_ranks_pass_unless_a_neighbour_speaks() {
        let mut d = Departures::default();
        assert!(d.exited(0, 0, "PMI finalize").is_none(), "srun hostname");
        assert!(d.exited(1, 0, "PMI finalize").is_none());
        let (gone, reason) = d.spoke(2).expect("rank 2's fences would wait for 0 and 1");
        assert_eq!(gone, 0);
        assert!(reason.contains("rank 0 exited (code 0) without initializing while rank 2"));

        let mut d = Departures::default();
        assert!(d.spoke(2).is_none());
        let reason = d
            .exited(0, 0, "PMIx_Finalize")
            .expect("rank 2 already spoke");
        assert!(reason.contains("while rank 2 of its node did"), "{reason}");
    }
}
