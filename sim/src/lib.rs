//! greedy-sim: a discrete-event simulator of a parallel job's start-up, launch plus wire-up,
//! for machines we do not have (10^3–10^6 nodes).
//!
//! Reading order: [`simulate_launch`] runs a launch over any greedy-tree [`Tree`] under the
//! SEQ/REM model with [`Noise`] (per-launch jitter, stragglers) and optionally a
//! [`SharedCpu`] (the emulated cluster's hosts share 2 cores); [`wireup`] costs the allgather
//! of the nodes' endpoints over the overlay tree, a ring or Bruck's algorithm with α/β/γ
//! message costs ([`Net`]); a [`Scenario`] ties both together and runs them R times with
//! seeded noise ([`Summary`]: median, p5–p95); [`validate`] fits the model to measured
//! launches (`docs/data/launch.csv`) and says how far the simulation is from them; [`report`]
//! writes the Markdown section and SVG plots of docs/benchmarks.md; [`bcast`] predicts a file
//! broadcast pipelined down a tree against every node fetching it.
//!
//! ```
//! use greedy_sim::{Scenario, Shape};
//! use greedy_tree::LaunchModel;
//! let model = LaunchModel::new(0.007, 0.172)?;
//! let s = Scenario::launch(1000, "greedy".parse::<Shape>()?, model).run(1, 0)?;
//! // Without noise the simulated launch is equation 2 of the greedy tree: 0.589 s.
//! assert!((s.launched.median - 0.589).abs() < 1e-9);
//! # Ok::<(), greedy_sim::Error>(())
//! ```
//!
//! **Non-goals:** no real processes or sockets (that is greedyrun's and the emulated
//! cluster's job); no contention inside the network beyond each node's ports; the wire-up's
//! messages have no noise of their own (the launch's noise reaches it through the ready times).

#![forbid(unsafe_code)]

pub mod bcast;
mod error;
pub mod launch;
mod noise;
mod plot;
mod queue;
pub mod report;
mod scenario;
pub mod validate;
pub mod wireup;

pub use error::Error;
pub use launch::{Limits, SharedCpu, simulate_launch};
pub use noise::{Jitter, Noise};
pub use scenario::{Run, Scenario, Shape, Spread, Summary};
pub use wireup::{Allgather, Net};
