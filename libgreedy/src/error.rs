//! The one error type of libgreedy: each variant names the rank, host, key or program at fault.

use std::io;

/// What went wrong, and where.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// This process was not started as a member (no `PMI_FD`, `PMI_RANK`, `PMI_SIZE`).
    #[error(
        "not a libgreedy member: {0} is not set (start members through a libgreedy front end, greedyrun --pmi pmi1 or srun --mpi=greedy)"
    )]
    NotAMember(&'static str),
    /// A variable of the member's environment does not hold what it must.
    #[error("{name}={value:?} is not valid: {why}")]
    BadVariable {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// Why it was refused.
        why: &'static str,
    },
    /// The local agent's PMI socket failed.
    #[error("the local agent's PMI socket (fd {fd}): {source}")]
    Agent {
        /// The socket's descriptor.
        fd: i32,
        /// The cause.
        source: io::Error,
    },
    /// The local agent answered something else than the request asked for.
    #[error("the local agent answered {answer:?} to {request}")]
    Protocol {
        /// The request's command.
        request: &'static str,
        /// The line it got.
        answer: String,
    },
    /// The agent refused a request (`rc` not 0).
    #[error("the local agent refused {request}: {why}")]
    Refused {
        /// The request's command.
        request: &'static str,
        /// The agent's message.
        why: String,
    },
    /// A member's contribution is missing or damaged in the exchange.
    #[error("rank {rank}'s contribution to {operation} #{seq} is missing or damaged ({why})")]
    Contribution {
        /// The collective.
        operation: &'static str,
        /// Its sequence number among this session's collectives.
        seq: u64,
        /// The rank whose data is at fault.
        rank: u32,
        /// What was wrong.
        why: String,
    },
    /// A collective was called with arguments that cannot be right.
    #[error("{operation}: {why}")]
    Usage {
        /// The call.
        operation: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// Only the session master (rank 0) talks to the front end.
    #[error("only the session master (rank 0) talks to the front end; this is rank {0}")]
    NotMaster(u32),
    /// The process distribution was refused before anything started.
    #[error("process distribution: {0}")]
    Distribution(String),
    /// The launcher could not be started.
    #[error("could not start {program}: {source}")]
    Launch {
        /// The launcher command.
        program: String,
        /// The cause.
        source: io::Error,
    },
    /// A Slurm command the back end asks failed.
    #[error("{command}: {why}")]
    Slurm {
        /// The command line.
        command: String,
        /// Its error output or the failure.
        why: String,
    },
    /// The session ended (a member died, the launcher failed) before the call completed.
    #[error("the session ended: {0}")]
    SessionEnded(String),
    /// No message came within the time asked for.
    #[error("no message from the session master within {0:?}")]
    Timeout(std::time::Duration),
    /// Talking to the front end over the master's stdio failed.
    #[error("the front-end channel: {0}")]
    Channel(#[source] io::Error),
}

/// libgreedy's results.
pub type Result<T> = std::result::Result<T, Error>;
