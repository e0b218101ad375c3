//! Which exits before finalize fail a job, and which ranks of a node spoke which family: the
//! rule every client server (PMI, PMIx, Charm++) of one node applies, on one shared record.
//!
//! A rank that exits non-zero (or by a signal) before finalize fails the job, as does a rank
//! that spoke a protocol and then exited without finalizing. A rank that exits 0 without ever
//! speaking one is not a client at all (`srun hostname` under `MpiDefault=greedy`, a setup
//! script): it fails the job only if another rank of its node does speak, since that rank's
//! fences would wait for it forever. (A rank alone on its node that leaves silently is found by
//! the fence timeout of the others, which names its node.) Two ranks of a node that speak
//! different families fail the job at the second one's first word ([`crate::family`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, MutexGuard},
};

use tokio::sync::watch;

use crate::family::{self, Family};

/// One node's record of who spoke which family and who left without a word; cheap to clone,
/// every clone is the same record.
#[derive(Debug, Clone)]
pub(crate) struct Departures {
    inner: Arc<Mutex<Record>>,
    /// The family the node's ranks speak, once one has spoken.
    node_family: Arc<watch::Sender<Option<Family>>>,
}

impl Default for Departures {
    fn default() -> Self {
        Departures {
            inner: Arc::default(),
            node_family: Arc::new(watch::Sender::new(None)),
        }
    }
}

#[derive(Debug, Default)]
struct Record {
    spoke: BTreeMap<u32, Family>,
    silent: BTreeSet<u32>,
}

impl Departures {
    fn lock(&self) -> MutexGuard<'_, Record> {
        // Sets of ranks stay consistent through any panic; keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `rank` (on `host`) exited with `code` (128+signal for a signal) before finalizing; the
    /// reason the job must end, if it must. `finalize` names the call in the message (`PMI
    /// finalize`).
    pub(crate) fn exited(
        &self,
        rank: u32,
        host: &str,
        code: i32,
        finalize: &str,
    ) -> Option<String> {
        let mut r = self.lock();
        if r.spoke.contains_key(&rank) {
            return Some(format!(
                "rank {rank} exited with code {code} before {finalize}"
            ));
        }
        if code != 0 {
            return Some(format!(
                "rank {rank} on {host} exited with code {code} before connecting to any wire-up service"
            ));
        }
        match r.spoke.keys().next() {
            Some(other) => Some(format!(
                "rank {rank} exited (code 0) without initializing while rank {other} of its node did"
            )),
            None => {
                r.silent.insert(rank);
                None
            }
        }
    }

    /// `rank` sent its first message in `family`; the rank and reason that end the job if a
    /// rank of this node left silently before, or spoke another family.
    pub(crate) fn spoke(&self, rank: u32, family: Family) -> Option<(u32, String)> {
        let mut r = self.lock();
        if let Some((&other, &theirs)) = r.spoke.iter().find(|(_, f)| **f != family) {
            let (who, other) = (format!("rank {rank}"), format!("rank {other}"));
            return Some((rank, family::mixed(&who, family, &other, theirs)));
        }
        r.spoke.insert(rank, family);
        self.node_family
            .send_if_modified(|f| f.replace(family).is_none());
        let gone = *r.silent.iter().next()?;
        Some((
            gone,
            format!(
                "rank {gone} exited (code 0) without initializing while rank {rank} of its node did"
            ),
        ))
    }

    /// The family `rank` spoke, if it spoke.
    pub(crate) fn family_of(&self, rank: u32) -> Option<Family> {
        self.lock().spoke.get(&rank).copied()
    }

    /// The family this node's ranks speak, once one has spoken.
    pub(crate) fn node_family(&self) -> Option<Family> {
        self.lock().spoke.values().next().copied()
    }

    /// Watches [`Departures::node_family`].
    pub(crate) fn watch_node_family(&self) -> watch::Receiver<Option<Family>> {
        self.node_family.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_and_half_finished_ranks_end_the_job() {
        let d = Departures::default();
        assert_eq!(
            d.exited(3, "n1", 7, "PMI finalize").as_deref(),
            Some("rank 3 on n1 exited with code 7 before connecting to any wire-up service")
        );
        assert!(d.exited(4, "n1", 139, "PMI finalize").is_some(), "a signal");
        assert!(d.spoke(5, Family::Pmi).is_none());
        assert_eq!(
            d.exited(5, "n1", 0, "PMI finalize").as_deref(),
            Some("rank 5 exited with code 0 before PMI finalize")
        );
    }

    #[test]
    fn silent_ranks_pass_unless_a_neighbour_speaks() {
        let d = Departures::default();
        assert!(
            d.exited(0, "n1", 0, "PMI finalize").is_none(),
            "srun hostname"
        );
        assert!(d.exited(1, "n1", 0, "PMI finalize").is_none());
        let (gone, reason) = d
            .spoke(2, Family::Pmix)
            .expect("rank 2's fences would wait for 0 and 1");
        assert_eq!(gone, 0);
        assert!(reason.contains("rank 0 exited (code 0) without initializing while rank 2"));

        let d = Departures::default();
        assert!(d.spoke(2, Family::Pmix).is_none());
        let reason = d
            .exited(0, "n1", 0, "PMIx_Finalize")
            .expect("rank 2 already spoke");
        assert!(reason.contains("while rank 2 of its node did"), "{reason}");
    }

    #[test]
    fn a_second_family_on_a_node_names_both_ranks() {
        let d = Departures::default();
        let shared = d.clone();
        assert!(d.spoke(4, Family::Pmi).is_none());
        assert!(shared.spoke(5, Family::Pmi).is_none(), "same family");
        let (rank, reason) = shared.spoke(6, Family::Pmix).expect("mixed");
        assert_eq!(rank, 6);
        assert!(
            reason.starts_with("rank 6 speaks PMIx while rank 4 speaks PMI-1/PMI-2"),
            "{reason}"
        );
        assert_eq!(d.family_of(5), Some(Family::Pmi));
        assert_eq!(d.family_of(6), None, "the mixed rank is not recorded");
        assert_eq!(d.node_family(), Some(Family::Pmi));
    }
}
