//! The PMI-1/PMI-2 server for the ranks of one node: per-rank socketpairs and handlers, the KVS and its fences.
//!
//! Ranks reach the server only over an inherited socketpair (`PMI_FD`, made by
//! [`PmiServer::socketpair_for`]; the embedder maps the child's end into the rank). There is no
//! `PMI_PORT` listener: the PMI wire protocols carry no credential (a rank is just a number),
//! so a port would let any local user claim a rank, read the KVS and abort the job
//! (docs/security.md). Each connection gets a task that feeds a sans-I/O [`Session`] and
//! carries out its actions.
//!
//! A fence (PMI-1 `barrier_in`, PMI-2 `kvs-fence`) completes locally once every local rank has
//! entered it; the node's puts since the previous fence then go to every node in **one**
//! overlay allgather, the results are merged into the node's KVS, and every local rank is
//! released. Gets are answered from that KVS without network traffic. Fences serve every
//! runtime barrier too (MPICH's finalize barrier is one).
//!
//! Name publishing (`MPI_Publish_name` and friends) goes to the job's one name table on node 0
//! ([`crate::names`]): every node's ranks, node 0's own included, ask it with one overlay
//! request each, and node 0's name service answers them from its `Service::Names` queue
//! (`node0.rs`, shared with the PMIx server's publish and lookup).
//!
//! Spawned jobs (`MPI_Comm_spawn`, [`crate::child`]) are served beside the job, each a
//! namespace of its own: its KVS (seeded with the spawner's preput keys before any of its
//! ranks starts), process mapping, size and appnums, and fences over the nodes hosting its
//! ranks only, gathered by node 0's subset-collective coordinator ([`crate::group`]) while
//! the job's ranks fence on independently. A rank's spawn request goes to the embedder
//! ([`crate::child::Spawns`]); the rank waits for the answer, the others go on.
//!
//! Failures abort the whole job through the overlay, naming the rank: a protocol violation
//! (quoting the offending text), `PMI_Abort`, a rank that closes its PMI connection or exits
//! before `finalize` (the launcher reports exits through [`PmiServer::rank_exited`]).
//! Only `PMI_*` variables are exported, never `PMIX_*` (MPICH ≥ 4.1 refuses both at once).

