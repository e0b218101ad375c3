//! The remote shell: which command starts an agent on a host, with defaults that keep each hop cheap.
//!
//! `--rsh CMD` is split on whitespace (no shell quoting); the host and the agent command are
//! appended. When the command is `ssh`, options that make a hop cheap and bounded are added
//! *after* the user's words, so the user's own `-o` settings win (ssh keeps the first value
//! it reads):
//!
//! * `KexAlgorithms=^curve25519-sha256`: Debian's default post-quantum KEX costs ≈ 0.1 CPU-s per
//!   handshake on this machine, curve25519 ≈ 0.03 (research/baseline-launchers.md §1.1). `^`
//!   moves it to the front of the default list instead of replacing the list, so a server
//!   without it still negotiates something.
//! * `BatchMode=yes`: never prompt (a prompt would hang the launch).
//! * `ConnectTimeout`: a host that drops packets fails within `--timeout`.
//! * `ServerAliveInterval`/`CountMax`: a host that hangs mid-job ends the edge in ≈ 30 s.
//! * `-T -x`: no tty, no X11 forwarding.
//!
//! When the command is `srun` (inside a Slurm allocation where ssh is not allowed), it is no
//! per-host remote shell: one step starts every agent, which connects back
//! ([`crate::connect`]).
//!
//! The agent command is single-quoted for the remote shell, because ssh and rsh hand the
//! remote side one string that a shell splits again.

use std::time::Duration;

/// The words of the remote shell command, without host and agent.
pub fn remote_shell(rsh: &str, connect_timeout: Duration) -> Vec<String> {
    let mut words: Vec<String> = rsh.split_whitespace().map(str::to_owned).collect();
    if words.is_empty() {
        words.push("ssh".into());
    }
    if is_ssh(&words) {
        let secs = connect_timeout.as_secs().max(1);
        for opt in [
            "-T".to_string(),
            "-x".to_string(),
            "-oBatchMode=yes".to_string(),
            "-oKexAlgorithms=^curve25519-sha256".to_string(),
            format!("-oConnectTimeout={secs}"),
            "-oServerAliveInterval=10".to_string(),
            "-oServerAliveCountMax=3".to_string(),
            "-oLogLevel=ERROR".to_string(),
        ] {
            words.push(opt);
        }
    }
    words
}

/// The full argv that starts `agent` on `host`.
///
/// The host has passed [`greedy_tree::hostname::check`] (it cannot begin with `-`); ssh also
/// gets `--` before it, so that no host could ever be read as an option.
pub fn command_line(rsh: &[String], host: &str, agent: &[String]) -> Vec<String> {
    let mut argv = rsh.to_vec();
    let command = agent
        .iter()
        .map(|w| shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ");
    if is_ssh(rsh) {
        argv.push("--".into());
    }
    argv.push(host.to_owned());
    argv.push(command);
    argv
}

/// Whether the remote shell command is `name` (by its program's file name).
fn is(words: &[String], name: &str) -> bool {
    words
        .first()
        .is_some_and(|w| w.rsplit('/').next() == Some(name))
}

/// Whether the remote shell command is ssh.
fn is_ssh(words: &[String]) -> bool {
    is(words, "ssh")
}

/// Whether the remote shell command is Slurm's srun (one step starts every agent:
/// [`crate::connect`]).
pub fn is_srun(words: &[String]) -> bool {
    is(words, "srun")
}

/// Quotes a word for a POSIX shell; plain words stay as they are.
pub fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-=:,+@%".contains(&b));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Whether a remote shell that failed before its agent said hello is worth another try: sshd
/// past `MaxStartups` resets or closes fresh connections (anchors §3.12).
pub fn is_retryable(stderr_tail: &str) -> bool {
    [
        "kex_exchange_identification",
        "Connection reset by peer",
        "Connection closed by remote host",
        "ssh_exchange_identification",
    ]
    .iter()
    .any(|p| stderr_tail.contains(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_gets_cheap_hop_options_after_the_users() {
        let w = remote_shell(
            "ssh -oKexAlgorithms=sntrup761x25519-sha512",
            Duration::from_secs(30),
        );
        assert_eq!(w[0], "ssh");
        assert_eq!(w[1], "-oKexAlgorithms=sntrup761x25519-sha512");
        assert!(w.contains(&"-oKexAlgorithms=^curve25519-sha256".to_string()));
        assert!(w.contains(&"-oConnectTimeout=30".to_string()));
        assert_eq!(remote_shell("", Duration::from_secs(1))[0], "ssh");
        assert_eq!(
            remote_shell("/usr/bin/ssh", Duration::ZERO)[5],
            "-oConnectTimeout=1"
        );
    }

    #[test]
    fn rsh_is_left_alone() {
        assert_eq!(remote_shell("rsh", Duration::from_secs(5)), vec!["rsh"]);
        assert_eq!(
            command_line(&["rsh".into()], "n3", &["/w/greedyd".into(), "a b".into()]),
            vec!["rsh", "n3", "/w/greedyd 'a b'"]
        );
    }

    #[test]
    fn ssh_ends_its_options_before_the_host() {
        let ssh = remote_shell("ssh", Duration::from_secs(5));
        let argv = command_line(&ssh, "n3", &["/w/greedyd".into()]);
        assert_eq!(argv[argv.len() - 3..], ["--", "n3", "/w/greedyd"]);
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("/a/b-c_d.e"), "/a/b-c_d.e");
    }

    #[test]
    fn retryable() {
        assert!(is_retryable(
            "kex_exchange_identification: read: Connection reset by peer"
        ));
        assert!(!is_retryable(
            "ssh: connect to host n3 port 22: Connection refused"
        ));
    }
}
