//! greedyrun's side of a job: launch position 0 of the tree, the terminal, and the verdict.
//!
//! greedyrun starts its children of the launch tree like any agent ([`Fanout`]), then runs one
//! event loop over: frames from the tree (hello, output, exits, losses, addresses to route),
//! its own stdin (to the stdin rank), SIGINT/SIGTERM/SIGHUP, and a 1 s tick for the progress line
//! and the named deadlines (`--timeout` for the launch, grace + linger for the teardown).
//! [`JobStatus`] decides; this module only carries out.

use std::{
    collections::HashMap,
    io::ErrorKind,
    sync::Arc,
    time::{Duration, Instant},
};

use greedy_pmix::WallTime;
use greedy_tree::Tree;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::{Semaphore, mpsc},
};
use tracing::debug;

use crate::{
    children::{Children, Limits, Step},
    fanout::{EdgeConfig, Fanout},
    heartbeat::Heartbeat,
    limits::{SHUTDOWN_TIMEOUT, TEARDOWN_LINGER, UP_CAPACITY},
    plan::Plan,
    proto::{BcastFile, BindTo, Cmd, PROTOCOL_VERSION, RankEnd, Start, Stream, Up},
    status::{JobStatus, Singletons, Verdict, code},
    stdio::Tagger,
    terminal::escape,
};

/// Chunks of rank output queued for greedyrun's stdout before the loop stops reading frames
/// (the tree's backpressure) — but never stops handling signals and deadlines.
const STDOUT_QUEUE: usize = 64;
/// Chunks of stdin (up to 64 KiB each) on their way to the stdin rank and not yet written to
/// its pipe ([`Up::StdinTaken`]): all of stdin's buffering, at every hop. Four keep a pipe
/// busy while `yes | greedyrun … sleep` holds at most 256 KiB anywhere; unbounded, greedyd
/// grew by half a GB a second.
const STDIN_WINDOW: usize = 4;
/// After an interrupt or a failure, how long queued output may take to reach a stdout that
/// is not being read before greedyrun exits anyway.
const STDOUT_DRAIN: Duration = Duration::from_secs(1);

/// Writes rank output to stdout, chunk by chunk, until the queue closes or a write fails.
async fn write_stdout(mut chunks: mpsc::Receiver<Vec<u8>>) -> std::io::Result<()> {
    let mut stdout = tokio::io::stdout();
    while let Some(chunk) = chunks.recv().await {
        stdout.write_all(&chunk).await?;
        stdout.flush().await?;
    }
    Ok(())
}

/// Everything greedyrun decided before the launch.
#[derive(Debug, Clone)]
pub struct JobConfig {
    /// The validated plan.
    pub plan: Plan,
    /// Remote shell words.
    pub rsh: Vec<String>,
    /// Agent command words.
    pub agent: Vec<String>,
    /// Retries of a remote shell refused by sshd.
    pub retries: u32,
    /// Prefix output lines with the rank.
    pub tag_output: bool,
    /// Forward output in the chunks it was read, not in whole lines (`--unbuffered`).
    pub unbuffered: bool,
    /// A failing rank does not end the job.
    pub keep_going: bool,
    /// Rank that gets greedyrun's stdin.
    pub stdin_rank: Option<u32>,
    /// What each local rank is bound to.
    pub bind: BindTo,
    /// Progress line period during the launch; zero disables it.
    pub progress: Duration,
    /// Environment of the ranks.
    pub env: Vec<(String, String)>,
    /// Working directory of the ranks.
    pub cwd: String,
    /// Print launch timings to stderr.
    pub verbose: bool,
    /// Do not print rank output (calibration).
    pub quiet: bool,
    /// Spawned children may take more processes than the hosts' free slots.
    pub oversubscribe: bool,
    /// Files copied to every host before the ranks start (`--bcast`).
    pub bcast: Vec<BcastFile>,
    /// Silence after which a host is lost (`--lost-after`; zero: never).
    pub lost_after: Duration,
}

/// What a finished job reports.
#[derive(Debug, Clone)]
pub struct Report {
    /// greedyrun's exit code.
    pub exit_code: i32,
    /// When each host's agent said hello, since the start.
    pub hello_at: Vec<Option<Duration>>,
    /// When the last rank ended (launch to finish), if all did.
    pub finished_at: Option<Duration>,
}

