//! A session's control connection: the request line a client opens it with, the frames a
//! task stream's client gets back, and the time either side waits for the other.

use std::time::Duration;

use tokio::io::BufReader;

use crate::task_spec::Defaults;

/// How long either side of a control connection waits for the other's next step of the
/// handshake (hosts, the job, its start).
pub(crate) const HANDSHAKE: Duration = Duration::from_secs(10);
/// How long one frame may take to reach a client before it counts as gone: a client stopped
/// with Ctrl-Z, or piped into a reader that does not read, once its socket buffer is full.
pub(crate) const CLIENT_STALL: Duration = Duration::from_secs(10);

/// Frames from a session to a client: kind, 4-byte big-endian length, payload.
pub(crate) mod frame {
    /// Nothing: sent while a stream runs, so a client that went away is noticed.
    pub(crate) const KEEPALIVE: u8 = 0;
    /// Bytes for the client's stdout.
    pub(crate) const STDOUT: u8 = 1;
    /// Bytes for the client's stderr.
    pub(crate) const STDERR: u8 = 2;
    /// A result line for the client's `--results`.
    pub(crate) const RESULT: u8 = 3;
    /// A diagnostic line (the client prints `greedyrun: ` before it).
    pub(crate) const SAY: u8 = 4;
    /// The stream's exit code, 4 bytes big-endian: the last frame.
    pub(crate) const EXIT: u8 = 5;
    /// Largest payload a client accepts.
    pub(crate) const MAX: u32 = 1 << 24;
}

/// The first line a client sends: what it wants.
pub(crate) const HELLO: &str = "greedy-session 1";

/// A client's connection read by lines.
pub(crate) type LineSource =
    tokio::io::Lines<BufReader<Box<dyn tokio::io::AsyncRead + Unpin + Send>>>;

/// What a client asked for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Request {
    /// Run the stream that follows, with these retries, tagging, a progress line every
    /// `progress_ms` (0: none), and these ranks and cores for its plain lines.
    Tasks {
        retries: u32,
        tag: bool,
        progress_ms: u64,
        defaults: Defaults,
    },
    /// Say how the session is.
    Status,
    /// Run a job on the session's agents ([`crate::session`]); with a claim, in the slots a
    /// stream's task took for it ([`super::JobBoard::claim`]).
    Job { claim: Option<u64> },
    /// End the session.
    End,
}

/// Where a run's private socket directories go: `$XDG_RUNTIME_DIR` if it is a directory, else
/// the temporary directory.
pub fn socket_parent() -> std::path::PathBuf {
    std::env::var_os("XDG_RUNTIME_DIR")
        .map(std::path::PathBuf::from)
        .filter(|d| d.is_dir())
        .unwrap_or_else(std::env::temp_dir)
}

/// How long a session's client may take to send its request line.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Reads a client's first line within [`REQUEST_TIMEOUT`] ([`parse_request`]).
pub(crate) async fn read_request(lines: &mut LineSource) -> Option<Request> {
    let line = tokio::time::timeout(REQUEST_TIMEOUT, lines.next_line())
        .await
        .ok()?
        .ok()??;
    parse_request(&line)
}

/// A client's first line: `greedy-session 1 tasks retries=K tag=0|1 progress_ms=MS ranks=R
/// cores=C`,
/// `… status`, `… job [claim=N]`, `… end`; `None` for anything else.
pub(crate) fn parse_request(line: &str) -> Option<Request> {
    let rest = line.strip_prefix(HELLO)?.trim();
    let mut words = rest.split_whitespace();
    match words.next()? {
        "status" => Some(Request::Status),
        "end" => Some(Request::End),
        "job" => match words.next().map(|w| w.split_once('=')) {
            None => Some(Request::Job { claim: None }),
            Some(Some(("claim", c))) => Some(Request::Job {
                claim: Some(c.parse().ok()?),
            }),
            Some(_) => None,
        },
        "tasks" => {
            let (mut retries, mut tag, mut progress_ms) = (0, false, 0);
            let mut defaults = Defaults::default();
            for w in words {
                match w.split_once('=')? {
                    ("retries", k) => retries = k.parse().ok()?,
                    ("tag", t) => tag = t == "1",
                    ("progress_ms", p) => progress_ms = p.parse().ok()?,
                    ("ranks", r) => defaults.ranks = r.parse().ok().filter(|&r| r > 0)?,
                    ("cores", c) => defaults.cores_per_rank = c.parse().ok().filter(|&c| c > 0)?,
                    _ => return None,
                }
            }
            Some(Request::Tasks {
                retries,
                tag,
                progress_ms,
                defaults,
            })
        }
        _ => None,
    }
}

/// The request line of a job for a session (`claim`: a stream's task's slots it runs in).
pub fn job_request(claim: Option<u64>) -> String {
    match claim {
        None => format!("{HELLO} job\n"),
        Some(c) => format!("{HELLO} job claim={c}\n"),
    }
}

/// The request line of a stream for a session (`progress`: the period of its progress line).
pub fn stream_request(retries: u32, defaults: Defaults, tag: bool, progress: Duration) -> String {
    format!(
        "tasks retries={retries} tag={} progress_ms={} ranks={} cores={}",
        u8::from(tag),
        progress.as_millis(),
        defaults.ranks,
        defaults.cores_per_rank
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_requests_parse_or_are_refused() {
        let tasks = |r, t, p| {
            Some(Request::Tasks {
                retries: r,
                tag: t,
                progress_ms: p,
                defaults: Defaults::default(),
            })
        };
        let wide = Defaults {
            ranks: 2,
            cores_per_rank: 4,
        };
        assert_eq!(
            parse_request("greedy-session 1 status"),
            Some(Request::Status)
        );
        assert_eq!(parse_request("greedy-session 1 end"), Some(Request::End));
        assert_eq!(
            parse_request(job_request(None).trim_end()),
            Some(Request::Job { claim: None })
        );
        assert_eq!(
            parse_request(job_request(Some(7)).trim_end()),
            Some(Request::Job { claim: Some(7) })
        );
        assert_eq!(parse_request("greedy-session 1 job claim=x"), None);
        assert_eq!(
            parse_request(&format!(
                "{HELLO} {}",
                stream_request(3, Defaults::default(), true, Duration::from_secs(2))
            )),
            tasks(3, true, 2000)
        );
        assert_eq!(
            parse_request(&format!(
                "{HELLO} {}",
                stream_request(0, wide, false, Duration::ZERO)
            )),
            Some(Request::Tasks {
                retries: 0,
                tag: false,
                progress_ms: 0,
                defaults: wide
            })
        );
        assert_eq!(parse_request("greedy-session 1 tasks"), tasks(0, false, 0));
        for bad in [
            "",
            "status",
            "greedy-session 2 status",
            "greedy-session 1 tasks retries=-1",
            "greedy-session 1 tasks nice=5",
            "greedy-session 1 tasks cores=0",
            "greedy-session 1 reboot",
        ] {
            assert_eq!(parse_request(bad), None, "{bad:?}");
        }
    }
}
