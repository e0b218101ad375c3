//! greedy-pmix: the node-side wire-up service of greedy.
//!
//! Each node agent of a job (a `greedyd`, or the Slurm plugin inside slurmstepd) embeds this
//! crate. Given a [`JobSpec`] (hosts, this node's index, the launch model, the ranks on each
//! node, a per-job secret) it
//! 1. joins the **overlay** ([`overlay::Overlay`]): every agent computes the same greedy tree from
//!    the job description, listens on TCP, connects to its parent (whose address a pluggable
//!    [`rendezvous::Rendezvous`] supplies) and proves knowledge of the job secret
//!    ([`auth`]) on every connection;
//! 2. offers **collectives** over it ([`collectives`]): barrier, broadcast, gather, allgather
//!    (tree for small payloads, ring over direct links for large ones) and job-wide abort;
//! 3. serves **PMI-1 and PMI-2** to the local ranks ([`server::PmiServer`]) over an inherited
//!    socketpair (`PMI_FD`; never a port, which any local user could reach). A KVS fence is one
//!    allgather; a name publish or lookup is one request to node 0's table ([`names`]);
//! 4. or serves **PMIx** ([`pmix::PmixServer`], libpmix through greedy-sys): a PMIx fence is
//!    one allgather, a direct modex one point-to-point [`overlay::Overlay::request`]. A job
//!    uses one family or the other, never both for one rank.
//!
//! 5. or serves **Charm++ netlrts** ([`charm::server::CharmServer`]): what `charmrun` does for
//!    the charm4py wheel — `NETSTART` per rank, the node table over one allgather, print,
//!    barrier, ending and abort;
//! 6. and **ends the job** the same way on every embedder ([`node::job_end`],
//!    [`node::NodeService::watch_end`]): the node an abort started on tells the launcher and
//!    has the ranks killed, through what the embedder implements ([`node::job_end::JobEnd`]).
//!
//! Wire formats and protocol logic are sans-I/O engines tested without sockets:
//! [`frame`] (overlay frames), [`auth`], [`collectives::Engine`], [`pmi1`], [`pmi2`],
//! [`session::Session`], [`charm`].
//!
//! ```no_run
//! # async fn demo(job: greedy_pmix::JobSpec) -> Result<(), greedy_pmix::Error> {
//! use greedy_pmix::{overlay::{Overlay, OverlayConfig}, rendezvous::Memory, server::{PmiConfig, PmiServer}};
//! let board = Memory::default(); // in-process rendezvous; launchers supply their own
//! let overlay = Overlay::start(&job, OverlayConfig::default(), &board).await?;
//! let pmi = PmiServer::start(&job, overlay.clone(), PmiConfig::default()).await?;
//! let (child_end, env) = pmi.socketpair_for(job.local_ranks()[0], Some(3))?; // map child_end to fd 3
//! # drop((child_end, env)); pmi.shutdown().await; overlay.shutdown().await; Ok(()) }
//! ```
//!
//! **Non-goals**: starting processes (the launcher or slurmstepd forks the ranks and reports
//! their exits here), ssh, Slurm, PMI/PMIx spawn, PMIx name publishing and connect, and
//! unsafe code (libpmix is reached through greedy-sys's safe wrappers).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod auth;
pub mod charm;
pub mod child;
pub mod collectives;
mod departures;
mod error;
pub mod family;
// The listener tests' stranger, shared with mpi_greedy's; not an API.
#[doc(hidden)]
pub mod flood;
pub mod frame;
pub mod group;
// The fuzz targets' bodies, shared with the corpus replay test; not an API.
#[doc(hidden)]
pub mod fuzzing;
mod job;
mod listener;
pub mod names;
pub mod namespace;
pub mod node;
mod node0;
pub mod overlay;
pub mod peer;
pub mod pmi1;
pub mod pmi2;
pub mod pmix;
pub mod rendezvous;
pub mod server;
pub mod session;
pub mod spawn;
pub use error::{AbortInfo, Error, LOST_NODE_CODE, WallTime};
pub use job::{JobSecret, JobSpec};
pub use namespace::NamespaceSpec;
