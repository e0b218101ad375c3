//! greedyd: the per-host agent. Reads its Start from stdin, starts its launch subtree, forks
//! its ranks, relays everything up, and leaves no process behind.
//!
//! Flow: Start → `Hello` up → children launched ([`Fanout`]) → guard started → wire-up joined
//! (when PMI is on) → ranks forked, each in its own process group → main loop: routed
//! commands from the parent, rank exits, wire-up aborts → on `Shutdown` or `Teardown` (or EOF
//! from the parent: greedyrun or the parent agent is gone) → ranks TERMed, KILLed after the
//! grace period → subtree waited for (bounded) → `Bye` up → exit.

use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use futures_util::{SinkExt, StreamExt};
use greedy_pmix::{JobSecret, node::NodeService, rendezvous::Memory, rendezvous::Rendezvous};
use greedy_tree::Tree;
use nix::sys::signal::Signal;
use tokio::{io::AsyncWriteExt, sync::mpsc};
use tokio_util::{
    codec::{FramedRead, FramedWrite},
    sync::CancellationToken,
};
use tracing::{Instrument, debug, info_span, warn};

use crate::{
    Error,
    fanout::{EdgeConfig, Fanout},
    guard::GuardHandle,
    proto::{BindTo, ChildCodec, Cmd, Down, PmiMode, RankEnd, Start, Stream, TaskId, Up},
    session::JobAgents,
    signals, spawn, stdio, wireup,
};

/// Frames queued towards the parent. Rank output waits when the parent pipe is slow, which
/// slows the rank (its pipe fills): back-pressure instead of loss.
const UP_CAPACITY: usize = 1024;
/// How long an agent waits for its Start after the remote shell started it.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// After a rank exits, how long its output pipes may stay open (held by a background child)
/// before its exit is reported anyway.
const STDIO_DRAIN: Duration = Duration::from_secs(2);
/// After Bye, how long an agent waits for its parent to close its stdin (and its own output
/// to drain) before exiting anyway.
const STDIN_DRAIN: Duration = Duration::from_secs(3);
/// Beyond the grace period, how long an agent waits for its subtree to say bye.
const SUBTREE_LINGER: Duration = Duration::from_secs(5);

/// Why the main loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Shutdown,
    Teardown,
    ParentGone,
}

/// Readies the process for the PMIx server and `--bind-to` (the host's topology, PMIx's
/// store choice): call it while the process has one thread, since it sets variables in the
/// environment (greedy-sys `pmix::server::prepare_process`).
pub fn prepare_pmix() {
    greedy_sys::pmix::server::prepare_process();
}

/// Runs the agent on this process's stdin/stdout (started by a remote shell); returns the
/// process exit code.
pub async fn run() -> Result<i32, Error> {
    run_on(tokio::io::stdin(), tokio::io::stdout(), None).await
}

