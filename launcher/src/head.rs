//! greedyrun's side of a job: launch position 0 of the tree, the terminal, and the verdict.
//!
//! greedyrun starts its children of the launch tree like any agent ([`Fanout`]), then runs one
//! event loop over: frames from the tree (hello, output, exits, losses, addresses to route),
//! its own stdin (to the stdin rank), SIGINT/SIGTERM/SIGHUP, and a 1 s tick for the progress line
//! and the named deadlines (`--timeout` for the launch, grace + linger for the teardown).
//! [`JobStatus`] decides; this module only carries out.

use std::{
    io::ErrorKind,
    time::{Duration, Instant},
};

use greedy_tree::Tree;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::mpsc,
};
use tracing::debug;

use crate::{
    fanout::{EdgeConfig, Fanout},
    limits::{SHUTDOWN_TIMEOUT, TEARDOWN_LINGER, UP_CAPACITY},
    plan::Plan,
    proto::{BindTo, Cmd, PROTOCOL_VERSION, Start, Stream, Up},
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
        model: plan.model,
        pmi: plan.pmi,
        secret: greedy_pmix::JobSecret::generate(),
        stdin_rank: cfg.stdin_rank,
        bind: cfg.bind,
        log: String::new(),
        tasks,
        unbuffered: cfg.unbuffered,
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

/// greedyrun's loop over a started job's frames, whatever its edges.
async fn drive(
    cfg: JobConfig,
    start: Start,
    edges: Edges,
    mut up_rx: mpsc::Receiver<Up>,
) -> Report {
    let plan = &cfg.plan;
    let n = plan.hosts.len();
    let t0 = Instant::now();
    let attached = matches!(edges, Edges::Session(_));
    let fanout = std::sync::Arc::new(edges);
    let overlay_tree: Tree = greedy_pmix::overlay::tree(n, &start.model);

    // stdin → the stdin rank's host, a chunk for each one taken.
    let window = std::sync::Arc::new(tokio::sync::Semaphore::new(STDIN_WINDOW));
    let stdin_task = cfg
        .stdin_rank
        .and_then(|r| plan.node_of_rank(r))
        .map(|node| {
            let (fanout, window) = (fanout.clone(), window.clone());
            tokio::spawn(async move {
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
            })
        });

    let mut status = JobStatus::new(plan.n_ranks, cfg.keep_going);
    let mut singletons = Singletons::default();
    let mut hello_at: Vec<Option<Duration>> = vec![None; n];
    let mut n_up = 0usize;
    let mut finished_at = None;
    let mut tagger = Tagger::default();
    // Its own task: a reader that stops reading (`greedyrun … | less`) must not stall
    // Ctrl-C and the deadlines, only the flow of frames.
    let (out_tx, out_rx) = mpsc::channel::<Vec<u8>>(STDOUT_QUEUE);
    let mut writer = tokio::spawn(write_stdout(out_rx));
    let mut pending_out: Option<Vec<u8>> = None;
    let mut dropped_out = 0usize;
    let mut interrupted = false;
    let mut stderr = tokio::io::stderr();
    let mut stdout_open = true;
    let launch_deadline = t0 + plan.timeout;
    let mut next_progress = t0 + cfg.progress.max(Duration::from_millis(1));
    let mut end_deadline: Option<Instant> = None;
    let mut killed_at: Option<Instant> = None;
    let mut stops = crate::signals::Stops::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));

    let host = |node: u32| plan.hosts.get(node as usize).cloned().unwrap_or_default();
    let say = |line: String| eprintln!("greedyrun: {line}");

    loop {
        let mut verdict = Verdict::Continue;
        tokio::select! {
            m = up_rx.recv(), if pending_out.is_none() => match m {
                None => break,
                Some(Up::Hello { node }) => {
                    if let Some(slot) = hello_at.get_mut(node as usize)
                        && slot.is_none()
                    {
                        *slot = Some(t0.elapsed());
                        n_up += 1;
                        if n_up == n && cfg.verbose && attached {
                            say(format!("all {n} hosts of the session run the job after {:.3} s", t0.elapsed().as_secs_f64()));
                        } else if n_up == n && cfg.verbose {
                            say(format!(
                                "all {n} agents up after {:.3} s; the model (SEQ {} s, REM {} s, --batch {}) predicts {:.3} s for this {} tree",
                                t0.elapsed().as_secs_f64(),
                                plan.model.seq(),
                                plan.model.rem(),
                                plan.batch,
                                plan.launch.launch_time(&plan.launch_model),
                                plan.topology,
                            ));
                        }
                    }
                }
                Some(Up::Output { rank, stream, data }) => {
                    if cfg.quiet {
                        continue;
                    }
                    let bytes = if cfg.tag_output { tagger.tag(rank, stream, &data) } else { data.to_vec() };
                    match stream {
                        Stream::Stdout if stdout_open => match out_tx.try_send(bytes) {
                            Ok(()) => {}
                            // After Ctrl-C, or once the teardown deadline killed the shells,
                            // what stdout does not take now is dropped, and counted; before,
                            // a slow reader only slows the frames.
                            Err(mpsc::error::TrySendError::Full(b)) if interrupted || killed_at.is_some() => dropped_out += b.len(),
                            Err(mpsc::error::TrySendError::Full(b)) => pending_out = Some(b),
                            Err(mpsc::error::TrySendError::Closed(_)) => {}
                        },
                        Stream::Stdout => {}
                        Stream::Stderr => {
                            let _ = async { stderr.write_all(&bytes).await?; stderr.flush().await }.await;
                        }
                    }
                }
                Some(Up::Exit { rank, end, silent }) => {
                    let on = plan.node_of_rank(rank).map_or("?", |i| plan.hosts[i].as_str());
                    let what = format!("rank {rank} on {on}");
                    verdict = status.rank_ended(end, &what);
                    if let Some(message) = singletons.ended(rank, on, end, silent) {
                        verdict = status.launcher_failed(code::LAUNCHER, message);
                    }
                    if status.ended() == plan.n_ranks {
                        finished_at = Some(t0.elapsed());
                        if cfg.verbose {
                            say(format!("all {} ranks ended after {:.3} s", plan.n_ranks, t0.elapsed().as_secs_f64()));
                        }
                    }
                }
                Some(Up::Spoke { node, family }) => {
                    if let Some(message) = singletons.spoke(&host(node), family) {
                        verdict = status.launcher_failed(code::LAUNCHER, message);
                    }
                }
                Some(Up::Address { node, addr }) => {
                    for c in overlay_tree.children(node as usize) {
                        fanout.route(Some(c as u32), Cmd::Address { node, addr: addr.clone() }).await;
                    }
                }
                Some(Up::Lost { node, by, what }) => {
                    let what = escape(&what);
                    // A session's job loses only that host: its agents are not a launch tree.
                    let sub = if attached { 1 } else { plan.launch.subtree_len(node as usize + 1) };
                    let by = by.map(|b| format!(" (started by {})", host(b))).unwrap_or_default();
                    let sub = if sub > 1 { format!("; its launch subtree of {sub} hosts goes with it") } else { String::new() };
                    verdict = status.launcher_failed(
                        code::LAUNCHER,
                        format!("host {}{by} lost: {what}{sub}", host(node)),
                    );
                }
                Some(Up::Failed { node, code, what }) => {
                    verdict = status.launcher_failed(code, format!("{}: {}", host(node), escape(&what)));
                }
                Some(Up::Aborted { node, abort }) => {
                    let message = format!("{}: wire-up aborted: {}", host(node), escape(&abort.to_string()));
                    verdict = status.aborted(&abort, message);
                }
                Some(Up::Note { node, text }) => {
                    // Once the job is ending, remote shells complain about connections that
                    // the teardown closed ("Connection reset by peer"): noise, unless asked.
                    if cfg.verbose || (end_deadline.is_none() && !status.tearing_down()) {
                        say(format!("{}: {}", host(node), escape(&text)));
                    }
                }
                Some(Up::Bye { .. }) => {}
                Some(Up::StdinTaken { .. }) => window.add_permits(1),
                // Only a task stream's or a session's agents send these (tasks::run).
                Some(Up::TaskOutput { .. } | Up::TaskEnd { .. } | Up::Job { .. }) => {}
                Some(Up::Unclean { node, what }) => say(format!(
                    "could not clean up {} after its agent failed to start, so what its remote shell started there may still run: {}",
                    host(node),
                    escape(&what)
                )),
            },
            permit = out_tx.reserve(), if pending_out.is_some() => match permit {
                Ok(p) => p.send(pending_out.take().unwrap_or_default()),
                Err(_) => pending_out = None,
            },
            ended = &mut writer, if stdout_open => {
                stdout_open = false;
                pending_out = None;
                if let Ok(Err(e)) = ended && e.kind() == ErrorKind::BrokenPipe {
                    verdict = status.launcher_failed(code::BROKEN_PIPE, String::new());
                }
            }
            sig = stops.recv() => {
                if status.tearing_down() { fanout.kill_all(); killed_at.get_or_insert(Instant::now()); }
                interrupted = true;
                dropped_out += pending_out.take().map_or(0, |b| b.len());
                verdict = status.interrupted(crate::signals::number(sig));
            }
            _ = tick.tick() => {
                let now = Instant::now();
                if n_up < n && !status.tearing_down() {
                    if now >= launch_deadline {
                        let missing: Vec<&String> = (0..n).filter(|&i| hello_at[i].is_none()).map(|i| &plan.hosts[i]).collect();
                        verdict = status.launcher_failed(code::LAUNCH_TIMEOUT, format!(
                            "launch timed out after {} s: no agent from {} ({} of {n} hosts; waited for the remote shell to start greedyd and for its hello)",
                            plan.timeout.as_secs_f64(), greedy_tree::hostlist::compress(&missing), missing.len()));
                    } else if !cfg.progress.is_zero() && now >= next_progress {
                        next_progress = now + cfg.progress;
                        let missing: Vec<&String> = (0..n).filter(|&i| hello_at[i].is_none()).map(|i| &plan.hosts[i]).collect();
                        say(format!("launch: {n_up}/{n} hosts up after {:.1} s; waiting for {}",
                            t0.elapsed().as_secs_f64(), greedy_tree::hostlist::compress(&missing)));
                    }
                }
                if let Some(d) = end_deadline
                    && now >= d
                    && killed_at.is_none()
                {
                    debug!("end deadline passed: killing remote shells");
                    fanout.kill_all();
                    killed_at = Some(now);
                    dropped_out += pending_out.take().map_or(0, |b| b.len());
                }
                if let Some(k) = killed_at
                    && now >= k + Duration::from_secs(5)
                {
                    break;
                }
            }
        }
        match verdict {
            Verdict::Continue => {}
            Verdict::Finished => {
                status.finishing();
                fanout.route(None, Cmd::Shutdown).await;
                // Once finishing, nothing an agent could still say changes the verdict
                // (`JobStatus::launcher_failed`), and only --verbose prints its notes: a
                // session's client need not wait for the byes, which cross its tree again.
                if fanout.leave_finished().await {
                    break;
                }
                end_deadline.get_or_insert(Instant::now() + SHUTDOWN_TIMEOUT);
            }
            Verdict::Teardown { message } => {
                if !message.is_empty() {
                    say(message);
                }
                fanout.route(None, Cmd::Teardown).await;
                end_deadline.get_or_insert(Instant::now() + plan.grace + TEARDOWN_LINGER);
            }
        }
    }
    if let Some(t) = stdin_task {
        t.abort();
    }
    drop(out_tx);
    if stdout_open {
        // A clean end waits for the reader as long as it takes (any program would), but
        // Ctrl-C still ends it; a failed or interrupted job gives it STDOUT_DRAIN.
        let patience = status.tearing_down().then_some(STDOUT_DRAIN);
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
    if dropped_out > 0 {
        say(format!(
            "{dropped_out} bytes of the ranks' output were dropped: stdout was not being read while the job was ending"
        ));
    }
    Report {
        exit_code: status.exit_code(),
        hello_at,
        finished_at,
    }
}
