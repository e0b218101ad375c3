//! greedy-launcher: `greedyrun` and `greedyd`, which start a parallel job over rsh/ssh along
//! the greedy launch tree and keep it under control until the end.
//!
//! Reading order: [`plan`] (arguments → validated [`plan::Plan`]), [`proto`] (the frames on
//! each tree edge), [`fanout`] (a parent starting its children over remote shells and routing
//! to them), [`agent`] (greedyd: its subtree, its ranks, teardown), [`head`] (greedyrun's loop),
//! [`status`] (which event ends the job with which code), and the smaller pieces: [`ssh`],
//! [`spawn`], [`stdio`], [`signals`], [`guard`], [`reap`], [`wireup`] (greedy-pmix embedded),
//! [`calibrate`], [`tasks`] (task streams, and a session's client), [`session`] (the session
//! daemon, the streams it runs and the jobs on it).
//!
//! Every edge of the launch tree is a remote shell: a parent runs `ssh host greedyd` and talks
//! to the child agent over that shell's stdin/stdout. The job description goes down once,
//! output, exits and failures come up, routed commands (stdin, addresses, shutdown, teardown)
//! go down. EOF on an edge means that subtree is lost, and the head names the host.
//!
//! ```no_run
//! # async fn demo() -> Result<(), greedy_launcher::Error> {
//! use greedy_launcher::plan::{HostSource, Plan, Request};
//! let plan = Plan::new(Request {
//!     n_ranks: Some(16), hosts: HostSource::List("n[1-8]".into()), ppn: Some(2),
//!     map_by: greedy_launcher::plan::MapBy::Slot, model: "0.02,0.15".parse().expect("a valid model"),
//!     topology: greedy_tree::Topology::Greedy, batch: 8,
//!     timeout: std::time::Duration::from_secs(30), grace: std::time::Duration::from_secs(3),
//!     pmi: greedy_launcher::proto::PmiMode::Auto, argv: vec!["hostname".into()], more: vec![],
//! })?;
//! assert_eq!(plan.hosts.len(), 8);
//! # Ok(()) }
//! ```
//!
//! **Non-goals:** no scheduler integration (that is the Slurm plugin), no wire-up protocol of
//! its own (greedy-pmix serves PMI-1/PMI-2 and PMIx), no `unsafe` (no `pre_exec`: process groups come from
//! `CommandExt::process_group`, orphan cleanup from a guard process), no retries of a job.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod agent;
pub mod allocation;
pub mod bcast;
pub mod calibrate;
pub mod children;
mod chunks;
pub mod connect;
mod error;
pub mod exports;
pub mod fanout;
// The fuzz targets' bodies, shared with the corpus replay test; not an API.
#[doc(hidden)]
pub mod fuzzing;
pub mod guard;
pub mod head;
pub mod heartbeat;
mod limits;
pub mod plan;
pub mod proto;
pub mod reap;
pub mod resume;
pub mod session;
pub mod signals;
pub mod slots;
pub mod spawn;
pub mod ssh;
pub mod status;
pub mod stdio;
pub mod task_spec;
pub mod tasks;
pub mod terminal;
pub mod wireup;

pub use error::Error;
