//! The task streams a run holds: greedyrun's own `--tasks` stream, or a session's clients'
//! streams. Where each stream's lines come from and its output goes, its account, and the
//! handlers of the loop's events ([`Streams`]) that greedyrun's loop and the session's share.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use super::{
    board::JobBoard,
    control::{CLIENT_STALL, LineSource, frame},
    dispatch::{Dispatcher, Done, Ended, Placement, Task},
    job_tasks::JobTasks,
    serve::job_frame,
    staging::{Collector, Stager},
};
use crate::{
    fanout::Fanout,
    limits::{SHUTDOWN_TIMEOUT, TEARDOWN_LINGER},
    plan::Plan,
    proto::{Cmd, RankEnd, Staged, Stream, TaskId, Up},
    status::code,
    stdio::Tagger,
    task_spec::{self, Defaults, TaskSpec},
    terminal::escape,
};

/// One result line: the task's number, host, exit code (128 + signal for a signal, 127 if it
/// could not start), its last run's wall time, when it ended (seconds since the stream
/// started, so tasks/s over time can be drawn), its runs, its command, its name if it has
/// one, for a task of several ranks the host of each rank, and the output files collected.
fn result_line(done: &Done, hosts: &[String], end_s: f64, outputs: &[String]) -> String {
    let spec = &done.task.spec;
    let name = |h: u32| hosts.get(h as usize).cloned().unwrap_or_default();
    let mut line = serde_json::json!({
        "task": done.task.id.line,
        "host": name(done.at.host()),
        "exit": done.end.code(),
        "wall_s": done.wall_us as f64 / 1e6,
        "end_s": (end_s * 1e3).round() / 1e3,
        "runs": done.runs,
        "command": spec.run.display(),
    });
    if let Some(name) = &spec.name {
        line["name"] = name.as_str().into();
    }
    if spec.ranks > 1 {
        line["rank_hosts"] = done.at.rank_hosts().map(name).collect::<Vec<_>>().into();
    }
    if !outputs.is_empty() {
        line["outputs"] = outputs.into();
    }
    if done.cancelled {
        line["cancelled"] = true.into();
    }
    let mut line = line.to_string();
    line.push('\n');
    line
}

/// A line read from stream `.0`: a line, the end, or the error that ended the reading.
/// A line that is not UTF-8 is `Err` of its bytes: it is named and the rest still runs.
pub(crate) type Read = (u32, Line);
/// What the reader of a stream got: a line, the end, or the error that ended the reading.
pub(crate) type Line = std::io::Result<Option<Result<String, Vec<u8>>>>;

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
pub(super) struct ClientOut {
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
pub(super) enum Feed {
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
    pub(super) fn client(
        out: tokio::net::unix::OwnedWriteHalf,
        writers: &tokio_util::task::TaskTracker,
    ) -> Feed {
        Feed::Client {
            out: ClientOut::new(out, writers),
            gone: false,
        }
    }

    pub(super) async fn send(&mut self, kind: u8, payload: &[u8]) {
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
            // Each line reaches the file at once, as a session's client writes it: a run
            // killed now resumes from it (`--resume`) without running this task again.
            Feed::Local { results, .. } => {
                if let Some(w) = results.as_mut() {
                    let _ = w.write_all(line.as_bytes()).and_then(|()| w.flush());
                }
            }
            Feed::Client { .. } => self.send(frame::RESULT, line.as_bytes()).await,
        }
    }

    pub(super) async fn say(&mut self, text: String) {
        match self {
            Feed::Local { .. } => eprintln!("greedyrun: {text}"),
            Feed::Client { .. } => self.send(frame::SAY, text.as_bytes()).await,
        }
    }

