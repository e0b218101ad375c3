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

use bytes::{Bytes, BytesMut};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    sync::mpsc,
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{Instrument, debug, info_span, warn};

use crate::{
    AbortInfo, Error, JobSpec,
    child::{ChildJob, Spawns},
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
}

impl Default for PmiConfig {
    fn default() -> Self {
        PmiConfig {
            early_close_grace: Duration::from_millis(500),
            fence_timeout: Duration::from_secs(300),
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
}

/// Capacity of each handler's notice queue: at most one fence release is outstanding per rank,
/// plus node-attribute puts, which MPICH makes a handful of per node, plus at most one
/// name-service answer (the client waits for it).
const NOTICE_CAPACITY: usize = 64;

#[derive(Debug, Default)]
struct NodeState {
    /// Job-wide KVS as of the last fence.
    kvs: HashMap<String, String>,
    /// This node's puts since the last fence, in order.
    pending: Vec<(String, String)>,
    node_attrs: HashMap<String, String>,
    claimed: HashSet<u32>,
    in_fence: HashSet<u32>,
    finalized: HashSet<u32>,
    exited: HashMap<u32, i32>,
    handlers: HashMap<u32, mpsc::Sender<Notice>>,
    fences: u64,
    /// Fences whose allgather has started (all local ranks were in).
    fences_started: u64,
}

/// The session's view of the node while the state lock is held.
struct View<'a> {
    job: &'a JobSpec,
    mapping: &'a str,
    state: &'a mut NodeState,
    attr_puts: Vec<(String, String)>,
}

impl Node for View<'_> {
    fn job_id(&self) -> &str {
        &self.job.job_id
    }
    fn n_ranks(&self) -> u32 {
        self.job.n_ranks()
    }
    fn get(&self, key: &str) -> Option<String> {
        if key == "PMI_process_mapping" {
            return Some(self.mapping.to_owned());
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
            "PMI_process_mapping" => Some(self.mapping.to_owned()),
            "universeSize" => Some(self.job.n_ranks().to_string()),
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
        self.job.local_ranks().contains(&rank) && self.state.claimed.insert(rank)
    }
}

/// A running PMI server for one node's ranks; cheap to clone.
#[derive(Clone, Debug)]
pub struct PmiServer {
    inner: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    job: Arc<JobSpec>,
    mapping: String,
    overlay: Overlay,
    config: PmiConfig,
    state: Mutex<NodeState>,
    /// Who of this node spoke which family (shared with the node's other servers).
    departures: Departures,
    /// The way to the embedder's spawner (PMI-1 `mcmd=spawn`, PMI-2 `spawn`).
    #[allow(dead_code)]
    spawns: Spawns,
    shutdown: CancellationToken,
    tracker: TaskTracker,
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
        let shared = Arc::new(Shared {
            job: Arc::new(job.clone()),
            mapping: job.process_mapping(),
            overlay,
            config,
            state: Mutex::new(NodeState::default()),
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
        let me = self.inner.job.node_idx;
        let io = |what, source| Error::Io {
            node: me,
            what,
            source,
        };
        if !self.inner.lock().claimed.insert(rank) || !self.inner.job.local_ranks().contains(&rank)
        {
            return Err(Error::InvalidJob {
                job: self.inner.job.job_id.clone(),
                reason: format!("rank {rank} is not a free local rank of node {me}"),
            });
        }
        let (ours, theirs) =
            std::os::unix::net::UnixStream::pair().map_err(|e| io("socketpair", e))?;
        ours.set_nonblocking(true)
            .map_err(|e| io("socketpair", e))?;
        let ours = tokio::net::UnixStream::from_std(ours).map_err(|e| io("socketpair", e))?;
        let shared = self.inner.clone();
        let span = info_span!("pmi", job = %self.inner.job.job_id, node = me, rank);
        self.inner
            .tracker
            .spawn(serve_rank(shared, ours, rank).instrument(span));
        let mut env = self.common_env(rank);
        let fd = child_fd.unwrap_or_else(|| std::os::fd::AsRawFd::as_raw_fd(&theirs));
        env.push(("PMI_FD".into(), fd.to_string()));
        Ok((theirs, env))
    }

    fn common_env(&self, rank: u32) -> Vec<(String, String)> {
        let job = &self.inner.job;
        let local = job.local_ranks();
        let local_id = local.iter().position(|&r| r == rank).unwrap_or(0);
        vec![
            ("PMI_RANK".into(), rank.to_string()),
            ("PMI_SIZE".into(), job.n_ranks().to_string()),
            ("PMI_JOBID".into(), job.job_id.clone()),
            ("MPI_LOCALNRANKS".into(), local.len().to_string()),
            ("MPI_LOCALRANKID".into(), local_id.to_string()),
        ]
    }

    /// The launcher reports that a local rank exited with `code` (128+signal for a signal).
    ///
    /// An exit before `finalize` aborts the job, naming the rank and the code, unless the rank
    /// never spoke PMI and exited 0 (not a PMI client; [`crate::departures`] has the rule).
    pub async fn rank_exited(&self, rank: u32, code: i32) {
        let reason = {
            let mut st = self.inner.lock();
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
    /// keys), fences over the nodes hosting its ranks.
    pub fn add_child(&self, child: &ChildJob) -> Result<(), Error> {
        Err(Error::InvalidJob {
            job: child.nspace.clone(),
            reason: "PMI does not serve spawned jobs yet".into(),
        })
    }

    /// As [`PmiServer::socketpair_for`], for local `rank` of child namespace `nspace`
    /// (its environment also says it was spawned: `PMI_SPAWNED=1`).
    pub fn child_socketpair_for(
        &self,
        nspace: &str,
        rank: u32,
        child_fd: Option<i32>,
    ) -> Result<(std::os::unix::net::UnixStream, Vec<(String, String)>), Error> {
        let _ = (rank, child_fd);
        Err(Error::InvalidJob {
            job: nspace.into(),
            reason: "PMI does not serve spawned jobs yet".into(),
        })
    }

    /// As [`PmiServer::rank_exited`], for local `rank` of child namespace `nspace`.
    pub async fn child_exited(&self, nspace: &str, rank: u32, code: i32) {
        let _ = (nspace, rank, code);
    }

    /// Number of fences completed on this node.
    pub fn fences(&self) -> u64 {
        self.inner.lock().fences
    }

    /// Stops every listener and handler and waits for them.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, NodeState> {
        // A panic while holding the lock cannot leave NodeState half-updated in a way that
        // matters more than stopping the job would, so take the data anyway.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Names the local ranks that have not entered fence `generation` once `fence_timeout` has
    /// passed since the first one did. This fires before the overlay's collective timeout
    /// (staggered above it), so the job's abort names ranks, not just a node.
    fn watch_local_fence(self: &Arc<Self>, generation: u64) {
        let shared = self.clone();
        self.tracker.spawn(
            async move {
                tokio::select! {
                    _ = shared.shutdown.cancelled() => return,
                    _ = tokio::time::sleep(shared.config.fence_timeout) => {}
                }
                let missing: Vec<u32> = {
                    let st = shared.lock();
                    if st.fences_started != generation {
                        return;
                    }
                    shared.job.local_ranks().iter().copied().filter(|r| !st.in_fence.contains(r)).collect()
                };
                let list: Vec<String> = missing.iter().map(u32::to_string).collect();
                let reason = format!(
                    "node {} fence #{generation}: ranks {} have not entered it after fence_timeout ({:?})",
                    shared.job.node_idx,
                    list.join(","),
                    shared.config.fence_timeout
                );
                shared.abort(missing.first().copied(), 1, reason).await;
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

    /// A rank entered a fence; the last local rank to enter starts the allgather.
    fn enter_fence(self: &Arc<Self>, rank: u32) {
        let puts = {
            let mut st = self.lock();
            let first = st.in_fence.is_empty();
            st.in_fence.insert(rank);
            if st.in_fence.len() < self.job.local_ranks().len() {
                if first {
                    self.watch_local_fence(st.fences_started);
                }
                return;
            }
            st.in_fence.clear();
            st.fences_started += 1;
            std::mem::take(&mut st.pending)
        };
        let shared = self.clone();
        self.tracker.spawn(
            async move {
                let blob = match postcard::to_stdvec(&puts) {
                    Ok(b) => Bytes::from(b),
                    Err(e) => {
                        shared
                            .abort(None, 1, format!("cannot encode this node's puts: {e}"))
                            .await;
                        return;
                    }
                };
                let blobs = match family::allgather(&shared.overlay, Family::Pmi, &shared.job, blob)
                    .await
                {
                    Ok(b) => b,
                    Err(e) => {
                        // Timeouts and aborts have already aborted the job; the abort watcher closes the ranks.
                        warn!("fence failed: {e}");
                        return;
                    }
                };
                let mut decoded = Vec::with_capacity(blobs.len());
                for (node, blob) in blobs.iter().enumerate() {
                    match postcard::from_bytes::<Vec<(String, String)>>(blob) {
                        Ok(kv) => decoded.push(kv),
                        Err(e) => {
                            let reason =
                                format!("fence: undecodable key/values from node {node}: {e}");
                            shared
                                .overlay
                                .abort(AbortInfo::new(shared.job.node_idx, None, 1, reason))
                                .await;
                            return;
                        }
                    }
                }
                let handlers: Vec<mpsc::Sender<Notice>> = {
                    let mut st = shared.lock();
                    for (k, v) in decoded.into_iter().flatten() {
                        st.kvs.insert(k, v);
                    }
                    st.fences += 1;
                    st.handlers.values().cloned().collect()
                };
                debug!("fence complete");
                for h in handlers {
                    let _ = h.send(Notice::FenceDone).await;
                }
            }
            .in_current_span(),
        );
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
async fn serve_rank<S: AsyncRead + AsyncWrite + Unpin>(shared: Arc<Shared>, stream: S, rank: u32) {
    RankHandler::new(shared, stream, rank).run().await;
}

/// One rank's connection: its PMI session and what it has done so far.
struct RankHandler<S> {
    /// The node's KVS, fences and abort.
    shared: Arc<Shared>,
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
    fn new(shared: Arc<Shared>, stream: S, rank: u32) -> Self {
        let (tx, notices) = mpsc::channel(NOTICE_CAPACITY);
        shared.lock().handlers.insert(rank, tx.clone());
        RankHandler {
            shared,
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
        self.shared.lock().handlers.remove(&self.rank);
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
        let rank = self.rank;
        let (polled, attr_puts) = {
            let mut st = shared.lock();
            let mut view = View {
                job: &shared.job,
                mapping: &shared.mapping,
                state: &mut st,
                attr_puts: Vec::new(),
            };
            let polled = self.session.poll(&mut self.buf, &mut view);
            (polled, view.attr_puts)
        };
        if !self.spoke {
            self.spoke = true;
            let gone = shared.departures.spoke(rank, Family::Pmi);
            if let Some((gone, reason)) = gone {
                shared.abort(Some(gone), 1, reason).await;
                return ControlFlow::Break(());
            }
        }
        for (k, v) in attr_puts {
            let handlers: Vec<_> = shared.lock().handlers.values().cloned().collect();
            for h in handlers {
                let _ = h.send(Notice::NodeAttr(k.clone(), v.clone())).await;
            }
        }
        match polled {
            Ok(actions) => ControlFlow::Continue(actions),
            Err(e) => {
                let reason = format!("node {} rank {rank}: {e}", shared.job.node_idx);
                shared.abort(Some(rank), 1, reason).await;
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
            Action::Fence => self.shared.enter_fence(rank),
            Action::WaitNodeAttr(_) => {}
            Action::Names(request) => {
                let ask = ask_names(self.shared.clone(), request, self.notices_tx.clone());
                self.shared.tracker.spawn(ask.in_current_span());
            }
            Action::Finalized => {
                self.shared.lock().finalized.insert(rank);
            }
            Action::Abort { code, msg } => {
                let reason = format!("rank {rank} called abort (code {code}): {msg:?}");
                self.shared.abort(Some(rank), code, reason).await;
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
        let exited = self.shared.lock().exited.contains_key(&r);
        if !exited {
            self.shared
                .abort(
                    Some(r),
                    1,
                    format!("rank {r} closed its PMI connection before finalize"),
                )
                .await;
        }
    }
}