use std::{
    collections::{HashMap, HashSet},
    ops::ControlFlow,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

mod spawned;

use bytes::{Bytes, BytesMut};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    sync::mpsc,
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{Instrument, debug, info_span, warn};

use crate::{
    AbortInfo, Error, JobSpec,
    child::{ChildJob, SpawnOrigin, Spawns},
    departures::Departures,
    family::{self, Family},
    frame::Service,
    names,
    overlay::Overlay,
    session::{Action, Node, Session},
};

/// Settings of the PMI server.
#[derive(Debug, Clone)]
pub struct PmiConfig {
    /// How long to wait, after a rank closes its PMI connection before `finalize`, for the
    /// launcher to report its exit code (so the abort message can name it) before aborting anyway.
    pub early_close_grace: Duration,
    /// How long the local ranks may take to all enter a fence once the first has. Keep it at
    /// or below `OverlayConfig::collective_timeout`, so that a stuck rank is named by its own
    /// node rather than the whole node by another.
    pub fence_timeout: Duration,
    /// How many processes the job and those it spawns may have in all (the launcher's slots:
    /// PMI-1 `get_universe_size`, PMI-2 `universeSize`, what `MPI_UNIVERSE_SIZE` says); `None`
    /// or fewer than a namespace's ranks: its ranks.
    pub universe: Option<u32>,
    /// Where to write this node's hardware topology as hwloc XML (in a private directory made
    /// there when a rank first asks, removed at shutdown), the file MPICH asks for as
    /// `PMI_hwloc_xmlfile` instead of probing the hardware in every rank, as Hydra gives it;
    /// `None`: not served. Loads the topology on the first ask: the process must have set
    /// hwloc's environment beforehand (greedy-sys `prepare_environment`) or loaded it
    /// (`prepare_process`).
    pub topology_dir: Option<std::path::PathBuf>,
    /// The job was spawned by another, which serves it as a job of its own (a nested step
    /// under srun): its ranks are told so (`PMI_SPAWNED`, `spawner-jobid`, appnums) and its
    /// KVS starts with the spawner's preput keys.
    pub origin: Option<SpawnOrigin>,
}

impl Default for PmiConfig {
    fn default() -> Self {
        PmiConfig {
            early_close_grace: Duration::from_millis(500),
            fence_timeout: Duration::from_secs(300),
            universe: None,
            topology_dir: None,
            origin: None,
        }
    }
}

/// Tells a rank's handler something happened elsewhere.
#[derive(Debug, Clone)]
enum Notice {
    FenceDone,
    NodeAttr(String, String),
    /// The name service's answer to this rank's request.
    Names(names::Response),
    /// The embedder's answer to this rank's spawn request: the child's namespace, or why not.
    Spawned(Result<String, String>),
}

/// Capacity of each handler's notice queue: at most one fence release is outstanding per rank,
/// plus node-attribute puts, which MPICH makes a handful of per node, plus at most one
/// name-service or spawn answer (the client waits for it).
const NOTICE_CAPACITY: usize = 64;

#[derive(Debug, Default)]
struct NodeState {
    /// Namespace-wide KVS as of the last fence.
    kvs: HashMap<String, String>,
    /// This node's puts since the last fence, in order.
    pending: Vec<(String, String)>,
    node_attrs: HashMap<String, String>,
    claimed: HashSet<u32>,
    /// Ranks that sent anything (a spawned job's; the job's are in [`Departures`]).
    spoke: HashSet<u32>,
    in_fence: HashSet<u32>,
    finalized: HashSet<u32>,
    exited: HashMap<u32, i32>,
    handlers: HashMap<u32, mpsc::Sender<Notice>>,
    fences: u64,
    /// Fences whose allgather has started (all local ranks were in).
    fences_started: u64,
}

/// One namespace this node serves: the job, or a job it spawned.
#[derive(Debug)]
struct Ns {
    /// Its ranks on the overlay's nodes (`job_id`: its kvsname; `node_idx`: this node).
    spec: Arc<JobSpec>,
    /// Its `PMI_process_mapping`.
    mapping: String,
    /// The namespace that spawned it (PMI-2 `spawner-jobid`) when served beside it; `None`
    /// for the job.
    spawner: Option<String>,
    /// The job's spawner when the job itself was spawned ([`PmiConfig::origin`]).
    origin: Option<String>,
    /// The first rank of each of its programs (`MPI_APPNUM` is the index); empty for the job.
    app_starts: Vec<u32>,
    state: Mutex<NodeState>,
}

impl Ns {
    /// The job's own namespace, seeded from its origin if it was spawned.
    fn job(spec: Arc<JobSpec>, origin: Option<&SpawnOrigin>) -> Ns {
        let state = NodeState {
            kvs: origin
                .map(|o| o.preput.iter().cloned().collect())
                .unwrap_or_default(),
            ..NodeState::default()
        };
        Ns {
            mapping: spec.process_mapping(),
            spec,
            spawner: None,
            origin: origin.map(|o| o.spawner.clone()),
            app_starts: origin.map(|o| o.app_starts.clone()).unwrap_or_default(),
            state: Mutex::new(state),
        }
    }

    fn lock(&self) -> MutexGuard<'_, NodeState> {
        // A panic while holding the lock cannot leave NodeState half-updated in a way that
        // matters more than stopping the job would, so take the data anyway.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn id(&self) -> &str {
        &self.spec.job_id
    }

    /// `rank` as an abort message names it: the job's ranks plainly, a spawned job's with
    /// its namespace.
    fn who(&self, rank: u32) -> String {
        match self.spawner {
            None => format!("rank {rank}"),
            Some(_) => format!("spawned job {} rank {rank}", self.id()),
        }
    }

    /// The rank the job's abort names: a spawned job's ranks are named in the reason only
    /// (the abort's rank is one of the job's).
    fn abort_rank(&self, rank: u32) -> Option<u32> {
        self.spawner.is_none().then_some(rank)
    }
}

/// The session's view of a namespace while its state lock is held.
struct View<'a> {
    ns: &'a Ns,
    /// The job family's universe size ([`PmiConfig::universe`]).
    universe: u32,
    /// The node's topology file ([`PmiConfig::topology_dir`]).
    topology: &'a TopologyFile,
    state: &'a mut NodeState,
    attr_puts: Vec<(String, String)>,
}