    pub(super) async fn finish(mut self, code: i32) {
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
pub(crate) struct Current {
    pub(super) feed: Feed,
    /// Reads its lines; dropped (aborted) when the stream is cancelled.
    reader: Option<tokio_util::task::AbortOnDropHandle<()>>,
    pub(super) line_no: u64,
    source_done: bool,
    done: u64,
    failed: u64,
    pub(super) exit_code: i32,
    t0: Instant,
    tagger: Option<Tagger>,
    /// Period of its progress line (zero: none), and when the next is due.
    progress: Duration,
    next_progress: Instant,
    /// Its client went away or stopped reading, and the stream was cancelled for it.
    dropped: bool,
    /// Lines of its tasks that were cancelled unfinished (reported once, at its end).
    cancelled: Vec<u64>,
    /// What its plain lines' tasks get.
    defaults: Defaults,
}

impl Current {
    /// greedyrun's own stream (number 0): `input`'s lines, read into the loop's queue `to`;
    /// its output on greedyrun's stdout and stderr, its results in `results`.
    pub(crate) fn local(
        input: Box<dyn tokio::io::AsyncRead + Unpin + Send>,
        results: Option<std::io::BufWriter<std::fs::File>>,
        to: mpsc::Sender<Read>,
        defaults: Defaults,
        tag: bool,
        progress: Duration,
    ) -> Current {
        let reader = read_lines(0, BufReader::new(input).lines(), to);
        let feed = Feed::Local {
            results,
            stdout: tokio::io::stdout(),
            stdout_closed: false,
        };
        Current::new(feed, reader, defaults, tag, progress)
    }

    fn new(
        feed: Feed,
        reader: tokio_util::task::AbortOnDropHandle<()>,
        defaults: Defaults,
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
            defaults,
        }
    }

    /// Nothing more of it is read or run: it ends once its running tasks have.
    fn stop_reading(&mut self) {
        self.source_done = true;
        self.reader = None;
    }

    /// Cancels stream `stream`: nothing more is read or run again; what was to run again
    /// counts as cancelled now, what runs as it ends (the caller ends those tasks).
    pub(super) fn cancel(&mut self, stream: u32, dispatch: &mut Dispatcher) {
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

    /// The task of line `line` (its `command`) is not run, for `why`: it fails, named with its
    /// number; the rest of the stream runs.
    async fn not_run(&mut self, line: u64, command: &str, why: &str) {
        self.done += 1;
        self.failed += 1;
        if self.exit_code == 0 {
            self.exit_code = 1;
        }
        let said = format!("task {line}: not run, {why}: {}", escape(command));
        self.feed.say(said).await;
        let result = serde_json::json!({
            "task": line, "host": null, "exit": null, "wall_s": 0.0,
            "end_s": (self.t0.elapsed().as_secs_f64() * 1e3).round() / 1e3,
            "runs": 0, "command": command, "error": why,
        });
        self.feed.result(&format!("{result}\n")).await;
    }
}

/// Why a stream cannot run `spec` on `board`'s hosts, if it cannot; `jobs`: whether it can
/// run tasks of several ranks or of MPI (it has a socket for their jobs).
fn cannot_run(spec: &TaskSpec, board: &JobBoard, jobs: bool) -> Option<String> {
    if spec.is_job() && !jobs {
        return Some(
            "tasks of several ranks or of MPI need a socket for their jobs, and greedyrun could not make one (run with -v to see why)".into(),
        );
    }
    if spec.is_job() {
        let room = board.rank_room(spec.cores_per_rank);
        return (u64::from(spec.ranks) > room).then(|| {
            format!(
                "it needs {} ranks of {} slots and the hosts have room for {room}",
                spec.ranks, spec.cores_per_rank
            )
        });
    }
    let largest = board.largest_host();
    (spec.slots() > u64::from(largest)).then(|| {
        format!(
            "it needs {} slots on one host and the largest host has {largest}",
            spec.slots()
        )
    })
}

/// Prints one of greedyrun's own diagnostic lines.
fn log(line: String) {
    eprintln!("greedyrun: {line}");
}

/// Hosts named in full when a new stream is told of the hosts lost before it.
const LOST_NAMED: usize = 5;

/// What a new stream is told of the hosts lost before it (`lost`, in words, oldest first):
/// the latest few by name, the news to a client that may have been told of the others;
/// `None` if none.
fn lost_before(lost: &[String]) -> Option<String> {
    let (earlier, latest) = lost.split_at(lost.len().saturating_sub(LOST_NAMED));
    let more = match earlier.len() {
        0 => String::new(),
        n => format!("; and {n} before them (the session's log names them)"),
    };
    (!latest.is_empty()).then(|| {
        format!(
            "this session has lost {} of its hosts before this stream: {}{more}",
            lost.len(),
            latest.join("; ")
        )
    })
}

/// The name of host `node` of `plan` (empty if there is none).
fn host(plan: &Plan, node: u32) -> String {
    plan.hosts.get(node as usize).cloned().unwrap_or_default()
}

/// The task streams being run on a launched tree, with one method per event of the loop
/// that runs them: greedyrun's own stream's ([`crate::tasks::run`]) or a session's
/// ([`super::daemon`]), which shares the slots with its jobs.
pub(crate) struct Streams<'a> {
    pub(super) plan: &'a Plan,
    verbose: bool,
    /// A session's: how long it waits for a client before it ends. `None` for greedyrun's own
    /// stream, whose end ends the run.
    idle: Option<Duration>,
    pub(super) t0: Instant,
    pub(super) board: Arc<JobBoard>,
    pub(super) fanout: Arc<Fanout>,
    pub(super) dispatch: Dispatcher,
    /// Every stream's lines come through one queue, a line per free slot.
    line_tx: mpsc::Sender<Read>,
    pub(super) streams: BTreeMap<u32, Current>,
    next_stream: u32,
    pub(super) hello_at: Vec<Option<Duration>>,
    /// The run's exit code so far.
    code: i32,
    /// No stream is taken or line read any more: the agents shut down or tear down.
    pub(super) ending: bool,
    end_deadline: Option<Instant>,
    /// Its tasks of several ranks or of MPI, each a job through a client of its own (none if
    /// there is no socket for their jobs).
    job_tasks: Option<JobTasks>,
    /// The files staged to the hosts (tasks' inputs, jobs' `--bcast` files: the jobs served
    /// beside this loop share it).
    pub(super) stager: Arc<tokio::sync::Mutex<Stager>>,
    /// The tasks' output files coming back.
    collector: Collector,
    launch_deadline: Instant,
    pub(super) launch_over: bool,
    pub(super) idle_since: Instant,
    /// The fewest hosts up or starting the run goes on with.
    min_hosts: usize,
    /// Each host lost so far, in words: a session tells every new stream.
    lost: Vec<String>,
}

impl<'a> Streams<'a> {
    /// No stream yet on the tree `fanout` started for `plan` at `t0`, in `board`'s slots;
    /// `idle` is a session's ([`Streams::idle`]).
    pub(crate) fn new(
        plan: &'a Plan,
        verbose: bool,
        idle: Option<Duration>,
        t0: Instant,
        board: Arc<JobBoard>,
        fanout: Arc<Fanout>,
        line_tx: mpsc::Sender<Read>,
    ) -> Streams<'a> {
        Streams {
            plan,
            verbose,
            idle,
            t0,
            dispatch: Dispatcher::new(board.clone()),
            board,
            fanout,
            line_tx,
            streams: BTreeMap::new(),
            next_stream: 0,
            hello_at: vec![None; plan.hosts.len()],
            code: 0,
            ending: false,
            end_deadline: None,
            job_tasks: None,
            stager: Arc::default(),
            collector: Collector::default(),
            launch_deadline: t0 + plan.timeout,
            launch_over: false,
            idle_since: Instant::now(),
            min_hosts: 1,
            lost: Vec::new(),
        }
    }

