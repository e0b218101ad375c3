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

/// The signals that end greedyrun's job, SIGINT, SIGTERM and SIGHUP, as one source: a closed
/// terminal or ssh session must tear the job down in order like any other end, or a `--rsh
/// srun` step outlives greedyrun and its port is free for a stranger to take.
#[derive(Debug)]
pub struct Stops {
    int: Option<tokio::signal::unix::Signal>,
    term: Option<tokio::signal::unix::Signal>,
    hup: Option<tokio::signal::unix::Signal>,
}

impl Stops {
    /// Catches the three signals from now on (their default action no longer ends the process).
    pub fn new() -> Stops {
        use tokio::signal::unix::{SignalKind, signal};
        Stops {
            int: signal(SignalKind::interrupt()).ok(),
            term: signal(SignalKind::terminate()).ok(),
            hup: signal(SignalKind::hangup()).ok(),
        }
    }

    /// The next of the three to arrive.
    ///
    /// # Cancel safety
    /// Cancel safe: a signal that arrives while no one waits is kept for the next call.
    pub async fn recv(&mut self) -> Signal {
        async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
            if let Some(s) = s
                && s.recv().await.is_some()
            {
                return;
            }
            std::future::pending().await
        }
        tokio::select! {
            _ = next(&mut self.int) => Signal::SIGINT,
            _ = next(&mut self.term) => Signal::SIGTERM,
            _ = next(&mut self.hup) => Signal::SIGHUP,
        }
    }
}

impl Default for Stops {
    fn default() -> Self {
        Self::new()
    }
}
