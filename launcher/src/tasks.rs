//! Task streams (`greedyrun --tasks FILE|-`): one task per line (a command, or a JSON
//! description: [`crate::task_spec`]), run in the hosts' slots across the launch tree, each
//! reported exactly once.
//!
//! The agents start no ranks (`Start::tasks`); greedyrun reads a line only when a slot is
//! free (beside the host an earlier task waits for), places it on a host with its slots free,
//! sends it there (`Cmd::Task`, routed down the tree), and the host's agent runs it (a command as
//! `sh -c LINE`, or for a line of plain words those words directly: [`crate::task_spec::argv_of`]) in the job's
//! environment and working directory with the task's own over them, and reports its output
//! and its end (`Up::TaskOutput`, `Up::TaskEnd`). A task that fails is run again, up to
//! `--task-retries` more times; the tasks of a host that is lost run again elsewhere. Each
//! task's final end is one JSON line in `--results FILE`. Memory is bounded by the number of
//! slots and streams, whatever the length of the streams. A session runs every stream its
//! clients submit at once: each stream's reader waits its turn for a free slot, so streams
//! share the slots line by line.
//!
//! A stream is cancelled by Ctrl-C, `--end-session`, its client going away (or not reading:
//! each client is written by a task of its own, within a bounded backlog) and a closed stdout
//! (exit 141): nothing of it runs again, and its unfinished tasks are named once, as
//! cancelled. A line that is not UTF-8 fails alone, named with its number.
//!
//! [`Dispatcher`] is the bookkeeping without I/O. [`run`] runs greedyrun's own stream in its
//! loop here, or for `--start-session` hands the streams to the session daemon's loop (in
//! [`crate::session`]); both drive the same per-event state. [`submit`] is a session's client.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::head::{JobConfig, Report, launch, start_frame};
use crate::limits::UP_CAPACITY;
use crate::proto::Up;
use crate::resume::Resume;
use crate::session::control::{HELLO, frame};
pub(crate) use crate::session::control::{Request, parse_request};
pub use crate::session::control::{job_request, stream_request};
pub use crate::session::dispatch::{Dispatcher, Done, Ended, Task};
use crate::session::job_tasks::JobTasks;
use crate::session::streams::{Current, Read, Streams};
use crate::session::{JobBoard, daemon};
use crate::status::code;
use crate::task_spec::Defaults;
use crate::terminal::escape;

/// Where a stream comes from: a file, stdin, or the clients of a session.
#[derive(Debug, Clone)]
pub enum Source {
    /// Lines of this file.
    File(PathBuf),
    /// Lines of greedyrun's stdin.
    Stdin,
    /// A session (`--start-session`): streams submitted through this control socket, run as
    /// they come, until `--end-session` or `idle` without a client.
    Session {
        /// The control socket (in a 0700 directory of its own).
        socket: PathBuf,
        /// How long the session waits for a client before it ends.
        idle: Duration,
    },
}

/// The fewest hosts a stream or session goes on with (`--min-hosts N` or `P%`): while fewer
/// are up or still starting, it ends, naming what did not run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MinHosts {
    /// This many hosts.
    Count(u32),
    /// This share of the hosts asked for, in percent (rounded up to whole hosts).
    Percent(f64),
}

impl Default for MinHosts {
    fn default() -> MinHosts {
        MinHosts::Count(1)
    }
}

impl std::str::FromStr for MinHosts {
    type Err = String;

    fn from_str(text: &str) -> Result<MinHosts, String> {
        let bad = || {
            format!("{text:?}: expected a number of hosts (N >= 1) or a share (P%, 0 < P <= 100)")
        };
        match text.strip_suffix('%') {
            Some(p) => match p.parse::<f64>() {
                Ok(p) if p > 0.0 && p <= 100.0 => Ok(MinHosts::Percent(p)),
                _ => Err(bad()),
            },
            None => match text.parse::<u32>() {
                Ok(n) if n >= 1 => Ok(MinHosts::Count(n)),
                _ => Err(bad()),
            },
        }
    }
}

