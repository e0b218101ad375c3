//! greedyd: the per-host agent. Reads its Start from stdin, starts its launch subtree, forks
//! its ranks, relays everything up, and leaves no process behind.
//!
//! Flow: Start → `Hello` up → children launched ([`Fanout`]) → guard started → wire-up joined
//! (when PMI is on; an abort goes up by the node service's rule, [`wireup::AgentEnd`]) →
//! ranks forked, each in its own process group → main loop: routed commands from the parent,
//! rank exits → on `Shutdown` or `Teardown` (or EOF from the parent: greedyrun or the parent
//! agent is gone) → ranks TERMed, KILLed after the grace period → subtree waited for
//! (bounded) → `Bye` up → exit.

mod children;
mod cores;
mod outputs;
mod staged;

use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
    sync::Arc,
    time::Duration,
};

use futures_util::{SinkExt, StreamExt, stream::Stream as FrameStream};
use greedy_pmix::{
    JobSecret, WallTime, node::NodeService, node::job_end::EndPolicy, rendezvous::Memory,
    rendezvous::Rendezvous,
};
use greedy_tree::Tree;
use nix::sys::signal::Signal;
use tokio::{
    io::AsyncWriteExt,
    process::{Child, ChildStdin},
    sync::{mpsc, watch},
    task::JoinHandle,
};
use tokio_util::{
    codec::{FramedRead, FramedWrite},
    sync::CancellationToken,
};
use tracing::{Instrument, debug, info_span, warn};

use self::{cores::Holder, outputs::OutputFiles};
use crate::{
    Error,
    fanout::{EdgeConfig, Fanout},
    guard::GuardHandle,
    heartbeat::{self, Heartbeat},
    proto::{
        BindTo, ChildCodec, Cmd, Down, PmiMode, RankEnd, Staged, Start, Stream, TaskId, TaskJob, Up,
    },
    session::{JobAgents, JobEnded, JobShare},
    signals, spawn, stdio,
    task_spec::{Outputs, Run, TaskSpec},
    wireup,
};

/// `GREEDY_CPUS`: the CPUs a bound rank or task runs on, as a comma list.
fn cpus_variable(cpus: &[u32]) -> (String, String) {
    let list: Vec<String> = cpus.iter().map(u32::to_string).collect();
    ("GREEDY_CPUS".into(), list.join(","))
}

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

