//! Signals: process-group delivery on hosts, and the TERM → KILL teardown of a set of groups.

use std::time::Duration;

use nix::{
    errno::Errno,
    sys::signal::{Signal, killpg},
    unistd::Pid,
};

/// Sends `signal` to process group `pgid`; false when the group no longer exists.
pub fn signal_group(pgid: u32, signal: Signal) -> bool {
    match i32::try_from(pgid) {
        Ok(raw) if raw > 1 => !matches!(killpg(Pid::from_raw(raw), signal), Err(Errno::ESRCH)),
        _ => false,
    }
}

/// Whether any process of group `pgid` is alive (signal 0 probes without delivering).
pub fn group_alive(pgid: u32) -> bool {
    match i32::try_from(pgid) {
        Ok(raw) if raw > 1 => killpg(Pid::from_raw(raw), None::<Signal>).is_ok(),
        _ => false,
    }
}

/// SIGTERM to every group, then SIGKILL to those still alive after `grace`; blocking.
///
/// Used by the guard, which has nothing else to do; the agent does the same asynchronously.
pub fn terminate_groups_blocking(groups: &[u32], grace: Duration) {
    for &g in groups {
        signal_group(g, Signal::SIGTERM);
    }
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline && groups.iter().any(|&g| group_alive(g)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    for &g in groups {
        signal_group(g, Signal::SIGKILL);
    }
}

/// The number of a signal, for exit codes.
pub fn number(signal: Signal) -> i32 {
    signal as i32
}
