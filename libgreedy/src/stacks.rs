//! Merged call stacks (greedy-stack): collected, merged into a call-prefix tree, rendered.
//!
//! The flow follows LLNL's STAT: a daemon on each node finds the job's ranks there
//! ([`targets::local_ranks`], from /proc and the ranks' environment), takes the stack of every
//! thread of each ([`collect::Collector`]), inserts them into a [`CallTree`], and sends the tree
//! up the daemon tree, where trees are merged ([`CallTree::merge`] is associative and
//! commutative, and costs one walk of both trees); the front end prints the result
//! ([`render`]: text lines per path, JSON, or an SVG drawing). Ranks are held as ranges
//! ([`RankSet`]), so a node of a large job's tree stays a few bytes.
//!
//! Stacks come from elfutils' `eu-stack` when it is on PATH: it only reads the ELF symbol tables
//! and CFI it needs, where gdb loads the symbols (and DWARF) of the whole program and its
//! libraries before printing anything, so it is an order of magnitude faster per process (5-15 ms
//! against about 200 ms for small programs, measured here); a rank is thus held under ptrace only
//! for those few milliseconds; and it is a small Debian package (`elfutils`) that a node image can
//! carry where gdb is not welcome. `gdb -batch` is the fallback, and the kernel's
//! `/proc/PID/task/TID/stack` (root only, kernel frames only) the last resort.
//!
//! Non-goals: source lines, arguments and inlined frames (they split ranks that wait in the same
//! function into many paths); demangling beyond what the tools print.

pub mod collect;
mod error;
mod ranks;
pub mod render;
pub mod targets;
pub mod tree;

pub use collect::Collector;
pub use error::Error;
pub use ranks::RankSet;
pub use targets::{Job, RankProcess, local_ranks};
pub use tree::CallTree;