/// Readies the process for a PMIx server and `--bind-to`, which open libpmix and hwloc only
/// when a job needs them: call it while the process has one thread, since it sets variables
/// in the environment (greedy-sys `pmix::server::prepare_environment`).
pub fn prepare_pmix() {
    greedy_sys::pmix::server::prepare_environment();
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
    let (up_tx, up_rx) = mpsc::channel::<Up>(UP_CAPACITY);
    let beat = Heartbeat::new(start.lost_after_s);
    let writer = tokio::spawn(write_up(up_rx, up_w, beat));
    let code = Agent::new(start, up_tx, None)
        .run(&mut heartbeat::watched(&mut down, beat))
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

/// Writes the agent's frames to its parent, with a ping whenever none went for a while.
async fn write_up<W>(
    mut up_rx: mpsc::Receiver<Up>,
    mut up_w: FramedWrite<W, ChildCodec>,
    beat: Heartbeat,
) where
    W: tokio::io::AsyncWrite + Unpin,
{
    loop {
        let msg = match beat.ping_every() {
            Some(every) => match tokio::time::timeout(every, up_rx.recv()).await {
                Ok(msg) => msg,
                Err(_) => Some(Up::Ping),
            },
            None => up_rx.recv().await,
        };
        let Some(msg) = msg else { break };
        if up_w.send(msg).await.is_err() {
            break;
        }
    }
    let _ = up_w.flush().await;
    let _ = up_w.get_mut().shutdown().await;
}

/// Runs the agent of one job of a session in the session agent's own process: `down` from
/// the session agent, `up` to it, sharing its guard and PMIx server (`share`); returns the
/// exit code a greedyd would have.
pub(crate) async fn run_in(
    start: Start,
    mut down: mpsc::UnboundedReceiver<Down>,
    up: mpsc::Sender<Up>,
    share: JobShare,
) -> i32 {
    let node = start.node_idx;
    if let Err(what) = start.check() {
        let code = crate::status::code::LAUNCHER;
        let _ = up.send(Up::Failed { node, code, what }).await;
        return 1;
    }
    let span = info_span!("job", job = %start.job_id, node, host = %start.hosts[node as usize]);
    let mut down = futures_util::stream::poll_fn(move |cx| down.poll_recv(cx).map(|d| d.map(Ok)));
    Agent::new(start, up, Some(share))
        .run(&mut down)
        .instrument(span)
        .await
}

struct Agent {
    start: Start,
    node: u32,
    up: mpsc::Sender<Up>,
    grace: Duration,
    /// The ranks', tasks' and jobs' process groups while they are still theirs: only these
    /// are ever signalled.
    groups: signals::OwnGroups,
    /// For a session's job run in the session agent's process: what it shares with it.
    share: Option<JobShare>,
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
    fn new(start: Start, up: mpsc::Sender<Up>, share: Option<JobShare>) -> Agent {
        // Start::check made both timeouts durations.
        let grace = Duration::from_secs_f64(start.grace_s);
        Agent {
            node: start.node_idx,
            start,
            up,
            grace,
            groups: share.as_ref().map(|s| s.groups.clone()).unwrap_or_default(),
            share,
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

    /// The agent's life: hello, launch subtree, guard, wire-up, ranks, main loop, teardown,
    /// bye; returns the exit code.
    async fn run<S: FrameStream<Item = Result<Down, Error>> + Unpin>(self, down: &mut S) -> i32 {
        let _ = self.up.send(Up::Hello { node: self.node }).await;
        let hello_timeout = Duration::from_secs_f64(self.start.hello_timeout_s.max(0.001));
        // The launch subtree first: it is on the critical path of everyone below.
        let fanout = self.start_fanout(hello_timeout).await;
        let guard = self.start_guard().await;
        // The wire-up service starts before the ranks and joins the overlay beside the main
        // loop, which routes it the Address frames it needs; ranks start at once, and their
        // first fence waits for the join.
        let board = Memory::default();
        let bound = self.bound_cpus().await;
        let wireup = self.start_wireup(&board, hello_timeout, &bound).await;
        // A task stream's hosts start no ranks: greedyrun sends them tasks.
        let runs_ranks = !wireup.failed && !self.start.tasks;
        let waits = !self.start.bcast.is_empty();
        // A session's cached file its agent could not link will not come as a staging.
        let uncached = (self.start.bcast.iter())
            .find(|f| f.cached.is_some())
            .map(|f| f.name.clone());
        let mut running = Running::new(self, fanout, guard, board, wireup);
        if let (true, Some(name)) = (runs_ranks, uncached) {
            let what = format!(
                "--bcast {name} is not in this host's session cache (it arrived damaged and is being sent again): run the job again"
            );
            running
                .agent
                .fail(crate::status::code::LAUNCHER, what)
                .await;
        }
        match (runs_ranks, waits) {
            (true, false) => running.spawn_ranks(&bound).await,
            // The ranks start once the job's broadcast files are here.
            (true, true) if running.agent.start.bcast.iter().all(|f| f.cached.is_none()) => {
                running.bcast_wait = Some(bound)
            }
            (true, true) => {}
            (false, _) => {}
        }
        let end = running.serve(down).await;
        debug!(
            ?end,
            live = running.live,
            spawned = running.spawned,
            "agent ending"
        );
        running.finish(end).await
    }

    /// Starts the remote shells of this node's launch subtree (none, after saying why, when
    /// the subtree sent down is malformed).
    async fn start_fanout(&self, hello_timeout: Duration) -> Fanout {
        let node = self.node;
        match Tree::from_subtree_sizes(self.start.launch_sizes.clone()) {
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
                        heartbeat: Heartbeat::new(self.start.lost_after_s),
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
                        heartbeat: Heartbeat::off(),
                        by: Some(node),
                    },
                    self.up.clone(),
                )
            }
        }
    }

    /// Starts the guard that kills this host's ranks if the agent dies; `None`, said once,
    /// when it cannot start. A session's job shares its session agent's.
    async fn start_guard(&self) -> Option<GuardHandle> {
        if let Some(share) = &self.share {
            return share.guard.as_ref().map(GuardHandle::share);
        }
        match std::env::current_exe().and_then(|exe| GuardHandle::start(&exe, self.grace)) {
            Ok(g) => Some(g),
            Err(e) => {
                self.note(format!(
                    "cannot start the guard (ranks may outlive a killed agent): {e}"
                ))
                .await;
                None
            }
        }
    }

    /// Starts the wire-up service of `--pmi` (none with `--pmi none`), its abort watch with
    /// it; a service that cannot start fails the job.
    async fn start_wireup(
        &self,
        board: &Memory,
        hello_timeout: Duration,
        bound: &BTreeMap<u32, Vec<u32>>,
    ) -> Wireup {
        if self.start.pmi == PmiMode::None {
            return Wireup::default();
        }
        let rdv = wireup::PipeRendezvous {
            up: self.up.clone(),
            board: board.clone(),
        };
        let leave = CancellationToken::new();
        let shared = self.share.as_ref().map(|s| (&s.pmix, s.names.clone()));
        match wireup::start(&self.start, rdv, hello_timeout, &leave, bound, shared).await {
            Ok(s) => {
                let end = Arc::new(wireup::AgentEnd {
                    node: self.node,
                    up: self.up.clone(),
                });
                // The default policy asks for no kill of stragglers, so no count of running
                // ranks is read: greedyrun's teardown ends them all.
                let (_, running) = watch::channel(0);
                // Ends when the service shuts down (its overlay's abort watch closes).
                drop(s.watch_end(end, EndPolicy::default(), running));
                Wireup {
                    spoken: Some(s.spoken()),
                    service: Some(s),
                    failed: false,
                }
            }
            Err(e) => {
                self.fail(crate::status::code::LAUNCHER, format!("wire-up: {e}"))
                    .await;
                Wireup {
                    failed: true,
                    ..Wireup::default()
                }
            }
        }
    }

    /// The CPUs of each of this host's cores or packages (`--bind-to`); `None` when ranks and
    /// tasks are not bound, or when hwloc cannot say (then said once, and they run unbound).
    async fn bind_units(&self) -> Option<Vec<Vec<u32>>> {
        use greedy_sys::pmix::topology::{Grain, Topology};
        let grain = match self.start.bind {
            BindTo::None => return None,
            BindTo::Core => Grain::Core,
            BindTo::Socket => Grain::Package,
        };
        let sets = Topology::this_machine().map_or_else(Vec::new, |t| t.cpus_by(grain));
        if sets.is_empty() {
            self.note(format!(
                "--bind-to: hwloc found no {grain:?} on this host; ranks and tasks run unbound"
            ))
            .await;
            return None;
        }
        Some(sets)
    }

    /// The CPUs each local rank is bound to (`--bind-to`: the host's n-th core or package for
    /// its n-th rank, round-robin; a job task's, as its session agent chose); empty when
    /// they are not bound.
    async fn bound_cpus(&self) -> BTreeMap<u32, Vec<u32>> {
        if let Some(share) = self.share.as_ref().filter(|s| !s.cpus.is_empty()) {
            return share.cpus.clone();
        }
        let Some(sets) = self.bind_units().await else {
            return BTreeMap::new();
        };
        let local = &self.start.ranks[self.node as usize];
        local
            .iter()
            .enumerate()
            .map(|(i, &rank)| (rank, sets[i % sets.len()].clone()))
            .collect()
    }

    /// What every rank and task of this host starts with: the job's environment less an outer
    /// launcher's endpoints (this greedyrun inside another job: they must not reach the
    /// processes beside this job's), `GREEDY_JOB`, `GREEDY_NODE` and `GREEDY_HOST` (its name
    /// in the host list: how a tool beside the job, such as greedy-stack, tells this host's
    /// ranks from others it can see).
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
            (
                "GREEDY_HOST".to_string(),
                self.start
                    .hosts
                    .get(self.node as usize)
                    .cloned()
                    .unwrap_or_default(),
            ),
        ]);
        env
    }

    /// Forks task `id` as `spec` says (a command's words, or `sh -c command`:
    /// [`crate::task_spec::argv_of`]; or its argv), in the job's environment with the task's
    /// variables over it, `GREEDY_TASK` its number, in its working directory, its stdio from
    /// and to its files if it names them; reports its output and its end up, and its process
    /// group to `ended` (and a count to `exits`) once it ended.
    /// Its process group, or `None` if it could not start (its end is reported at once).
    async fn spawn_task(
        &self,
        id: TaskId,
        spec: TaskSpec,
        cpus: Option<&[u32]>,
        guard: &mut Option<GuardHandle>,
        exits: &mpsc::Sender<u32>,
        ended: &mpsc::Sender<u32>,
    ) -> Option<u32> {
        let mut env = self.job_env();
        env.retain(|(k, _)| !spec.env.contains_key(k));
        env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        env.push(("GREEDY_TASK".to_string(), id.line.to_string()));
        env.extend(cpus.map(cpus_variable));
        let started = tokio::time::Instant::now();
        let mut child = match self.task_child(&env, &spec, cpus) {
            Ok(child) => child,
            Err(e) => {
                self.task_not_started(id, &program_of(&spec), &e).await;
                return None;
            }
        };
        let pgid = child.id().unwrap_or(0);
        self.groups.adopt(pgid);
        if let Some(g) = guard.as_mut() {
            g.watch(pgid).await;
        }
        let (out, err) = (child.stdout.take(), child.stderr.take());
        let out = self.forward_task_output(id, out, Stream::Stdout);
        let err = self.forward_task_output(id, err, Stream::Stderr);
        let outputs = OutputFiles::new(
            (id, self.node),
            Path::new(&self.start.cwd),
            spec.cwd.as_deref(),
            &spec.outputs,
        );
        let ending = TaskEnding {
            id,
            node: self.node,
            pgid,
            started,
            outputs,
            up: self.up.clone(),
            exits: exits.clone(),
            ended: ended.clone(),
            own: self.groups.clone(),
        };
        tokio::spawn(ending.wait(child, out, err).instrument(info_span!(
            "task",
            stream = id.stream,
            line = id.line
        )));
        Some(pgid)
    }

    /// Forwards task `id`'s `pipe` up as its `stream`, to its end; nothing for a task whose
    /// stream goes to a file of its own.
    fn forward_task_output<R>(&self, id: TaskId, pipe: Option<R>, stream: Stream) -> JoinHandle<()>
    where
        R: tokio::io::AsyncRead + Unpin + Send + 'static,
    {
        let Some(pipe) = pipe else {
            return tokio::spawn(async {});
        };
        tokio::spawn(stdio::forward_as(
            pipe,
            self.up.clone(),
            self.start.unbuffered,
            move |data| Up::TaskOutput { id, stream, data },
        ))
    }

    /// Forks task `spec` in `env`: its argv, or its command's words, or `sh -c command`;
    /// in its working directory (relative to the job's), which must exist; its stdio files
    /// relative to that.
    fn task_child(
        &self,
        env: &[(String, String)],
        spec: &TaskSpec,
        cpus: Option<&[u32]>,
    ) -> std::io::Result<Child> {
        let job_cwd = std::path::Path::new(&self.start.cwd);
        let cwd = match &spec.cwd {
            Some(dir) => {
                let cwd = job_cwd.join(dir);
                if !cwd.is_dir() {
                    let what = format!("working directory {}: not a directory", cwd.display());
                    return Err(std::io::Error::new(std::io::ErrorKind::NotFound, what));
                }
                cwd
            }
            None => job_cwd.to_path_buf(),
        };
        let files = spawn::StdioFiles {
            stdin: spec.stdin.as_ref().map(|p| cwd.join(p)),
            stdout: spec.stdout.as_ref().map(|p| cwd.join(p)),
            stderr: spec.stderr.as_ref().map(|p| cwd.join(p)),
        };
        let cwd = cwd.to_string_lossy();
        let rank = |argv| spawn::RankSpec {
            argv,
            env,
            cwd: &cwd,
            stdin: false,
            inherit: None,
            cpus,
            files: Some(&files),
        };
        let command = match &spec.run {
            Run::Argv(argv) => return spawn::spawn(rank(argv)),
            Run::Shell(command) => command,
        };
        let argv = crate::task_spec::argv_of(command);
        let shell = ["/bin/sh".to_string(), "-c".to_string(), command.clone()];
        // A plain line whose program cannot be run goes through the shell, for its message
        // and its code.
        match spawn::spawn(rank(&argv)) {
            Err(_) if argv[..] != shell[..] => spawn::spawn(rank(&shell)),
            spawned => spawned,
        }
    }

    /// Tells greedyrun `text`, printed once with this host's name.
    async fn note(&self, text: String) {
        let _ = self
            .up
            .send(Up::Note {
                node: self.node,
                text,
            })
            .await;
    }

    /// Says why task `id` did not start, and reports its end.
    async fn task_not_started(
        &self,
        id: TaskId,
        program: &str,
        e: &(dyn std::fmt::Display + Sync),
    ) {
        self.note(format!("task {}: cannot run {program:?}: {e}", id.line))
            .await;
        let end = RankEnd::NotStarted;
        let _ = self
            .up
            .send(Up::TaskEnd {
                node: self.node,
                id,
                end,
                wall_us: 0,
            })
            .await;
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
        let local = &self.start.ranks[self.node as usize];
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
            let inherit = match service {
                Some(service) => wireup_env(service, rank, &mut env).await,
                None => None,
            };
            let wants_stdin = self.start.stdin_rank == Some(rank);
            let cpus = bound.get(&rank).map(Vec::as_slice);
            env.extend(cpus.map(cpus_variable));
            let spec = spawn::RankSpec {
                argv: self.start.argv_of(rank),
                env: &env,
                cwd: &self.start.cwd,
                stdin: wants_stdin,
                inherit,
                cpus,
                files: None,
            };
            match spawn::spawn(spec) {
                Ok(mut child) => {
                    let stdin = if wants_stdin {
                        child.stdin.take().zip(stdin_rx.take())
                    } else {
                        None
                    };
                    self.watch_rank(rank, child, stdin, service, guard, exit_tx)
                        .await;
                    started += 1;
                }
                Err(e) => self.rank_not_started(rank, &e, service).await,
            }
        }
        started
    }

    /// Looks after a forked rank: its process group, its stdin (the stdin rank's pipe and the
    /// chunks for it), its output, and its end once it exited.
    async fn watch_rank(
        &self,
        rank: u32,
        mut child: Child,
        stdin: Option<(ChildStdin, mpsc::UnboundedReceiver<Option<bytes::Bytes>>)>,
        service: Option<&NodeService>,
        guard: &mut Option<GuardHandle>,
        exit_tx: &mpsc::Sender<u32>,
    ) {
        let pgid = child.id().unwrap_or(0);
        self.groups.adopt(pgid);
        if let Some(g) = guard.as_mut() {
            g.watch(pgid).await;
        }
        if let Some((sin, rx)) = stdin {
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
        let ending = RankEnding {
            rank,
            node: self.node,
            pgid,
            up: self.up.clone(),
            exits: exit_tx.clone(),
            service: service.cloned(),
            own: self.groups.clone(),
        };
        tokio::spawn(
            ending
                .wait(child, out, err)
                .instrument(info_span!("rank", rank)),
        );
    }

    /// Says why `rank` did not start, and reports its end (to the wire-up service too).
    async fn rank_not_started(&self, rank: u32, e: &std::io::Error, service: Option<&NodeService>) {
        let program = &self.start.argv_of(rank)[0];
        self.note(format!("rank {rank}: cannot run {program:?}: {e}"))
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
                at: WallTime::now(),
            })
            .await;
    }
}

