//! Spawned jobs (`MPI_Comm_spawn`): what a rank asks for, how the embedder answers, and the child job every node of the family learns.
//!
//! The node service does not start processes: a spawn request from a local rank (PMI-1
//! `mcmd=spawn`, PMI-2 `spawn`, PMIx `PMIx_Spawn`) becomes one family-independent
//! [`SpawnRequest`], handed to the embedder as a [`PendingSpawn`]
//! ([`crate::node::NodeService::take_spawns`]). The embedder (greedyrun through its agents)
//! places the children, tells **every** node of the overlay the resulting [`ChildJob`]
//! ([`crate::node::NodeService::add_child`]), waits until every node added it, forks the
//! children with [`crate::node::NodeService::child_env`], and only then answers the
//! requester ([`PendingSpawn::started`]): PRRTE and Hydra also answer once the children run.
//! A child is a new namespace of the parent's job family, served by the same node services
//! over the same overlay; its failure aborts the family like any rank's.

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

/// Why a spawn is refused when the embedder serves none (under srun, for now).
pub const NOT_SERVED: &str = "spawn is not served by this launcher";

/// The namespace of the `n`th job spawned in `family` (the job's own namespace): `family@n`,
/// as PRRTE names them. Open MPI 5 turns a namespace into its 32-bit job id as a 16-bit hash of
/// what comes before the last `@` and the number after it (opal/mca/pmix/base/pmix_base_fns.c
/// `opal_pmix_convert_nspace`@v5.0.8): names without `@` differ in 16 bits only, and one
/// spawned job in a few hundred took an earlier one's id (its ranks then reached for a gone
/// process's address); `family@n` gives every child of the family its own id for the first
/// 65,535. `n` counts from 1 (0 is the family's own id).
pub fn nspace(family: &str, n: u32) -> String {
    format!("{family}@{n}")
}

/// What a local rank asked to start, whatever family it spoke.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnRequest {
    /// The requester's namespace (the parent job, or a child that spawns again).
    pub parent: String,
    /// The requester's rank in it.
    pub requester: u32,
    /// The family the requester spoke: an embedder may serve spawn to some families only.
    pub family: crate::family::Family,
    /// The programs, in the order given (`MPI_Comm_spawn_multiple`'s commands): the appnum.
    pub apps: Vec<SpawnApp>,
    /// Key/values the children find in their own KVS at start (PMI's preput: MPICH's
    /// `PARENT_ROOT_PORT_NAME`).
    pub preput: Vec<(String, String)>,
}

impl SpawnRequest {
    /// How many processes the request asks for in all.
    pub fn total_procs(&self) -> u64 {
        self.apps.iter().map(|a| u64::from(a.maxprocs)).sum()
    }
}

/// One program of a spawn request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnApp {
    /// The program as the client named it (looked up in `path`, then `PATH`, on the host).
    pub program: String,
    /// Its arguments, without the program.
    pub args: Vec<String>,
    /// How many copies.
    pub maxprocs: u32,
    /// Variables its processes get on top of the job's (Open MPI: `OMPI_PARENT_PORT`,
    /// `OMPI_MCA_*`).
    pub env: Vec<(String, String)>,
    /// Its working directory (`wdir`, `PMIX_WDIR`), else the job's.
    pub cwd: Option<String>,
    /// The hosts it may run on (`host`/`hosts` info, `PMIX_HOST`), empty for any of the
    /// job's.
    pub hosts: Vec<String>,
    /// Where to look for the program first (MPICH's `path` info).
    pub path: Option<String>,
}

/// Where a job that another job spawned came from, when it is served as a job of its own
/// rather than beside its parent (a nested step under srun): what its ranks are told as a
/// child's are ([`ChildJob`]'s preput keys and appnums, PMI-2 `spawner-jobid`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnOrigin {
    /// The namespace that asked for it.
    pub spawner: String,
    /// Key/values seeded into its KVS before any of its ranks starts.
    pub preput: Vec<(String, String)>,
    /// The first rank of each of its programs (its appnums); `[0]` for one program.
    pub app_starts: Vec<u32>,
}

