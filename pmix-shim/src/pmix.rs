//! The PMIx server for the ranks of one node (Open MPI, MPICH-on-PMIx): job info, fences and direct modex over the overlay.
//!
//! Two levels (`pmix/host.rs`): a process has one libpmix server, a
//! [`PmixHost`], which may host several namespaces (a job and the jobs it spawns are served by
//! the same node services); a [`PmixServer`] is one namespace on it, holding what is the
//! namespace's (its [`NamespaceSpec`] and overlay, job info, local ranks, fences, direct modex,
//! aborts, names). The host routes every upcall by namespace to the `PmixServer` that
//! registered it.
//!
//! A namespace may hold ranks on some of its overlay's nodes only ([`crate::namespace`]): it is
//! registered on the others too, with no local process (libpmix answers its job-level keys
//! there and sends proc-level gets up as direct modex); its maps list its own nodes only; all
//! its fences, the whole-namespace one included, are subset collectives over its nodes.
//!
//! Flow: [`PmixServer::start`] initialises a host for the job (the embedders' one job per
//! process; it is finalized with the job), or [`PmixHost::serve`] adds a namespace to a running
//! host; either registers the job's namespace with the job-level keys Open MPI 4.1/5.0 and
//! MPICH require (research/pmix-pmi.md §1, "Job-level keys"; under [`Binding::Reported`]
//! later, once every local rank has said where it runs), and starts three tasks: the fence
//! loop, the direct-modex server and the abort watcher. For each local rank the embedder calls
//! [`PmixServer::env_for`] (register the client, then `setup_fork`) and starts the rank with
//! that environment, which holds `PMIX_*` variables only, never `PMI_*` (MPICH ≥ 4.1 refuses
//! both at once). [`PmixServer::shutdown`] deregisters the namespace (libpmix drops its clients
//! and data) and leaves the other namespaces served.
//!
//! PMIx calls up on its own thread, which must never block: every callback hands its work to
//! tokio (a bounded channel for fences, a spawned task for direct modex and abort) and returns;
//! the work completes PMIx's callback from a tokio thread when done (research §1 Threading).
//!
//! - **Fence** (`fence_nb`: all local participants are in): one overlay allgather of
//!   `(participants, collect, this node's blob)`; every node checks that all nodes ran the same
//!   fence, then hands PMIx the concatenation of the blobs (PMIx unpacks them in any order).
//!   With `collect` false the blobs are empty and the allgather is a barrier. Fences are issued
//!   to the overlay one at a time, in the order PMIx reports them, so the overlay's sequence
//!   numbers match across nodes. A fence whose participants leave out whole nodes (always so
//!   for a namespace without ranks on every node), or span several namespaces, or belong to
//!   a namespace added over another's overlay (a spawned child: its fences and its parent's
//!   are not ordered alike on every node) is a subset collective gathered by node 0
//!   ([`crate::group`], `pmix/dynamic.rs`).
//! - **Spawn** (`pmix/children.rs`): `PMIx_Spawn` goes to the embedder
//!   ([`crate::child`]); each child namespace is served over the family's host and overlay.
//! - **Names, connect, disconnect** (`pmix/dynamic.rs`): publish, lookup and unpublish on
//!   node 0's table shared with PMI; connect and disconnect (within the job or across a
//!   parent and its children) as subset collectives; a namespace the host does not host is
//!   refused.
//! - **Direct modex**: a point-to-point [`Overlay::request`] to the node owning the rank (by the
//!   namespace's own map), whose overlay hands it to its server of that namespace
//!   ([`crate::served`]: several namespaces may share one overlay, a spawned child its
//!   parent's, [`PmixServer::add_namespace`]); that server
//!   answers with `PMIx_server_dmodex_request`'s blob once the rank has posted the key the
//!   client asked for (at most `KEY_WAIT`, 10 s).
//! - **Abort**: `PMIx_Abort` aborts the whole job through the overlay, naming the rank, its
//!   code and message; a rank that exits before `PMIx_Finalize` (reported by the embedder
//!   through [`PmixServer::rank_exited`]) does too. The embedder watches
//!   [`Overlay::aborted`] and kills its ranks, as with the PMI server.
//!
//! PMIx allows one server per process: one agent per process (tests run agents as separate
//! processes: `tests/openmpi.rs`, and `tests/pmix_host.rs` with a job and a namespace on two of
//! the three nodes on each agent's host).

mod children;
mod dynamic;
mod host;

pub use host::{HostConfig, PmixHost};

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    ops::ControlFlow,
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use bytes::Bytes;
/// When PMIx groups are served (a field of [`PmixConfig`]).
pub use greedy_sys::pmix::group::Groups;
use greedy_sys::pmix::{
    Proc, RANK_WILDCARD, Status,
    group::{GroupDone, GroupRequest},
    info::{InfoArray, Value, key},
    pubsub::{Datum, Directives, LookupDone, Published},
    server::{Handler, ModexDone, OpDone, Server},
    spawn::{App, SpawnDone},
};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{Instrument, debug, info_span, warn};

use crate::{
    AbortInfo, Error, JobSpec, NamespaceSpec,
    child::{ChildJob, Spawns},
    departures::Departures,
    family::{self, Family},
    frame::Service,
    overlay::Overlay,
    peer::JobProcesses,
};

/// Decides which connections to the PMIx port may reach libpmix: `admit(peer, local)`, the
/// client's address and ours. Runs where libpmix accepts (on 5.0 and later its progress
/// thread): it must be quick; a panic refuses (greedy-sys's accept gate,
/// [`greedy_sys::pmix::gate`]).
pub type Admit = greedy_sys::pmix::gate::Policy;

/// The default [`PmixConfig::admit`]: nobody. An embedder must say who its ranks are.
pub fn admit_nobody() -> Admit {
    Arc::new(|_, _| false)
}

/// A [`PmixConfig::admit`] for the job's processes ([`crate::peer::JobProcesses`]): the
/// client's socket must belong to the job's user and be open in a descendant of the embedder.
/// Keeps out every other user (whom libpmix's own uid check lets in by trusting the bytes
/// they send) and every process of the job's user outside the job.
pub fn admit_job(procs: JobProcesses) -> Admit {
    admit_trees(crate::peer::JobTrees::new(procs))
}

/// [`admit_job`] for processes of several trees, some joining later.
pub fn admit_trees(trees: crate::peer::JobTrees) -> Admit {
    Arc::new(move |peer, local| match trees.admit(peer, local) {
        Ok(_) => true,
        Err(refused) => {
            debug!("PMIx connection refused: {refused}");
            false
        }
    })
}

/// Creates a fresh directory `<parent>/<prefix><random>` with mode 0700 for an agent's PMIx
/// files ([`PmixConfig::tmpdir`]). The name is unguessable (96 random bits), so nobody can
/// plant anything at it beforehand; `mkdir` fails rather than reuse or follow anything that
/// stands there, and the result is checked to be a real directory with mode 0700.
pub fn private_dir(parent: &std::path::Path, prefix: &str) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let mut bytes = [0u8; 12];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
    let suffix: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let dir = parent.join(format!("{prefix}{suffix}"));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    // The umask may have taken bits away, never added any; set exactly 0700.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    // In a sticky /tmp nobody else can rename or replace what we created; check anyway.
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.permissions().mode() & 0o7777 != 0o700 {
        return Err(std::io::Error::other(format!(
            "{}: not a private directory of ours after creating it",
            dir.display()
        )));
    }
    Ok(dir)
}

/// Settings of the PMIx server.
#[derive(Clone)]
pub struct PmixConfig {
    /// This agent's own directory for PMIx rendezvous files and the job's session directories
    /// (`PMIX_SERVER_TMPDIR`, `PMIX_TMPDIR`, `PMIX_NSDIR`); created if missing. Must differ
    /// between agents on one machine: Open MPI names its shared-memory files after the node's
    /// local ranks there.
    pub tmpdir: PathBuf,
    /// How long PMIx may take to confirm a namespace or client registration.
    pub register_timeout: Duration,
    /// How long [`PmixServer::shutdown`] waits for `PMIx_server_finalize`.
    pub finalize_timeout: Duration,
    /// The process exits once the job ends (greedyd): the server is left to the exit, neither
    /// deregistering the namespace nor finalized ([`HostConfig::leave_to_exit`]).
    pub leave_to_exit: bool,
    /// How long an exit before `PMIx_Finalize` waits before it aborts the job, so that a
    /// cause already on its way wins: when one rank calls `MPI_Abort` and exits, its peers
    /// often die of SIGPIPE on the broken TCP links before the abort reaches their nodes.
    pub exit_grace: Duration,
    /// The uid and gid the local ranks run as, when not this process's (slurmstepd runs as
    /// root, the ranks as the job's user): PMIx accepts their connections only when registered
    /// with it, and they need to write in `tmpdir`, which is handed to them. `tmpdir` must
    /// then be a fresh directory this process created (a path the ranks' user could have
    /// planted would let them redirect the `chown`).
    pub owner: Option<(u32, u32)>,
    /// Which connections reach libpmix at all (the accept gate, checked before libpmix reads
    /// a byte): a connection libpmix accepts has passed this policy. The default,
    /// [`admit_nobody`], fails closed; embedders pass one that admits their ranks' sockets
    /// only. libpmix cannot tell a stranger from a rank itself (research/endpoint-security.md
    /// §2), and one silent stranger would freeze it.
    pub admit: Admit,
    /// Where the CPUs each local rank is bound to come from, told to the ranks as their
    /// `PMIX_LOCALITY_STRING` and `PMIX_CPUSET`.
    pub binding: Binding,
    /// How many processes the job and those it spawns may have in all (the launcher's slots:
    /// `PMIX_UNIVERSE_SIZE`, `PMIX_MAX_PROCS`, what `MPI_UNIVERSE_SIZE` says); `None` or fewer
    /// than a namespace's ranks: its ranks.
    pub universe: Option<u32>,
    /// When PMIx groups are served ([`Groups`]).
    pub groups: Groups,
}