impl MinHosts {
    /// The number of hosts, of `hosts` asked for (at least 1).
    pub fn of(self, hosts: usize) -> usize {
        let n = match self {
            MinHosts::Count(n) => n as usize,
            MinHosts::Percent(p) => (hosts as f64 * p / 100.0).ceil() as usize,
        };
        n.max(1)
    }
}

/// Where a stream's results go.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum ResultsFile {
    /// Nowhere.
    #[default]
    None,
    /// `--results FILE`: created afresh.
    New(PathBuf),
    /// `--resume FILE`: the results of an earlier run of the stream, kept to its done tasks
    /// (which do not run again) and added to ([`Resume`]).
    Resume(PathBuf),
}

/// Where the lines come from and where the results go.
#[derive(Debug, Clone)]
pub struct TaskOptions {
    /// The stream.
    pub source: Source,
    /// JSON lines of the tasks' ends.
    pub results: ResultsFile,
    /// Runs again of a failed task.
    pub retries: u32,
    /// What a plain line's task gets.
    pub defaults: Defaults,
    /// The fewest hosts the run goes on with.
    pub min_hosts: MinHosts,
}

/// Where the run's streams come from, once open.
enum Input<'a> {
    /// greedyrun's own stream, and the private socket its tasks of several ranks or of MPI
    /// attach their jobs on (none if it could not be made: such tasks are refused).
    Own(Box<Current>, Option<Private>),
    /// A session's clients, on this socket.
    Session(tokio::net::UnixListener, &'a std::path::Path),
}

/// A socket of greedyrun's own run in a fresh 0700 directory, removed with it.
struct Private {
    listener: tokio::net::UnixListener,
    dir: std::path::PathBuf,
    socket: std::path::PathBuf,
}

