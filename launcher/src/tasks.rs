//! Task streams (`greedyrun --tasks FILE|-`): one shell command per line, run in the hosts'
//! slots across the launch tree, each reported exactly once.
//!
//! The agents start no ranks (`Start::tasks`); greedyrun reads a line only when a slot is
//! free, sends it to that host (`Cmd::Task`, routed down the tree), and the host's agent runs
//! it as `sh -c LINE` (or, for a line of plain words, those words directly: [`argv_of`]) in
//! the job's environment and working directory and reports its output
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
//! [`Dispatcher`] is the bookkeeping without I/O; [`run`] is greedyrun's loop around it.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::ops::Range;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use crate::head::{JobConfig, Report, launch, start_frame};
use crate::limits::{SHUTDOWN_TIMEOUT, TEARDOWN_LINGER, UP_CAPACITY};
use crate::proto::{Cmd, RankEnd, Stream, TaskId, Up};
use crate::session::control::{CLIENT_STALL, HELLO, LineSource, frame, read_request};
pub(crate) use crate::session::control::{Request, parse_request};
pub use crate::session::control::{job_request, stream_request};
use crate::session::{self, JobBoard};
use crate::status::code;
use crate::stdio::Tagger;
use crate::terminal::escape;
use std::sync::Arc;

/// A line of a stream: its stream and line number, and its command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// Its stream and line (from 1: the task's name in results and messages).
    pub id: TaskId,
    /// The shell command line.
    pub command: String,
    /// Runs so far that ended in failure (a retry has `attempt` ≥ 1).
    pub failures: u32,
}

/// A task's final end, reported once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    /// The task.
    pub task: Task,
    /// Host index it last ran on.
    pub host: u32,
    /// How its last run ended.
    pub end: RankEnd,
    /// Its last run's wall time, in microseconds.
    pub wall_us: u64,
    /// How many of its runs ended (a run on a host that was lost did not).
    pub runs: u32,
    /// It failed because its stream was cancelled (never run again).
    pub cancelled: bool,
}

#[derive(Debug)]
struct InFlight {
    host: u32,
    task: Task,
    runs: u32,
}

/// Which host runs what: tasks in flight and tasks to run again, in slots taken from the
/// session's [`JobBoard`] (which jobs share).
pub struct Dispatcher {
    board: Arc<JobBoard>,
    in_flight: HashMap<TaskId, InFlight>,
    /// Tasks to run before the next line: retries and the tasks of lost hosts.
    again: VecDeque<(Task, u32)>,
    /// Each open stream's runs again of a failed task.
    retries: HashMap<u32, u32>,
    /// Streams cancelled (their client left, Ctrl-C, a closed stdout): nothing of them runs
    /// again, and what they were running ends as cancelled.
    cancelled: std::collections::HashSet<u32>,
}

/// What [`Dispatcher::ended`] made of a task's end.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// Its final end.
    Done(Done),
    /// It failed and runs again.
    Retry,
    /// Not the run in flight (a lost host's late report after the task moved on): ignored.
    Stale,
}

impl Dispatcher {
    /// Tasks in `board`'s slots.
    pub fn new(board: Arc<JobBoard>) -> Dispatcher {
        Dispatcher {
            board,
            in_flight: HashMap::new(),
            again: VecDeque::new(),
            retries: HashMap::new(),
            cancelled: Default::default(),
        }
    }

    /// Stream `stream` begins: a failed task of it runs at most `retries` more times.
    pub fn open_stream(&mut self, stream: u32, retries: u32) {
        self.retries.insert(stream, retries);
    }

    /// Stream `stream` has ended (nothing of it runs or waits).
    pub fn close_stream(&mut self, stream: u32) {
        self.retries.remove(&stream);
        self.cancelled.remove(&stream);
    }

    /// Stream `stream` is cancelled: what was to run again is dropped and returned; what runs
    /// ends without a retry, as cancelled.
    pub fn cancel(&mut self, stream: u32) -> Vec<Task> {
        self.cancelled.insert(stream);
        let (dropped, kept) = std::mem::take(&mut self.again)
            .into_iter()
            .partition(|(t, _)| t.id.stream == stream);
        self.again = kept;
        dropped.into_iter().map(|(t, _)| t).collect()
    }

    /// Whether a slot is free for a task.
    pub fn has_free_slot(&self) -> bool {
        self.board.has_free_task_slot()
    }

    /// The next task that must run before a new line: a retry or a lost host's task.
    pub fn take_again(&mut self) -> Option<(Task, u32)> {
        self.again.pop_front()
    }

    /// Puts `task` (run `runs` times before) in a free slot: the host to send it to.
    /// Call only when [`Dispatcher::has_free_slot`].
    pub fn assign(&mut self, task: Task, runs: u32) -> u32 {
        let host = self.board.take_task_slot().expect("a free slot");
        self.in_flight
            .insert(task.id, InFlight { host, task, runs });
        host
    }

    /// Task `id` ended on `host`.
    pub fn ended(&mut self, host: u32, id: TaskId, end: RankEnd, wall_us: u64) -> Ended {
        match self.in_flight.get(&id) {
            Some(f) if f.host == host => {}
            _ => return Ended::Stale,
        }
        let InFlight {
            host,
            mut task,
            runs,
        } = self.in_flight.remove(&id).expect("checked");
        self.board.task_ended(host);
        let runs = runs + 1;
        let retries = self.retries.get(&id.stream).copied().unwrap_or(0);
        let cancelled = end.failed() && self.cancelled.contains(&id.stream);
        if end.failed() && !cancelled && task.failures < retries {
            task.failures += 1;
            self.again.push_back((task, runs));
            return Ended::Retry;
        }
        Ended::Done(Done {
            task,
            host,
            end,
            wall_us,
            runs,
            cancelled,
        })
    }

    /// Hosts `hosts` are lost (a launch subtree; the board was told): what ran there runs
    /// again elsewhere, first; returns how many tasks that is.
    pub fn hosts_lost(&mut self, hosts: Range<u32>) -> usize {
        let moved: Vec<TaskId> = self
            .in_flight
            .iter()
            .filter(|(_, f)| hosts.contains(&f.host))
            .map(|(&id, _)| id)
            .collect();
        for id in &moved {
            let f = self.in_flight.remove(id).expect("listed");
            self.board.task_ended(f.host);
            self.again.push_front((f.task, f.runs));
        }
        moved.len()
    }