/// Where the local ranks' CPU bindings come from.
#[derive(Debug, Clone)]
pub enum Binding {
    /// Known before the ranks start, since the embedder binds them itself: rank → the
    /// operating system's CPU numbers; a rank not named runs unbound. The namespace is
    /// registered before [`PmixServer::start`] returns.
    Known(BTreeMap<u32, Vec<u32>>),
    /// Learnt as each local rank starts ([`PmixServer::rank_started`]): Slurm binds a task
    /// after the MPI plugin's prefork. The namespace is registered once every local rank has
    /// been reported (at most `register_timeout` after the start; later ones then count as
    /// unbound); the embedder reports a rank that exits first as started unbound, as
    /// [`crate::node::NodeService::rank_exited`] does. A client reads its job's data as soon
    /// as it connects, so the embedder holds each rank before its exec until
    /// [`PmixServer::registered`] (the accept gate cannot hold it: from libpmix 5 on,
    /// `accept` runs on the progress thread that the registration needs).
    Reported,
}

impl std::fmt::Debug for PmixConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PmixConfig")
            .field("tmpdir", &self.tmpdir)
            .field("register_timeout", &self.register_timeout)
            .field("finalize_timeout", &self.finalize_timeout)
            .field("leave_to_exit", &self.leave_to_exit)
            .field("exit_grace", &self.exit_grace)
            .field("owner", &self.owner)
            .field("binding", &self.binding)
            .finish_non_exhaustive()
    }
}

impl PmixConfig {
    /// Defaults with `tmpdir` as the agent's directory; admits no connection until
    /// [`PmixConfig::admit`] is set.
    pub fn new(tmpdir: PathBuf) -> Self {
        PmixConfig {
            tmpdir,
            register_timeout: Duration::from_secs(30),
            finalize_timeout: Duration::from_secs(10),
            leave_to_exit: false,
            exit_grace: Duration::from_millis(500),
            owner: None,
            admit: admit_nobody(),
            binding: Binding::Known(BTreeMap::new()),
            universe: None,
            groups: Groups::default(),
        }
    }

    /// The settings of the process's server when `job` is the first namespace it hosts
    /// (host name, node id and the server's own namespace from `job`).
    pub fn host_config(&self, job: &JobSpec) -> HostConfig {
        let me = job.node_idx;
        self.shared_host_config(
            self.tmpdir.clone(),
            job.hosts.get(me).cloned().unwrap_or_default(),
            me as u32,
            format!("greedy-{}", job.job_id),
        )
    }

    /// The settings of a server this process runs for several jobs (a session's agent), in
    /// `tmpdir`, on host `hostname` (node `nodeid` of the session), named `server_nspace`.
    pub fn shared_host_config(
        &self,
        tmpdir: PathBuf,
        hostname: String,
        nodeid: u32,
        server_nspace: String,
    ) -> HostConfig {
        HostConfig {
            tmpdir,
            hostname,
            nodeid,
            server_nspace,
            owner: self.owner,
            admit: self.admit.clone(),
            finalize_timeout: self.finalize_timeout,
            leave_to_exit: self.leave_to_exit,
            groups: self.groups,
        }
    }

    /// The settings of one namespace.
    pub fn namespace_config(&self) -> NamespaceConfig {
        NamespaceConfig {
            register_timeout: self.register_timeout,
            exit_grace: self.exit_grace,
            binding: self.binding.clone(),
            universe: self.universe,
            log_output: None,
        }
    }
}

/// Settings of one namespace hosted by a [`PmixHost`] (those of the process are in
/// [`HostConfig`]).
#[derive(Debug, Clone)]
pub struct NamespaceConfig {
    /// As [`PmixConfig::register_timeout`].
    pub register_timeout: Duration,
    /// As [`PmixConfig::exit_grace`].
    pub exit_grace: Duration,
    /// As [`PmixConfig::binding`].
    pub binding: Binding,
    /// As [`PmixConfig::universe`].
    pub universe: Option<u32>,
    /// Where a rank's logged messages for its standard error go as its own output (Open MPI's
    /// error messages, `PMIx_Log`); `None`: declined, and the rank prints them itself. Only the
    /// job's own ranks' (a spawned child's ranks are numbered apart from the job's).
    pub log_output: Option<mpsc::Sender<crate::charm::server::Output>>,
}

/// Variables that make Open MPI 4.1 accept a PMIx direct launch (an empty value is replaced by
/// the job id).
///
/// Open MPI 4.1 decides how it was started in its schizo framework before it looks at PMIx:
/// only Slurm (`SLURM_NODELIST` + `SLURM_STEP_ID`), Flux (`FLUX_JOB_ID`), JSM, or an `orted`
/// (`OMPI_MCA_orte_local_daemon_uri`) count as a launcher; otherwise schizo/orte declares the
/// process an unmanaged singleton and forces `ess=singleton`, overriding `OMPI_MCA_ess`
/// (orte/mca/schizo/{orte,flux,slurm}/*.c@v4.1.4; measured: every rank ran as "rank 0 of 1").
/// We present as Flux: schizo/flux declares a direct launch (`ess=pmi`, no self-binding) and
/// touches nothing else; a fake Slurm step would make Slurm-aware code in the ranks act, and
/// a fake orted URI would make them dial it. Open MPI's pmix/flux component (a client of
/// Flux's own PMI library) loses to ext3x, which PMIX_NAMESPACE selects at priority 100
/// (measured). Open MPI 5 (no schizo in the ranks) and MPICH ignore the variable. Forcing
/// `OMPI_MCA_pmix=ext3x` instead is not an option: Open MPI 5 refuses the unknown component.
const OPEN_MPI_4_DIRECT_LAUNCH: &[(&str, &str)] = &[("FLUX_JOB_ID", "")];

/// The job-data store the ranks' PMIx clients use: `hash`, each client's own copy sent by the
/// server, rather than the first of the `ds21,ds12,hash` list `PMIx_server_setup_fork` offers.
///
/// A client that picks ds21 makes the server create that job's shared-memory store on the
/// node: two 4 MiB segments (`NS_META_SEG_SIZE`, `NS_DATA_SEG_SIZE`, src/mca/common/dstore/
/// dstore_base.h@v4.2.2) that it memsets whole (dstore_segment.c), 8 MiB resident in the
/// server and in every rank, whatever the job's size. The server keeps its own copy in hash
/// either way. A hash client holds the job's data itself, which costs less than the segments
/// until a node runs dozens of ranks of a job of thousands; Open MPI 4.1 and 5 and Intel MPI
/// start as fast with it (8 local ranks: the same within noise, docs/benchmarks.md).
const CLIENT_STORE: (&str, &str) = ("PMIX_GDS_MODULE", "hash");

/// How long a `PMIx_Abort` waits for this node to have taken the abort before it returns.
const ABORT_ON_ITS_WAY: Duration = Duration::from_secs(1);

/// Capacity of the queue from PMIx's thread to the fence loop. A job's ranks block in one
/// fence at a time, so one or two are ever queued; a full queue means a runaway client and
/// the fence is refused (`PMIX_ERR_OUT_OF_RESOURCE`) rather than blocking PMIx's thread.
const FENCE_QUEUE: usize = 64;

/// A fence PMIx handed up, waiting for the overlay.
struct FenceReq {
    procs: Vec<Proc>,
    collect: bool,
    data: Vec<u8>,
    done: ModexDone,
}

/// What each node contributes to a fence's allgather.
#[derive(Serialize, Deserialize)]
struct FenceBlob {
    /// The participants (sorted by PMIx), to check every node ran the same fence.
    procs: Vec<(String, u32)>,
    collect: bool,
    data: Bytes,
}

/// A direct-modex request sent to the node owning the rank.
#[derive(Serialize, Deserialize)]
struct DmodexReq {
    nspace: String,
    rank: u32,
    /// The key the asking client needs (`PMIX_REQUIRED_KEY`), if PMIx named one.
    key: Option<String>,
}

/// The overlay request body asking `proc_`'s node for its data (and for `key` to be posted).
pub fn encode_dmodex_request(proc_: &Proc, key: Option<String>) -> Result<Bytes, String> {
    postcard::to_stdvec(&DmodexReq {
        nspace: proc_.nspace.clone(),
        rank: proc_.rank,
        key,
    })
    .map(Bytes::from)
    .map_err(|e| e.to_string())
}

/// The namespace a direct-modex request body names (for [`crate::served`]'s routing).
fn dmodex_nspace(body: &[u8]) -> Result<String, String> {
    postcard::from_bytes::<DmodexReq>(body)
        .map(|r| r.nspace)
        .map_err(|e| format!("bad dmodex request: {e}"))
}

