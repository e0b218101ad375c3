//! Starting child agents over remote shells along the launch tree, and the edges to them.
//!
//! A parent (greedyrun at launch position 0, or a greedyd) starts its children in launch order,
//! keeping at most `batch` remote shells in flight until their agents say hello (sshd's
//! `MaxStartups` is 10 by default). Each child gets one *edge task* that owns the remote shell
//! process and its pipes:
//!
//! 1. spawn `RSH host AGENT` (own process group, so a terminal Ctrl-C reaches only greedyrun,
//!    which forwards it in order), write [`Down::Start`];
//! 2. wait for [`Up::Hello`] within `hello_timeout`; if the shell exits first with an sshd
//!    "too many startups" complaint, retry up to `retries` times with back-off; if no hello
//!    comes (or the job ends first), kill the shell and clean the host up through a second
//!    one ([`crate::reap`]), since sshd and rshd leave what the first started there running;
//! 3. relay: routed [`Down`] frames in, every [`Up`] frame of the subtree out;
//! 4. EOF of the shell's stdout without the child's [`Up::Bye`] reports [`Up::Lost`] naming
//!    the host and the shell's last stderr line;
//! 5. in a task stream or session, the lost child's launch subtree heals (`Parent::heal`):
//!    its descendants that said hello are reported lost (cut off), the rest are started from
//!    here, so one lost host costs that host alone.
//!
//! Channels are bounded: each edge's down queue holds [`EDGE_CAPACITY`] frames, so a stuck
//! child slows whoever routes to it; the one exception is teardown, which must not wait on a
//! stuck child: when its queue is full, its shell is killed instead.

use std::{
    collections::{BTreeSet, VecDeque},
    ops::Range,
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures_util::{SinkExt, StreamExt};
use greedy_tree::Tree;
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    process::Command,
    sync::{Semaphore, mpsc},
    time::Instant,
};
use tokio_util::{
    codec::{FramedRead, FramedWrite},
    sync::CancellationToken,
    task::TaskTracker,
};
use tracing::{Instrument, debug, info_span};

use greedy_pmix::JobSecret;

use crate::{
    connect,
    heartbeat::{self, Heartbeat},
    proto::{Cmd, Down, ParentCodec, Start, Up},
    reap, ssh,
};

/// Frames queued towards one child: a few hundred control frames or stdin chunks; beyond
/// that the router waits, which is the back-pressure we want.
pub const EDGE_CAPACITY: usize = 256;

/// Lines of a remote shell's stderr kept for the message when it fails.
const STDERR_TAIL: usize = 3;

/// How long a parent waits for `greedyd --reap` on a host whose agent never said hello.
const REAP_TIMEOUT: Duration = Duration::from_secs(3);

/// How a parent starts its children.
#[derive(Debug, Clone)]
pub struct EdgeConfig {
    /// Remote shell words (host and agent are appended).
    pub rsh: Vec<String>,
    /// Agent command words.
    pub agent: Vec<String>,
    /// Remote shells in flight before hello.
    pub batch: u32,
    /// Retries of a shell refused by sshd's MaxStartups.
    pub retries: u32,
    /// Wait for a child's hello (`--timeout`).
    pub hello_timeout: Duration,
    /// When a quiet child is lost (`--lost-after`).
    pub heartbeat: Heartbeat,
    /// Host index of this parent, `None` for greedyrun.
    pub by: Option<u32>,
}

struct Edge {
    /// The node it starts first, then the rest of its launch subtree.
    hosts: Range<usize>,
    tx: mpsc::Sender<Down>,
    kill: CancellationToken,
}

/// The children of one parent: routes frames to them and waits for them.
pub struct Fanout {
    parent: Arc<Parent>,
}

impl std::fmt::Debug for Fanout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fanout")
            .field("children", &self.parent.edges().len())
            .finish()
    }
}

/// One child: its node, then its launch subtree's sizes (the child first).
type Child = (u32, Vec<u32>);

/// A child's edge before its task runs: its Start, its down queue, its kill token.
type Pending = (ChildStart, mpsc::Receiver<Down>, CancellationToken);