/// Runs the agent on its parent's connection, `down` from the parent and `up` to it: the
/// remote shell's stdin/stdout, or the TCP connection of an agent that one srun started
/// ([`crate::connect`]). With `key`, a Start carrying another job secret is refused.
pub async fn run_on<R, W>(down: R, up: W, key: Option<&JobSecret>) -> Result<i32, Error>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut down = FramedRead::new(down, ChildCodec::default());
    let mut up_w = FramedWrite::new(up, ChildCodec::default());
    let start = match tokio::time::timeout(START_TIMEOUT, down.next()).await {
        Ok(Some(Ok(Down::Start(s)))) => *s,
        Ok(Some(Ok(other))) => {
            return Err(Error::Frame(format!("expected Start first, got {other:?}")));
        }
        Ok(Some(Err(e))) => return Err(e),
        Ok(None) => return Err(Error::Frame("stdin closed before Start".into())),
        Err(_) => {
            return Err(Error::Frame(format!(
                "no Start within {} s (greedyd is started by greedyrun, not by hand)",
                START_TIMEOUT.as_secs()
            )));
        }
    };
    if key.is_some_and(|k| !crate::connect::same_secret(k, &start.secret)) {
        return Err(Error::Untrusted(
            "the job sent over the connection carries another job secret than the key it was proven with: not run".into(),
        ));
    }
    let node = start.node_idx;
    if let Err(what) = start.check() {
        let _ = up_w
            .send(Up::Failed {
                node,
                code: crate::status::code::LAUNCHER,
                what,
            })
            .await;
        return Ok(1);
    }
    let span = info_span!("agent", job = %start.job_id, node, host = %start.hosts[node as usize]);
    let (up_tx, mut up_rx) = mpsc::channel::<Up>(UP_CAPACITY);
    let writer = tokio::spawn(async move {
        while let Some(msg) = up_rx.recv().await {
            if up_w.send(msg).await.is_err() {
                break;
            }
        }
        let _ = up_w.flush().await;
        let _ = up_w.get_mut().shutdown().await;
    });
    let code = Agent::new(start, up_tx)
        .run(&mut down)
        .instrument(span)
        .await;
    // Bye is queued. Drain stdin until the parent closes it (it does on Bye): leaving unread
    // bytes in an rsh socket makes our exit a RST that can destroy the Bye in flight.
    let drain = async { while let Some(Ok(_)) = down.next().await {} };
    let _ = tokio::time::timeout(STDIN_DRAIN, async {
        tokio::join!(drain, async {
            let _ = writer.await;
        })
    })
    .await;
    Ok(code)
}

struct Agent {
    start: Start,
    node: u32,
    up: mpsc::Sender<Up>,
    grace: Duration,
    /// The ranks', tasks' and jobs' process groups while they are still theirs: only these
    /// are ever signalled.
    groups: signals::OwnGroups,
}

/// Writes stdin chunks to the stdin rank as it reads them, and says so for each (greedyrun's
/// window, [`Up::StdinTaken`]); ends at EOF or when the rank closes its stdin.
async fn feed_stdin(
    mut sin: tokio::process::ChildStdin,
    mut rx: mpsc::UnboundedReceiver<Option<bytes::Bytes>>,
    up: mpsc::Sender<Up>,
    node: u32,
) {
    while let Some(Some(b)) = rx.recv().await {
        if sin.write_all(&b).await.is_err() || sin.flush().await.is_err() {
            break;
        }
        if up.send(Up::StdinTaken { node }).await.is_err() {
            break;
        }
    }
}

impl Agent {
    fn new(start: Start, up: mpsc::Sender<Up>) -> Agent {
        // Start::check made both timeouts durations.
        let grace = Duration::from_secs_f64(start.grace_s);
        Agent {
            node: start.node_idx,
            start,
            up,
            grace,
            groups: signals::OwnGroups::default(),
        }
    }

    async fn fail(&self, code: i32, what: String) {
        warn!("{what}");
        let _ = self
            .up
            .send(Up::Failed {
                node: self.node,
                code,
                what,
            })
            .await;
    }