/// Adds the wire-up service's variables for `rank` to `env` (its defaults only where `env`
/// has no such variable); the PMI socket the rank inherits, if any.
async fn wireup_env(
    service: &NodeService,
    rank: u32,
    env: &mut Vec<(String, String)>,
) -> Option<(std::os::fd::OwnedFd, i32)> {
    match service.env_for(rank, Some(wireup::PMI_FD)).await {
        Ok(w) => add_wireup(w, env),
        Err(e) => {
            warn!(rank, "no wire-up for this rank: {e}");
            None
        }
    }
}

/// Adds what the wire-up service gave a rank to its `env` (the defaults only where `env` has
/// no such variable); the PMI socket the rank inherits, if any, at [`wireup::PMI_FD`].
fn add_wireup(
    w: greedy_pmix::node::RankWireup,
    env: &mut Vec<(String, String)>,
) -> Option<(std::os::fd::OwnedFd, i32)> {
    for (k, v) in w.defaults {
        if !env.iter().any(|(name, _)| *name == k) {
            env.push((k, v));
        }
    }
    env.extend(w.env);
    w.pmi_fd.map(|fd| (fd, wireup::PMI_FD))
}

/// How a process ended (255 when it cannot be waited for).
async fn end_of_child(child: &mut Child) -> RankEnd {
    match child.wait().await {
        Ok(s) => spawn::end_of(s),
        Err(_) => RankEnd::Exited(255),
    }
}