impl Node for View<'_> {
    fn job_id(&self) -> &str {
        self.ns.id()
    }
    fn n_ranks(&self) -> u32 {
        self.ns.spec.n_ranks()
    }
    fn universe_size(&self) -> u32 {
        self.universe.max(self.n_ranks())
    }
    fn get(&self, key: &str) -> Option<String> {
        match key {
            "PMI_process_mapping" => return Some(self.ns.mapping.clone()),
            TOPOLOGY_KEY => return self.topology.path().map(str::to_owned),
            _ => {}
        }
        self.state.kvs.get(key).cloned().or_else(|| {
            self.state
                .pending
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        })
    }
    fn job_attr(&self, key: &str) -> Option<String> {
        match key {
            "PMI_process_mapping" => Some(self.ns.mapping.clone()),
            "universeSize" => Some(self.universe_size().to_string()),
            TOPOLOGY_KEY => self.topology.path().map(str::to_owned),
            _ => None,
        }
    }
    fn node_attr(&self, key: &str) -> Option<String> {
        self.state.node_attrs.get(key).cloned()
    }
    fn put(&mut self, _rank: u32, key: String, value: String) {
        self.state.pending.push((key, value));
    }
    fn put_node_attr(&mut self, key: String, value: String) {
        self.state.node_attrs.insert(key.clone(), value.clone());
        self.attr_puts.push((key, value));
    }
    fn claim(&mut self, rank: u32) -> bool {
        self.ns.spec.local_ranks().contains(&rank) && self.state.claimed.insert(rank)
    }
    fn appnum(&self, rank: u32) -> u32 {
        let after = self.ns.app_starts.partition_point(|&first| first <= rank);
        after.saturating_sub(1) as u32
    }
    fn spawner(&self) -> Option<String> {
        self.ns.spawner.clone().or_else(|| self.ns.origin.clone())
    }
}

/// A running PMI server for one node's ranks; cheap to clone.
#[derive(Clone, Debug)]
pub struct PmiServer {
    inner: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// The job: its placement is the overlay's.
    job: Arc<JobSpec>,
    /// The job's namespace.
    root: Arc<Ns>,
    /// The jobs it spawned served here, by namespace.
    spawned: Mutex<HashMap<String, Arc<Ns>>>,
    overlay: Overlay,
    config: PmiConfig,
    /// Who of this node spoke which family (shared with the node's other servers).
    departures: Departures,
    /// The way to the embedder's spawner (PMI-1 `mcmd=spawn`, PMI-2 `spawn`).
    spawns: Spawns,
    /// The node's topology file ([`PmiConfig::topology_dir`]).
    topology: TopologyFile,
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

/// MPICH's job attribute naming the launcher's hwloc XML topology of the node.
const TOPOLOGY_KEY: &str = "PMI_hwloc_xmlfile";

/// The node's topology file for MPICH, written when a rank first asks for it (a job whose
/// ranks never ask pays nothing), in a private directory removed at shutdown.
#[derive(Debug, Default)]
struct TopologyFile {
    /// Where its directory is made; `None`: not served.
    parent: Option<std::path::PathBuf>,
    /// The directory and the file once written (`None` inside: hwloc could not).
    made: std::sync::OnceLock<Option<(std::path::PathBuf, String)>>,
}

impl TopologyFile {
    /// The file, written on first use.
    fn path(&self) -> Option<&str> {
        let parent = self.parent.as_deref()?;
        let made = self.made.get_or_init(|| write_topology(parent));
        made.as_ref().map(|(_, f)| f.as_str())
    }