impl Fanout {
    /// Starts the children of the root of `tree`, which covers launch positions `positions`
    /// (position `p` is host `p - 1`). `template` is the job's Start; each child's copy gets
    /// its own `node_idx` and `launch_sizes`.
    pub fn start(
        template: &Start,
        tree: &Tree,
        positions: Range<usize>,
        cfg: EdgeConfig,
        up: mpsc::Sender<Up>,
    ) -> Fanout {
        let tracker = TaskTracker::new();
        tracker.close();
        let parent = Arc::new(Parent {
            job: Arc::new(template.clone()),
            batch: Arc::new(Semaphore::new(cfg.batch.max(1) as usize)),
            cfg: Arc::new(cfg),
            edges: Mutex::default(),
            tracker,
            kill: CancellationToken::new(),
            stop: CancellationToken::new(),
        });
        let sizes = tree.subtree_sizes();
        let children = (tree.child_ranges(positions.clone()).into_iter())
            .map(|r| {
                let off = r.start - positions.start;
                ((r.start - 1) as u32, sizes[off..off + r.len()].to_vec())
            })
            .collect();
        if ssh::is_srun(&parent.cfg.rsh) && parent.cfg.by.is_none() {
            let pending = parent.register(children);
            parent.tracker.spawn(launch_star(
                template.secret.clone(),
                pending,
                up,
                parent.cfg.clone(),
                parent.kill.clone(),
            ));
        } else {
            parent.launch(children, up);
        }
        Fanout { parent }
    }

    /// Sends `cmd` towards `to` (every node when `None`), through the child(ren) whose subtree
    /// holds it. A lost child is skipped.
    pub async fn route(&self, to: Option<u32>, cmd: Cmd) {
        if to.is_none() && matches!(cmd, Cmd::Teardown | Cmd::Shutdown) {
            self.parent.stop.cancel();
        }
        let targets: Vec<(mpsc::Sender<Down>, CancellationToken)> = (self.parent.edges().iter())
            .filter(|e| to.is_none_or(|n| e.hosts.contains(&(n as usize))))
            .map(|e| (e.tx.clone(), e.kill.clone()))
            .collect();
        for (tx, kill) in targets {
            let frame = Down::Route {
                to,
                cmd: cmd.clone(),
            };
            if matches!(cmd, Cmd::Teardown) {
                // Never wait on a stuck child during teardown: kill its shell instead.
                if let Err(mpsc::error::TrySendError::Full(_)) = tx.try_send(frame) {
                    kill.cancel();
                }
            } else {
                let _ = tx.send(frame).await;
            }
        }
    }

    /// Kills every remote shell (and stops launching new ones).
    pub fn kill_all(&self) {
        self.parent.kill.cancel();
    }

    /// Waits until every edge has ended.
    pub async fn wait(&self) {
        self.parent.tracker.wait().await;
    }
}

/// What the edges of one parent share: the job, how to start a child, the edges to route
/// through (a lost child's adopted subtrees join them), and the tokens that end them all.
/// Not the queue up: whoever reads it sees it close once the last edge ended.
struct Parent {
    job: Arc<Start>,
    cfg: Arc<EdgeConfig>,
    /// Remote shells in flight before hello.
    batch: Arc<Semaphore>,
    edges: Mutex<Vec<Edge>>,
    tracker: TaskTracker,
    kill: CancellationToken,
    /// Cancelled at shutdown or teardown: children not yet started are never started.
    stop: CancellationToken,
}

impl Parent {
    fn edges(&self) -> std::sync::MutexGuard<'_, Vec<Edge>> {
        self.edges.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An edge per child, to route through from now on; what each edge's task needs; none
    /// once stopped, checked under the lock [`Fanout::route`] takes after stopping, so each
    /// edge either is routed the teardown or never starts.
    fn register(&self, children: Vec<Child>) -> Vec<Pending> {
        let mut edges = self.edges();
        if self.stop.is_cancelled() {
            return Vec::new();
        }
        (children.into_iter())
            .map(|(node_idx, launch_sizes)| {
                let (tx, rx) = mpsc::channel(EDGE_CAPACITY);
                let kill = self.kill.child_token();
                let first = node_idx as usize;
                edges.push(Edge {
                    hosts: first..first + launch_sizes[0] as usize,
                    tx,
                    kill: kill.clone(),
                });
                let start = ChildStart {
                    job: self.job.clone(),
                    node_idx,
                    launch_sizes,
                };
                (start, rx, kill)
            })
            .collect()
    }

    /// Starts the remote shells of `children` in order, at most `batch` of them (this
    /// parent's, across every call) before their hello; their frames go to `up`.
    fn launch(self: &Arc<Self>, children: Vec<Child>, up: mpsc::Sender<Up>) {
        let pending = self.register(children);
        let me = self.clone();
        self.tracker.spawn(async move {
            for (start, rx, edge_kill) in pending {
                let permit = tokio::select! {
                    p = me.batch.clone().acquire_owned() => p.expect("never closed"),
                    _ = me.kill.cancelled() => return,
                    _ = me.stop.cancelled() => return,
                };
                if me.kill.is_cancelled() || me.stop.is_cancelled() {
                    return;
                }
                let node = start.node_idx;
                let span = info_span!("edge", job = %start.job.job_id, node);
                let edge = run_edge(start, rx, up.clone(), permit, edge_kill, me.clone());
                me.tracker.spawn(edge.instrument(span));
                debug!(node, "remote shell started");
            }
        });
    }

