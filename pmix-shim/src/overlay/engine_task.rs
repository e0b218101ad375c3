//! The overlay's engine task: owns the collective [`Engine`] and every link's sender, and turns
//! handle requests, link events and deadlines into engine calls and frames.

use std::{collections::HashMap, net::SocketAddr, time::Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{Instrument, debug, warn};

use super::{Event, Incoming, Queues, Request, Shared, link::connect};
use crate::{
    AbortInfo, Error,
    collectives::{Engine, Outcome, Output},
    frame::{Link, Message, Service},
};

/// The engine task's state: the engine, the links it writes to, and who waits for what.
pub(super) struct EngineTask {
    /// What the link tasks share: the job, the tree, the config, the event channel.
    shared: Shared,
    /// The sans-I/O collectives; everything it outputs is carried out here.
    engine: Engine,
    /// This node's index.
    me: usize,
    /// The request channel's sending end, for answers to requests this node serves.
    answers_tx: mpsc::Sender<Request>,
    /// Tells the handles of the job's abort.
    aborted_tx: watch::Sender<Option<AbortInfo>>,
    /// Requests for this node, to its local servers ([`super::Overlay::incoming`]).
    queues: Queues,
    /// Each node's live links with their ids; frames go on the first.
    links: HashMap<usize, Vec<(u64, mpsc::Sender<Message>)>>,
    /// Collectives started here, by sequence number, awaiting their result.
    waiting: HashMap<u64, oneshot::Sender<Result<Outcome, Error>>>,
    /// Point-to-point requests this node sent, by id, awaiting their answer.
    asked: HashMap<u64, oneshot::Sender<Result<Bytes, String>>>,
    /// The id of this node's next point-to-point request.
    next_ask: u64,
    /// Every node's listener address, once the join gathered them.
    book: Vec<SocketAddr>,
    /// Messages for nodes we are still connecting to directly.
    parked: HashMap<usize, Vec<Message>>,
}

impl EngineTask {
    /// A task for `engine`; `answers_tx` is the sending end of the handle's request channel.
    pub(super) fn new(
        shared: Shared,
        engine: Engine,
        answers_tx: mpsc::Sender<Request>,
        aborted_tx: watch::Sender<Option<AbortInfo>>,
        queues: Queues,
    ) -> Self {
        EngineTask {
            me: shared.job.node_idx,
            shared,
            engine,
            answers_tx,
            aborted_tx,
            queues,
            links: HashMap::new(),
            waiting: HashMap::new(),
            asked: HashMap::new(),
            next_ask: 0,
            book: Vec::new(),
            parked: HashMap::new(),
        }
    }

    /// Serves requests, link events and deadlines until shutdown, then says bye.
    pub(super) async fn run(
        mut self,
        mut requests: mpsc::Receiver<Request>,
        mut events: mpsc::Receiver<Event>,
    ) {
        loop {
            let mut out = Vec::new();
            let deadline = self
                .engine
                .next_deadline()
                .map(tokio::time::Instant::from_std);
            tokio::select! {
                // Requests first: an abort a local server sent just before this node leaves
                // goes out ahead of the Bye.
                biased;
                Some(request) = requests.recv() => self.on_request(request, &mut out),
                _ = self.shared.shutdown.cancelled() => break,
                Some(event) = events.recv() => self.on_event(event, &mut out).await,
                _ = sleep_until_opt(deadline) => self.engine.on_timeout(Instant::now(), &mut out),
            }
            for output in out {
                self.on_output(output).await;
            }
        }
        self.shut_down();
    }

    /// A request from a handle.
    fn on_request(&mut self, request: Request, out: &mut Vec<Output>) {
        let me = self.me;
        match request {
            Request::Start {
                op,
                blob,
                timeout,
                reply,
            } => {
                // Only the join passes its own timeout; it must stay on the tree, since
                // the ring needs the addresses the join is gathering.
                let tree_only = timeout.is_some();
                let seq = self
                    .engine
                    .start(op, blob, Instant::now(), timeout, tree_only, out);
                self.waiting.insert(seq, reply);
            }
            Request::Abort(info) => self.engine.abort(info, out),
            Request::AddressBook(b) => self.book = b,
            Request::Ask {
                to,
                service,
                body,
                reply,
            } => {
                let id = self.next_ask;
                self.next_ask += 1;
                if to >= self.shared.job.n_nodes() {
                    let _ = reply.send(Err(format!("no node {to} in this job")));
                } else if to == me {
                    self.asked.insert(id, reply);
                    self.deliver(me, id, service, body, out);
                } else {
                    self.asked.insert(id, reply);
                    out.push(Output::Send {
                        to,
                        msg: Message::Request { id, service, body },
                    });
                }
            }
            Request::Answer { to, id, body } => {
                if to == me {
                    if let Some(reply) = self.asked.remove(&id) {
                        let _ = reply.send(body);
                    }
                } else {
                    out.push(Output::Send {
                        to,
                        msg: Message::Response { id, body },
                    });
                }
            }
        }
    }

    /// An event from a link task.
    async fn on_event(&mut self, event: Event, out: &mut Vec<Output>) {
        let me = self.me;
        match event {
            Event::Frame {
                from,
                msg: Message::Request { id, service, body },
            } => self.deliver(from, id, service, body, out),
            Event::Frame {
                from: _,
                msg: Message::Response { id, body },
            } => {
                // A request whose asker gave up (timeout) finds no one here: drop it.
                if let Some(reply) = self.asked.remove(&id) {
                    let _ = reply.send(body);
                }
            }
            Event::Frame { from, msg } => self.engine.on_message(from, msg, out),
            Event::Linked { node, id, tx } => {
                for msg in self.parked.remove(&node).unwrap_or_default() {
                    let _ = tx.send(msg).await;
                }
                self.links.entry(node).or_default().push((id, tx));
            }
            Event::Closed {
                node,
                id,
                clean,
                reason,
            } => {
                if let Some(l) = self.links.get_mut(&node) {
                    l.retain(|(i, _)| *i != id);
                }
                if !clean && self.engine.aborted().is_none() {
                    let host = self.shared.job.hosts.get(node).cloned().unwrap_or_default();
                    let reason = format!("lost overlay link to node {node} ({host}): {reason}");
                    warn!(peer = node, "{reason}");
                    let info = AbortInfo::new(me, None, crate::LOST_NODE_CODE, reason);
                    self.engine.abort(info, out);
                } else if clean {
                    self.engine.neighbour_left(node, out);
                }
            }
            Event::DirectFailed { node, reason } => {
                self.parked.remove(&node);
                if self.engine.aborted().is_none() {
                    let info = AbortInfo::new(me, None, crate::LOST_NODE_CODE, reason);
                    self.engine.abort(info, out);
                }
            }
        }
    }

    /// Carries out what the engine said.
    async fn on_output(&mut self, output: Output) {
        match output {
            Output::Send { to, msg } => self.send(to, msg).await,
            Output::Done { seq, result } => {
                if let Some(reply) = self.waiting.remove(&seq) {
                    let _ = reply.send(result);
                }
            }
            Output::Aborted(info) => {
                warn!(origin = info.origin_node, "job aborted: {info}");
                self.aborted_tx.send_replace(Some(info));
            }
        }
    }

    /// Sends `msg` to node `to` on its link, or parks it until a direct link to `to` is up
    /// (dialing it with the first parked message).
    async fn send(&mut self, to: usize, msg: Message) {
        if let Some((_, tx)) = self.links.get(&to).and_then(|l| l.first()) {
            if tx.send(msg).await.is_err() {
                debug!(peer = to, "link writer gone");
            }
        } else if let Some(&addr) = self.book.get(to) {
            let first = !self.parked.contains_key(&to);
            self.parked.entry(to).or_default().push(msg);
            if first {
                self.dial_direct(to, addr);
            }
        } else {
            // A tree neighbour whose link is being set up (the link task announces
            // itself on the event channel, which may be read after this request).
            self.parked.entry(to).or_default().push(msg);
        }
    }

    /// Opens a direct link to node `to` at `addr` in the background; a failure comes back as
    /// [`Event::DirectFailed`].
    fn dial_direct(&self, to: usize, addr: SocketAddr) {
        let shared = self.shared.clone();
        shared.tracker.clone().spawn(
            async move {
                // Tried again as long as a join would be: the peer's
                // listener drops new connections while strangers fill it.
                let until = tokio::time::Instant::now() + shared.config.join_timeout;
                if let Err(e) = connect(&shared, to, addr, Link::Direct, Some(until)).await {
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

    /// A request for this node: queue it for the local server of its `service`, or refuse it
    /// when that queue is full.
    fn deliver(&self, from: usize, id: u64, service: Service, body: Bytes, out: &mut Vec<Output>) {
        let me = self.me;
        let queue = self.queues.of(service);
        let incoming = Incoming {
            from,
            body,
            id,
            answers: Some(self.answers_tx.clone()),
        };
        if let Err(e) = queue.try_send(incoming) {
            let mut refused = e.into_inner();
            refused.answers = None;
            let body = Err(format!(
                "node {me}: no server for requests, or its queue is full"
            ));
            if from == me {
                let _ = self
                    .answers_tx
                    .try_send(Request::Answer { to: me, id, body });
            } else {
                out.push(Output::Send {
                    to: from,
                    msg: Message::Response { id, body },
                });
            }
        }
    }

    /// Clean shutdown: tell every peer, fail whoever still waits.
    fn shut_down(self) {
        for (_, tx) in self.links.values().flatten() {
            let _ = tx.try_send(Message::Bye);
        }
        drop(self.links);
        for (_, reply) in self.waiting {
            let _ = reply.send(Err(Error::Shutdown { node: self.me }));
        }
    }
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
