//! Sans-I/O engine for the overlay collectives: barrier, broadcast, gather, allgather, abort.
//!
//! Every node runs one [`Engine`] and calls the same collectives in the same order; each call
//! gets the next sequence number, and messages for a collective this node has not started yet
//! are kept until it does. The engine only says what to send to which node ([`Output::Send`])
//! and when a collective is done; [`crate::overlay`] moves the bytes.
//!
//! Algorithms, on the job's greedy tree (node 0 is the root):
//! - **barrier**: empty contributions up the tree, an empty release down.
//! - **gather**: each node sends its subtree's blobs to its parent; the root gets all of them.
//! - **broadcast**: the root's blob flows down the tree.
//! - **allgather**: blobs go up the tree as in gather. If the whole payload stays within
//!   [`AllgatherRule::tree_max`] bytes the root sends the full set down the tree (two tree
//!   traversals, best for the small blobs of a typical fence). If any subtree exceeds it, that
//!   subtree sends only its size, and the root sends `Ring` or `Bruck` down the tree (by the
//!   number of nodes, [`AllgatherRule::ring_max_nodes`]); every node then runs that algorithm
//!   over direct links:
//!   - *Bruck*: in round k a node sends every blob it holds (at most 2^k: its own and those of
//!     the nodes after it) to the node 2^k before it, and receives as many from the node 2^k
//!     after it, so after ⌈log2 n⌉ rounds it holds all n. Each node sends and receives (n-1)
//!     blobs, in ⌈log2 n⌉ messages.
//!   - *ring*: node i sends its blob to i+1 and forwards what it gets from i-1 unless the next
//!     hop is the blob's origin; each blob crosses n-1 links, n-1 steps in sequence.
//!
//!   Both are bandwidth-optimal, while the tree root would send the whole payload to every
//!   child. The root decides, so every node picks the same algorithm although each only knows
//!   its own blob size. The crossovers are measured in docs/benchmarks.md.
//!
//! Result order: allgather and gather return one blob per node, **indexed by node index**.
//!
//! A collective not done within its timeout fails with [`Error::CollectiveTimeout`] naming the
//! nodes this node is still waiting for, and aborts the job: a lost collective cannot be resumed.

use std::{
    collections::{BTreeMap, BTreeSet},
    ops::ControlFlow,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use greedy_tree::Tree;
use tracing::warn;

use crate::{
    AbortInfo, Error, JobSpec,
    frame::{DownContent, Message, UpContent},
};

/// Which collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Wait until every node has entered.
    Barrier,
    /// Node 0's blob to every node.
    Broadcast,
    /// Every node's blob to node 0.
    Gather,
    /// Every node's blob to every node.
    Allgather,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Barrier => "barrier",
            Op::Broadcast => "broadcast",
            Op::Gather => "gather",
            Op::Allgather => "allgather",
        }
    }
}

/// Which allgather runs: by the total payload the root sees (every node's blob added up) and
/// the number of nodes. The defaults are the crossovers measured in docs/benchmarks.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllgatherRule {
    /// Totals up to this many bytes go up and down the tree.
    pub tree_max: u64,
    /// Larger totals run the ring on jobs of up to this many nodes, and Bruck's algorithm on
    /// larger ones (the ring's n-1 steps in sequence cost more than Bruck's ⌈log2 n⌉ rounds).
    pub ring_max_nodes: usize,
}

impl AllgatherRule {
    /// The tree up to `tree_max` bytes, the ring above.
    pub fn ring_above(tree_max: u64) -> Self {
        AllgatherRule {
            tree_max,
            ring_max_nodes: usize::MAX,
        }
    }

    /// The tree up to `tree_max` bytes, Bruck's algorithm above.
    pub fn bruck_above(tree_max: u64) -> Self {
        AllgatherRule {
            tree_max,
            ring_max_nodes: 0,
        }
    }

    /// What the root of `n` nodes sends down for an allgather past `tree_max`.
    fn large(&self, n: usize) -> DownContent {
        if n <= self.ring_max_nodes {
            DownContent::Ring
        } else {
            DownContent::Bruck
        }
    }
}

