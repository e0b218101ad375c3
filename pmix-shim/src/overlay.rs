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

mod engine_task;
mod link;
pub mod served;

use std::{collections::HashMap, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use greedy_tree::Tree;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{Instrument, info, info_span};

use self::{
    engine_task::EngineTask,
    link::{accept_loop, connect},
};
use crate::{
    AbortInfo, Error, JobSpec, auth,
    collectives::{AllgatherRule, Engine, Op, Outcome},
    frame::{Link, Message, Service},
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
        service: Service,
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

/// The engine's ends of the services' request queues.
struct Queues {
    /// PMIx direct modex ([`Service::Modex`]).
    modex: mpsc::Sender<Incoming>,
    /// The name table ([`Service::Names`]).
    names: mpsc::Sender<Incoming>,
    /// The subset-collective coordinator ([`Service::Group`]).
    group: mpsc::Sender<Incoming>,
    /// Spawned jobs to serve ([`Service::Children`]).
    children: mpsc::Sender<Incoming>,
}

impl Queues {
    /// The queue of `service`'s server.
    fn of(&self, service: Service) -> &mpsc::Sender<Incoming> {
        match service {
            Service::Modex => &self.modex,
            Service::Names => &self.names,
            Service::Group => &self.group,
            Service::Children => &self.children,
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
/// Capacity of each service's queue of point-to-point requests waiting for this node's server
/// (see [`Overlay::incoming`]): a PMIx direct modex is at most one per remote rank and key
/// miss, a name request one per PMI client at a time; a request arriving at a full queue is
/// answered with an error rather than stalling the engine.
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
    /// Each service's queue until its server takes it.
    incoming: std::sync::Mutex<HashMap<Service, mpsc::Receiver<Incoming>>>,
    request_timeout: Duration,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    /// The namespaces served over this overlay on this node ([`crate::served`]).
    served: served::Served,
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
        let (listener, local_addr) = listener::bind(me, config.bind, "listener address").await?;
        let deadline = tokio::time::Instant::now() + config.join_timeout;
        let (events_tx, events_rx) = mpsc::channel(EVENT_CAPACITY);
        let (requests_tx, requests_rx) = mpsc::channel(REQUEST_CAPACITY);
        let (aborted_tx, aborted_rx) = watch::channel(None);
        let (modex_tx, modex_rx) = mpsc::channel(INCOMING_CAPACITY);
        let (names_tx, names_rx) = mpsc::channel(INCOMING_CAPACITY);
        let (group_tx, group_rx) = mpsc::channel(INCOMING_CAPACITY);
        let (children_tx, children_rx) = mpsc::channel(INCOMING_CAPACITY);
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
        let engine = EngineTask::new(
            shared.clone(),
            engine,
            requests_tx.clone(),
            aborted_tx,
            Queues {
                modex: modex_tx,
                names: names_tx,
                group: group_tx,
                children: children_tx,
            },
        );
        tracker.spawn(engine.run(requests_rx, events_rx).instrument(span.clone()));
        tracker.spawn(accept_loop(shared.clone(), listener).instrument(span.clone()));
        let overlay = Overlay {
            inner: Arc::new(Inner {
                node_idx: me,
                local_addr,
                requests: requests_tx,
                aborted: aborted_rx,
                join: join_rx,
                incoming: std::sync::Mutex::new(HashMap::from([
                    (Service::Modex, modex_rx),
                    (Service::Names, names_rx),
                    (Service::Group, group_rx),
                    (Service::Children, children_rx),
                ])),
                request_timeout: config.request_timeout,
                shutdown,
                tracker,
                served: Default::default(),
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
        let me = self.shared.job.node_idx;
        let joined = self.join(rendezvous).instrument(self.span.clone());
        let result = match tokio::time::timeout_at(self.deadline, joined).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout {
                node: me,
                what: "join_timeout",
                after: self.shared.config.join_timeout,
            }),
        };
        match result {
            Ok(()) => {
                info!(parent: &self.span, "overlay joined");
                self.state.send_replace(JoinState::Joined);
                Ok(())
            }
            // Leaving mid-join makes whatever the join was waiting for fail; say why instead.
            Err(_) if self.overlay.inner.shutdown.is_cancelled() => {
                Err(Error::Shutdown { node: me })
            }
            Err(e) => {
                let info = AbortInfo::new(me, None, 1, format!("joining the overlay failed: {e}"));
                self.state.send_replace(JoinState::Failed(info.clone()));
                self.overlay.abort(info).await;
                Err(e)
            }
        }
    }

    /// The join itself, without its deadline: publish, connect to the parent, then the
    /// allgather of listener addresses, whose result the engine keeps for direct links.
    async fn join<R: Rendezvous>(&self, rendezvous: &R) -> Result<(), Error> {
        let me = self.shared.job.node_idx;
        let local_addr = self.overlay.inner.local_addr;
        rendezvous
            .publish(me, local_addr)
            .await
            .map_err(|reason| Error::Rendezvous {
                node: me,
                peer_node: me,
                reason,
            })?;
        if let Some(parent) = self.shared.topo.parent(me) {
            // (The lookup is cancel-safe: leaving drops it.)
            let addr = tokio::select! {
                found = rendezvous.lookup(parent) => found.map_err(|reason| Error::Rendezvous {
                    node: me,
                    peer_node: parent,
                    reason,
                })?,
                _ = self.shared.shutdown.cancelled() => return Err(Error::Shutdown { node: me }),
            };
            connect(&self.shared, parent, addr, Link::Child, Some(self.deadline)).await?;
        }
        let remaining = self
            .deadline
            .saturating_duration_since(tokio::time::Instant::now());
        let outcome = self
            .overlay
            .submit(
                Op::Allgather,
                Bytes::from(local_addr.to_string()),
                Some(remaining),
            )
            .await?;
        let Outcome::Allgather(blobs) = outcome else {
            unreachable!("allgather yields Allgather")
        };
        let book = address_book(me, &blobs)?;
        self.overlay
            .inner
            .requests
            .send(Request::AddressBook(book))
            .await
            .map_err(|_| Error::Shutdown { node: me })
    }
}

/// Every node's listener address from the join's allgather, as node `me` parses it.
fn address_book(me: usize, blobs: &[Bytes]) -> Result<Vec<SocketAddr>, Error> {
    blobs
        .iter()
        .enumerate()
        .map(|(i, b)| {
            std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| Error::Handshake {
                    node: me,
                    peer: format!("node {i}"),
                    reason: format!("bad address in join: {:?}", String::from_utf8_lossy(b)),
                })
        })
        .collect()
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

    /// The namespaces served over this overlay on this node.
    pub fn served(&self) -> &served::Served {
        &self.inner.served
    }

    /// Runs `task` among the overlay's own tasks (it must end when the overlay shuts down,
    /// e.g. when its queue closes): a service shared by every namespace on the overlay.
    pub(crate) fn spawn_task<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let shutdown = self.inner.shutdown.clone();
        self.inner.tracker.spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = task => {}
            }
        });
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
    pub async fn request(&self, to: usize, service: Service, body: Bytes) -> Result<Bytes, Error> {
        self.request_within(to, service, body, self.inner.request_timeout)
            .await
    }

    /// As [`Overlay::request`], waiting at most `limit` for the answer (for requests the
    /// asked node holds on purpose: a waiting lookup, a subset collective).
    pub async fn request_within(
        &self,
        to: usize,
        service: Service,
        body: Bytes,
        limit: Duration,
    ) -> Result<Bytes, Error> {
        self.joined().await?;
        let node = self.inner.node_idx;
        let (reply, rx) = oneshot::channel();
        self.inner
            .requests
            .send(Request::Ask {
                to,
                service,
                body,
                reply,
            })
            .await
            .map_err(|_| Error::Shutdown { node })?;
        match tokio::time::timeout(limit, rx).await {
            Err(_) => Err(Error::Timeout {
                node,
                what: "request_timeout",
                after: limit,
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

    /// The requests for `service` that other nodes send this one with [`Overlay::request`];
    /// `None` after the first call (one server per service and node). Until it is taken,
    /// requests wait in a bounded queue; beyond it they are refused.
    pub fn incoming(&self, service: Service) -> Option<mpsc::Receiver<Incoming>> {
        self.inner
            .incoming
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&service)
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
