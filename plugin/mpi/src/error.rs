//! The crate's one error type; each variant names the node (and variable or peer) to look at.

use std::time::Duration;

/// Everything that can stop mpi/greedy from serving a step.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A variable the step needs is absent from the hook's environment.
    #[error("{node}: {var} is not set (was the step started with --mpi=greedy?)")]
    Missing {
        /// The node (NodeName, or `srun`).
        node: String,
        /// The variable.
        var: &'static str,
    },
    /// A variable holds something we cannot use.
    #[error("{node}: {var}={value:?}: {reason}")]
    Malformed {
        /// The node (NodeName, or `srun`).
        node: String,
        /// The variable.
        var: &'static str,
        /// Its value (never the secret's).
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The launch environment (from the user's srun) says other than slurmstepd's own record
    /// of the step: a root stepd acts on Slurm's record only, so the step is refused.
    #[error("{node}: {var}={value:?} contradicts slurmstepd's record ({slurm}): refusing the step")]
    Contradicts {
        /// The node.
        node: String,
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What slurmstepd's record says.
        slurm: String,
    },
    /// An mpi.conf setting is wrong.
    #[error(transparent)]
    Conf(#[from] greedy_slurm::ConfError),
    /// A spawned step's tasks could not be handed to the parent step ([`crate::attach`]).
    #[error("{node}: cannot attach to step {parent}'s service: {reason}")]
    Attach {
        /// The node.
        node: String,
        /// The parent step, `J.S`.
        parent: String,
        /// Why.
        reason: String,
    },
    /// A node's address could not be found or resolved.
    #[error("{node}: address of {host}: {reason}")]
    Address {
        /// The node looking.
        node: String,
        /// The host whose address was wanted.
        host: String,
        /// Why it failed.
        reason: String,
    },
    /// The wire-up service (overlay, PMI server) failed.
    #[error("{node}: {source}")]
    Shim {
        /// The node.
        node: String,
        /// What greedy-pmix reported.
        #[source]
        source: greedy_pmix::Error,
    },
    /// A system call failed.
    #[error("{node}: {what}: {source}")]
    Io {
        /// The node (NodeName, or `srun`).
        node: String,
        /// What we were doing.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A named wait ran out.
    #[error("{node}: {what} ran out after {after:?}")]
    Timeout {
        /// The node.
        node: String,
        /// The timeout's name (its mpi.conf key).
        what: &'static str,
        /// Its value.
        after: Duration,
    },
    /// A node is in two components of a het step: each component runs its own slurmstepd
    /// there, and one step's overlay has one node service per node.
    #[error(
        "{node}: {host} is in {components} of het step {step}: mpi/greedy serves a het step \
         whose components have disjoint nodes (one node service per node); place the \
         components on different nodes (srun -w/-x per component)"
    )]
    SharedNode {
        /// The node refusing (NodeName, or `srun`).
        node: String,
        /// The het step, `J.S`.
        step: String,
        /// The node in two components.
        host: String,
        /// Which components (or which ranks, when Slurm did not say), for a person.
        components: String,
    },
    /// The hook was called in a state it cannot serve (e.g. prefork twice in one stepd).
    #[error("{node}: {reason}")]
    State {
        /// The node.
        node: String,
        /// What is wrong.
        reason: String,
    },
}

impl Error {
    /// Turns greedy-pmix failures on `node` into [`Error::Shim`] (for `map_err`).
    pub(crate) fn shim(node: &str) -> impl Fn(greedy_pmix::Error) -> Error + Copy + '_ {
        move |source| Error::Shim {
            node: node.to_string(),
            source,
        }
    }

    /// Turns a failed system call on `node` while doing `what` into [`Error::Io`].
    pub(crate) fn io(node: &str) -> impl Fn(&'static str, std::io::Error) -> Error + Copy + '_ {
        move |what, source| Error::Io {
            node: node.to_string(),
            what,
            source,
        }
    }
}