    /// The run ends once fewer than `hosts` hosts are up or still starting (`--min-hosts`).
    pub(crate) fn keep_at_least(&mut self, hosts: usize) {
        self.min_hosts = hosts.max(1);
    }

    /// Whether this runs a session's streams.
    pub(super) fn session(&self) -> bool {
        self.idle.is_some()
    }

    /// The streams run tasks of several ranks or of MPI as jobs, through `jobs`' clients.
    pub(crate) fn run_job_tasks(&mut self, jobs: JobTasks) {
        self.job_tasks = Some(jobs);
    }

    /// Sends task `id`, placed `at`, there: to its agent, or to a client of its own if it is
    /// a job.
    async fn send_task(&mut self, id: TaskId, spec: TaskSpec, at: Placement) {
        let Some(staged) = self.stage(id, &spec).await else {
            return;
        };
        if let (Some(jobs), true) = (&mut self.job_tasks, spec.is_job()) {
            return jobs.start(id, &spec, (&at, &self.plan.hosts), staged);
        }
        let spec = Box::new(spec);
        let cmd = Cmd::Task { id, spec, staged };
        self.fanout.route(Some(at.host()), cmd).await;
    }

    /// Task `id`'s inputs on every host, each file sent once per content, said on its
    /// stream; `None` if one cannot be (the task fails, named, and its slots are free).
    async fn stage(&mut self, id: TaskId, spec: &TaskSpec) -> Option<Vec<Staged>> {
        if spec.inputs.is_empty() {
            return Some(Vec::new());
        }
        let staged = self.stager.lock().await.stage(spec, &self.fanout).await;
        let Some(cur) = self.streams.get_mut(&id.stream) else {
            self.dispatch.forget(id);
            return None;
        };
        match staged {
            Ok((staged, said)) => {
                for line in said {
                    cur.feed.say(line).await;
                }
                Some(staged)
            }
            Err(why) => {
                self.dispatch.forget(id);
                cur.not_run(id.line, &spec.run.display(), &why).await;
                None
            }
        }
    }

