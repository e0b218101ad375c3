//! The tree overlay between node agents: TCP links, authentication, and the collective engine's I/O.
//!
//! Flow of [`Overlay::start`]: compute the greedy tree from the job description (the same on
//! every node, no messages), bind a listener, publish its address through the
//! [`Rendezvous`], connect to the parent (found through the rendezvous), accept the children,
//! then run one allgather of listener addresses (the *join*) so that every node can later open
//! direct links for the ring. `start` returns once the whole tree is connected.
//!
//! Tasks (mini-redis style): one accept loop; one reader and one writer per link; one engine
//! task owning the [`Engine`] and every link's sender. Readers feed the engine through one
//! bounded channel; the engine feeds each writer through its own bounded channel. Shutdown is
//! explicit: [`Overlay::shutdown`] (or the embedder's `leave` token, which works mid-join too)
//! cancels a token, the engine says `Bye` on every link so that peers take the close as clean
//! (a link's writer says it if the engine never saw the link), and every task is awaited.
//!
//! Every link is authenticated ([`crate::auth`]): a stranger, a peer from another job, or one
//! speaking another overlay version is refused with a log line and gets nothing but a nonce.
//! Until its hello proves the secret (within `hello_timeout`), a connection holds an unproven
//! slot of the listener's [`auth::Gate`]; one over the caps (in all, per source address) is
//! closed at once, so strangers neither queue ahead of peers nor make a proven link wait.
//! A link that closes without `Bye` while the job runs aborts the job, naming the lost node.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use greedy_tree::Tree;
use tokio::{
    net::{
        TcpListener, TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::{mpsc, oneshot, watch},
};
use tokio_util::{
    codec::{FramedRead, FramedWrite},
    sync::CancellationToken,
    task::TaskTracker,
};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::{
    AbortInfo, Error, JobSpec, auth,
    collectives::{AllgatherRule, Engine, Op, Outcome, Output},
    frame::{FrameCodec, FrameError, HANDSHAKE_MAX_BODY, Link, Message},
    listener,
    rendezvous::Rendezvous,
};

/// The overlay tree of a job of `n_nodes` agents: the greedy tree under the job's model, node
/// 0 at the root. The one rule every agent and embedder uses to find a node's parent.
pub fn tree(n_nodes: usize, model: &greedy_tree::LaunchModel) -> greedy_tree::Tree {
    greedy_tree::greedy(n_nodes, model)
}

/// Limits and timeouts of the overlay; every network wait is one of these.
#[derive(Debug, Clone)]
pub struct OverlayConfig {
    /// Address the listener binds; port 0 picks a free one. It is also the address published,
    /// so it must be reachable from the other nodes (not `0.0.0.0`).
    pub bind: SocketAddr,
    /// Whole join: rendezvous, connecting to the parent, and the address exchange.
    pub join_timeout: Duration,
    /// One TCP connect attempt.
    pub connect_timeout: Duration,
    /// Each later step of the handshake, and saying bye.
    pub handshake_timeout: Duration,
    /// A new connection's `hello` (its first frame, which proves the job secret) must arrive
    /// within this, or it is closed: a silent stranger holds a slot no longer. A real peer
    /// sends it in one round trip, and one whose hello was late dials again.
    pub hello_timeout: Duration,
    /// Every collective after the join. Slurm's `PMIxTimeout` default (300 s) is the model:
    /// a PMI fence waits for the slowest rank of the job, which may still be starting.
    pub collective_timeout: Duration,
    /// Which algorithm an allgather of a given total size runs (measured crossovers:
    /// docs/benchmarks.md).
    pub allgather: AllgatherRule,
    /// Largest frame accepted from a peer; bounds the memory a peer can make us reserve.
    pub max_frame: usize,
    /// Connections that have not proved the job secret yet, in all and per source address;
    /// one over either is closed at once (accept never waits). Proven links do not count.
    pub admission: auth::Admission,
    /// On shutdown, how long to keep draining a link until the peer says bye too.
    pub shutdown_linger: Duration,
    /// A point-to-point [`Overlay::request`] (e.g. a PMIx direct modex) waits this long for
    /// its answer. The answering node may itself wait for a rank that is still starting, so
    /// this is as generous as a collective.
    pub request_timeout: Duration,
}

impl Default for OverlayConfig {
    fn default() -> Self {
        OverlayConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            join_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(5),
            hello_timeout: Duration::from_secs(2),
            collective_timeout: Duration::from_secs(300),
            allgather: AllgatherRule::default(),
            max_frame: 1 << 30,
            admission: auth::Admission {
                max_unproven: 512,
                max_unproven_per_source: 64,
            },
            shutdown_linger: Duration::from_secs(1),
            request_timeout: Duration::from_secs(300),
        }
    }
}

/// Requests from the handle to the engine task.
enum Request {
    Start {
        op: Op,
        blob: Bytes,
        timeout: Option<Duration>,
        reply: oneshot::Sender<Result<Outcome, Error>>,
    },
    Abort(AbortInfo),
    AddressBook(Vec<SocketAddr>),
    /// A point-to-point request to node `to`; the answer comes back on `reply`.
    Ask {
        to: usize,
        body: Bytes,
        reply: oneshot::Sender<Result<Bytes, String>>,
    },
    /// The answer to node `to`'s request `id`.
    Answer {
        to: usize,
        id: u64,
        body: Result<Bytes, String>,
    },
}