impl Default for AllgatherRule {
    fn default() -> Self {
        AllgatherRule {
            tree_max: 256 * 1024,
            ring_max_nodes: 16,
        }
    }
}

/// What a finished collective yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A barrier completed.
    Barrier,
    /// The root's blob.
    Broadcast(Bytes),
    /// On the root, every node's blob by node index; elsewhere `None`.
    Gather(Option<Vec<Bytes>>),
    /// Every node's blob, by node index.
    Allgather(Vec<Bytes>),
}

/// What the I/O layer must do.
#[derive(Debug)]
pub enum Output {
    /// Send a message to a node (a tree neighbour, or a ring or Bruck partner).
    Send {
        /// Destination node.
        to: usize,
        /// The message.
        msg: Message,
    },
    /// Collective `seq` finished.
    Done {
        /// Its sequence number.
        seq: u64,
        /// Its result.
        result: Result<Outcome, Error>,
    },
    /// The job was aborted (first time only): kill the local ranks.
    Aborted(AbortInfo),
}

#[derive(Debug, Default)]
struct State {
    /// Set when this node called the collective.
    op: Option<Op>,
    /// When this node called it.
    started: Option<Instant>,
    /// Never switch to the ring (the join: the ring needs the addresses it gathers).
    tree_only: bool,
    timeout: Duration,
    own: Bytes,
    /// Children's upward contributions, by child node index.
    from_children: BTreeMap<usize, UpContent>,
    sent_up: bool,
    /// The down message, if it arrived (it can only arrive after we sent up, except broadcast).
    down: Option<DownContent>,
    /// Ring state, once the root chose the ring.
    ring: Option<Vec<Option<Bytes>>>,
    /// Ring blobs that arrived before this node learned of the ring.
    early_ring: Vec<(u32, Bytes)>,
    /// Bruck state, once the root chose Bruck's algorithm.
    bruck: Option<Bruck>,
    /// Bruck messages not used yet, by round: each from the one node that sends it.
    early_bruck: BTreeMap<u32, Vec<(u32, Bytes)>>,
}

/// Where one node is in Bruck's allgather.
#[derive(Debug)]
struct Bruck {
    /// Blobs by origin node.
    blobs: Vec<Option<Bytes>>,
    /// This node holds the blobs of nodes me, me+1, …, me+held-1 (mod n).
    held: usize,
    /// The round whose message this node waits for.
    round: u32,
}

/// The node that sends node `me` of `n` its message of Bruck round `round`.
fn bruck_sender(me: usize, n: usize, round: u32) -> usize {
    (me + (1usize << round)) % n
}

/// One node's collective engine.
#[derive(Debug)]
pub struct Engine {
    node_idx: usize,
    /// The plan every node computed from the job description.
    topo: Arc<Tree>,
    allgather: AllgatherRule,
    timeout: Duration,
    next_seq: u64,
    /// This node's depth in the tree, and the tree's depth: for staggered deadlines.
    depth: usize,
    max_depth: usize,
    states: BTreeMap<u64, State>,
    /// Tree neighbours that left the job cleanly (said `Bye`).
    departed: BTreeSet<usize>,
    aborted: Option<AbortInfo>,
    /// For error messages: hosts and ranks of each node.
    job: JobSpec,
}

impl Engine {
    /// An engine for `job.node_idx` on `topo`; `allgather` picks each allgather's algorithm;
    /// every collective must finish within `timeout`.
    pub fn new(job: JobSpec, topo: Arc<Tree>, allgather: AllgatherRule, timeout: Duration) -> Self {
        let depths = topo.depths();
        let depth = depths[job.node_idx] as usize;
        let max_depth = depths.into_iter().max().unwrap_or(0) as usize;
        Engine {
            node_idx: job.node_idx,
            topo,
            allgather,
            timeout,
            next_seq: 0,
            depth,
            max_depth,
            states: BTreeMap::new(),
            departed: BTreeSet::new(),
            aborted: None,
            job,
        }
    }