/// A spawned job as every node of the family learns it (the same value on every node).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildJob {
    /// Its namespace: PMI kvsname and jobid, PMIx nspace ([`nspace`]).
    pub nspace: String,
    /// The namespace that asked for it.
    pub parent: String,
    /// The rank of `parent` that asked.
    pub requester: u32,
    /// `ranks[n]`: its ranks on overlay node `n`, ascending (empty where it has none).
    pub ranks: Vec<Vec<u32>>,
    /// Its programs in rank order: app `i` (its appnum) runs ranks from `apps[i].first_rank`
    /// up to the next app's.
    pub apps: Vec<ChildApp>,
    /// Key/values seeded into its KVS before any of its ranks starts.
    pub preput: Vec<(String, String)>,
}

/// One program of a child job and the ranks that run it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildApp {
    /// Its first rank.
    pub first_rank: u32,
    /// The program (as it will be exec'd) and its arguments.
    pub argv: Vec<String>,
    /// Variables on top of the job's.
    pub env: Vec<(String, String)>,
    /// Its working directory, else the job's.
    pub cwd: Option<String>,
}

impl ChildJob {
    /// The child `nspace` for `request`, placed as `ranks` (by overlay node); an app's `path`
    /// goes in front of `inherited_path` in its `PATH`.
    pub fn new(
        nspace: String,
        request: &SpawnRequest,
        ranks: Vec<Vec<u32>>,
        inherited_path: Option<&str>,
    ) -> ChildJob {
        let mut first_rank = 0;
        let apps = (request.apps.iter())
            .map(|a| {
                let mut env = a.env.clone();
                if let Some(dir) = &a.path {
                    let rest = inherited_path.map_or(String::new(), |p| format!(":{p}"));
                    env.push(("PATH".into(), format!("{dir}{rest}")));
                }
                let argv = std::iter::once(&a.program)
                    .chain(&a.args)
                    .cloned()
                    .collect();
                let app = ChildApp {
                    first_rank,
                    argv,
                    env,
                    cwd: a.cwd.clone(),
                };
                first_rank += a.maxprocs;
                app
            })
            .collect();
        ChildJob {
            nspace,
            parent: request.parent.clone(),
            requester: request.requester,
            ranks,
            apps,
            preput: request.preput.clone(),
        }
    }

    /// How many ranks it has.
    pub fn n_ranks(&self) -> u32 {
        self.ranks.iter().map(|r| r.len() as u32).sum()
    }

    /// The app `rank` runs and its number (appnum); `None` for a rank past the job's, or a
    /// job without apps.
    pub fn app_of(&self, rank: u32) -> Option<(usize, &ChildApp)> {
        if rank >= self.n_ranks() {
            return None;
        }
        let i = self.apps.partition_point(|a| a.first_rank <= rank);
        let i = i.checked_sub(1)?;
        Some((i, &self.apps[i]))
    }
}

/// A spawn a local rank waits on: answer it exactly once. Dropped unanswered, the rank is
/// told the launcher went away.
#[derive(Debug)]
pub struct PendingSpawn {
    /// What was asked.
    pub request: SpawnRequest,
    reply: oneshot::Sender<Result<String, String>>,
}

impl PendingSpawn {
    /// Every child of namespace `nspace` runs (it was added on every node first).
    pub fn started(self, nspace: String) {
        let _ = self.reply.send(Ok(nspace));
    }

    /// Nothing was started, because of `why` (for the requester's error and the log).
    pub fn refused(self, why: String) {
        let _ = self.reply.send(Err(why));
    }
}

/// The servers' way to the embedder's spawner; refuses every request until the embedder
/// takes the queue ([`Spawns::take`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Spawns {
    queue: std::sync::Arc<std::sync::Mutex<Queue>>,
}

#[derive(Debug, Default)]
struct Queue {
    tx: Option<mpsc::Sender<PendingSpawn>>,
    taken: bool,
}

/// Spawn requests queued for the embedder at most (each waits for one answer).
const QUEUE: usize = 64;

impl Spawns {
    /// The embedder's end of the queue, once; `None` after the first call.
    pub(crate) fn take(&self) -> Option<mpsc::Receiver<PendingSpawn>> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.taken {
            return None;
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        q.tx = Some(tx);
        q.taken = true;
        Some(rx)
    }

