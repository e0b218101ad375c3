//! libgreedy: the LIBI interface over greedy's launch tree, for tool builders.
//!
//! A front end ([`FrontEnd`]) launches a [`Distribution`] of processes through a [`Backend`]
//! (greedyrun over ssh/rsh or on a session, an srun step, or beside a running Slurm job) and
//! exchanges messages with the session master (rank 0). The members ([`Member`]) learn rank
//! and size and call `broadcast`, `scatter`, `gather`, `allgather`, `barrier` and `reduce`,
//! carried by their hosts' agents over greedy's authenticated overlay along the greedy tree.
//! The C ABI over the same calls is `capi` (`include/greedy/libi.h`).
#![deny(unsafe_code)]

mod backend;
pub mod capi;
mod channel;
mod distribution;
mod error;
mod front;
// The fuzz targets' bodies, shared with the corpus replay test; not an API.
#[doc(hidden)]
pub mod fuzzing;
mod member;
mod pmi;
pub mod stacks;

pub use backend::Backend;
pub use distribution::{Distribution, HostGroup};
pub use error::{Error, Result};
pub use front::{FrontEnd, Outcome, Session};
pub use member::Member;