    /// The job's abort, once aborted.
    pub fn aborted(&self) -> Option<&AbortInfo> {
        self.aborted.as_ref()
    }

    /// Sequence numbers of collectives started here and not yet done.
    pub fn pending(&self) -> impl Iterator<Item = u64> + '_ {
        self.states
            .iter()
            .filter(|(_, s)| s.op.is_some())
            .map(|(seq, _)| *seq)
    }

    /// Starts this node's part of the next collective; returns its sequence number.
    ///
    /// `blob` is this node's contribution (gather, allgather) or the payload (broadcast, on
    /// node 0 only); it is ignored elsewhere.
    /// `timeout` overrides the engine's default for this one collective, and `tree_only`
    /// keeps an allgather on the tree whatever its size: both for the overlay's join, which
    /// gathers the addresses the ring needs.
    pub fn start(
        &mut self,
        op: Op,
        blob: Bytes,
        now: Instant,
        timeout: Option<Duration>,
        tree_only: bool,
        out: &mut Vec<Output>,
    ) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(info) = &self.aborted {
            out.push(Output::Done {
                seq,
                result: Err(Error::Aborted(info.clone())),
            });
            return seq;
        }
        let state = self.states.entry(seq).or_default();
        state.op = Some(op);
        state.own = blob;
        state.started = Some(now);
        state.tree_only = tree_only;
        state.timeout = timeout.unwrap_or(self.timeout);
        self.advance(seq, out);
        self.fail_if_departed(out);
        seq
    }

    /// Tree neighbour `node` left the job cleanly (it said `Bye`): its ranks are done. A
    /// collective that still needs it can never finish, so the job is aborted now, naming it,
    /// rather than at the collective's timeout; so is any later one that needs it.
    ///
    /// The overlay's join (`tree_only`) is left to its own timeout: a node may leave mid-join
    /// when its ranks ended before it joined (slurmstepd ending a `/bin/true` step), which is
    /// no error while nobody needs it.
    pub fn neighbour_left(&mut self, node: usize, out: &mut Vec<Output>) {
        let me = self.node_idx;
        if self.topo.parent(me) == Some(node) || self.topo.children(me).any(|c| c == node) {
            self.departed.insert(node);
            self.fail_if_departed(out);
        }
    }

    /// Whether collective `state` still needs tree neighbour `node`: the parent, for the
    /// result (or to take this subtree's part); a child, for its subtree's part.
    fn needs(&self, state: &State, node: usize) -> bool {
        if state.tree_only || state.off_tree() || state.op.is_none() {
            return false;
        }
        if self.topo.parent(self.node_idx) == Some(node) {
            return true;
        }
        state.op != Some(Op::Broadcast)
            && !state.sent_up
            && !state.from_children.contains_key(&node)
    }

    fn fail_if_departed(&mut self, out: &mut Vec<Output>) {
        if self.aborted.is_some() {
            return;
        }
        let blocked = self.states.iter().find_map(|(&seq, state)| {
            let node = self.departed.iter().find(|&&n| self.needs(state, n))?;
            Some((seq, state.op?, *node))
        });
        let Some((seq, op, node)) = blocked else {
            return;
        };
        let reason = format!(
            "{} left the job while {} {seq} was waiting for it: its ranks ended without \
             entering it (ranks that end 0 without a word to the wire-up service ran as \
             singletons, started outside the launcher's environment)",
            self.job.describe_nodes(&[node]),
            op.name()
        );
        let info = AbortInfo::new(self.node_idx, None, 1, reason);
        self.abort(info, out);
    }

    /// Handles a collective message from node `from`.
    pub fn on_message(&mut self, from: usize, msg: Message, out: &mut Vec<Output>) {
        if self.aborted.is_some() && !matches!(msg, Message::Abort(_)) {
            return;
        }
        match msg {
            Message::Up { seq, content } => {
                if seq < self.next_seq && !self.states.contains_key(&seq) {
                    return; // a collective we already finished; cannot happen with honest peers
                }
                self.states
                    .entry(seq)
                    .or_default()
                    .from_children
                    .insert(from, content);
                self.advance(seq, out);
            }
            Message::Down { seq, content } => {
                if seq < self.next_seq && !self.states.contains_key(&seq) {
                    return;
                }
                self.states.entry(seq).or_default().down = Some(content);
                self.advance(seq, out);
            }
            Message::Ring { seq, origin, blob } => {
                if seq < self.next_seq && !self.states.contains_key(&seq) {
                    return;
                }
                let state = self.states.entry(seq).or_default();
                state.early_ring.push((origin, blob));
                self.advance(seq, out);
            }
            Message::Bruck { seq, round, blobs } => {
                if seq < self.next_seq && !self.states.contains_key(&seq) {
                    return;
                }
                let n = self.topo.len();
                // Only the one node that sends this round here, once: anything else is ignored
                // rather than trusted (it cannot come from an honest peer).
                if round >= usize::BITS
                    || (1usize << round) >= n
                    || bruck_sender(self.node_idx, n, round) != from
                {
                    return;
                }
                let state = self.states.entry(seq).or_default();
                state.early_bruck.entry(round).or_insert(blobs);
                self.advance(seq, out);
            }
            Message::Abort(info) => self.abort_from(Some(from), info, out),
            _ => {}
        }
    }

    /// Aborts the job from this node: floods the abort and fails every pending collective.
    pub fn abort(&mut self, info: AbortInfo, out: &mut Vec<Output>) {
        self.abort_from(None, info, out);
    }

    fn abort_from(&mut self, from: Option<usize>, info: AbortInfo, out: &mut Vec<Output>) {
        if self.aborted.is_some() {
            return;
        }
        self.aborted = Some(info.clone());
        let me = self.node_idx;
        for to in self
            .topo
            .parent(me)
            .into_iter()
            .chain(self.topo.children(me))
            .filter(|&n| Some(n) != from)
            .collect::<Vec<_>>()
        {
            out.push(Output::Send {
                to,
                msg: Message::Abort(info.clone()),
            });
        }
        let pending: Vec<u64> = self.pending().collect();
        for seq in pending {
            self.states.remove(&seq);
            out.push(Output::Done {
                seq,
                result: Err(Error::Aborted(info.clone())),
            });
        }
        self.states.clear();
        out.push(Output::Aborted(info));
    }

    /// When collective `state` times out here.
    ///
    /// The node that can name a missing contributor most precisely is the parent of the one that
    /// did not arrive, so deadlines are staggered: a node still waiting for its children gets
    /// 5 % of the timeout extra per level between it and the deepest level (deeper nodes fire
    /// first), and a node that has contributed and waits for the result fires last. Whoever fires
    /// first aborts the job with its message.
    fn deadline(&self, state: &State) -> Option<Instant> {
        let started = state.started?;
        let waiting_for_children =
            state.op != Some(Op::Broadcast) && !state.sent_up && !state.off_tree();
        let levels = if waiting_for_children {
            self.max_depth - self.depth
        } else {
            self.max_depth + 1
        };
        Some(started + state.timeout + state.timeout.mul_f64(0.05 * levels as f64))
    }

    /// The earliest deadline of a pending collective.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.states.values().filter_map(|s| self.deadline(s)).min()
    }

    /// Fails every collective whose deadline passed, naming who it waits for, and aborts the job.
    pub fn on_timeout(&mut self, now: Instant, out: &mut Vec<Output>) {
        let Some((&seq, state)) = self
            .states
            .iter()
            .find(|(_, s)| self.deadline(s).is_some_and(|d| d <= now))
        else {
            return;
        };
        let op = state.op.unwrap_or(Op::Barrier);
        let missing = self.missing(state);
        let err = Error::CollectiveTimeout {
            node: self.node_idx,
            op: op.name(),
            seq,
            after: now.saturating_duration_since(state.started.unwrap_or(now)),
            missing: self.job.describe_nodes(&missing),
            missing_nodes: missing,
        };
        let reason = err.to_string();
        self.states.remove(&seq);
        out.push(Output::Done {
            seq,
            result: Err(err),
        });
        self.abort(AbortInfo::new(self.node_idx, None, 1, reason), out);
    }

    /// Nodes whose contribution this node still waits for.
    fn missing(&self, state: &State) -> Vec<usize> {
        let me = self.node_idx;
        let off_tree = state
            .ring
            .as_ref()
            .or(state.bruck.as_ref().map(|b| &b.blobs));
        if let Some(blobs) = off_tree {
            return blobs
                .iter()
                .enumerate()
                .filter(|(_, b)| b.is_none())
                .map(|(i, _)| i)
                .collect();
        }
        let op = state.op.unwrap_or(Op::Barrier);
        if op != Op::Broadcast && !state.sent_up {
            let mut missing: Vec<usize> = self
                .topo
                .children(me)
                .filter(|c| !state.from_children.contains_key(c))
                .flat_map(|c| self.topo.subtree_range(c))
                .collect();
            if missing.is_empty() && self.topo.parent(me).is_none() {
                missing.push(me);
            }
            return missing;
        }
        // Waiting for the result from above: everything outside our subtree may be late.
        let mine = self.topo.subtree_range(me);
        (0..self.topo.len()).filter(|n| !mine.contains(n)).collect()
    }

    /// Moves collective `seq` as far as its messages allow: up the tree, down it, then through
    /// the ring or Bruck's rounds if the root chose one. Each phase breaks when the collective
    /// is done or must wait for a message.
    fn advance(&mut self, seq: u64, out: &mut Vec<Output>) {
        let Some(op) = self.states.get(&seq).and_then(|s| s.op) else {
            return;
        };
        if self.up_phase(seq, op, out).is_break() || self.down_phase(seq, op, out).is_break() {
            return;
        }
        let on_bruck = self.states.get(&seq).is_some_and(|s| s.bruck.is_some());
        if on_bruck {
            self.bruck_phase(seq, out);
        } else {
            self.ring_phase(seq, out);
        }
    }

    /// Upward phase: once every child's part is in, sends this subtree's part to the parent
    /// (which ends a gather here); the root instead decides what goes down.
    fn up_phase(&mut self, seq: u64, op: Op, out: &mut Vec<Output>) -> ControlFlow<()> {
        let me = self.node_idx;
        let Some(state) = self.states.get_mut(&seq) else {
            return ControlFlow::Break(());
        };
        if op == Op::Broadcast || state.sent_up {
            return ControlFlow::Continue(());
        }
        if self
            .topo
            .children(me)
            .any(|c| !state.from_children.contains_key(&c))
        {
            return ControlFlow::Break(());
        }
        let (blobs, total, oversize) = state.take_subtree(me);
        let oversize = oversize
            || (op == Op::Allgather && !state.tree_only && total > self.allgather.tree_max);
        state.sent_up = true;
        let Some(parent) = self.topo.parent(me) else {
            return self.decide(seq, op, blobs, oversize, out);
        };
        let content = if oversize {
            UpContent::Oversize(total)
        } else {
            UpContent::Blobs(blobs)
        };
        out.push(Output::Send {
            to: parent,
            msg: Message::Up { seq, content },
        });
        if op == Op::Gather {
            self.states.remove(&seq);
            out.push(Output::Done {
                seq,
                result: Ok(Outcome::Gather(None)),
            });
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }

    /// The root, with every node's part in: ends a gather, or sets what goes down the tree
    /// (the blobs, or the ring or Bruck for an allgather past `tree_max`).
    fn decide(
        &mut self,
        seq: u64,
        op: Op,
        blobs: Vec<(u32, Bytes)>,
        oversize: bool,
        out: &mut Vec<Output>,
    ) -> ControlFlow<()> {
        let n = self.topo.len();
        let down = match op {
            Op::Gather => {
                self.states.remove(&seq);
                let all = by_node(n, blobs);
                out.push(Output::Done {
                    seq,
                    result: Ok(Outcome::Gather(Some(all))),
                });
                return ControlFlow::Break(());
            }
            Op::Barrier => DownContent::Blobs(Vec::new()),
            _ if oversize => self.allgather.large(n),
            _ => DownContent::Blobs(blobs),
        };
        if let Some(state) = self.states.get_mut(&seq) {
            state.down = Some(down);
        }
        ControlFlow::Continue(())
    }

    /// Downward phase: forwards the down message to the children, then finishes, or starts
    /// the ring or Bruck's rounds.
    fn down_phase(&mut self, seq: u64, op: Op, out: &mut Vec<Output>) -> ControlFlow<()> {
        let me = self.node_idx;
        let n = self.topo.len();
        let Some(state) = self.states.get_mut(&seq) else {
            return ControlFlow::Break(());
        };
        if op == Op::Broadcast && self.topo.parent(me).is_none() && state.down.is_none() {
            state.down = Some(DownContent::Blobs(vec![(0, state.own.clone())]));
        }
        if state.off_tree() {
            return ControlFlow::Continue(());
        }
        let Some(down) = state.down.take() else {
            return ControlFlow::Break(());
        };
        for child in self.topo.children(me) {
            out.push(Output::Send {
                to: child,
                msg: Message::Down {
                    seq,
                    content: down.clone(),
                },
            });
        }
        match down {
            DownContent::Blobs(blobs) => {
                self.states.remove(&seq);
                out.push(Output::Done {
                    seq,
                    result: Ok(op.on_tree_outcome(n, blobs)),
                });
                return ControlFlow::Break(());
            }
            DownContent::Bruck => state.start_bruck(seq, me, n, out),
            DownContent::Ring => state.start_ring(seq, me, n, out),
        }
        ControlFlow::Continue(())
    }

    /// Bruck phase: takes each round's message in turn, then sends the next round's.
    fn bruck_phase(&mut self, seq: u64, out: &mut Vec<Output>) {
        let me = self.node_idx;
        let n = self.topo.len();
        let Some(state) = self.states.get_mut(&seq) else {
            return;
        };
        let Some(bruck) = state.bruck.as_mut() else {
            return;
        };
        while bruck.held < n {
            let Some(blobs) = state.early_bruck.remove(&bruck.round) else {
                return;
            };
            let first = bruck_sender(me, n, bruck.round);
            let count = (1usize << bruck.round).min(n - bruck.held);
            let expected = (0..count).map(|j| ((first + j) % n) as u32);
            if blobs.len() != count || !blobs.iter().map(|(o, _)| *o).eq(expected) {
                // Not what the sender must send: wait for the timeout, which names the
                // nodes whose blobs are still missing.
                warn!(
                    seq,
                    round = bruck.round,
                    "bruck message with the wrong blobs ignored"
                );
                return;
            }
            for (origin, blob) in blobs {
                bruck.blobs[origin as usize] = Some(blob);
            }
            bruck.held += count;
            bruck.round += 1;
            if bruck.held < n {
                bruck_send(seq, me, bruck, out);
            }
        }
        gathered(seq, &mut bruck.blobs, out);
        self.states.remove(&seq);
    }

    /// Ring phase: keeps each new blob and forwards it unless the next node is its origin.
    fn ring_phase(&mut self, seq: u64, out: &mut Vec<Output>) {
        let me = self.node_idx;
        let n = self.topo.len();
        let Some(state) = self.states.get_mut(&seq) else {
            return;
        };
        let next = (me + 1) % n;
        let ring = state.ring.as_mut().expect("ring phase");
        for (origin, blob) in std::mem::take(&mut state.early_ring) {
            let origin_idx = origin as usize;
            if origin_idx >= n || ring[origin_idx].is_some() {
                continue; // duplicate or nonsense: ignore rather than loop
            }
            if origin_idx != next {
                out.push(Output::Send {
                    to: next,
                    msg: Message::Ring {
                        seq,
                        origin,
                        blob: blob.clone(),
                    },
                });
            }
            ring[origin_idx] = Some(blob);
        }
        if ring.iter().all(Option::is_some) {
            gathered(seq, ring, out);
            self.states.remove(&seq);
        }
    }
}