    /// Child `lost` is gone: routes to it stop, and in a task stream or session (which goes
    /// on without lost hosts) its launch subtree heals. Descendants that said hello through
    /// it are cut off with it (their agents end once their parent's pipe closes), each
    /// reported lost; every one not started yet is adopted: started from here, with the
    /// subtree planned for it, instead of being lost too. A job fails with its first lost
    /// host, and greedyrun names the subtree that goes with it.
    async fn heal(
        self: &Arc<Self>,
        lost: &ChildStart,
        started: &BTreeSet<u32>,
        up: &mpsc::Sender<Up>,
    ) {
        self.edges()
            .retain(|e| e.hosts.start != lost.node_idx as usize);
        if !self.job.tasks || self.kill.is_cancelled() || self.stop.is_cancelled() {
            return;
        }
        let Ok(tree) = Tree::from_subtree_sizes(lost.launch_sizes.clone()) else {
            return;
        };
        let (mut cut, mut adopt) = (Vec::new(), Vec::new());
        sort_out(&tree, 0, lost.node_idx, started, &mut cut, &mut adopt);
        for (node, by) in cut {
            let what = format!(
                "cut off: {}, through which it was started, was lost",
                lost.job.hosts[by as usize]
            );
            let by = Some(by);
            let _ = up.send(Up::Lost { node, by, what }).await;
        }
        if !adopt.is_empty() {
            debug!(
                lost = lost.node_idx,
                adopted = adopt.len(),
                "healing the launch tree"
            );
            self.launch(adopt, up.clone());
        }
    }
}

/// Below position `v` of a lost child's subtree `tree` (position 0 is node `base`): the
/// started descendants, cut off, with the node that started each; and the roots of the
/// subtrees not started, to adopt, in launch order.
fn sort_out(
    tree: &Tree,
    v: usize,
    base: u32,
    started: &BTreeSet<u32>,
    cut: &mut Vec<(u32, u32)>,
    adopt: &mut Vec<Child>,
) {
    for c in tree.children(v) {
        let node = base + c as u32;
        if started.contains(&node) {
            cut.push((node, base + v as u32));
            sort_out(tree, c, base, started, cut, adopt);
        } else {
            let r = tree.subtree_range(c);
            adopt.push((node, tree.subtree_sizes()[r].to_vec()));
        }
    }
}

/// How long srun may take to end by itself once every edge has ended (its tasks are
/// exiting), before it is told to end them.
const SRUN_LINGER: Duration = Duration::from_secs(3);

/// greedyrun's children when one srun step starts them all ([`connect`]): the step, then an
/// edge per host waiting for its agent's connection. Returns once srun has ended.
async fn launch_star(
    key: JobSecret,
    pending: Vec<(ChildStart, mpsc::Receiver<Down>, CancellationToken)>,
    up: mpsc::Sender<Up>,
    cfg: Arc<EdgeConfig>,
    kill: CancellationToken,
) {
    if pending.is_empty() {
        return;
    }
    let hosts: Vec<String> = pending
        .iter()
        .map(|(s, _, _)| s.host().to_string())
        .collect();
    let (star, conns) =
        match connect::Star::start(&cfg.rsh, &cfg.agent, &hosts, &key, cfg.hello_timeout).await {
            Ok(started) => started,
            Err(e) => {
                for (s, _, _) in &pending {
                    let what = format!("cannot start the agents through srun: {e}");
                    let _ = up
                        .send(Up::Lost {
                            node: s.node_idx,
                            by: None,
                            what,
                        })
                        .await;
                }
                return;
            }
        };
    let edges = TaskTracker::new();
    for ((start, rx, edge_kill), conn) in pending.into_iter().zip(conns) {
        let span = info_span!("edge", job = %start.job.job_id, node = start.node_idx);
        let edge = run_star_edge(
            start,
            rx,
            up.clone(),
            conn,
            star.clone(),
            edge_kill,
            (cfg.hello_timeout, cfg.heartbeat),
        );
        edges.spawn(edge.instrument(span));
    }
    edges.close();
    tokio::select! {
        _ = edges.wait() => {
            // Every agent said bye or was lost: srun ends as its tasks do, and ends the tasks
            // of hosts whose agent never connected when told.
            tokio::select! {
                _ = star.srun_ended() => {}
                _ = tokio::time::sleep(SRUN_LINGER) => star.stop(),
            }
        }
        _ = kill.cancelled() => star.stop(),
    }
    star.srun_ended().await;
    // srun is gone: no agent will connect any more.
    star.stop();
}