/// Waits, at most [`STDIO_DRAIN`], for a process's output to be forwarded.
async fn drain_output(out: JoinHandle<()>, err: JoinHandle<()>) {
    let _ = tokio::time::timeout(STDIO_DRAIN, async {
        let _ = out.await;
        let _ = err.await;
    })
    .await;
}

/// What reports a rank's end up once it exited and its output drained.
struct RankEnding {
    rank: u32,
    node: u32,
    pgid: u32,
    up: mpsc::Sender<Up>,
    /// The main loop's count of ended ranks and tasks.
    exits: mpsc::Sender<u32>,
    service: Option<NodeService>,
    own: signals::OwnGroups,
}

impl RankEnding {
    /// Waits for the rank, then reports its end.
    async fn wait(self, mut child: Child, out: JoinHandle<()>, err: JoinHandle<()>) {
        let end = end_of_child(&mut child).await;
        let at = WallTime::now();
        // At once: an empty group's number is free from now on.
        self.own.forget_if_empty(self.pgid);
        drain_output(out, err).await;
        // Its background children may have gone while we drained.
        self.own.forget_if_empty(self.pgid);
        let (end, silent) = self.judged(end).await;
        let rank = self.rank;
        let exit = Up::Exit {
            rank,
            end,
            silent,
            at,
        };
        let _ = self.up.send(exit).await;
        let _ = self.exits.send(self.pgid).await;
    }

