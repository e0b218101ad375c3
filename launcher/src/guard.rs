//! The guard: a tiny process per agent that kills the agent's ranks if the agent dies.
//!
//! An agent that is SIGKILLed cannot clean up, and its ranks would be orphaned (they are in
//! their own process groups, and sshd sends no SIGHUP without a tty). So every agent starts
//! `greedyd --guard GRACE` in a process group of its own, with stdin a pipe from the agent and
//! stdout/stderr on /dev/null (so it never holds the remote shell's channel open). The agent
//! writes `pgid N` for each rank it starts and `done` when it has reaped them all. EOF without
//! `done` means the agent died: the guard sends SIGTERM to every group, SIGKILL after GRACE,
//! and exits. (`PR_SET_PDEATHSIG` would need `pre_exec`, i.e. unsafe code, in the launcher.)

use std::{
    io::{BufRead, Write},
    process::Stdio,
    time::Duration,
};

use tokio::{
    io::AsyncWriteExt,
    process::{Child, ChildStdin, Command},
};

use crate::signals;

/// Runs the guard loop on this process's stdin; returns when the agent said done or died.
pub fn run(grace: Duration) {
    let mut groups = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if line == "done" {
            return;
        }
        if let Some(pgid) = line.strip_prefix("pgid ").and_then(|p| p.parse().ok()) {
            groups.push(pgid);
        } else if let Some(pgid) = line
            .strip_prefix("gone ")
            .and_then(|p| p.parse::<u32>().ok())
        {
            groups.retain(|&g| g != pgid);
        }
    }
    signals::terminate_groups_blocking(&groups, grace);
    let _ = std::io::stderr().flush();
}

/// The agent's handle on its guard.
#[derive(Debug)]
pub struct GuardHandle {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl GuardHandle {
    /// Starts `exe --guard GRACE_SECS` (exe: this agent's own binary).
    pub fn start(exe: &std::path::Path, grace: Duration) -> std::io::Result<GuardHandle> {
        let mut child = Command::new(exe)
            .arg("--guard")
            .arg(format!("{:.3}", grace.as_secs_f64()))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        let stdin = child.stdin.take();
        Ok(GuardHandle { child, stdin })
    }

    /// Tells the guard about a rank's process group.
    pub async fn watch(&mut self, pgid: u32) {
        if let Some(stdin) = &mut self.stdin {
            let _ = stdin.write_all(format!("pgid {pgid}\n").as_bytes()).await;
            let _ = stdin.flush().await;
        }
    }

    /// A task's process group is gone: the guard forgets it.
    pub async fn unwatch(&mut self, pgid: u32) {
        if let Some(stdin) = &mut self.stdin {
            let _ = stdin.write_all(format!("gone {pgid}\n").as_bytes()).await;
            let _ = stdin.flush().await;
        }
    }

    /// Every rank is reaped: release the guard and reap it.
    pub async fn done(mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"done\n").await;
            let _ = stdin.flush().await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await;
    }
}
