//! The node agent inside slurmstepd: greedy-pmix's node service, and the tasks' side of it.
//!
//! Lifecycle (one step per slurmstepd process):
//! 1. `prefork` (root, before any task is forked) calls [`Agent::start`]: resolve this node's
//!    NodeAddr, start a tokio runtime on its own threads and greedy-pmix's
//!    [`NodeService`]: every wire-up family the step serves (all of them unless the user chose
//!    one), each rank's variables (PMIx registers the ranks), a PMI socket per rank and a
//!    notify pipe, and return; a failure so far is an error returned to Slurm (the step fails
//!    to launch), never an abort. The node joins the overlay in the background (bounded by
//!    `GreedyJoinTimeout`) while slurmstepd forks the tasks and they load their libraries; a
//!    rank's first fence waits for the join. A join that fails aborts the job.
//! 2. each forked task runs the task hook, which reads the immutable [`TaskTable`] (no lock:
//!    the fork may have happened while a runtime thread held one), keeps its own socket across
//!    exec, hands its stdio to the agent when the step serves Charm++, and writes a
//!    [`TaskRecord::Forked`] into the notify pipe with the CPUs the task may run on (the agent
//!    then closes slurmstepd's copy of that rank's socket, so a rank that dies is seen as EOF;
//!    slurmstepd binds a task before it releases it to the hooks, so PMIx registers the job,
//!    with each rank's locality, once every local task has written its record); a step that
//!    serves PMIx holds each task there until that registration (a client reads its job's
//!    data as soon as it connects); then the task's watcher (the process slurmstepd forked)
//!    writes [`TaskRecord::Exited`] with the program's exact code when it ends.
//! 3. an abort anywhere in the job (a rank's `PMI_Abort`, a malformed message, a rank that
//!    fails before finalize, ranks of two families, a timeout) reaches every node over the
//!    overlay; the node where it started reports the code to srun and asks slurmctld to kill
//!    the step (`Hooks::kill_step`), which ends every task on every node. That rule is
//!    greedy-pmix's ([`NodeService::watch_end`]); this module supplies what only a Slurm step
//!    can do (`StepEnd`, greedy-pmix's `JobEnd`).
//! 4. there is no per-step hook in slurmstepd after the tasks end: the agent stops in `fini`,
//!    which slurmstepd calls at teardown, after every task has been reaped
//!    ([`Agent::shutdown`], bounded by `GreedyShutdownTimeout`). A short step (`srun
//!    /bin/true`) can get there before its node has joined: the join is let finish first,
//!    else left saying `Bye`, since the other nodes take a link closed without one as a
//!    crash and abort the job.

use crate::Error;
use crate::charm::{self, Stdio};
use crate::plan::{self, Rendezvous as Choice, StepPlan, StepRecord};
use crate::rendezvous::{ExitReport, SrunRendezvous, ask_spawn, await_job_end, report_exit};
use greedy_pmix::charm::server::{OUTPUT_CAPACITY, Output};
use greedy_pmix::child::PendingSpawn;
use greedy_pmix::family::Family;
use greedy_pmix::node::job_end::{EndPolicy, JobEnd, Kill};
use greedy_pmix::node::{NodeConfig, NodeService};
use greedy_pmix::peer::{JobProcesses, JobTrees};

use crate::attach::Attachments;
use greedy_pmix::pmix::Binding;
use greedy_pmix::rendezvous::{Fixed, Rendezvous};
use greedy_pmix::{AbortInfo, WallTime};
use greedy_sys::slurm::CpuBits;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span, error, info, info_span, warn};

/// slurm.conf's NodeAddr for a NodeName.
pub type NodeAddrFn = dyn Fn(&str) -> Option<String> + Send + Sync;
/// Kills every task of step (job, step); false if slurmctld refused.
pub type KillStepFn = dyn Fn(u32, u32) -> bool + Send + Sync;

/// What the agent needs from the Slurm process it runs in; supplied by `exports.rs`, so this
/// module links (and is tested) without Slurm.
pub struct Hooks {
    /// slurm.conf's NodeAddr for a NodeName.
    pub node_addr: Box<NodeAddrFn>,
    /// Kills every task of step (job, step); false if slurmctld refused.
    pub kill_step: Arc<KillStepFn>,
}

/// One local rank's socket and environment, read by the task hook after fork.
#[derive(Debug, Clone)]
pub struct RankSlot {
    /// PMI: the task's end of the socketpair (its number in slurmstepd, inherited by the
    /// fork). A step that does not serve PMI has none.
    pub fd: Option<RawFd>,
    /// The variables to put into the task's env.
    pub env: Vec<(String, String)>,
    /// Variables to put there only if the task's env has none of that name (the user's
    /// choice wins: `MPIR_CVAR_PMI_VERSION`).
    pub defaults: Vec<(String, String)>,
}

/// Everything the task hook reads: immutable once `prefork` returns.
#[derive(Debug)]
pub struct TaskTable {
    /// Local ranks.
    pub ranks: HashMap<u32, RankSlot>,
    /// The uid slurmstepd's record gives the tasks: a task hook running as another is a sign
    /// that this build misreads the record, and the task is failed rather than served.
    pub job_uid: u32,
    notify: std::io::PipeWriter,
    /// Steps serving PMIx: a pipe whose write end the agent closes once PMIx has registered
    /// the job (the number of the write end, which each task closes its copy of, and how
    /// long a task waits).
    registered: Option<(std::io::PipeReader, RawFd, Duration)>,
    /// Charm++ steps: where each task sends its stdout and stderr ([`crate::charm`]).
    charm_stdio: Option<std::os::unix::net::UnixDatagram>,
}

impl TaskTable {
    /// The table of a step whose tasks another process serves ([`crate::attach`]): no PMI
    /// socket, no registration to wait for; the reader of the task records.
    pub fn served_elsewhere(
        ranks: HashMap<u32, RankSlot>,
        job_uid: u32,
    ) -> std::io::Result<(TaskTable, std::io::PipeReader)> {
        let (reader, notify) = std::io::pipe()?;
        let table = TaskTable {
            ranks,
            job_uid,
            notify,
            registered: None,
            charm_stdio: None,
        };
        Ok((table, reader))
    }

    /// Tells the agent that `rank`'s task has been forked (it holds its socket now), so
    /// slurmstepd can close its own copy, and where the task may run (slurmstepd bound it
    /// before releasing it to the hooks). One `write(2)`: atomic on a pipe.
    pub fn forked(&self, rank: u32) -> std::io::Result<()> {
        let cpus = greedy_sys::slurm::affinity();
        (&self.notify).write_all(TaskRecord::Forked(rank, cpus).encode().as_ref())
    }