/// A point-to-point request another node (or this one) sent with [`Overlay::request`].
///
/// Answer it with [`Incoming::respond`]; dropping it answers with an error, so the asking
/// node never waits for a request nobody will serve.
#[derive(Debug)]
pub struct Incoming {
    /// The asking node.
    pub from: usize,
    /// The request.
    pub body: Bytes,
    id: u64,
    answers: Option<mpsc::Sender<Request>>,
}

impl Incoming {
    /// Sends the answer (or the reason there is none) back to the asking node.
    pub async fn respond(mut self, body: Result<Bytes, String>) {
        if let Some(tx) = self.answers.take() {
            let _ = tx
                .send(Request::Answer {
                    to: self.from,
                    id: self.id,
                    body,
                })
                .await;
        }
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        if let Some(tx) = self.answers.take() {
            let _ = tx.try_send(Request::Answer {
                to: self.from,
                id: self.id,
                body: Err("the node dropped the request unanswered".to_string()),
            });
        }
    }
}

/// What links tell the engine.
enum Event {
    Frame {
        from: usize,
        msg: Message,
    },
    Linked {
        node: usize,
        id: u64,
        tx: mpsc::Sender<Message>,
    },
    Closed {
        node: usize,
        id: u64,
        clean: bool,
        reason: String,
    },
    DirectFailed {
        node: usize,
        reason: String,
    },
}

/// Capacity of the engine's inbox: readers wait when the engine lags, which slows the senders.
const EVENT_CAPACITY: usize = 256;
/// Capacity of each link's outbox. A ring allgather queues at most n-1 frames per link, and
/// the engine awaits a full outbox, so this must stay above the largest job's node count to
/// rule out a cycle of full queues between ring neighbours; 4096 nodes is beyond our clusters.
const LINK_CAPACITY: usize = 4096;
/// Capacity of the request channel from handles: collectives are issued one at a time per caller.
const REQUEST_CAPACITY: usize = 64;
/// Capacity of the queue of point-to-point requests waiting for this node's server (see
/// [`Overlay::incoming`]): a PMIx direct modex is at most one per remote rank and key miss, and
/// a request arriving at a full queue is answered with an error rather than stalling the engine.
const INCOMING_CAPACITY: usize = 1024;

/// A running overlay; cheap to clone, every clone drives the same agent.
///
/// Collectives are numbered in the order they reach the overlay: every node must make the same
/// calls in the same order (as with MPI collectives).
///
/// # Cancel safety
/// The collective methods are not cancel-safe: once called, the collective runs on this node
/// whether or not the future is polled to the end, and a dropped caller only loses the result.
/// Racing one against a timer in `select!` therefore desynchronises nothing, but the next call
/// gets the next sequence number.
#[derive(Clone, Debug)]
pub struct Overlay {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    node_idx: usize,
    local_addr: SocketAddr,
    requests: mpsc::Sender<Request>,
    aborted: watch::Receiver<Option<AbortInfo>>,
    join: watch::Receiver<JoinState>,
    incoming: std::sync::Mutex<Option<mpsc::Receiver<Incoming>>>,
    request_timeout: Duration,
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

/// What every link task needs.
#[derive(Clone)]
struct Shared {
    job: Arc<JobSpec>,
    topo: Arc<Tree>,
    config: OverlayConfig,
    events: mpsc::Sender<Event>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    next_link_id: Arc<std::sync::atomic::AtomicU64>,
}

/// How far this node's join has got; collectives and requests wait for [`JoinState::Joined`].
#[derive(Debug, Clone)]
enum JoinState {
    Joining,
    Joined,
    /// The join failed; the job is aborted with this.
    Failed(AbortInfo),
}

/// The join of a node whose overlay already listens ([`Overlay::listen`]).
struct Joiner {
    overlay: Overlay,
    shared: Shared,
    deadline: tokio::time::Instant,
    state: watch::Sender<JoinState>,
    span: tracing::Span,
}

impl Overlay {
    /// Joins the overlay of `job` as node `job.node_idx`; returns once every node has joined.
    pub async fn start<R: Rendezvous>(
        job: &JobSpec,
        config: OverlayConfig,
        rendezvous: &R,
    ) -> Result<Overlay, Error> {
        Self::start_or_leave(job, config, rendezvous, &CancellationToken::new()).await
    }