    /// The rank's end as the wire-up service judges it, and whether it stayed silent. The
    /// service decides: a plain program that exits 0 without speaking any protocol is fine
    /// (greedy-pmix `departures`).
    async fn judged(&self, end: RankEnd) -> (RankEnd, bool) {
        let Some(service) = &self.service else {
            return (end, false);
        };
        service.rank_exited(self.rank, end.code()).await;
        // A rank that aborted exits once the abort is out: it goes up first, so greedyrun's
        // code is the abort's (the abort watch, `wireup::AgentEnd`, sends it again; greedyrun
        // keeps one).
        let abort = service.overlay().aborted().borrow().clone();
        if let Some(abort) = abort {
            let node = self.node;
            let _ = self.up.send(Up::Aborted { node, abort }).await;
        }
        let silent = service.family_of(self.rank).is_none();
        (wireup::end_of(service, self.rank, end), silent)
    }
}

/// The program a task runs, to name it when it cannot.
fn program_of(spec: &TaskSpec) -> String {
    spec.run.argv().swap_remove(0)
}

/// What reports a task's end up once it exited and its output drained.
struct TaskEnding {
    id: TaskId,
    node: u32,
    pgid: u32,
    started: tokio::time::Instant,
    /// The files to send back (or name) once it ended.
    outputs: OutputFiles,
    up: mpsc::Sender<Up>,
    /// The main loop's count of ended ranks and tasks.
    exits: mpsc::Sender<u32>,
    /// The main loop's list of running tasks.
    ended: mpsc::Sender<u32>,
    own: signals::OwnGroups,
}

impl TaskEnding {
    /// Waits for the task, then reports its end and its wall time.
    async fn wait(self, mut child: Child, out: JoinHandle<()>, err: JoinHandle<()>) {
        let end = end_of_child(&mut child).await;
        self.own.forget_if_empty(self.pgid);
        let wall_us = self.started.elapsed().as_micros() as u64;
        drain_output(out, err).await;
        self.outputs.send(&self.up).await;
        // The loop hears of the end before greedyrun can send the next task: that task's
        // cores are picked with this one's free (`Running::start_task` drains these first).
        let _ = self.ended.send(self.pgid).await;
        let (node, id) = (self.node, self.id);
        let _ = self
            .up
            .send(Up::TaskEnd {
                node,
                id,
                end,
                wall_us,
            })
            .await;
        let _ = self.exits.send(self.pgid).await;
    }
}

/// What the wire-up service gave the main loop: nothing with `--pmi none`.
#[derive(Default)]
struct Wireup {
    service: Option<NodeService>,
    /// Tells greedyrun once which family this node's ranks speak (singletons elsewhere).
    spoken: Option<watch::Receiver<Option<greedy_pmix::family::Family>>>,
    /// The service could not start (the job was failed): no rank starts.
    failed: bool,
}

/// An agent whose subtree, guard and wire-up are up: the main loop's state, with one method
/// per event, then the teardown.
struct Running {
    agent: Agent,
    fanout: Fanout,
    guard: Option<GuardHandle>,
    /// The overlay addresses greedyrun routed down, for the wire-up's rendezvous.
    board: Memory,
    wireup: Wireup,
    /// stdin for the stdin rank. Unbounded on purpose: the main loop must never block on a
    /// rank that does not read its stdin, or it could not see Teardown. greedyrun bounds it:
    /// it sends a chunk only when one was taken ([`Up::StdinTaken`]).
    stdin_tx: mpsc::UnboundedSender<Option<bytes::Bytes>>,
    /// Its receiving end until the stdin rank is forked.
    stdin_rx: Option<mpsc::UnboundedReceiver<Option<bytes::Bytes>>>,
    /// The process group of each rank or task that ended (counted in `live`).
    exit_tx: mpsc::Sender<u32>,
    exit_rx: mpsc::Receiver<u32>,
    /// Ranks and tasks started and not yet ended.
    live: usize,
    /// Whether this host's ranks were forked.
    spawned: bool,
    /// The process group of each task that ended (removed from `tasks`).
    task_tx: mpsc::Sender<u32>,
    task_rx: mpsc::Receiver<u32>,
    /// Task process groups still running, with their stream (by group: a task run again on
    /// this host has the same id as its ended run, never the same group while that one is
    /// listed).
    tasks: HashMap<u32, u32>,
    /// The cores tasks are bound to (`--bind-to`; none when unbound), known from the first
    /// task on.
    task_cores: Option<cores::TaskCores>,
    /// The files staged to this host, and each running task's directory of them.
    staged: staged::StagedFiles,
    /// The ranks' CPUs while they wait for the job's broadcast files (`--bcast`).
    bcast_wait: Option<BTreeMap<u32, Vec<u32>>>,
    /// A session's jobs, each run in this process beside it.
    jobs: JobAgents,
    /// The local ranks' spawn requests, from the wire-up service (`None` without one).
    spawns: Option<mpsc::Receiver<greedy_pmix::child::PendingSpawn>>,
    /// Spawns waiting for greedyrun, and the spawned children of this host.
    children: children::ChildRanks,
}

/// The next spawn request of a local rank; `None` once the service stops serving them.
async fn next_spawn(
    rx: &mut Option<mpsc::Receiver<greedy_pmix::child::PendingSpawn>>,
) -> Option<greedy_pmix::child::PendingSpawn> {
    rx.as_mut().expect("guarded").recv().await
}

/// Waits until the wire-up says which family this node's ranks speak.
async fn spoken(
    rx: &mut Option<watch::Receiver<Option<greedy_pmix::family::Family>>>,
) -> Result<Option<greedy_pmix::family::Family>, watch::error::RecvError> {
    let rx = rx.as_mut().expect("guarded");
    rx.wait_for(Option::is_some).await.map(|f| *f)
}