    /// Steps serving PMIx: waits until PMIx has registered the job (every local task has
    /// said [`TaskTable::forked`]), at most the registration's own limit; whether it did.
    /// Async-signal-safe. Other steps: true at once.
    pub fn wait_registered(&self) -> bool {
        match &self.registered {
            Some((read, write, limit)) => {
                greedy_sys::slurm::wait_closed(read.as_raw_fd(), *write, *limit)
            }
            None => true,
        }
    }

    /// Where a task's watcher writes its [`TaskRecord::Exited`].
    pub fn notify_fd(&self) -> RawFd {
        self.notify.as_raw_fd()
    }

    /// Charm++ steps: hands the task's stdin, stdout and stderr to the agent, which writes the
    /// rank's prints there and answers its `scanf` from its stdin ([`charm::send_stdio`];
    /// async-signal-safe). Other steps: nothing.
    pub fn send_stdio(
        &self,
        rank: u32,
        fds: [std::os::fd::BorrowedFd<'_>; 3],
    ) -> std::io::Result<()> {
        match &self.charm_stdio {
            Some(sock) => charm::send_stdio(sock, rank, fds),
            None => Ok(()),
        }
    }
}

/// What a task hook or a task's watcher tells the agent: 8 bytes, `rank` then `code`
/// (little-endian), [`TaskRecord::FORKED`] as the code of a fork, which 128 more bytes follow
/// (the CPUs as 16 little-endian words, all zero for unknown). Each record is one `write(2)`,
/// atomic on the pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskRecord {
    /// The task of this rank was forked, and may run on these CPUs (`None`: unknown).
    Forked(u32, Option<CpuBits>),
    /// The rank's program ended with this exit code, or 128 + its signal.
    Exited(u32, i32),
}

/// A [`TaskRecord`]'s wire form, built without allocating (a forked task may not).
pub struct RecordBytes {
    buf: [u8; TaskRecord::MAX_LEN],
    len: usize,
}

impl AsRef<[u8]> for RecordBytes {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl TaskRecord {
    /// The code of a fork record (no exit code is negative).
    pub const FORKED: i32 = -1;
    /// The longest record: a fork's.
    pub const MAX_LEN: usize = 8 + 8 * 16;

    /// The wire form.
    pub fn encode(self) -> RecordBytes {
        let (rank, code, cpus) = match self {
            TaskRecord::Forked(rank, cpus) => (rank, Self::FORKED, Some(cpus.unwrap_or_default())),
            TaskRecord::Exited(rank, code) => (rank, code, None),
        };
        let mut buf = [0u8; Self::MAX_LEN];
        buf[..4].copy_from_slice(&rank.to_le_bytes());
        buf[4..8].copy_from_slice(&code.to_le_bytes());
        let len = match cpus {
            Some(words) => {
                for (i, w) in words.iter().enumerate() {
                    buf[8 + 8 * i..16 + 8 * i].copy_from_slice(&w.to_le_bytes());
                }
                Self::MAX_LEN
            }
            None => 8,
        };
        RecordBytes { buf, len }
    }

    /// Reads one record.
    pub fn read_from(reader: &mut impl Read) -> std::io::Result<TaskRecord> {
        let mut head = [0u8; 8];
        reader.read_exact(&mut head)?;
        let rank = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
        Ok(
            match i32::from_le_bytes(head[4..].try_into().expect("4 bytes")) {
                Self::FORKED => {
                    let mut body = [0u8; Self::MAX_LEN - 8];
                    reader.read_exact(&mut body)?;
                    let mut words = CpuBits::default();
                    for (w, bytes) in words.iter_mut().zip(body.chunks_exact(8)) {
                        *w = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
                    }
                    TaskRecord::Forked(rank, (words != CpuBits::default()).then_some(words))
                }
                code => TaskRecord::Exited(rank, code),
            },
        )
    }
}

/// The CPU numbers set in `bits`.
fn cpus_of(bits: &CpuBits) -> Vec<u32> {
    (0..bits.len() as u32 * 64)
        .filter(|&cpu| bits[cpu as usize / 64] & (1 << (cpu % 64)) != 0)
        .collect()
}

/// The running service of one node.
pub struct Agent {
    runtime: Option<Runtime>,
    service: Option<NodeService>,
    node: String,
    shutdown_timeout: Duration,
    /// Cancelled by [`Agent::shutdown`]: a join still in flight leaves the overlay saying `Bye`.
    leave: CancellationToken,
    /// Task exits being reported to the service, which shutdown lets finish: an exit that
    /// aborts the job must reach the overlay before this node says `Bye`.
    exits: TaskTracker,
    /// Watches for the job's abort; on the node it started on, it reports to srun and kills
    /// the step, which shutdown lets finish (the other nodes' tasks may run on otherwise).
    abort_watch: Option<JoinHandle<()>>,
    /// PMIx steps: where the steps its ranks spawn attach their tasks.
    attachments: Option<Attachments>,
    /// How long the step's end waits for spawned steps still attached (`GreedyFenceTimeout`).
    children_wait: Duration,
    /// Local tasks that have not exited yet.
    running: tokio::sync::watch::Sender<usize>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Agent({})", self.node)
    }
}

/// An address the NodeAddr text names (an IP, or a name that resolves).
fn resolve(node: &str, host: &str, hooks: &Hooks) -> Result<IpAddr, Error> {
    let fail = |reason: String| Error::Address {
        node: node.to_string(),
        host: host.to_string(),
        reason,
    };
    let addr = (hooks.node_addr)(host).ok_or_else(|| fail("not in slurm.conf".into()))?;
    if let Ok(ip) = addr.parse::<IpAddr>() {
        return Ok(ip);
    }
    let ips: Vec<IpAddr> = (addr.as_str(), 0)
        .to_socket_addrs()
        .map_err(|e| fail(format!("NodeAddr {addr}: {e}")))?
        .map(|a| a.ip())
        .collect();
    ips.iter()
        .find(|ip| !ip.is_loopback())
        .or(ips.first())
        .copied()
        .ok_or_else(|| fail(format!("NodeAddr {addr} resolves to nothing")))
}

/// How long a shutting-down overlay link waits for its peer's goodbye.
const SHUTDOWN_LINGER: Duration = Duration::from_millis(100);