    /// Removes what was written.
    fn remove(&self) {
        if let Some(Some((dir, _))) = self.made.get() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Writes this machine's topology as XML in a new private directory under `parent`: the
/// directory and the file, or `None` (said at warn level) when hwloc cannot.
fn write_topology(parent: &std::path::Path) -> Option<(std::path::PathBuf, String)> {
    let topo = greedy_sys::pmix::topology::Topology::this_machine()?;
    let dir = match crate::pmix::private_dir(parent, "greedy-topology.") {
        Ok(d) => d,
        Err(e) => {
            warn!("no topology file for MPICH: {e}");
            return None;
        }
    };
    let file = dir.join("topology.xml");
    match topo.export_xml(&file) {
        Ok(()) => Some((dir, file.display().to_string())),
        Err(e) => {
            warn!("no topology file for MPICH: {}: {e}", file.display());
            let _ = std::fs::remove_dir_all(&dir);
            None
        }
    }
}

impl PmiServer {
    /// Starts serving `job`'s local ranks, with fences over `overlay`.
    pub async fn start(
        job: &JobSpec,
        overlay: Overlay,
        config: PmiConfig,
    ) -> Result<PmiServer, Error> {
        Self::start_on(
            job,
            overlay,
            config,
            Departures::default(),
            Spawns::default(),
        )
        .await
    }

    /// As [`PmiServer::start`], sharing the node's record of who spoke what and its way to
    /// the embedder's spawner.
    pub(crate) async fn start_on(
        job: &JobSpec,
        overlay: Overlay,
        config: PmiConfig,
        departures: Departures,
        spawns: Spawns,
    ) -> Result<PmiServer, Error> {
        job.validate()?;
        let me = job.node_idx;
        let spec = Arc::new(job.clone());
        let topology = TopologyFile {
            parent: config.topology_dir.clone(),
            ..TopologyFile::default()
        };
        let shared = Arc::new(Shared {
            topology,
            root: Arc::new(Ns::job(spec.clone(), config.origin.as_ref())),
            job: spec,
            spawned: Mutex::new(HashMap::new()),
            overlay,
            config,
            departures,
            spawns,
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
        });
        let span = info_span!("pmi", job = %job.job_id, node = me);
        shared
            .tracker
            .spawn(abort_watch(shared.clone()).instrument(span.clone()));
        crate::node0::spawn(
            &shared.job,
            &shared.overlay,
            &shared.tracker,
            &shared.shutdown,
        );
        Ok(PmiServer { inner: shared })
    }

    /// A socketpair for `rank`: returns the child's end, to be mapped to fd `child_fd` in the
    /// rank (`None`: inherited as it is, under its own number), and the environment to give it
    /// (`PMI_FD`, `PMI_RANK`, `PMI_SIZE`, …).
    pub fn socketpair_for(
        &self,
        rank: u32,
        child_fd: Option<i32>,
    ) -> Result<(std::os::unix::net::UnixStream, Vec<(String, String)>), Error> {
        let (theirs, mut env) = self.pair_for(self.inner.root.clone(), rank, child_fd)?;
        if self.inner.root.origin.is_some() {
            env.push(("PMI_SPAWNED".into(), "1".into()));
        }
        Ok((theirs, env))
    }

    fn pair_for(
        &self,
        ns: Arc<Ns>,
        rank: u32,
        child_fd: Option<i32>,
    ) -> Result<(std::os::unix::net::UnixStream, Vec<(String, String)>), Error> {
        let me = self.inner.job.node_idx;
        let io = |what, source| Error::Io {
            node: me,
            what,
            source,
        };
        if !ns.spec.local_ranks().contains(&rank) || !ns.lock().claimed.insert(rank) {
            return Err(Error::InvalidJob {
                job: ns.id().to_owned(),
                reason: format!("rank {rank} is not a free local rank of node {me}"),
            });
        }
        let (ours, theirs) =
            std::os::unix::net::UnixStream::pair().map_err(|e| io("socketpair", e))?;
        ours.set_nonblocking(true)
            .map_err(|e| io("socketpair", e))?;
        let ours = tokio::net::UnixStream::from_std(ours).map_err(|e| io("socketpair", e))?;
        let shared = self.inner.clone();
        let span = info_span!("pmi", job = %ns.id(), node = me, rank);
        let mut env = common_env(&ns, rank);
        self.inner
            .tracker
            .spawn(serve_rank(shared, ns, ours, rank).instrument(span));
        let fd = child_fd.unwrap_or_else(|| std::os::fd::AsRawFd::as_raw_fd(&theirs));
        env.push(("PMI_FD".into(), fd.to_string()));
        Ok((theirs, env))
    }

    /// The launcher reports that a local rank exited with `code` (128+signal for a signal).
    ///
    /// An exit before `finalize` aborts the job, naming the rank and the code, unless the rank
    /// never spoke PMI and exited 0 (not a PMI client; [`crate::departures`] has the rule).
    pub async fn rank_exited(&self, rank: u32, code: i32) {
        let reason = {
            let mut st = self.inner.root.lock();
            st.exited.insert(rank, code);
            if st.finalized.contains(&rank) {
                None
            } else {
                let host = &self.inner.job.hosts[self.inner.job.node_idx];
                self.inner
                    .departures
                    .exited(rank, host, code, "PMI finalize")
            }
        };
        if let Some(reason) = reason {
            self.inner.abort(Some(rank), code, reason).await;
        }
    }

    /// Serves spawned job `child` beside the job: its own KVS (seeded with its preput
    /// keys), fences over the nodes hosting its ranks. Adding the same job again is a no-op.
    pub fn add_child(&self, child: &ChildJob) -> Result<(), Error> {
        let ns = spawned::namespace(&self.inner.job, child)?;
        let placement = ns.spec.clone();
        {
            let mut spawned = self.inner.lock_spawned();
            match spawned.get(&child.nspace) {
                Some(known) if known.spec.ranks == ns.spec.ranks => return Ok(()),
                Some(_) => {
                    return Err(Error::InvalidJob {
                        job: child.nspace.clone(),
                        reason: "served already with another placement".into(),
                    });
                }
                None => {}
            }
            // Node 0's coordinator gathers its fences from the nodes this placement names.
            if !self.inner.overlay.served().add_placement(placement) {
                return Err(Error::InvalidJob {
                    job: child.nspace.clone(),
                    reason: "the overlay serves a namespace of that name with another placement"
                        .into(),
                });
            }
            spawned.insert(child.nspace.clone(), Arc::new(ns));
        }
        debug!(nspace = %child.nspace, ranks = child.n_ranks(), "serving spawned job");
        Ok(())
    }

    /// As [`PmiServer::socketpair_for`], for local `rank` of child namespace `nspace`
    /// (its environment also says it was spawned: `PMI_SPAWNED=1`).
    pub fn child_socketpair_for(
        &self,
        nspace: &str,
        rank: u32,
        child_fd: Option<i32>,
    ) -> Result<(std::os::unix::net::UnixStream, Vec<(String, String)>), Error> {
        let ns = self.inner.child(nspace)?;
        let (theirs, mut env) = self.pair_for(ns, rank, child_fd)?;
        env.push(("PMI_SPAWNED".into(), "1".into()));
        Ok((theirs, env))
    }

    /// As [`PmiServer::rank_exited`], for local `rank` of child namespace `nspace`: an exit
    /// before `finalize` aborts the whole family, naming the namespace, rank and host,
    /// unless the rank never spoke PMI and exited 0.
    pub async fn child_exited(&self, nspace: &str, rank: u32, code: i32) {
        let Ok(ns) = self.inner.child(nspace) else {
            warn!(
                nspace,
                rank, code, "exit reported for a namespace not served here"
            );
            return;
        };
        let host = &self.inner.job.hosts[self.inner.job.node_idx];
        let reason = {
            let mut st = ns.lock();
            st.exited.insert(rank, code);
            let who = ns.who(rank);
            if st.finalized.contains(&rank) {
                None
            } else if st.spoke.contains(&rank) {
                Some(format!(
                    "{who} on {host} exited with code {code} before PMI finalize"
                ))
            } else if code != 0 {
                Some(format!(
                    "{who} on {host} exited with code {code} before connecting to any wire-up service"
                ))
            } else {
                None
            }
        };
        if let Some(reason) = reason {
            self.inner.abort(None, code, reason).await;
        }
    }

    /// Number of fences completed on this node.
    pub fn fences(&self) -> u64 {
        self.inner.root.lock().fences
    }

    /// Stops every listener and handler and waits for them; removes the topology file.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
        self.inner.topology.remove();
    }

    /// The node's topology file MPICH is given, if any ([`PmiConfig::topology_dir`]); written
    /// by this call if no rank asked yet.
    pub fn topology_file(&self) -> Option<&str> {
        self.inner.topology.path()
    }
}

/// What rank `rank` of `ns` finds in its environment besides its `PMI_FD`.
fn common_env(ns: &Ns, rank: u32) -> Vec<(String, String)> {
    let spec = &ns.spec;
    let local = spec.local_ranks();
    let local_id = local.iter().position(|&r| r == rank).unwrap_or(0);
    vec![
        ("PMI_RANK".into(), rank.to_string()),
        ("PMI_SIZE".into(), spec.n_ranks().to_string()),
        ("PMI_JOBID".into(), spec.job_id.clone()),
        ("MPI_LOCALNRANKS".into(), local.len().to_string()),
        ("MPI_LOCALRANKID".into(), local_id.to_string()),
    ]
}

impl Shared {
    fn lock_spawned(&self) -> MutexGuard<'_, HashMap<String, Arc<Ns>>> {
        self.spawned.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Spawned job `nspace`, if served here.
    fn child(&self, nspace: &str) -> Result<Arc<Ns>, Error> {
        self.lock_spawned()
            .get(nspace)
            .cloned()
            .ok_or_else(|| Error::InvalidJob {
                job: nspace.into(),
                reason: format!("not a spawned job served on node {}", self.job.node_idx),
            })
    }