    /// As [`Overlay::start`], and cancelling `leave` makes this node leave the overlay, during
    /// the join or after it: it says `Bye` on every link it has, so that its peers take the
    /// departure as clean, not as a crash; a join still in progress then fails with
    /// [`Error::Shutdown`]. An embedder that may have to stop before its node has joined
    /// (slurmstepd ending a step whose tasks are already gone) needs this: dropping the
    /// `start` future instead would close the links without a word, and abort the job.
    pub async fn start_or_leave<R: Rendezvous>(
        job: &JobSpec,
        config: OverlayConfig,
        rendezvous: &R,
        leave: &CancellationToken,
    ) -> Result<Overlay, Error> {
        let joiner = Self::listen(job, config, leave).await?;
        let overlay = joiner.overlay.clone();
        match joiner.run(rendezvous).await {
            Ok(()) => Ok(overlay),
            Err(e) => {
                overlay.shutdown().await;
                Err(e)
            }
        }
    }

    /// Listens as node `job.node_idx` and returns at once, joining in the background: the
    /// handle can be given to the servers right away, and its collectives and requests wait
    /// for the join ([`Overlay::joined`]). A join that fails aborts the job on this node (the
    /// abort names the cause, [`Overlay::aborted`] fires); cancelling `leave` leaves as in
    /// [`Overlay::start_or_leave`]. This is how a node serves its ranks while the slowest
    /// node of the job is still starting.
    pub async fn begin<R: Rendezvous + 'static>(
        job: &JobSpec,
        config: OverlayConfig,
        rendezvous: R,
        leave: &CancellationToken,
    ) -> Result<Overlay, Error> {
        let joiner = Self::listen(job, config, leave).await?;
        let overlay = joiner.overlay.clone();
        let tracker = overlay.inner.tracker.clone();
        tracker.spawn(async move {
            let _ = joiner.run(&rendezvous).await;
        });
        Ok(overlay)
    }

    /// Waits until this node has joined: `Ok` once every node of the job has, the abort
    /// ([`Error::Aborted`]) if the join failed, [`Error::Shutdown`] if the node left first.
    pub async fn joined(&self) -> Result<(), Error> {
        let node = self.inner.node_idx;
        let mut state = self.inner.join.clone();
        let state = state
            .wait_for(|s| !matches!(s, JoinState::Joining))
            .await
            .map_err(|_| Error::Shutdown { node })?;
        match &*state {
            JoinState::Failed(info) => Err(Error::Aborted(info.clone())),
            _ => Ok(()),
        }
    }

    /// Binds the listener and starts the engine; the join is the returned [`Joiner`]'s.
    async fn listen(
        job: &JobSpec,
        config: OverlayConfig,
        leave: &CancellationToken,
    ) -> Result<Joiner, Error> {
        job.validate()?;
        let me = job.node_idx;
        let span = info_span!("overlay", job = %job.job_id, node = me);
        let tree = tree(job.n_nodes(), &job.model);
        let topo = Arc::new(tree);
        let listener = TcpListener::bind(config.bind)
            .await
            .map_err(|source| Error::Bind {
                node: me,
                addr: config.bind,
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| Error::Io {
            node: me,
            what: "listener address",
            source,
        })?;
        let deadline = tokio::time::Instant::now() + config.join_timeout;
        let (events_tx, events_rx) = mpsc::channel(EVENT_CAPACITY);
        let (requests_tx, requests_rx) = mpsc::channel(REQUEST_CAPACITY);
        let (aborted_tx, aborted_rx) = watch::channel(None);
        let (incoming_tx, incoming_rx) = mpsc::channel(INCOMING_CAPACITY);
        let (join_tx, join_rx) = watch::channel(JoinState::Joining);
        let shutdown = leave.child_token();
        let tracker = TaskTracker::new();
        let shared = Shared {
            job: Arc::new(job.clone()),
            topo: topo.clone(),
            config: config.clone(),
            events: events_tx,
            shutdown: shutdown.clone(),
            tracker: tracker.clone(),
            next_link_id: Arc::default(),
        };
        let engine = Engine::new(
            job.clone(),
            topo.clone(),
            config.allgather,
            config.collective_timeout,
        );
        tracker.spawn(
            run_engine(
                shared.clone(),
                engine,
                (requests_tx.clone(), requests_rx),
                events_rx,
                aborted_tx,
                incoming_tx,
            )
            .instrument(span.clone()),
        );
        tracker.spawn(accept_loop(shared.clone(), listener).instrument(span.clone()));
        let overlay = Overlay {
            inner: Arc::new(Inner {
                node_idx: me,
                local_addr,
                requests: requests_tx,
                aborted: aborted_rx,
                join: join_rx,
                incoming: std::sync::Mutex::new(Some(incoming_rx)),
                request_timeout: config.request_timeout,
                shutdown,
                tracker,
            }),
        };
        info!(parent: &span, %local_addr, "overlay listening");
        Ok(Joiner {
            overlay,
            shared,
            deadline,
            state: join_tx,
            span,
        })
    }
}

impl Joiner {
    /// Publishes this node's address, connects to its parent and runs the join (one allgather
    /// of listener addresses, which also proves the tree is whole), all within the join
    /// timeout; then tells the waiters how it went.
    async fn run<R: Rendezvous>(self, rendezvous: &R) -> Result<(), Error> {
        let Joiner {
            overlay,
            shared,
            deadline,
            state,
            span,
        } = self;
        let me = shared.job.node_idx;
        let local_addr = overlay.inner.local_addr;
        let join_timeout = Error::Timeout {
            node: me,
            what: "join_timeout",
            after: shared.config.join_timeout,
        };
        let joined = async {
            rendezvous
                .publish(me, local_addr)
                .await
                .map_err(|reason| Error::Rendezvous {
                    node: me,
                    peer_node: me,
                    reason,
                })?;
            if let Some(parent) = shared.topo.parent(me) {
                // (The lookup is cancel-safe: leaving drops it.)
                let addr = tokio::select! {
                    found = rendezvous.lookup(parent) => found.map_err(|reason| Error::Rendezvous {
                        node: me,
                        peer_node: parent,
                        reason,
                    })?,
                    _ = shared.shutdown.cancelled() => return Err(Error::Shutdown { node: me }),
                };
                connect(&shared, parent, addr, Link::Child, Some(deadline)).await?;
            }
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let outcome = overlay
                .submit(
                    Op::Allgather,
                    Bytes::from(local_addr.to_string()),
                    Some(remaining),
                )
                .await?;
            let Outcome::Allgather(blobs) = outcome else {
                unreachable!("allgather yields Allgather")
            };
            let book = blobs
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    std::str::from_utf8(b)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| Error::Handshake {
                            node: me,
                            peer: format!("node {i}"),
                            reason: format!(
                                "bad address in join: {:?}",
                                String::from_utf8_lossy(b)
                            ),
                        })
                })
                .collect::<Result<Vec<SocketAddr>, Error>>()?;
            overlay
                .inner
                .requests
                .send(Request::AddressBook(book))
                .await
                .map_err(|_| Error::Shutdown { node: me })
        };
        let result = match tokio::time::timeout_at(deadline, joined.instrument(span.clone())).await
        {
            Ok(r) => r,
            Err(_) => Err(join_timeout),
        };
        match result {
            Ok(()) => {
                info!(parent: &span, "overlay joined");
                state.send_replace(JoinState::Joined);
                Ok(())
            }
            // Leaving mid-join makes whatever the join was waiting for fail; say why instead.
            Err(_) if overlay.inner.shutdown.is_cancelled() => Err(Error::Shutdown { node: me }),
            Err(e) => {
                let info = AbortInfo::new(me, None, 1, format!("joining the overlay failed: {e}"));
                state.send_replace(JoinState::Failed(info.clone()));
                overlay.abort(info).await;
                Err(e)
            }
        }
    }
}