impl Private {
    /// A new one, or `None` (said with `verbose`).
    fn new(verbose: bool) -> Option<Private> {
        let made =
            greedy_pmix::pmix::private_dir(&crate::session::socket_parent(), "greedy-tasks.")
                .and_then(|dir| {
                    let socket = dir.join("control");
                    let listener = tokio::net::UnixListener::bind(&socket)?;
                    Ok(Private {
                        listener,
                        dir,
                        socket,
                    })
                });
        match made {
            Ok(p) => Some(p),
            Err(e) => {
                if verbose {
                    eprintln!("greedyrun: no socket for the stream's MPI tasks: {e}");
                }
                None
            }
        }
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs a task stream on the plan's hosts to its end (or, for a session, the streams its
/// clients submit, all at once, until one ends the session or none comes for `idle`); prints
/// the tasks' output and the one-line diagnostics. Exit code 0 if every task ended 0, 1 if
/// some failed, the launcher's codes if no host was left to run the rest or the stream could
/// not be read.
pub async fn run(cfg: JobConfig, opts: TaskOptions) -> Report {
    let plan = &cfg.plan;
    let n = plan.hosts.len();
    let t0 = Instant::now();
    // Every stream's lines come through one queue, a line per free slot.
    let (line_tx, line_rx) = mpsc::channel::<Read>(1);
    let slots: Vec<u32> = plan.ranks.iter().map(|r| r.len() as u32).collect();
    // A session's jobs (crate::session) on the same hosts and slots.
    let board = JobBoard::new(plan.hosts.clone(), slots);
    let (input, failed_before) = match open(&cfg, &opts, line_tx.clone()).await {
        Ok(opened) => opened,
        Err(code) => return Report::unlaunched(code, n),
    };
    let idle = match &opts.source {
        Source::Session { idle, .. } => Some(*idle),
        _ => None,
    };
    let (up_tx, up_rx) = mpsc::channel::<Up>(UP_CAPACITY);
    let socket = match &input {
        Input::Session(_, socket) => Some(socket.to_path_buf()),
        Input::Own(_, private) => private.as_ref().map(|p| p.socket.clone()),
    };
    let job_tasks = socket.map(|s| JobTasks::new(s, board.clone(), &up_tx));
    let fanout = Arc::new(launch(&cfg, &start_frame(&cfg, true), up_tx));
    let mut streams = Streams::new(plan, cfg.verbose, idle, t0, board, fanout, line_tx);
    if let Some(jobs) = job_tasks {
        streams.run_job_tasks(jobs);
    }
    streams.keep_at_least(opts.min_hosts.of(n));
    let (exit_code, hello_at) = match input {
        Input::Own(stream, None) => {
            streams.adopt(*stream, opts.retries);
            run_own(streams, line_rx, up_rx).await
        }
        // Its job tasks' clients attach on its own socket, as on a session's.
        Input::Own(stream, Some(private)) => {
            streams.adopt(*stream, opts.retries);
            let Private {
                ref listener,
                ref socket,
                ..
            } = private;
            daemon::run(streams, listener, socket, line_rx, up_rx).await
        }
        Input::Session(listener, socket) => {
            daemon::run(streams, &listener, socket, line_rx, up_rx).await
        }
    };
    Report {
        exit_code: with_failed_before(exit_code, failed_before),
        hello_at,
        finished_at: Some(t0.elapsed()),
    }
}

/// The lines of a stream.
pub type Lines = Box<dyn tokio::io::AsyncRead + Unpin + Send>;

/// The results file and the lines to run: `--results FILE` created; or, resuming, the
/// earlier run's file kept to its done tasks and appended to, their lines blanked
/// ([`Resume`]), with how many of them failed.
fn results_and_lines(
    results: &ResultsFile,
    lines: Lines,
) -> Result<(Option<std::io::BufWriter<std::fs::File>>, Lines, usize), String> {
    let path = match results {
        ResultsFile::None => return Ok((None, lines, 0)),
        ResultsFile::New(path) => {
            let file = std::fs::File::create(path)
                .map_err(|e| format!("--results {}: {e}", path.display()))?;
            return Ok((Some(std::io::BufWriter::new(file)), lines, 0));
        }
        ResultsFile::Resume(path) => path,
    };
    let resumed = Resume::load(path).map_err(|e| e.to_string())?;
    say(format!(
        "--resume {}: {} tasks done before ({} failed) do not run again",
        path.display(),
        resumed.done(),
        resumed.failed()
    ));
    let failed = resumed.failed();
    let (file, lines) = resumed.into_parts(lines);
    Ok((Some(std::io::BufWriter::new(file)), lines, failed))
}

/// A run's exit code once the run before it failed `failed_before` tasks: a clean end says
/// some task failed.
fn with_failed_before(exit_code: i32, failed_before: usize) -> i32 {
    match (exit_code, failed_before) {
        (0, 1..) => 1,
        _ => exit_code,
    }
}

/// Opens the stream's file (or stdin) and `--results`, or binds the session's socket; the
/// exit code if that fails.
async fn open<'a>(
    cfg: &JobConfig,
    opts: &'a TaskOptions,
    to: mpsc::Sender<Read>,
) -> Result<(Input<'a>, usize), i32> {
    let log = |line: String| eprintln!("greedyrun: {line}");
    if let Source::Session { socket, .. } = &opts.source {
        return match tokio::net::UnixListener::bind(socket) {
            Ok(l) => Ok((Input::Session(l, socket), 0)),
            Err(e) => {
                log(format!("session socket {}: {e}", socket.display()));
                Err(code::LAUNCHER)
            }
        };
    }
    let input: Lines = match &opts.source {
        Source::File(p) => match tokio::fs::File::open(p).await {
            Ok(f) => Box::new(f),
            Err(e) => {
                log(format!("--tasks {}: {e}", p.display()));
                return Err(code::USAGE);
            }
        },
        _ => Box::new(tokio::io::stdin()),
    };
    let (results, input, failed_before) = results_and_lines(&opts.results, input).map_err(|e| {
        log(e);
        code::USAGE
    })?;
    let own = Current::local(
        input,
        results,
        to,
        opts.defaults,
        cfg.tag_output,
        cfg.progress,
    );
    Ok((
        Input::Own(Box::new(own), Private::new(cfg.verbose)),
        failed_before,
    ))
}

/// greedyrun's loop over its own stream, until the stream and the run end.
async fn run_own(
    mut streams: Streams<'_>,
    mut lines: mpsc::Receiver<Read>,
    mut ups: mpsc::Receiver<Up>,
) -> (i32, Vec<Option<Duration>>) {
    let mut stops = crate::signals::Stops::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        let want_line = streams.step().await;
        tokio::select! {
            Some((stream, line)) = lines.recv(), if want_line => streams.on_line(stream, line).await,
            m = ups.recv() => match m {
                None => break,
                Some(up) => streams.on_up(up).await,
            },
            sig = stops.recv() => if streams.on_signal(sig).await {
                break;
            },
            _ = tick.tick() => streams.on_tick().await,
        }
    }
    streams.finish().await
}