    /// Names the local ranks of `ns` that have not entered fence `generation` once
    /// `fence_timeout` has passed since the first one did. This fires before the overlay's
    /// collective timeout (staggered above it), so the job's abort names ranks, not just a node.
    fn watch_local_fence(self: &Arc<Self>, ns: &Arc<Ns>, generation: u64) {
        let shared = self.clone();
        let ns = ns.clone();
        self.tracker.spawn(
            async move {
                tokio::select! {
                    _ = shared.shutdown.cancelled() => return,
                    _ = tokio::time::sleep(shared.config.fence_timeout) => {}
                }
                let missing: Vec<u32> = {
                    let st = ns.lock();
                    if st.fences_started != generation {
                        return;
                    }
                    ns.spec.local_ranks().iter().copied().filter(|r| !st.in_fence.contains(r)).collect()
                };
                let list: Vec<String> = missing.iter().map(u32::to_string).collect();
                let whose = match ns.spawner {
                    None => String::new(),
                    Some(_) => format!("spawned job {} ", ns.id()),
                };
                let reason = format!(
                    "node {} {whose}fence #{generation}: ranks {} have not entered it after fence_timeout ({:?})",
                    shared.job.node_idx,
                    list.join(","),
                    shared.config.fence_timeout
                );
                let rank = missing.first().and_then(|&r| ns.abort_rank(r));
                shared.abort(rank, 1, reason).await;
            }
            .in_current_span(),
        );
    }

