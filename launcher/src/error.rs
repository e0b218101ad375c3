//! The launcher library's one error type; every variant names the host, rank or input to look at.

use std::io;

/// Everything the launcher library can report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The command line or a hostfile does not describe a runnable job.
    #[error("{0}")]
    Plan(String),
    /// A host list or hostfile could not be parsed.
    #[error("{what}: {error}")]
    Hosts {
        /// Which input (`--hosts`, `-H`, the hostfile path).
        what: String,
        /// The parser's error, with line and column (part of the message, not a `source`:
        /// `{:#}` would print it twice).
        error: greedy_tree::Error,
    },
    /// A control-plane frame could not be encoded or decoded.
    #[error("control frame: {0}")]
    Frame(String),
    /// An I/O failure, with what we were doing.
    #[error("{what}: {source}")]
    Io {
        /// What we were doing.
        what: String,
        /// The OS error.
        source: io::Error,
    },
    /// A peer that should be this user's own (greedyrun, a session) did not prove it: nothing
    /// was sent to it, nothing it said was obeyed.
    #[error("{0}")]
    Untrusted(String),
    /// The wire-up service failed.
    #[error(transparent)]
    Wireup(#[from] greedy_pmix::Error),
}

impl From<io::Error> for Error {
    fn from(source: io::Error) -> Self {
        Error::Io {
            what: "control pipe".into(),
            source,
        }
    }
}