    /// Tasks running now.
    pub fn running(&self) -> usize {
        self.in_flight.len()
    }

    /// Tasks of `stream` running now.
    pub fn running_of(&self, stream: u32) -> usize {
        self.in_flight
            .keys()
            .filter(|id| id.stream == stream)
            .count()
    }

    /// Nothing of `stream` in flight and nothing to run again.
    pub fn idle(&self, stream: u32) -> bool {
        self.running_of(stream) == 0 && !self.again.iter().any(|(t, _)| t.id.stream == stream)
    }

    /// What can never run now (the host list is exhausted): in flight and to run again.
    pub fn drain(&mut self) -> Vec<Task> {
        let mut left: Vec<Task> = self.again.drain(..).map(|(t, _)| t).collect();
        left.extend(self.in_flight.drain().map(|(_, f)| f.task));
        left.sort_by_key(|t| t.id);
        left
    }
}

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

/// Where the lines come from and where the results go.
#[derive(Debug, Clone)]
pub struct TaskOptions {
    /// The stream.
    pub source: Source,
    /// JSON lines of the tasks' ends, or `None`.
    pub results: Option<PathBuf>,
    /// Runs again of a failed task.
    pub retries: u32,
}

/// One result line: the task's number, host, exit code (128 + signal for a signal, 127 if it
/// could not start), its last run's wall time, when it ended (seconds since the stream
/// started, so tasks/s over time can be drawn), its runs and its command.
fn result_line(done: &Done, host: &str, end_s: f64) -> String {
    let mut line = serde_json::json!({
        "task": done.task.id.line,
        "host": host,
        "exit": done.end.code(),
        "wall_s": done.wall_us as f64 / 1e6,
        "end_s": (end_s * 1e3).round() / 1e3,
        "runs": done.runs,
        "command": done.task.command,
    });
    if done.cancelled {
        line["cancelled"] = true.into();
    }
    let mut line = line.to_string();
    line.push('\n');
    line
}

/// A line read from stream `.0`: a line, the end, or the error that ended the reading.
/// A line that is not UTF-8 is `Err` of its bytes: it is named and the rest still runs.
type Read = (u32, std::io::Result<Option<Result<String, Vec<u8>>>>);

/// Reads stream `stream`'s lines into `to` one at a time, each sent when the loop takes it
/// (it takes one per free slot): the streams' readers queue for the slots in turn, and no
/// stream is read ahead by more than a line.
fn read_lines(
    stream: u32,
    lines: LineSource,
    to: mpsc::Sender<Read>,
) -> tokio_util::task::AbortOnDropHandle<()> {
    // Lines as bytes, as GNU parallel reads them: one undecodable line must not end the
    // stream (tokio's `Lines` fails at the first).
    let mut source = lines.into_inner();
    tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
        loop {
            let mut buf = Vec::new();
            let line = match source.read_until(b'\n', &mut buf).await {
                Ok(0) => Ok(None),
                Ok(_) => {
                    if buf.last() == Some(&b'\n') {
                        buf.pop();
                        if buf.last() == Some(&b'\r') {
                            buf.pop();
                        }
                    }
                    Ok(Some(String::from_utf8(buf).map_err(|e| e.into_bytes())))
                }
                Err(e) => Err(e),
            };
            let last = !matches!(line, Ok(Some(_)));
            if to.send((stream, line)).await.is_err() || last {
                return;
            }
        }
    }))
}

/// What a session keeps queued for one client that is slow to read: past it the client
/// counts as gone, as on EPIPE (its stream is cancelled). Memory of a session whose clients
/// stop reading stays bounded by this each; a client that reads at all keeps far below it.
const CLIENT_BACKLOG: usize = 16 << 20;

/// A session client's connection, written by a task of its own so that the session's loop
/// only queues: a client that does not read stalls no one ([`CLIENT_BACKLOG`],
/// [`CLIENT_STALL`]).
struct ClientOut {
    tx: mpsc::UnboundedSender<bytes::Bytes>,
    /// Bytes queued and not yet written.
    held: Arc<std::sync::atomic::AtomicUsize>,
}

impl ClientOut {
    /// Starts the writer of `out`; `writers` tracks it, so the session can wait for its
    /// last frames before it exits.
    fn new(
        mut out: tokio::net::unix::OwnedWriteHalf,
        writers: &tokio_util::task::TaskTracker,
    ) -> ClientOut {
        let (tx, mut rx) = mpsc::unbounded_channel::<bytes::Bytes>();
        let held = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let taken = held.clone();
        writers.spawn(async move {
            while let Some(frame) = rx.recv().await {
                match tokio::time::timeout(CLIENT_STALL, out.write_all(&frame)).await {
                    Ok(Ok(())) => {
                        taken.fetch_sub(frame.len(), std::sync::atomic::Ordering::Relaxed)
                    }
                    _ => return,
                };
            }
            let _ = tokio::time::timeout(CLIENT_STALL, out.shutdown()).await;
        });
        ClientOut { tx, held }
    }

    /// Queues `frame`; false when the client is gone (its writer ended) or too far behind.
    fn queue(&self, frame: bytes::Bytes) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let len = frame.len();
        if self.held.fetch_add(len, Relaxed) + len > CLIENT_BACKLOG {
            self.held.fetch_sub(len, Relaxed);
            return false;
        }
        self.tx.send(frame).is_ok()
    }
}

/// Where a stream's output, results and diagnostics go.
enum Feed {
    /// greedyrun's own stream: stdout, stderr, the `--results` file.
    Local {
        results: Option<std::io::BufWriter<std::fs::File>>,
        /// One handle for the whole stream: tokio reports a failed write on the handle's
        /// next write or flush, so a handle per write would never see EPIPE.
        stdout: tokio::io::Stdout,
        /// stdout was closed (`| head -1`): the stream ends as SIGPIPE ends a job.
        stdout_closed: bool,
    },
    /// A session's client, over its control connection.
    Client {
        out: ClientOut,
        /// It went away or stopped reading: the rest is dropped (its stream is cancelled).
        gone: bool,
    },
}

impl Feed {
    /// A session client's feed, written beside the loop.
    fn client(
        out: tokio::net::unix::OwnedWriteHalf,
        writers: &tokio_util::task::TaskTracker,
    ) -> Feed {
        Feed::Client {
            out: ClientOut::new(out, writers),
            gone: false,
        }
    }