/// One child: launch (with retries), hello, relay, and the lost report.
async fn run_edge(
    start: ChildStart,
    mut rx: mpsc::Receiver<Down>,
    up: mpsc::Sender<Up>,
    permit: tokio::sync::OwnedSemaphorePermit,
    kill: CancellationToken,
    parent: Arc<Parent>,
) {
    let edge = ShellEdge {
        node: start.node_idx,
        host: start.host().to_string(),
        token: reap::token(&start.job.job_id, start.node_idx),
        start,
        up,
        kill,
        cfg: parent.cfg.clone(),
    };
    let lost = edge.run(&mut rx, permit).await;
    // Nothing goes down this edge any more: a router waiting on its full queue goes on.
    drop(rx);
    if let Some(Loss { what, started }) = lost {
        let _ = edge.up.send(edge.lost(what)).await;
        parent.heal(&edge.start, &started, &edge.up).await;
    }
}

/// How an edge to a child ended without the child's bye, or the edge being killed.
struct Loss {
    what: String,
    /// The descendants that said hello through the child and have not said bye.
    started: BTreeSet<u32>,
}

impl Loss {
    fn before_hello(what: String) -> Option<Loss> {
        Some(Loss {
            what,
            started: BTreeSet::new(),
        })
    }
}

/// `": text"`, or nothing for no text: a shell's last stderr lines after a message.
fn colon(text: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}

/// The edge to one child over a remote shell ([`run_edge`]): one method per phase.
struct ShellEdge {
    start: ChildStart,
    node: u32,
    host: String,
    /// Names what the agent started on the host, for `greedyd --reap`.
    token: String,
    up: mpsc::Sender<Up>,
    kill: CancellationToken,
    cfg: Arc<EdgeConfig>,
}

/// How the hello phase ended.
enum Hello {
    /// The child said hello.
    Said,
    /// No hello in time (why): the shell is gone, the host cleaned up.
    Late(String),
    /// The edge was killed: the shell is gone, the host cleaned up.
    Killed,
    /// The shell's output ended (`None`) or was not greedyd's protocol (`Some`, the message)
    /// before hello.
    Failed(Option<String>),
}

/// A remote shell running `greedyd` for one child, with its pipes.
struct Shell {
    /// The shell's command line (the last word is the reap token).
    argv: Vec<String>,
    child: tokio::process::Child,
    /// Its stdin, until the relay takes it.
    down: Option<FramedWrite<tokio::process::ChildStdin, ParentCodec>>,
    frames: FramedRead<tokio::process::ChildStdout, ParentCodec>,
    /// The last lines of its stderr.
    tail: Arc<Mutex<VecDeque<String>>>,
    /// Set at hello: stderr lines after it go up as notes.
    hello_seen: Arc<std::sync::atomic::AtomicBool>,
    stderr_task: tokio::task::JoinHandle<()>,
}

impl Shell {
    /// The command that starts the agent, without the reap token.
    fn command(&self) -> String {
        self.argv[..self.argv.len() - 1].join(" ")
    }

    /// The last lines of its stderr, joined.
    fn tail_text(&self) -> String {
        let t = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        t.iter().cloned().collect::<Vec<_>>().join(" / ")
    }

    /// After its output ended before hello: its exit status (killed if it does not end within
    /// 5 s) and its stderr's last lines.
    async fn ended_before_hello(&mut self) -> (String, String) {
        let status = match tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await {
            Ok(Ok(s)) => s.to_string(),
            _ => {
                kill_shell(&mut self.child);
                "still running; killed".into()
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), &mut self.stderr_task).await;
        (status, self.tail_text())
    }

    /// After the relay: its exit status (killed and reaped if it does not end within 5 s),
    /// once its stderr was read (at most 2 s more).
    async fn ended_after_relay(&mut self) -> String {
        let status = match tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await {
            Ok(Ok(s)) => s.to_string(),
            _ => {
                kill_shell(&mut self.child);
                let _ = self.child.wait().await;
                "killed".into()
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), &mut self.stderr_task).await;
        status
    }
}

