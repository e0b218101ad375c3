//! route_greedy: the Slurm route plugin `route/greedy` (22.05, 23.02). Slurm sends every
//! forwarded RPC (srun's task launch, slurmctld's pings and kills, sbcast) down a tree: the
//! sender splits the sorted host list into sub-lists, contacts each sub-list's head, and the
//! head forwards to the rest of its sub-list the same way. route/default splits k-ary by
//! `TreeWidth`; this plugin splits along the greedy tree, the fastest under the SEQ/REM launch
//! model (research/slurm-plugin-api.md §5).
//!
//! Reading order: [`split`] (the pure split and its TreeWidth fallback), [`config`] (the
//! `Route*` keys of greedy.conf), [`state`] (the configuration in force), then `exports.rs`
//! (the C entry points, thin trampolines into greedy-sys). [`calibrate`] fits the model's
//! SEQ and REM to timed `srun` launches under route/default, for greedy.conf's defaults.
//!
//! ```
//! use route_greedy::split::{greedy_ranges, kary_ranges};
//! let model = greedy_tree::LaunchModel::new(0.011, 0.056)?;
//! // srun reaching 16 hosts: heads n1, n2, n4, … each forwarding to the rest of its range.
//! let greedy = greedy_ranges(16, &model, 50)?;
//! assert_eq!(greedy.iter().map(|r| r.len()).sum::<usize>(), 16);
//! assert_eq!(kary_ranges(16, 4).len(), 4);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **Non-goals:** no knowledge of which RPC is being forwarded (the route interface does not
//! say), no per-step trees (the plugin is cluster-wide), no Slurm ≥ 23.11 (the route plugin
//! interface is gone; its successor is the topology plugin).

#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod calibrate;
pub mod config;
// The C entry points reference symbols only Slurm processes define, so test binaries, which
// are not loaded by Slurm, leave them out; so does a build for a Slurm without the route
// plugin interface (≥ 23.11; build.rs).
#[cfg(all(not(test), route_interface))]
#[allow(unsafe_code)]
mod exports;
// The fuzz target's body, shared with the corpus replay test; not an API.
#[doc(hidden)]
pub mod fuzzing;
pub mod split;
pub mod state;
