//! The crate's one error type; every variant names the node, rank or peer a person must look at.

use std::{fmt, io, net::SocketAddr, time::Duration};

/// The code of the abort a node starts when its overlay link to another node closes without a
/// bye (that node's host or agent is gone): greedyrun's code for a lost host, so that the
/// same fault ends a job with the same code whether the tree or the wire-up hears of it first.
pub const LOST_NODE_CODE: i32 = 125;

/// Why a job was aborted, as carried by the overlay to every node.
///
/// `origin_node` is where the abort started; `rank` is the rank that caused it, when one did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AbortInfo {
    /// The node whose agent started the abort.
    pub origin_node: usize,
    /// The rank that asked for or caused the abort, if any.
    pub rank: Option<u32>,
    /// The exit code the job should end with (the rank's own code when it exited).
    pub code: i32,
    /// What happened, for a person: names the rank and quotes offending text.
    pub reason: String,
    /// When the abort started, on the origin's clock.
    pub at: WallTime,
}

impl AbortInfo {
    /// An abort starting now at `origin_node`.
    pub fn new(origin_node: usize, rank: Option<u32>, code: i32, reason: String) -> Self {
        AbortInfo {
            origin_node,
            rank,
            code,
            reason,
            at: WallTime::now(),
        }
    }
}

/// A moment on a node's wall clock, in microseconds since the Unix epoch.
///
/// Two nodes can abort a job independently before either hears of the other (a rank calls
/// `MPI_Abort`, and a peer whose connection to it then fails aborts with its own code); the
/// job ends with the earliest, which is the cause. Cluster clocks agree to well under the
/// tens of milliseconds such a cascade takes.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct WallTime(pub u64);

impl WallTime {
    /// This node's clock now.
    pub fn now() -> Self {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        WallTime(u64::try_from(since.as_micros()).unwrap_or(u64::MAX))
    }
}

impl fmt::Display for WallTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::str::FromStr for WallTime {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(WallTime)
    }
}

impl fmt::Display for AbortInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {}", self.origin_node)?;
        if let Some(rank) = self.rank {
            write!(f, " rank {rank}")?;
        }
        write!(f, " (code {}): {}", self.code, self.reason)
    }
}

/// Everything that can go wrong in the overlay, the collectives and the PMI service.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The job description handed to the agent is inconsistent.
    #[error("job {job}: invalid job description: {reason}")]
    InvalidJob {
        /// The job id.
        job: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A listener could not be bound.
    #[error("node {node}: bind {addr}: {source}")]
    Bind {
        /// This node.
        node: usize,
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
    /// Connecting to another node's agent failed.
    #[error("node {node}: connect to node {peer_node} at {addr}: {source}")]
    Connect {
        /// This node.
        node: usize,
        /// The node we tried to reach.
        peer_node: usize,
        /// Its address.
        addr: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
    /// A peer failed the handshake (wrong version, wrong secret, garbage, wrong role).
    #[error("node {node}: peer {peer}: handshake refused: {reason}")]
    Handshake {
        /// This node.
        node: usize,
        /// The peer's address or node index.
        peer: String,
        /// Why it was refused.
        reason: String,
    },
    /// A named network wait ran out.
    #[error("node {node}: {what} timed out after {after:?}")]
    Timeout {
        /// This node.
        node: usize,
        /// Which wait (the name of its configuration field).
        what: &'static str,
        /// The configured limit.
        after: Duration,
    },
    /// A collective did not complete in time; names who has not contributed.
    #[error("node {node}: {op} #{seq} timed out after {after:?}; no contribution from {missing}")]
    CollectiveTimeout {
        /// This node.
        node: usize,
        /// barrier, broadcast, gather or allgather.
        op: &'static str,
        /// The collective's sequence number (every node counts the same).
        seq: u64,
        /// The configured limit.
        after: Duration,
        /// Node indices that have not contributed, as far as this node can tell.
        missing_nodes: Vec<usize>,
        /// The same, rendered with hosts and ranks.
        missing: String,
    },
    /// The job was aborted (by a rank, a failed rank, or another node).
    #[error("job aborted by {0}")]
    Aborted(AbortInfo),
    /// A PMIx server call failed.
    #[error("node {node}: {what}: {status}")]
    Pmix {
        /// This node.
        node: usize,
        /// The call (and the rank, when there is one).
        what: String,
        /// PMIx's status name and code.
        status: String,
    },
    /// Another node could not answer a point-to-point request.
    #[error("node {node}: request to node {peer_node} refused: {reason}")]
    Refused {
        /// This node.
        node: usize,
        /// The node asked.
        peer_node: usize,
        /// Its reason.
        reason: String,
    },
    /// The overlay was shut down while the operation was pending.
    #[error("node {node}: overlay shut down")]
    Shutdown {
        /// This node.
        node: usize,
    },
    /// The rendezvous could not give a peer's address.
    #[error("node {node}: rendezvous for node {peer_node}: {reason}")]
    Rendezvous {
        /// This node.
        node: usize,
        /// The node whose address was asked for.
        peer_node: usize,
        /// Why it failed.
        reason: String,
    },
    /// Another I/O failure, with what we were doing.
    #[error("node {node}: {what}: {source}")]
    Io {
        /// This node.
        node: usize,
        /// What we were doing.
        what: &'static str,
        /// The OS error.
        source: io::Error,
    },
}