impl ShellEdge {
    /// Launch (with retries), hello, relay; the loss, if the child was lost.
    async fn run(
        &self,
        rx: &mut mpsc::Receiver<Down>,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> Option<Loss> {
        // Held until the child's hello (across retries): at most `batch` shells in flight.
        let mut permit = Some(permit);
        let mut attempt = 0;
        loop {
            let mut shell = match self.launch() {
                Ok(shell) => shell,
                Err(what) => return Loss::before_hello(what),
            };
            send_start(shell.down.as_mut().expect("not relayed yet"), &self.start).await;
            match self.hello(&mut shell).await {
                Hello::Said => {
                    permit.take();
                    return self.relay(shell, rx).await;
                }
                Hello::Late(what) => return Loss::before_hello(what),
                Hello::Killed => return None,
                Hello::Failed(why) => {
                    let (status, tail) = shell.ended_before_hello().await;
                    if why.is_none() && attempt < self.cfg.retries && ssh::is_retryable(&tail) {
                        attempt += 1;
                        debug!(attempt, "remote shell refused, retrying: {tail}");
                        tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                        continue;
                    }
                    return Loss::before_hello(why.unwrap_or_else(|| {
                        format!(
                            "remote shell `{}` ended before greedyd said hello ({status}){}",
                            shell.command(),
                            colon(&tail)
                        )
                    }));
                }
            }
        }
    }

    /// The loss of this child, reported by this parent.
    fn lost(&self, what: String) -> Up {
        Up::Lost {
            node: self.node,
            by: self.cfg.by,
            what,
        }
    }

    /// Starts the remote shell; why not, if it cannot run.
    fn launch(&self) -> Result<Shell, String> {
        let (argv, child) = spawn_agent(
            &self.cfg,
            &self.host,
            reap::LAUNCH_FLAG,
            &self.token,
            Stdio::piped(),
        );
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                let shell = self.cfg.rsh.first().cloned().unwrap_or_default();
                return Err(format!("cannot run remote shell {shell:?}: {e}"));
            }
        };
        let down = FramedWrite::new(child.stdin.take().expect("piped"), ParentCodec::default());
        let frames = FramedRead::new(child.stdout.take().expect("piped"), ParentCodec::default());
        let tail = Arc::new(Mutex::new(VecDeque::<String>::new()));
        let hello_seen = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stderr_task = tokio::spawn(read_stderr(
            child.stderr.take().expect("piped"),
            tail.clone(),
            hello_seen.clone(),
            self.up.clone(),
            self.node,
        ));
        Ok(Shell {
            argv,
            child,
            down: Some(down),
            frames,
            tail,
            hello_seen,
            stderr_task,
        })
    }

    /// Waits for the child's hello within the hello timeout, passing on what its subtree
    /// says meanwhile.
    async fn hello(&self, shell: &mut Shell) -> Hello {
        let deadline = tokio::time::Instant::now() + self.cfg.hello_timeout;
        loop {
            tokio::select! {
                f = shell.frames.next() => match f {
                    Some(Ok(Up::Hello { node })) => {
                        shell.hello_seen.store(true, std::sync::atomic::Ordering::Relaxed);
                        let _ = self.up.send(Up::Hello { node }).await;
                        return Hello::Said;
                    }
                    Some(Ok(other)) => { let _ = self.up.send(other).await; }
                    Some(Err(e)) => return Hello::Failed(Some(format!(
                        "the remote shell's output is not greedyd's protocol ({e}); is {} installed on {}, and does the login print anything?",
                        self.cfg.agent.join(" "), self.host))),
                    None => return Hello::Failed(None),
                },
                _ = tokio::time::sleep_until(deadline) => return Hello::Late(self.no_hello(shell).await),
                _ = self.kill.cancelled() => {
                    kill_shell(&mut shell.child);
                    let _ = shell.child.wait().await;
                    self.reap().await;
                    return Hello::Killed;
                }
            }
        }
    }

    /// No hello within the timeout: kills the shell, cleans the host up; says why.
    async fn no_hello(&self, shell: &mut Shell) -> String {
        kill_shell(&mut shell.child);
        let _ = shell.child.wait().await;
        let what = format!(
            "no hello from greedyd within {} s (waited for `{}` to start the agent){}",
            self.cfg.hello_timeout.as_secs_f64(),
            shell.command(),
            colon(&shell.tail_text())
        );
        self.reap().await;
        what
    }

    /// Cleans up the host of a child that never said hello ([`crate::reap`]).
    async fn reap(&self) {
        reap_remote(&self.cfg, self.node, &self.host, &self.token, &self.up).await;
    }

    /// Relays the child's frames until its side closes; the loss if it went away without
    /// saying bye (and was not killed).
    async fn relay(&self, mut shell: Shell, rx: &mut mpsc::Receiver<Down>) -> Option<Loss> {
        let down = shell.down.take().expect("relayed once");
        let Shell { child, frames, .. } = &mut shell;
        let relay = Relay {
            node: self.node,
            rx,
            frames,
            up: &self.up,
            kill: &self.kill,
            beat: self.cfg.heartbeat,
        };
        let Relayed {
            bye,
            killed,
            silent,
            started,
        } = relay.run(down, || kill_shell(child)).await;
        let status = shell.ended_after_relay().await;
        let what = if silent {
            self.cfg.heartbeat.silence()
        } else {
            format!(
                "the agent or its remote shell went away mid-job ({status}){}",
                colon(&shell.tail_text())
            )
        };
        (silent || !bye && !killed).then_some(Loss { what, started })
    }
}