    /// Hosts `hosts` are lost (the board was told): their tasks run again elsewhere; how many.
    fn move_tasks_off(&mut self, hosts: std::ops::Range<u32>) -> usize {
        let moved = self.dispatch.hosts_lost(hosts);
        if let Some(jobs) = &self.job_tasks {
            jobs.forget(&moved);
        }
        moved.len()
    }

    /// Runs `stream` (already reading into [`Current::local`]'s queue) as the next stream,
    /// a failed task of it at most `retries` more times.
    pub(crate) fn adopt(&mut self, stream: Current, retries: u32) {
        let id = self.next_stream;
        self.next_stream += 1;
        self.dispatch.open_stream(id, retries);
        self.streams.insert(id, stream);
    }

    /// Runs a client's stream of `lines`, its output to `feed`, which is told first of the
    /// hosts the session has lost.
    pub(super) async fn open(
        &mut self,
        mut feed: Feed,
        lines: LineSource,
        retries: u32,
        defaults: Defaults,
        tag: bool,
        progress: Duration,
    ) {
        if let Some(text) = lost_before(&self.lost) {
            feed.say(text).await;
        }
        let stream = self.next_stream;
        self.next_stream += 1;
        self.dispatch.open_stream(stream, retries);
        let reader = read_lines(stream, lines, self.line_tx.clone());
        let cur = Current::new(feed, reader, defaults, tag, progress);
        self.streams.insert(stream, cur);
    }

    /// Before each wait: free slots first take what must run again, then streams that are
    /// done end, and with no host left everything ends. Whether to take a line now (new lines
    /// are read in the wait, so a source slow to give them never holds the rest).
    pub(crate) async fn step(&mut self) -> bool {
        self.run_again().await;
        let want_line = !self.ending
            && self.dispatch.has_free_slot()
            && self.streams.values().any(|c| !c.source_done);
        self.end_done().await;
        self.end_if_stranded().await;
        want_line
    }

    /// Tasks waiting to run (retries, lost hosts' tasks, a task whose slots were not free)
    /// into free slots, in order; the first that can never fit fails.
    async fn run_again(&mut self) {
        while !self.ending {
            if let Some(task) = self.dispatch.take_unplaceable() {
                let why = format!(
                    "no host left has the {} slots it needs",
                    task.spec.slot_count()
                );
                if let Some(cur) = self.streams.get_mut(&task.id.stream) {
                    (cur.not_run(task.id.line, &task.spec.run.display(), &why)).await;
                }
                continue;
            }
            let Some((task, to)) = self.dispatch.place_again() else {
                break;
            };
            if !self.streams.contains_key(&task.id.stream) {
                log(format!(
                    "task {} of a stream that has ended: dropped",
                    task.id.line
                ));
                self.dispatch.forget(task.id);
                continue;
            }
            self.send_task(task.id, task.spec, to).await;
        }
    }

    /// Ends the streams whose lines are read and whose tasks all ended; greedyrun's own
    /// stream ending ends the run.
    async fn end_done(&mut self) {
        let over: Vec<u32> = (self.streams.iter())
            .filter(|&(&s, c)| c.source_done && self.dispatch.idle(s))
            .map(|(&s, _)| s)
            .collect();
        for stream in over {
            let cur = self.streams.remove(&stream).expect("listed");
            self.dispatch.close_stream(stream);
            let code = cur.exit_code;
            if self.verbose {
                log(format!(
                    "{} tasks ended ({} failed) in {:.3} s",
                    cur.done,
                    cur.failed,
                    cur.t0.elapsed().as_secs_f64()
                ));
            }
            cur.end(code).await;
            self.idle_since = Instant::now();
            if !self.session() && !self.ending {
                self.code = code;
                self.end_run(Cmd::Shutdown).await;
            }
        }
    }