impl Running {
    fn new(
        agent: Agent,
        fanout: Fanout,
        guard: Option<GuardHandle>,
        board: Memory,
        wireup: Wireup,
    ) -> Running {
        let (stdin_tx, stdin_rx) = mpsc::unbounded_channel();
        let (exit_tx, exit_rx) = mpsc::channel(64);
        let (task_tx, task_rx) = mpsc::channel(64);
        let spawns = wireup.service.as_ref().and_then(NodeService::take_spawns);
        let jobs = JobAgents::new(
            agent.node,
            agent.grace,
            agent.up.clone(),
            wireup::SharedPmix::new(&agent.start),
        );
        Running {
            agent,
            fanout,
            guard,
            board,
            wireup,
            stdin_tx,
            stdin_rx: Some(stdin_rx),
            exit_tx,
            exit_rx,
            live: 0,
            spawned: false,
            task_tx,
            task_rx,
            tasks: HashMap::new(),
            task_cores: None,
            staged: staged::StagedFiles::default(),
            bcast_wait: None,
            jobs,
            spawns,
            children: children::ChildRanks::default(),
        }
    }

    /// Forks this host's ranks.
    async fn spawn_ranks(&mut self, bound: &BTreeMap<u32, Vec<u32>>) {
        self.live = self
            .agent
            .spawn_ranks(
                self.wireup.service.as_ref(),
                bound,
                &mut self.guard,
                &mut self.stdin_rx,
                &self.exit_tx,
            )
            .await;
        self.spawned = true;
    }

    /// The main loop, until the parent says to end or is gone.
    async fn serve<S: FrameStream<Item = Result<Down, Error>> + Unpin>(
        &mut self,
        down: &mut S,
    ) -> End {
        loop {
            let end = tokio::select! {
                f = down.next() => self.on_frame(f).await,
                spoke = spoken(&mut self.wireup.spoken), if self.wireup.spoken.is_some() => {
                    self.on_spoken(spoke).await;
                    None
                },
                Some(pgid) = self.exit_rx.recv() => {
                    self.on_exit(pgid).await;
                    None
                },
                ended = self.jobs.ended(), if !self.jobs.is_empty() => {
                    self.on_job_ended(ended);
                    None
                },
                Some(pgid) = self.task_rx.recv() => {
                    self.on_task_ended(pgid).await;
                    None
                },
                spawn = next_spawn(&mut self.spawns), if self.spawns.is_some() => {
                    match spawn {
                        Some(p) => self.children.request(p, &self.agent.up, self.agent.node).await,
                        None => self.spawns = None,
                    }
                    None
                },
            };
            if let Some(end) = end {
                return end;
            }
        }
    }

    /// A frame from the parent; `Some` when it ends the main loop.
    async fn on_frame(&mut self, f: Option<Result<Down, Error>>) -> Option<End> {
        match f {
            Some(Ok(Down::Route { to, cmd })) => {
                let node = self.agent.node;
                if to != Some(node) {
                    self.fanout.route(to, cmd.clone()).await;
                }
                if to.is_none() || to == Some(node) {
                    return self.on_cmd(cmd).await;
                }
                None
            }
            Some(Ok(Down::Start(_) | Down::Ping)) => None,
            Some(Err(e)) => {
                warn!("parent pipe: {e}");
                Some(End::ParentGone)
            }
            None => Some(End::ParentGone),
        }
    }

    /// A command for this node; `Some` when it ends the main loop.
    async fn on_cmd(&mut self, cmd: Cmd) -> Option<End> {
        let tasks = self.agent.start.tasks;
        match cmd {
            Cmd::Stdin(b) => {
                let _ = self.stdin_tx.send(Some(b));
            }
            Cmd::StdinEof => {
                let _ = self.stdin_tx.send(None);
            }
            Cmd::Address { node, addr } => {
                let _ = self.board.publish(node as usize, addr).await;
            }
            Cmd::Shutdown => return Some(End::Shutdown),
            Cmd::Teardown => return Some(End::Teardown),
            Cmd::Task { id, spec, staged } if tasks => self.start_task(id, *spec, staged).await,
            Cmd::TaskOutputs {
                id,
                cwd,
                outputs,
                end,
                wall_us,
            } if tasks => self.job_task_outputs(id, cwd.as_deref(), &outputs, (end, wall_us)),
            Cmd::Stage { id, offset, data } => {
                let written = self.staged.chunk(id, offset, &data);
                self.on_staged(written).await;
            }
            Cmd::StageEnd { id, hash } => self.on_stage_end(id, &hash).await,
            Cmd::Task { id, .. } | Cmd::TaskOutputs { id, .. } => warn!(
                stream = id.stream,
                line = id.line,
                "a task for a job that runs ranks: ignored"
            ),
            Cmd::JobStart {
                job,
                nodes,
                start,
                task,
            } if tasks => self.start_job(job, &nodes, *start, task).await,
            Cmd::JobStart { job, .. } => warn!(job, "a job for an agent that runs ranks: ignored"),
            Cmd::ForJob { job, cmd } => self.jobs.deliver(job, cmd),
            Cmd::EndJob { job } => self.jobs.end(job),
            Cmd::CancelTasks { stream } => self.cancel_tasks(stream),
            Cmd::SpawnAnswer { id, result } => self.children.answer(id, result),
            Cmd::AddChild { child, job, start } => {
                let mut fork = children::Fork {
                    agent: &self.agent,
                    service: self.wireup.service.as_ref(),
                    guard: &mut self.guard,
                    exit_tx: &self.exit_tx,
                };
                let added = self.children.add(child, *job, &fork).await;
                // The job's only node: no other agent has to add the child first.
                if start && added {
                    self.live += self.children.start(child, &mut fork).await;
                }
            }
            Cmd::StartChild { child } => {
                let mut fork = children::Fork {
                    agent: &self.agent,
                    service: self.wireup.service.as_ref(),
                    guard: &mut self.guard,
                    exit_tx: &self.exit_tx,
                };
                self.live += self.children.start(child, &mut fork).await;
            }
            Cmd::KillChild { child } => self.children.kill(child, &self.agent),
            Cmd::Names { ticket, response } => self.jobs.names_answered(ticket, response),
        }
        None
    }

