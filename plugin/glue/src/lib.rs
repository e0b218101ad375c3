//! greedy-slurm: what greedy's Slurm plugins (`route_greedy.so`, `topology_greedy.so`,
//! `mpi_greedy.so`) share, none of it touching Slurm itself.
//!
//! - [`conf`]: `greedy.conf` and Slurm's `mpi.conf`, the files next to `slurm.conf` (`Key=Value`
//!   lines, `#` comments): where they are ([`conf::path`], [`conf::beside_slurm_conf`]), and
//!   their parsed lines ([`conf::parse`]). Each plugin interprets its own keys.
//! - [`guard`]: runs the body of an `extern "C"` entry point so that a panic never unwinds
//!   into Slurm: it is caught, reported once through the plugin's logger, and the entry point
//!   returns its fallback.
//!
//! ```
//! let conf = greedy_slurm::conf::parse("RouteSeq=0.002 # measured\nRouteRem=0.03\n");
//! assert_eq!(conf.entries[0].key, "RouteSeq");
//! let rc = greedy_slurm::guard::catch("route_p_reconfigure", -1, |_| {}, || 0);
//! assert_eq!(rc, 0);
//! ```
//!
//! **Non-goals:** no FFI (the plugins' `exports.rs` call `greedy-sys`), no policy about what a
//! key means, no I/O beyond reading the one file.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod conf;
mod error;
// The fuzz target's body, shared with the corpus replay test; not an API.
#[doc(hidden)]
pub mod fuzzing;
pub mod guard;

pub use error::ConfError;