    async fn run<R: tokio::io::AsyncRead + Unpin>(
        self,
        down: &mut FramedRead<R, ChildCodec>,
    ) -> i32 {
        let node = self.node;
        let _ = self.up.send(Up::Hello { node }).await;
        let hello_timeout = Duration::from_secs_f64(self.start.hello_timeout_s.max(0.001));

        // The launch subtree first: it is on the critical path of everyone below.
        let fanout = match Tree::from_subtree_sizes(self.start.launch_sizes.clone()) {
            Ok(tree) => {
                let pos = node as usize + 1;
                Fanout::start(
                    &self.start,
                    &tree,
                    pos..pos + tree.len(),
                    EdgeConfig {
                        rsh: self.start.rsh.clone(),
                        agent: self.start.agent.clone(),
                        batch: self.start.batch,
                        retries: self.start.retries,
                        hello_timeout,
                        by: Some(node),
                    },
                    self.up.clone(),
                )
            }
            Err(e) => {
                self.fail(
                    crate::status::code::LAUNCHER,
                    format!("bad launch subtree: {e}"),
                )
                .await;
                Fanout::start(
                    &self.start,
                    &Tree::from_subtree_sizes(vec![1]).expect("one node"),
                    0..1,
                    EdgeConfig {
                        rsh: vec![],
                        agent: vec![],
                        batch: 1,
                        retries: 0,
                        hello_timeout,
                        by: Some(node),
                    },
                    self.up.clone(),
                )
            }
        };

        let mut guard =
            match std::env::current_exe().and_then(|exe| GuardHandle::start(&exe, self.grace)) {
                Ok(g) => Some(g),
                Err(e) => {
                    let _ = self
                        .up
                        .send(Up::Note {
                            node,
                            text: format!(
                                "cannot start the guard (ranks may outlive a killed agent): {e}"
                            ),
                        })
                        .await;
                    None
                }
            };

        // The wire-up service starts before the ranks and joins the overlay beside the main
        // loop, which routes it the Address frames it needs; ranks start at once, and their
        // first fence waits for the join.
        let board = Memory::default();
        let mut service: Option<NodeService> = None;
        let mut abort_rx: Option<tokio::sync::watch::Receiver<Option<greedy_pmix::AbortInfo>>> =
            None;
        // Tells greedyrun once which family this node's ranks speak (singletons elsewhere).
        let mut spoken: Option<tokio::sync::watch::Receiver<Option<greedy_pmix::family::Family>>> =
            None;
        let mut wireup_failed = false;
        let bound = self.bound_cpus().await;
        if self.start.pmi != PmiMode::None {
            let rdv = wireup::PipeRendezvous {
                up: self.up.clone(),
                board: board.clone(),
            };
            let leave = CancellationToken::new();
            match wireup::start(&self.start, rdv, hello_timeout, &leave, &bound).await {
                Ok(s) => {
                    abort_rx = Some(s.overlay().aborted());
                    spoken = Some(s.spoken());
                    service = Some(s);
                }
                Err(e) => {
                    wireup_failed = true;
                    self.fail(crate::status::code::LAUNCHER, format!("wire-up: {e}"))
                        .await;
                }
            }
        }

        // stdin for the stdin rank. Unbounded on purpose: the main loop must never block on a
        // rank that does not read its stdin, or it could not see Teardown. greedyrun bounds
        // it: it sends a chunk only when one was taken ([`Up::StdinTaken`]).
        let (stdin_tx, stdin_rx) = mpsc::unbounded_channel::<Option<bytes::Bytes>>();
        let mut stdin_rx = Some(stdin_rx);
        // The process group of each rank or task that ended (counted in `live`).
        let (exit_tx, mut exit_rx) = mpsc::channel::<u32>(64);
        let mut live = 0usize;
        let mut spawned = false;

        // Task process groups still running, with their stream (by group: a task run again on
        // this host has the same id as its ended run, never the same group while that one is
        // listed).
        let (task_tx, mut task_rx) = mpsc::channel::<u32>(64);
        let mut tasks: HashMap<u32, u32> = HashMap::new();
        // A session's jobs, each run by a greedyd of its own on this host.
        let mut jobs = JobAgents::new(node, self.grace, self.up.clone(), self.groups.clone());
        // A task stream's hosts start no ranks: greedyrun sends them tasks.
        if !wireup_failed && !self.start.tasks {
            live = self
                .spawn_ranks(
                    service.as_ref(),
                    &bound,
                    &mut guard,
                    &mut stdin_rx,
                    &exit_tx,
                )
                .await;
            spawned = true;
        }

        let end = loop {
            tokio::select! {
                f = down.next() => match f {
                    Some(Ok(Down::Route { to, cmd })) => {
                        if to != Some(node) {
                            fanout.route(to, cmd.clone()).await;
                        }
                        if to.is_none() || to == Some(node) {
                            match cmd {
                                Cmd::Stdin(b) => { let _ = stdin_tx.send(Some(b)); }
                                Cmd::StdinEof => { let _ = stdin_tx.send(None); }
                                Cmd::Address { node: n, addr } => {
                                    if let Ok(a) = addr.parse() {
                                        let _ = board.publish(n as usize, a).await;
                                    }
                                }
                                Cmd::Shutdown => break End::Shutdown,
                                Cmd::Teardown => break End::Teardown,
                                Cmd::Task { id, command } if self.start.tasks => {
                                    if let Some(pgid) = self.spawn_task(id, command, &mut guard, &exit_tx, &task_tx).await {
                                        tasks.insert(pgid, id.stream);
                                        live += 1;
                                    }
                                }
                                Cmd::Task { id, .. } => warn!(stream = id.stream, line = id.line, "a task for a job that runs ranks: ignored"),
                                Cmd::JobStart { job, nodes, start } if self.start.tasks => {
                                    jobs.start(job, &nodes, *start, &mut guard).await;
                                }
                                Cmd::JobStart { job, .. } => warn!(job, "a job for an agent that runs ranks: ignored"),
                                Cmd::ForJob { job, cmd } => jobs.deliver(job, cmd),
                                Cmd::EndJob { job } => jobs.end(job),
                                Cmd::CancelTasks { stream } => {
                                    let groups: Vec<u32> = tasks.iter().filter(|&(_, &s)| s == stream).map(|(&g, _)| g).collect();
                                    for &g in &groups {
                                        self.groups.signal(g, Signal::SIGTERM);
                                    }
                                    let (grace, own) = (self.grace, self.groups.clone());
                                    tokio::spawn(async move {
                                        tokio::time::sleep(grace).await;
                                        for g in groups {
                                            own.signal(g, Signal::SIGKILL);
                                        }
                                    });
                                }
                            }
                        }
                    }
                    Some(Ok(Down::Start(_))) => {}
                    Some(Err(e)) => { warn!("parent pipe: {e}"); break End::ParentGone; }
                    None => break End::ParentGone,
                },
                spoke = async { spoken.as_mut().expect("guarded").wait_for(Option::is_some).await.map(|f| *f) }, if spoken.is_some() => {
                    spoken = None;
                    if let Ok(Some(family)) = spoke {
                        let _ = self.up.send(Up::Spoke { node, family }).await;
                    }
                },
                changed = async { abort_rx.as_mut().expect("guarded").changed().await }, if abort_rx.is_some() => {
                    match changed {
                        Ok(()) => {
                            let info = abort_rx.as_ref().and_then(|r| r.borrow().clone());
                            if let Some(abort) = info {
                                warn!("wire-up aborted: {abort}");
                                let _ = self.up.send(Up::Aborted { node, abort }).await;
                                abort_rx = None;
                            }
                        }
                        Err(_) => abort_rx = None,
                    }
                },
                Some(pgid) = exit_rx.recv() => {
                    live = live.saturating_sub(1);
                    if !self.groups.owns(pgid) && let Some(g) = guard.as_mut() {
                        g.unwatch(pgid).await;
                    }
                },
                job = jobs.ended(), if !jobs.is_empty() => {
                    if let (Some(pgid), Some(g)) = (jobs.forget(job), guard.as_mut()) {
                        g.unwatch(pgid).await;
                    }
                },
                Some(pgid) = task_rx.recv() => {
                    // What the task left running in its group ends with it: a stream of
                    // thousands of tasks must not pile up their background processes.
                    if tasks.remove(&pgid).is_some() {
                        self.groups.kill_and_forget(pgid);
                        if let Some(g) = guard.as_mut() {
                            g.unwatch(pgid).await;
                        }
                    }
                },
            }
        };
        debug!(?end, live, spawned, "agent ending");

        // Pass the end on first, so the whole subtree tears down in parallel with us.
        let cmd = if end == End::Shutdown {
            Cmd::Shutdown
        } else {
            Cmd::Teardown
        };
        fanout.route(None, cmd).await;
        // A session's jobs end as if their remote shells were lost: each greedyd tears its
        // ranks down within the grace period.
        jobs.end_all(self.grace + SUBTREE_LINGER).await;
        if live > 0 {
            for g in self.groups.all() {
                self.groups.signal(g, Signal::SIGTERM);
            }
            let deadline = tokio::time::Instant::now() + self.grace;
            while live > 0 {
                tokio::select! {
                    Some(_) = exit_rx.recv() => live -= 1,
                    _ = tokio::time::sleep_until(deadline) => break,
                }
            }
        }
        // Whatever is left in the ranks' groups (their background children, or ranks that
        // ignored SIGTERM) is killed: no process of the job outlives its agent. A group whose
        // leader was reaped and that emptied is no longer listed, so a stranger's group on a
        // recycled pid is never hit.
        for g in self.groups.all() {
            self.groups.signal(g, Signal::SIGKILL);
        }
        let reap_deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while live > 0 {
            tokio::select! {
                Some(_) = exit_rx.recv() => live -= 1,
                _ = tokio::time::sleep_until(reap_deadline) => break,
            }
        }
        if let Some(service) = service.take() {
            let _ = tokio::time::timeout(Duration::from_secs(6), service.shutdown()).await;
        }
        if tokio::time::timeout(self.grace + SUBTREE_LINGER, fanout.wait())
            .await
            .is_err()
        {
            fanout.kill_all();
            let _ = tokio::time::timeout(Duration::from_secs(5), fanout.wait()).await;
        }
        if let Some(g) = guard.take() {
            g.done().await;
        }
        let _ = self.up.send(Up::Bye { node }).await;
        0
    }