/// How a relay ended.
struct Relayed {
    /// The child said `Bye`.
    bye: bool,
    /// The edge was killed (`kill`).
    killed: bool,
    /// Nothing came from the child for `--lost-after`: it was cut off.
    silent: bool,
    /// The child's descendants that said hello and have not said bye or been lost.
    started: BTreeSet<u32>,
}

/// An edge to a child that said hello: routed frames go down to it, every frame of its
/// subtree comes up, until its side closes, it is killed, or it falls silent.
struct Relay<'a, R> {
    node: u32,
    rx: &'a mut mpsc::Receiver<Down>,
    frames: &'a mut FramedRead<R, ParentCodec>,
    up: &'a mpsc::Sender<Up>,
    kill: &'a CancellationToken,
    beat: Heartbeat,
}

impl<R: tokio::io::AsyncRead + Unpin> Relay<'_, R> {
    /// Relays until the child's side closes. `end` cuts the child off (kills its remote
    /// shell, or closes its connection): when the edge is killed, when nobody listens upstream
    /// any more, or when the child has been silent for `--lost-after`.
    async fn run<W>(self, down: FramedWrite<W, ParentCodec>, mut end: impl FnMut()) -> Relayed
    where
        W: tokio::io::AsyncWrite + Unpin,
    {
        let mut ended = Relayed {
            bye: false,
            killed: false,
            silent: false,
            started: BTreeSet::new(),
        };
        let mut rx_open = true;
        let mut down = Some(down);
        let mut heard = Instant::now();
        let mut sent = Instant::now();
        loop {
            let ping_at = self.beat.ping_every().map(|p| sent + p);
            let lost_at = self.beat.deadline(heard);
            tokio::select! {
                d = self.rx.recv(), if rx_open => match d {
                    Some(d) => {
                        if !self.send(&mut down, d, lost_at).await {
                            ended.silent = true;
                        }
                        sent = Instant::now();
                    }
                    None => rx_open = false,
                },
                () = heartbeat::until(ping_at), if down.is_some() => {
                    if !self.send(&mut down, Down::Ping, lost_at).await {
                        ended.silent = true;
                    }
                    sent = Instant::now();
                }
                f = self.frames.next() => match f {
                    Some(Ok(msg)) => {
                        if self.on_frame(msg, &mut ended, &mut down).await.is_err() {
                            // Nobody listens any more: end this subtree.
                            end();
                        }
                        // Heard after passing it up: a wait upstream is not the child's silence.
                        heard = Instant::now();
                    }
                    Some(Err(_)) | None => break,
                },
                () = heartbeat::until(lost_at) => {
                    if ended.killed {
                        // Killed, and its side never closed (a cut link): stop waiting for it.
                        break;
                    }
                    ended.silent = true;
                }
                _ = self.kill.cancelled(), if !ended.killed => {
                    // A remote shell dies of `end`; a connected-back agent sees its connection
                    // close and tears its ranks down. Either way its side closes next.
                    ended.killed = true;
                    end();
                    down = None;
                }
            }
            if ended.silent {
                // Its side may never close (a cut link): end it, and stop waiting.
                end();
                break;
            }
        }
        ended
    }

    /// Sends `d` down unless the child stays silent until `lost_at` (its pipe full and
    /// unread); false then.
    async fn send<W>(
        &self,
        down: &mut Option<FramedWrite<W, ParentCodec>>,
        d: Down,
        lost_at: Option<Instant>,
    ) -> bool
    where
        W: tokio::io::AsyncWrite + Unpin,
    {
        let Some(w) = down.as_mut() else { return true };
        tokio::select! {
            _ = w.send(d) => true,
            () = heartbeat::until(lost_at) => false,
        }
    }

    /// One frame from the child's subtree, passed up (but pings); an error when nobody
    /// listens upstream any more.
    async fn on_frame<W>(
        &self,
        msg: Up,
        ended: &mut Relayed,
        down: &mut Option<FramedWrite<W, ParentCodec>>,
    ) -> Result<(), ()>
    where
        W: tokio::io::AsyncWrite + Unpin,
    {
        match msg {
            Up::Ping => return Ok(()),
            Up::Hello { node } if node != self.node => {
                ended.started.insert(node);
            }
            Up::Bye { node } | Up::Lost { node, .. } => {
                ended.started.remove(&node);
            }
            _ => {}
        }
        if matches!(msg, Up::Bye { node } if node == self.node) {
            ended.bye = true;
            // Close the child's stdin once it said bye: it drains its stdin to EOF before
            // exiting. An rsh child's stdin *is* the TCP socket, and exiting with unread
            // bytes there makes the kernel send RST, which can destroy the Bye still on its
            // way to us.
            if let Some(mut w) = down.take() {
                let _ = w.get_mut().shutdown().await;
            }
        }
        self.up.send(msg).await.map_err(|_| ())
    }
}