    /// A staged file's bytes were written, or not: said if not (the tasks that need it fail
    /// here, naming it; a job waiting for its broadcast files fails).
    async fn on_staged(&self, written: std::io::Result<()>) {
        let Err(e) = written else { return };
        if self.bcast_wait.is_some() {
            let what = format!("copying the --bcast files: {e}");
            self.agent.fail(crate::status::code::LAUNCHER, what).await;
        } else {
            self.agent.note(format!("staging a task input: {e}")).await;
        }
    }

    /// The file staged as `id` is all here: kept if it is content `hash`, else asked for
    /// again; the ranks start once the job's broadcast files are all here.
    async fn on_stage_end(&mut self, id: u64, hash: &str) {
        match self.staged.end(id, hash) {
            Ok(true) => {}
            Ok(false) => {
                warn!(id, "a staged file differs from its SHA-256: asked again");
                let node = self.agent.node;
                let _ = self.agent.up.send(Up::StageAgain { node, id }).await;
                return;
            }
            Err(e) => return self.on_staged(Err(e)).await,
        }
        if self.bcast_wait.is_none() {
            return;
        }
        match self.staged.bcast_dir(&self.agent.start.bcast) {
            None => {}
            Some(Ok(dir)) => {
                staged::run_copies(&mut self.agent.start, &dir);
                let bound = self.bcast_wait.take().unwrap_or_default();
                self.spawn_ranks(&bound).await;
            }
            Some(Err(e)) => {
                self.bcast_wait = None;
                let what = format!("the --bcast files: {e}");
                self.agent.fail(crate::status::code::LAUNCHER, what).await;
            }
        }
    }

    /// Sends the outputs of task `id`, a job whose first rank ran here, up, then its end.
    fn job_task_outputs(
        &self,
        id: TaskId,
        cwd: Option<&str>,
        outputs: &Outputs,
        (end, wall_us): (RankEnd, u64),
    ) {
        let agent = &self.agent;
        let node = agent.node;
        let files = OutputFiles::new((id, node), Path::new(&agent.start.cwd), cwd, outputs);
        let up = agent.up.clone();
        tokio::spawn(async move {
            files.send(&up).await;
            let end = Up::TaskEnd {
                node,
                id,
                end,
                wall_us,
            };
            let _ = up.send(end).await;
        });
    }

    /// Forks a task of a stream, its `staged` inputs linked in a directory of its own.
    async fn start_task(&mut self, id: TaskId, mut spec: TaskSpec, staged: Vec<Staged>) {
        while let Ok(pgid) = self.task_rx.try_recv() {
            self.on_task_ended(pgid).await;
        }
        let dir = match staged.is_empty() {
            true => None,
            false => match self.staged.task_dir(id, &staged) {
                Ok(dir) => Some(dir),
                Err(why) => {
                    return self
                        .agent
                        .task_not_started(id, &program_of(&spec), &why)
                        .await;
                }
            },
        };
        if let Some(dir) = &dir {
            spec.env
                .insert("GREEDY_STAGED".into(), dir.display().to_string());
        }
        let picked = self.task_cores().await.pick(spec.slot_count());
        let cpus = picked.as_ref().map(|(_, cpus)| cpus.as_slice());
        let pgid = (self.agent)
            .spawn_task(
                id,
                spec,
                cpus,
                &mut self.guard,
                &self.exit_tx,
                &self.task_tx,
            )
            .await;
        if let Some(pgid) = pgid {
            if let Some(dir) = dir {
                self.staged.task_started(pgid, dir);
            }
            self.tasks.insert(pgid, id.stream);
            self.live += 1;
            if let (Some(held), Some((cores, _))) = (self.task_cores.as_mut(), picked) {
                held.hold(Holder::Task(pgid), cores);
            }
        }
    }

