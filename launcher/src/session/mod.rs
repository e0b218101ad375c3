//! Jobs on a session's running tree: `greedyrun` with `GREEDY_SESSION` set runs its job on
//! the agents a session keeps, with no new remote shell.
//!
//! Three sides, one idea:
//! - **The client** ([`attach`], `Attached::start`) is greedyrun as always: it plans the job
//!   on the session's free slots and runs [`crate::head`]'s loop (terminal, signals, stdin,
//!   verdict, deadlines), whose edges are the session's control connection instead of remote
//!   shells (`client::JobLink`).
//! - **The session** ([`JobBoard`], [`serve::serve_job`]) reserves the slots, sends the job down its
//!   tree ([`crate::proto::Cmd::JobStart`]), routes the client's commands to the job's hosts
//!   ([`crate::proto::Cmd::ForJob`]) and the job's frames ([`crate::proto::Up::Job`]) back to the client.
//! - **Each agent** ([`JobAgents`]) runs its part of the job itself: an agent of the job's own
//!   inside its process (`agent::run_in`), given the job's Start as a remote shell would give
//!   it, so wire-up, stdio, signals, exit codes and teardown are a fresh launch's, with no
//!   process started but the ranks. The job's agent shares the session agent's guard and the
//!   host's one PMIx server ([`crate::wireup::SharedPmix`]); its overlay, PMI and Charm++
//!   servers, process groups and abort are its own, so a job that fails ends only itself.
//!   Dropping its command channel is losing its remote shell.
//!
//! The session itself is `greedyrun --start-session`: a task stream daemon whose clients
//! submit streams and attach jobs.
//!
//! Files: `client` (greedyrun's side of a job), `control` (the control connection's request
//! line and frames), `board` and `queue` (the session's slots, its jobs and their frames),
//! `names` (the one name table of the session's jobs),
//! `serve` (the session's side of one job), `agent` (each agent's side), `dispatch` (which
//! host runs which task), `job_tasks` (a stream's MPI and multi-rank tasks, each a job through a
//! client of its own), `staging` (tasks' input files, sent down the tree once per content), `streams` (the task streams being run and their events: a session's,
//! or greedyrun's own `--tasks` stream), `daemon` (the session's loop).

pub(crate) mod agent;
pub(crate) mod board;
pub(crate) mod client;
pub(crate) mod control;
pub(crate) mod daemon;
pub(crate) mod dispatch;
pub(crate) mod job_tasks;
pub(crate) mod names;
pub(crate) mod queue;
pub(crate) mod serve;
pub(crate) mod staging;
pub(crate) mod streams;

pub use agent::{JobAgents, JobEnded, JobShare};
pub use board::JobBoard;
pub use client::{Attached, attach, connect_own};
pub use control::{job_request, socket_parent, stream_request};
pub use job_tasks::SERVE_VAR;
pub use names::AskSession;
pub use queue::JobQueue;
pub use serve::job_frame;