impl Report {
    /// A job of `hosts` hosts that ends with `exit_code` before any host said hello.
    pub(crate) fn unlaunched(exit_code: i32, hosts: usize) -> Report {
        Report {
            exit_code,
            hello_at: vec![None; hosts],
            finished_at: None,
        }
    }
}

/// The Start frame of a job (`tasks`: a task stream, whose hosts start no ranks): a fresh
/// secret and job id, the plan, and `launch_sizes` left for each edge to fill.
pub(crate) fn start_frame(cfg: &JobConfig, tasks: bool) -> Start {
    let plan = &cfg.plan;
    // Unique enough for tracing and the PMI kvsname: greedyrun's pid and start time.
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() % 1_000_000)
        .unwrap_or(0);
    Start {
        version: PROTOCOL_VERSION,
        job_id: format!("greedy{}.{started}", std::process::id()),
        node_idx: 0,
        hosts: plan.hosts.clone(),
        ranks: plan.ranks.clone(),
        launch_sizes: Vec::new(),
        apps: plan.apps.clone(),
        env: cfg.env.clone(),
        cwd: cfg.cwd.clone(),
        rsh: cfg.rsh.clone(),
        agent: cfg.agent.clone(),
        batch: plan.batch,
        retries: cfg.retries,
        hello_timeout_s: plan.timeout.as_secs_f64(),
        grace_s: plan.grace.as_secs_f64(),
        lost_after_s: cfg.lost_after.as_secs_f64(),
        model: plan.model,
        pmi: plan.pmi,
        secret: greedy_pmix::JobSecret::generate(),
        stdin_rank: cfg.stdin_rank,
        bind: cfg.bind,
        log: String::new(),
        tasks,
        unbuffered: cfg.unbuffered,
        universe: plan.slots.iter().sum(),
        bcast: if tasks { Vec::new() } else { cfg.bcast.clone() },
    }
}

/// Starts greedyrun's children along the plan's launch tree (position 0 is greedyrun), each
/// sent `start`; their frames come up on `up`.
pub(crate) fn launch(cfg: &JobConfig, start: &Start, up: mpsc::Sender<Up>) -> Fanout {
    let plan = &cfg.plan;
    Fanout::start(
        start,
        &plan.launch,
        0..plan.hosts.len() + 1,
        EdgeConfig {
            rsh: cfg.rsh.clone(),
            agent: cfg.agent.clone(),
            batch: plan.batch,
            retries: cfg.retries,
            hello_timeout: plan.timeout,
            heartbeat: Heartbeat::new(start.lost_after_s),
            by: None,
        },
        up,
    )
}

/// Where greedyrun's commands go: down its own remote shells, or to a session that runs the
/// job on the agents it keeps ([`crate::session`]).
enum Edges {
    Tree(Fanout),
    Session(crate::session::client::JobLink),
}

impl Edges {
    async fn route(&self, to: Option<u32>, cmd: Cmd) {
        match self {
            Edges::Tree(f) => f.route(to, cmd).await,
            Edges::Session(l) => l.route(to, cmd),
        }
    }

    fn kill_all(&self) {
        match self {
            Edges::Tree(f) => f.kill_all(),
            Edges::Session(l) => l.kill_all(),
        }
    }

    /// The session's placements of spawned children (none for our own tree, where greedyrun
    /// places them itself).
    fn placements(&self) -> Option<mpsc::Receiver<crate::session::client::Placement>> {
        match self {
            Edges::Tree(_) => None,
            Edges::Session(l) => l.placements(),
        }
    }

    /// Every rank ended and the shutdown is sent: whether greedyrun may end now. A session
    /// sees its agents through the shutdown itself; our own remote shells must say bye first.
    async fn leave_finished(&self) -> bool {
        match self {
            Edges::Tree(_) => false,
            Edges::Session(l) => {
                l.detach().await;
                true
            }
        }
    }
}

/// Runs a job to its end; prints its output and the one-line diagnostics.
pub async fn run(cfg: JobConfig) -> Report {
    let (up_tx, up_rx) = mpsc::channel::<Up>(UP_CAPACITY);
    let start = start_frame(&cfg, false);
    let fanout = launch(&cfg, &start, up_tx);
    drive(cfg, start, Edges::Tree(fanout), up_rx).await
}

