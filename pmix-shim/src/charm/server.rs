//! The netlrts service of one node agent: a TCP listener for its ranks, the node table over one allgather, runtime requests.
//!
//! Flow: [`CharmServer::start`] binds `config.bind` (loopback: only this host's processes can
//! connect, and each connection is admitted only if its client socket is held by a process of
//! the job, [`crate::peer`]; a stranger's connection is closed before a byte is read) → the
//! launcher gives each rank [`CharmServer::env_for`] → each connection's `initnode` is checked
//! against the local ranks, and the node table gives the ranks `config.advertise` (this
//! host's cluster address, where the other hosts send their datagrams) → once all local ranks are in, one overlay
//! allgather carries this node's [`Report`]s, every node builds the same table and sends it →
//! `barrier`/`barrier0` are an overlay barrier once all local ranks entered → `ending`: once
//! every local rank sent it, an overlay barrier (so no socket closes while a peer may still
//! need acks on the UDP data path), then each rank that ended with 0 gets `die` (on which a
//! netlrts client exits 0) and the others see their connection closed (on which it exits 1):
//! the process's own status is as close to its `ending` code as the client allows, which
//! matters where the embedder cannot rewrite it (Slurm reports the process's real status);
//! [`CharmServer::exit_code`] gives the launcher the real one.
//!
//! Failures abort the job through the overlay, naming the rank and its host: a rank that
//! exits before `ending` (before `initnode` too: charm4py sends its early errors to
//! /dev/null), a malformed stream, `abort`, or local ranks not connected within
//! `connect_timeout` of the node's first. Output (`print`, `printerr`) goes to the launcher as [`Output`] on a
//! bounded channel, so a flood slows the client rather than growing memory.

use std::{
    collections::{HashMap, HashSet},
    net::{Ipv4Addr, SocketAddr},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use bytes::Bytes;
use tokio::{net::TcpListener, sync::mpsc};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{Instrument, debug, info_span, warn};

mod connection;

use super::{ENTRY_LEN, Report, node_table, nodetab_frame};
use crate::{
    AbortInfo, Error, JobSpec,
    departures::Departures,
    family::{self, Family},
    listener,
    overlay::Overlay,
    peer::JobProcesses,
};

/// Settings of the netlrts service.
#[derive(Debug, Clone)]
pub struct CharmConfig {
    /// Where to listen: loopback, since only this host's ranks connect (a netlrts client
    /// reads the address from `NETSTART`, IPv4 only).
    pub bind: SocketAddr,
    /// This host's cluster address: the node table tells the other hosts to send this
    /// node's ranks their datagrams there.
    pub advertise: Ipv4Addr,
    /// Who may connect: the job's own processes.
    pub admit: JobProcesses,
    /// How long, from the node's first `initnode`, its other local ranks have to connect and
    /// send theirs. A client retries its connect for 30 minutes and hides its errors; this
    /// names it much sooner. (Before any rank connects, the node may be serving another
    /// family; a node none of whose ranks connect is named by the others' collective timeout.)
    pub connect_timeout: Duration,
    /// After a rank's connection drops before `ending`, how long to wait for the launcher to
    /// report its exit code, so the abort names the code.
    pub early_close_grace: Duration,
    /// Where a client's `scanf` is answered: the embedder reads that rank's standard input.
    /// `None`: `scanf` aborts the job (the embedder gives stdin to the rank's fd 0 instead,
    /// and one stream cannot be split two ways).
    pub scanf: Option<mpsc::Sender<ScanfRequest>>,
}

/// A client's `scanf`, for the embedder to answer from that rank's standard input.
#[derive(Debug)]
pub struct ScanfRequest {
    /// Whose stdin.
    pub rank: u32,
    /// How many values the format converts ([`super::scanf_conversions`]).
    pub conversions: usize,
    /// The text for `scanf-data` ([`super::scanf_take`] of what was read), or `None` at the
    /// end of the rank's input (the job is aborted, as charmrun exits at end of file).
    pub reply: tokio::sync::oneshot::Sender<Option<String>>,
}

impl CharmConfig {
    /// Defaults: listen on an ephemeral loopback port, advertise `advertise`, admit `admit`.
    pub fn new(advertise: Ipv4Addr, admit: JobProcesses) -> CharmConfig {
        CharmConfig {
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            advertise,
            admit,
            connect_timeout: Duration::from_secs(120),
            early_close_grace: Duration::from_millis(500),
            scanf: None,
        }
    }
}

/// Rank output that arrived over the protocol, for the launcher's stdio path. An empty
/// `data` is the end of that rank's output: its connection is closed and everything it sent
/// was passed on before ([`Output::is_end`]); an embedder that holds a descriptor per rank
/// can close it then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Whose.
    pub rank: u32,
    /// Standard error rather than output.
    pub stderr: bool,
    /// The bytes; empty only in the end marker.
    pub data: Bytes,
}