/// Most direct-modex requests waiting for one namespace's server on this node (beyond, they
/// are refused at once, naming the namespace).
const DMODEX_QUEUE: usize = 1024;

/// What a remote node's direct-modex request asks for (its bytes are untrusted until here): a
/// rank of this node and the key its client needs. The error is the reply to the asker.
pub fn decode_dmodex_request(job: &JobSpec, body: &[u8]) -> Result<(Proc, Option<String>), String> {
    let asked =
        postcard::from_bytes::<DmodexReq>(body).map_err(|e| format!("bad dmodex request: {e}"))?;
    if asked.nspace != job.job_id || !job.local_ranks().contains(&asked.rank) {
        return Err(format!(
            "node {}: rank {} of {:?} is not here",
            job.node_idx, asked.rank, asked.nspace
        ));
    }
    let proc_ = Proc {
        nspace: asked.nspace,
        rank: asked.rank,
    };
    Ok((proc_, asked.key))
}

/// How long the owning node holds a direct-modex answer for a key its rank has not posted
/// yet. A rank may commit more than once: Open MPI 4.1 commits during its runtime set-up and
/// again after opening its transports, and PMIx answers a direct modex from the first commit
/// on. A peer fast enough to ask in between would get a blob without the transport keys and
/// fail `MPI_Init` with "Not found"; holding the answer until the key is posted closes that
/// race. A key that never comes is answered (as missing) after this bound.
const KEY_WAIT: Duration = Duration::from_secs(10);

/// How often the owning node looks for a key it is holding an answer for (at most).
const KEY_POLL: Duration = Duration::from_millis(20);

/// One completed fence as this node saw it (for benchmarks and diagnostics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceRecord {
    /// The client's `PMIX_COLLECT_DATA`.
    pub collect: bool,
    /// This node's blob (the local ranks' committed data, PMIx-packed).
    pub local_bytes: usize,
    /// The concatenation handed back to PMIx (every node's blob).
    pub total_bytes: usize,
    /// From the upcall (all local ranks in) to the result (every node's blob here).
    pub elapsed: Duration,
}

/// Direct-modex requests this node served and made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DmodexCounts {
    /// Requests for a remote rank's data sent to its node.
    pub asked: u64,
    /// Requests from other nodes answered for a local rank.
    pub answered: u64,
}

/// PMIx name-service and subset operations this node carried out successfully for its ranks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DynamicCounts {
    /// `PMIx_Publish` calls.
    pub published: u64,
    /// `PMIx_Lookup` calls answered with data.
    pub looked_up: u64,
    /// `PMIx_Unpublish` calls.
    pub unpublished: u64,
    /// `PMIx_Connect` calls (this node's part, once all local participants are in).
    pub connected: u64,
    /// `PMIx_Disconnect` calls (likewise).
    pub disconnected: u64,
    /// Fences over a subset of the nodes.
    pub subset_fences: u64,
    /// `PMIx_Group_construct` calls completed (counted once per node).
    pub groups_constructed: u64,
    /// `PMIx_Group_destruct` calls completed (likewise).
    pub groups_destructed: u64,
}

/// Per-node facts the callbacks update.
#[derive(Debug, Default)]
struct State {
    fence_log: Vec<FenceRecord>,
    dmodex: DmodexCounts,
    finalized: HashSet<u32>,
    /// Ranks that called `PMIx_Abort`: their abort is under way, their exit adds nothing.
    aborting: HashSet<u32>,
    exited: HashMap<u32, i32>,
    registered: HashSet<u32>,
    /// Ranks whose connection handshake libpmix completed (`client_connected`).
    connected: HashSet<u32>,
    fences: u64,
    dynamic: DynamicCounts,
    /// How many subset collectives of each (operation, participants) this node ran: the
    /// sequence number naming the next one ([`crate::group`]).
    group_seq: HashMap<(crate::group::GroupOp, Vec<(String, u32)>), u64>,
}

impl State {
    /// A local rank registered with libpmix that may have died during its connection
    /// handshake: it never completed one, and it ended by a signal (`128+n`), or its end is
    /// not known yet; with how it ended. A client that exits on its own is not inside
    /// `PMIx_Init`'s handshake, so a plain exit (a program that is no PMIx client) is safe.
    fn cut_off_connecting(&self) -> Option<(u32, String)> {
        let unsafe_end = |rank: &u32| match self.exited.get(rank) {
            None => Some("its end not known".to_string()),
            Some(&code) if code >= 128 => Some(format!("code {code}")),
            Some(_) => None,
        };
        (self.registered.iter())
            .filter(|r| !self.connected.contains(r))
            .find_map(|r| unsafe_end(r).map(|end| (*r, end)))
    }
}

/// The bindings of [`Binding::Reported`] as they come in.
#[derive(Debug, Default)]
struct Started {
    /// Local ranks that have neither started nor exited.
    missing: HashSet<u32>,
    bound: BTreeMap<u32, Vec<u32>>,
    /// Told when `missing` empties (none under [`Binding::Known`]).
    all_in: Option<oneshot::Sender<()>>,
}

impl Started {
    /// Nothing to wait for under [`Binding::Known`]; under [`Binding::Reported`], every local
    /// rank, and the receiver told when the last one is in.
    fn new(job: &JobSpec, binding: &Binding) -> (Started, Option<oneshot::Receiver<()>>) {
        match binding {
            // A node without ranks of the namespace has nothing to wait for.
            Binding::Known(_) => (Started::default(), None),
            Binding::Reported if job.local_ranks().is_empty() => (Started::default(), None),
            Binding::Reported => {
                let (tx, rx) = oneshot::channel();
                let started = Started {
                    missing: job.local_ranks().iter().copied().collect(),
                    bound: BTreeMap::new(),
                    all_in: Some(tx),
                };
                (started, Some(rx))
            }
        }
    }
}

/// Checks that the job id fits a PMIx namespace and creates the namespace's directory under
/// `config.tmpdir`, both given to `config.owner` if set.
fn namespace_dir(job: &JobSpec, config: &HostConfig) -> Result<PathBuf, Error> {
    let me = job.node_idx;
    if job.job_id.len() > greedy_sys::pmix::MAX_NSLEN {
        return Err(Error::InvalidJob {
            job: job.job_id.clone(),
            reason: format!(
                "a PMIx namespace holds at most {} bytes",
                greedy_sys::pmix::MAX_NSLEN
            ),
        });
    }
    let nsdir = config.tmpdir.join(format!("ns-{}", job.job_id));
    let dirs_failed = |source| Error::Io {
        node: me,
        what: "creating the PMIx directories",
        source,
    };
    std::fs::create_dir_all(&nsdir).map_err(dirs_failed)?;
    if let Some((uid, gid)) = config.owner {
        // Inner first: until `tmpdir` is theirs, the ranks' user cannot touch what is in it.
        for dir in [&nsdir, &config.tmpdir] {
            std::os::unix::fs::chown(dir, Some(uid), Some(gid)).map_err(dirs_failed)?;
        }
    }
    Ok(nsdir)
}

/// What PMIx's callbacks reach (no `Server` inside: the server owns the handler).
struct Bridge {
    job: Arc<JobSpec>,
    overlay: Overlay,
    runtime: tokio::runtime::Handle,
    state: Arc<Mutex<State>>,
    departures: Departures,
    spawns: Spawns,
    /// As [`Shared::own_overlay`].
    own_overlay: bool,
    /// Whether the namespace is a spawned child ([`Shared::child`]).
    spawned: bool,
    fences: mpsc::Sender<FenceReq>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    /// As [`NamespaceConfig::log_output`].
    log_output: Option<mpsc::Sender<crate::charm::server::Output>>,
}

/// What a namespace shares with the rest of its family on this node.
#[derive(Default)]
struct Ties {
    departures: Departures,
    spawns: Spawns,
    child: Option<Arc<ChildJob>>,
    /// Served over another namespace's overlay ([`PmixServer::add_namespace`]).
    shares_overlay: bool,
    /// The family's processes on this node besides this namespace's (a child's parent and
    /// earlier children): with its own, whether the node is oversubscribed.
    neighbours: usize,
}

impl Ties {
    /// A job's own namespace's ties: the node's record of who spoke what and its spawner.
    fn family(departures: Departures, spawns: Spawns) -> Ties {
        Ties {
            departures,
            spawns,
            ..Ties::default()
        }
    }
}

fn lock_children(shared: &Shared) -> MutexGuard<'_, HashMap<String, PmixServer>> {
    shared.children.lock().unwrap_or_else(|p| p.into_inner())
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // The state is a few sets; a panic elsewhere cannot leave it worse than stopping would.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl Bridge {
    /// Aborts the job on the overlay; `done`, if given, completes once this node has the
    /// abort on its way (at most [`ABORT_ON_ITS_WAY`] later).
    fn abort_job(&self, rank: Option<u32>, code: i32, reason: String, done: Option<OpDone>) {
        let overlay = self.overlay.clone();
        warn!(?rank, code, "aborting job: {reason}");
        let info = AbortInfo::new(self.job.node_idx, rank, code, reason);
        self.tracker.spawn_on(
            async move {
                let mut aborted = overlay.aborted();
                overlay.abort(info).await;
                if let Some(done) = done {
                    let _ =
                        tokio::time::timeout(ABORT_ON_ITS_WAY, aborted.wait_for(Option::is_some))
                            .await;
                    done.complete(Status::SUCCESS);
                }
            },
            &self.runtime,
        );
    }
}