impl Overlay {
    /// This node's index.
    pub fn node_idx(&self) -> usize {
        self.inner.node_idx
    }

    /// The listener's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// Runs a collective once this node has joined.
    async fn collective(&self, op: Op, blob: Bytes) -> Result<Outcome, Error> {
        self.joined().await?;
        self.submit(op, blob, None).await
    }

    /// Hands a collective to the engine (the join's own, with its `timeout`, cannot wait for
    /// the join).
    async fn submit(
        &self,
        op: Op,
        blob: Bytes,
        timeout: Option<Duration>,
    ) -> Result<Outcome, Error> {
        let node = self.inner.node_idx;
        let (reply, rx) = oneshot::channel();
        self.inner
            .requests
            .send(Request::Start {
                op,
                blob,
                timeout,
                reply,
            })
            .await
            .map_err(|_| Error::Shutdown { node })?;
        rx.await.map_err(|_| Error::Shutdown { node })?
    }

    /// Waits until every node has entered the barrier.
    pub async fn barrier(&self) -> Result<(), Error> {
        self.collective(Op::Barrier, Bytes::new()).await.map(|_| ())
    }

    /// Node 0's `blob` on every node (the argument is ignored on other nodes).
    pub async fn broadcast(&self, blob: Bytes) -> Result<Bytes, Error> {
        match self.collective(Op::Broadcast, blob).await? {
            Outcome::Broadcast(b) => Ok(b),
            other => unreachable!("broadcast yielded {other:?}"),
        }
    }

    /// Every node's blob on node 0, by node index; `None` on the other nodes.
    pub async fn gather(&self, blob: Bytes) -> Result<Option<Vec<Bytes>>, Error> {
        match self.collective(Op::Gather, blob).await? {
            Outcome::Gather(b) => Ok(b),
            other => unreachable!("gather yielded {other:?}"),
        }
    }

    /// Every node's blob on every node, **indexed by node index**.
    pub async fn allgather(&self, blob: Bytes) -> Result<Vec<Bytes>, Error> {
        match self.collective(Op::Allgather, blob).await? {
            Outcome::Allgather(b) => Ok(b),
            other => unreachable!("allgather yielded {other:?}"),
        }
    }