impl Output {
    /// Whether this is the end marker of its rank's output.
    pub fn is_end(&self) -> bool {
        self.data.is_empty()
    }
}

/// Capacity of the output channel: a few hundred prints in flight before the clients (10 ms
/// flush period each) are slowed by the launcher's pipe.
pub const OUTPUT_CAPACITY: usize = 256;

/// Capacity of each handler's queue: table, a barrier release, close; never more than a few.
const NOTICE_CAPACITY: usize = 8;

#[derive(Debug, Clone)]
enum Notice {
    Send(Vec<u8>),
    /// The job ended cleanly everywhere: `die` if the rank's code is 0, else close.
    End,
    /// The job was aborted: `die` with this message (the client exits 0 by itself, so the
    /// job's status stays the failing rank's where the embedder cannot rewrite statuses).
    Die(String),
}

/// After `die`, how long a client has to exit by itself before its connection is closed (it
/// exits at once; a close instead would make it exit 1).
const DIE_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug, Default)]
struct NodeState {
    reports: Vec<Report>,
    handlers: HashMap<u32, mpsc::Sender<Notice>>,
    in_barrier: HashSet<u32>,
    in_barrier0: HashSet<u32>,
    endings: HashMap<u32, i32>,
    exited: HashMap<u32, i32>,
    table_sent: bool,
}

/// A running netlrts service for one node's ranks; cheap to clone.
#[derive(Clone, Debug)]
pub struct CharmServer {
    inner: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    job: Arc<JobSpec>,
    overlay: Overlay,
    config: CharmConfig,
    addr: SocketAddr,
    output: mpsc::Sender<Output>,
    state: Mutex<NodeState>,
    /// Who of this node spoke which family (shared with the node's other servers).
    departures: Departures,
    /// Notified at the first `initnode`: the connect timeout runs from there.
    first_connect: tokio::sync::Notify,
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

impl CharmServer {
    /// Starts serving `job`'s local ranks; output goes to `output`.
    pub async fn start(
        job: &JobSpec,
        overlay: Overlay,
        config: CharmConfig,
        output: mpsc::Sender<Output>,
    ) -> Result<CharmServer, Error> {
        Self::start_on(job, overlay, config, output, Departures::default()).await
    }

    /// As [`CharmServer::start`], sharing the node's record of who spoke what.
    pub(crate) async fn start_on(
        job: &JobSpec,
        overlay: Overlay,
        config: CharmConfig,
        output: mpsc::Sender<Output>,
        departures: Departures,
    ) -> Result<CharmServer, Error> {
        job.validate()?;
        let me = job.node_idx;
        let (listener, addr) = listener::bind(me, config.bind, "netlrts listener address").await?;
        let shared = Arc::new(Shared {
            job: Arc::new(job.clone()),
            overlay,
            config,
            addr,
            output,
            state: Mutex::new(NodeState::default()),
            departures,
            first_connect: tokio::sync::Notify::new(),
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
        });
        let span = info_span!("charm", job = %job.job_id, node = me);
        shared
            .tracker
            .spawn(accept_loop(shared.clone(), listener).instrument(span.clone()));
        shared.tracker.spawn(watch(shared.clone()).instrument(span));
        Ok(CharmServer { inner: shared })
    }

    /// The listener's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// The variables `rank` needs: `NETSTART` (the rank as node number, this listener) and the
    /// job's `NETMAGIC`. No `PMI_*`: the wheel's libcharm reads none.
    pub fn env_for(&self, rank: u32) -> Vec<(String, String)> {
        let a = self.inner.addr;
        vec![
            (
                "NETSTART".into(),
                format!(
                    "{rank} {} {} {} 0",
                    a.ip(),
                    a.port(),
                    std::process::id() & 0x7fff
                ),
            ),
            (
                "NETMAGIC".into(),
                super::netmagic(&self.inner.job.job_id).to_string(),
            ),
        ]
    }