impl Handler for Bridge {
    fn client_connected(&self, proc_: Proc) {
        debug!(nspace = %proc_.nspace, rank = proc_.rank, "PMIx client connected");
        if proc_.nspace != self.job.job_id {
            return;
        }
        lock(&self.state).connected.insert(proc_.rank);
        let gone = self.departures.spoke(proc_.rank, Family::Pmix);
        if let Some((gone, reason)) = gone {
            self.abort_job(Some(gone), 1, reason, None);
        }
    }

    /// A message for the rank's standard error goes out as the rank's own output, ahead of
    /// anything the rank does next (Open MPI logs its `MPI_Abort` message just before it
    /// aborts, and would print it only once the log is declined, racing the kill).
    fn log(&self, proc_: Proc, stderr: Option<String>, done: OpDone) {
        let (Some(out), Some(mut text)) = (self.log_output.clone(), stderr) else {
            return greedy_sys::pmix::server::decline_log(done);
        };
        if text.is_empty() || proc_.nspace != self.job.job_id {
            return greedy_sys::pmix::server::decline_log(done);
        }
        if !text.ends_with('\n') {
            text.push('\n');
        }
        let output = crate::charm::server::Output {
            rank: proc_.rank,
            stderr: true,
            data: bytes::Bytes::from(text),
        };
        self.tracker.spawn_on(
            async move {
                let status = match out.send(output).await {
                    Ok(()) => Status::SUCCESS,
                    Err(_) => Status::NOT_SUPPORTED,
                };
                done.complete(status);
            },
            &self.runtime,
        );
    }

    fn client_finalized(&self, proc_: Proc, done: OpDone) {
        if proc_.nspace == self.job.job_id {
            lock(&self.state).finalized.insert(proc_.rank);
        }
        done.complete(Status::SUCCESS);
    }

    fn abort(
        &self,
        proc_: Proc,
        status: i32,
        msg: String,
        targets: Option<Vec<Proc>>,
        done: OpDone,
    ) {
        // A subset abort (targets) still aborts the whole job: ranks of an MPI job cannot
        // outlive the ones they talk to, and Slurm's plugin does the same (kills the step).
        let scope = match &targets {
            Some(t) if !t.is_empty() => format!(" (asked for {} processes)", t.len()),
            _ => String::new(),
        };
        // A spawned namespace's rank is named with its namespace (its ranks count from 0 too).
        let spawned = match self.spawned {
            true => format!(" of spawned namespace {}", proc_.nspace),
            false => String::new(),
        };
        let reason = format!(
            "node {} rank {}{spawned} called PMIx_Abort (code {status}){scope}: {msg:?}",
            self.job.node_idx, proc_.rank
        );
        lock(&self.state).aborting.insert(proc_.rank);
        // The caller exits once PMIx_Abort returns, and its peers, seeing their links to it
        // break, may abort in turn: answer only once this node has the abort on its way, so
        // that the first cause is the one the job ends with.
        self.abort_job(Some(proc_.rank), status, reason, Some(done));
    }

    fn fence(&self, procs: Vec<Proc>, collect: bool, data: Vec<u8>, done: ModexDone) {
        // Fences over some of the nodes are not overlay collectives (they need not be issued
        // in the same order on every node): node 0 gathers them, concurrently.
        if !self.own_overlay || !spans_every_node(&self.job, &procs) {
            return self.subset_fence(procs, collect, data, done);
        }
        let req = FenceReq {
            procs,
            collect,
            data,
            done,
        };
        if let Err(e) = self.fences.try_send(req) {
            let req = match e {
                mpsc::error::TrySendError::Full(r) | mpsc::error::TrySendError::Closed(r) => r,
            };
            warn!("fence refused: fence queue full or server stopping");
            req.done.complete(Status::OUT_OF_RESOURCE, Vec::new());
        }
    }

    fn direct_modex(&self, proc_: Proc, key: Option<String>, done: ModexDone) {
        let node = (proc_.nspace == self.job.job_id)
            .then(|| self.job.node_of_rank(proc_.rank))
            .flatten();
        let Some(node) = node else {
            done.complete(Status::NOT_FOUND, Vec::new());
            return;
        };
        let overlay = self.overlay.clone();
        let shutdown = self.shutdown.clone();
        let rank = proc_.rank;
        lock(&self.state).dmodex.asked += 1;
        let body = encode_dmodex_request(&proc_, key);
        self.tracker.spawn_on(
            async move {
                let body = match body {
                    Ok(b) => b,
                    Err(_) => return done.complete(Status::ERROR, Vec::new()),
                };
                let answer = tokio::select! {
                    // Dropping `done` answers PMIx with an error.
                    _ = shutdown.cancelled() => return,
                    a = overlay.request(node, Service::Modex, body) => a,
                };
                match answer {
                    Ok(blob) => done.complete(Status::SUCCESS, blob.to_vec()),
                    Err(e) => {
                        warn!(rank, peer = node, "direct modex failed: {e}");
                        let status = match e {
                            Error::Timeout { .. } => Status::TIMEOUT,
                            _ => Status::ERROR,
                        };
                        done.complete(status, Vec::new());
                    }
                }
            }
            .instrument(info_span!("dmodex", rank, peer = node)),
            &self.runtime,
        );
    }

    fn publish(&self, proc_: Proc, what: Published, done: OpDone) {
        self.publish_names(proc_, what, done);
    }

    fn lookup(&self, proc_: Proc, keys: Vec<String>, directives: Directives, done: LookupDone) {
        self.lookup_names(proc_, keys, directives, done);
    }

    fn unpublish(&self, proc_: Proc, keys: Vec<String>, _directives: Directives, done: OpDone) {
        self.unpublish_names(proc_, keys, done);
    }

    fn connect(&self, procs: Vec<Proc>, timeout: Option<Duration>, done: OpDone) {
        self.connect_procs(procs, false, timeout, done);
    }

    fn disconnect(&self, procs: Vec<Proc>, timeout: Option<Duration>, done: OpDone) {
        self.connect_procs(procs, true, timeout, done);
    }

    fn group(&self, request: GroupRequest, done: GroupDone) {
        self.group_op(request, done);
    }

    fn spawn(
        &self,
        requester: Proc,
        job_info: Vec<(String, Datum)>,
        apps: Vec<App>,
        done: SpawnDone,
    ) {
        self.spawn_apps(requester, job_info, apps, done);
    }

    fn callback_panicked(&self, callback: &'static str, message: String) {
        self.abort_job(
            None,
            1,
            format!(
                "node {}: PMIx callback {callback} panicked: {message}",
                self.job.node_idx
            ),
            None,
        );
    }
}

/// A running PMIx server for one node's ranks; cheap to clone.
#[derive(Clone, Debug)]
pub struct PmixServer {
    inner: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    job: Arc<JobSpec>,
    config: NamespaceConfig,
    /// The process's server this namespace is registered with.
    host: PmixHost,
    /// Whether [`PmixServer::shutdown`] also finalizes the host (it was started for this job).
    owns_host: bool,
    overlay: Overlay,
    server: Mutex<Option<Arc<Server>>>,
    state: Arc<Mutex<State>>,
    departures: Departures,
    /// The way to the embedder's spawner (`PMIx_Spawn`), shared by every namespace of the
    /// family.
    spawns: Spawns,
    /// The spawned job this namespace is, if it is one (its apps and parent).
    child: Option<Arc<ChildJob>>,
    /// Whether its fences over every node may be overlay collectives: only the namespace
    /// the overlay was started for; others on it (added, spawned) fence as subsets, since
    /// two namespaces' fences are not ordered alike on every node.
    own_overlay: bool,
    /// As [`Ties::neighbours`].
    neighbours: usize,
    /// The namespaces spawned in the family, served here beside this one (on the job's own
    /// server: [`PmixServer::add_child`]).
    children: Mutex<HashMap<String, PmixServer>>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    nsdir: PathBuf,
    /// `Some(true)` once the namespace is registered, `Some(false)` if that failed or the
    /// server stopped first.
    registered: watch::Sender<Option<bool>>,
    started: Mutex<Started>,
}

impl PmixHost {
    /// Hosts namespace `ns` on this process's server beside the others, with fences and
    /// direct modex over `overlay` (the overlay whose nodes `ns` is numbered by; `ns` may have
    /// no rank on this node). Several namespaces may share one overlay: its direct-modex and
    /// subset-collective requests are dispatched by namespace ([`crate::served`]).
    /// [`PmixServer::shutdown`] deregisters it and leaves the server and the overlay running;
    /// [`PmixHost::shutdown`] finalizes the server. See [`PmixServer::add_namespace`] for the
    /// order across nodes.
    pub async fn serve(
        &self,
        ns: &NamespaceSpec,
        overlay: Overlay,
        config: NamespaceConfig,
    ) -> Result<PmixServer, Error> {
        PmixServer::open(self.clone(), false, ns, overlay, config, Ties::default()).await
    }
}

impl PmixServer {
    /// Starts this process's PMIx server for `job`'s local ranks, with fences and direct
    /// modex over `overlay`: a [`PmixHost`] hosting the job's namespace only, finalized by
    /// [`PmixServer::shutdown`]. Fails if a PMIx server already ran in this process.
    pub async fn start(
        job: &JobSpec,
        overlay: Overlay,
        config: PmixConfig,
    ) -> Result<PmixServer, Error> {
        let ties = (Departures::default(), Spawns::default());
        Self::start_on(job, overlay, config, ties, None).await
    }