    /// Asks node `to` (any node, this one included) and waits for its answer, at most
    /// `request_timeout`. Unlike collectives, requests are not numbered: nodes need not agree
    /// on them, and several may be outstanding at once.
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped caller only loses the answer, which is discarded when it comes.
    pub async fn request(&self, to: usize, body: Bytes) -> Result<Bytes, Error> {
        self.joined().await?;
        let node = self.inner.node_idx;
        let (reply, rx) = oneshot::channel();
        self.inner
            .requests
            .send(Request::Ask { to, body, reply })
            .await
            .map_err(|_| Error::Shutdown { node })?;
        match tokio::time::timeout(self.inner.request_timeout, rx).await {
            Err(_) => Err(Error::Timeout {
                node,
                what: "request_timeout",
                after: self.inner.request_timeout,
            }),
            Ok(Err(_)) => Err(Error::Shutdown { node }),
            Ok(Ok(Ok(b))) => Ok(b),
            Ok(Ok(Err(reason))) => Err(Error::Refused {
                node,
                peer_node: to,
                reason,
            }),
        }
    }

    /// The requests other nodes send this one with [`Overlay::request`]; `None` after the
    /// first call (one server per node). Until it is taken, requests wait in a bounded queue;
    /// beyond it they are refused.
    pub fn incoming(&self) -> Option<mpsc::Receiver<Incoming>> {
        self.inner
            .incoming
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Aborts the job on every node: pending and later collectives fail with [`Error::Aborted`].
    pub async fn abort(&self, info: AbortInfo) {
        let _ = self.inner.requests.send(Request::Abort(info)).await;
    }

    /// Watches for the job's abort (from any node); the embedder kills its ranks when it fires.
    pub fn aborted(&self) -> watch::Receiver<Option<AbortInfo>> {
        self.inner.aborted.clone()
    }

    /// Says `Bye` to every peer, closes every link and waits for every task.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
    }
}