    /// Asks the embedder to start `request`: the child's namespace once every child runs,
    /// else why not.
    pub(crate) async fn ask(&self, request: SpawnRequest) -> Result<String, String> {
        let tx = self
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .tx
            .clone();
        let Some(tx) = tx else {
            return Err(NOT_SERVED.into());
        };
        let (reply, answer) = oneshot::channel();
        if tx.send(PendingSpawn { request, reply }).await.is_err() {
            return Err("the launcher no longer serves spawns".into());
        }
        answer
            .await
            .unwrap_or_else(|_| Err("the launcher went away before answering".into()))
    }
}

#[cfg(test)]
mod tests {
    /// Open MPI 5's job id of a namespace (opal_pmix_convert_nspace@v5.0.8, its hash
    /// `OPAL_HASH_STR` being Bob Jenkins' one-at-a-time).
    fn ompi5_jobid(nspace: &str) -> u32 {
        let (family, local) = match nspace.rsplit_once('@') {
            Some((f, n)) => (f, n.parse::<u32>().unwrap_or(0)),
            None => (nspace, 0),
        };
        let mut h: u32 = 0;
        for b in family.bytes() {
            h = h.wrapping_add(u32::from(b));
            h = h.wrapping_add(h << 10);
            h ^= h >> 6;
        }
        h = h.wrapping_add(h << 3);
        h ^= h >> 11;
        h = h.wrapping_add(h << 15);
        let family16 = ((h >> 16) ^ (h & 0xffff)) & 0xffff;
        (family16 << 16) | (local & 0xffff)
    }

    #[test]
    fn a_familys_children_get_distinct_open_mpi_job_ids() {
        let family = "greedy20006.690725";
        // As Open MPI 5.0.11 printed it for that job (its port names start "517734400.0:").
        assert_eq!(ompi5_jobid(family), 517_734_400);
        let mut ids: Vec<u32> = (1..=5000)
            .map(|n| ompi5_jobid(&nspace(family, n)))
            .collect();
        ids.push(ompi5_jobid(family));
        let n = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), n);
    }
    use super::*;

    fn child() -> ChildJob {
        let app = |first_rank, p: &str| ChildApp {
            first_rank,
            argv: vec![p.into()],
            env: vec![],
            cwd: None,
        };
        ChildJob {
            nspace: "j.1".into(),
            parent: "j".into(),
            requester: 0,
            ranks: vec![vec![0, 1], vec![], vec![2]],
            apps: vec![app(0, "a"), app(2, "b")],
            preput: vec![],
        }
    }

    #[test]
    fn each_rank_runs_the_app_it_falls_in() {
        let c = child();
        assert_eq!(c.n_ranks(), 3);
        assert_eq!(
            c.app_of(1).map(|(i, a)| (i, a.argv[0].as_str())),
            Some((0, "a"))
        );
        assert_eq!(c.app_of(2).map(|(i, _)| i), Some(1));
        assert!(c.app_of(3).is_none());
    }

    #[tokio::test]
    async fn a_spawn_is_refused_until_the_embedder_serves_them_and_answered_once_it_does() {
        let spawns = Spawns::default();
        let req = SpawnRequest {
            parent: "j".into(),
            requester: 0,
            family: crate::family::Family::Pmi,
            apps: vec![],
            preput: vec![],
        };
        assert_eq!(spawns.ask(req.clone()).await, Err(NOT_SERVED.into()));
        let mut rx = spawns.take().unwrap();
        assert!(spawns.take().is_none());
        let asker = tokio::spawn({
            let spawns = spawns.clone();
            let req = req.clone();
            async move { spawns.ask(req).await }
        });
        rx.recv().await.unwrap().started("j.1".into());
        assert_eq!(asker.await.unwrap(), Ok("j.1".into()));
        let dropped = tokio::spawn(async move { spawns.ask(req).await });
        drop(rx.recv().await.unwrap());
        assert!(dropped.await.unwrap().unwrap_err().contains("went away"));
    }
}
