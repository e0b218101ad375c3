//! mpi_greedy: the Slurm MPI plugin `mpi/greedy` (`srun --mpi=greedy`, `MpiDefault=greedy`),
//! Slurm 22.05, 24.11 and 26.05. slurmstepd serves the job's ranks PMIx (Open MPI), PMI-1/PMI-2
//! (MPICH, Intel MPI) and Charm++ netlrts: under `auto` every family at once, each rank by the
//! one it speaks, or the one a step or mpi.conf names ([`plan::Protocol::resolve`]), through
//! greedy-pmix: node agents joined in a greedy tree overlay, a fence as one allgather.
//!
//! Reading order: [`plan`] (sans-I/O: srun's layout → private variables; a stepd's env → what
//! it serves; which protocol), [`config`] (the `Greedy*` keys of Slurm's mpi.conf), [`rendezvous`]
//! (how a stepd learns its overlay parent's address when the step has no reserved ports),
//! [`srun`] (srun's side), [`nested`] (a rank's spawn as a nested step), [`attach`] (a PMIx
//! child step's tasks served by the parent step), [`agent`] (slurmstepd's side), [`logging`],
//! then `exports.rs`
//! (the C entry points, thin trampolines into greedy-sys).
//!
//! ```
//! use mpi_greedy::{config::MpiConfig, plan::{self, Protocol, StepLayout, StepPlan, StepRecord}};
//! // srun: 2 nodes x 2 ranks, no reserved ports: srun's listener (port 4000) is the rendezvous.
//! let layout = StepLayout { job_id: 7, step_id: 0, node_list: "n[1-2]".into(),
//!     ranks: vec![vec![0, 1], vec![2, 3]], het: None };
//! let env = plan::prelaunch_env(&layout, &greedy_pmix::JobSecret::generate(), &MpiConfig::default(),
//!     Protocol::Pmi, 4000, true);
//! // n2's stepd: slurmstepd's own record of the step, and the same variables plus what
//! // slurmd set.
//! let stepd = StepRecord { job_id: 7, step_id: 0, nnodes: 2, ntasks: 4, nodeid: 1,
//!     node_tasks: 2, uid: 1000, gid: 1000, node_name: "n2".into(), het: None };
//! let get = |k: &str| match k {
//!     "SLURM_SRUN_COMM_HOST" => Some("10.0.0.1".to_string()),
//!     _ => env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()),
//! };
//! let step = StepPlan::new(&stepd, get)?;
//! assert_eq!((step.node_idx, step.ranks[1].clone()), (1, vec![2, 3]));
//! # Ok::<(), mpi_greedy::Error>(())
//! ```
//!
//! **Non-goals:** no Slurm-internal struct beyond the documented hook arguments and the
//! leading fields of the stepd's `stepd_step_rec_t` (ids, counts, uid, gid, node name, the het
//! step's nodes and ranks: the authority a root stepd acts on, never the user's launch env), no
//! srun-side forwarding of KVS data (srun only helps nodes find each other), no node shared by
//! two components of a
//! het step, no settings a stepd reads itself (srun reads mpi.conf's `Greedy*` keys
//! and passes them to every node), no non-root PMIx jobs yet (libpmix's directory is not
//! handed to the job's uid).

#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod agent;
pub mod attach;
pub mod charm;
pub mod choice;
pub mod config;
mod error;
// The C entry points reference symbols only Slurm processes define, so test binaries, which
// are not loaded by Slurm, leave them out.
#[cfg(not(test))]
#[allow(unsafe_code)]
mod exports;
// The fuzz targets' bodies, shared with the corpus replay test; not an API.
#[doc(hidden)]
pub mod fuzzing;
pub mod logging;
pub mod nested;
pub mod plan;
pub mod rendezvous;
pub mod srun;

pub use error::Error;

/// `plugin_id`: "GRDY" in ASCII. Slurm's own MPI plugins use 101–108 (slurm_mpi.h) and the
/// loader reserves 0 and NO_VAL, so this cannot collide with a built-in one.
pub const PLUGIN_ID: u32 = 0x4752_4459;