async fn run_engine(
    shared: Shared,
    mut engine: Engine,
    (answers_tx, mut requests): (mpsc::Sender<Request>, mpsc::Receiver<Request>),
    mut events: mpsc::Receiver<Event>,
    aborted_tx: watch::Sender<Option<AbortInfo>>,
    incoming_tx: mpsc::Sender<Incoming>,
) {
    let me = shared.job.node_idx;
    let mut links: HashMap<usize, Vec<(u64, mpsc::Sender<Message>)>> = HashMap::new();
    let mut waiting: HashMap<u64, oneshot::Sender<Result<Outcome, Error>>> = HashMap::new();
    // Point-to-point requests this node sent, by id, awaiting their answer.
    let mut asked: HashMap<u64, oneshot::Sender<Result<Bytes, String>>> = HashMap::new();
    let mut next_ask: u64 = 0;
    // A request for this node: queue it for the local server, or refuse it when the queue is full.
    let deliver = |from: usize, id: u64, body: Bytes, out: &mut Vec<Output>| {
        let incoming = Incoming {
            from,
            body,
            id,
            answers: Some(answers_tx.clone()),
        };
        if let Err(e) = incoming_tx.try_send(incoming) {
            let mut refused = e.into_inner();
            refused.answers = None;
            let body = Err(format!(
                "node {me}: no server for requests, or its queue is full"
            ));
            if from == me {
                let _ = answers_tx.try_send(Request::Answer { to: me, id, body });
            } else {
                out.push(Output::Send {
                    to: from,
                    msg: Message::Response { id, body },
                });
            }
        }
    };
    let mut book: Vec<SocketAddr> = Vec::new();
    // Messages for nodes we are still connecting to directly.
    let mut parked: HashMap<usize, Vec<Message>> = HashMap::new();
    loop {
        let mut out = Vec::new();
        let deadline = engine.next_deadline().map(tokio::time::Instant::from_std);
        tokio::select! {
            // Requests first: an abort a local server sent just before this node leaves goes
            // out ahead of the Bye.
            biased;
            Some(request) = requests.recv() => match request {
                Request::Start { op, blob, timeout, reply } => {
                    // Only the join passes its own timeout; it must stay on the tree, since
                    // the ring needs the addresses the join is gathering.
                    let tree_only = timeout.is_some();
                    let seq = engine.start(op, blob, Instant::now(), timeout, tree_only, &mut out);
                    waiting.insert(seq, reply);
                }
                Request::Abort(info) => engine.abort(info, &mut out),
                Request::AddressBook(b) => book = b,
                Request::Ask { to, body, reply } => {
                    let id = next_ask;
                    next_ask += 1;
                    if to >= shared.job.n_nodes() {
                        let _ = reply.send(Err(format!("no node {to} in this job")));
                    } else if to == me {
                        asked.insert(id, reply);
                        deliver(me, id, body, &mut out);
                    } else {
                        asked.insert(id, reply);
                        out.push(Output::Send { to, msg: Message::Request { id, body } });
                    }
                }
                Request::Answer { to, id, body } => {
                    if to == me {
                        if let Some(reply) = asked.remove(&id) {
                            let _ = reply.send(body);
                        }
                    } else {
                        out.push(Output::Send { to, msg: Message::Response { id, body } });
                    }
                }
            },
            _ = shared.shutdown.cancelled() => break,
            Some(event) = events.recv() => match event {
                Event::Frame { from, msg: Message::Request { id, body } } => deliver(from, id, body, &mut out),
                Event::Frame { from: _, msg: Message::Response { id, body } } => {
                    // A request whose asker gave up (timeout) finds no one here: drop it.
                    if let Some(reply) = asked.remove(&id) {
                        let _ = reply.send(body);
                    }
                }
                Event::Frame { from, msg } => engine.on_message(from, msg, &mut out),
                Event::Linked { node, id, tx } => {
                    for msg in parked.remove(&node).unwrap_or_default() {
                        let _ = tx.send(msg).await;
                    }
                    links.entry(node).or_default().push((id, tx));
                }
                Event::Closed { node, id, clean, reason } => {
                    if let Some(l) = links.get_mut(&node) {
                        l.retain(|(i, _)| *i != id);
                    }
                    if !clean && engine.aborted().is_none() {
                        let host = shared.job.hosts.get(node).cloned().unwrap_or_default();
                        let reason = format!("lost overlay link to node {node} ({host}): {reason}");
                        warn!(peer = node, "{reason}");
                        engine.abort(AbortInfo::new(me, None, 1, reason), &mut out);
                    } else if clean {
                        engine.neighbour_left(node, &mut out);
                    }
                }
                Event::DirectFailed { node, reason } => {
                    parked.remove(&node);
                    if engine.aborted().is_none() {
                        engine.abort(AbortInfo::new(me, None, 1, reason), &mut out);
                    }
                }
            },
            _ = sleep_until_opt(deadline) => engine.on_timeout(Instant::now(), &mut out),
        }
        for output in out {
            match output {
                Output::Send { to, msg } => {
                    if let Some((_, tx)) = links.get(&to).and_then(|l| l.first()) {
                        if tx.send(msg).await.is_err() {
                            debug!(peer = to, "link writer gone");
                        }
                    } else if let Some(&addr) = book.get(to) {
                        let first = !parked.contains_key(&to);
                        parked.entry(to).or_default().push(msg);
                        if first {
                            let shared = shared.clone();
                            shared.tracker.clone().spawn(
                                async move {
                                    // Tried again as long as a join would be: the peer's
                                    // listener drops new connections while strangers fill it.
                                    let until =
                                        tokio::time::Instant::now() + shared.config.join_timeout;
                                    if let Err(e) =
                                        connect(&shared, to, addr, Link::Direct, Some(until)).await
                                    {
                                        let _ = shared
                                            .events
                                            .send(Event::DirectFailed {
                                                node: to,
                                                reason: e.to_string(),
                                            })
                                            .await;
                                    }
                                }
                                .in_current_span(),
                            );
                        }
                    } else {
                        // A tree neighbour whose link is being set up (the link task announces
                        // itself on the event channel, which may be read after this request).
                        parked.entry(to).or_default().push(msg);
                    }
                }
                Output::Done { seq, result } => {
                    if let Some(reply) = waiting.remove(&seq) {
                        let _ = reply.send(result);
                    }
                }
                Output::Aborted(info) => {
                    warn!(origin = info.origin_node, "job aborted: {info}");
                    aborted_tx.send_replace(Some(info));
                }
            }
        }
    }
    // Clean shutdown: tell every peer, fail whoever still waits.
    for (_, tx) in links.values().flatten() {
        let _ = tx.try_send(Message::Bye);
    }
    drop(links);
    for (_, reply) in waiting {
        let _ = reply.send(Err(Error::Shutdown { node: me }));
    }
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

async fn accept_loop(shared: Shared, listener: TcpListener) {
    let gate = auth::Gate::new(shared.config.admission);
    let (shutdown, tracker) = (&shared.shutdown, &shared.tracker);
    listener::accept_gated(
        listener,
        gate,
        shutdown,
        tracker,
        "overlay",
        |stream, addr, slot| {
            let shared = shared.clone();
            async move {
                // Debug, not warn: anyone on the network can connect, and a stranger's probe
                // must not write into the job's stderr (srun prints slurmstepd's warnings). A
                // real peer that fails the proof is named by the join timeout instead.
                if let Err(reason) = serve_link(&shared, stream, addr, slot).await {
                    debug!(%addr, "refused overlay connection: {reason}");
                }
            }
            .in_current_span()
        },
    )
    .await
}

type Reader = FramedRead<OwnedReadHalf, FrameCodec>;
type Writer = FramedWrite<OwnedWriteHalf, FrameCodec>;

/// Frames a fresh connection with the handshake's small frame limit; [`run_link`] raises it.
fn framed(stream: TcpStream) -> (Reader, Writer) {
    let _ = stream.set_nodelay(true);
    let codec = FrameCodec {
        max_body: HANDSHAKE_MAX_BODY,
    };
    let (r, w) = stream.into_split();
    (FramedRead::new(r, codec), FramedWrite::new(w, codec))
}

/// Why a handshake frame did not come.
enum Missing {
    /// The peer closed or reset the connection, or did not answer in time: what an overloaded
    /// peer that gave up on us looks like, so the dialing side may try again.
    Dropped(String),
    /// The peer sent something that is not the frame expected.
    Bad(String),
}

impl From<Missing> for String {
    fn from(m: Missing) -> String {
        match m {
            Missing::Dropped(r) | Missing::Bad(r) => r,
        }
    }
}

/// The next handshake frame, within `wait`: what is left of `hello_timeout` where a stranger may
/// be on the other end (the accepting side), else up to the join's deadline ([`handshake_wait`]).
async fn next_frame(
    reader: &mut Reader,
    expecting: &str,
    wait: Duration,
) -> Result<Message, Missing> {
    match tokio::time::timeout(wait, reader.next()).await {
        Err(_) => Err(Missing::Dropped(format!("no {expecting} within {wait:?}"))),
        Ok(None) => Err(Missing::Dropped(format!("closed before {expecting}"))),
        Ok(Some(Err(FrameError::Io(e)))) => Err(Missing::Dropped(e.to_string())),
        Ok(Some(Err(e))) => Err(Missing::Bad(e.to_string())),
        Ok(Some(Ok(m))) => Ok(m),
    }
}

/// Server side of a link: challenge, check the proof (within `hello_timeout` of the accept,
/// holding `slot` until then), welcome, then run the link.
async fn serve_link(
    shared: &Shared,
    stream: TcpStream,
    addr: SocketAddr,
    slot: auth::Unproven,
) -> Result<(), String> {
    let job = &shared.job;
    let me = job.node_idx;
    let (mut reader, mut writer) = framed(stream);
    let server_nonce = auth::nonce();
    let until = tokio::time::Instant::now() + shared.config.hello_timeout;
    let send = writer.send(Message::Challenge {
        nonce: server_nonce,
    });
    tokio::time::timeout_at(until, send)
        .await
        .map_err(|_| "challenge not sent within hello_timeout".to_string())?
        .map_err(|e| e.to_string())?;
    let left = until.saturating_duration_since(tokio::time::Instant::now());
    let hello = next_frame(&mut reader, "hello", left).await?;
    let auth::Accepted { peer, link, proof } =
        auth::accept_hello(job, |n| shared.topo.parent(n), &server_nonce, &hello)?;
    slot.proven();
    writer
        .send(Message::Welcome {
            node_idx: me as u32,
            mac: proof,
        })
        .await
        .map_err(|e| e.to_string())?;
    debug!(peer, %addr, ?link, "accepted link");
    run_link(shared.clone(), peer, reader, writer).await;
    Ok(())
}

/// Client side: connect, prove, check the server's proof, run the link. With a `deadline`, a
/// refused connection or a handshake the peer dropped is tried again until then: the accepting
/// side waits only `hello_timeout` for a hello, a node starved of CPU (600 agents on 2 cores in
/// CI) can be slower than that to send it, and a listener full of strangers drops new
/// connections at once.
async fn connect(
    shared: &Shared,
    peer: usize,
    addr: SocketAddr,
    link: Link,
    deadline: Option<tokio::time::Instant>,
) -> Result<(), Error> {
    let me = shared.job.node_idx;
    let mut backoff = Duration::from_millis(10);
    loop {
        // A node that leaves stops trying; no link exists yet, so nobody waits for a bye.
        let failure = tokio::select! {
            dialed = dial(shared, peer, addr, link, deadline) => match dialed {
                Ok((reader, writer)) => {
                    debug!(peer, %addr, ?link, "link up");
                    shared
                        .tracker
                        .spawn(run_link(shared.clone(), peer, reader, writer).in_current_span());
                    return Ok(());
                }
                Err(Dial::Final(e)) => return Err(e),
                Err(Dial::Again(e)) => e,
            },
            _ = shared.shutdown.cancelled() => return Err(Error::Shutdown { node: me }),
        };
        if deadline.is_none_or(|d| tokio::time::Instant::now() + backoff >= d) {
            return Err(failure);
        }
        debug!(peer, %addr, "trying again in {backoff:?}: {failure}");
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shared.shutdown.cancelled() => return Err(Error::Shutdown { node: me }),
        }
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
}

/// How one dial ended when it did not bring a link up.
enum Dial {
    /// Worth another try before the join's deadline: refused, dropped, or unanswered.
    Again(Error),
    /// The peer answered with something wrong; trying again would get the same.
    Final(Error),
}

/// One connection and handshake to `peer`; the authenticated halves on success.
async fn dial(
    shared: &Shared,
    peer: usize,
    addr: SocketAddr,
    link: Link,
    deadline: Option<tokio::time::Instant>,
) -> Result<(Reader, Writer), Dial> {
    let job = &shared.job;
    let me = job.node_idx;
    let stream = tokio::time::timeout(shared.config.connect_timeout, TcpStream::connect(addr))
        .await
        .unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connect_timeout",
            ))
        })
        .map_err(|source| {
            Dial::Again(Error::Connect {
                node: me,
                peer_node: peer,
                addr,
                source,
            })
        })?;
    let refused = |reason: String| Error::Handshake {
        node: me,
        peer: format!("node {peer} at {addr}"),
        reason,
    };
    let missing = |m: Missing| match m {
        Missing::Dropped(r) => Dial::Again(refused(r)),
        Missing::Bad(r) => Dial::Final(refused(r)),
    };
    let (mut reader, mut writer) = framed(stream);
    let challenge = next_frame(&mut reader, "challenge", handshake_wait(shared, deadline))
        .await
        .map_err(missing)?;
    let Message::Challenge {
        nonce: server_nonce,
    } = challenge
    else {
        return Err(Dial::Final(refused(format!(
            "expected challenge, got {}",
            challenge.kind()
        ))));
    };
    let nonce = auth::nonce();
    let mac = auth::client_proof(
        &job.secret,
        &job.job_id,
        me as u32,
        link,
        &server_nonce,
        &nonce,
    );
    let hello = Message::Hello {
        job_id: job.job_id.clone(),
        node_idx: me as u32,
        link,
        nonce,
        mac,
    };
    writer
        .send(hello)
        .await
        .map_err(|e| Dial::Again(refused(e.to_string())))?;
    let welcome = next_frame(&mut reader, "welcome", handshake_wait(shared, deadline))
        .await
        .map_err(missing)?;
    auth::check_welcome(job, peer, &server_nonce, &nonce, &welcome)
        .map_err(|r| Dial::Final(refused(r)))?;
    Ok((reader, writer))
}

