//! The guard: a tiny process per agent that kills the agent's ranks if the agent dies.
//!
//! An agent that is SIGKILLed cannot clean up, and its ranks would be orphaned (they are in
//! their own process groups, and sshd sends no SIGHUP without a tty). So every agent starts
//! `greedy-guard GRACE` (the binary beside greedyd, which maps none of greedyd's libraries;
//! `greedyd --guard GRACE` where it is missing) in a process group of its own, with stdin a pipe from the agent and
//! stdout/stderr on /dev/null (so it never holds the remote shell's channel open). The agent
//! writes `pgid N` for each rank it starts and `done` when it has reaped them all. EOF without
//! `done` means the agent died: the guard sends SIGTERM to every group, SIGKILL after GRACE,
//! and exits. (`PR_SET_PDEATHSIG` would need `pre_exec`, i.e. unsafe code, in the launcher.)
//! A session's agent runs its jobs in its own process, and they share its guard
//! ([`GuardHandle::share`]); each job's handle makes the guard forget the job's groups at its end.

use std::{
    collections::HashSet,
    io::{BufRead, Write},
    process::Stdio,
    time::Duration,
};

use tokio::{
    io::AsyncWriteExt,
    process::{Child, Command},
    sync::mpsc,
    task::JoinHandle,
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

/// The agent's handle on its guard; [`GuardHandle::share`] hands a job run in this process (a
/// session's) a handle on the same guard.
#[derive(Debug)]
pub struct GuardHandle {
    /// Lines for the guard's stdin, written in order by one task.
    lines: mpsc::UnboundedSender<String>,
    /// The guard and its writer, for the owner only: a shared handle cannot release it.
    owned: Option<(Child, JoinHandle<()>)>,
    /// A shared handle's groups still watched, forgotten by the guard at its `done`: the
    /// guard outlives the job, and a group number freed later may become a stranger's.
    watched: HashSet<u32>,
}

impl GuardHandle {
    /// Starts `greedy-guard GRACE_SECS` from `exe`'s directory (exe: this agent's own
    /// binary), or `exe --guard GRACE_SECS` if there is none.
    pub fn start(exe: &std::path::Path, grace: Duration) -> std::io::Result<GuardHandle> {
        let guard = exe.with_file_name("greedy-guard");
        let mut command = match guard.is_file() {
            true => Command::new(guard),
            false => {
                let mut c = Command::new(exe);
                c.arg("--guard");
                c
            }
        };
        let mut child = command
            .arg(format!("{:.3}", grace.as_secs_f64()))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        let mut stdin = child.stdin.take().expect("piped");
        let (lines, mut rx) = mpsc::unbounded_channel::<String>();
        let writer = tokio::spawn(async move {
            while let Some(line) = rx.recv().await {
                let written = stdin
                    .write_all(line.as_bytes())
                    .await
                    .and(stdin.flush().await);
                // After `done` the guard exits: shared handles may still hold the channel.
                if written.is_err() || line == "done\n" {
                    break;
                }
            }
        });
        Ok(GuardHandle {
            lines,
            owned: Some((child, writer)),
            watched: HashSet::new(),
        })
    }

    /// A handle on the same guard for a job this agent runs in its own process; its
    /// [`GuardHandle::done`] leaves the guard running.
    pub fn share(&self) -> GuardHandle {
        GuardHandle {
            lines: self.lines.clone(),
            owned: None,
            watched: HashSet::new(),
        }
    }

    /// Tells the guard about a rank's process group.
    pub async fn watch(&mut self, pgid: u32) {
        if self.owned.is_none() {
            self.watched.insert(pgid);
        }
        let _ = self.lines.send(format!("pgid {pgid}\n"));
    }

    /// A task's process group is gone: the guard forgets it.
    pub async fn unwatch(&mut self, pgid: u32) {
        self.watched.remove(&pgid);
        let _ = self.lines.send(format!("gone {pgid}\n"));
    }

    /// Every rank is reaped: release the guard and reap it (a shared handle: the guard
    /// forgets this handle's groups).
    pub async fn done(self) {
        let Some((mut child, writer)) = self.owned else {
            for pgid in self.watched {
                let _ = self.lines.send(format!("gone {pgid}\n"));
            }
            return;
        };
        let _ = self.lines.send("done\n".into());
        drop(self.lines);
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            let _ = writer.await;
            let _ = child.wait().await;
        })
        .await;
    }
}
