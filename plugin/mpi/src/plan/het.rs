//! Heterogeneous steps (`srun A : B`, or one srun over several components of a het job):
//! srun launches each component as its own Slurm step, with its own slurmstepd on each of its
//! nodes, but hands every component's MPI hooks the layout of the whole het step (srun.c
//! `_launch_app`, step_launch.c `_rebuild_mpi_layout`; slurmstepd's `het_job_*` fields). One
//! overlay spans every component: a node's index is its position in the het step's node list,
//! ranks are global (component offset + local rank), and the step is named by the het job id.
//!
//! srun sorts the het node list by name when no node is in two components and reorders the
//! per-node rank lists to match (srun.c `_reorder_het_job_recs`), so a node's position is found
//! by name, not from `het_job_node_offset` (the offset in the unsorted concatenation).
//!
//! How a het step reaches an MPI plugin, the same in 22.05, 24.11 and 26.05 (22.05.8, 24.11.5,
//! 26.05.3 sources):
//! - srun: `slurm_step_launch` runs once per component, each in its own thread, so
//!   `client_prelaunch` and `client_fini` run once per component; the step info carries
//!   `het_job_id` (NO_VAL for a het step inside one allocation) and `het_job_task_offset`, and
//!   its layout is the whole het step's (`het_job_nnodes`, `het_job_node_list`,
//!   `het_job_task_cnts`, `het_job_tids` with global ranks). srun exits with the highest code
//!   the components' `client_fini` return (srun.c `_launch_app`).
//! - slurmstepd: one per component per node (each component is its own step: its own job id
//!   and the same step id in a het job, the same job id and its own `step_het_comp` inside one
//!   allocation); `stepd_step_rec_t` holds `het_job_*` (26.05 adds `het_job_step_task_cnts`),
//!   the per-node arrays only when srun launched two components or more. The task hook gets
//!   the het job's view (`task.c` `_setup_mpi`: het job id, `het_job_nnodes`,
//!   `het_job_node_offset + nodeid`, `het_job_ntasks`, `het_job_task_offset + gtid`).
//! - A node in two components: slurmctld keeps a component's `-w` nodes from the others
//!   (proc_req.c `_exclude_het_job_nodes`) and srun keeps a local het step's components apart
//!   (`_handle_het_step_exclude`), but a het job's components may still share a node; then
//!   two stepds of one step run there, and this plugin refuses the step.

use super::encode_ranks;

/// The het step's name, `J.S` with the het job id: the same in every component (a component of
/// a het job has its own job id; the step id is the same in all).
pub fn step_name(job_or_het_id: u32, step_id: u32) -> String {
    format!("{job_or_het_id}.{step_id}")
}

/// A node that appears more than once in the het step's node list: its name, and which
/// components (from `rank_components`, the component of each global rank) or which ranks hold
/// its entries, for the error a person reads.
pub fn shared_node(
    hosts: &[String],
    ranks: &[Vec<u32>],
    rank_components: Option<&[u32]>,
) -> Option<(String, String)> {
    let (first, dup) = hosts.iter().enumerate().find_map(|(j, h)| {
        let i = hosts[..j].iter().position(|x| x == h)?;
        Some((i, j))
    })?;
    let host = hosts[dup].clone();
    let entries: Vec<usize> = (first..hosts.len()).filter(|&i| hosts[i] == host).collect();
    let component_of = |node: usize| -> Option<u32> {
        let rank = *ranks.get(node)?.first()?;
        rank_components?.get(rank as usize).copied()
    };
    let comps: Option<Vec<u32>> = entries.iter().map(|&i| component_of(i)).collect();
    let what = match comps {
        Some(c) => format!(
            "components {}",
            c.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(" and ")
        ),
        None => format!(
            "{} components (ranks {})",
            entries.len(),
            entries
                .iter()
                .map(|&i| encode_ranks(&[ranks.get(i).cloned().unwrap_or_default()]))
                .collect::<Vec<_>>()
                .join(" and ")
        ),
    };
    Some((host, what))
}

/// The component each global rank belongs to, from Slurm's per-rank list, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Components {
    /// This node's component.
    pub own: u32,
    /// `of_rank[rank]`, when Slurm sent it (it does with two components or more).
    pub of_rank: Option<Vec<u32>>,
}

impl Components {
    /// The component of `rank`, if known.
    pub fn of(&self, rank: u32) -> Option<u32> {
        self.of_rank.as_ref()?.get(rank as usize).copied()
    }

    /// The component of node `node` of the het step (its first rank's), if known.
    pub fn of_node(&self, ranks: &[Vec<u32>], node: usize) -> Option<u32> {
        self.of(*ranks.get(node)?.first()?)
    }

    /// Whether node `me` kills its own component's step when an abort started on node
    /// `origin`: the first node of each other component does (the origin kills its own), so
    /// every component's step ends at once with one request to slurmctld per component.
    /// Unknown components: every node but the origin does.
    pub fn kills_own(&self, ranks: &[Vec<u32>], me: usize, origin: usize) -> bool {
        match (self.of_node(ranks, origin), self.of_node(ranks, me)) {
            (Some(o), Some(m)) => {
                o != m && (0..ranks.len()).find(|&n| self.of_node(ranks, n) == Some(m)) == Some(me)
            }
            _ => me != origin,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn disjoint_components_share_no_node() {
        let ranks = vec![vec![0, 1], vec![2, 3], vec![4]];
        assert_eq!(shared_node(&hosts(&["n1", "n2", "n3"]), &ranks, None), None);
    }

    #[test]
    fn a_node_in_two_components_is_named_with_them() {
        let ranks = vec![vec![0, 1], vec![2, 3], vec![4]];
        let comps = [0, 0, 1, 1, 1];
        let h = hosts(&["n1", "n2", "n1"]);
        assert_eq!(
            shared_node(&h, &ranks, Some(&comps)),
            Some(("n1".into(), "components 0 and 1".into()))
        );
        assert_eq!(
            shared_node(&h, &ranks, None),
            Some(("n1".into(), "2 components (ranks 0-1 and 4)".into()))
        );
    }

    #[test]
    fn components_are_found_by_rank_and_node() {
        let c = Components {
            own: 1,
            of_rank: Some(vec![0, 0, 1, 1, 1]),
        };
        let ranks = vec![vec![2, 3], vec![0, 1], vec![4]];
        assert_eq!(c.of(3), Some(1));
        assert_eq!(c.of(9), None);
        assert_eq!(c.of_node(&ranks, 1), Some(0));
        assert_eq!(c.of_node(&ranks, 2), Some(1));
        // Node 0 is component 1's first, node 1 component 0's only one.
        assert!(c.kills_own(&ranks, 0, 1) && !c.kills_own(&ranks, 2, 1));
        assert!(!c.kills_own(&ranks, 0, 2) && c.kills_own(&ranks, 1, 2));
        let unknown = Components {
            own: 1,
            of_rank: None,
        };
        assert!(unknown.kills_own(&ranks, 0, 1) && !unknown.kills_own(&ranks, 1, 1));
    }
}
