//! Starting a host's local ranks: one process group per rank, stdio piped to the agent.
//!
//! `std::process::Command::process_group(0)` (through tokio) makes each rank the leader of its
//! own group, so a signal to the group also reaches whatever the rank started (a wrapper
//! script's real program, anchors §3.8 on ompi#3337), and a Ctrl-C on greedyrun's terminal does
//! not hit ranks directly: greedyrun forwards it in order (TERM, then KILL). No `pre_exec` is
//! needed, so the launcher stays free of `unsafe` (STYLE.md): a rank bound to CPUs
//! (`--bind-to`) inherits the affinity of the thread that forks it, which is set for that one
//! synchronous spawn and restored after.

use std::{
    os::unix::process::ExitStatusExt,
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
};

use command_fds::{CommandFdExt, FdMapping};
use tokio::process::{Child, Command};

use crate::proto::RankEnd;

/// What a rank is started with.
#[derive(Debug)]
pub struct RankSpec<'a> {
    /// Program and arguments.
    pub argv: &'a [String],
    /// The whole environment of the rank.
    pub env: &'a [(String, String)],
    /// Working directory.
    pub cwd: &'a str,
    /// Whether the rank's stdin is a pipe from the agent (else /dev/null).
    pub stdin: bool,
    /// A descriptor the rank inherits at this number (its PMI socketpair); no other
    /// descriptor of the agent reaches it.
    pub inherit: Option<(std::os::fd::OwnedFd, i32)>,
    /// The CPUs the rank is bound to, if it is.
    pub cpus: Option<&'a [u32]>,
    /// Files its stdio comes from and goes to instead of pipes (a task's).
    pub files: Option<&'a StdioFiles>,
}

/// Files a task's stdin, stdout and stderr are instead of /dev/null and pipes to the agent.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StdioFiles {
    /// Read as stdin.
    pub stdin: Option<PathBuf>,
    /// Created (or truncated) for stdout.
    pub stdout: Option<PathBuf>,
    /// Created (or truncated) for stderr.
    pub stderr: Option<PathBuf>,
}

/// `path` opened for the child, or an error that names it.
fn open(path: &Path, write: bool) -> std::io::Result<Stdio> {
    let file = match write {
        true => std::fs::File::create(path),
        false => std::fs::File::open(path),
    };
    file.map(Stdio::from)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// Starts a rank in its own process group; stdout and stderr are pipes unless
/// [`RankSpec::files`] names files for them.
pub fn spawn(spec: RankSpec<'_>) -> std::io::Result<Child> {
    let files = spec.files.cloned().unwrap_or_default();
    let stdin = match (&files.stdin, spec.stdin) {
        (Some(p), _) => open(p, false)?,
        (None, true) => Stdio::piped(),
        (None, false) => Stdio::null(),
    };
    let out = |file: &Option<PathBuf>| {
        file.as_deref()
            .map_or(Ok(Stdio::piped()), |p| open(p, true))
    };
    let mut cmd = Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..])
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(stdin)
        .stdout(out(&files.stdout)?)
        .stderr(out(&files.stderr)?)
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
    match spec.cpus {
        None => cmd.spawn(),
        Some(cpus) => spawn_bound(&mut cmd, cpus),
    }
}

/// Spawns with this thread's affinity set to `cpus` (the child inherits it from the forking
/// thread), then gives the thread its own back. Nothing else runs on the thread meanwhile:
/// the spawn is synchronous.
fn spawn_bound(cmd: &mut Command, cpus: &[u32]) -> std::io::Result<Child> {
    use nix::{sched, unistd::Pid};
    let this_thread = Pid::from_raw(0);
    let mut set = sched::CpuSet::new();
    for &cpu in cpus {
        set.set(cpu as usize).map_err(std::io::Error::other)?;
    }
    let own = sched::sched_getaffinity(this_thread).map_err(std::io::Error::other)?;
    sched::sched_setaffinity(this_thread, &set).map_err(std::io::Error::other)?;
    let child = cmd.spawn();
    // Restoring cannot fail where setting just worked (the same thread, a wider set).
    let _ = sched::sched_setaffinity(this_thread, &own);
    child
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
            env: &[("PATH".into(), "/usr/bin:/bin".into())],
            cwd: "/",
            stdin: false,
            inherit: None,
            cpus: None,
            files: None,
        };
        let env = spec.env;
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
            cpus: None,
            files: None,
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
            env: &[("PATH".into(), "/usr/bin:/bin".into())],
            cwd: "/",
            stdin: false,
            inherit: Some((theirs.into(), 3)),
            cpus: None,
            files: None,
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

    #[tokio::test]
    async fn a_bound_rank_runs_on_its_cpus_and_the_agent_keeps_its_own() {
        let this_thread = nix::unistd::Pid::from_raw(0);
        let own = nix::sched::sched_getaffinity(this_thread).unwrap();
        let cpu = (0..nix::sched::CpuSet::count())
            .find(|&c| own.is_set(c).unwrap_or(false))
            .expect("this thread may run somewhere") as u32;
        let argv = vec![
            "sh".to_string(),
            "-c".into(),
            "grep Cpus_allowed_list /proc/self/status".into(),
        ];
        let spec = RankSpec {
            argv: &argv,
            env: &[("PATH".into(), "/usr/bin:/bin".into())],
            cwd: "/",
            stdin: false,
            inherit: None,
            cpus: Some(&[cpu]),
            files: None,
        };
        let out = spawn(spec).unwrap().wait_with_output().await.unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text.split_whitespace().last(),
            Some(cpu.to_string().as_str()),
            "{text}"
        );
        assert_eq!(nix::sched::sched_getaffinity(this_thread).unwrap(), own);
    }
}