    async fn abort(&self, rank: Option<u32>, code: i32, reason: String) {
        warn!(?rank, code, "aborting job: {reason}");
        self.overlay
            .abort(AbortInfo::new(self.job.node_idx, rank, code, reason))
            .await;
    }

    /// A rank of `ns` entered a fence; the last local rank to enter starts the allgather.
    fn enter_fence(self: &Arc<Self>, ns: &Arc<Ns>, rank: u32) {
        let (puts, generation) = {
            let mut st = ns.lock();
            let first = st.in_fence.is_empty();
            st.in_fence.insert(rank);
            if st.in_fence.len() < ns.spec.local_ranks().len() {
                if first {
                    self.watch_local_fence(ns, st.fences_started);
                }
                return;
            }
            st.in_fence.clear();
            st.fences_started += 1;
            (std::mem::take(&mut st.pending), st.fences_started - 1)
        };
        let shared = self.clone();
        let ns = ns.clone();
        self.tracker.spawn(
            async move {
                let Some(gathered) = shared.gather(&ns, generation, &puts).await else {
                    return;
                };
                let handlers: Vec<mpsc::Sender<Notice>> = {
                    let mut st = ns.lock();
                    for (k, v) in gathered.into_iter().flatten() {
                        st.kvs.insert(k, v);
                    }
                    st.fences += 1;
                    st.handlers.values().cloned().collect()
                };
                debug!(nspace = %ns.id(), "fence complete");
                for h in handlers {
                    let _ = h.send(Notice::FenceDone).await;
                }
            }
            .in_current_span(),
        );
    }