    /// The launcher reports that a local rank exited with `code`; before `ending` that aborts
    /// the job, naming the rank and its host.
    pub async fn rank_exited(&self, rank: u32, code: i32) {
        let (ended, connected) = {
            let mut st = self.inner.lock();
            st.exited.insert(rank, code);
            (
                st.endings.contains_key(&rank),
                st.reports.iter().any(|r| r.rank == rank),
            )
        };
        if !ended {
            let when = if connected {
                "before Charm++ ending"
            } else {
                "before connecting to its netlrts service (charm4py discards its own errors until then: run it without greedyrun to see them)"
            };
            let reason = format!(
                "rank {rank} on {} exited with code {code} {when}",
                self.inner.host()
            );
            self.inner.abort(Some(rank), code.max(1), reason).await;
        }
    }

    /// The code the rank reported in `ending`: the job's real exit status for that rank (the
    /// client itself exits 1 when the launcher closes its socket).
    pub fn exit_code(&self, rank: u32) -> Option<i32> {
        self.inner.lock().endings.get(&rank).copied()
    }

    /// Stops the listener and every handler (clients see their socket close and exit).
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, NodeState> {
        // A panic while holding the lock leaves at worst a stale count; stopping the job is
        // worse, so take the data anyway.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn host(&self) -> &str {
        &self.job.hosts[self.job.node_idx]
    }

    async fn abort(&self, rank: Option<u32>, code: i32, reason: String) {
        // Once the job is aborted, every rank's end is a consequence, not news.
        if self.overlay.aborted().borrow().is_some() {
            debug!(?rank, code, "after the abort: {reason}");
            return;
        }
        warn!(?rank, code, "aborting job: {reason}");
        self.overlay
            .abort(AbortInfo::new(self.job.node_idx, rank, code, reason))
            .await;
    }

    fn all_local(&self, set_len: usize) -> bool {
        set_len == self.job.local_ranks().len()
    }

    fn handlers(&self) -> Vec<(u32, mpsc::Sender<Notice>)> {
        self.lock()
            .handlers
            .iter()
            .map(|(r, h)| (*r, h.clone()))
            .collect()
    }