/// Runs a job to its end on the session `attached` connects to: the same job, output and
/// verdict as [`run`], on agents that are already up.
pub async fn run_attached(cfg: JobConfig, attached: crate::session::Attached) -> Report {
    let start = start_frame(&cfg, false);
    match attached.start(&start).await {
        Ok((link, up_rx)) => drive(cfg, start, Edges::Session(link), up_rx).await,
        Err(why) => {
            eprintln!("greedyrun: {why}");
            Report::unlaunched(code::LAUNCHER, cfg.plan.hosts.len())
        }
    }
}

/// The job's spawned children, on the plan's slots.
fn children_of(cfg: &JobConfig, start: &Start) -> Children {
    let plan = &cfg.plan;
    let path = (cfg.env.iter())
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone());
    let limits = Limits {
        slots: plan.slots.clone(),
        oversubscribe: cfg.oversubscribe,
        timeout: plan.timeout,
        path,
    };
    Children::new(&start.job_id, &plan.hosts, &plan.ranks, limits)
}

/// Prints one of greedyrun's own diagnostic lines.
fn say(line: String) {
    eprintln!("greedyrun: {line}");
}

/// Forwards greedyrun's stdin to the stdin rank's host, a chunk for each one taken there
/// ([`STDIN_WINDOW`]); `None` if no rank takes stdin.
fn forward_stdin(
    cfg: &JobConfig,
    fanout: Arc<Edges>,
    window: Arc<Semaphore>,
) -> Option<tokio::task::JoinHandle<()>> {
    let node = cfg.stdin_rank.and_then(|r| cfg.plan.node_of_rank(r))?;
    Some(tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match window.acquire().await {
                Ok(p) => p.forget(),
                Err(_) => break,
            }
            match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(k) => {
                    let b = bytes::Bytes::copy_from_slice(&buf[..k]);
                    fanout.route(Some(node as u32), Cmd::Stdin(b)).await;
                }
            }
        }
        fanout.route(Some(node as u32), Cmd::StdinEof).await;
    }))
}

/// The session's next placement of a spawned child; `None` when there are no more.
async fn next_placement(
    rx: &mut Option<mpsc::Receiver<crate::session::client::Placement>>,
) -> Option<crate::session::client::Placement> {
    rx.as_mut()?.recv().await
}

/// greedyrun's loop over a started job's frames, whatever its edges.
async fn drive(
    cfg: JobConfig,
    start: Start,
    edges: Edges,
    mut up_rx: mpsc::Receiver<Up>,
) -> Report {
    let t0 = Instant::now();
    let fanout = Arc::new(edges);
    let window = Arc::new(Semaphore::new(STDIN_WINDOW));
    let stdin_task = forward_stdin(&cfg, fanout.clone(), window.clone());
    // Its own task: a reader that stops reading (`greedyrun … | less`) must not stall
    // Ctrl-C and the deadlines, only the flow of frames.
    let (out_tx, out_rx) = mpsc::channel::<Vec<u8>>(STDOUT_QUEUE);
    let mut writer = tokio::spawn(write_stdout(out_rx));
    let mut placed = fanout.placements();
    let mut head = Head::new(&cfg, &start, t0, fanout, window);
    head.send_bcast(None, None);
    let mut stops = crate::signals::Stops::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        let verdict = tokio::select! {
            m = up_rx.recv(), if head.pending_out.is_none() => match m {
                None => break,
                Some(up) => head.on_up(up, &out_tx).await,
            },
            permit = out_tx.reserve(), if head.pending_out.is_some() => {
                match permit {
                    Ok(p) => p.send(head.pending_out.take().unwrap_or_default()),
                    Err(_) => head.pending_out = None,
                }
                Verdict::Continue
            }
            ended = &mut writer, if head.stdout_open => head.stdout_ended(ended),
            Some((child, ranks)) = next_placement(&mut placed), if placed.is_some() => {
                let step = head.children.placement(child, ranks, Instant::now());
                head.carry_step(step).await
            }
            Some(sent) = head.bcast.join_next(), if !head.bcast.is_empty() => head.bcast_sent(sent),
            sig = stops.recv() => head.on_signal(sig),
            _ = tick.tick() => match head.on_tick().await {
                Some(verdict) => verdict,
                None => break,
            },
        };
        if head.carry_out(verdict).await {
            break;
        }
    }
    if let Some(t) = stdin_task {
        t.abort();
    }
    drop(out_tx);
    head.finish(writer, stops).await
}