    async fn send(&mut self, kind: u8, payload: &[u8]) {
        if let Feed::Client { out, gone, .. } = self
            && !*gone
        {
            let mut frame = bytes::BytesMut::with_capacity(5 + payload.len());
            frame.extend_from_slice(&[kind]);
            frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
            frame.extend_from_slice(payload);
            if !out.queue(frame.freeze()) {
                *gone = true;
            }
        }
    }

    /// A client's writes failed (it is gone), or greedyrun's own stdout closed.
    fn gone(&self) -> bool {
        matches!(
            self,
            Feed::Client { gone: true, .. }
                | Feed::Local {
                    stdout_closed: true,
                    ..
                }
        )
    }

    async fn output(&mut self, stream: Stream, bytes: &[u8]) {
        match self {
            Feed::Local {
                stdout,
                stdout_closed,
                ..
            } => {
                let written = match stream {
                    Stream::Stdout if *stdout_closed => Ok(()),
                    Stream::Stdout => match stdout.write_all(bytes).await {
                        Ok(()) => stdout.flush().await,
                        e => e,
                    },
                    Stream::Stderr => tokio::io::stderr().write_all(bytes).await,
                };
                if stream == Stream::Stdout
                    && let Err(e) = written
                    && e.kind() == std::io::ErrorKind::BrokenPipe
                {
                    *stdout_closed = true;
                }
            }
            Feed::Client { .. } => {
                let kind = match stream {
                    Stream::Stdout => frame::STDOUT,
                    Stream::Stderr => frame::STDERR,
                };
                self.send(kind, bytes).await;
            }
        }
    }

    async fn result(&mut self, line: &str) {
        match self {
            Feed::Local { results, .. } => {
                if let Some(w) = results.as_mut() {
                    let _ = w.write_all(line.as_bytes());
                }
            }
            Feed::Client { .. } => self.send(frame::RESULT, line.as_bytes()).await,
        }
    }

    async fn say(&mut self, text: String) {
        match self {
            Feed::Local { .. } => eprintln!("greedyrun: {text}"),
            Feed::Client { .. } => self.send(frame::SAY, text.as_bytes()).await,
        }
    }

    async fn finish(mut self, code: i32) {
        match &mut self {
            Feed::Local { results, .. } => {
                if let Some(w) = results.as_mut()
                    && let Err(e) = w.flush()
                {
                    eprintln!("greedyrun: --results: {e}");
                }
                let _ = tokio::io::stdout().flush().await;
            }
            // Its writer sends what is queued, then closes the connection.
            Feed::Client { .. } => self.send(frame::EXIT, &code.to_be_bytes()).await,
        }
    }
}

/// A stream being run and its account.
struct Current {
    feed: Feed,
    /// Reads its lines; dropped (aborted) when the stream is cancelled.
    reader: Option<tokio_util::task::AbortOnDropHandle<()>>,
    line_no: u64,
    source_done: bool,
    done: u64,
    failed: u64,
    exit_code: i32,
    t0: Instant,
    tagger: Option<Tagger>,
    /// Period of its progress line (zero: none), and when the next is due.
    progress: Duration,
    next_progress: Instant,
    /// Its client went away or stopped reading, and the stream was cancelled for it.
    dropped: bool,
    /// Lines of its tasks that were cancelled unfinished (reported once, at its end).
    cancelled: Vec<u64>,
}

impl Current {
    fn new(
        feed: Feed,
        reader: tokio_util::task::AbortOnDropHandle<()>,
        tag: bool,
        progress: Duration,
    ) -> Current {
        Current {
            feed,
            reader: Some(reader),
            line_no: 0,
            source_done: false,
            done: 0,
            failed: 0,
            exit_code: 0,
            t0: Instant::now(),
            tagger: tag.then(Tagger::default),
            progress,
            next_progress: Instant::now() + progress,
            dropped: false,
            cancelled: Vec::new(),
        }
    }

    /// Nothing more of it is read or run: it ends once its running tasks have.
    fn stop_reading(&mut self) {
        self.source_done = true;
        self.reader = None;
    }

    /// Cancels stream `stream`: nothing more is read or run again; what was to run again
    /// counts as cancelled now, what runs as it ends (the caller ends those tasks).
    fn cancel(&mut self, stream: u32, dispatch: &mut Dispatcher) {
        self.stop_reading();
        self.cancelled
            .extend(dispatch.cancel(stream).iter().map(|t| t.id.line));
    }

    /// The stream is over: its cancelled tasks are named once, then the client gets `code`.
    async fn end(mut self, code: i32) {
        if !self.cancelled.is_empty() {
            self.cancelled.sort_unstable();
            let lines: Vec<String> = self.cancelled.iter().map(u64::to_string).collect();
            let n = lines.len();
            let text = format!(
                "{n} unfinished tasks cancelled (lines {})",
                lines.join(", ")
            );
            self.feed.say(text).await;
        }
        self.feed.finish(code).await;
    }

    /// The line just read is not UTF-8 text: it fails, named with its number, unrun; the
    /// rest of the stream runs.
    async fn undecodable(&mut self, bytes: &[u8]) {
        let text = String::from_utf8_lossy(bytes);
        self.done += 1;
        self.failed += 1;
        if self.exit_code == 0 {
            self.exit_code = 1;
        }
        let said = format!(
            "task {}: not run, the line is not UTF-8 text: {}",
            self.line_no,
            escape(&text)
        );
        self.feed.say(said).await;
        let line = serde_json::json!({
            "task": self.line_no, "host": null, "exit": null, "wall_s": 0.0,
            "end_s": (self.t0.elapsed().as_secs_f64() * 1e3).round() / 1e3,
            "runs": 0, "command": text, "error": "not UTF-8",
        });
        self.feed.result(&format!("{line}\n")).await;
    }
}

/// A client's request as [`read_client`] hands it to the session's loop, with the rest of its
/// input and its output.
type ClientRequest = (
    Option<Request>,
    LineSource,
    tokio::net::unix::OwnedWriteHalf,
);