    /// Runs an overlay collective in the background, then sends each local handler what
    /// `after` gives for its rank.
    fn after_collective<F>(self: &Arc<Self>, what: &'static str, blob: Option<Bytes>, after: F)
    where
        F: FnOnce(&Arc<Shared>, Vec<Bytes>) -> Result<Vec<(u32, Notice)>, String> + Send + 'static,
    {
        let shared = self.clone();
        self.tracker.spawn(
            async move {
                let res = match blob {
                    Some(b) => {
                        family::allgather(&shared.overlay, Family::Charm, &shared.job, b).await
                    }
                    None => shared.overlay.barrier().await.map(|()| Vec::new()),
                };
                let blobs = match res {
                    Ok(b) => b,
                    Err(e) => {
                        // Timeouts and aborts have already aborted the job; the watcher closes the clients.
                        warn!("{what} failed: {e}");
                        return;
                    }
                };
                let notices = match after(&shared, blobs) {
                    Ok(n) => n,
                    Err(reason) => {
                        shared.abort(None, 1, format!("{what}: {reason}")).await;
                        return;
                    }
                };
                let handlers: HashMap<u32, mpsc::Sender<Notice>> =
                    shared.handlers().into_iter().collect();
                for (rank, notice) in notices {
                    if let Some(h) = handlers.get(&rank) {
                        let _ = h.send(notice).await;
                    }
                }
                debug!("{what} complete");
            }
            .in_current_span(),
        );
    }

    /// A rank's `initnode` was accepted; the last local one starts the table allgather.
    fn reported(self: &Arc<Self>, report: Report) {
        let mine = {
            let mut st = self.lock();
            st.reports.push(report);
            if !self.all_local(st.reports.len()) {
                return;
            }
            st.table_sent = true;
            st.reports.clone()
        };
        let blob = match postcard::to_stdvec(&mine) {
            Ok(b) => Bytes::from(b),
            Err(e) => {
                warn!("cannot encode the node's reports: {e}");
                return;
            }
        };
        self.after_collective("node table", Some(blob), |shared, blobs| {
            let per_node = blobs
                .iter()
                .enumerate()
                .map(|(node, b)| {
                    postcard::from_bytes::<Vec<Report>>(b)
                        .map_err(|e| format!("undecodable reports from node {node}: {e}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let table: Vec<[u8; ENTRY_LEN]> = node_table(&per_node)?;
            Ok(shared
                .job
                .local_ranks()
                .iter()
                .map(|&r| (r, Notice::Send(nodetab_frame(&table, r))))
                .collect())
        });
    }

    /// A rank entered `barrier` (or `barrier0`); the last local one runs an overlay barrier.
    ///
    /// `barrier0` (`CmiBarrierZero`: node 0 leaves last) waits for every process, like
    /// `barrier`. charmrun instead replies once it has as many `barrier0`s as *hosts*
    /// (research/charm-protocol.md §2), which with several processes per host releases node 0
    /// early and then a second time for the same round. Every process of a non-SMP build sends
    /// one per round, so waiting for all never holds node 0 longer than charmrun would once
    /// its round is complete; copying the host count would copy the double reply.
    fn barrier(self: &Arc<Self>, rank: u32, zero: bool) {
        {
            let mut st = self.lock();
            let set = if zero {
                &mut st.in_barrier0
            } else {
                &mut st.in_barrier
            };
            set.insert(rank);
            if !self.all_local(set.len()) {
                return;
            }
            set.clear();
        }
        let what = if zero { "barrier0" } else { "barrier" };
        self.after_collective(what, None, move |shared, _| {
            let frame = super::barrier_frame(zero);
            Ok(shared
                .job
                .local_ranks()
                .iter()
                // barrier0 releases node 0 only (charmrun replies to it alone).
                .filter(|&&r| !zero || r == 0)
                .map(|&r| (r, Notice::Send(frame.clone())))
                .collect())
        });
    }

    /// A rank sent `ending`; once all local ranks have, and every node agrees, close them all.
    fn ending(self: &Arc<Self>, rank: u32, code: i32) {
        {
            let mut st = self.lock();
            st.endings.insert(rank, code);
            if !self.all_local(st.endings.len()) {
                return;
            }
        }
        self.after_collective("ending", None, |shared, _| {
            Ok(shared
                .job
                .local_ranks()
                .iter()
                .map(|&r| (r, Notice::End))
                .collect())
        });
    }
}

/// Aborts the job when the local ranks are not all connected in time; stops the clients when
/// the job is aborted elsewhere.
async fn watch(shared: Arc<Shared>) {
    let mut aborted = shared.overlay.aborted();
    // Armed by the node's first rank: a node serving every family cannot expect a netlrts
    // client before one shows up.
    let deadline = tokio::time::sleep(Duration::MAX);
    tokio::pin!(deadline);
    let mut armed = false;
    let mut waiting = true;
    loop {
        tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            _ = shared.first_connect.notified(), if waiting => {
                waiting = false;
                armed = true;
                deadline.as_mut().reset(tokio::time::Instant::now() + shared.config.connect_timeout);
            }
            msg = async {
                aborted.wait_for(Option::is_some).await.ok().map(|info| {
                    format!("job aborted by {}", info.as_ref().expect("waited for Some"))
                })
            } => {
                if let Some(msg) = msg {
                    for (_, h) in shared.handlers() {
                        let _ = h.send(Notice::Die(msg.clone())).await;
                    }
                }
                return;
            }
            _ = &mut deadline, if armed => {
                armed = false;
                let missing: Vec<u32> = {
                    let st = shared.lock();
                    if st.table_sent { continue; }
                    shared.job.local_ranks().iter().copied()
                        .filter(|r| !st.reports.iter().any(|x| x.rank == *r)).collect()
                };
                let list: Vec<String> = missing.iter().map(u32::to_string).collect();
                let reason = format!(
                    "ranks {} on {} did not connect to the netlrts service within connect_timeout ({:?})",
                    list.join(","), shared.host(), shared.config.connect_timeout
                );
                shared.abort(missing.first().copied(), 1, reason).await;
            }
        }
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    // One connection per local rank; a few extra for strays of the job, which are dropped at
    // initnode. A stranger holds a slot only for the kernel lookup that refuses it.
    let max = shared.job.local_ranks().len() + 8;
    let (shutdown, tracker) = (&shared.shutdown, &shared.tracker);
    let local = shared.addr;
    listener::accept_loop(
        listener,
        max,
        shutdown,
        tracker,
        "netlrts",
        |stream, peer| {
            let _ = stream.set_nodelay(true);
            let s = shared.clone();
            async move {
                // Debug, not warn: a stranger's probe must not write into the job's stderr.
                match s.config.admit.admit_async(peer, local).await {
                    Ok(owner) => debug!(%peer, ?owner, "netlrts client"),
                    Err(refused) => return debug!("netlrts connection refused: {refused}"),
                }
                connection::serve(s, stream).await;
            }
            .instrument(info_span!("conn", %peer, rank = tracing::field::Empty))
        },
    )
    .await
}