    /// With fewer hosts left than the run goes on with (none, by default), every stream
    /// ends, naming what did not run.
    async fn end_if_stranded(&mut self) {
        let hosts = self.board.hosts_left(self.launch_over, self.min_hosts);
        if self.ending || hosts >= self.min_hosts {
            return;
        }
        let left = self.dispatch.drain();
        let why = match hosts {
            0 => "no host left to run tasks".to_string(),
            _ => format!(
                "{hosts} of {} hosts left, fewer than --min-hosts {}",
                self.plan.hosts.len(),
                self.min_hosts
            ),
        };
        let text = format!("{why}: {} tasks not run", left.len());
        for (&stream, cur) in self.streams.iter_mut() {
            let mut said = text.clone();
            if !cur.source_done {
                said += &format!("; the stream is not read past line {}", cur.line_no);
            }
            cur.feed.say(said).await;
            for task in left.iter().filter(|t| t.id.stream == stream) {
                cur.feed
                    .say(format!(
                        "task {} not run: {}",
                        task.id.line,
                        task.spec.label()
                    ))
                    .await;
            }
            cur.exit_code = code::LAUNCHER;
            cur.stop_reading();
        }
        log(text);
        self.code = code::LAUNCHER;
        self.end_run(Cmd::Teardown).await;
        for (_, cur) in std::mem::take(&mut self.streams) {
            let code = cur.exit_code;
            cur.end(code).await;
        }
    }

    /// Ends the run: `cmd` (`Shutdown` or `Teardown`) to every agent, which get until the
    /// deadline to say bye before their remote shells are killed.
    pub(super) async fn end_run(&mut self, cmd: Cmd) {
        let patience = match cmd {
            Cmd::Teardown => self.plan.grace + TEARDOWN_LINGER,
            _ => SHUTDOWN_TIMEOUT,
        };
        self.ending = true;
        if let (Cmd::Teardown, Some(jobs)) = (&cmd, &self.job_tasks) {
            jobs.end(None);
        }
        self.fanout.route(None, cmd).await;
        self.end_deadline = Some(Instant::now() + patience);
    }

    /// A line of `stream` was read (or its end, or why not).
    pub(crate) async fn on_line(&mut self, stream: u32, line: Line) {
        // A line of a stream cancelled meanwhile is not run.
        let Some(cur) = self.streams.get_mut(&stream).filter(|c| !c.source_done) else {
            return;
        };
        match line {
            Ok(Some(Err(bytes))) => {
                cur.line_no += 1;
                let text = String::from_utf8_lossy(&bytes);
                cur.not_run(cur.line_no, &text, "the line is not UTF-8 text")
                    .await;
            }
            Ok(Some(Ok(line))) => {
                cur.line_no += 1;
                if line.trim().is_empty() {
                    return;
                }
                let spec = match task_spec::parse(&line, &cur.defaults) {
                    Ok(spec) => spec,
                    Err(e) => return cur.not_run(cur.line_no, &line, &e.to_string()).await,
                };
                let jobs = self.job_tasks.is_some();
                if let Some(why) = cannot_run(&spec, &self.board, jobs) {
                    return cur.not_run(cur.line_no, &spec.run.display(), &why).await;
                }
                let id = TaskId {
                    stream,
                    line: cur.line_no,
                };
                let task = Task {
                    id,
                    spec: spec.clone(),
                    failures: 0,
                };
                if let Some(to) = self.dispatch.assign(task, 0) {
                    self.send_task(id, spec, to).await;
                }
            }
            Ok(None) => cur.stop_reading(),
            Err(e) => {
                let line_no = cur.line_no;
                (cur.feed)
                    .say(format!("reading the tasks after line {line_no}: {e}"))
                    .await;
                cur.stop_reading();
                cur.exit_code = code::USAGE;
            }
        }
    }