/// How a node finds its overlay parent: at the reserved port of its NodeAddr, or through srun.
enum StepRendezvous {
    Ports(Fixed),
    Srun(SrunRendezvous),
}

impl Rendezvous for StepRendezvous {
    async fn publish(&self, node_idx: usize, addr: SocketAddr) -> Result<(), String> {
        match self {
            StepRendezvous::Ports(r) => r.publish(node_idx, addr).await,
            StepRendezvous::Srun(r) => r.publish(node_idx, addr).await,
        }
    }

    async fn lookup(&self, node_idx: usize) -> Result<SocketAddr, String> {
        match self {
            StepRendezvous::Ports(r) => r.lookup(node_idx).await,
            StepRendezvous::Srun(r) => r.lookup(node_idx).await,
        }
    }
}

impl Agent {
    /// Starts this node's service for `plan` and returns with the ranks' variables and
    /// sockets, while the node joins the overlay in the background: ranks start and load
    /// their MPI library meanwhile, and their first fence waits for the join. Local faults
    /// (NodeAddr, runtime, sockets, libpmix) are errors returned here; a join that fails later
    /// (timeout, refused peer) aborts the job, which ends the step through `Hooks::kill_step`.
    ///
    /// Joining first and forking after, as a blocking prefork would, made every rank wait for
    /// the slowest node's slurmstepd to start before its exec: about 100 ms at 8 nodes here
    /// (docs/benchmarks.md).
    pub fn start(plan: &StepPlan, hooks: &Hooks) -> Result<(Agent, TaskTable), Error> {
        let node = plan.node().to_string();
        let (io, shim) = (Error::io(&node), Error::shim(&node));
        let my_ip = resolve(&node, &node, hooks)?;
        let rendezvous = step_rendezvous(plan, hooks)?;
        // From here on a failure must stop what runs: `agent` does so when dropped.
        let mut agent = Agent::new(plan)?;
        let rt = agent.runtime.as_ref().expect("set by Agent::new");
        // The step's tasks, and the tasks of the steps it spawns, which attach later.
        let trees = JobTrees::new(JobProcesses::descendants_of(
            std::process::id(),
            plan.job_uid,
        ));
        let mut config = node_config(plan, my_ip, &trees)?;
        let register_timeout = config.pmix.register_timeout;
        let local = &plan.ranks[plan.node_idx];
        let (out_tx, out_rx) = tokio::sync::mpsc::channel(OUTPUT_CAPACITY);
        let charm_stdio = charm_stdio(rt, &mut config, local.len(), out_rx, &node)?;
        let span = info_span!("mpi", job = %plan.kvsname, node = %node);
        let service = rt
            .block_on(
                NodeService::start(&plan.job_spec(), config, rendezvous, &agent.leave, out_tx)
                    .instrument(span.clone()),
            )
            .map_err(shim)?;
        agent.service = Some(service.clone());
        if let Some(requests) = service.take_spawns() {
            let forward = forward_spawns(requests, plan.clone(), service.clone());
            rt.spawn(forward.instrument(span.clone()));
        }
        if plan.protocol.families().contains(&Family::Pmix) {
            let _rt = rt.enter();
            let _span = span.enter();
            // Without it only a PMIx spawn fails (its step cannot attach), saying why.
            match Attachments::start(plan, service.clone(), trees) {
                Ok(a) => agent.attachments = Some(a),
                Err(e) => warn!("mpi/greedy: spawned steps cannot attach here: {e}"),
            }
        }
        let stdio = charm_stdio.as_ref().map(|(_, stdio)| stdio.clone());
        agent.abort_watch = Some(agent.watch_end(plan, hooks, stdio.clone(), &span));
        let (ranks, held) = rank_slots(rt, &service, local, &node)?;
        let (reader, notify) = std::io::pipe().map_err(|e| io("notify pipe", e))?;
        agent.watch_tasks(reader, held, local.len(), stdio);
        let registered = if plan.protocol.families().contains(&Family::Pmix) {
            Some(
                agent
                    .registration(register_timeout)
                    .map_err(|e| io("registration pipe", e))?,
            )
        } else {
            None
        };
        Ok((
            agent,
            TaskTable {
                ranks,
                job_uid: plan.job_uid,
                notify,
                registered,
                charm_stdio: charm_stdio.map(|(task_side, _)| task_side),
            },
        ))
    }