/// What a client of a session does: send `request` (and, for a stream, its lines), print
/// what comes back, write results to `results`; returns the exit code the session sent.
pub async fn submit(
    socket: &std::path::Path,
    request: &str,
    lines: Option<Lines>,
    results: ResultsFile,
) -> i32 {
    let conn = match crate::session::connect_own(socket).await {
        Ok(c) => c,
        Err(e) => {
            say(e.to_string());
            return code::LAUNCHER;
        }
    };
    let (results, lines, failed_before) = match lines {
        Some(lines) => match results_and_lines(&results, lines) {
            Ok((results, lines, failed)) => (results, Some(lines), failed),
            Err(e) => {
                say(e);
                return code::USAGE;
            }
        },
        None => (None, None, 0),
    };
    let (mut rd, mut wr) = conn.into_split();
    let header = format!("{HELLO} {request}\n");
    let sender = tokio::spawn(async move {
        wr.write_all(header.as_bytes()).await?;
        if let Some(mut lines) = lines {
            tokio::io::copy(&mut lines, &mut wr).await?;
        }
        wr.shutdown().await
    });
    let mut received = Received {
        stdout: tokio::io::stdout(),
        stderr: tokio::io::stderr(),
        results,
    };
    // Ctrl-C (or TERM, HUP) ends this client with the signal's code whatever the disposition
    // it inherited (a script's `&` ignores SIGINT): the session sees it go and cancels the
    // stream's tasks; every result received so far is already in `results`.
    let mut stops = crate::signals::Stops::new();
    let exit = loop {
        let frame = tokio::select! {
            frame = read_frame(&mut rd) => frame,
            sig = stops.recv() => {
                say("interrupted: the session ends this stream's running tasks".into());
                break 128 + crate::signals::number(sig);
            }
        };
        let (kind, payload) = match frame {
            Ok(frame) => frame,
            Err(code) => break code,
        };
        if let Some(exit) = received.on_frame(kind, payload).await {
            break exit;
        }
    };
    sender.abort();
    received.finish().await;
    with_failed_before(exit, failed_before)
}

/// Prints one of greedyrun's own diagnostic lines.
fn say(line: String) {
    eprintln!("greedyrun: {line}");
}

/// The next frame from a session: its kind and payload; or, said, the exit code of a session
/// that went away or is none.
async fn read_frame(rd: &mut tokio::net::unix::OwnedReadHalf) -> Result<(u8, Vec<u8>), i32> {
    use tokio::io::AsyncReadExt;
    let mut head = [0u8; 5];
    if rd.read_exact(&mut head).await.is_err() {
        say("the session went away before the stream ended".into());
        return Err(code::LAUNCHER);
    }
    let len = u32::from_be_bytes(head[1..].try_into().expect("4 bytes"));
    if len > frame::MAX {
        say(format!(
            "the session sent a frame of {len} bytes: not a greedy session"
        ));
        return Err(code::LAUNCHER);
    }
    let mut payload = vec![0u8; len as usize];
    if rd.read_exact(&mut payload).await.is_err() {
        say("the session went away before the stream ended".into());
        return Err(code::LAUNCHER);
    }
    Ok((head[0], payload))
}