    /// As [`PmixServer::start`], sharing the node's record of who spoke what and its way to
    /// the embedder's spawner; the ranks' logged messages to `log_output`
    /// ([`NamespaceConfig::log_output`]).
    pub(crate) async fn start_on(
        job: &JobSpec,
        overlay: Overlay,
        config: PmixConfig,
        (departures, spawns): (Departures, Spawns),
        log_output: Option<mpsc::Sender<crate::charm::server::Output>>,
    ) -> Result<PmixServer, Error> {
        let spec = NamespaceSpec::of_job(job)?;
        let host = PmixHost::start(config.host_config(job))?;
        let ns = NamespaceConfig {
            log_output,
            ..config.namespace_config()
        };
        let ties = Ties::family(departures, spawns);
        let opened = Self::open(host.clone(), true, &spec, overlay, ns, ties).await;
        if opened.is_err() {
            host.shutdown().await;
        }
        opened
    }

    /// Serves `job`'s namespace on `host`, a server this process runs for several jobs (a
    /// session's agent), sharing the node's record of who spoke what and its way to the
    /// embedder's spawner; [`PmixServer::shutdown`] deregisters it and leaves `host` running.
    pub(crate) async fn serve_on(
        host: PmixHost,
        job: &JobSpec,
        overlay: Overlay,
        config: NamespaceConfig,
        departures: Departures,
        spawns: Spawns,
    ) -> Result<PmixServer, Error> {
        let spec = NamespaceSpec::of_job(job)?;
        let ties = Ties::family(departures, spawns);
        Self::open(host, false, &spec, overlay, config, ties).await
    }

    /// Registers namespace `ns` with `host` and starts its tasks (the fence loop, the
    /// direct-modex server, node 0's services).
    async fn open(
        host: PmixHost,
        owns_host: bool,
        ns: &NamespaceSpec,
        overlay: Overlay,
        config: NamespaceConfig,
        ties: Ties,
    ) -> Result<PmixServer, Error> {
        // From here on `job` is the namespace's placement in the overlay's numbering.
        let job = Arc::new(ns.placement().clone());
        let me = job.node_idx;
        let span = info_span!("pmix", job = %job.job_id, node = me);
        let nsdir = namespace_dir(&job, host.config())?;
        let server = host.server().ok_or(Error::Shutdown { node: me })?;
        let (fence_tx, fence_rx) = mpsc::channel(FENCE_QUEUE);
        let (started, all_started) = Started::new(&job, &config.binding);
        let shared = Arc::new(Shared {
            job: job.clone(),
            config,
            host,
            owns_host,
            overlay: overlay.clone(),
            server: Mutex::new(Some(server.clone())),
            state: Arc::new(Mutex::new(State::default())),
            departures: ties.departures,
            spawns: ties.spawns,
            child: ties.child,
            own_overlay: !ties.shares_overlay,
            neighbours: ties.neighbours,
            children: Mutex::new(HashMap::new()),
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
            nsdir,
            registered: watch::Sender::new(None),
            started: Mutex::new(started),
        });
        if !shared.host.route(&job.job_id, shared.bridge(fence_tx)) {
            return Err(Error::InvalidJob {
                job: job.job_id.clone(),
                reason: format!("node {me}: the namespace is hosted here already"),
            });
        }
        let (modex_tx, modex_rx) = mpsc::channel(DMODEX_QUEUE);
        if !overlay.served().add(job.clone(), modex_tx) {
            shared.host.unroute(&job.job_id);
            return Err(Error::InvalidJob {
                job: job.job_id.clone(),
                reason: format!("node {me}: the namespace is served on this overlay already"),
            });
        }
        crate::overlay::served::start_modex_router(&overlay, dmodex_nspace);
        crate::node0::spawn(&job, &overlay, &shared.tracker, &shared.shutdown);
        let pmix = PmixServer { inner: shared };
        let inner = &pmix.inner;
        if let Some(all_started) = all_started {
            inner
                .tracker
                .spawn(register_when_started(inner.clone(), all_started).instrument(span.clone()));
        } else {
            let none = BTreeMap::new();
            let bound = match &inner.config.binding {
                Binding::Known(bound) => bound,
                Binding::Reported => &none,
            };
            if let Err(e) = register_nspace(inner, &server, bound).await {
                pmix.shutdown().await;
                return Err(e);
            }
            inner.finish_registration(true);
        }
        drop(server);
        inner.begin(fence_rx, modex_rx, span);
        Ok(pmix)
    }

    /// [`Binding::Reported`]: the embedder says local `rank` has started, bound to `bound`
    /// CPUs or unbound; the namespace is registered when the last local rank has. Nothing for
    /// a rank reported before, or under [`Binding::Known`].
    pub fn rank_started(&self, rank: u32, bound: Option<Vec<u32>>) {
        let mut started = lock_started(&self.inner);
        if !started.missing.remove(&rank) {
            return;
        }
        if let Some(cpus) = bound {
            started.bound.insert(rank, cpus);
        }
        if started.missing.is_empty()
            && let Some(all_in) = started.all_in.take()
        {
            let _ = all_in.send(());
        }
    }

    /// Whether the namespace got registered (waits for it under [`Binding::Reported`]); false
    /// if that failed or the server stopped first.
    pub async fn registered(&self) -> bool {
        let mut rx = self.inner.registered.subscribe();
        let done = rx.wait_for(Option::is_some).await;
        done.ok().and_then(|d| *d).unwrap_or(false)
    }

    /// Registers local `rank` with PMIx and returns the environment to start it with
    /// (`PMIX_NAMESPACE`, `PMIX_RANK`, the server URI, …, the store it keeps the job's data in,
    /// [`CLIENT_STORE`], and the variables Open MPI 4.1 needs to accept a direct launch,
    /// [`OPEN_MPI_4_DIRECT_LAUNCH`]): add it to the rank's
    /// environment, and give the rank no `PMI_*` variables.
    pub async fn env_for(&self, rank: u32) -> Result<Vec<(String, String)>, Error> {
        let shared = &self.inner;
        let me = shared.job.node_idx;
        let failed = |what: &str, status: Status| Error::Pmix {
            node: me,
            what: format!("rank {rank}: {what}"),
            status: status.to_string(),
        };
        if !shared.job.local_ranks().contains(&rank) || !lock(&shared.state).registered.insert(rank)
        {
            return Err(Error::InvalidJob {
                job: shared.job.job_id.clone(),
                reason: format!("rank {rank} is not a free local rank of node {me}"),
            });
        }
        let server = shared
            .server
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or(Error::Shutdown { node: me })?;
        let proc_ = Proc {
            nspace: shared.job.job_id.clone(),
            rank,
        };
        let (tx, rx) = oneshot::channel();
        server
            .register_client(&proc_, shared.host.config().owner, move |s| {
                let _ = tx.send(s);
            })
            .map_err(|s| failed("PMIx_server_register_client", s))?;
        match tokio::time::timeout(shared.config.register_timeout, rx).await {
            Err(_) => {
                return Err(Error::Timeout {
                    node: me,
                    what: "register_timeout",
                    after: shared.config.register_timeout,
                });
            }
            Ok(Err(_)) => return Err(failed("PMIx_server_register_client", Status::ERROR)),
            Ok(Ok(s)) if !s.is_success() => {
                return Err(failed("PMIx_server_register_client", s));
            }
            Ok(Ok(_)) => {}
        }
        let mut env = server
            .setup_fork(&proc_)
            .map_err(|s| failed("PMIx_server_setup_fork", s))?;
        let (gds, store) = CLIENT_STORE;
        match env.iter_mut().find(|(k, _)| k == gds) {
            Some((_, v)) => *v = store.into(),
            None => env.push((gds.into(), store.into())),
        }
        env.extend(OPEN_MPI_4_DIRECT_LAUNCH.iter().map(|(k, v)| {
            let v = if v.is_empty() {
                shared.job.job_id.as_str()
            } else {
                v
            };
            (k.to_string(), v.to_string())
        }));
        Ok(env)
    }