impl Op {
    /// What a collective that ended on the tree with `blobs` from above yields.
    fn on_tree_outcome(self, n: usize, blobs: Vec<(u32, Bytes)>) -> Outcome {
        match self {
            Op::Barrier => Outcome::Barrier,
            Op::Broadcast => {
                Outcome::Broadcast(blobs.into_iter().next().map(|(_, b)| b).unwrap_or_default())
            }
            _ => Outcome::Allgather(by_node(n, blobs)),
        }
    }
}

impl State {
    /// Whether the allgather left the tree for the ring or Bruck's algorithm.
    fn off_tree(&self) -> bool {
        self.ring.is_some() || self.bruck.is_some()
    }

    /// This subtree's part, taking the children's: the blobs by origin node (this node's
    /// first), their total size, and whether a child's part was already too large to carry.
    fn take_subtree(&mut self, me: usize) -> (Vec<(u32, Bytes)>, u64, bool) {
        let mut blobs = vec![(me as u32, self.own.clone())];
        let mut oversize = false;
        let mut total = self.own.len() as u64;
        for content in std::mem::take(&mut self.from_children).into_values() {
            match content {
                UpContent::Blobs(b) => {
                    total += b.iter().map(|(_, x)| x.len() as u64).sum::<u64>();
                    blobs.extend(b);
                }
                UpContent::Oversize(bytes) => {
                    total += bytes;
                    oversize = true;
                }
            }
        }
        (blobs, total, oversize)
    }