/// Reads a client's request; a job is served here, beside the loop (several jobs run at once
/// on disjoint slots), anything else goes to the loop through `to_loop`.
async fn read_client(
    conn: tokio::net::UnixStream,
    board: Arc<JobBoard>,
    fanout: Arc<crate::fanout::Fanout>,
    to_loop: mpsc::Sender<ClientRequest>,
) {
    let (rd, out) = conn.into_split();
    let boxed: Box<dyn tokio::io::AsyncRead + Unpin + Send> = Box::new(rd);
    let mut lines = BufReader::new(boxed).lines();
    let request = read_request(&mut lines).await;
    if request == Some(Request::Job) {
        session::serve_job(lines.into_inner(), out, board, fanout).await;
        return;
    }
    let _ = to_loop.send((request, lines, out)).await;
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
    let log = |line: String| eprintln!("greedyrun: {line}");
    let host = |node: u32| plan.hosts.get(node as usize).cloned().unwrap_or_default();

    // Every stream's lines come through one queue, a line per free slot.
    let (line_tx, mut line_rx) = mpsc::channel::<Read>(1);
    let mut streams: std::collections::BTreeMap<u32, Current> = Default::default();
    let mut next_stream = 0u32;
    let mut listener: Option<tokio::net::UnixListener> = None;
    let mut idle: Option<Duration> = None;
    let slots: Vec<u32> = plan.ranks.iter().map(|r| r.len() as u32).collect();
    // A session's jobs (crate::session) on the same hosts and slots.
    let board = JobBoard::new(plan.hosts.clone(), slots);
    let mut dispatch = Dispatcher::new(board.clone());
    match &opts.source {
        Source::File(_) | Source::Stdin => {
            let results = match &opts.results {
                None => None,
                Some(p) => match std::fs::File::create(p) {
                    Ok(f) => Some(std::io::BufWriter::new(f)),
                    Err(e) => {
                        log(format!("--results {}: {e}", p.display()));
                        return Report::unlaunched(code::USAGE, n);
                    }
                },
            };
            let input: Box<dyn tokio::io::AsyncRead + Unpin + Send> = match &opts.source {
                Source::File(p) => match tokio::fs::File::open(p).await {
                    Ok(f) => Box::new(f),
                    Err(e) => {
                        log(format!("--tasks {}: {e}", p.display()));
                        return Report::unlaunched(code::USAGE, n);
                    }
                },
                _ => Box::new(tokio::io::stdin()),
            };
            let reader = read_lines(0, BufReader::new(input).lines(), line_tx.clone());
            let feed = Feed::Local {
                results,
                stdout: tokio::io::stdout(),
                stdout_closed: false,
            };
            streams.insert(0, Current::new(feed, reader, cfg.tag_output, cfg.progress));
            dispatch.open_stream(0, opts.retries);
            next_stream = 1;
        }
        Source::Session { socket, idle: i } => {
            match tokio::net::UnixListener::bind(socket) {
                Ok(l) => listener = Some(l),
                Err(e) => {
                    log(format!("session socket {}: {e}", socket.display()));
                    return Report::unlaunched(code::LAUNCHER, n);
                }
            }
            idle = Some(*i);
        }
    }
    let session = listener.is_some();
    let own_uid = nix::unistd::geteuid().as_raw();

    let (up_tx, mut up_rx) = mpsc::channel::<Up>(UP_CAPACITY);
    let fanout = std::sync::Arc::new(launch(&cfg, &start_frame(&cfg, true), up_tx));
    let mut hello_at: Vec<Option<Duration>> = vec![None; n];
    let mut session_code = 0;
    let mut ending = false;
    let mut end_deadline: Option<Instant> = None;
    let launch_deadline = t0 + plan.timeout;
    let mut launch_over = false;
    let mut idle_since = Instant::now();
    let mut stops = crate::signals::Stops::new();
    // Each client's writer: the session waits for their last frames (bounded) before it exits.
    let writers = tokio_util::task::TaskTracker::new();
    // Requests wait here while the loop is busy; clients are few (one per greedyrun).
    let (request_tx, mut request_rx) = mpsc::channel::<ClientRequest>(16);
    let mut tick = tokio::time::interval(Duration::from_millis(250));

    loop {
        // Free slots first take what must run again; new lines are read in the select below,
        // so a source that is slow to give them (a pipe, a client) never holds the rest.
        while !ending && dispatch.has_free_slot() {
            let Some((task, runs)) = dispatch.take_again() else {
                break;
            };
            if !streams.contains_key(&task.id.stream) {
                log(format!(
                    "task {} of a stream that has ended: dropped",
                    task.id.line
                ));
                continue;
            }
            let (id, command) = (task.id, task.command.clone());
            let to = dispatch.assign(task, runs);
            fanout.route(Some(to), Cmd::Task { id, command }).await;
        }
        let want_line =
            !ending && dispatch.has_free_slot() && streams.values().any(|c| !c.source_done);
        let over: Vec<u32> = streams
            .iter()
            .filter(|&(&s, c)| c.source_done && dispatch.idle(s))
            .map(|(&s, _)| s)
            .collect();
        for stream in over {
            let cur = streams.remove(&stream).expect("listed");
            dispatch.close_stream(stream);
            let code = cur.exit_code;
            if cfg.verbose {
                log(format!(
                    "{} tasks ended ({} failed) in {:.3} s",
                    cur.done,
                    cur.failed,
                    cur.t0.elapsed().as_secs_f64()
                ));
            }
            cur.end(code).await;
            idle_since = Instant::now();
            if !session && !ending {
                session_code = code;
                ending = true;
                fanout.route(None, Cmd::Shutdown).await;
                end_deadline = Some(Instant::now() + SHUTDOWN_TIMEOUT);
            }
        }
        if !ending && board.capacity(launch_over).2 {
            let left = dispatch.drain();
            let text = format!("no host left to run tasks: {} tasks not run", left.len());
            for (&stream, cur) in streams.iter_mut() {
                let mut said = text.clone();
                if !cur.source_done {
                    said += &format!("; the stream is not read past line {}", cur.line_no);
                }
                cur.feed.say(said).await;
                for task in left.iter().filter(|t| t.id.stream == stream) {
                    cur.feed
                        .say(format!("task {} not run: {}", task.id.line, task.command))
                        .await;
                }
                cur.exit_code = code::LAUNCHER;
                cur.stop_reading();
            }
            log(text);
            session_code = code::LAUNCHER;
            ending = true;
            fanout.route(None, Cmd::Teardown).await;
            end_deadline = Some(Instant::now() + plan.grace + TEARDOWN_LINGER);
            for (_, cur) in std::mem::take(&mut streams) {
                let code = cur.exit_code;
                cur.end(code).await;
            }
        }
        tokio::select! {
            Some((stream, line)) = line_rx.recv(), if want_line => {
                // A line of a stream cancelled meanwhile is not run.
                let Some(cur) = streams.get_mut(&stream).filter(|c| !c.source_done) else { continue };
                match line {
                    Ok(Some(Err(bytes))) => {
                        cur.line_no += 1;
                        cur.undecodable(&bytes).await;
                    }
                    Ok(Some(Ok(line))) => {
                        cur.line_no += 1;
                        if !line.trim().is_empty() {
                            let id = TaskId { stream, line: cur.line_no };
                            let command = line.clone();
                            let task = Task { id, command: line, failures: 0 };
                            let to = dispatch.assign(task, 0);
                            fanout.route(Some(to), Cmd::Task { id, command }).await;
                        }
                    }
                    Ok(None) => cur.stop_reading(),
                    Err(e) => {
                        let line_no = cur.line_no;
                        cur.feed.say(format!("reading the tasks after line {line_no}: {e}")).await;
                        cur.stop_reading();
                        cur.exit_code = code::USAGE;
                    }
                }
            }
            m = up_rx.recv() => match m {
                None => break,
                Some(Up::Hello { node }) => {
                    if let Some(slot) = hello_at.get_mut(node as usize) && slot.is_none() {
                        *slot = Some(t0.elapsed());
                    }
                    board.host_up(node);
                }
                Some(Up::TaskOutput { id, stream, data }) => {
                    if let Some(cur) = streams.get_mut(&id.stream) {
                        let bytes = match cur.tagger.as_mut() {
                            Some(t) => t.tag_task(id.line, stream, &data),
                            None => data.to_vec(),
                        };
                        cur.feed.output(stream, &bytes).await;
                    }
                }
                Some(Up::TaskEnd { node, id, end, wall_us }) => {
                    match dispatch.ended(node, id, end, wall_us) {
                        Ended::Done(d) => {
                            if let Some(cur) = streams.get_mut(&id.stream) {
                                cur.done += 1;
                                if let Some(t) = cur.tagger.as_mut() {
                                    t.forget_task(id.line);
                                }
                                if d.cancelled {
                                    cur.cancelled.push(id.line);
                                } else if d.end.failed() {
                                    cur.failed += 1;
                                    if cur.exit_code == 0 {
                                        cur.exit_code = 1;
                                    }
                                    let runs = if d.runs == 1 { "1 run".to_string() } else { format!("{} runs", d.runs) };
                                    cur.feed.say(format!("task {} on {} ended with {} after {runs}: {}", id.line, host(d.host), d.end.code(), d.task.command)).await;
                                }
                                cur.feed.result(&result_line(&d, &host(d.host), cur.t0.elapsed().as_secs_f64())).await;
                            }
                        }
                        Ended::Retry if cfg.verbose => log(format!("task {} of stream {} on {} ended with {}: running it again", id.line, id.stream, host(node), end.code())),
                        Ended::Retry | Ended::Stale => {}
                    }
                }
                Some(Up::Lost { node, what, .. }) => {
                    let what = escape(&what);
                    let sub = plan.launch.subtree_len(node as usize + 1) as u32;
                    board.hosts_lost(node..node + sub, &what).await;
                    let moved = dispatch.hosts_lost(node..node + sub);
                    let out = if sub > 1 { format!("it and its launch subtree ({sub} hosts) leave") } else { "it leaves".into() };
                    let text = format!("host {} lost: {what}; {out} the streams, {moved} of their tasks run again elsewhere", host(node));
                    if streams.is_empty() || ending {
                        log(text);
                    } else {
                        for cur in streams.values_mut() {
                            cur.feed.say(text.clone()).await;
                        }
                    }
                }
                Some(Up::Failed { node, what, .. }) => {
                    let what = escape(&what);
                    board.hosts_lost(node..node + 1, &what).await;
                    let moved = dispatch.hosts_lost(node..node + 1);
                    log(format!("{}: {what}; out of the streams, {moved} tasks run again elsewhere", host(node)));
                }
                Some(Up::Note { node, text }) => {
                    if cfg.verbose || !ending {
                        log(format!("{}: {}", host(node), escape(&text)));
                    }
                }
                Some(Up::Unclean { node, what }) => log(format!(
                    "could not clean up {} after its agent failed to start, so what its remote shell started there may still run: {}",
                    host(node),
                    escape(&what)
                )),
                Some(Up::Job { job, frame }) => session::job_frame(&board, job, &frame),
                Some(Up::Bye { .. } | Up::Output { .. } | Up::Exit { .. } | Up::Spoke { .. } | Up::Address { .. } | Up::Aborted { .. } | Up::StdinTaken { .. }) => {}
            },
            accepted = async { listener.as_ref().expect("guarded").accept().await }, if listener.is_some() && !ending => {
                let Ok((conn, _)) = accepted else { continue };
                // The socket's directory is the owner's alone (0700); the peer's uid, from the
                // kernel, is checked anyway.
                let uid = conn.peer_cred().map(|c| c.uid());
                if uid.as_ref().ok() != Some(&own_uid) {
                    log(format!("refused a control connection from uid {uid:?}: the session is uid {own_uid}'s"));
                    continue;
                }
                // Its request is read beside the loop: a client that says nothing holds no one.
                tokio::spawn(read_client(conn, board.clone(), fanout.clone(), request_tx.clone()));
            }
            Some((request, lines, out)) = request_rx.recv(), if !ending => {
                let mut feed = Feed::client(out, &writers);
                let (jobs, busy, waiting) = board.running();
                let (slots, lost, _) = board.capacity(launch_over);
                match request {
                    // Streams share the slots with each other and with jobs (crate::slots).
                    Some(Request::Tasks { retries, tag, progress_ms }) => {
                        let stream = next_stream;
                        next_stream += 1;
                        dispatch.open_stream(stream, retries);
                        let reader = read_lines(stream, lines, line_tx.clone());
                        streams.insert(stream, Current::new(feed, reader, tag, Duration::from_millis(progress_ms)));
                    }
                    Some(Request::Status) => {
                        let up = hello_at.iter().filter(|h| h.is_some()).count();
                        let n_streams = streams.len();
                        let plural = if n_streams == 1 { "" } else { "s" };
                        let text = format!(
                            "session of {n} hosts ({up} up, {lost} lost), {slots} slots, {} tasks running, {jobs} jobs running on {busy} slots, {waiting} jobs waiting for slots, {n_streams} task stream{plural}, up {:.0} s, idle {:.0} s",
                            dispatch.running(), t0.elapsed().as_secs_f64(), idle_since.elapsed().as_secs_f64(),
                        );
                        let counts = serde_json::json!({
                            "hosts": n, "up": up, "lost": lost,
                            "slots": slots, "running": dispatch.running(), "streams": n_streams,
                            "jobs": jobs, "job_slots": busy, "jobs_waiting": waiting,
                        });
                        feed.send(frame::RESULT, counts.to_string().as_bytes()).await;
                        feed.send(frame::SAY, text.as_bytes()).await;
                        for line in board.describe() {
                            feed.send(frame::SAY, line.as_bytes()).await;
                        }
                        feed.finish(0).await;
                    }
                    Some(Request::End) => {
                        feed.finish(0).await;
                        ending = true;
                        // The streams end with the session: what runs is ended, what is not
                        // read is not run.
                        for (&stream, cur) in streams.iter_mut() {
                            let text = format!("the session is being ended (--end-session): {} running tasks are ended, the stream is not read past line {}", dispatch.running_of(stream), cur.line_no);
                            cur.feed.say(text).await;
                            cur.exit_code = code::LAUNCHER;
                            cur.cancel(stream, &mut dispatch);
                        }
                        if streams.is_empty() {
                            fanout.route(None, Cmd::Shutdown).await;
                            end_deadline = Some(Instant::now() + SHUTDOWN_TIMEOUT);
                        } else {
                            fanout.route(None, Cmd::Teardown).await;
                            end_deadline = Some(Instant::now() + plan.grace + TEARDOWN_LINGER);
                        }
                    }
                    Some(Request::Job) => {}
                    None => log("a control connection said nothing greedyrun understands: closed".into()),
                }
            }
            // A session outlives the terminal it was started from.
            sig = stops.recv() => match sig {
                nix::sys::signal::Signal::SIGHUP if session => {}
                _ if ending => { fanout.kill_all(); break; }
                sig => {
                    if sig == nix::sys::signal::Signal::SIGINT {
                        log(format!("interrupted: {} tasks running are ended", dispatch.running()));
                    }
                    for (&stream, cur) in streams.iter_mut() {
                        cur.cancel(stream, &mut dispatch);
                    }
                    session_code = 128 + crate::signals::number(sig);
                    ending = true;
                    fanout.route(None, Cmd::Teardown).await;
                    end_deadline = Some(Instant::now() + plan.grace + TEARDOWN_LINGER);
                }
            },
            _ = tick.tick() => {
                let now = Instant::now();
                if !launch_over && now >= launch_deadline {
                    launch_over = true;
                    let missing: Vec<&String> = (0..n).filter(|&i| hello_at[i].is_none()).map(|i| &plan.hosts[i]).collect();
                    if !missing.is_empty() {
                        log(format!("no agent from {} after {} s: the stream runs without them", greedy_tree::hostlist::compress(&missing), plan.timeout.as_secs_f64()));
                    }
                }
                if board.running().0 > 0 {
                    idle_since = now;
                }
                if let (Some(idle), true, false) = (idle, streams.is_empty(), ending)
                    && idle_since.elapsed() >= idle
                {
                    log(format!("no stream for {} s: the session ends", idle.as_secs_f64()));
                    ending = true;
                    fanout.route(None, Cmd::Shutdown).await;
                    end_deadline = Some(Instant::now() + SHUTDOWN_TIMEOUT);
                }
                for (&stream, cur) in streams.iter_mut() {
                    // A client that went away mid-stream ends its stream: its running tasks
                    // are ended, nothing more is read, and the other streams run on.
                    // greedyrun's own stream whose stdout closed (`| head -1`) ends as SIGPIPE
                    // ends a job.
                    if !cur.dropped {
                        if session {
                            cur.feed.send(frame::KEEPALIVE, &[]).await;
                        }
                        if cur.feed.gone() {
                            if session {
                                log(format!("the client of stream {stream} went away or stopped reading: its {} running tasks are ended", dispatch.running_of(stream)));
                            } else {
                                cur.exit_code = code::BROKEN_PIPE;
                            }
                            cur.dropped = true;
                            cur.cancel(stream, &mut dispatch);
                            fanout.route(None, Cmd::CancelTasks { stream }).await;
                        }
                    }
                    if !cur.progress.is_zero() && now >= cur.next_progress {
                        cur.next_progress = now + cur.progress;
                        let rate = cur.done as f64 / cur.t0.elapsed().as_secs_f64().max(1e-9);
                        let line = format!("tasks: {} done ({} failed), {} running, {rate:.1} tasks/s", cur.done, cur.failed, dispatch.running_of(stream));
                        cur.feed.say(line).await;
                    }
                }
                if let Some(d) = end_deadline && now >= d {
                    fanout.kill_all();
                    end_deadline = None;
                }
            }
        }
    }
    for (_, cur) in std::mem::take(&mut streams) {
        // An interrupt decides (the tasks it ended failed because of it); else the stream's.
        let code = match session_code {
            129 | 130 | 143 => session_code,
            _ if cur.exit_code != 0 => cur.exit_code,
            _ => session_code,
        };
        if !session {
            session_code = code;
        }
        cur.end(code).await;
    }
    if let Source::Session { socket, .. } = &opts.source {
        let _ = std::fs::remove_file(socket);
    }
    writers.close();
    let _ = tokio::time::timeout(CLIENT_STALL, writers.wait()).await;
    Report {
        exit_code: session_code,
        hello_at,
        finished_at: Some(t0.elapsed()),
    }
}

