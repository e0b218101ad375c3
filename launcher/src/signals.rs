//! Signals: process-group delivery on hosts, and the TERM → KILL teardown of a set of groups.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::Duration,
};

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
/// A group seen empty is never signalled again: its number is free for any new process.
pub fn terminate_groups_blocking(groups: &[u32], grace: Duration) {
    for &g in groups {
        signal_group(g, Signal::SIGTERM);
    }
    let mut left = groups.to_vec();
    let deadline = std::time::Instant::now() + grace;
    loop {
        left.retain(|&g| group_alive(g));
        if left.is_empty() || std::time::Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for &g in &left {
        signal_group(g, Signal::SIGKILL);
    }
}

/// The process groups that are still a job's own, shared by the tasks that reap their leaders.
///
/// A group is the job's from its leader's spawn until its leader is reaped and no member is
/// left: from then on Linux may hand its number to any new process (`pid_max` is 32768 on
/// many nodes), so a later `killpg` would hit a stranger's group, another user's under root.
/// A group that outlives its leader (a rank's background child) stays the job's until it is
/// seen empty, since the kernel allocates no pid that names a live group.
#[derive(Debug, Clone, Default)]
pub struct OwnGroups(Arc<Mutex<HashSet<u32>>>);

impl OwnGroups {
    /// `pgid` is a group whose leader this process just spawned.
    pub fn adopt(&self, pgid: u32) {
        self.set().insert(pgid);
    }

    /// Forgets `pgid` if no member is left; call it right after reaping its leader (before
    /// anything slow: the number is free the moment the group empties). True when forgotten.
    pub fn forget_if_empty(&self, pgid: u32) -> bool {
        let mut set = self.set();
        if !group_alive(pgid) {
            set.remove(&pgid);
        }
        !set.contains(&pgid)
    }

    /// Whether `pgid` is still the job's.
    pub fn owns(&self, pgid: u32) -> bool {
        self.set().contains(&pgid)
    }

    /// Sends `signal` to `pgid` if it is still the job's; forgets it when it is gone.
    pub fn signal(&self, pgid: u32, signal: Signal) -> bool {
        let mut set = self.set();
        if !set.contains(&pgid) {
            return false;
        }
        let delivered = signal_group(pgid, signal);
        if !delivered {
            set.remove(&pgid);
        }
        delivered
    }

    /// SIGKILL to whatever is left of `pgid` (if still the job's), which is then forgotten.
    pub fn kill_and_forget(&self, pgid: u32) {
        self.signal(pgid, Signal::SIGKILL);
        self.set().remove(&pgid);
    }

    /// Every group still the job's.
    pub fn all(&self) -> Vec<u32> {
        self.set().iter().copied().collect()
    }

    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<u32>> {
        // Nothing panics while holding the lock; a poisoned set is still the right set.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Spawns `script` as the leader of a process group of its own.
    fn leader(script: &str) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        std::process::Command::new("sh")
            .args(["-c", script])
            .process_group(0)
            .spawn()
            .unwrap()
    }

    #[test]
    fn a_group_is_forgotten_once_its_reaped_leader_left_it_empty() {
        let own = OwnGroups::default();
        let mut alone = leader("exit 0");
        let pgid = alone.id();
        own.adopt(pgid);
        alone.wait().unwrap();
        assert!(own.forget_if_empty(pgid));
        assert!(
            !own.signal(pgid, Signal::SIGKILL),
            "a forgotten group was signalled"
        );

        // A leader that leaves a background child: the group stays the job's until killed.
        let mut parent = leader("sleep 4264 & exit 0");
        let pgid = parent.id();
        own.adopt(pgid);
        parent.wait().unwrap();
        assert!(!own.forget_if_empty(pgid));
        assert_eq!(own.all(), [pgid]);
        own.kill_and_forget(pgid);
        assert!(own.all().is_empty());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while group_alive(pgid) {
            assert!(std::time::Instant::now() < deadline, "its sleep survived");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
