//! The process-wide configuration: loaded at `init`, replaced at `route_p_reconfigure`, read by
//! every split (splits run concurrently on slurmd's and srun's forwarding threads).

use crate::config::RouteConfig;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// `None` until first loaded. An `Arc` so a split holds its snapshot without holding the lock
/// while it computes.
static CURRENT: RwLock<Option<Arc<RouteConfig>>> = RwLock::new(None);

/// Whether the last load ignored greedy.conf (its defaults are in force).
static IGNORED: AtomicBool = AtomicBool::new(false);

/// Rereads greedy.conf from its place ([`greedy_slurm::conf::path_from_env`]); returns the line
/// to log at error level if the file was ignored, and one to log at verbose level saying what
/// is in force (both without the plugin's name, which the caller puts first).
pub fn reload() -> (Option<String>, String) {
    reload_from(&greedy_slurm::conf::path_from_env())
}

/// [`reload`] from `path`.
pub fn reload_from(path: &std::path::Path) -> (Option<String>, String) {
    let (cfg, fault) = RouteConfig::load(path);
    let in_force = format!(
        "RouteSeq={} RouteRem={} RouteConcurrency={} (config {})",
        cfg.model.seq(),
        cfg.model.rem(),
        cfg.model.concurrency(),
        path.display()
    );
    // A poisoned lock only means a panic while it was held; the value is replaced whole.
    let mut slot = CURRENT.write().unwrap_or_else(|p| p.into_inner());
    *slot = Some(Arc::new(cfg));
    IGNORED.store(fault.is_some(), Ordering::Relaxed);
    (fault, in_force)
}

/// Whether the configuration in force is the defaults because greedy.conf could not be used
/// (route/greedy splits with them; topology/greedy leaves the split to its delegate).
pub fn file_was_ignored() -> bool {
    IGNORED.load(Ordering::Relaxed)
}

/// The configuration in force, loading it first if `init` did not; the second value is the
/// line to log if that first load ignored the file.
pub fn current() -> (Arc<RouteConfig>, Option<String>) {
    if let Some(cfg) = CURRENT.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
        return (Arc::clone(cfg), None);
    }
    let (fault, _) = reload();
    let cfg = CURRENT
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .unwrap_or_default();
    (cfg, fault)
}