    /// A frame from the tree.
    pub(crate) async fn on_up(&mut self, up: Up) {
        let plan = self.plan;
        match up {
            Up::Hello { node } => {
                if let Some(slot) = self.hello_at.get_mut(node as usize)
                    && slot.is_none()
                {
                    *slot = Some(self.t0.elapsed());
                }
                self.board.host_up(node);
            }
            Up::TaskOutput { id, stream, data } => {
                if let Some(cur) = self.streams.get_mut(&id.stream) {
                    let bytes = match cur.tagger.as_mut() {
                        Some(t) => t.tag_task(id.line, stream, &data),
                        None => data.to_vec(),
                    };
                    cur.feed.output(stream, &bytes).await;
                }
            }
            Up::TaskFile {
                id,
                path,
                offset,
                data,
                last,
            } => {
                let shown = path.clone();
                let written = self.collector.chunk(id, path, offset, &data, last);
                if let (Err(e), Some(cur)) = (written, self.streams.get_mut(&id.stream)) {
                    let text = format!("task {}: output {}: {e}", id.line, escape(&shown));
                    cur.feed.say(text).await;
                }
            }
            Up::TaskFileLeft { node, id, path } => {
                (self.collector).left(id, format!("{}:{path}", host(plan, node)));
            }
            Up::StageAgain { node, id } => {
                let again = self.stager.lock().await.again(node, id, &self.fanout).await;
                log(format!("{}: a staged input {again}", host(plan, node)));
            }
            Up::TaskEnd {
                node,
                id,
                end,
                wall_us,
            } => self.task_ended(node, id, end, wall_us).await,
            Up::Lost { node, by, what } => self.lost(node, by, &escape(&what)).await,
            Up::Failed { node, what, .. } => {
                let what = escape(&what);
                self.board.hosts_lost(node..node + 1, &what).await;
                let moved = self.move_tasks_off(node..node + 1);
                log(format!(
                    "{}: {what}; out of the streams, {moved} tasks run again elsewhere",
                    host(plan, node)
                ));
            }
            Up::Note { node, text } => {
                if self.verbose || !self.ending {
                    log(format!("{}: {}", host(plan, node), escape(&text)));
                }
            }
            Up::Unclean { node, what } => log(format!(
                "could not clean up {} after its agent failed to start, so what its remote shell started there may still run: {}",
                host(plan, node),
                escape(&what)
            )),
            Up::Job { job, frame } => job_frame(&self.board, job, &frame),
            Up::Names {
                node,
                ticket,
                request,
            } => {
                let answers = self
                    .board
                    .names()
                    .ask(node, ticket, request, Instant::now());
                self.send_names(answers).await;
            }
            Up::Bye { .. }
            | Up::Output { .. }
            | Up::Exit { .. }
            | Up::Spawn { .. }
            | Up::ChildAdded { .. }
            | Up::ChildStarted { .. }
            | Up::ChildOutput { .. }
            | Up::ChildExit { .. }
            | Up::Spoke { .. }
            | Up::Address { .. }
            | Up::Aborted { .. }
            | Up::StdinTaken { .. }
            | Up::Ping => {}
        }
    }