/// greedyrun's state during a job, with one method per event of [`drive`]'s loop.
struct Head<'a> {
    cfg: &'a JobConfig,
    t0: Instant,
    /// The job runs on a session's agents.
    attached: bool,
    fanout: Arc<Edges>,
    overlay_tree: Tree,
    /// Chunks of stdin the stdin rank's host may still take.
    window: Arc<Semaphore>,
    status: JobStatus,
    singletons: Singletons,
    /// Spawned jobs: their placement, their start, their slots.
    children: Children,
    hello_at: Vec<Option<Duration>>,
    n_up: usize,
    finished_at: Option<Duration>,
    tagger: Tagger,
    /// The `--bcast` files being sent down the tree.
    bcast: tokio::task::JoinSet<Result<(), String>>,
    /// How often each host asked again for each of them.
    resent: HashMap<(u32, u64), u32>,
    /// A chunk the writer's queue did not take: no frame is read until it does.
    pending_out: Option<Vec<u8>>,
    dropped_out: usize,
    interrupted: bool,
    stderr: tokio::io::Stderr,
    stdout_open: bool,
    launch_deadline: Instant,
    next_progress: Instant,
    end_deadline: Option<Instant>,
    killed_at: Option<Instant>,
}

impl<'a> Head<'a> {
    fn new(
        cfg: &'a JobConfig,
        start: &Start,
        t0: Instant,
        fanout: Arc<Edges>,
        window: Arc<Semaphore>,
    ) -> Head<'a> {
        let plan = &cfg.plan;
        let n = plan.hosts.len();
        Head {
            cfg,
            t0,
            attached: matches!(*fanout, Edges::Session(_)),
            fanout,
            overlay_tree: greedy_pmix::overlay::tree(n, &start.model),
            window,
            status: JobStatus::new(plan.n_ranks, cfg.keep_going),
            singletons: Singletons::default(),
            children: children_of(cfg, start),
            hello_at: vec![None; n],
            n_up: 0,
            finished_at: None,
            tagger: Tagger::default(),
            bcast: tokio::task::JoinSet::new(),
            resent: HashMap::new(),
            pending_out: None,
            dropped_out: 0,
            interrupted: false,
            stderr: tokio::io::stderr(),
            stdout_open: true,
            launch_deadline: t0 + plan.timeout,
            next_progress: t0 + cfg.progress.max(Duration::from_millis(1)),
            end_deadline: None,
            killed_at: None,
        }
    }

    /// The name of host `node`.
    fn host(&self, node: u32) -> String {
        (self.cfg.plan.hosts.get(node as usize))
            .cloned()
            .unwrap_or_default()
    }

    /// A frame from the tree; rank output for stdout goes to `out`.
    async fn on_up(&mut self, up: Up, out: &mpsc::Sender<Vec<u8>>) -> Verdict {
        match up {
            Up::Hello { node } => self.on_hello(node),
            Up::Output { rank, stream, data } => self.on_output(rank, stream, &data, out).await,
            Up::Exit {
                rank,
                end,
                silent,
                at,
            } => return self.on_exit(rank, end, silent, at),
            Up::Spoke { node, family } => {
                if let Some(message) = self.singletons.spoke(&self.host(node), family) {
                    return self.status.launcher_failed(code::LAUNCHER, message);
                }
            }
            Up::Address { node, addr } => {
                for c in self.overlay_tree.children(node as usize) {
                    let cmd = Cmd::Address { node, addr };
                    self.fanout.route(Some(c as u32), cmd).await;
                }
            }
            Up::Lost { node, by, what } => return self.on_lost(node, by, &what),
            Up::Failed { node, code, what } => {
                let message = format!("{}: {}", self.host(node), escape(&what));
                return self.status.launcher_failed(code, message);
            }
            Up::Aborted { node, abort } => {
                // Named by the host where it started (a dead rank's), not the reporter's.
                let origin_node = u32::try_from(abort.origin_node).unwrap_or(node);
                let origin = self.host(origin_node);
                let mut message =
                    format!("{origin}: wire-up aborted: {}", escape(&abort.to_string()));
                if origin_node != node {
                    message += &format!(" (reported by {})", self.host(node));
                }
                return self.status.aborted(&abort, message);
            }
            Up::Note { node, text } => {
                // Once the job is ending, remote shells complain about connections that
                // the teardown closed ("Connection reset by peer"): noise, unless asked.
                if self.cfg.verbose || (self.end_deadline.is_none() && !self.status.tearing_down())
                {
                    say(format!("{}: {}", self.host(node), escape(&text)));
                }
            }
            Up::Bye { .. } => {}
            Up::ChildOutput {
                child,
                rank,
                stream,
                data,
            } => {
                let tag = (self.cfg.tag_output)
                    .then(|| self.tagger.tag_child(child, rank, stream, &data));
                self.write_output(stream, tag.unwrap_or_else(|| data.to_vec()), out)
                    .await;
            }
            up @ (Up::Spawn { .. }
            | Up::ChildAdded { .. }
            | Up::ChildStarted { .. }
            | Up::ChildExit { .. }) => return self.on_spawn_frame(up).await,
            Up::StdinTaken { .. } => self.window.add_permits(1),
            Up::StageAgain { node, id } => return self.stage_again(node, id),
            // Only a task stream's or a session's agents send these (session::streams).
            Up::TaskOutput { .. }
            | Up::TaskFile { .. }
            | Up::TaskFileLeft { .. }
            | Up::TaskEnd { .. }
            | Up::Job { .. }
            | Up::Names { .. } => {}
            // Each edge takes its child's pings (fanout); none comes this far.
            Up::Ping => {}
            Up::Unclean { node, what } => say(format!(
                "could not clean up {} after its agent failed to start, so what its remote shell started there may still run: {}",
                self.host(node),
                escape(&what)
            )),
        }
        Verdict::Continue
    }

    /// Sends the `--bcast` files (only staging `only`, if named) to every host or to `to`.
    /// On a session, the session has put them in its agents' caches before the job.
    fn send_bcast(&mut self, to: Option<u32>, only: Option<u64>) {
        if self.cfg.bcast.is_empty() || self.attached {
            return;
        }
        let (files, fanout) = (self.cfg.bcast.clone(), self.fanout.clone());
        self.bcast.spawn(async move {
            crate::bcast::send(&files, only, |cmd| fanout.route(to, cmd)).await
        });
    }

    /// Host `node` got `--bcast` file `id` other than it was sent: sent again, a few times.
    fn stage_again(&mut self, node: u32, id: u64) -> Verdict {
        let asked = self.resent.entry((node, id)).or_default();
        *asked += 1;
        let asked = *asked;
        let name = (self.cfg.bcast.get(id as usize)).map_or("?", |f| f.path.as_str());
        if asked > crate::bcast::RESENDS {
            let message = format!(
                "{}: --bcast {name} arrived damaged {asked} times",
                self.host(node)
            );
            return self.status.launcher_failed(code::LAUNCHER, message);
        }
        say(format!(
            "{}: --bcast {name} arrived damaged (SHA-256 differs): sending it again",
            self.host(node)
        ));
        self.send_bcast(Some(node), Some(id));
        Verdict::Continue
    }

    /// A sending of `--bcast` files ended: the job fails if a file could not be read.
    fn bcast_sent(&mut self, sent: Result<Result<(), String>, tokio::task::JoinError>) -> Verdict {
        match sent {
            Ok(Ok(())) => Verdict::Continue,
            Ok(Err(why)) => self.status.launcher_failed(code::LAUNCHER, why),
            Err(e) => self
                .status
                .launcher_failed(code::LAUNCHER, format!("--bcast: {e}")),
        }
    }

    /// `node`'s agent said hello: counted once; with --verbose, the last is timed.
    fn on_hello(&mut self, node: u32) {
        let Some(slot) = self.hello_at.get_mut(node as usize) else {
            return;
        };
        if slot.is_some() {
            return;
        }
        *slot = Some(self.t0.elapsed());
        self.n_up += 1;
        let (plan, n, t) = (&self.cfg.plan, self.hello_at.len(), self.t0.elapsed());
        if self.n_up == n && self.cfg.verbose && self.attached {
            say(format!(
                "all {n} hosts of the session run the job after {:.3} s",
                t.as_secs_f64()
            ));
        } else if self.n_up == n && self.cfg.verbose {
            say(format!(
                "all {n} agents up after {:.3} s; the model (SEQ {} s, REM {} s, --batch {}) predicts {:.3} s for this {} tree",
                t.as_secs_f64(),
                plan.model.seq(),
                plan.model.rem(),
                plan.batch,
                plan.launch.launch_time(&plan.launch_model),
                plan.topology,
            ));
        }
    }

    /// Rank output: stdout through the writer's queue, stderr at once.
    async fn on_output(
        &mut self,
        rank: u32,
        stream: Stream,
        data: &[u8],
        out: &mpsc::Sender<Vec<u8>>,
    ) {
        let bytes = match self.cfg.tag_output {
            true => self.tagger.tag(rank, stream, data),
            false => data.to_vec(),
        };
        self.write_output(stream, bytes, out).await;
    }

    /// Output of a rank or a child's rank, tagged already: stdout through the writer's queue,
    /// stderr at once.
    async fn write_output(&mut self, stream: Stream, bytes: Vec<u8>, out: &mpsc::Sender<Vec<u8>>) {
        if self.cfg.quiet {
            return;
        }
        match stream {
            Stream::Stdout if self.stdout_open => match out.try_send(bytes) {
                Ok(()) => {}
                // After Ctrl-C, or once the teardown deadline killed the shells, what stdout
                // does not take now is dropped, and counted; before, a slow reader only
                // slows the frames.
                Err(mpsc::error::TrySendError::Full(b))
                    if self.interrupted || self.killed_at.is_some() =>
                {
                    self.dropped_out += b.len()
                }
                Err(mpsc::error::TrySendError::Full(b)) => self.pending_out = Some(b),
                Err(mpsc::error::TrySendError::Closed(_)) => {}
            },
            Stream::Stdout => {}
            Stream::Stderr => {
                let stderr = &mut self.stderr;
                let _ = async {
                    stderr.write_all(&bytes).await?;
                    stderr.flush().await
                }
                .await;
            }
        }
    }

    /// Rank `rank` ended.
    fn on_exit(&mut self, rank: u32, end: RankEnd, silent: bool, at: WallTime) -> Verdict {
        let plan = &self.cfg.plan;
        let on = plan
            .node_of_rank(rank)
            .map_or("?", |i| plan.hosts[i].as_str());
        let what = format!("rank {rank} on {on}");
        if let Some(node) = plan.node_of_rank(rank) {
            self.children.rank_ended(node);
        }
        let mut verdict = self.status.rank_ended(end, at, &what);
        if let Some(message) = self.singletons.ended(rank, on, end, silent) {
            verdict = self.status.launcher_failed(code::LAUNCHER, message);
        }
        self.ranks_done();
        verdict
    }

    /// A frame of a spawn: a request, a node's answer to a phase, a child's end.
    async fn on_spawn_frame(&mut self, up: Up) -> Verdict {
        let step = match up {
            Up::Spawn { node, id, request } => return self.on_spawn(node, id, request).await,
            Up::ChildExit {
                child,
                rank,
                end,
                at,
            } => return self.on_child_exit(child, rank, end, at),
            Up::ChildAdded {
                node,
                child,
                result,
            } => self.children.added(node, child, result),
            Up::ChildStarted {
                node,
                child,
                result,
            } => self.children.started(node, child, result),
            _ => return Verdict::Continue,
        };
        self.carry_step(step).await
    }

    /// Rank `rank` of spawned child `child` ended (or was never started).
    fn on_child_exit(&mut self, child: u32, rank: u32, end: RankEnd, at: WallTime) -> Verdict {
        let verdict = match self.children.child_ended(child, rank) {
            Some(c) if c.counts => self.status.child_ended(end, at, &c.what),
            Some(_) => self.status.killed_rank_ended(),
            None => Verdict::Continue,
        };
        self.ranks_done();
        verdict
    }

    /// Once every rank (and spawned child) ended: when, said with --verbose.
    fn ranks_done(&mut self) {
        let n = self.status.n_ranks();
        if self.finished_at.is_some() || self.status.ended() < n || self.children.busy() {
            return;
        }
        let t = self.t0.elapsed();
        self.finished_at = Some(t);
        if self.cfg.verbose {
            say(format!(
                "all {n} ranks ended after {:.3} s",
                t.as_secs_f64()
            ));
        }
    }

    /// A rank asks for a spawn: placed (by greedyrun, or by the session that holds the job's
    /// slots) and started, or refused at once (while the job ends).
    async fn on_spawn(
        &mut self,
        node: u32,
        id: u32,
        request: greedy_pmix::child::SpawnRequest,
    ) -> Verdict {
        let refuse = |why: &str| Cmd::SpawnAnswer {
            id,
            result: Err(why.to_string()),
        };
        if self.status.tearing_down() || self.end_deadline.is_some() {
            let refusal = refuse("the job is ending");
            self.fanout.route(Some(node), refusal).await;
            return Verdict::Continue;
        }
        let now = Instant::now();
        let Edges::Session(link) = &*self.fanout else {
            let step = self.children.request(node, id, request, now);
            return self.carry_step(step).await;
        };
        // The session holds the slots: it places the child, and the phases follow.
        let apps = request.apps.clone();
        let child = self.children.ask_placement(node, id, request, now);
        link.place(child, apps, self.cfg.oversubscribe);
        self.status.spawning(self.children.busy())
    }

    /// Carries out a step of the children's state: its commands, the ranks the job now waits
    /// for, and a failure of the job.
    async fn carry_step(&mut self, step: Step) -> Verdict {
        for (to, cmd) in step.route {
            if let (
                Some(node),
                Cmd::SpawnAnswer {
                    result: Err(why), ..
                },
            ) = (to, &cmd)
            {
                // The rank gets only an MPI error class: the user reads why here.
                say(format!(
                    "MPI_Comm_spawn from {} refused: {}",
                    self.host(node),
                    escape(why)
                ));
            }
            self.fanout.route(to, cmd).await;
        }
        self.status.add_ranks(step.ranks_added);
        let failed = match step.fail_job {
            Some(why) => self.status.launcher_failed(code::LAUNCHER, why),
            None => Verdict::Continue,
        };
        let settled = self.status.spawning(self.children.busy());
        if failed != Verdict::Continue {
            failed
        } else {
            settled
        }
    }

    /// Host `node` was lost (by the agent `by` that started it), with its launch subtree.
    fn on_lost(&mut self, node: u32, by: Option<u32>, what: &str) -> Verdict {
        let what = escape(what);
        // A session's job loses only that host: its agents are not a launch tree.
        let sub = match self.attached {
            true => 1,
            false => self.cfg.plan.launch.subtree_len(node as usize + 1),
        };
        let by = (by.map(|b| format!(" (started by {})", self.host(b)))).unwrap_or_default();
        let sub = match sub > 1 {
            true => format!("; its launch subtree of {sub} hosts goes with it"),
            false => String::new(),
        };
        let message = format!("host {}{by} lost: {what}{sub}", self.host(node));
        self.status.launcher_failed(code::LAUNCHER, message)
    }

    /// stdout's writer ended: a closed pipe ends the job as SIGPIPE would.
    fn stdout_ended(
        &mut self,
        ended: Result<std::io::Result<()>, tokio::task::JoinError>,
    ) -> Verdict {
        self.stdout_open = false;
        self.pending_out = None;
        if let Ok(Err(e)) = ended
            && e.kind() == ErrorKind::BrokenPipe
        {
            return self
                .status
                .launcher_failed(code::BROKEN_PIPE, String::new());
        }
        Verdict::Continue
    }

    /// SIGINT, SIGTERM or SIGHUP: the job is interrupted; a second one while it tears down
    /// kills the remote shells.
    fn on_signal(&mut self, sig: nix::sys::signal::Signal) -> Verdict {
        if self.status.tearing_down() {
            self.fanout.kill_all();
            self.killed_at.get_or_insert(Instant::now());
        }
        self.interrupted = true;
        self.dropped_out += self.pending_out.take().map_or(0, |b| b.len());
        self.status.interrupted(crate::signals::number(sig))
    }

    /// The tick: the launch deadline and progress line, the spawns' deadlines, the end
    /// deadline, and 5 s after the shells were killed, the end (`None`).
    async fn on_tick(&mut self) -> Option<Verdict> {
        let now = Instant::now();
        let mut verdict = self.launch_tick(now);
        let step = self.children.tick(now);
        if step != Step::default() {
            let spawn = self.carry_step(step).await;
            if verdict == Verdict::Continue {
                verdict = spawn;
            }
        }
        if let Some(d) = self.end_deadline
            && now >= d
            && self.killed_at.is_none()
        {
            debug!("end deadline passed: killing remote shells");
            self.fanout.kill_all();
            self.killed_at = Some(now);
            self.dropped_out += self.pending_out.take().map_or(0, |b| b.len());
        }
        if let Some(k) = self.killed_at
            && now >= k + Duration::from_secs(5)
        {
            return None;
        }
        Some(verdict)
    }

    /// While agents are missing: the launch deadline, else the progress line.
    fn launch_tick(&mut self, now: Instant) -> Verdict {
        let (plan, n) = (&self.cfg.plan, self.hello_at.len());
        if self.n_up >= n || self.status.tearing_down() {
            return Verdict::Continue;
        }
        let missing: Vec<&String> = (0..n)
            .filter(|&i| self.hello_at[i].is_none())
            .map(|i| &plan.hosts[i])
            .collect();
        if now >= self.launch_deadline {
            let message = format!(
                "launch timed out after {} s: no agent from {} ({} of {n} hosts; waited for the remote shell to start greedyd and for its hello)",
                plan.timeout.as_secs_f64(),
                greedy_tree::hostlist::compress(&missing),
                missing.len()
            );
            return self.status.launcher_failed(code::LAUNCH_TIMEOUT, message);
        }
        if !self.cfg.progress.is_zero() && now >= self.next_progress {
            self.next_progress = now + self.cfg.progress;
            say(format!(
                "launch: {}/{n} hosts up after {:.1} s; waiting for {}",
                self.n_up,
                self.t0.elapsed().as_secs_f64(),
                greedy_tree::hostlist::compress(&missing)
            ));
        }
        Verdict::Continue
    }

    /// Carries out `verdict`; whether greedyrun may end now.
    async fn carry_out(&mut self, verdict: Verdict) -> bool {
        match verdict {
            Verdict::Continue => {}
            Verdict::Note { message } => say(message),
            Verdict::Finished => {
                self.status.finishing();
                self.fanout.route(None, Cmd::Shutdown).await;
                // Once finishing, nothing an agent could still say changes the verdict
                // (`JobStatus::launcher_failed`), and only --verbose prints its notes: a
                // session's client need not wait for the byes, which cross its tree again.
                if self.fanout.leave_finished().await {
                    return true;
                }
                (self.end_deadline).get_or_insert(Instant::now() + SHUTDOWN_TIMEOUT);
            }
            Verdict::Teardown { message } => {
                if !message.is_empty() {
                    say(message);
                }
                self.fanout.route(None, Cmd::Teardown).await;
                let linger = self.cfg.plan.grace + TEARDOWN_LINGER;
                self.end_deadline.get_or_insert(Instant::now() + linger);
            }
        }
        false
    }

    /// The loop ended (and the writer's queue closed): what stdout has yet to take gets its
    /// chance, and the report.
    async fn finish(
        self,
        mut writer: tokio::task::JoinHandle<std::io::Result<()>>,
        mut stops: crate::signals::Stops,
    ) -> Report {
        if self.stdout_open {
            // A clean end waits for the reader as long as it takes (any program would), but
            // Ctrl-C still ends it; a failed or interrupted job gives it STDOUT_DRAIN.
            let patience = self.status.tearing_down().then_some(STDOUT_DRAIN);
            let drained = tokio::select! {
                _ = &mut writer => true,
                _ = async { match patience { Some(p) => tokio::time::sleep(p).await, None => std::future::pending().await } } => false,
                _ = stops.recv() => false,
            };
            if !drained {
                writer.abort();
                say("stdout is not being read: the rest of the ranks' output is dropped".into());
            }
        }
        if self.dropped_out > 0 {
            say(format!(
                "{} bytes of the ranks' output were dropped: stdout was not being read while the job was ending",
                self.dropped_out
            ));
        }
        Report {
            exit_code: self.status.exit_code(),
            hello_at: self.hello_at,
            finished_at: self.finished_at,
        }
    }
}