/// The first read buffer of an edge to an agent that connected back (8 KiB by default).
const EDGE_READ_START: usize = 256;

/// One child that the srun step started ([`connect`]): waits for its agent to connect back,
/// then hello and relay as over a remote shell. The agent is Slurm's to start and end; a
/// host whose agent never connects is reported lost, naming why when srun ended first.
async fn run_star_edge(
    start: ChildStart,
    mut rx: mpsc::Receiver<Down>,
    up: mpsc::Sender<Up>,
    conn: connect::Pending,
    star: connect::Star,
    kill: CancellationToken,
    (hello_timeout, beat): (Duration, Heartbeat),
) {
    let node = start.node_idx;
    let host = start.host().to_string();
    let lost = |what: String| Up::Lost {
        node,
        by: None,
        what,
    };
    let deadline = tokio::time::Instant::now() + hello_timeout;
    let stream = tokio::select! {
        c = conn => match c {
            Ok(s) => s,
            Err(_) => return,
        },
        why = star.srun_ended() => {
            let _ = up.send(lost(format!(
                "{why} before greedyd on {host} connected back (srun's own messages are above)"
            ))).await;
            return;
        }
        _ = tokio::time::sleep_until(deadline) => {
            let _ = up.send(lost(format!(
                "greedyd on {host} did not connect back within {} s of srun starting every agent",
                hello_timeout.as_secs_f64()
            ))).await;
            return;
        }
        _ = kill.cancelled() => return,
    };
    let (r, w) = stream.into_split();
    // Every host is greedyrun's child here: a read buffer that starts small (it grows with
    // the frames) keeps greedyrun's memory per host small.
    let mut frames = FramedRead::with_capacity(r, ParentCodec::default(), EDGE_READ_START);
    let mut down = FramedWrite::new(w, ParentCodec::default());
    send_start(&mut down, &start).await;
    let hello = loop {
        tokio::select! {
            f = frames.next() => match f {
                Some(Ok(Up::Hello { node: n })) => {
                    let _ = up.send(Up::Hello { node: n }).await;
                    break true;
                }
                Some(Ok(other)) => { let _ = up.send(other).await; }
                Some(Err(_)) | None => break false,
            },
            _ = tokio::time::sleep_until(deadline) => break false,
            _ = kill.cancelled() => return,
        }
    };
    if !hello {
        let _ = up
            .send(lost(format!(
                "greedyd on {host} connected back but did not say hello within {} s",
                hello_timeout.as_secs_f64()
            )))
            .await;
        return;
    }
    let relay = Relay {
        node,
        rx: &mut rx,
        frames: &mut frames,
        up: &up,
        kill: &kill,
        beat,
    };
    let Relayed {
        bye,
        killed,
        silent,
        ..
    } = relay.run(down, || {}).await;
    if silent {
        let _ = up.send(lost(beat.silence())).await;
    } else if !bye && !killed {
        let _ = up
            .send(lost(
                "the agent's connection to greedyrun closed mid-job (the agent died, or its host)"
                    .into(),
            ))
            .await;
    }
}

/// A child's Start: the job's, one copy shared by every child, and the child's own place in
/// the tree. The whole Start (the plan: every host and rank) is built only to be written: a
/// copy kept per child made greedyrun's memory grow with children × hosts (under `--rsh
/// srun` every host is a child).
#[derive(Debug)]
struct ChildStart {
    job: Arc<Start>,
    node_idx: u32,
    launch_sizes: Vec<u32>,
}

impl ChildStart {
    fn host(&self) -> &str {
        &self.job.hosts[self.node_idx as usize]
    }
}

/// Writes `start` to a child, then lets the writer's buffer go: it grew to the size of the
/// plan and would be kept, unused, for the edge's life.
async fn send_start<W: tokio::io::AsyncWrite + Unpin>(
    down: &mut FramedWrite<W, ParentCodec>,
    start: &ChildStart,
) {
    let mut full = Start::clone(&start.job);
    full.node_idx = start.node_idx;
    full.launch_sizes = start.launch_sizes.clone();
    let _ = down.send(Down::Start(Box::new(full))).await;
    *down.write_buffer_mut() = Default::default();
}

