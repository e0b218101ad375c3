//! The one error type of greedy-slurm: what is wrong with `greedy.conf` or `mpi.conf`, and where.

use std::path::PathBuf;
use thiserror::Error;

/// A configuration file (`greedy.conf`, `mpi.conf`) that cannot be read or has a line the
/// plugin cannot use.
#[derive(Debug, Error)]
pub enum ConfError {
    /// The file exists but could not be read (a missing file is not an error: defaults apply).
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why reading failed.
        source: std::io::Error,
    },
    /// A line that is not `Key=Value`, or a value the plugin refuses.
    #[error("{}: line {line}: {reason}: {text:?}", path.display())]
    Line {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The offending line, as written.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
}