/// What a client of a session does: send `request` (and, for a stream, its lines), print
/// what comes back, write results to `results`; returns the exit code the session sent.
pub async fn submit(
    socket: &std::path::Path,
    request: &str,
    lines: Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>,
    results: Option<PathBuf>,
) -> i32 {
    use tokio::io::AsyncReadExt;
    let say = |line: String| eprintln!("greedyrun: {line}");
    let conn = match crate::session::connect_own(socket).await {
        Ok(c) => c,
        Err(e) => {
            say(e.to_string());
            return code::LAUNCHER;
        }
    };
    let mut results = match results {
        None => None,
        Some(p) => match std::fs::File::create(&p) {
            Ok(f) => Some(std::io::BufWriter::new(f)),
            Err(e) => {
                say(format!("--results {}: {e}", p.display()));
                return code::USAGE;
            }
        },
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
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    let exit = loop {
        let mut head = [0u8; 5];
        if rd.read_exact(&mut head).await.is_err() {
            say("the session went away before the stream ended".into());
            break code::LAUNCHER;
        }
        let len = u32::from_be_bytes(head[1..].try_into().expect("4 bytes"));
        if len > frame::MAX {
            say(format!(
                "the session sent a frame of {len} bytes: not a greedy session"
            ));
            break code::LAUNCHER;
        }
        let mut payload = vec![0u8; len as usize];
        if rd.read_exact(&mut payload).await.is_err() {
            say("the session went away before the stream ended".into());
            break code::LAUNCHER;
        }
        match head[0] {
            // A closed stdout (`| head -1`) ends the stream as SIGPIPE ends a job: the session
            // sees this client go and cancels it.
            frame::STDOUT => {
                if let Err(e) = stdout.write_all(&payload).await
                    && e.kind() == std::io::ErrorKind::BrokenPipe
                {
                    break code::BROKEN_PIPE;
                }
            }
            frame::STDERR => {
                let _ = stderr.write_all(&payload).await;
            }
            // Each line reaches the file at once: Ctrl-C (whose default action ends this
            // client) must not lose the results of tasks that finished.
            frame::RESULT => {
                if let Some(w) = results.as_mut() {
                    let _ = w.write_all(&payload).and_then(|()| w.flush());
                }
            }
            frame::KEEPALIVE => {}
            frame::SAY => say(escape(&String::from_utf8_lossy(&payload)).into_owned()),
            frame::EXIT if payload.len() == 4 => {
                break i32::from_be_bytes(payload[..].try_into().expect("4 bytes"));
            }
            k => {
                say(format!(
                    "the session sent a frame of kind {k}: not a greedy session"
                ));
                break code::LAUNCHER;
            }
        }
    };
    sender.abort();
    let _ = stdout.flush().await;
    if let Some(mut w) = results
        && let Err(e) = w.flush()
    {
        say(format!("--results: {e}"));
    }
    exit
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

/// Shell builtins and keywords: a line starting with one needs the shell, whose own it is.
const SHELL_WORDS: &[&str] = &[
    ".", ":", "!", "{", "}", "alias", "bg", "break", "case", "cd", "command", "continue", "do",
    "done", "elif", "else", "esac", "eval", "exec", "exit", "export", "fg", "fi", "for", "getopts",
    "hash", "if", "in", "jobs", "local", "read", "readonly", "return", "set", "shift", "source",
    "then", "times", "trap", "type", "ulimit", "umask", "unalias", "unset", "until", "wait",
    "while",
];

/// How a host's agent runs a task line: the line's words themselves when it is plain words
/// that `sh -c` would pass on unchanged (letters, digits and `_-./=:,+@%^` between blanks; no
/// quote, `$`, glob, redirection, `~` or `#`; not starting with a variable assignment or a
/// shell builtin or keyword), else `sh -c LINE`. The program, its arguments and environment
/// are the same either way; a plain line saves the exec of a shell per task, which is most of
/// a short task's cost beside the program's own. A plain line whose program cannot be run is
/// run through the shell after all, for the shell's own message and exit code (127, 126).
pub fn argv_of(command: &str) -> Vec<String> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./=:,+@%^ \t".contains(c);
    let words: Vec<&str> = command
        .split([' ', '\t'])
        .filter(|w| !w.is_empty())
        .collect();
    match words.first() {
        Some(first)
            if command.chars().all(plain)
                && !first.contains('=')
                && !SHELL_WORDS.contains(first) =>
        {
            words.iter().map(|w| w.to_string()).collect()
        }
        _ => vec!["/bin/sh".into(), "-c".into(), command.into()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_run_without_a_shell_and_the_rest_through_one() {
        assert_eq!(argv_of("/bin/true"), ["/bin/true"]);
        assert_eq!(argv_of("  sleep\t0.01 "), ["sleep", "0.01"]);
        assert_eq!(
            argv_of("./sim --n=4 -o out_1.dat a,b:c+d@e%f^g"),
            ["./sim", "--n=4", "-o", "out_1.dat", "a,b:c+d@e%f^g"]
        );
        for line in [
            "echo $HOME",
            "echo 'a b'",
            "echo \"a\"",
            "ls *.dat",
            "a > out",
            "a | b",
            "a; b",
            "a && b",
            "cd /tmp",
            "exit 3",
            "FOO=1 env",
            "ls ~",
            "a # comment",
            "echo a\\ b",
            "(a)",
            "",
            "   ",
        ] {
            assert_eq!(argv_of(line), ["/bin/sh", "-c", line], "{line:?}");
        }
    }

    /// Line `line` of stream 0.
    fn id(line: u64) -> TaskId {
        TaskId { stream: 0, line }
    }

    fn task(line: u64) -> Task {
        Task {
            id: id(line),
            command: format!("cmd {line}"),
            failures: 0,
        }
    }

    /// A dispatcher on hosts with these slots, none up yet, running stream 0 with these
    /// retries, and its board.
    fn dispatcher(slots: Vec<u32>, retries: u32) -> (Dispatcher, Arc<JobBoard>) {
        let hosts = (0..slots.len()).map(|i| format!("h{i}")).collect();
        let board = JobBoard::new(hosts, slots);
        let mut d = Dispatcher::new(board.clone());
        d.open_stream(0, retries);
        (d, board)
    }

    /// Hosts `hosts` are lost, as the session's loop tells the board and the dispatcher.
    fn lose(board: &JobBoard, d: &mut Dispatcher, hosts: Range<u32>) -> usize {
        futures_util::FutureExt::now_or_never(board.hosts_lost(hosts.clone(), "gone"))
            .expect("no job to tell");
        d.hosts_lost(hosts)
    }

    #[test]
    fn slots_rotate_over_hosts_and_free_on_end() {
        let (mut d, board) = dispatcher(vec![1, 2], 0);
        assert!(!d.has_free_slot());
        board.host_up(1);
        board.host_up(0);
        board.host_up(0); // a second hello adds nothing
        let hosts: Vec<u32> = (1..=3).map(|i| d.assign(task(i), 0)).collect();
        assert_eq!(hosts, [1, 1, 0]);
        assert!(!d.has_free_slot());
        let Ended::Done(done) = d.ended(1, id(2), RankEnd::Exited(0), 7) else {
            panic!()
        };
        assert_eq!(
            (done.task.id, done.host, done.runs, done.wall_us),
            (id(2), 1, 1, 7)
        );
        assert_eq!(d.assign(task(4), 0), 1);
    }

    #[test]
    fn a_failed_task_runs_again_up_to_the_retries_then_is_done_once() {
        let (mut d, board) = dispatcher(vec![1], 2);
        board.host_up(0);
        d.assign(task(1), 0);
        assert_eq!(d.ended(0, id(1), RankEnd::Exited(3), 1), Ended::Retry);
        let (t, runs) = d.take_again().unwrap();
        assert_eq!((t.failures, runs), (1, 1));
        d.assign(t, runs);
        assert_eq!(d.ended(0, id(1), RankEnd::Signaled(9), 1), Ended::Retry);
        let (t, runs) = d.take_again().unwrap();
        d.assign(t, runs);
        let Ended::Done(done) = d.ended(0, id(1), RankEnd::Exited(3), 1) else {
            panic!()
        };
        assert_eq!((done.runs, done.end.code()), (3, 3));
        assert!(d.idle(0));
        // A second report of it is not a second end.
        assert_eq!(d.ended(0, id(1), RankEnd::Exited(0), 1), Ended::Stale);
    }

    #[test]
    fn a_lost_hosts_tasks_run_elsewhere_and_its_late_reports_are_ignored() {
        let (mut d, board) = dispatcher(vec![2, 2, 1], 0);
        for h in 0..3 {
            board.host_up(h);
        }
        let on: Vec<u32> = (1..=5).map(|i| d.assign(task(i), 0)).collect();
        assert_eq!(on, [0, 0, 1, 1, 2]);
        // Hosts 1 and 2 (a launch subtree) are lost with tasks 3, 4 and 5.
        assert_eq!(lose(&board, &mut d, 1..3), 3);
        assert!(!d.has_free_slot());
        assert!(d.ended(0, id(1), RankEnd::Exited(0), 1).is_done());
        let (moved, _) = d.take_again().unwrap();
        assert!([3, 4, 5].contains(&moved.id.line));
        assert_eq!(d.assign(moved.clone(), 0), 0);
        // The lost host's report of it comes late: not its end.
        assert_eq!(d.ended(1, moved.id, RankEnd::Exited(0), 1), Ended::Stale);
        assert!(d.ended(0, moved.id, RankEnd::Exited(0), 1).is_done());
        assert!(!board.capacity(true).2);
        // Task 2 still runs on host 0: lost with it, it is left with the other two.
        assert_eq!(lose(&board, &mut d, 0..1), 1);
        assert!(board.capacity(true).2);
        let left: Vec<u64> = d.drain().iter().map(|t| t.id.line).collect();
        assert_eq!(left.len(), 3);
        assert!(left.contains(&2));
        assert!(d.idle(0));
    }

    /// Two streams at once: each has its own retries; cancelling one forgets only its
    /// retries; each is idle on its own.
    #[test]
    fn streams_share_the_slots_and_keep_their_own_account() {
        let (mut d, board) = dispatcher(vec![2, 1], 1);
        d.open_stream(1, 0);
        for h in 0..2 {
            board.host_up(h);
        }
        let b = |line| Task {
            id: TaskId { stream: 1, line },
            command: "b".into(),
            failures: 0,
        };
        d.assign(task(1), 0);
        d.assign(b(1), 0);
        d.assign(b(2), 0);
        assert!(!d.has_free_slot());
        assert_eq!((d.running_of(0), d.running_of(1)), (1, 2));
        // Stream 0 retries; stream 1, with none, is done with its failure.
        assert_eq!(d.ended(0, id(1), RankEnd::Exited(3), 1), Ended::Retry);
        let failed = d.ended(0, TaskId { stream: 1, line: 1 }, RankEnd::Exited(3), 1);
        assert!(failed.is_done());
        assert!(!d.idle(0), "stream 0's retry waits");
        // Stream 0 is cancelled: its retry goes; stream 1's task runs on.
        let dropped = d.cancel(0);
        assert_eq!(dropped.iter().map(|t| t.id).collect::<Vec<_>>(), [id(1)]);
        assert!(d.idle(0));
        assert!(!d.idle(1));
        assert!(d.take_again().is_none());
        assert!(
            d.ended(1, TaskId { stream: 1, line: 2 }, RankEnd::Exited(0), 1)
                .is_done()
        );
        assert!(d.idle(1));
        d.close_stream(0);
        d.close_stream(1);
    }

    /// A cancelled stream's task that fails (it was ended for the cancel) is not run again:
    /// it is done, as cancelled; one that ends 0 is done as usual.
    #[test]
    fn a_cancelled_streams_tasks_end_cancelled_and_never_run_again() {
        let (mut d, board) = dispatcher(vec![2], 3);
        board.host_up(0);
        d.assign(task(1), 0);
        d.assign(task(2), 0);
        assert!(d.cancel(0).is_empty());
        match d.ended(0, id(1), RankEnd::Signaled(15), 1) {
            Ended::Done(done) => assert!(done.cancelled),
            other => panic!("{other:?}"),
        }
        match d.ended(0, id(2), RankEnd::Exited(0), 1) {
            Ended::Done(done) => assert!(!done.cancelled),
            other => panic!("{other:?}"),
        }
        assert!(d.take_again().is_none());
        assert!(d.idle(0));
    }

    impl Ended {
        fn is_done(&self) -> bool {
            matches!(self, Ended::Done(_))
        }
    }

    #[test]
    fn result_lines_are_json_with_the_command_escaped() {
        let d = Done {
            task: Task {
                id: TaskId { stream: 3, line: 7 },
                command: "echo \"a\tb\"".into(),
                failures: 0,
            },
            host: 0,
            end: RankEnd::Signaled(9),
            wall_us: 1_500_000,
            runs: 1,
            cancelled: false,
        };
        let v: serde_json::Value = serde_json::from_str(&result_line(&d, "n1", 2.3456)).unwrap();
        assert_eq!(v["end_s"], 2.346);
        assert_eq!(v["task"], 7);
        assert_eq!(v["exit"], 137);
        assert_eq!(v["wall_s"], 1.5);
        assert_eq!(v["command"], "echo \"a\tb\"");
        assert_eq!(v["host"], "n1");
    }
}