    /// Fence `generation` of `ns` with this node's `puts`: every node's puts, or `None`
    /// once the job was aborted (here, or by the failure that stopped the fence).
    async fn gather(
        &self,
        ns: &Ns,
        generation: u64,
        puts: &[(String, String)],
    ) -> Option<Vec<Vec<(String, String)>>> {
        let blob = match postcard::to_stdvec(puts) {
            Ok(b) => Bytes::from(b),
            Err(e) => {
                let reason = format!("cannot encode this node's puts: {e}");
                self.abort(None, 1, reason).await;
                return None;
            }
        };
        let blobs = match ns.spawner {
            None => family::allgather(&self.overlay, Family::Pmi, &self.job, blob).await,
            Some(_) => spawned::fence(self, ns, generation, blob).await,
        };
        let blobs = match blobs {
            Ok(b) => b,
            Err(e) => {
                // Timeouts and aborts have already aborted the job; the abort watcher closes the ranks.
                warn!(nspace = %ns.id(), "fence failed: {e}");
                return None;
            }
        };
        let mut decoded = Vec::with_capacity(blobs.len());
        for (node, blob) in blobs.iter().enumerate() {
            match postcard::from_bytes::<Vec<(String, String)>>(blob) {
                Ok(kv) => decoded.push(kv),
                Err(e) => {
                    let reason = format!(
                        "fence of {}: undecodable key/values from node {node}: {e}",
                        ns.id()
                    );
                    self.abort(None, 1, reason).await;
                    return None;
                }
            }
        }
        Some(decoded)
    }
}

/// Asks node 0's name table on behalf of a rank and hands the answer to the rank's handler.
async fn ask_names(shared: Arc<Shared>, request: names::Request, to: mpsc::Sender<Notice>) {
    let body = names::encode_request(&request);
    let answer = tokio::select! {
        _ = shared.shutdown.cancelled() => return,
        r = shared.overlay.request(names::NAMES_NODE, Service::Names, body) => match r {
            Ok(bytes) => names::decode_response(&bytes),
            Err(e) => {
                // The rank gets an error reply; the log says which rank could not reach node 0.
                warn!("name service: {e}");
                names::Response::Failed(format!("name service: {e}"))
            }
        },
    };
    let _ = to.send(Notice::Names(answer)).await;
}

async fn abort_watch(shared: Arc<Shared>) {
    let mut aborted = shared.overlay.aborted();
    tokio::select! {
        _ = shared.shutdown.cancelled() => {}
        r = aborted.wait_for(Option::is_some) => {
            if r.is_ok() {
                // Release every rank: their handlers close the connections, so blocked clients fail.
                shared.shutdown.cancel();
            }
        }
    }
}

/// Serves one rank's connection until it finalizes and closes, fails, or the server stops.
async fn serve_rank<S: AsyncRead + AsyncWrite + Unpin>(
    shared: Arc<Shared>,
    ns: Arc<Ns>,
    stream: S,
    rank: u32,
) {
    RankHandler::new(shared, ns, stream, rank).run().await;
}

/// One rank's connection: its PMI session and what it has done so far.
struct RankHandler<S> {
    /// The node's overlay, spawner and abort.
    shared: Arc<Shared>,
    /// The rank's namespace: its KVS and fences.
    ns: Arc<Ns>,
    /// The rank's end of its socketpair.
    stream: S,
    rank: u32,
    /// The sans-I/O PMI-1/PMI-2 protocol state of this connection.
    session: Session,
    /// Fence releases and node attributes for this rank.
    notices: mpsc::Receiver<Notice>,
    /// Keeps the notice channel open as long as the handler runs; name-service answers come on it.
    notices_tx: mpsc::Sender<Notice>,
    /// Bytes read from the rank and not parsed yet.
    buf: BytesMut,
    /// The connection closed (or a write failed) before the rank finalized.
    closed_early: bool,
    /// Whether this rank sent anything: a task that never speaks PMI is not a client.
    spoke: bool,
}

impl<S: AsyncRead + AsyncWrite + Unpin> RankHandler<S> {
    /// Registers rank `rank`'s handler for notices.
    fn new(shared: Arc<Shared>, ns: Arc<Ns>, stream: S, rank: u32) -> Self {
        let (tx, notices) = mpsc::channel(NOTICE_CAPACITY);
        ns.lock().handlers.insert(rank, tx.clone());
        RankHandler {
            shared,
            ns,
            stream,
            rank,
            session: Session::new(Some(rank)),
            notices,
            notices_tx: tx,
            buf: BytesMut::with_capacity(4096),
            closed_early: false,
            spoke: false,
        }
    }

    /// Serves notices and the rank's requests until the connection ends, then checks how.
    async fn run(mut self) {
        loop {
            let flow = tokio::select! {
                _ = self.shared.shutdown.cancelled() => break,
                Some(notice) = self.notices.recv() => self.on_notice(notice).await,
                read = self.stream.read_buf(&mut self.buf) => self.on_read(read).await,
            };
            if flow.is_break() {
                break;
            }
        }
        self.ns.lock().handlers.remove(&self.rank);
        if self.closed_early && self.spoke {
            self.closed_before_finalize().await;
        }
    }

