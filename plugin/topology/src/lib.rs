//! topology_greedy: the Slurm topology plugin `topology/greedy` (24.11, 26.05). From 23.11 Slurm
//! has no route plugins: every slurmd that forwards an RPC (a step's launch, slurmctld's pings
//! and kills) splits its forward list through the topology plugin (`topology_g_split_hostlist`,
//! src/common/forward.c). This plugin splits along the greedy tree, with the same rule as
//! route/greedy on 22.05 ([`route_greedy::split`]), and serves every other hook (scheduling,
//! `scontrol show topology`, topoinfo) by calling the site's own topology plugin, the
//! *delegate*, loaded from PluginDir ([`delegate`]), so scheduling is exactly the delegate's.
//!
//! Reading order: [`config`] (`TopologyDelegate` in greedy.conf), [`delegate`] (finding,
//! loading and calling the site's plugin), [`split`] (the plan for one split, or why Slurm's
//! own is used), then `exports.rs` (the C entry points of each release).
//!
//! **Non-goals:** no topology of its own (the delegate's is the topology), no `topology.yaml`
//! (from 25.05 it can name only built-in plugins; without it, `TopologyPlugin` is used), no
//! change to srun's own first split on 25.05+ (srun splits with `hostlist_split_treewidth`
//! there, not through the plugin).

#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod config;
#[allow(unsafe_code)]
pub mod delegate;
// The C entry points reference symbols only Slurm processes define, so test binaries, which
// are not loaded by Slurm, leave them out; so does a build for a release without this
// topology interface (build.rs).
#[cfg(all(not(test), any(topo_v24_11, topo_v26_05)))]
#[allow(unsafe_code)]
mod exports;
pub mod split;