/// How long the dialing side waits for its peer's next handshake frame: `handshake_timeout`, or
/// what is left of the join if that is longer. The peer is the node it chose to reach, which
/// may be slow, not a stranger: with hundreds of nodes on a few cores (600 agents on 2 here)
/// an agent starting its PMIx server answered after more than 5 s.
fn handshake_wait(shared: &Shared, deadline: Option<tokio::time::Instant>) -> Duration {
    let left = deadline.map_or(Duration::ZERO, |d| {
        d.saturating_duration_since(tokio::time::Instant::now())
    });
    left.max(shared.config.handshake_timeout)
}

/// Runs an authenticated link: registers it with the engine, then pumps frames both ways.
async fn run_link(shared: Shared, peer: usize, mut reader: Reader, mut writer: Writer) {
    reader.decoder_mut().max_body = shared.config.max_frame;
    writer.encoder_mut().max_body = shared.config.max_frame;
    let id = shared
        .next_link_id
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (tx, mut rx) = mpsc::channel::<Message>(LINK_CAPACITY);
    // A link that comes up while this node leaves (its handshake was under way) is one the
    // engine never says goodbye on: the writer below says it, else the peer would take the
    // close as a crash.
    let stopping = shared.shutdown.clone();
    if stopping.is_cancelled()
        || shared
            .events
            .send(Event::Linked { node: peer, id, tx })
            .await
            .is_err()
    {
        let bye = async {
            writer.send(Message::Bye).await?;
            writer.close().await
        };
        let _ = tokio::time::timeout(shared.config.handshake_timeout, bye).await;
        return;
    }
    let span = info_span!("link", peer);
    shared.tracker.spawn(
        async move {
            let mut said_bye = false;
            while let Some(msg) = rx.recv().await {
                let bye = matches!(msg, Message::Bye);
                if let Err(e) = writer.send(msg).await {
                    debug!("write failed: {e}");
                    let _ = writer.close().await;
                    return;
                }
                said_bye |= bye;
            }
            // The engine dropped this link's sender: the link closed, or this node is leaving
            // and the engine stopped before it saw the link (then no bye came from it).
            if stopping.is_cancelled() && !said_bye {
                let _ = writer.send(Message::Bye).await;
            }
            let _ = writer.close().await;
        }
        .instrument(span.clone()),
    );
    // After our shutdown starts, keep reading (and discarding) until the peer's bye or close,
    // for at most `shutdown_linger`: closing a socket with unread data sends a reset, which can
    // destroy our own bye before the peer reads it and make it abort a finished job.
    let linger = async {
        shared.shutdown.cancelled().await;
        tokio::time::sleep(shared.config.shutdown_linger).await;
    };
    tokio::pin!(linger);
    let (clean, reason) = async {
        loop {
            let frame = tokio::select! {
                _ = &mut linger => return (true, String::new()),
                f = reader.next() => f,
            };
            let stopping = shared.shutdown.is_cancelled();
            match frame {
                None if stopping => return (true, String::new()),
                None => return (false, "connection closed without bye".to_string()),
                Some(Err(_)) if stopping => return (true, String::new()),
                Some(Err(e)) => {
                    warn!("refused frame: {e}");
                    return (false, e.to_string());
                }
                Some(Ok(Message::Bye)) => return (true, String::new()),
                Some(Ok(_)) if stopping => {}
                Some(Ok(
                    msg @ (Message::Up { .. }
                    | Message::Down { .. }
                    | Message::Ring { .. }
                    | Message::Bruck { .. }
                    | Message::Abort(_)
                    | Message::Request { .. }
                    | Message::Response { .. }),
                )) => {
                    // The engine may be gone (shutting down): keep draining.
                    let _ = shared.events.send(Event::Frame { from: peer, msg }).await;
                }
                Some(Ok(other)) => {
                    return (
                        false,
                        format!("unexpected {} on an established link", other.kind()),
                    );
                }
            }
        }
    }
    .instrument(span)
    .await;
    let _ = shared
        .events
        .send(Event::Closed {
            node: peer,
            id,
            clean,
            reason,
        })
        .await;
}
