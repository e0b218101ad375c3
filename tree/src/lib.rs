//! greedy-tree: optimal process-launch trees under the SEQ/REM model, and the host lists they
//! are laid over.
//!
//! A launch starts one process per host along a tree: a parent spends SEQ between two launches
//! and a child can launch REM after its parent started it ([`LaunchModel`], Goehner et al.,
//! IEEE Cluster 2012). [`greedy()`] builds the tree with the least launch time for `n` hosts
//! in O(n); [`Topology`] names it and the fixed shapes other launchers use; a [`Tree`] is laid
//! over a host list in depth-first preorder, so host 0 is the root and each subtree owns a
//! contiguous slice. [`Tree::launch_times`] evaluates any tree under the model, and
//! [`calibrate`] fits SEQ and REM to measured launches. Host lists come
//! from Slurm hostlist expressions ([`hostlist`]) and hostfiles ([`hostfile`]).
//!
//! ```
//! use greedy_tree::{LaunchModel, Topology};
//! let model = LaunchModel::new(0.007, 0.172)?;
//! let tree = Topology::Greedy.build(1000, &model);
//! let kary16 = Topology::Kary(16).build(1000, &model);
//! assert!(tree.launch_time(&model) <= kary16.launch_time(&model));
//! // A forwarder owning hosts 1..n recomputes its part of the plan from its range alone.
//! let first = tree.children(0).next().unwrap();
//! let mine = tree.subtree_range(first);
//! let sub = Topology::Greedy.build(mine.len(), &model);
//! assert_eq!(sub.child_ranges(mine.clone()),
//!            tree.children(first).map(|c| tree.subtree_range(c)).collect::<Vec<_>>());
//! # Ok::<(), greedy_tree::Error>(())
//! ```
//!
//! [`treewidth`] holds Slurm's own TreeWidth splits, the shape the greedy plan replaces.
//!
//! **Non-goals:** no I/O (callers read files and print), no process launching, no knowledge
//! of Slurm or ssh beyond the hostlist syntax and the TreeWidth split. Every node computes the same plan from
//! (hosts, model) without messages.

#![forbid(unsafe_code)]

pub mod calibrate;
#[cfg(feature = "cli")]
pub mod cli;
mod error;
// The fuzz targets' bodies, shared with the corpus replay test; not an API.
#[doc(hidden)]
pub mod fuzzing;
mod greedy;
pub mod hostfile;
pub mod hostlist;
pub mod hostname;
mod model;
mod topology;
mod tree;
pub mod treewidth;

pub use error::Error;
pub use greedy::{greedy, greedy_with_heap};
pub use model::LaunchModel;
pub use topology::Topology;
pub use tree::{Children, Position, Positions, Shape, Tree};
