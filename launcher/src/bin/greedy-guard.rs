//! `greedy-guard GRACE`: the guard of an agent's ranks ([`greedy_launcher::guard`]), a binary of
//! its own so that it maps no library greedyd needs and it does not (libpmix, hwloc): each
//! agent starts one, and the dynamic loader's work is a good part of a host's cost per job.

use std::time::Duration;

fn main() {
    let grace = std::env::args().nth(1).and_then(|g| g.parse::<f64>().ok());
    let Some(grace) = grace.filter(|g| g.is_finite() && *g >= 0.0) else {
        eprintln!("usage: greedy-guard GRACE_SECONDS (started by greedyd, not by hand)");
        std::process::exit(2);
    };
    greedy_launcher::guard::run(Duration::from_secs_f64(grace));
}