    /// The launcher reports that a local rank exited with `code` (128+signal for a signal).
    /// An exit before `PMIx_Finalize` aborts the job, naming the rank and the code, unless
    /// the rank called `PMIx_Abort` (whose message, already on its way, names it better), the
    /// job is aborted within `exit_grace` for another reason, or the rank never connected and
    /// exited 0 (not a PMIx client; [`crate::departures`] has the rule).
    pub async fn rank_exited(&self, rank: u32, code: i32) {
        let reason = {
            let mut st = lock(&self.inner.state);
            st.exited.insert(rank, code);
            if st.finalized.contains(&rank) || st.aborting.contains(&rank) {
                None
            } else {
                let host = &self.inner.job.hosts[self.inner.job.node_idx];
                self.inner
                    .departures
                    .exited(rank, host, code, "PMIx_Finalize")
            }
        };
        if let Some(reason) = reason {
            let mut aborted = self.inner.overlay.aborted();
            tokio::select! {
                _ = aborted.wait_for(Option::is_some) => return,
                _ = self.inner.shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.inner.config.exit_grace) => {}
            }
            let reason = match &self.inner.child {
                Some(c) => format!(
                    "node {} ({}): spawned namespace {}: {reason}",
                    self.inner.job.node_idx,
                    self.inner.job.hosts[self.inner.job.node_idx],
                    c.nspace
                ),
                None => format!("node {}: {reason}", self.inner.job.node_idx),
            };
            warn!(rank, code, "aborting job: {reason}");
            self.inner
                .overlay
                .abort(AbortInfo::new(
                    self.inner.job.node_idx,
                    Some(rank),
                    code,
                    reason,
                ))
                .await;
        }
    }

    /// Number of fences completed on this node.
    pub fn fences(&self) -> u64 {
        lock(&self.inner.state).fences
    }

    /// Every fence completed on this node, in order.
    pub fn fence_log(&self) -> Vec<FenceRecord> {
        lock(&self.inner.state).fence_log.clone()
    }

    /// Name-service and subset operations this node carried out.
    pub fn dynamic_counts(&self) -> DynamicCounts {
        lock(&self.inner.state).dynamic
    }

    /// Adds namespace `nspace` (a spawned child) over this namespace's overlay and host, with
    /// `ranks[n]` its ranks on overlay node `n` (empty where it has none): the
    /// [`NamespaceSpec::on_overlay`] of this namespace's overlay. This namespace is untouched;
    /// the child is removed with its own [`PmixServer::shutdown`] (the overlay and the host
    /// keep running).
    ///
    /// Call it on every node of the overlay, and let no rank of the child start (nor any
    /// parent rank name it) before every node has returned: libpmix answers the child's
    /// job-level keys from each node's registration, a node asked for a child's direct modex
    /// or (node 0) a child's subset fence before it added the child refuses the request, and
    /// a client's fence naming an unregistered namespace is held by libpmix until its timeout.
    /// Remove it on every node once every rank of it has ended; a request arriving later is
    /// refused at once, naming the namespace.
    pub async fn add_namespace(
        &self,
        nspace: &str,
        ranks: Vec<Vec<u32>>,
        config: NamespaceConfig,
    ) -> Result<PmixServer, Error> {
        let inner = &self.inner;
        let ns = NamespaceSpec::on_overlay(&inner.job, nspace, ranks)?;
        let ties = Ties {
            shares_overlay: true,
            ..Ties::default()
        };
        let (host, overlay) = (inner.host.clone(), inner.overlay.clone());
        PmixServer::open(host, false, &ns, overlay, config, ties).await
    }

    /// Direct-modex traffic of this node so far.
    pub fn dmodex_counts(&self) -> DmodexCounts {
        lock(&self.inner.state).dmodex
    }

    /// Stops the tasks, then deregisters the namespace (PMIx drops its clients and data) and,
    /// if the host was started for this job ([`PmixServer::start`]), finalizes the server.
    /// Together at most the host's `finalize_timeout`: a finalize still running then is left
    /// behind on its own thread, so a stuck libpmix cannot hold the agent's teardown.
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        // The family's spawned namespaces end with it (their ranks are gone by now).
        let children: Vec<PmixServer> = lock_children(inner).drain().map(|(_, c)| c).collect();
        for child in children {
            Box::pin(child.shutdown()).await;
        }
        // Later direct modex and subset collectives naming the namespace are refused at once;
        // those queued are answered with an error as its queue goes.
        inner.overlay.served().remove(&inner.job.job_id);
        inner.shutdown.cancel();
        // Whoever waits for the registration stops waiting.
        inner.finish_registration(false);
        inner.tracker.close();
        inner.tracker.wait().await;
        let server = inner
            .server
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if server.is_none() {
            return;
        }
        drop(server);
        if inner.owns_host && inner.host.config().leave_to_exit {
            // Nothing of libpmix's to wait for; the namespace's handler (and what it holds,
            // such as the ranks' output channel) goes now.
            inner.host.unroute(&inner.job.job_id);
            return inner.host.shutdown().await;
        }
        let limit = inner.host.config().finalize_timeout;
        let started = tokio::time::Instant::now();
        if let Some((rank, end)) = lock(&inner.state).cut_off_connecting() {
            // libpmix (4.2 to 6) releases a rank's record twice when its client dies during
            // the connection handshake (the error path of ptl_base_connection_hdlr.c), and
            // deregistering the namespace then locks a freed mutex on the progress thread:
            // every later namespace of this host's server would wait forever. The namespace
            // stays registered (its data leaks until the server ends) and is refused from now.
            debug!(rank, %end, "namespace left registered: the rank ended before it finished connecting");
            inner.host.unroute(&inner.job.job_id);
        } else {
            // Deregistering the namespace first makes PMIx drop the job's clients and data
            // before it finalizes, instead of racing a client that dies while connecting.
            inner.host.remove(&inner.job.job_id, limit).await;
        }
        if inner.owns_host {
            let left = limit.saturating_sub(started.elapsed());
            inner.host.shutdown_within(left).await;
        }
    }
}

/// Registers the job's namespace, with `bound` as the local ranks' bindings.
async fn register_nspace(
    shared: &Shared,
    server: &Server,
    bound: &BTreeMap<u32, Vec<u32>>,
) -> Result<(), Error> {
    let (job, config) = (&shared.job, &shared.config);
    let me = job.node_idx;
    let failed = |what: &str, status: Status| Error::Pmix {
        node: me,
        what: what.to_string(),
        status: status.to_string(),
    };
    let info = job_info(
        job,
        server,
        (&shared.host.config().tmpdir, &shared.nsdir),
        (bound, config.universe),
        shared.child.as_deref(),
        oversubscribed(job.local_ranks().len() + shared.neighbours),
    )
    .map_err(|s| failed("building the job info", s))?;
    let (tx, rx) = oneshot::channel();
    server
        .register_nspace(
            &job.job_id,
            job.local_ranks().len() as u32,
            info,
            move |s| {
                let _ = tx.send(s);
            },
        )
        .map_err(|s| failed("PMIx_server_register_nspace", s))?;
    match tokio::time::timeout(config.register_timeout, rx).await {
        Err(_) => Err(Error::Timeout {
            node: me,
            what: "register_timeout",
            after: config.register_timeout,
        }),
        Ok(Err(_)) => Err(failed("PMIx_server_register_nspace", Status::ERROR)),
        Ok(Ok(s)) if !s.is_success() => Err(failed("PMIx_server_register_nspace", s)),
        Ok(Ok(_)) => Ok(()),
    }
}

/// [`Binding::Reported`]: registers the namespace once every local rank has started (or after
/// `register_timeout`). A failure aborts the job, naming this node.
async fn register_when_started(shared: Arc<Shared>, all_started: oneshot::Receiver<()>) {
    let limit = shared.config.register_timeout;
    tokio::select! {
        _ = shared.shutdown.cancelled() => return shared.finish_registration(false),
        waited = tokio::time::timeout(limit, all_started) => if waited.is_err() {
            let missing = lock_started(&shared).missing.clone();
            warn!(?missing, "ranks not started after {limit:?}; their PMIx locality is left out");
        }
    }
    let bound = std::mem::take(&mut lock_started(&shared).bound);
    let server = shared
        .server
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let Some(server) = server else {
        return shared.finish_registration(false);
    };
    let registered = register_nspace(&shared, &server, &bound).await;
    shared.finish_registration(registered.is_ok());
    if let Err(e) = registered {
        let me = shared.job.node_idx;
        warn!("{e}");
        shared
            .overlay
            .abort(AbortInfo::new(me, None, 1, e.to_string()))
            .await;
    }
}

impl Shared {
    /// The handler of this namespace's upcalls, handing fences to `fences`.
    fn bridge(&self, fences: mpsc::Sender<FenceReq>) -> Arc<Bridge> {
        Arc::new(Bridge {
            job: self.job.clone(),
            overlay: self.overlay.clone(),
            runtime: tokio::runtime::Handle::current(),
            state: self.state.clone(),
            departures: self.departures.clone(),
            spawns: self.spawns.clone(),
            own_overlay: self.own_overlay,
            spawned: self.child.is_some(),
            fences,
            shutdown: self.shutdown.clone(),
            tracker: self.tracker.clone(),
            log_output: (self.config.log_output.clone()).filter(|_| self.child.is_none()),
        })
    }

    /// Starts the fence loop and the direct-modex server.
    fn begin(
        self: &Arc<Self>,
        fences: mpsc::Receiver<FenceReq>,
        modex: mpsc::Receiver<crate::overlay::Incoming>,
        span: tracing::Span,
    ) {
        self.tracker
            .spawn(fence_loop(self.clone(), fences).instrument(span.clone()));
        self.tracker
            .spawn(dmodex_server(self.clone(), modex).instrument(span));
    }

    /// The registration's outcome; the first one counts.
    fn finish_registration(&self, ok: bool) {
        self.registered.send_if_modified(|done| {
            let first = done.is_none();
            if first {
                *done = Some(ok);
            }
            first
        });
    }
}

fn lock_started(shared: &Shared) -> MutexGuard<'_, Started> {
    shared.started.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `processes` of the family on this node are more than the CPUs this agent may run
/// on: the ranks are then told so (`PMIX_NODE_OVERSUBSCRIBED`), and Open MPI's yield while they
/// wait (`mpi_yield_when_idle`), as under PRRTE, instead of spinning each other off the CPUs.
fn oversubscribed(processes: usize) -> bool {
    std::thread::available_parallelism().is_ok_and(|cpus| processes > cpus.get())
}