    /// Starts Bruck's rounds as node `me` of `n`: holds its own blob, sends round 0.
    fn start_bruck(&mut self, seq: u64, me: usize, n: usize, out: &mut Vec<Output>) {
        let mut blobs = vec![None; n];
        blobs[me] = Some(self.own.clone());
        let bruck = Bruck {
            blobs,
            held: 1,
            round: 0,
        };
        if n > 1 {
            bruck_send(seq, me, &bruck, out);
        }
        self.bruck = Some(bruck);
    }

    /// Starts the ring as node `me` of `n`: holds its own blob, sends it to the next node.
    fn start_ring(&mut self, seq: u64, me: usize, n: usize, out: &mut Vec<Output>) {
        let mut ring = vec![None; n];
        ring[me] = Some(self.own.clone());
        self.ring = Some(ring);
        if n > 1 {
            let msg = Message::Ring {
                seq,
                origin: me as u32,
                blob: self.own.clone(),
            };
            out.push(Output::Send {
                to: (me + 1) % n,
                msg,
            });
        }
    }
}

/// Ends allgather `seq` with the blobs gathered off the tree, by origin node.
fn gathered(seq: u64, blobs: &mut [Option<Bytes>], out: &mut Vec<Output>) {
    let all = blobs
        .iter_mut()
        .map(|b| b.take().unwrap_or_default())
        .collect();
    out.push(Output::Done {
        seq,
        result: Ok(Outcome::Allgather(all)),
    });
}

/// Sends node `me`'s message of Bruck round `bruck.round`: the first 2^round blobs it holds (or
/// as many as the receiver still lacks) to the node 2^round before it.
fn bruck_send(seq: u64, me: usize, bruck: &Bruck, out: &mut Vec<Output>) {
    let n = bruck.blobs.len();
    let step = 1usize << bruck.round;
    let count = step.min(n - step);
    let blobs = (0..count)
        .map(|j| {
            let origin = (me + j) % n;
            let blob = bruck.blobs[origin].clone().unwrap_or_default();
            (origin as u32, blob)
        })
        .collect();
    out.push(Output::Send {
        to: (me + n - step) % n,
        msg: Message::Bruck {
            seq,
            round: bruck.round,
            blobs,
        },
    });
}

fn by_node(n: usize, blobs: Vec<(u32, Bytes)>) -> Vec<Bytes> {
    let mut all = vec![Bytes::new(); n];
    for (node, blob) in blobs {
        if let Some(slot) = all.get_mut(node as usize) {
            *slot = blob;
        }
    }
    all
}

#[cfg(test)]
mod tests;
