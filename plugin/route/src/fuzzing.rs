//! The body of the cargo-fuzz target in `fuzz/`, so that the fuzz binary and the stable corpus
//! replay (`tests/fuzz_corpus.rs`) run the same checks. It takes arbitrary bytes and panics
//! only when an invariant of the code under test breaks.

use std::path::Path;

use greedy_slurm::conf;

use crate::config::RouteConfig;
use crate::split;

/// A fuzz target: the name of its binary and corpus directory, and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target of this crate.
pub const TARGETS: &[Target] = &[("route_conf", route_conf)];

/// greedy.conf as route/greedy reads it: a configuration (with a valid model) or one error,
/// never a panic; the split an accepted configuration plans is a partition of the host list
/// for any TreeWidth (the greedy one, or the TreeWidth fallback).
pub fn route_conf(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cfg) = RouteConfig::from_conf(&conf::parse(text), Path::new("greedy.conf")) else {
        return;
    };
    for (n, width) in [(1, 0), (7, 2), (64, 50), (1000, 3)] {
        let (planned, _) = split::split(n, Ok(cfg.model), width);
        split::check_partition(&planned.ranges, n, width).expect("a partition");
    }
}