    /// Task `id` ended on `node`: counted and reported once, or run again.
    async fn task_ended(&mut self, node: u32, id: TaskId, end: RankEnd, wall_us: u64) {
        let plan = self.plan;
        match self.dispatch.ended(node, id, end, wall_us) {
            Ended::Done(d) => {
                let Some(cur) = self.streams.get_mut(&id.stream) else {
                    return;
                };
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
                    let runs = match d.runs {
                        1 => "1 run".to_string(),
                        n => format!("{n} runs"),
                    };
                    let text = format!(
                        "task {} on {} ended with {} after {runs}: {}",
                        id.line,
                        host(plan, d.at.host()),
                        d.end.code(),
                        d.task.spec.label()
                    );
                    cur.feed.say(text).await;
                }
                let end_s = cur.t0.elapsed().as_secs_f64();
                let outputs = self.collector.take(id);
                (cur.feed)
                    .result(&result_line(&d, &plan.hosts, end_s, &outputs))
                    .await;
            }
            Ended::Retry => {
                // What the failed run sent back is not the task's result.
                self.collector.take(id);
                if self.verbose {
                    log(format!(
                        "task {} of stream {} on {} ended with {}: running it again",
                        id.line,
                        id.stream,
                        host(plan, node),
                        end.code()
                    ));
                }
            }
            Ended::Collect { cwd, outputs } => {
                let cmd = Cmd::TaskOutputs {
                    id,
                    cwd,
                    outputs,
                    end,
                    wall_us,
                };
                self.fanout.route(Some(node), cmd).await;
            }
            Ended::Stale => {}
        }
    }

    /// `node` was lost: its tasks run again elsewhere.
    async fn lost(&mut self, node: u32, by: Option<u32>, what: &str) {
        // Only this host: its parent reports each host cut off with it and starts the rest of
        // its launch subtree itself (`fanout`).
        self.board.hosts_lost(node..node + 1, what).await;
        let moved = self.move_tasks_off(node..node + 1);
        let by = (by.map(|b| format!(" (started by {})", host(self.plan, b)))).unwrap_or_default();
        let named = format!("host {}{by} lost: {what}", host(self.plan, node));
        let text =
            format!("{named}; it leaves the streams, {moved} of its tasks run again elsewhere");
        self.lost.push(named);
        if self.streams.is_empty() || self.ending {
            log(text);
        } else {
            for cur in self.streams.values_mut() {
                cur.feed.say(text.clone()).await;
            }
        }
    }

    /// A signal: the streams are cancelled, or once ending, the remote shells killed. Whether
    /// the loop ends now.
    pub(crate) async fn on_signal(&mut self, sig: Signal) -> bool {
        match sig {
            // A session outlives the terminal it was started from.
            Signal::SIGHUP if self.session() => false,
            _ if self.ending => {
                self.fanout.kill_all();
                true
            }
            sig => {
                if sig == Signal::SIGINT {
                    log(format!(
                        "interrupted: {} tasks running are ended",
                        self.dispatch.running()
                    ));
                }
                for (&stream, cur) in self.streams.iter_mut() {
                    cur.cancel(stream, &mut self.dispatch);
                }
                self.code = 128 + crate::signals::number(sig);
                self.end_run(Cmd::Teardown).await;
                false
            }
        }
    }

    /// Sends the session name table's answers to the hosts that asked.
    async fn send_names(&self, answers: Vec<super::names::Answer>) {
        for (node, ticket, response) in answers {
            let cmd = Cmd::Names { ticket, response };
            self.fanout.route(Some(node), cmd).await;
        }
    }

    /// The loop's tick: the launch deadline, a session's idleness, the streams' clients and
    /// progress lines, the end deadline, the name table's waiting lookups.
    pub(crate) async fn on_tick(&mut self) {
        let now = Instant::now();
        let late = self.board.names().expire(now);
        self.send_names(late).await;
        if !self.launch_over && now >= self.launch_deadline {
            self.launch_over = true;
            let n = self.plan.hosts.len();
            let missing: Vec<&String> = (0..n)
                .filter(|&i| self.hello_at[i].is_none())
                .map(|i| &self.plan.hosts[i])
                .collect();
            if !missing.is_empty() {
                log(format!(
                    "no agent from {} after {} s: the stream runs without them",
                    greedy_tree::hostlist::compress(&missing),
                    self.plan.timeout.as_secs_f64()
                ));
            }
        }
        if self.board.running().0 > 0 {
            self.idle_since = now;
        }
        if let (Some(idle), true, false) = (self.idle, self.streams.is_empty(), self.ending)
            && self.idle_since.elapsed() >= idle
        {
            log(format!(
                "no stream for {} s: the session ends",
                idle.as_secs_f64()
            ));
            self.end_run(Cmd::Shutdown).await;
        }
        self.tick_streams(now).await;
        if let Some(d) = self.end_deadline
            && now >= d
        {
            self.fanout.kill_all();
            self.end_deadline = None;
        }
    }

    /// Each stream's client still there (else its stream is cancelled), and its progress line.
    async fn tick_streams(&mut self, now: Instant) {
        let session = self.session();
        for (&stream, cur) in self.streams.iter_mut() {
            // A client that went away mid-stream ends its stream: its running tasks are
            // ended, nothing more is read, and the other streams run on. greedyrun's own
            // stream whose stdout closed (`| head -1`) ends as SIGPIPE ends a job.
            if !cur.dropped {
                if session {
                    cur.feed.send(frame::KEEPALIVE, &[]).await;
                }
                if cur.feed.gone() {
                    if session {
                        log(format!(
                            "the client of stream {stream} went away or stopped reading: its {} running tasks are ended",
                            self.dispatch.running_of(stream)
                        ));
                    } else {
                        cur.exit_code = code::BROKEN_PIPE;
                    }
                    cur.dropped = true;
                    cur.cancel(stream, &mut self.dispatch);
                    self.fanout.route(None, Cmd::CancelTasks { stream }).await;
                    if let Some(jobs) = &self.job_tasks {
                        jobs.end(Some(stream));
                    }
                }
            }
            if !cur.progress.is_zero() && now >= cur.next_progress {
                cur.next_progress = now + cur.progress;
                let rate = cur.done as f64 / cur.t0.elapsed().as_secs_f64().max(1e-9);
                let line = format!(
                    "tasks: {} done ({} failed), {} running, {rate:.1} tasks/s",
                    cur.done,
                    cur.failed,
                    self.dispatch.running_of(stream)
                );
                cur.feed.say(line).await;
            }
        }
    }

    /// The loop ended: the streams left end, each with its code; the run's exit code and
    /// when each host said hello.
    pub(crate) async fn finish(mut self) -> (i32, Vec<Option<Duration>>) {
        for (_, cur) in std::mem::take(&mut self.streams) {
            // An interrupt decides (the tasks it ended failed because of it); else the
            // stream's.
            let code = match self.code {
                129 | 130 | 143 => self.code,
                _ if cur.exit_code != 0 => cur.exit_code,
                _ => self.code,
            };
            if !self.session() {
                self.code = code;
            }
            cur.end(code).await;
        }
        (self.code, self.hello_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_stream_is_told_the_hosts_lost_before_it_the_latest_by_name() {
        assert_eq!(lost_before(&[]), None);
        let one = vec!["host n3 lost: gone".to_string()];
        assert_eq!(
            lost_before(&one).unwrap(),
            "this session has lost 1 of its hosts before this stream: host n3 lost: gone"
        );
        let many: Vec<String> = (1..=8).map(|i| format!("host n{i} lost: x")).collect();
        let text = lost_before(&many).unwrap();
        assert!(
            text.starts_with("this session has lost 8 of its hosts"),
            "{text}"
        );
        assert!(
            text.contains("host n4 lost")
                && text.contains("host n8 lost")
                && !text.contains("host n3"),
            "{text}"
        );
        assert!(
            text.ends_with("; and 3 before them (the session's log names them)"),
            "{text}"
        );
    }

    #[test]
    fn result_lines_are_json_with_the_command_escaped() {
        let d = Done {
            task: Task {
                id: TaskId { stream: 3, line: 7 },
                spec: TaskSpec {
                    name: Some("n-7".into()),
                    ..TaskSpec::plain("echo \"a\tb\"".into(), &Defaults::default())
                },
                failures: 0,
            },
            at: Placement(vec![(0, 1)]),
            end: RankEnd::Signaled(9),
            wall_us: 1_500_000,
            runs: 1,
            cancelled: false,
        };
        let v: serde_json::Value =
            serde_json::from_str(&result_line(&d, &["n1".into()], 2.3456, &[])).unwrap();
        assert_eq!(v["end_s"], 2.346);
        assert_eq!(v["task"], 7);
        assert_eq!(v["exit"], 137);
        assert_eq!(v["wall_s"], 1.5);
        assert_eq!(v["command"], "echo \"a\tb\"");
        assert_eq!(v["host"], "n1");
        assert_eq!(v["name"], "n-7");
        assert!(v.get("rank_hosts").is_none());
        // A job task's ranks, spanning hosts: each rank's host.
        let d = Done {
            at: Placement(vec![(1, 2), (0, 1)]),
            task: Task {
                spec: TaskSpec {
                    ranks: 3,
                    ..d.task.spec.clone()
                },
                ..d.task
            },
            ..d
        };
        let hosts = ["n1".to_string(), "n2".to_string()];
        let v: serde_json::Value =
            serde_json::from_str(&result_line(&d, &hosts, 1.0, &["o".into()])).unwrap();
        assert_eq!(v["host"], "n2");
        assert_eq!(v["rank_hosts"], serde_json::json!(["n2", "n2", "n1"]));
        assert_eq!(v["outputs"], serde_json::json!(["o"]));
    }
}