    /// The agent of `plan` with its runtime, before the service starts.
    fn new(plan: &StepPlan) -> Result<Agent, Error> {
        if plan.protocol.families().contains(&Family::Pmix) {
            // Before the runtime's threads: it sets PMIx's and, for a moment, hwloc's
            // variables in the environment.
            greedy_sys::pmix::server::prepare_process();
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("greedy-mpi")
            .enable_all()
            .build()
            .map_err(|e| Error::io(plan.node())("start the runtime", e))?;
        Ok(Agent {
            runtime: Some(runtime),
            service: None,
            node: plan.node().to_string(),
            shutdown_timeout: plan.shutdown_timeout,
            leave: CancellationToken::new(),
            exits: TaskTracker::new(),
            abort_watch: None,
            attachments: None,
            children_wait: plan.fence_timeout,
            running: tokio::sync::watch::Sender::new(plan.ranks[plan.node_idx].len()),
        })
    }

    /// Hands the end of the step to the node service (greedy-pmix's rule, [`StepEnd`] for
    /// what only Slurm can do), and a Charm++ rank's non-zero end to srun.
    /// Returns the abort watch.
    fn watch_end(
        &self,
        plan: &StepPlan,
        hooks: &Hooks,
        stdio: Option<Stdio>,
        span: &Span,
    ) -> JoinHandle<()> {
        let rt = self.runtime.as_ref().expect("running");
        let service = self.service.clone().expect("started");
        let end = Arc::new(StepEnd {
            plan: plan.clone(),
            kill_step: hooks.kill_step.clone(),
            stdio: stdio.clone(),
        });
        if let Some(stdio) = &stdio {
            stdio.set_service(service.clone());
            // A netlrts process exits 1 after `charm.exit(3)`: srun gets the 3 from here.
            let (p, handle) = (plan.clone(), rt.handle().clone());
            stdio.on_nonzero_end(Box::new(move |rank, code| {
                let p = p.clone();
                handle.spawn(async move {
                    let reason =
                        format!("rank {rank} on {} ended with charm.exit({code})", p.node());
                    report_to_srun(&p, code, WallTime::now(), reason).await;
                });
            }));
        }
        let _rt = rt.enter();
        span.in_scope(|| service.watch_end(end, StepEnd::policy(), self.running.subscribe()))
    }

    /// Steps serving PMIx: the pipe whose write end closes when PMIx has registered the job
    /// (or given up), with its number and how long a task waits for it.
    fn registration(
        &self,
        register_timeout: Duration,
    ) -> std::io::Result<(std::io::PipeReader, RawFd, Duration)> {
        let rt = self.runtime.as_ref().expect("running");
        let service = self.service.clone().expect("started");
        let (read, write) = std::io::pipe()?;
        let write_fd = write.as_raw_fd();
        // slurmstepd's copy of the write end closes when PMIx has registered the job (or
        // given up); the tasks' own copies close in their hooks.
        rt.spawn(async move {
            service.pmix_registered().await;
            drop(write);
        });
        Ok((read, write_fd, register_timeout * 2))
    }

    /// Stops the node service, then the runtime; all within `GreedyShutdownTimeout`, after
    /// which remaining threads are left to die with the process. A join still in flight (a
    /// step such as `srun /bin/true` can end before it completes) gets
    /// `GreedyShutdownTimeout` to finish first, then leaves the overlay saying `Bye`.
    pub fn shutdown(mut self) {
        // slurmstepd calls fini once it has reaped every local task, also those whose
        // watchers the step kill ended before they reported: none runs, so an abort's
        // straggler watch ends here instead of killing the step again and holding fini.
        self.running.send_replace(0);
        let Some(rt) = self.runtime.take() else {
            return;
        };
        let deadline = self.shutdown_timeout;
        let Some(service) = self.service.take() else {
            rt.shutdown_timeout(Duration::from_millis(50));
            return;
        };
        // Every node is still there to finish the join (a stepd's fini comes after its own
        // tasks end, not the others'), and a joined node leaves cleanly; leaving mid-join
        // would leave the others' join waiting for this node's part until their
        // GreedyJoinTimeout ends the step, if their tasks still run by then.
        let (node, leave) = (self.node.clone(), self.leave.clone());
        let overlay = service.overlay().clone();
        rt.block_on(async {
            if tokio::time::timeout(deadline, overlay.joined()).await.is_err() {
                info!(node = %node, "mpi/greedy: overlay join not complete within GreedyShutdownTimeout ({deadline:?}) after the local tasks ended; leaving it");
                leave.cancel();
            }
        });
        if let Some(attachments) = self.attachments.take() {
            // Spawned ranks still running need this node's PMIx server; not after an abort,
            // which ends them too.
            let aborted = overlay.aborted().borrow().is_some();
            let wait = if aborted {
                Duration::ZERO
            } else {
                self.children_wait
            };
            rt.block_on(attachments.finish(wait));
        }
        let fences = service.fences();
        let exits = self.exits.clone();
        exits.close();
        let stopped = rt.block_on(async {
            tokio::time::timeout(deadline, async {
                // A rank that failed as this node's last tasks ended: its abort goes out
                // ahead of the Bye.
                exits.wait().await;
                service.shutdown().await;
            })
            .await
        });
        if stopped.is_err() {
            error!(node = %self.node, "mpi/greedy: service did not stop within GreedyShutdownTimeout ({deadline:?})");
        } else {
            info!(node = %self.node, fences, "mpi/greedy: service stopped");
        }
        let ours = overlay
            .aborted()
            .borrow()
            .as_ref()
            .is_some_and(|a| a.origin_node == overlay.node_idx());
        if let (true, Some(watch)) = (ours, self.abort_watch.take()) {
            // This node reports the job's code to srun and kills the step: without it the
            // other nodes' tasks run on, and srun learns nothing.
            let limit = REPORT_TIMEOUT + deadline;
            let ended = rt.block_on(async { tokio::time::timeout(limit, watch).await });
            if ended.is_err() {
                error!(node = %self.node, "mpi/greedy: the step's end not reported within {limit:?}");
            }
        }
        rt.shutdown_timeout(Duration::from_millis(50));
    }
}

/// How this node finds its overlay parent: at the reserved port of the parent's NodeAddr, or
/// through srun.
fn step_rendezvous(plan: &StepPlan, hooks: &Hooks) -> Result<StepRendezvous, Error> {
    let node = plan.node();
    Ok(match (&plan.rendezvous, plan.parent()) {
        (Choice::Ports { port }, parent) => {
            let known = match parent {
                Some(p) => {
                    let ip = resolve(node, &plan.hosts[p], hooks)?;
                    HashMap::from([(p, SocketAddr::new(ip, *port))])
                }
                None => HashMap::new(),
            };
            StepRendezvous::Ports(Fixed(known))
        }
        (Choice::Srun { addr }, _) => {
            StepRendezvous::Srun(SrunRendezvous::new(*addr, &plan.kvsname, &plan.secret))
        }
    })
}

/// How long adding a PMIx child on every node of the step may take.
const ADD_CHILD_TIMEOUT: Duration = Duration::from_secs(30);

/// Local ranks' spawn requests, each asked of srun, which starts it as a nested step
/// ([`crate::nested`]; a PMIx child added on every node first, [`crate::attach`]), and
/// answered as srun says.
async fn forward_spawns(
    mut requests: tokio::sync::mpsc::Receiver<PendingSpawn>,
    plan: StepPlan,
    service: NodeService,
) {
    while let Some(pending) = requests.recv().await {
        let (plan, service) = (plan.clone(), service.clone());
        let ask = async move {
            let (job, node) = (&plan.kvsname, plan.node_idx);
            let add = async |child| {
                let added = service
                    .add_child_everywhere(&child, ADD_CHILD_TIMEOUT)
                    .await;
                added.map_err(|e| e.to_string())
            };
            match ask_spawn(plan.srun, job, &plan.secret, node, &pending.request, add).await {
                Ok(nspace) => pending.started(nspace),
                Err(why) => pending.refused(why),
            }
        };
        tokio::spawn(ask.in_current_span());
    }
}

/// The node service's settings for `plan`, its overlay on `my_ip`; PMIx admits `trees`.
fn node_config(plan: &StepPlan, my_ip: IpAddr, trees: &JobTrees) -> Result<NodeConfig, Error> {
    let node = plan.node();
    // Only the step's tasks (this slurmstepd's descendants, as the job's user) reach the
    // PMIx and netlrts endpoints at all.
    let admit = JobProcesses::descendants_of(std::process::id(), plan.job_uid);
    let mut config =
        NodeConfig::new(my_ip, admit, &plan.protocol.families()).map_err(|e| Error::Address {
            host: node.to_string(),
            node: node.to_string(),
            reason: format!("{e} (its NodeAddr)"),
        })?;
    config.pmix.admit = greedy_pmix::pmix::admit_trees(trees.clone());
    if let Choice::Ports { port } = plan.rendezvous {
        config.overlay.bind = SocketAddr::new(my_ip, port);
    }
    config.overlay.join_timeout = plan.join_timeout;
    config.overlay.collective_timeout = plan.fence_timeout + Duration::from_secs(30);
    // Shutdown runs in slurmstepd's fini, after every local rank was reaped; slurmd polls
    // for the stepd's exit once a second before it frees the nodes, so a long linger
    // costs the next job a whole second.
    config.overlay.shutdown_linger = SHUTDOWN_LINGER;
    config.pmi.fence_timeout = plan.fence_timeout;
    config.pmi.origin = plan.origin.clone();
    if let Some(cpus) = plan.universe {
        config.set_universe(cpus);
    }
    // The PMIx directory is handed to the job's user (PmixServer::start chowns it).
    config.pmix.owner = job_owner(plan);
    // slurmstepd binds each task after prefork: each task hook says where its task runs,
    // and PMIx tells the ranks after that.
    config.pmix.binding = Binding::Reported;
    // A rank that has not connected by then is reported like a fence that never completes.
    config.charm.connect_timeout = plan.fence_timeout;
    Ok(config)
}

/// Steps serving Charm++: the tasks' end of the stdio channel and the threads that write the
/// ranks' prints (`out_rx`) and answer their `scanf`, which `config` is given.
fn charm_stdio(
    rt: &Runtime,
    config: &mut NodeConfig,
    n_local: usize,
    out_rx: tokio::sync::mpsc::Receiver<Output>,
    node: &str,
) -> Result<Option<(std::os::unix::net::UnixDatagram, Stdio)>, Error> {
    if !config.families.contains(&Family::Charm) {
        return Ok(None);
    }
    let io = Error::io(node);
    let (task_side, agent_side) = charm::stdio_channel().map_err(|e| io("stdio socketpair", e))?;
    // One `scanf` at a time per node: each client waits for its answer anyway.
    let (scanf_tx, scanf_rx) = tokio::sync::mpsc::channel(1);
    config.charm.scanf = Some(scanf_tx);
    let stdio = Stdio::start(rt.handle(), agent_side, n_local, out_rx, scanf_rx, node)
        .map_err(|e| io("charm stdio threads", e))?;
    Ok(Some((task_side, stdio)))
}

/// slurmstepd's copy of each local rank's PMI socket, by rank.
type HeldSockets = HashMap<u32, OwnedFd>;

/// Each local rank's variables and PMI socket, and slurmstepd's copies of the sockets, held
/// until each task has been forked.
fn rank_slots(
    rt: &Runtime,
    service: &NodeService,
    local: &[u32],
    node: &str,
) -> Result<(HashMap<u32, RankSlot>, HeldSockets), Error> {
    let mut ranks = HashMap::new();
    let mut held = HashMap::new();
    for &rank in local {
        let wireup = rt
            .block_on(service.env_for(rank, None))
            .map_err(Error::shim(node))?;
        let fd = wireup.pmi_fd.as_ref().map(AsRawFd::as_raw_fd);
        if let Some(theirs) = wireup.pmi_fd {
            held.insert(rank, theirs);
        }
        let slot = RankSlot {
            fd,
            env: wireup.env,
            defaults: wireup.defaults,
        };
        ranks.insert(rank, slot);
    }
    Ok((ranks, held))
}

/// The uid and gid the step's tasks run as, when this stepd runs as root and they do not.
fn job_owner(plan: &StepPlan) -> Option<(u32, u32)> {
    (plan.job_uid != 0 && greedy_sys::slurm::running_as_root())
        .then_some((plan.job_uid, plan.job_gid))
}

/// How long the node an abort started on waits for srun to take the exit report before it
/// kills the step anyway (srun then exits with the signal instead of the rank's code).
const REPORT_TIMEOUT: Duration = Duration::from_secs(2);

/// Charm++: how long after an abort the step is killed, if its tasks have not all ended by
/// then (a client exits within milliseconds of `die`; the kill is for those still starting).
const CHARM_KILL_GRACE: Duration = Duration::from_secs(1);

/// How long after an abort a node that still has tasks asks again for the step's kill (each
/// wait after the previous one). Slurm's step kill can miss a node's tasks (2 of 40
/// `exitcode-ompi` steps here kept one node's two tasks, in a fence the abort had failed,
/// until srun's own timeout).
const KILL_STRAGGLERS: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
];

