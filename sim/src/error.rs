//! The one error type of greedy-sim: every variant names the input at fault.

use std::path::PathBuf;

/// What went wrong, with the parameter, file line or row to correct.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A simulation parameter out of range.
    #[error("{name} {value}: {reason}")]
    Param {
        /// The parameter (command-line name).
        name: &'static str,
        /// The value given.
        value: String,
        /// What it must be.
        reason: &'static str,
    },
    /// A malformed line of a measurements file.
    #[error("{}: line {line}: {reason}: {text:?}", path.display())]
    Measured {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The line as read.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An error of the tree planner (bad model or topology name).
    #[error(transparent)]
    Tree(#[from] greedy_tree::Error),
    /// A plot could not be drawn or written.
    #[error("plot {}: {reason}", path.display())]
    Plot {
        /// The file being written.
        path: PathBuf,
        /// The backend's message.
        reason: String,
    },
}

impl Error {
    /// A [`Error::Param`] naming `name` and `value`.
    pub fn param(name: &'static str, value: impl ToString, reason: &'static str) -> Error {
        Error::Param {
            name,
            value: value.to_string(),
            reason,
        }
    }
}
