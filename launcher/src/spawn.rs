//! Starting a host's local ranks: one process group per rank, stdio piped to the agent.
//!
//! `std::process::Command::process_group(0)` (through tokio) makes each rank the leader of its
//! own group, so a signal to the group also reaches whatever the rank started (a wrapper
//! script's real program, anchors §3.8 on ompi#3337), and a Ctrl-C on greedyrun's terminal does
//! not hit ranks directly: greedyrun forwards it in order (TERM, then KILL). No `pre_exec` is
//! needed, so the launcher stays free of `unsafe` (STYLE.md).

use std::{os::unix::process::ExitStatusExt, process::ExitStatus, process::Stdio};

use command_fds::{CommandFdExt, FdMapping};
use tokio::process::{Child, Command};

use crate::proto::RankEnd;

/// What a rank is started with.
#[derive(Debug)]
pub struct RankSpec<'a> {
    /// Program and arguments.
    pub argv: &'a [String],
    /// The whole environment of the rank.
    pub env: Vec<(String, String)>,
    /// Working directory.
    pub cwd: &'a str,
    /// Whether the rank's stdin is a pipe from the agent (else /dev/null).
    pub stdin: bool,
    /// A descriptor the rank inherits at this number (its PMI socketpair); no other
    /// descriptor of the agent reaches it.
    pub inherit: Option<(std::os::fd::OwnedFd, i32)>,
}

/// Starts a rank in its own process group; stdout and stderr are pipes.
pub fn spawn(spec: RankSpec<'_>) -> std::io::Result<Child> {
    let mut cmd = Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..])
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(if spec.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // A missing working directory (not every host mounts it) falls back to the agent's, with
    // the rank still started, rather than failing a job over a cosmetic difference.
    if std::path::Path::new(spec.cwd).is_dir() {
        cmd.current_dir(spec.cwd);
    }
    if let Some((fd, child_fd)) = spec.inherit {
        // command-fds dup2s it in the child; our copy stays close-on-exec, so ranks started
        // at the same time never see each other's.
        cmd.fd_mappings(vec![FdMapping {
            parent_fd: fd,
            child_fd,
        }])
        .map_err(std::io::Error::other)?;
    }
    cmd.spawn()
}

/// How a rank ended, from its wait status.
pub fn end_of(status: ExitStatus) -> RankEnd {
    match (status.code(), status.signal()) {
        (Some(c), _) => RankEnd::Exited(c),
        (None, Some(s)) => RankEnd::Signaled(s),
        (None, None) => RankEnd::Exited(255),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn spawn_runs_in_its_own_group_and_reports_codes() {
        let argv = vec!["sh".to_string(), "-c".into(), "exit 3".into()];
        let spec = RankSpec {
            argv: &argv,
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            cwd: "/",
            stdin: false,
            inherit: None,
        };
        let env = spec.env.clone();
        let mut child = spawn(spec).unwrap();
        let pid = child.id().unwrap() as i32;
        let pgid = nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(pid)));
        let status = child.wait().await.unwrap();
        assert_eq!(end_of(status), RankEnd::Exited(3));
        // The group existed as the child's own (or the child was already reaped).
        if let Ok(g) = pgid {
            assert_eq!(g.as_raw(), pid);
        }
        let argv = vec!["sh".to_string(), "-c".into(), "kill -TERM $$".into()];
        let spec = RankSpec {
            argv: &argv,
            env,
            cwd: "/",
            stdin: false,
            inherit: None,
        };
        let status = spawn(spec).unwrap().wait().await.unwrap();
        assert_eq!(end_of(status), RankEnd::Signaled(15));
    }

    #[tokio::test]
    async fn a_rank_inherits_its_socketpair_at_the_given_fd_and_nothing_else() {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let other = std::os::unix::net::UnixStream::pair().unwrap();
        // fd 3 is the socketpair; the agent's other descriptor is not inherited.
        let script = format!(
            "readlink /proc/self/fd/3; test -e /proc/self/fd/{} && echo leaked; echo hi >&3",
            std::os::fd::AsRawFd::as_raw_fd(&other.1)
        );
        let argv = vec!["sh".to_string(), "-c".into(), script];
        let spec = RankSpec {
            argv: &argv,
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            cwd: "/",
            stdin: false,
            inherit: Some((theirs.into(), 3)),
        };
        let mut child = spawn(spec).unwrap();
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(child.stdout.as_mut().unwrap(), &mut out)
            .await
            .unwrap();
        assert!(child.wait().await.unwrap().success());
        assert!(out.starts_with("socket:["), "{out}");
        assert!(!out.contains("leaked"), "{out}");
        let mut got = String::new();
        std::io::Read::read_to_string(&mut &ours, &mut got).unwrap();
        assert_eq!(got, "hi\n");
    }
}