/// How long a join may take before the node also asks srun to tell it of the job's end.
/// Joins take milliseconds in most steps, which then open no connection for this. (CI run 19
/// saw an `exitcode-ompi` step whose nodes not linked to the abort's waited 63 s in their
/// first fence for the join to time out; its cause was not found.)
const HEAR_END_AFTER: Duration = Duration::from_millis(500);

/// When the step is killed again after an abort that came before the join; within the time
/// `fini` gives the abort's report and kill. Another node's slurmstepd may not have started
/// its tasks yet (the ranks are served from the launch on), and a kill that reaches a node
/// before its tasks exist does not stop them.
const KILL_AGAIN: [Duration; 2] = [Duration::from_millis(500), Duration::from_millis(1000)];

/// How a Slurm step ends, for greedy-pmix's rule ([`greedy_pmix::node::job_end`]): srun hears the
/// code and why, slurmctld kills the step, and in a step serving Charm++ the ranks' stdio is
/// told and released.
struct StepEnd {
    plan: StepPlan,
    kill_step: Arc<KillStepFn>,
    stdio: Option<Stdio>,
}

impl StepEnd {
    /// The NodeName of node `idx`.
    fn host(&self, idx: usize) -> &str {
        self.plan.hosts.get(idx).map_or("?", String::as_str)
    }

    /// In a het step, the first node of each component but the origin's kills its own
    /// component's step: a stepd kills only the job its credential names (the het job id comes
    /// from the user's srun), and the origin's kill reaches only its own component in a het
    /// job (one allocation per component).
    fn kill_own_component(&self, info: &AbortInfo) {
        let p = &self.plan;
        if let Some(het) = &p.het
            && het.kills_own(&p.ranks, p.node_idx, info.origin_node)
        {
            (self.kill_step)(p.job_id, p.step_id);
        }
    }

