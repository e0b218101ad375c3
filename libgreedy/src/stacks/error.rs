//! The one error type of `stacks`: every variant names the pid, tool or path at fault.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

/// What can go wrong while finding a job's ranks, collecting their stacks or reading a rank set.
#[derive(Debug, Error)]
pub enum Error {
    /// A directory or file of /proc that must be readable is not (the /proc root itself, or a
    /// rank's task list for kernel stacks).
    #[error("{}: {source}", path.display())]
    Read {
        /// The path as opened.
        path: PathBuf,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// A Slurm job runs several steps on this node and none was named, so their ranks collide.
    #[error("slurm job {job}: steps {steps:?} run on this node: name one (JOB.STEP)")]
    Steps {
        /// The job id.
        job: u32,
        /// The steps found, ascending.
        steps: Vec<u32>,
    },
    /// The stack tool could not be started.
    #[error("pid {pid}: {tool}: cannot start: {source}")]
    Spawn {
        /// The process whose stacks were asked for.
        pid: u32,
        /// `eu-stack` or `gdb`.
        tool: &'static str,
        /// Why the exec failed.
        source: std::io::Error,
    },
    /// The stack tool did not finish in time (a stuck ptrace attach); it was killed.
    #[error("pid {pid}: {tool}: no answer after {after:?}, killed")]
    Timeout {
        /// The process whose stacks were asked for.
        pid: u32,
        /// `eu-stack` or `gdb`.
        tool: &'static str,
        /// The time allowed.
        after: Duration,
    },
    /// The stack tool ran but printed no stack (no such process, ptrace refused, ...).
    #[error("pid {pid}: {tool}: no stack ({status}): {message}")]
    NoStack {
        /// The process whose stacks were asked for.
        pid: u32,
        /// `eu-stack`, `gdb` or `kernel`.
        tool: &'static str,
        /// The tool's exit status, as printed by std.
        status: String,
        /// The last line the tool wrote to stderr, the reason it gives.
        message: String,
    },
    /// A job named in a form that is neither `J[.S]` (Slurm) nor, for the daemons, `slurm:J[.S]`
    /// or `greedy:ID`.
    #[error("job {text:?}: expected {expected}")]
    JobName {
        /// The text as given.
        text: String,
        /// The forms accepted where it was given.
        expected: &'static str,
    },
    /// A rank set's text that is not `A[-B][,C[-D]]...` of ascending ranks.
    #[error("rank set {text:?}: expected ranges like 0-62,64")]
    RankSet {
        /// The text as given.
        text: String,
    },
}