/// Starts `RSH host AGENT FLAG TOKEN` (`--launch` or `--reap`, see [`reap`]) in a process
/// group of its own, stdout and stderr piped; returns its argv for messages.
fn spawn_agent(
    cfg: &EdgeConfig,
    host: &str,
    flag: &str,
    token: &str,
    stdin: Stdio,
) -> (Vec<String>, std::io::Result<tokio::process::Child>) {
    let mut agent = cfg.agent.clone();
    agent.extend([flag.to_string(), token.to_string()]);
    let argv = ssh::command_line(&cfg.rsh, host, &agent);
    let child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn();
    (argv, child)
}

/// Runs `AGENT --reap TOKEN` on a host whose agent never said hello (see [`reap`]), through
/// a second remote shell; reports [`Up::Unclean`] if that cannot be done.
async fn reap_remote(cfg: &EdgeConfig, node: u32, host: &str, token: &str, up: &mpsc::Sender<Up>) {
    let (argv, child) = spawn_agent(cfg, host, reap::REAP_FLAG, token, Stdio::null());
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            let what = format!("cannot run the remote shell to clean it up: {e}");
            let _ = up.send(Up::Unclean { node, what }).await;
            return;
        }
    };
    let (mut stdout, mut stderr) = (
        child.stdout.take().expect("piped"),
        child.stderr.take().expect("piped"),
    );
    let finished = tokio::time::timeout(REAP_TIMEOUT, async {
        let (mut out, mut err) = (String::new(), String::new());
        let _ = tokio::join!(
            stdout.read_to_string(&mut out),
            stderr.read_to_string(&mut err)
        );
        child.wait().await.map(|status| (status, out, err))
    })
    .await;
    let what = match finished {
        Ok(Ok((status, out, _))) if status.success() => {
            debug!(
                host,
                "reaped {} processes left by a remote shell",
                out.trim()
            );
            return;
        }
        Ok(Ok((status, _, err))) => format!(
            "`{}` failed ({status}): {}",
            argv.join(" "),
            err.trim().replace('\n', " / ")
        ),
        Ok(Err(e)) => e.to_string(),
        Err(_) => {
            kill_shell(&mut child);
            let _ = child.wait().await;
            format!(
                "a second remote shell did not answer within {} s either",
                REAP_TIMEOUT.as_secs()
            )
        }
    };
    let _ = up.send(Up::Unclean { node, what }).await;
}

/// Keeps the last lines of a remote shell's stderr; after hello, forwards each as a note.
async fn read_stderr(
    stderr: tokio::process::ChildStderr,
    tail: Arc<Mutex<VecDeque<String>>>,
    hello_seen: Arc<std::sync::atomic::AtomicBool>,
    up: mpsc::Sender<Up>,
    node: u32,
) {
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let line = line.trim_end().to_string();
        if line.is_empty() {
            continue;
        }
        {
            let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
            if t.len() == STDERR_TAIL {
                t.pop_front();
            }
            t.push_back(line.clone());
        }
        if hello_seen.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = up.send(Up::Note { node, text: line }).await;
        }
    }
}

/// Kills a remote shell and everything it started here: it leads its own process group, and
/// a wrapper script's children (or an ssh ProxyCommand) would outlive a kill of its pid alone.
fn kill_shell(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id() {
        crate::signals::signal_group(pid, nix::sys::signal::Signal::SIGKILL);
    }
    let _ = child.start_kill();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Node 4's subtree: 4 starts 5 (which starts 6 and 7) and 8 (which starts 9).
    fn subtree() -> Tree {
        Tree::from_subtree_sizes(vec![6, 3, 1, 1, 2, 1]).unwrap()
    }

    fn sorted(started: &[u32]) -> (Vec<(u32, u32)>, Vec<Child>) {
        let (mut cut, mut adopt) = (Vec::new(), Vec::new());
        let started = started.iter().copied().collect();
        sort_out(&subtree(), 0, 4, &started, &mut cut, &mut adopt);
        (cut, adopt)
    }

    #[test]
    fn a_child_lost_before_its_children_started_has_them_adopted_whole() {
        let (cut, adopt) = sorted(&[]);
        assert!(cut.is_empty());
        assert_eq!(adopt, [(5, vec![3, 1, 1]), (8, vec![2, 1])]);
    }

    #[test]
    fn started_descendants_are_cut_off_and_what_they_had_not_started_is_adopted() {
        // 5 and 6 said hello; 7 (5's) and 8 with 9 had not started.
        let (cut, adopt) = sorted(&[5, 6]);
        assert_eq!(cut, [(5, 4), (6, 5)]);
        assert_eq!(adopt, [(7, vec![1]), (8, vec![2, 1])]);
        // Everyone started: all cut, each named with the node that started it.
        let (cut, adopt) = sorted(&[5, 6, 7, 8, 9]);
        assert_eq!(cut, [(5, 4), (6, 5), (7, 5), (8, 4), (9, 8)]);
        assert!(adopt.is_empty());
    }
}