/// The namespace's job-level info (research/pmix-pmi.md §1): sizes, maps, local peers, and
/// per-rank data for the local ranks only (with where each bound one runs); PMIx derives
/// remote ranks' hosts and node ids from the node and proc maps.
fn job_info(
    job: &JobSpec,
    server: &Server,
    (tmpdir, nsdir): (&std::path::Path, &std::path::Path),
    (bound, universe): (&BTreeMap<u32, Vec<u32>>, Option<u32>),
    child: Option<&ChildJob>,
    oversubscribed: bool,
) -> Result<InfoArray, Status> {
    let me = job.node_idx;
    let n_ranks = job.n_ranks();
    let universe = universe.unwrap_or(0).max(n_ranks);
    let local = job.local_ranks();
    // The maps list the namespace's own nodes only, as PRRTE registers a job on a daemon
    // hosting none of its procs. libpmix numbers the nodes of `PMIX_NODE_MAP` by position
    // and takes `PMIX_LOCAL_SIZE` from the node whose id is `PMIX_NODEID`: the id must be
    // this node's position there (none on a node without ranks of the namespace).
    let own = crate::namespace::own_nodes(job);
    let nodeid = crate::namespace::nodes_with_ranks(job)
        .iter()
        .position(|&n| n == me)
        .map(|i| i as u32);
    let node_map = server.generate_regex(&own.hosts.join(","))?;
    let ppn: Vec<String> = own
        .ranks
        .iter()
        .map(|r| r.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
        .collect();
    let proc_map = server.generate_ppn(&ppn.join(";"))?;
    let host = job.hosts[me].clone();
    let mut entries: Vec<(&'static std::ffi::CStr, Value)> = vec![
        (key::SPAWNED, Value::Bool(child.is_some())),
        (key::TMPDIR, Value::Str(tmpdir.to_string_lossy().into())),
        (key::NSDIR, Value::Str(nsdir.to_string_lossy().into())),
        (key::TDIR_RMCLEAN, Value::Bool(true)),
        (key::JOBID, Value::Str(job.job_id.clone())),
        (key::HOSTNAME, Value::Str(host.clone())),
        (key::UNIV_SIZE, Value::U32(universe)),
        (key::JOB_SIZE, Value::U32(n_ranks)),
        (
            key::JOB_NUM_APPS,
            Value::U32(child.map_or(1, |c| c.apps.len().max(1) as u32)),
        ),
        (key::APP_SIZE, Value::U32(n_ranks)),
        (key::MAX_PROCS, Value::U32(universe)),
        (key::NUM_NODES, Value::U32(own.n_nodes() as u32)),
        (key::LOCAL_SIZE, Value::U32(local.len() as u32)),
        (key::NODE_SIZE, Value::U32(local.len() as u32)),
        (key::NODE_MAP, Value::Regex(node_map)),
        (key::PROC_MAP, Value::Regex(proc_map)),
        (key::ANL_MAP, Value::Str(own.process_mapping())),
    ];
    if oversubscribed {
        entries.push((key::NODE_OVERSUBSCRIBED, Value::Bool(true)));
    }
    // A node without ranks of the namespace has no node id in it, no local peers and no
    // local leader.
    if let Some(id) = nodeid {
        entries.push((key::NODEID, Value::U32(id)));
    }
    if let Some(&leader) = local.iter().min() {
        let peers: Vec<String> = local.iter().map(u32::to_string).collect();
        entries.push((key::LOCAL_PEERS, Value::Str(peers.join(","))));
        entries.push((key::LOCALLDR, Value::Rank(leader)));
    }
    for (local_rank, &rank) in local.iter().enumerate() {
        let mut data = proc_data(
            server,
            rank,
            local_rank,
            &host,
            nodeid,
            bound.get(&rank).map(Vec::as_slice),
        );
        if let Some(child) = child {
            children::child_keys(&mut data, child, rank);
        }
        entries.push((key::PROC_DATA, Value::Infos(data)));
    }
    InfoArray::new(&entries)
}

/// The per-process keys of local rank `rank` (`local_rank` among this node's), bound to `cpus`
/// when known.
fn proc_data(
    server: &Server,
    rank: u32,
    local_rank: usize,
    host: &str,
    nodeid: Option<u32>,
    cpus: Option<&[u32]>,
) -> Vec<(&'static std::ffi::CStr, Value)> {
    let mut data = vec![
        (key::RANK, Value::Rank(rank)),
        (key::APPNUM, Value::U32(0)),
        (key::APPLDR, Value::Rank(0)),
        (key::GLOBAL_RANK, Value::Rank(rank)),
        (key::APP_RANK, Value::Rank(rank)),
        (key::LOCAL_RANK, Value::U16(local_rank as u16)),
        (key::NODE_RANK, Value::U16(local_rank as u16)),
        (key::HOSTNAME, Value::Str(host.to_string())),
        (key::NODEID, Value::U32(nodeid.unwrap_or(0))),
    ];
    // Open MPI tells which local peers share a package, a cache or a core from these;
    // without them every peer is just "on this node".
    if let Some(cpus) = cpus {
        match server.locality_of(cpus) {
            Ok(place) => data.extend([
                (key::LOCALITY_STRING, Value::Str(place.locality)),
                (key::CPUSET, Value::Str(place.cpuset)),
            ]),
            Err(s) => warn!(rank, "no PMIx locality for CPUs {cpus:?}: {s}"),
        }
    }
    data
}

/// Whether a fence's participants involve every node of the overlay (and only this
/// namespace), as an overlay collective must: the whole namespace (wildcard rank) or ranks on
/// every node, of a namespace with ranks on every node of the overlay.
fn spans_every_node(job: &JobSpec, procs: &[Proc]) -> bool {
    if procs.iter().any(|p| p.nspace != job.job_id) || !crate::namespace::spans_overlay(job) {
        return false;
    }
    if procs.iter().any(|p| p.rank == RANK_WILDCARD) {
        return true;
    }
    let nodes: HashSet<usize> = procs
        .iter()
        .filter_map(|p| job.node_of_rank(p.rank))
        .collect();
    nodes.len() == job.n_nodes()
}

/// Carries fences to the overlay one at a time, in the order PMIx reported them.
async fn fence_loop(shared: Arc<Shared>, mut fences: mpsc::Receiver<FenceReq>) {
    loop {
        let req = tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            r = fences.recv() => match r { Some(r) => r, None => return },
        };
        if fence(&shared, req).await.is_break() {
            return;
        }
    }
}

/// Runs one fence over the overlay and answers PMIx; `Break` when the server stops meanwhile.
async fn fence(shared: &Shared, req: FenceReq) -> ControlFlow<()> {
    let job = &shared.job;
    let me = job.node_idx;
    let FenceReq {
        procs,
        collect,
        data,
        done,
    } = req;
    if !shared.own_overlay || !spans_every_node(job, &procs) {
        // Bridge::fence sends these to node 0; none is queued here.
        done.complete(Status::ERROR, Vec::new());
        return ControlFlow::Continue(());
    }
    let mine = FenceBlob {
        procs: procs.iter().map(|p| (p.nspace.clone(), p.rank)).collect(),
        collect,
        data: if collect {
            Bytes::from(data)
        } else {
            Bytes::new()
        },
    };
    let blob = match postcard::to_stdvec(&mine) {
        Ok(b) => Bytes::from(b),
        Err(e) => {
            warn!("cannot encode fence blob: {e}");
            done.complete(Status::ERROR, Vec::new());
            return ControlFlow::Continue(());
        }
    };
    let started = std::time::Instant::now();
    let gathered = tokio::select! {
        // Dropping `done` answers PMIx with an error; the server is finalized after this.
        _ = shared.shutdown.cancelled() => return ControlFlow::Break(()),
        g = family::allgather(&shared.overlay, Family::Pmix, &shared.job, blob) => g,
    };
    let blobs = match gathered {
        Ok(b) => b,
        Err(e) => {
            // Timeouts and aborts have already aborted the job.
            warn!("fence failed: {e}");
            let status = match e {
                Error::CollectiveTimeout { .. } => Status::TIMEOUT,
                _ => Status::ERROR,
            };
            done.complete(status, Vec::new());
            return ControlFlow::Continue(());
        }
    };
    let all = match concat_fence(me, &mine, &blobs) {
        Ok(all) => all,
        Err(reason) => {
            warn!("aborting job: {reason}");
            done.complete(Status::ERROR, Vec::new());
            shared
                .overlay
                .abort(AbortInfo::new(me, None, 1, reason))
                .await;
            return ControlFlow::Continue(());
        }
    };
    record_fence(shared, collect, mine.data.len(), all.len(), started);
    done.complete(Status::SUCCESS, all);
    ControlFlow::Continue(())
}

/// Counts a completed fence in the node's log (benchmarks, diagnostics) and traces it.
fn record_fence(
    shared: &Shared,
    collect: bool,
    local_bytes: usize,
    total_bytes: usize,
    started: std::time::Instant,
) {
    {
        let mut st = lock(&shared.state);
        st.fences += 1;
        st.fence_log.push(FenceRecord {
            collect,
            local_bytes,
            total_bytes,
            elapsed: started.elapsed(),
        });
    }
    debug!(
        collect,
        bytes = total_bytes,
        elapsed_us = started.elapsed().as_micros() as u64,
        "fence complete"
    );
}