    /// Where an abort started, for a person: the node, and in a het step the component of
    /// the rank (or node) at fault: `n3` or `component 1 on n3`.
    fn origin(&self, abort: &AbortInfo) -> String {
        let host = self.host(abort.origin_node);
        let Some(het) = &self.plan.het else {
            return host.to_string();
        };
        let comp = match abort.rank {
            Some(r) => het.of(r),
            None => het.of_node(&self.plan.ranks, abort.origin_node),
        };
        match comp {
            Some(c) => format!("component {c} on {host}"),
            None => host.to_string(),
        }
    }

    /// The rule's timing for a Slurm step.
    fn policy() -> EndPolicy {
        EndPolicy {
            kill_again: KILL_AGAIN.to_vec(),
            kill_stragglers: KILL_STRAGGLERS.to_vec(),
            hear_end_after: Some(HEAR_END_AFTER),
        }
    }
}

impl JobEnd for StepEnd {
    /// Logs the abort. In a step serving Charm++, an abort that started at a local rank that
    /// spoke netlrts, or nothing yet, is told on its stderr, which srun shows; when the
    /// node's ranks speak netlrts, they got `die` and exit by themselves with their own
    /// status, and the report and the step kill (for ranks still starting) follow after
    /// [`CHARM_KILL_GRACE`].
    async fn aborted(&self, info: &AbortInfo, service: &NodeService) {
        let (job, step, me) = (self.plan.job_id, self.plan.step_id, self.plan.node_idx);
        let origin = self.origin(info);
        error!("mpi/greedy: step {job}.{step} aborted on {origin}: {info}");
        self.kill_own_component(info);
        let Some(stdio) = &self.stdio else { return };
        // A netlrts rank's (or a rank's that never spoke) own output is where its user looks.
        let local = info.rank.filter(|_| info.origin_node == me);
        if let Some(rank) =
            local.filter(|&r| service.family_of(r).is_none_or(|f| f == Family::Charm))
        {
            stdio.aborted(rank, format!("job aborted: {info}")).await;
        }
        if service.family() == Some(Family::Charm) {
            tokio::time::sleep(CHARM_KILL_GRACE).await;
        }
        // The step will be killed: no task's pipes may be held open by this node past that.
        stdio.release_all().await;
    }

    async fn report(&self, code: i32, abort: &AbortInfo) {
        let reason = format!("{}: {}", self.origin(abort), abort.reason);
        report_to_srun(&self.plan, code, abort.at, reason).await;
    }

    fn kill(&self, why: Kill) {
        let (job, step) = (self.plan.job_id, self.plan.step_id);
        if let Kill::Stragglers { running } = why {
            warn!(
                "mpi/greedy: {running} local tasks of step {job}.{step} still run after its abort: asking slurmctld to kill it again"
            );
        }
        // Asked again, the step may be gone by now: nothing to say if slurmctld refuses.
        if !(self.kill_step)(job, step) && why == Kill::Ending {
            error!("mpi/greedy: could not ask slurmctld to kill step {job}.{step}");
        }
    }

    /// srun relays the kept report of the abort that ended the job, with its reporter's
    /// signature.
    async fn hear_end(&self) -> Result<AbortInfo, String> {
        let p = &self.plan;
        match await_job_end(p.srun, &p.kvsname, &p.secret, p.node_idx).await {
            Ok(report) => {
                info!(
                    origin = report.node,
                    "mpi/greedy: srun says the step ended before this node joined: {}",
                    report.reason
                );
                Ok(AbortInfo {
                    origin_node: report.node,
                    rank: None,
                    code: report.code,
                    reason: report.reason,
                    at: report.at,
                })
            }
            Err(e) => {
                info!("mpi/greedy: not watching srun for the step's end: {e}");
                Err(e)
            }
        }
    }
}

/// Tells srun the job's exit code and why (srun exits with it); logs what went wrong, never
/// waiting longer than [`REPORT_TIMEOUT`].
async fn report_to_srun(plan: &StepPlan, code: i32, at: WallTime, reason: String) {
    let (job, step) = (plan.job_id, plan.step_id);
    let exit = ExitReport {
        node: plan.node_idx,
        code,
        at,
        reason,
    };
    let report = report_exit(plan.srun, &plan.kvsname, &plan.secret, exit);
    match tokio::time::timeout(REPORT_TIMEOUT, report).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => error!("mpi/greedy: step {job}.{step}: exit code {code} not reported: {e}"),
        Err(_) => error!(
            "mpi/greedy: step {job}.{step}: srun {} did not take exit code {code} within {REPORT_TIMEOUT:?}",
            plan.srun
        ),
    }
}

/// Tells srun why this node refused its step in prefork, so that srun exits 1 saying so
/// (a launch failure alone leaves srun 22.05 at 0). Best effort, at most [`REPORT_TIMEOUT`]:
/// srun's port and the secret come from the refused env itself, and the report is signed
/// for the step slurmstepd runs, so it can reach only that step's own srun.
pub fn report_refusal(stepd: &StepRecord, get: impl Fn(&str) -> Option<String>, reason: String) {
    let srun = plan::srun_address(&stepd.node_name, &get).ok();
    let secret = get(plan::VAR_SECRET).and_then(|h| greedy_pmix::JobSecret::from_hex(&h));
    let (Some(srun), Some(secret)) = (srun, secret) else {
        return;
    };
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    let job = plan::record_step_name(stepd);
    let exit = ExitReport {
        node: stepd.nodeid as usize,
        code: 1,
        at: WallTime::now(),
        reason,
    };
    let report = rt.block_on(async {
        tokio::time::timeout(REPORT_TIMEOUT, report_exit(srun, &job, &secret, exit)).await
    });
    if !matches!(report, Ok(Ok(()))) {
        info!("mpi/greedy: step {job}: srun {srun} did not take the refusal");
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_millis(200));
        }
    }
}

