//! The embedded wire-up (greedy-pmix): how an agent joins the overlay, and the rendezvous.
//!
//! The overlay tree is greedy-pmix's own (`greedy(n_hosts, model)` over the job's hosts); it
//! need not match the launch tree. The only thing an agent must learn is its overlay
//! parent's address, and the launcher's pipes supply it ([`PipeRendezvous`]): an agent
//! publishes its listener address up the tree as [`Up::Address`]; greedyrun routes it down as
//! [`Cmd::Address`](crate::proto::Cmd::Address) to exactly that node's overlay children, which
//! look it up on their local board. The rest of the address book travels over the overlay.
//!
//! A job's end after an abort follows the node service's rule
//! ([`NodeService::watch_end`]); [`AgentEnd`] is greedyd's part of it: the abort goes up, and
//! greedyrun ends the job.

use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use greedy_pmix::{
    AbortInfo, JobSpec,
    charm::server::{OUTPUT_CAPACITY, Output},
    family::Family,
    names::SharedTable,
    node::{
        NodeConfig, NodeService,
        job_end::{JobEnd, Kill},
    },
    peer::JobProcesses,
    pmix::{Binding, PmixHost},
    rendezvous::{Memory, Rendezvous},
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::{
    Error,
    proto::{PmiMode, RankEnd, Start, Stream, Up},
};

/// The descriptor number a PMI rank finds its socketpair at (the first after stdio).
pub const PMI_FD: i32 = 3;

/// The families `mode` serves: every one unless the user chose (`--pmi`).
pub fn families(mode: PmiMode) -> Vec<Family> {
    match mode {
        PmiMode::None => Vec::new(),
        PmiMode::Auto => Family::ALL.to_vec(),
        PmiMode::Strict => vec![Family::Pmi],
        PmiMode::Pmix => vec![Family::Pmix],
        PmiMode::Charm => vec![Family::Charm],
    }
}

/// How a rank's end is reported: a Charm++ client exits 1 when its socket is closed after
/// `ending`, so its real code is the one it sent (research/charm-protocol.md §2).
pub fn end_of(service: &NodeService, rank: u32, end: RankEnd) -> RankEnd {
    service.charm_exit_code(rank).map_or(end, RankEnd::Exited)
}

/// Publishes up the launcher's pipes; looks up on the board that [`Cmd::Address`] fills.
///
/// [`Cmd::Address`]: crate::proto::Cmd::Address
#[derive(Debug, Clone)]
pub struct PipeRendezvous {
    /// Towards greedyrun.
    pub up: mpsc::Sender<Up>,
    /// Addresses routed down to this agent.
    pub board: Memory,
}

impl Rendezvous for PipeRendezvous {
    async fn publish(&self, node_idx: usize, addr: SocketAddr) -> Result<(), String> {
        self.up
            .send(Up::Address {
                node: node_idx as u32,
                addr,
            })
            .await
            .map_err(|_| "the parent pipe is closed".to_string())
    }

    async fn lookup(&self, node_idx: usize) -> Result<SocketAddr, String> {
        self.board.lookup(node_idx).await
    }
}

/// A session agent's one PMIx server for every job it runs on this host (libpmix allows one
/// per process), started by the first job that serves PMIx here and finalized when the agent
/// ends; cheap to clone.
#[derive(Debug, Clone)]
pub struct SharedPmix {
    /// The server's own namespace, host name and node id: the session's.
    name: String,
    hostname: String,
    nodeid: u32,
    started: Arc<tokio::sync::OnceCell<Result<(PmixHost, PathBuf), String>>>,
}

impl SharedPmix {
    /// Nothing started yet, for the session agent started by `start`.
    pub fn new(start: &Start) -> SharedPmix {
        let node = start.node_idx;
        SharedPmix {
            name: format!("greedy-{}", start.job_id),
            hostname: start.hosts.get(node as usize).cloned().unwrap_or_default(),
            nodeid: node,
            started: Arc::default(),
        }
    }

    /// The server, started now with `config`'s settings (in a fresh private directory under
    /// its scratch directory) if no job started it before.
    async fn host(&self, config: &NodeConfig) -> Result<PmixHost, String> {
        let started = self.started.get_or_init(|| async {
            let dir = greedy_pmix::pmix::private_dir(&config.scratch, "greedy-pmix.")
                .map_err(|e| format!("creating the PMIx directory: {e}"))?;
            let host_config = config.pmix.shared_host_config(
                dir.clone(),
                self.hostname.clone(),
                self.nodeid,
                self.name.clone(),
            );
            PmixHost::start(host_config)
                .map(|h| (h, dir.clone()))
                .map_err(|e| {
                    let _ = std::fs::remove_dir_all(&dir);
                    e.to_string()
                })
        });
        started.await.clone().map(|(host, _)| host)
    }

    /// Finalizes the server, if a job started it, and removes its directory. The agent is
    /// ending: a finalize that takes more than 2 s is left behind rather than delaying its bye.
    pub async fn shutdown(&self) {
        if let Some(Ok((host, dir))) = self.started.get() {
            host.shutdown_within(Duration::from_secs(2)).await;
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The greedy-pmix job description of this agent.
pub fn job_spec(start: &Start) -> Result<JobSpec, Error> {
    Ok(JobSpec {
        job_id: start.job_id.clone(),
        hosts: start.hosts.clone(),
        node_idx: start.node_idx as usize,
        model: start.model,
        ranks: start.ranks.clone(),
        secret: start.secret.clone(),
    })
}

/// Starts this node's wire-up service (the families of `start.pmi`) and returns while it joins
/// the overlay in the background; the ranks can be forked at once. `bound` says where each
/// local rank is bound (PMIx tells the ranks). A session's job (`session`) is served on the
/// host's one PMIx server, and its names are the session's.
///
/// The overlay listens on the address this host's name resolves to (it must be reachable by
/// the other hosts, so not loopback); the join is bounded by `join_timeout` (`--timeout`).
/// Netlrts clients' prints take the ranks' stdout/stderr path up the tree.
pub async fn start(
    start: &Start,
    rendezvous: PipeRendezvous,
    join_timeout: Duration,
    leave: &CancellationToken,
    bound: &BTreeMap<u32, Vec<u32>>,
    session: Option<(&SharedPmix, Arc<dyn SharedTable>)>,
) -> Result<NodeService, Error> {
    let spec = job_spec(start)?;
    let host = &start.hosts[start.node_idx as usize];
    let addrs: Vec<std::net::IpAddr> = tokio::net::lookup_host((host.as_str(), 0))
        .await
        .map_err(|source| Error::Io {
            what: format!("resolve {host} for the overlay listener"),
            source,
        })?
        .map(|a| a.ip())
        .collect();
    // Prefer an address other hosts can reach. Only-loopback is fine for a job whose hosts
    // are all this machine (tests); on a cluster it means the host maps its own name to
    // 127.0.1.1 (Debian's default), and the join timeout will name the nodes it cut off.
    let ip = addrs
        .iter()
        .find(|ip| !ip.is_loopback())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| Error::Plan(format!("{host} resolves to no address")))?;
    // Only this agent's descendants (its ranks) reach the PMIx and netlrts endpoints.
    let admit = JobProcesses::of_this_process().map_err(|source| Error::Io {
        what: "read this agent's own uid".into(),
        source,
    })?;
    let mut config = NodeConfig::new(ip, admit, &families(start.pmi))
        .map_err(|e| Error::Plan(format!("{host}: {e}")))?;
    config.overlay.join_timeout = join_timeout;
    config.pmix.binding = Binding::Known(bound.clone());
    if start.universe > 0 {
        config.set_universe(start.universe);
    }
    // MPICH ranks read the node's topology from a file rather than each probing the hardware.
    config.pmi.topology_dir = Some(config.scratch.clone());
    // Open MPI's error messages (PMIx_Log) reach greedyrun as the rank's output even when
    // the rank is killed right after (MPI_Abort).
    config.pmix_log_to_output = true;
    // greedyd exits once its job (or its session) ends: libpmix is left to the exit.
    config.pmix.leave_to_exit = true;
    // A session's job: the host's one PMIx server, and the session's name table.
    if let Some((shared, names)) = session {
        config.names = Some(names);
        if config.families.contains(&Family::Pmix) {
            let pmix = shared.host(&config).await;
            config.pmix_host = Some(pmix.map_err(|e| Error::Plan(format!("{host}: {e}")))?);
        }
    }
    let (out_tx, out_rx) = mpsc::channel::<Output>(OUTPUT_CAPACITY);
    tokio::spawn(forward_service_output(out_rx, rendezvous.up.clone()));
    Ok(NodeService::start(&spec, config, rendezvous, leave, out_tx).await?)
}

/// How a job run by greedyrun ends, for greedy-pmix's rule ([`greedy_pmix::node::job_end`]), with
/// [`EndPolicy::default()`](greedy_pmix::node::job_end::EndPolicy): every node that hears of the
/// abort sends it up ([`Up::Aborted`]); greedyrun keeps the earliest abort's code and tears the
/// job down over the launch tree.
#[derive(Debug, Clone)]
pub struct AgentEnd {
    /// This agent's node.
    pub node: u32,
    /// Towards greedyrun.
    pub up: mpsc::Sender<Up>,
}

impl JobEnd for AgentEnd {
    /// Sends the abort up from every node (greedyrun keeps one): the first to reach greedyrun
    /// ends the job, whichever node it came from. A rank that aborted sends it up too before
    /// its exit (the agent's `RankEnding`).
    async fn aborted(&self, abort: &AbortInfo, _service: &NodeService) {
        warn!("wire-up aborted: {abort}");
        let (node, abort) = (self.node, abort.clone());
        let _ = self.up.send(Up::Aborted { node, abort }).await;
    }

    /// Nothing more: [`JobEnd::aborted`] sent the abort up on this node already, and
    /// greedyrun takes its code from the abort itself.
    async fn report(&self, _code: i32, _abort: &AbortInfo) {}

    /// Nothing on the agent: the kill is greedyrun's teardown, which it starts when the abort
    /// reaches it (`Teardown` down the launch tree; each agent TERMs, then KILLs, its ranks'
    /// process groups).
    fn kill(&self, _why: Kill) {}

    /// Never resolves (and the default policy never asks): greedyrun routes every node's
    /// frames, so an abort from any node reaches it and its teardown reaches every agent,
    /// joined or not; a node has nothing to learn of the job's end from it.
    async fn hear_end(&self) -> Result<AbortInfo, String> {
        std::future::pending().await
    }
}

/// Sends netlrts clients' prints and PMIx ranks' logged messages up the tree as the ranks'
/// own output.
async fn forward_service_output(mut out_rx: mpsc::Receiver<Output>, up: mpsc::Sender<Up>) {
    while let Some(o) = out_rx.recv().await {
        // The rank's own stdio pipes carry its end of output already.
        if o.is_end() {
            continue;
        }
        let stream = if o.stderr {
            Stream::Stderr
        } else {
            Stream::Stdout
        };
        let msg = Up::Output {
            rank: o.rank,
            stream,
            data: o.data,
        };
        if up.send(msg).await.is_err() {
            break;
        }
    }
}