    /// Ends the running tasks of `stream`: TERM, KILL after the grace period.
    fn cancel_tasks(&self, stream: u32) {
        let groups: Vec<u32> = self
            .tasks
            .iter()
            .filter(|&(_, &s)| s == stream)
            .map(|(&g, _)| g)
            .collect();
        for &g in &groups {
            self.agent.groups.signal(g, Signal::SIGTERM);
        }
        let (grace, own) = (self.agent.grace, self.agent.groups.clone());
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            for g in groups {
                own.signal(g, Signal::SIGKILL);
            }
        });
    }

    /// The wire-up learnt which family this node's ranks speak: said once.
    async fn on_spoken(
        &mut self,
        spoke: Result<Option<greedy_pmix::family::Family>, watch::error::RecvError>,
    ) {
        self.wireup.spoken = None;
        if let Ok(Some(family)) = spoke {
            let node = self.agent.node;
            let _ = self.agent.up.send(Up::Spoke { node, family }).await;
        }
    }

    /// A rank or task ended, its group `pgid`.
    async fn on_exit(&mut self, pgid: u32) {
        self.live = self.live.saturating_sub(1);
        if !self.agent.groups.owns(pgid)
            && let Some(g) = self.guard.as_mut()
        {
            g.unwatch(pgid).await;
        }
    }

    /// A session's job ended on this host: its ranks (their cores are free), or its agent.
    fn on_job_ended(&mut self, ended: JobEnded) {
        let (JobEnded::Ranks(job) | JobEnded::Agent(job)) = ended;
        if let Some(held) = self.task_cores.as_mut() {
            held.release(Holder::Job(job));
        }
        if ended == JobEnded::Agent(job) {
            self.jobs.forget(job);
            self.staged.job_ended(job);
        }
    }

    /// The cores the stream's tasks (and its job tasks' ranks) are bound to, learnt from
    /// hwloc at the first task.
    async fn task_cores(&mut self) -> &mut cores::TaskCores {
        if self.task_cores.is_none() {
            let units = self.agent.bind_units().await.unwrap_or_default();
            self.task_cores = Some(cores::TaskCores::new(units));
        }
        self.task_cores.as_mut().expect("set above")
    }

    /// The CPUs of each of a job task's local `ranks` (session job `job`): `per_rank` of the
    /// least used cores each, held by the job until it ends; none when tasks run unbound.
    async fn job_rank_cpus(
        &mut self,
        job: u32,
        ranks: &[u32],
        per_rank: u32,
    ) -> BTreeMap<u32, Vec<u32>> {
        let cores = self.task_cores().await;
        let mut cpus = BTreeMap::new();
        for &rank in ranks {
            let Some((picked, set)) = cores.pick(per_rank) else {
                break;
            };
            cores.hold(Holder::Job(job), picked);
            cpus.insert(rank, set);
        }
        cpus
    }

    /// Runs session job `job`'s part on this host (if `nodes` has it). A stream's job task
    /// brings its `task`: its ranks find the inputs it staged in `GREEDY_STAGED` (if one is
    /// not here, the job runs without and the ranks that look for it fail, as this host says),
    /// and when the stream binds its tasks each rank is bound to cores no task here holds.
    async fn start_job(
        &mut self,
        job: u32,
        nodes: &[u32],
        mut start: Start,
        task: Option<TaskJob>,
    ) {
        let here = nodes.iter().position(|&n| n == self.agent.node);
        if here.is_some() && !start.bcast.is_empty() {
            self.link_cached_copies(job, &mut start).await;
        }
        let (Some(i), Some(task)) = (here, task) else {
            return self
                .jobs
                .start(job, nodes, start, self.guard.as_ref(), BTreeMap::new());
        };
        if !task.staged.is_empty() {
            match self.staged.job_dir(job, &task.staged) {
                Ok(dir) => start
                    .env
                    .push(("GREEDY_STAGED".into(), dir.display().to_string())),
                Err(why) => self.agent.note(format!("job {job}: {why}")).await,
            }
        }
        let ranks = start.ranks.get(i).cloned().unwrap_or_default();
        let cpus = self.job_rank_cpus(job, &ranks, task.cores_per_rank).await;
        self.jobs
            .start(job, nodes, start, self.guard.as_ref(), cpus);
    }

    /// Session job `job`'s `--bcast` files, which the session put in this agent's cache
    /// before the job: its ranks run the copies, and its agent waits for no staging. A file
    /// not here (it arrived damaged and is coming again) is left to the job's agent, which
    /// fails the job naming it.
    async fn link_cached_copies(&mut self, job: u32, start: &mut Start) {
        match self.staged.cached_copies(job, &start.bcast) {
            Ok(dir) => {
                staged::run_copies(start, &dir);
                start.bcast.clear();
            }
            Err(why) => self.agent.note(format!("job {job}: --bcast: {why}")).await,
        }
    }

    /// A task ended, its group `pgid`.
    async fn on_task_ended(&mut self, pgid: u32) {
        // What the task left running in its group ends with it: a stream of thousands of
        // tasks must not pile up their background processes.
        if self.tasks.remove(&pgid).is_some() {
            if let Some(held) = self.task_cores.as_mut() {
                held.release(Holder::Task(pgid));
            }
            self.staged.task_ended(pgid);
            self.agent.groups.kill_and_forget(pgid);
            if let Some(g) = self.guard.as_mut() {
                g.unwatch(pgid).await;
            }
        }
    }

    /// Tears everything down after the main loop ended for `end`; says bye; the exit code.
    async fn finish(mut self, end: End) -> i32 {
        // Pass the end on first, so the whole subtree tears down in parallel with us.
        let cmd = if end == End::Shutdown {
            Cmd::Shutdown
        } else {
            Cmd::Teardown
        };
        self.fanout.route(None, cmd).await;
        // A session's jobs end as if their remote shells were lost: each tears its ranks down
        // within the grace period.
        self.jobs.end_all(self.agent.grace + SUBTREE_LINGER).await;
        self.end_processes().await;
        if let Some(service) = self.wireup.service.take() {
            let _ = tokio::time::timeout(Duration::from_secs(6), service.shutdown()).await;
        }
        let linger = self.agent.grace + SUBTREE_LINGER;
        if tokio::time::timeout(linger, self.fanout.wait())
            .await
            .is_err()
        {
            self.fanout.kill_all();
            let _ = tokio::time::timeout(Duration::from_secs(5), self.fanout.wait()).await;
        }
        if let Some(g) = self.guard.take() {
            g.done().await;
        }
        let node = self.agent.node;
        let _ = self.agent.up.send(Up::Bye { node }).await;
        0
    }

    /// TERMs the ranks and tasks, waits the grace period for them, then KILLs what is left
    /// in their groups.
    async fn end_processes(&mut self) {
        let own = self.agent.groups.clone();
        if self.live > 0 {
            for g in own.all() {
                own.signal(g, Signal::SIGTERM);
            }
            self.reap_until(tokio::time::Instant::now() + self.agent.grace)
                .await;
        }
        // Whatever is left in the ranks' groups (their background children, or ranks that
        // ignored SIGTERM) is killed: no process of the job outlives its agent. A group whose
        // leader was reaped and that emptied is no longer listed, so a stranger's group on a
        // recycled pid is never hit.
        for g in own.all() {
            own.signal(g, Signal::SIGKILL);
        }
        self.reap_until(tokio::time::Instant::now() + Duration::from_secs(2))
            .await;
    }

    /// Counts ended ranks and tasks until none is left or `deadline`.
    async fn reap_until(&mut self, deadline: tokio::time::Instant) {
        while self.live > 0 {
            tokio::select! {
                Some(_) = self.exit_rx.recv() => self.live -= 1,
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
    }
}
