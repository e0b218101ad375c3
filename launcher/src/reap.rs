//! Cleaning a host whose agent never said hello: what its remote shell had started there.
//!
//! sshd and rshd do not signal a session's processes when the client goes away (no pty), so
//! killing a hung remote shell here leaves whatever it started on the host: a login script
//! that stalls, an agent binary on a hung filesystem. Every agent command therefore carries
//! `--launch TOKEN` (job and node, [`token`]); a parent that gives up on a child runs
//! `AGENT --reap TOKEN` on that host through a fresh remote shell, and [`reap`] kills this
//! user's processes whose command line carries the token, with their descendants, the
//! session or process group they lead, before they can fork again.

use std::{collections::HashSet, os::unix::fs::MetadataExt};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

/// The option that marks an agent's command line (and the remote shell's) with its token.
pub const LAUNCH_FLAG: &str = "--launch";

/// The option that runs the reaper instead of an agent.
pub const REAP_FLAG: &str = "--reap";

/// Scans before giving up on processes that keep forking.
const ROUNDS: usize = 5;

/// The token of `node`'s agent of job `job_id`: unique per host of a job, so that hosts
/// sharing one process table (containers, the emulated cluster) never reap each other.
pub fn token(job_id: &str, node: u32) -> String {
    format!("{job_id}.{node}")
}

/// One process as the reaper sees it.
#[derive(Debug, Clone)]
struct Proc {
    pid: u32,
    ppid: u32,
    pgrp: u32,
    session: u32,
    /// The argv words joined by spaces (a remote shell's `sh -c '…'` string included).
    cmdline: String,
}

/// Kills every process of this user that carries `--launch TOKEN`, its descendants and the
/// session or group it leads; returns how many processes were signalled.
pub fn reap(token: &str) -> std::io::Result<usize> {
    let uid = std::fs::metadata("/proc/self")?.uid();
    let spared = ancestors_of_self();
    let mut killed = 0;
    for _ in 0..ROUNDS {
        let procs = processes_of(uid);
        let victims: Vec<u32> = victims(&procs, token)
            .into_iter()
            .filter(|p| !spared.contains(p))
            .collect();
        if victims.is_empty() {
            break;
        }
        // Stop first, so a victim cannot fork a child this scan misses; then kill.
        for &pid in &victims {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGSTOP);
        }
        for &pid in &victims {
            if kill(Pid::from_raw(pid as i32), Signal::SIGKILL).is_ok() {
                killed += 1;
            }
        }
    }
    Ok(killed)
}

/// The processes to kill: those marked with the token, everything below them, and the members
/// of a session or process group a marked process leads (what reparented to init escapes the
/// PPid walk, not its session).
fn victims(procs: &[Proc], token: &str) -> Vec<u32> {
    let marked: Vec<&Proc> = procs
        .iter()
        .filter(|p| carries(&p.cmdline, token))
        .collect();
    let mut out: HashSet<u32> = HashSet::new();
    for m in &marked {
        out.insert(m.pid);
        for p in procs {
            if (m.session == m.pid && p.session == m.pid) || (m.pgrp == m.pid && p.pgrp == m.pid) {
                out.insert(p.pid);
            }
        }
    }
    // Descendants, to a fixed point.
    loop {
        let before = out.len();
        for p in procs {
            if out.contains(&p.ppid) {
                out.insert(p.pid);
            }
        }
        if out.len() == before {
            break;
        }
    }
    let mut v: Vec<u32> = out.into_iter().collect();
    v.sort_unstable();
    v
}

/// Whether `cmdline` holds `--launch TOKEN` with the token as a whole word.
fn carries(cmdline: &str, token: &str) -> bool {
    let needle = format!("{LAUNCH_FLAG} {token}");
    cmdline.match_indices(&needle).any(|(at, _)| {
        cmdline[at + needle.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || "._-".contains(c)))
    })
}

/// This process and its ancestors: never reaped, whatever their command lines say.
fn ancestors_of_self() -> HashSet<u32> {
    let mut out = HashSet::new();
    let mut pid = std::process::id();
    while pid > 1 && out.insert(pid) {
        match read_proc(pid) {
            Some(p) => pid = p.ppid,
            None => break,
        }
    }
    out
}

/// Every process of `uid` that could be read.
fn processes_of(uid: u32) -> Vec<Proc> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.metadata().is_ok_and(|m| m.uid() == uid))
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(read_proc)
        .collect()
}

/// `/proc/<pid>/stat` and `cmdline`; `None` if the process is gone.
fn read_proc(pid: u32) -> Option<Proc> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid pgrp session …": comm may hold anything, so split after its last ')'.
    let mut rest = stat.rsplit_once(')')?.1.split_whitespace().skip(1);
    let mut field = || rest.next()?.parse::<u32>().ok();
    let (ppid, pgrp, session) = (field()?, field()?, field()?);
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&raw)
        .split('\0')
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    Some(Proc {
        pid,
        ppid,
        pgrp,
        session,
        cmdline,
    })
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    fn proc(pid: u32, ppid: u32, pgrp: u32, session: u32, cmdline: &str) -> Proc {
        Proc {
            pid,
            ppid,
            pgrp,
            session,
            cmdline: cmdline.into(),
        }
    }

    #[test]
    fn the_token_is_a_whole_word() {
        assert!(carries("sh -c /w/greedyd --launch j1.3", "j1.3"));
        assert!(carries(
            "sh -c sleep 9; /w/greedyd --launch j1.3 --x",
            "j1.3"
        ));
        assert!(!carries("/w/greedyd --launch j1.33", "j1.3"));
        assert!(!carries("/w/greedyd --reap j1.3", "j1.3"));
        assert!(!carries("/w/greedyd --launch j1.3-b", "j1.3"));
    }

    #[test]
    fn victims_are_marked_processes_their_descendants_and_their_sessions() {
        let procs = [
            proc(10, 1, 10, 10, "sh -c sleep 9; greedyd --launch j.1"), // session leader
            proc(11, 10, 10, 10, "sleep 9"),
            proc(12, 1, 12, 10, "orphan in the session"),
            proc(13, 12, 12, 10, "its child"),
            proc(20, 1, 20, 20, "sh -c greedyd --launch j.2"), // another host's
            proc(21, 20, 20, 20, "sleep 9"),
            proc(30, 1, 30, 30, "bash"),
        ];
        assert_eq!(victims(&procs, "j.1"), [10, 11, 12, 13]);
        assert_eq!(victims(&procs, "j.2"), [20, 21]);
        assert!(victims(&procs, "j.3").is_empty());
    }

    #[test]
    fn reaps_a_marked_shell_and_its_children_and_spares_the_rest() {
        let token = token(&format!("reaptest{}", std::process::id()), 6);
        let spawn = |t: &str| {
            Command::new("sh")
                .args(["-c", &format!("sleep 300; exit 0 # {LAUNCH_FLAG} {t}")])
                .spawn()
                .unwrap()
        };
        let mut marked = spawn(&token);
        let mut other = spawn(&format!("{token}9"));
        // Let sh fork its sleep.
        std::thread::sleep(std::time::Duration::from_millis(200));
        let killed = reap(&token).unwrap();
        assert!(killed >= 2, "killed {killed}: the shell and its sleep");
        let status = marked.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        assert!(
            other.try_wait().unwrap().is_none(),
            "another token's shell was reaped"
        );
        assert_eq!(reap(&token).unwrap(), 0, "nothing left to reap");
        assert!(reap(&format!("{token}9")).unwrap() >= 2);
        let _ = other.wait();
    }
}