/// Where a session's client puts what the session sends.
struct Received {
    stdout: tokio::io::Stdout,
    stderr: tokio::io::Stderr,
    results: Option<std::io::BufWriter<std::fs::File>>,
}

impl Received {
    /// A frame of kind `kind`; the exit code once the stream ended.
    async fn on_frame(&mut self, kind: u8, payload: Vec<u8>) -> Option<i32> {
        match kind {
            // A closed stdout (`| head -1`) ends the stream as SIGPIPE ends a job: the session
            // sees this client go and cancels it.
            frame::STDOUT => {
                if let Err(e) = self.stdout.write_all(&payload).await
                    && e.kind() == std::io::ErrorKind::BrokenPipe
                {
                    return Some(code::BROKEN_PIPE);
                }
            }
            frame::STDERR => {
                let _ = self.stderr.write_all(&payload).await;
            }
            // Each line reaches the file at once: Ctrl-C (whose default action ends this
            // client) must not lose the results of tasks that finished.
            frame::RESULT => {
                if let Some(w) = self.results.as_mut() {
                    let _ = w.write_all(&payload).and_then(|()| w.flush());
                }
            }
            frame::KEEPALIVE => {}
            frame::SAY => say(escape(&String::from_utf8_lossy(&payload)).into_owned()),
            frame::EXIT if payload.len() == 4 => {
                return Some(i32::from_be_bytes(payload[..].try_into().expect("4 bytes")));
            }
            k => {
                say(format!(
                    "the session sent a frame of kind {k}: not a greedy session"
                ));
                return Some(code::LAUNCHER);
            }
        }
        None
    }

    /// The stream ended: what is buffered is written.
    async fn finish(mut self) {
        let _ = self.stdout.flush().await;
        if let Some(mut w) = self.results
            && let Err(e) = w.flush()
        {
            say(format!("--results: {e}"));
        }
    }
}

/// A session's hosts up and lost, from its status; `None` if it does not answer (yet).
pub async fn session_hosts(socket: &std::path::Path) -> Option<(usize, usize)> {
    use tokio::io::AsyncReadExt;
    let conn = crate::session::connect_own(socket).await.ok()?;
    let (mut rd, mut wr) = conn.into_split();
    wr.write_all(format!("{HELLO} status\n").as_bytes())
        .await
        .ok()?;
    let ask = async {
        loop {
            let mut head = [0u8; 5];
            rd.read_exact(&mut head).await.ok()?;
            let len = u32::from_be_bytes(head[1..].try_into().expect("4 bytes"));
            if len > frame::MAX {
                return None;
            }
            let mut payload = vec![0u8; len as usize];
            rd.read_exact(&mut payload).await.ok()?;
            if head[0] == frame::RESULT {
                let v: serde_json::Value = serde_json::from_slice(&payload).ok()?;
                return Some((v["up"].as_u64()? as usize, v["lost"].as_u64()? as usize));
            }
            if head[0] == frame::EXIT {
                return None;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), ask)
        .await
        .ok()?
}

#[cfg(test)]
mod tests {
    use super::MinHosts;

    #[test]
    fn min_hosts_is_a_count_or_a_share_rounded_up() {
        let of = |text: &str, hosts| text.parse::<MinHosts>().unwrap().of(hosts);
        assert_eq!(of("3", 10), 3);
        assert_eq!(of("90%", 10), 9);
        assert_eq!(of("80%", 6), 5);
        assert_eq!(of("0.1%", 6), 1);
        assert_eq!(of("100%", 256), 256);
        assert_eq!(MinHosts::default().of(256), 1);
        for bad in ["0", "-1", "0%", "101%", "x", "%", "1.5", ""] {
            let e = bad.parse::<MinHosts>().unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }
}