impl Agent {
    /// A thread reads the task records: `forked` closes slurmstepd's copy of that rank's PMI
    /// socket (`held`, so a dead rank is an EOF) and tells the node service where the rank
    /// runs if Slurm bound it; `exited` (from the task's watcher,
    /// `greedy_sys::slurm::watch_exec`) tells it how the rank ended (PMIx has no socket whose
    /// EOF would say so) and, for Charm++ steps, lets the writer close the task's stdio. Not
    /// a runtime task: it blocks in `read(2)`. It stops after `n_local` exits; a watcher
    /// killed before it reports (SIGKILL of the step) only leaves the thread waiting until
    /// slurmstepd exits.
    fn watch_tasks(
        &self,
        mut reader: std::io::PipeReader,
        mut held: HashMap<u32, OwnedFd>,
        n_local: usize,
        stdio: Option<Stdio>,
    ) {
        let service = self.service.clone().expect("started");
        let exits = self.exits.clone();
        let running = self.running.clone();
        let handle = self.runtime.as_ref().expect("running").handle().clone();
        let node = self.node.clone();
        // slurmstepd's own CPUs (prefork runs on its main thread), which its tasks start with.
        let node_cpus = greedy_sys::slurm::affinity();
        let spawned = std::thread::Builder::new()
            .name("greedy-mpi-tasks".into())
            .spawn(move || {
                let mut ended = 0;
                while ended < n_local
                    && let Ok(record) = TaskRecord::read_from(&mut reader)
                {
                    match record {
                        TaskRecord::Forked(rank, cpus) => {
                            drop(held.remove(&rank));
                            // A rank that may run wherever slurmstepd may is not bound.
                            let bound = cpus.filter(|c| node_cpus.is_some_and(|n| n != *c));
                            service.rank_started(rank, bound.as_ref().map(cpus_of))
                        }
                        TaskRecord::Exited(rank, code) => {
                            ended += 1;
                            running.send_modify(|n| *n = n.saturating_sub(1));
                            let (service, stdio) = (service.clone(), stdio.clone());
                            exits.spawn_on(
                                async move {
                                    if let Some(stdio) = stdio {
                                        // A netlrts client's last prints may still be on their
                                        // way, and a task that failed before speaking may be
                                        // one whose abort note is coming; other tasks' pipes
                                        // close at once, since the step ends only when every
                                        // one has.
                                        let spoke = service.family_of(rank);
                                        let linger = spoke == Some(Family::Charm)
                                            || service.family() == Some(Family::Charm)
                                            || (spoke.is_none() && code != 0);
                                        tokio::spawn(
                                            async move { stdio.exited(rank, linger).await },
                                        );
                                    }
                                    service.rank_exited(rank, code).await
                                },
                                &handle,
                            );
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            // Without it a dead rank is only noticed by the fence timeout; not worth failing for.
            error!(node = %node, "mpi/greedy: no task watcher thread: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Agent, Hooks, TaskRecord, TaskTable};
    use crate::plan::{Protocol, Rendezvous, StepPlan};
    use greedy_sys::slurm::CpuBits;
    use greedy_tree::LaunchModel;
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    /// A launch model whose 4-node tree is not a star (SEQ much longer than REM): node 0's
    /// first child launches the third node.
    fn deep() -> LaunchModel {
        LaunchModel::new(1.0, 0.001).unwrap()
    }

    /// Node `node_idx` of a 4-node PMI step `5.0` (4/2/1/1 ranks, as `srun -N4 -n8` packs them)
    /// whose nodes n1..n4 listen on 127.0.0.1..4 at `port`; srun is unreachable.
    fn plan(node_idx: usize, port: u16, join_timeout: Duration) -> StepPlan {
        StepPlan {
            job_id: 5,
            het: None,
            step_id: 0,
            kvsname: "5.0".into(),
            hosts: (1..=4).map(|i| format!("n{i}")).collect(),
            node_idx,
            ranks: vec![vec![0, 1, 2, 3], vec![4, 5], vec![6], vec![7]],
            secret: greedy_pmix::JobSecret::from_bytes(&[0xab; 16]).unwrap(),
            model: deep(),
            protocol: Protocol::Pmi,
            rendezvous: Rendezvous::Ports { port },
            srun: "127.0.0.1:9".parse().unwrap(),
            job_uid: own_uid(),
            job_gid: 0,
            join_timeout,
            fence_timeout: Duration::from_secs(10),
            shutdown_timeout: Duration::from_millis(500),
            origin: None,
            universe: None,
            attach: None,
        }
    }

    /// Starts node `node_idx`'s agent as prefork does; `kills` records every step it ends.
    fn start(plan: &StepPlan, kills: &Arc<Mutex<Vec<(u32, u32)>>>) -> Agent {
        start_with_tasks(plan, kills).0
    }

    fn start_with_tasks(
        plan: &StepPlan,
        kills: &Arc<Mutex<Vec<(u32, u32)>>>,
    ) -> (Agent, TaskTable) {
        let kills = kills.clone();
        let hooks = Hooks {
            node_addr: Box::new(|host| Some(format!("127.0.0.{}", host.strip_prefix('n')?))),
            kill_step: Arc::new(move |job, step| {
                kills.lock().unwrap().push((job, step));
                true
            }),
        };
        Agent::start(plan, &hooks).expect("agent starts")
    }

    /// This test's uid: its ranks run as it, as a step's as the job's user.
    fn own_uid() -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").unwrap().uid()
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// `srun --mpi=greedy -N4 -n8 /bin/true`: three nodes' tasks end (fini) while the join is
    /// still in flight, node 0's run on. Their leaving must not end the step (issue 15: a
    /// node that dropped its links mid-join made the others abort with "lost overlay link").
    #[test]
    fn nodes_ending_before_the_join_completes_do_not_end_the_step() {
        let port = free_port();
        let join_timeout = Duration::from_secs(2);
        let kills = Arc::new(Mutex::new(Vec::new()));
        let agents: Vec<Agent> = (0..4)
            .map(|i| start(&plan(i, port, join_timeout), &kills))
            .collect();
        let mut agents = agents.into_iter();
        let node0 = agents.next().unwrap();
        for agent in agents {
            agent.shutdown();
        }
        // Past node 0's join timeout: a join left incomplete would end the step by now.
        std::thread::sleep(join_timeout + Duration::from_millis(500));
        assert_eq!(*kills.lock().unwrap(), [], "a node ended the step");
        node0.shutdown();
        assert_eq!(*kills.lock().unwrap(), [], "a node ended the step");
    }

    /// A node whose join cannot complete (node 0 never starts) leaves it saying Bye: the node
    /// it was linked to goes on waiting for the join, and does not take it as a crash.
    #[test]
    fn a_node_leaving_mid_join_says_bye() {
        let port = free_port();
        let kills = Arc::new(Mutex::new(Vec::new()));
        let tree = greedy_tree::greedy(4, &deep());
        // A node linked to another node than the missing node 0.
        let leaver = (1..4)
            .find(|&i| tree.parent(i).is_some_and(|p| p != 0))
            .expect("a 4-node tree has a node below node 1, 2 or 3");
        let others: Vec<Agent> = (1..4)
            .filter(|&i| i != leaver)
            .map(|i| start(&plan(i, port, Duration::from_secs(20)), &kills))
            .collect();
        let agent = start(&plan(leaver, port, Duration::from_secs(20)), &kills);
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        agent.shutdown();
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "left in {:?}",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(
            *kills.lock().unwrap(),
            [],
            "the leaver's link was taken for a crash"
        );
        for agent in others {
            agent.shutdown();
        }
        assert_eq!(*kills.lock().unwrap(), [], "a node ended the step");
    }

    /// A step whose kill did not reach every node (or reached one before its tasks started):
    /// nodes 0 to 2 wait in a join that cannot complete, node 3's stepd never having come.
    /// Node 3's abort (exit 7) is in srun's report: they hear of it from srun within a second
    /// or so, not at their join timeout, and do not report or kill it again themselves.
    #[test]
    fn nodes_that_cannot_join_hear_the_end_from_srun() {
        use crate::rendezvous::{ExitReport, SrunBoard, report_exit};
        let port = free_port();
        let kills = Arc::new(Mutex::new(Vec::new()));
        let rt = tokio::runtime::Runtime::new().unwrap();
        let secret = plan(0, port, Duration::ZERO).secret;
        let board = rt
            .block_on(SrunBoard::bind(
                "127.0.0.1:0".parse().unwrap(),
                "5.0",
                &secret,
                4,
                Duration::from_secs(30),
            ))
            .unwrap();
        let srun = board.local_addr().unwrap();
        rt.spawn(board.serve());
        let agents: Vec<Agent> = (0..3)
            .map(|i| {
                let mut p = plan(i, port, Duration::from_secs(30));
                p.srun = srun;
                start(&p, &kills)
            })
            .collect();
        let report = ExitReport {
            node: 3,
            code: 7,
            at: greedy_pmix::WallTime::now(),
            reason: "rank 7 on n4 exited with code 7 before PMI_Init".into(),
        };
        rt.block_on(report_exit(srun, "5.0", &secret, report))
            .unwrap();
        let t0 = Instant::now();
        for agent in &agents {
            let mut aborted = agent.service.as_ref().unwrap().overlay().aborted();
            let heard = rt.block_on(async {
                tokio::time::timeout(Duration::from_secs(5), aborted.wait_for(Option::is_some))
                    .await
                    .map(|seen| seen.map(|a| a.clone()))
            });
            let abort = heard.expect("heard within 5 s").unwrap().unwrap();
            assert_eq!((abort.origin_node, abort.code), (3, 7), "{abort}");
        }
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        for agent in agents {
            agent.shutdown();
        }
        assert_eq!(*kills.lock().unwrap(), [], "only the origin ends the step");
    }

    #[test]
    fn task_records_round_trip() {
        for r in [
            TaskRecord::Forked(0, None),
            TaskRecord::Forked(u32::MAX, None),
            TaskRecord::Forked(
                5,
                Some([1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1 << 63]),
            ),
            TaskRecord::Exited(9, 7),
            TaskRecord::Exited(3, 0),
            TaskRecord::Exited(3, 139),
        ] {
            let bytes = r.encode();
            let mut reader = bytes.as_ref();
            assert_eq!(TaskRecord::read_from(&mut reader).unwrap(), r);
            assert!(reader.is_empty(), "{r:?} left bytes behind");
        }
        let mut bits = CpuBits::default();
        bits[0] = 0b1010;
        bits[15] = 1 << 63;
        assert_eq!(super::cpus_of(&bits), [1, 3, 1023]);
    }

    /// The step kill after an abort may end a task's watcher before it reports (proctrack
    /// signals the whole step): at fini the node must neither hold slurmstepd for the
    /// straggler watch nor ask slurmctld for the kill again.
    #[test]
    fn tasks_whose_watchers_the_kill_ended_count_as_ended_at_fini() {
        let port = free_port();
        let kills = Arc::new(Mutex::new(Vec::new()));
        let mut agents: Vec<(Agent, TaskTable)> = (0..4)
            .map(|i| start_with_tasks(&plan(i, port, Duration::from_secs(20)), &kills))
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        let (node1, tasks1) = agents.remove(1);
        // Rank 4 fails; rank 5's watcher is killed with the step and never reports.
        (&tasks1.notify)
            .write_all(TaskRecord::Exited(4, 3).encode().as_ref())
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        // The kill ended every node's tasks: each slurmstepd reaps them and calls fini.
        let t0 = Instant::now();
        node1.shutdown();
        let held = t0.elapsed();
        for (agent, _) in agents {
            agent.shutdown();
        }
        std::thread::sleep(Duration::from_millis(1500));
        let kills = kills.lock().unwrap().clone();
        assert_eq!(kills, [(5, 0)], "the step is killed once, by the abort");
        assert!(held < Duration::from_secs(2), "fini held for {held:?}");
    }

    /// A node's only rank fails (exit 3) and its slurmstepd tears down right after reaping
    /// it, while the node is still reporting to srun (which is slow to answer here): the node
    /// where the abort started must still end the step, else the other nodes' tasks run on.
    #[test]
    fn a_rank_failing_as_its_node_tears_down_still_ends_the_step() {
        let port = free_port();
        let kills = Arc::new(Mutex::new(Vec::new()));
        // An srun that takes the connection (backlog) and never answers the report.
        let srun = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut agents: Vec<(Agent, TaskTable)> = (0..4)
            .map(|i| {
                let mut p = plan(i, port, Duration::from_secs(20));
                p.srun = srun.local_addr().unwrap();
                start_with_tasks(&p, &kills)
            })
            .collect();
        // Joined (loopback: milliseconds).
        std::thread::sleep(Duration::from_millis(500));
        let (node3, tasks3) = agents.pop().unwrap();
        (&tasks3.notify)
            .write_all(TaskRecord::Exited(7, 3).encode().as_ref())
            .unwrap();
        // slurmstepd reaps the task and sends its exit before its teardown.
        std::thread::sleep(Duration::from_millis(100));
        node3.shutdown();
        let kills = kills.lock().unwrap().clone();
        assert!(
            !kills.is_empty() && kills.iter().all(|&k| k == (5, 0)),
            "node 3 did not end the step: {kills:?}"
        );
        for (agent, _) in agents {
            agent.shutdown();
        }
    }
}