    /// The CPUs each local rank is bound to (`--bind-to`: the host's n-th core or package for
    /// its n-th rank, round-robin); empty when they are not bound, or when hwloc cannot say
    /// (then said once, and the ranks run unbound).
    async fn bound_cpus(&self) -> BTreeMap<u32, Vec<u32>> {
        use greedy_sys::pmix::topology::{Grain, Topology};
        let grain = match self.start.bind {
            BindTo::None => return BTreeMap::new(),
            BindTo::Core => Grain::Core,
            BindTo::Socket => Grain::Package,
        };
        let sets = Topology::this_machine().map_or_else(Vec::new, |t| t.cpus_by(grain));
        if sets.is_empty() {
            let text =
                format!("--bind-to: hwloc found no {grain:?} on this host; ranks run unbound");
            let _ = self
                .up
                .send(Up::Note {
                    node: self.node,
                    text,
                })
                .await;
            return BTreeMap::new();
        }
        let local = &self.start.ranks[self.node as usize];
        local
            .iter()
            .enumerate()
            .map(|(i, &rank)| (rank, sets[i % sets.len()].clone()))
            .collect()
    }

    /// What every rank and task of this host starts with: the job's environment less an outer
    /// launcher's endpoints (this greedyrun inside another job: they must not reach the
    /// processes beside this job's), `GREEDY_JOB` and `GREEDY_NODE`.
    fn job_env(&self) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = self
            .start
            .env
            .iter()
            .filter(|(k, _)| !greedy_pmix::node::is_launcher_variable(k))
            .cloned()
            .collect();
        env.extend([
            ("GREEDY_JOB".to_string(), self.start.job_id.clone()),
            ("GREEDY_NODE".to_string(), self.node.to_string()),
        ]);
        env
    }

    /// Forks task `id` (`command`'s words, or `sh -c command`: [`crate::tasks::argv_of`], in
    /// the job's environment, `GREEDY_TASK` its number);
    /// reports its output and its end up, and its process group to `ended` (and a count to
    /// `exits`) once it ended.
    /// Its process group, or `None` if it could not start (its end is reported at once).
    async fn spawn_task(
        &self,
        id: TaskId,
        command: String,
        guard: &mut Option<GuardHandle>,
        exits: &mpsc::Sender<u32>,
        ended: &mpsc::Sender<u32>,
    ) -> Option<u32> {
        let node = self.node;
        let mut env = self.job_env();
        env.push(("GREEDY_TASK".to_string(), id.line.to_string()));
        let started = tokio::time::Instant::now();
        let spec = |argv| spawn::RankSpec {
            argv,
            env: &env,
            cwd: &self.start.cwd,
            stdin: false,
            inherit: None,
            cpus: None,
        };
        let argv = crate::tasks::argv_of(&command);
        let shell = ["/bin/sh".to_string(), "-c".to_string(), command];
        // A plain line whose program cannot be run goes through the shell, for its message
        // and its code.
        let spawned = match spawn::spawn(spec(&argv)) {
            Err(_) if argv[..] != shell[..] => spawn::spawn(spec(&shell)),
            spawned => spawned,
        };
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => {
                let text = format!("task {}: cannot run /bin/sh: {e}", id.line);
                let _ = self.up.send(Up::Note { node, text }).await;
                let end = RankEnd::NotStarted;
                let _ = self
                    .up
                    .send(Up::TaskEnd {
                        node,
                        id,
                        end,
                        wall_us: 0,
                    })
                    .await;
                return None;
            }
        };
        let pgid = child.id().unwrap_or(0);
        self.groups.adopt(pgid);
        if let Some(g) = guard.as_mut() {
            g.watch(pgid).await;
        }
        let out = tokio::spawn(stdio::forward_as(
            child.stdout.take().expect("piped"),
            self.up.clone(),
            self.start.unbuffered,
            move |data| Up::TaskOutput {
                id,
                stream: Stream::Stdout,
                data,
            },
        ));
        let err = tokio::spawn(stdio::forward_as(
            child.stderr.take().expect("piped"),
            self.up.clone(),
            self.start.unbuffered,
            move |data| Up::TaskOutput {
                id,
                stream: Stream::Stderr,
                data,
            },
        ));
        let (up, exits, ended) = (self.up.clone(), exits.clone(), ended.clone());
        let own = self.groups.clone();
        tokio::spawn(
            async move {
                let end = match child.wait().await {
                    Ok(s) => spawn::end_of(s),
                    Err(_) => RankEnd::Exited(255),
                };
                own.forget_if_empty(pgid);
                let wall_us = started.elapsed().as_micros() as u64;
                let _ = tokio::time::timeout(STDIO_DRAIN, async {
                    let _ = out.await;
                    let _ = err.await;
                })
                .await;
                let _ = up
                    .send(Up::TaskEnd {
                        node,
                        id,
                        end,
                        wall_us,
                    })
                    .await;
                let _ = ended.send(pgid).await;
                let _ = exits.send(pgid).await;
            }
            .instrument(info_span!("task", stream = id.stream, line = id.line)),
        );
        Some(pgid)
    }

    /// Forks this host's ranks; returns how many were started.
    async fn spawn_ranks(
        &self,
        service: Option<&NodeService>,
        bound: &BTreeMap<u32, Vec<u32>>,
        guard: &mut Option<GuardHandle>,
        stdin_rx: &mut Option<mpsc::UnboundedReceiver<Option<bytes::Bytes>>>,
        exit_tx: &mpsc::Sender<u32>,
    ) -> usize {
        let node = self.node as usize;
        let local = self.start.ranks[node].clone();
        let n_ranks: u32 = self.start.ranks.iter().map(|r| r.len() as u32).sum();
        let mut started = 0;
        for (local_id, &rank) in local.iter().enumerate() {
            let mut env = self.job_env();
            env.extend([
                ("GREEDY_RANK".to_string(), rank.to_string()),
                ("GREEDY_SIZE".to_string(), n_ranks.to_string()),
                ("GREEDY_LOCAL_RANK".to_string(), local_id.to_string()),
                ("GREEDY_LOCAL_SIZE".to_string(), local.len().to_string()),
            ]);
            let mut inherit = None;
            if let Some(service) = service {
                match service.env_for(rank, Some(wireup::PMI_FD)).await {
                    Ok(w) => {
                        for (k, v) in w.defaults {
                            if !env.iter().any(|(name, _)| *name == k) {
                                env.push((k, v));
                            }
                        }
                        env.extend(w.env);
                        inherit = w.pmi_fd.map(|fd| (fd, wireup::PMI_FD));
                    }
                    Err(e) => warn!(rank, "no wire-up for this rank: {e}"),
                }
            }
            let wants_stdin = self.start.stdin_rank == Some(rank);
            let cpus = bound.get(&rank).map(Vec::as_slice);
            if let Some(cpus) = cpus {
                let list: Vec<String> = cpus.iter().map(u32::to_string).collect();
                env.push(("GREEDY_CPUS".into(), list.join(",")));
            }
            let spec = spawn::RankSpec {
                argv: self.start.argv_of(rank),
                env: &env,
                cwd: &self.start.cwd,
                stdin: wants_stdin,
                inherit,
                cpus,
            };
            match spawn::spawn(spec) {
                Ok(mut child) => {
                    let pgid = child.id().unwrap_or(0);
                    self.groups.adopt(pgid);
                    if let Some(g) = guard.as_mut() {
                        g.watch(pgid).await;
                    }
                    if wants_stdin
                        && let (Some(sin), Some(rx)) = (child.stdin.take(), stdin_rx.take())
                    {
                        tokio::spawn(feed_stdin(sin, rx, self.up.clone(), self.node));
                    }
                    let out = tokio::spawn(stdio::forward(
                        rank,
                        Stream::Stdout,
                        child.stdout.take().expect("piped"),
                        self.up.clone(),
                        self.start.unbuffered,
                    ));
                    let err = tokio::spawn(stdio::forward(
                        rank,
                        Stream::Stderr,
                        child.stderr.take().expect("piped"),
                        self.up.clone(),
                        self.start.unbuffered,
                    ));
                    let (up, me) = (self.up.clone(), self.node);
                    let exit_tx = exit_tx.clone();
                    let service = service.cloned();
                    let own = self.groups.clone();
                    tokio::spawn(
                        async move {
                            let end = match child.wait().await {
                                Ok(s) => spawn::end_of(s),
                                Err(_) => RankEnd::Exited(255),
                            };
                            // At once: an empty group's number is free from now on.
                            own.forget_if_empty(pgid);
                            let _ = tokio::time::timeout(STDIO_DRAIN, async {
                                let _ = out.await;
                                let _ = err.await;
                            })
                            .await;
                            // Its background children may have gone while we drained.
                            own.forget_if_empty(pgid);
                            // The service decides: a plain program that exits 0 without
                            // speaking any protocol is fine (greedy-pmix `departures`).
                            let (end, silent) = match &service {
                                Some(service) => {
                                    service.rank_exited(rank, end.code()).await;
                                    // A rank that aborted exits once the abort is out: it
                                    // goes up first, so greedyrun's code is the abort's
                                    // (the main loop sends it again; greedyrun keeps one).
                                    let abort = service.overlay().aborted().borrow().clone();
                                    if let Some(abort) = abort {
                                        let _ = up.send(Up::Aborted { node: me, abort }).await;
                                    }
                                    let silent = service.family_of(rank).is_none();
                                    (wireup::end_of(service, rank, end), silent)
                                }
                                None => (end, false),
                            };
                            let _ = up.send(Up::Exit { rank, end, silent }).await;
                            let _ = exit_tx.send(pgid).await;
                        }
                        .instrument(info_span!("rank", rank)),
                    );
                    started += 1;
                }
                Err(e) => {
                    let _ = self
                        .up
                        .send(Up::Note {
                            node: self.node,
                            text: format!(
                                "rank {rank}: cannot run {:?}: {e}",
                                self.start.argv_of(rank)[0]
                            ),
                        })
                        .await;
                    if let Some(service) = service {
                        service.rank_exited(rank, RankEnd::NotStarted.code()).await;
                    }
                    let _ = self
                        .up
                        .send(Up::Exit {
                            rank,
                            end: RankEnd::NotStarted,
                            silent: false,
                        })
                        .await;
                }
            }
        }
        started
    }
}
