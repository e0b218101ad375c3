//! A PMIx namespace as served on an overlay: the overlay's nodes, and where the namespace's own ranks sit on them (possibly on some of the nodes only).
//!
//! A job's [`JobSpec`] describes the overlay *and* its ranks, and needs ranks on every node
//! (a node without ranks would never enter the job's fences). A namespace spawned later
//! (`MPI_Comm_spawn`) lives on some of its parent's nodes but is registered on every node of
//! the overlay that may be asked about it (libpmix answers its job-level keys from that
//! registration, and sends proc-level gets up as direct modex to the owning node). So a
//! [`NamespaceSpec`] keeps the overlay's node numbering and hosts, and its own rank lists,
//! empty on the nodes that host none of its ranks. What follows from that:
//! - its PMIx maps (`PMIX_NODE_MAP`, `PMIX_PROC_MAP`, `PMIX_NUM_NODES`, `PMI_process_mapping`)
//!   list only [`NamespaceSpec::nodes`], as PRRTE registers a child job with its own map's nodes
//!   on every daemon;
//! - its fences run over the nodes hosting participants (the subset path, [`crate::group`])
//!   unless the namespace has ranks on every node ([`NamespaceSpec::spans_overlay`]);
//! - direct modex goes to the overlay node the namespace's own map names.
//!
//! Several namespaces may be served over one overlay (a spawned child over its parent's,
//! [`crate::pmix::PmixServer::add_namespace`]): each node dispatches the overlay's
//! direct-modex requests by the namespace they name, and node 0's coordinator looks up each
//! subset collective's namespace, both in the overlay's [`crate::overlay::served::Served`] registry; a
//! namespace not (or no longer) served there is refused at once, never left pending.

use crate::{Error, JobSpec};

/// A namespace served on an overlay; every node of the overlay gets the same one except for
/// the node index.
#[derive(Debug, Clone)]
pub struct NamespaceSpec {
    /// The namespace's ranks in the overlay's numbering: `job_id` is the namespace, `hosts`,
    /// `node_idx`, `model` and `secret` are the overlay's, `ranks[n]` may be empty.
    placement: JobSpec,
}

impl NamespaceSpec {
    /// A job's own namespace: its ranks on every node of its overlay.
    pub fn of_job(job: &JobSpec) -> Result<NamespaceSpec, Error> {
        job.validate()?;
        Ok(NamespaceSpec {
            placement: job.clone(),
        })
    }

    /// Namespace `nspace` served on the overlay of `overlay`, with `ranks[n]` the ranks on
    /// overlay node `n` (one list per node, empty where it has none; each rank once).
    pub fn on_overlay(
        overlay: &JobSpec,
        nspace: &str,
        ranks: Vec<Vec<u32>>,
    ) -> Result<NamespaceSpec, Error> {
        let placement = JobSpec {
            job_id: nspace.to_string(),
            ranks,
            ..overlay.clone()
        };
        placement.check(true)?;
        Ok(NamespaceSpec { placement })
    }

    /// The namespace's name.
    pub fn nspace(&self) -> &str {
        &self.placement.job_id
    }

    /// The namespace's ranks on this node (none on an idle node).
    pub fn local_ranks(&self) -> &[u32] {
        self.placement.local_ranks()
    }

    /// How many ranks the namespace has.
    pub fn n_ranks(&self) -> u32 {
        self.placement.n_ranks()
    }

    /// The overlay nodes hosting the namespace's ranks, ascending.
    pub fn nodes(&self) -> Vec<usize> {
        nodes_with_ranks(&self.placement)
    }

    /// Whether the namespace has ranks on every node of the overlay (a job's namespace does).
    pub fn spans_overlay(&self) -> bool {
        spans_overlay(&self.placement)
    }

    /// The placement as a `JobSpec` in the overlay's numbering (nodes may hold no rank).
    pub(crate) fn placement(&self) -> &JobSpec {
        &self.placement
    }
}

/// The nodes of `placement` holding ranks, ascending.
pub(crate) fn nodes_with_ranks(placement: &JobSpec) -> Vec<usize> {
    (0..placement.n_nodes())
        .filter(|&n| !placement.ranks[n].is_empty())
        .collect()
}

/// Whether every node of `placement` holds ranks.
pub(crate) fn spans_overlay(placement: &JobSpec) -> bool {
    placement.ranks.iter().all(|r| !r.is_empty())
}

/// `placement` reduced to the nodes holding ranks (renumbered from 0, `node_idx` 0): the
/// namespace's own node list for its PMIx maps.
pub(crate) fn own_nodes(placement: &JobSpec) -> JobSpec {
    let nodes = nodes_with_ranks(placement);
    JobSpec {
        hosts: nodes.iter().map(|&n| placement.hosts[n].clone()).collect(),
        ranks: nodes.iter().map(|&n| placement.ranks[n].clone()).collect(),
        node_idx: 0,
        ..placement.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JobSecret;

    fn overlay() -> JobSpec {
        JobSpec {
            job_id: "a".into(),
            hosts: vec!["h0".into(), "h1".into(), "h2".into()],
            node_idx: 0,
            model: Default::default(),
            ranks: vec![vec![0], vec![1], vec![2]],
            secret: JobSecret::generate(),
        }
    }

    #[test]
    fn a_namespace_may_leave_overlay_nodes_idle() {
        let ns = NamespaceSpec::on_overlay(&overlay(), "a.1", vec![vec![], vec![0], vec![1, 2]])
            .unwrap();
        assert_eq!(ns.nspace(), "a.1");
        assert_eq!(ns.nodes(), [1, 2]);
        assert!(ns.local_ranks().is_empty());
        assert!(!ns.spans_overlay());
        assert_eq!(ns.n_ranks(), 3);
        let own = own_nodes(ns.placement());
        assert_eq!(own.hosts, ["h1", "h2"]);
        assert_eq!(own.ranks, [vec![0], vec![1, 2]]);
        assert_eq!(own.process_mapping(), "(vector,(0,1,1),(1,1,2))");
        // The job itself still needs ranks everywhere.
        let mut job = overlay();
        job.ranks[0].clear();
        job.ranks[1] = vec![0, 1];
        assert!(job.validate().is_err());
        assert!(NamespaceSpec::of_job(&job).is_err());
        assert!(NamespaceSpec::of_job(&overlay()).unwrap().spans_overlay());
    }

    #[test]
    fn a_namespace_needs_ranks_one_list_per_overlay_node_each_once() {
        let bad = |ranks: Vec<Vec<u32>>| {
            NamespaceSpec::on_overlay(&overlay(), "a.1", ranks)
                .unwrap_err()
                .to_string()
        };
        assert!(bad(vec![vec![], vec![], vec![]]).contains("no ranks"));
        assert!(bad(vec![vec![0], vec![1]]).contains("3 hosts but 2 rank lists"));
        assert!(bad(vec![vec![], vec![0], vec![0]]).contains("placed twice"));
        assert!(bad(vec![vec![], vec![2], vec![]]).contains("out of range"));
    }
}