    /// A fence or node attribute this rank may be waiting for.
    async fn on_notice(&mut self, notice: Notice) -> ControlFlow<()> {
        let reply = match notice {
            Notice::FenceDone => self.session.fence_done(),
            Notice::NodeAttr(k, v) => self.session.node_attr_ready(&k, &v),
            Notice::Names(answer) => self.session.names_done(&answer),
            Notice::Spawned(answer) => self.session.spawn_done(&answer),
        };
        if !reply.is_empty() && self.stream.write_all(&reply).await.is_err() {
            self.closed_early = !self.session.finalized();
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }

    /// Bytes from the rank (or its close): carries out every request they complete.
    async fn on_read(&mut self, read: std::io::Result<usize>) -> ControlFlow<()> {
        if matches!(read, Ok(0) | Err(_)) {
            self.closed_early = !self.session.finalized();
            return ControlFlow::Break(());
        }
        loop {
            let Some(actions) = self.poll().await? else {
                return ControlFlow::Continue(());
            };
            for action in actions {
                self.on_action(action).await?;
            }
        }
    }

    /// The session's next request from the buffer: its actions, `None` until more bytes
    /// come; breaks when the job is aborted.
    async fn poll(&mut self) -> ControlFlow<(), Option<Vec<Action>>> {
        let shared = &self.shared;
        let ns = &self.ns;
        let rank = self.rank;
        let (polled, attr_puts) = {
            let mut st = ns.lock();
            if !self.spoke {
                st.spoke.insert(rank);
            }
            let mut view = View {
                ns,
                universe: self.shared.config.universe.unwrap_or(0),
                topology: &shared.topology,
                state: &mut st,
                attr_puts: Vec::new(),
            };
            let polled = self.session.poll(&mut self.buf, &mut view);
            (polled, view.attr_puts)
        };
        if !self.spoke {
            self.spoke = true;
            debug!(nspace = %ns.id(), rank, "rank's first PMI message");
            // A spawned job's ranks share numbers with the job's: its own record says who spoke.
            let gone = match ns.spawner {
                None => shared.departures.spoke(rank, Family::Pmi),
                Some(_) => None,
            };
            if let Some((gone, reason)) = gone {
                shared.abort(Some(gone), 1, reason).await;
                return ControlFlow::Break(());
            }
        }
        for (k, v) in attr_puts {
            let handlers: Vec<_> = ns.lock().handlers.values().cloned().collect();
            for h in handlers {
                let _ = h.send(Notice::NodeAttr(k.clone(), v.clone())).await;
            }
        }
        match polled {
            Ok(actions) => ControlFlow::Continue(actions),
            Err(e) => {
                let reason = format!("node {} {}: {e}", shared.job.node_idx, ns.who(rank));
                shared.abort(ns.abort_rank(rank), 1, reason).await;
                ControlFlow::Break(())
            }
        }
    }

    /// Carries out one action of the session.
    async fn on_action(&mut self, action: Action) -> ControlFlow<()> {
        let rank = self.rank;
        match action {
            Action::Send(bytes) => {
                if self.stream.write_all(&bytes).await.is_err() {
                    self.closed_early = !self.session.finalized();
                    return ControlFlow::Break(());
                }
            }
            Action::Fence => {
                debug!(nspace = %self.ns.id(), rank, "rank entered fence");
                self.shared.enter_fence(&self.ns, rank)
            }
            Action::WaitNodeAttr(_) => {}
            Action::Names(request) => {
                let ask = ask_names(self.shared.clone(), request, self.notices_tx.clone());
                self.shared.tracker.spawn(ask.in_current_span());
            }
            Action::Spawn(request) => {
                let request = spawned::request(self.ns.id(), rank, request);
                debug!(rank, procs = request.total_procs(), "spawn asked");
                let ask = spawned::ask(self.shared.clone(), request, self.notices_tx.clone());
                self.shared.tracker.spawn(ask.in_current_span());
            }
            Action::Finalized => {
                self.ns.lock().finalized.insert(rank);
            }
            Action::Abort { code, msg } => {
                let who = self.ns.who(rank);
                let reason = format!("{who} called abort (code {code}): {msg:?}");
                self.shared
                    .abort(self.ns.abort_rank(rank), code, reason)
                    .await;
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }

    /// The rank closed its connection before finalize: aborts the job unless the launcher
    /// reports the rank's exit within the grace time, which makes the better message.
    async fn closed_before_finalize(&self) {
        let r = self.rank;
        tokio::select! {
            _ = self.shared.shutdown.cancelled() => return,
            _ = tokio::time::sleep(self.shared.config.early_close_grace) => {}
        }
        let exited = self.ns.lock().exited.contains_key(&r);
        if !exited {
            let who = self.ns.who(r);
            let reason = format!("{who} closed its PMI connection before finalize");
            self.shared.abort(self.ns.abort_rank(r), 1, reason).await;
        }
    }
}