/// Every node's fence data in node order, for PMIx; an error naming the node when one ran
/// another fence than this node's `mine` or sent an undecodable blob.
fn concat_fence(me: usize, mine: &FenceBlob, blobs: &[Bytes]) -> Result<Vec<u8>, String> {
    let mut all = Vec::with_capacity(blobs.iter().map(Bytes::len).sum());
    for (node, b) in blobs.iter().enumerate() {
        match postcard::from_bytes::<FenceBlob>(b) {
            Ok(f) if f.procs == mine.procs && f.collect == mine.collect => {
                all.extend_from_slice(&f.data)
            }
            Ok(f) => {
                return Err(format!(
                    "node {me} fence: node {node} ran a different fence (participants {:?}, collect {}) than this node ({:?}, collect {}); PMIx fences must be issued in the same order on every node",
                    f.procs, f.collect, mine.procs, mine.collect
                ));
            }
            Err(e) => {
                return Err(format!(
                    "node {me} fence: undecodable blob from node {node}: {e}"
                ));
            }
        }
    }
    Ok(all)
}

/// Answers other nodes' direct-modex requests for this node's ranks.
async fn dmodex_server(
    shared: Arc<Shared>,
    mut incoming: mpsc::Receiver<crate::overlay::Incoming>,
) {
    loop {
        let req = tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            r = incoming.recv() => match r { Some(r) => r, None => return },
        };
        let server = shared
            .server
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let job = shared.job.clone();
        let shutdown = shared.shutdown.clone();
        let state = shared.state.clone();
        shared.tracker.spawn(
            async move {
                let (proc_, key) = match decode_dmodex_request(&job, &req.body) {
                    Ok(asked) => asked,
                    Err(reason) => return req.respond(Err(reason)).await,
                };
                let Some(server) = server else {
                    return req.respond(Err("PMIx server stopped".into())).await;
                };
                if let Some(key) = key {
                    tokio::select! {
                        _ = shutdown.cancelled() => {
                            return req.respond(Err("node shutting down".into())).await;
                        }
                        _ = await_key(&server, &proc_, key) => {}
                    }
                }
                let (tx, rx) = oneshot::channel();
                if let Err(s) = server.dmodex_request(&proc_, move |r| {
                    let _ = tx.send(r);
                }) {
                    return req
                        .respond(Err(format!("PMIx_server_dmodex_request: {s}")))
                        .await;
                }
                drop(server);
                // PMIx answers once the rank has committed its data; the asking node's
                // request_timeout bounds the wait.
                let answer = tokio::select! {
                    _ = shutdown.cancelled() => Err("node shutting down".into()),
                    r = rx => match r {
                    Ok(Ok(blob)) => Ok(Bytes::from(blob)),
                    Ok(Err(s)) => Err(format!("PMIx_server_dmodex_request: {s}")),
                    Err(_) => Err("PMIx dropped the dmodex request".into()),
                    },
                };
                if answer.is_ok() {
                    lock(&state).dmodex.answered += 1;
                }
                req.respond(answer).await;
            }
            .in_current_span(),
        );
    }
}

/// Waits until local `proc_` has posted `key` (see [`KEY_WAIT`]), at most that long.
async fn await_key(server: &Arc<Server>, proc_: &Proc, key: String) {
    let started = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        let (s, p, k) = (server.clone(), proc_.clone(), key.clone());
        // PMIx_Get blocks on PMIx's thread: keep it off the runtime's workers.
        let posted = tokio::task::spawn_blocking(move || s.has_key(&p, &k)).await;
        match posted {
            Ok(Ok(true)) => {
                if pause > Duration::from_millis(1) {
                    debug!(
                        rank = proc_.rank,
                        key,
                        waited_ms = started.elapsed().as_millis() as u64,
                        "key posted"
                    );
                }
                return;
            }
            Ok(Ok(false)) => {}
            Ok(Err(status)) => {
                debug!(rank = proc_.rank, key, %status, "cannot look for the key; answering now");
                return;
            }
            Err(_) => return,
        }
        if started.elapsed() >= KEY_WAIT {
            warn!(
                rank = proc_.rank,
                key,
                "rank has not posted the key a peer asked for within {KEY_WAIT:?}; answering without it"
            );
            return;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(KEY_POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JobSecret;

    /// Only a registered rank that never finished connecting and ended by a signal (or not
    /// yet) keeps the namespace registered.
    #[test]
    fn a_rank_cut_off_while_connecting_keeps_the_namespace() {
        let mut st = State::default();
        st.registered.extend([0, 1, 2]);
        st.connected.insert(0);
        st.exited.extend([(0, 143), (1, 0), (2, 7)]);
        assert_eq!(
            st.cut_off_connecting(),
            None,
            "connected, or exited by itself"
        );
        st.registered.insert(3);
        assert_eq!(
            st.cut_off_connecting(),
            Some((3, "its end not known".into()))
        );
        st.exited.insert(3, 143);
        assert_eq!(st.cut_off_connecting(), Some((3, "code 143".into())));
        st.connected.insert(3);
        assert_eq!(st.cut_off_connecting(), None);
    }

    fn check(procs: &[(&str, u32)], expect: bool) {
        let job = JobSpec {
            job_id: "j".into(),
            hosts: vec!["n0".into(), "n1".into(), "n2".into()],
            node_idx: 0,
            model: Default::default(),
            ranks: vec![vec![0, 1], vec![2], vec![3, 4]],
            secret: JobSecret::generate(),
        };
        let procs: Vec<Proc> = procs
            .iter()
            .map(|&(nspace, rank)| Proc {
                nspace: nspace.into(),
                rank,
            })
            .collect();
        assert_eq!(spans_every_node(&job, &procs), expect, "{procs:?}");
    }

    #[test]
    fn private_dirs_are_fresh_0700_and_unguessable() {
        use std::os::unix::fs::PermissionsExt;
        let parent = tempfile::tempdir().unwrap();
        let a = private_dir(parent.path(), "greedy-pmix.").unwrap();
        let b = private_dir(parent.path(), "greedy-pmix.").unwrap();
        assert_ne!(a, b);
        for d in [&a, &b] {
            let meta = std::fs::symlink_metadata(d).unwrap();
            assert!(meta.is_dir());
            assert_eq!(meta.permissions().mode() & 0o7777, 0o700, "{d:?}");
            let name = d.file_name().unwrap().to_str().unwrap();
            assert_eq!(name.len(), "greedy-pmix.".len() + 24, "{name}");
        }
        // Nothing is reused: a parent we cannot write to fails, it does not fall back.
        assert!(private_dir(&parent.path().join("missing"), "x.").is_err());
    }

    #[test]
    fn dmodex_requests_name_a_local_rank_of_this_job() {
        let job = JobSpec {
            job_id: "j".into(),
            hosts: vec!["n0".into(), "n1".into()],
            node_idx: 1,
            model: Default::default(),
            ranks: vec![vec![0], vec![1, 2]],
            secret: JobSecret::generate(),
        };
        let ask = |nspace: &str, rank, key: Option<&str>| {
            let p = Proc {
                nspace: nspace.into(),
                rank,
            };
            decode_dmodex_request(
                &job,
                &encode_dmodex_request(&p, key.map(Into::into)).unwrap(),
            )
        };
        let (p, key) = ask("j", 2, Some("btl.tcp")).unwrap();
        assert_eq!((p.rank, key.as_deref()), (2, Some("btl.tcp")));
        assert!(
            ask("j", 0, None)
                .unwrap_err()
                .contains("rank 0 of \"j\" is not here")
        );
        assert!(ask("k", 1, None).is_err());
        assert!(
            decode_dmodex_request(&job, b"\xff")
                .unwrap_err()
                .contains("bad dmodex request")
        );
    }

    #[test]
    fn fences_must_span_every_node() {
        check(&[("j", RANK_WILDCARD)], true);
        check(&[("j", 0), ("j", 2), ("j", 3)], true);
        check(&[("j", 0), ("j", 1), ("j", 2), ("j", 3), ("j", 4)], true);
        // Node 2 (ranks 3, 4) left out: not an overlay collective.
        check(&[("j", 0), ("j", 2)], false);
        check(&[("j", 1)], false);
        // Another namespace (PMIx_Connect groups): not supported.
        check(&[("j", RANK_WILDCARD), ("other", RANK_WILDCARD)], false);
        check(&[("other", 0)], false);
        check(&[], false);
    }

    #[test]
    fn a_namespace_on_some_nodes_never_fences_over_the_overlay() {
        let mut job = JobSpec {
            job_id: "j.1".into(),
            hosts: vec!["n0".into(), "n1".into(), "n2".into()],
            node_idx: 0,
            model: Default::default(),
            ranks: vec![vec![], vec![0], vec![1, 2]],
            secret: JobSecret::generate(),
        };
        let all = |nspace: &str| {
            vec![Proc {
                nspace: nspace.into(),
                rank: RANK_WILDCARD,
            }]
        };
        // Its whole-namespace fence involves nodes 1 and 2 only: the subset path.
        assert!(!spans_every_node(&job, &all("j.1")));
        job.ranks = vec![vec![0], vec![1], vec![2]];
        assert!(spans_every_node(&job, &all("j.1")));
    }
}
