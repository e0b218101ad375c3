//! The node agent inside slurmstepd: the overlay, the PMI server and the ranks' sockets.
//!
//! Lifecycle (one step per slurmstepd process):
//! 1. `prefork` (root, before any task is forked) calls [`Agent::start`]: resolve this node's
//!    NodeAddr, start a tokio runtime on its own threads, make one socketpair per local rank
//!    and a notify pipe, and return; a failure so far is an error returned to Slurm (the step
//!    fails to launch), never an abort. In the background the node joins the overlay (bounded
//!    by `GreedyJoinTimeout`), starts the PMI server and splices each rank's socket to it; a
//!    failure there is logged and ends the step through slurmctld.
//! 2. each forked task runs the task hook, which reads the immutable [`TaskTable`] (no lock:
//!    the fork may have happened while a runtime thread held one), keeps its own socket across
//!    exec and writes a [`TaskRecord::Forked`] into the notify pipe (the agent then closes
//!    slurmstepd's copy of that rank's socket, so a rank that dies is seen as EOF); then the
//!    task's watcher (the process slurmstepd forked) writes [`TaskRecord::Exited`] with the
//!    program's exact code when it ends, for the PMI/PMIx server.
//! 3. an abort anywhere in the job (a rank's `PMI_Abort`, a malformed PMI message, a rank that
//!    fails before finalize, a timeout) reaches every node over the overlay; the node where it
//!    started reports the code to srun and asks slurmctld to kill the step
//!    (`Hooks::kill_step`), which ends every task on every node.
//! 4. there is no per-step hook in slurmstepd after the tasks end: the agent stops in `fini`,
//!    which slurmstepd calls at teardown, after every task has been reaped
//!    ([`Agent::shutdown`], bounded by `GreedyShutdownTimeout`). A short step (`srun
//!    /bin/true`) can get there before its node has joined: the join is let finish first,
//!    else left saying `Bye`, since the other nodes take a link closed without one as a
//!    crash and abort the job.

use crate::Error;
use crate::charm::{self, Stdio};
use crate::plan::{self, Protocol, Rendezvous as Choice, StepPlan};
use crate::rendezvous::{SrunRendezvous, report_exit};
use greedy_pmix::charm::server::{CharmConfig, CharmServer, OUTPUT_CAPACITY};
use greedy_pmix::overlay::{Overlay, OverlayConfig};
use greedy_pmix::peer::JobProcesses;
use greedy_pmix::pmix::{PmixConfig, PmixServer};
use greedy_pmix::rendezvous::Fixed;
use greedy_pmix::server::{PmiConfig, PmiServer};
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
use tracing::{Instrument, error, info, info_span};

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
    /// fork). PMIx ranks connect to libpmix's own socket instead.
    pub fd: Option<RawFd>,
    /// The variables to put into the task's env.
    pub env: Vec<(String, String)>,
}

/// Everything the task hook reads: immutable once `prefork` returns.
#[derive(Debug)]
pub struct TaskTable {
    /// Local ranks.
    pub ranks: HashMap<u32, RankSlot>,
    notify: std::io::PipeWriter,
    /// Charm++ steps: where each task sends its stdout and stderr ([`crate::charm`]).
    charm_stdio: Option<std::os::unix::net::UnixDatagram>,
}

impl TaskTable {
    /// Tells the agent that `rank`'s task has been forked (it holds its socket now), so
    /// slurmstepd can close its own copy. One `write(2)` of 8 bytes: atomic on a pipe.
    pub fn forked(&self, rank: u32) -> std::io::Result<()> {
        (&self.notify).write_all(&TaskRecord::Forked(rank).encode())
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
/// (little-endian), [`TaskRecord::FORKED`] as the code of a fork.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskRecord {
    /// The task of this rank was forked.
    Forked(u32),
    /// The rank's program ended with this exit code, or 128 + its signal.
    Exited(u32, i32),
}

impl TaskRecord {
    /// The code of a fork record (no exit code is negative).
    pub const FORKED: i32 = -1;

    /// The wire form.
    pub fn encode(self) -> [u8; 8] {
        let (rank, code) = match self {
            TaskRecord::Forked(rank) => (rank, Self::FORKED),
            TaskRecord::Exited(rank, code) => (rank, code),
        };
        let mut record = [0u8; 8];
        record[..4].copy_from_slice(&rank.to_le_bytes());
        record[4..].copy_from_slice(&code.to_le_bytes());
        record
    }

    /// Reads the wire form.
    pub fn decode(record: [u8; 8]) -> TaskRecord {
        let rank = u32::from_le_bytes(record[..4].try_into().expect("4 bytes"));
        match i32::from_le_bytes(record[4..].try_into().expect("4 bytes")) {
            Self::FORKED => TaskRecord::Forked(rank),
            code => TaskRecord::Exited(rank, code),
        }
    }
}

/// The running service of one node.
pub struct Agent {
    runtime: Option<Runtime>,
    joined: Joined,
    /// PMIx's directory for this step, removed at shutdown.
    pmix_dir: Option<std::path::PathBuf>,
    node: String,
    shutdown_timeout: Duration,
    /// Cancelled by [`Agent::shutdown`]: a join still in flight leaves the overlay saying `Bye`.
    leave: CancellationToken,
    /// PMI: the background join and server start, which shutdown lets finish first.
    service: Option<JoinHandle<()>>,
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

/// The client server of a joined node.
#[derive(Clone)]
enum Client {
    Pmi(PmiServer),
    Pmix(PmixServer),
    Charm(CharmServer, Stdio),
}

impl Client {
    fn fences(&self) -> u64 {
        match self {
            Client::Pmi(s) => s.fences(),
            Client::Pmix(s) => s.fences(),
            Client::Charm(..) => 0,
        }
    }
    async fn shutdown(&self) {
        match self {
            Client::Pmi(s) => s.shutdown().await,
            Client::Pmix(s) => s.shutdown().await,
            Client::Charm(s, _) => s.shutdown().await,
        }
    }
    async fn rank_exited(&self, rank: u32, code: i32) {
        match self {
            Client::Pmi(s) => s.rank_exited(rank, code).await,
            Client::Pmix(s) => s.rank_exited(rank, code).await,
            Client::Charm(s, stdio) => {
                tokio::spawn({
                    let stdio = stdio.clone();
                    async move { stdio.exited(rank).await }
                });
                s.rank_exited(rank, code).await
            }
        }
    }
}

/// The service once joined (what shutdown must stop), and the task exits seen before it was:
/// a task may end before its node has joined the overlay.
#[derive(Default)]
struct JoinState {
    service: Option<(Overlay, Client)>,
    early_exits: Vec<(u32, i32)>,
    /// The client server taking task exits, which shutdown lets finish: an exit that aborts
    /// the job must reach the overlay before this node says `Bye`.
    exits: TaskTracker,
    /// Watches for the job's abort; on the node it started on, it reports to srun and kills
    /// the step, which shutdown lets finish (the other nodes' tasks may run on otherwise).
    abort_watch: Option<JoinHandle<()>>,
}

type Joined = Arc<std::sync::Mutex<JoinState>>;

fn lock(joined: &Joined) -> std::sync::MutexGuard<'_, JoinState> {
    joined.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records this node's service as joined and hands it the task exits seen before.
fn set_joined(joined: &Joined, overlay: Overlay, client: Client, rt: &tokio::runtime::Handle) {
    let (early, exits) = {
        let mut st = lock(joined);
        st.service = Some((overlay, client.clone()));
        (std::mem::take(&mut st.early_exits), st.exits.clone())
    };
    for (rank, code) in early {
        let client = client.clone();
        exits.spawn_on(async move { client.rank_exited(rank, code).await }, rt);
    }
}

impl Agent {
    /// Starts this node's service for `plan` and returns at once with the ranks' sockets:
    /// joining the overlay and starting the PMI server go on in the background while
    /// slurmstepd forks the tasks and they load their MPI library. A rank's first PMI
    /// messages wait in its socket until then. Local faults (NodeAddr, runtime, sockets) are
    /// errors returned here; a join that fails later (timeout, refused peer) is logged and
    /// ends the step through `Hooks::kill_step`.
    ///
    /// Joining first and forking after, as a blocking prefork would, made every rank wait for
    /// the slowest node's slurmstepd to start before its exec: about 100 ms at 8 nodes here
    /// (docs/benchmarks.md).
    pub fn start(plan: &StepPlan, hooks: &Hooks) -> Result<(Agent, TaskTable), Error> {
        let node = plan.node().to_string();
        let io = Error::io(&node);
        let my_ip = resolve(&node, &node, hooks)?;
        let parent_ip = match (&plan.rendezvous, plan.parent()) {
            (Choice::Ports { .. }, Some(parent)) => {
                Some((parent, resolve(&node, &plan.hosts[parent], hooks)?))
            }
            _ => None,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("greedy-mpi")
            .enable_all()
            .build()
            .map_err(|e| io("start the runtime", e))?;
        let span = info_span!("mpi", job = %plan.kvsname, node = %node);
        let joined: Joined = Arc::default();
        let mut agent = Agent {
            runtime: Some(runtime),
            joined: joined.clone(),
            pmix_dir: None,
            node: node.clone(),
            shutdown_timeout: plan.shutdown_timeout,
            leave: CancellationToken::new(),
            service: None,
        };
        // From here on a failure must stop what runs: `agent` does so when dropped.
        if plan.protocol == Protocol::Pmix {
            return agent.start_pmix(plan, my_ip, parent_ip, hooks, span);
        }
        if plan.protocol == Protocol::Charm {
            return agent.start_charm(plan, my_ip, parent_ip, hooks, span);
        }
        let mut ranks = HashMap::new();
        let mut held: HashMap<u32, OwnedFd> = HashMap::new();
        let mut ours = Vec::new();
        let local = &plan.ranks[plan.node_idx];
        let n_ranks: usize = plan.ranks.iter().map(Vec::len).sum();
        for (local_id, &rank) in local.iter().enumerate() {
            let (mine, theirs) =
                std::os::unix::net::UnixStream::pair().map_err(|e| io("rank socketpair", e))?;
            mine.set_nonblocking(true)
                .map_err(|e| io("rank socketpair", e))?;
            let fd = theirs.as_raw_fd();
            let offered = vec![
                ("PMI_RANK".to_string(), rank.to_string()),
                ("PMI_SIZE".to_string(), n_ranks.to_string()),
                ("PMI_JOBID".to_string(), plan.kvsname.clone()),
                ("MPI_LOCALNRANKS".to_string(), local.len().to_string()),
                ("MPI_LOCALRANKID".to_string(), local_id.to_string()),
            ];
            ranks.insert(
                rank,
                RankSlot {
                    fd: Some(fd),
                    env: plan::task_env(&offered, fd),
                },
            );
            held.insert(rank, OwnedFd::from(theirs));
            ours.push((rank, mine));
        }
        let (reader, notify) = std::io::pipe().map_err(|e| io("notify pipe", e))?;
        agent.watch_tasks(reader, held, local.len());
        let service = Service {
            plan: plan.clone(),
            my_ip,
            parent_ip,
            ours,
            joined,
            kill_step: hooks.kill_step.clone(),
            leave: agent.leave.clone(),
        };
        agent.service = Some(
            agent
                .runtime
                .as_ref()
                .expect("set above")
                .spawn(service.run().instrument(span)),
        );
        Ok((
            agent,
            TaskTable {
                ranks,
                notify,
                charm_stdio: None,
            },
        ))
    }

    /// PMIx: libpmix must register each client before its task exists (the task hook only
    /// copies the variables `setup_fork` returned), so this node joins the overlay and starts
    /// its PMIx server before prefork returns.
    fn start_pmix(
        mut self,
        plan: &StepPlan,
        my_ip: IpAddr,
        parent_ip: Option<(usize, IpAddr)>,
        hooks: &Hooks,
        span: tracing::Span,
    ) -> Result<(Agent, TaskTable), Error> {
        let node = plan.node().to_string();
        let shim = Error::shim(&node);
        let rt = self.runtime.as_ref().expect("set in start");
        let overlay = rt
            .block_on(join(plan, my_ip, parent_ip, &self.leave).instrument(span.clone()))
            .map_err(shim)?;
        // One directory per step and node: Open MPI names its shared-memory files after the
        // node's local ranks there (greedy-pmix's PmixConfig). Fresh, 0700 and with an
        // unguessable name (greedy_pmix::pmix::private_dir): it is handed to the job's user
        // (PmixServer::start chowns it), and nothing can have been planted at its path.
        let io = Error::io(&node);
        let tmpdir = greedy_pmix::pmix::private_dir(&std::env::temp_dir(), "greedy-pmix.")
            .map_err(|e| io("create the PMIx directory", e))?;
        self.pmix_dir = Some(tmpdir.clone());
        let owner = job_owner(plan);
        // Only the step's tasks (this slurmstepd's descendants, as the job's user) reach
        // libpmix at all.
        let config = PmixConfig {
            owner,
            admit: greedy_pmix::pmix::admit_job(
                step_processes(plan).map_err(|e| io("read slurmstepd's uid", e))?,
            ),
            ..PmixConfig::new(tmpdir)
        };
        let rt = self.runtime.as_ref().expect("set in start");
        let pmix = rt
            .block_on(PmixServer::start(&plan.job_spec(), overlay.clone(), config))
            .map_err(shim)?;
        set_joined(
            &self.joined,
            overlay.clone(),
            Client::Pmix(pmix.clone()),
            rt.handle(),
        );
        let watch =
            rt.spawn(watch_abort(plan.clone(), overlay, hooks.kill_step.clone()).instrument(span));
        lock(&self.joined).abort_watch = Some(watch);
        let mut ranks = HashMap::new();
        for &rank in &plan.ranks[plan.node_idx] {
            let env = rt.block_on(pmix.env_for(rank)).map_err(shim)?;
            ranks.insert(rank, RankSlot { fd: None, env });
        }
        let (reader, notify) = std::io::pipe().map_err(|e| io("notify pipe", e))?;
        self.watch_tasks(reader, HashMap::new(), plan.ranks[plan.node_idx].len());
        Ok((
            self,
            TaskTable {
                ranks,
                notify,
                charm_stdio: None,
            },
        ))
    }

    /// Charm++ netlrts: a rank's `NETSTART` names this node's listener, so the node joins the
    /// overlay and starts its `CharmServer` before prefork returns, as for PMIx. Joining
    /// first also means every task's exit reaches the server: a rank that dies before it
    /// connects (charm4py hides those errors) must abort the job, naming it.
    fn start_charm(
        self,
        plan: &StepPlan,
        my_ip: IpAddr,
        parent_ip: Option<(usize, IpAddr)>,
        hooks: &Hooks,
        span: tracing::Span,
    ) -> Result<(Agent, TaskTable), Error> {
        let node = plan.node().to_string();
        let shim = Error::shim(&node);
        let io = Error::io(&node);
        let rt = self.runtime.as_ref().expect("set in start");
        let overlay = rt
            .block_on(join(plan, my_ip, parent_ip, &self.leave).instrument(span.clone()))
            .map_err(shim)?;
        let local = &plan.ranks[plan.node_idx];
        let (task_side, agent_side) =
            charm::stdio_channel().map_err(|e| io("stdio socketpair", e))?;
        let (out_tx, out_rx) = tokio::sync::mpsc::channel(OUTPUT_CAPACITY);
        // One `scanf` at a time per node: each client waits for its answer anyway.
        let (scanf_tx, scanf_rx) = tokio::sync::mpsc::channel(1);
        let stdio = Stdio::start(
            rt.handle(),
            agent_side,
            local.len(),
            out_rx,
            scanf_rx,
            &node,
        )
        .map_err(|e| io("charm stdio threads", e))?;
        let IpAddr::V4(advertise) = my_ip else {
            return Err(Error::Address {
                host: node.clone(),
                node,
                reason: format!("Charm++ netlrts needs an IPv4 NodeAddr, not {my_ip}"),
            });
        };
        let admit = step_processes(plan).map_err(|e| io("read slurmstepd's uid", e))?;
        let mut config = CharmConfig::new(advertise, admit);
        // A rank that has not connected by then is reported like a fence that never completes.
        config.connect_timeout = plan.fence_timeout;
        config.scanf = Some(scanf_tx);
        let server = rt
            .block_on(CharmServer::start(
                &plan.job_spec(),
                overlay.clone(),
                config,
                out_tx,
            ))
            .map_err(shim)?;
        stdio.set_server(server.clone());
        // A netlrts process exits 1 after `charm.exit(3)`: srun gets the 3 from here.
        let (p, handle) = (plan.clone(), rt.handle().clone());
        stdio.on_nonzero_end(Box::new(move |rank, code| {
            let p = p.clone();
            handle.spawn(async move {
                let reason = format!("rank {rank} on {} ended with charm.exit({code})", p.node());
                report_to_srun(&p, code, &reason).await;
            });
        }));
        set_joined(
            &self.joined,
            overlay.clone(),
            Client::Charm(server.clone(), stdio.clone()),
            rt.handle(),
        );
        // On an abort every connected client gets `die` and exits by itself with its own
        // status; the exit report to srun and the step kill (for ranks still starting) follow
        // after the grace.
        let (p, kill) = (plan.clone(), hooks.kill_step.clone());
        let watch = rt.spawn(
            async move {
                charm_abort_note(p.clone(), overlay.clone(), stdio).await;
                tokio::time::sleep(CHARM_KILL_GRACE).await;
                watch_abort(p, overlay, kill).await;
            }
            .instrument(span),
        );
        lock(&self.joined).abort_watch = Some(watch);
        let ranks = local
            .iter()
            .map(|&rank| {
                (
                    rank,
                    RankSlot {
                        fd: None,
                        env: server.env_for(rank),
                    },
                )
            })
            .collect();
        let (reader, notify) = std::io::pipe().map_err(|e| io("notify pipe", e))?;
        self.watch_tasks(reader, HashMap::new(), local.len());
        Ok((
            self,
            TaskTable {
                ranks,
                notify,
                charm_stdio: Some(task_side),
            },
        ))
    }

    /// Stops the PMI server and the overlay, then the runtime; all within
    /// `GreedyShutdownTimeout`, after which remaining threads are left to die with the process.
    /// A join still in flight (PMI: it runs in the background, and a step such as `srun
    /// /bin/true` can end before it completes) gets `GreedyShutdownTimeout` to finish first,
    /// then leaves the overlay saying `Bye`, within `GreedyShutdownTimeout` again.
    pub fn shutdown(mut self) {
        let Some(rt) = self.runtime.take() else {
            return;
        };
        let deadline = self.shutdown_timeout;
        if let Some(mut service) = self.service.take() {
            // Every node is still there to finish the join (a stepd's fini comes after its own
            // tasks end, not the others'), and a joined node leaves cleanly; leaving mid-join
            // would leave the others' join waiting for this node's part until their
            // GreedyJoinTimeout ends the step, if their tasks still run by then.
            let (node, leave) = (self.node.clone(), self.leave.clone());
            rt.block_on(async move {
                if tokio::time::timeout(deadline, &mut service).await.is_ok() {
                    return;
                }
                info!(node = %node, "mpi/greedy: overlay join not complete within GreedyShutdownTimeout ({deadline:?}) after the local tasks ended; leaving it");
                leave.cancel();
                if tokio::time::timeout(deadline, service).await.is_err() {
                    error!(node = %node, "mpi/greedy: overlay join not left within GreedyShutdownTimeout ({deadline:?})");
                }
            });
        }
        let (joined, exits, abort_watch) = {
            let mut st = lock(&self.joined);
            (st.service.take(), st.exits.clone(), st.abort_watch.take())
        };
        if let Some((overlay, pmi)) = joined {
            let fences = pmi.fences();
            exits.close();
            let stopping = overlay.clone();
            let stopped = rt.block_on(async move {
                tokio::time::timeout(deadline, async {
                    // A rank that failed as this node's last tasks ended: its abort goes out
                    // ahead of the Bye.
                    exits.wait().await;
                    pmi.shutdown().await;
                    stopping.shutdown().await;
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
            if let (true, Some(watch)) = (ours, abort_watch) {
                // This node reports the job's code to srun and kills the step: without it the
                // other nodes' tasks run on, and srun learns nothing.
                let limit = REPORT_TIMEOUT + deadline;
                let ended = rt.block_on(async { tokio::time::timeout(limit, watch).await });
                if ended.is_err() {
                    error!(node = %self.node, "mpi/greedy: the step's end not reported within {limit:?}");
                }
            }
        }
        rt.shutdown_timeout(Duration::from_millis(50));
        if let Some(dir) = self.pmix_dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The background part of a node's service.
struct Service {
    plan: StepPlan,
    my_ip: IpAddr,
    parent_ip: Option<(usize, IpAddr)>,
    ours: Vec<(u32, std::os::unix::net::UnixStream)>,
    joined: Joined,
    kill_step: Arc<KillStepFn>,
    /// Cancelled when the node leaves (fini) before this service is up.
    leave: CancellationToken,
}

impl Service {
    async fn run(self) {
        let (plan, kill, leave) = (
            self.plan.clone(),
            self.kill_step.clone(),
            self.leave.clone(),
        );
        if let Err(e) = self.serve().await {
            if leave.is_cancelled() {
                // The local tasks have all ended; the join was left on purpose, saying Bye.
                info!(
                    "mpi/greedy: step {}.{}: left before the overlay join completed: {e}",
                    plan.job_id, plan.step_id
                );
                return;
            }
            error!(
                "mpi/greedy: step {}.{}: {e}; ending the step",
                plan.job_id, plan.step_id
            );
            end_step(&plan, 1, e.to_string(), kill).await;
        }
    }

    async fn serve(self) -> Result<(), Error> {
        let plan = &self.plan;
        let node = plan.node().to_string();
        let shim = Error::shim(&node);
        let spec = plan.job_spec();
        let overlay = join(plan, self.my_ip, self.parent_ip, &self.leave)
            .await
            .map_err(shim)?;
        let pmi_config = PmiConfig {
            fence_timeout: plan.fence_timeout,
            ..PmiConfig::default()
        };
        let pmi = PmiServer::start(&spec, overlay.clone(), pmi_config)
            .await
            .map_err(shim)?;
        set_joined(
            &self.joined,
            overlay.clone(),
            Client::Pmi(pmi.clone()),
            &tokio::runtime::Handle::current(),
        );
        let watch = tokio::spawn(
            watch_abort(plan.clone(), overlay, self.kill_step.clone()).in_current_span(),
        );
        lock(&self.joined).abort_watch = Some(watch);
        // Splice each rank's socket to a fresh connection of the PMI server. EOF travels both
        // ways, so a rank that dies still closes its PMI connection, and an abort still
        // closes the rank's socket.
        for (rank, mine) in self.ours {
            let (server_end, _) = pmi.socketpair_for(rank, -1).map_err(shim)?;
            let splice = |e| Error::io(&node)("PMI splice", e);
            server_end.set_nonblocking(true).map_err(splice)?;
            let mut server_end = tokio::net::UnixStream::from_std(server_end).map_err(splice)?;
            let mut mine = tokio::net::UnixStream::from_std(mine).map_err(splice)?;
            tokio::spawn(async move {
                let _ = tokio::io::copy_bidirectional(&mut mine, &mut server_end).await;
            });
        }
        Ok(())
    }
}

/// Joins the overlay of `plan` as this node (`my_ip`), finding the parent by reserved port
/// (`parent_ip`, resolved beforehand from NodeAddr) or through srun; cancelling `leave` leaves
/// it, mid-join too, saying `Bye`.
async fn join(
    plan: &StepPlan,
    my_ip: IpAddr,
    parent_ip: Option<(usize, IpAddr)>,
    leave: &CancellationToken,
) -> Result<Overlay, greedy_pmix::Error> {
    let spec = plan.job_spec();
    let mut config = OverlayConfig {
        join_timeout: plan.join_timeout,
        collective_timeout: plan.fence_timeout + Duration::from_secs(30),
        // Shutdown runs in slurmstepd's fini, after every local rank was reaped; slurmd
        // polls for the stepd's exit once a second before it frees the nodes, so a long
        // linger costs the next job a whole second.
        shutdown_linger: SHUTDOWN_LINGER,
        ..OverlayConfig::default()
    };
    match &plan.rendezvous {
        Choice::Ports { port } => {
            config.bind = SocketAddr::new(my_ip, *port);
            let known = parent_ip
                .map(|(parent, ip)| (parent, SocketAddr::new(ip, *port)))
                .into_iter()
                .collect();
            Overlay::start_or_leave(&spec, config, &Fixed(known), leave).await
        }
        Choice::Srun { addr } => {
            config.bind = SocketAddr::new(my_ip, 0);
            let rdv = SrunRendezvous::new(*addr, &plan.kvsname, plan.secret.as_bytes());
            Overlay::start_or_leave(&spec, config, &rdv, leave).await
        }
    }
}

/// Who may reach the step's PMIx and netlrts endpoints: the tasks, which are this
/// slurmstepd's descendants running as the job's user.
fn step_processes(plan: &StepPlan) -> std::io::Result<JobProcesses> {
    match plan.job_uid {
        Some(uid) => Ok(JobProcesses::descendants_of(std::process::id(), uid)),
        None => JobProcesses::of_this_process(),
    }
}

/// The uid and gid the step's tasks run as, when this stepd runs as root and they do not.
fn job_owner(plan: &StepPlan) -> Option<(u32, u32)> {
    let uid = plan.job_uid.filter(|&u| u != 0)?;
    if !greedy_sys::slurm::running_as_root() {
        return None;
    }
    let gid = plan
        .job_gid
        .or_else(|| greedy_sys::slurm::primary_gid(uid))
        .unwrap_or(uid);
    Some((uid, gid))
}

/// How long the node an abort started on waits for srun to take the exit report before it
/// kills the step anyway (srun then exits with the signal instead of the rank's code).
const REPORT_TIMEOUT: Duration = Duration::from_secs(2);

/// Logs an abort of the job and, on the node where it started, reports the job's exit code to
/// srun and asks slurmctld to kill the step.
async fn watch_abort(plan: StepPlan, overlay: Overlay, kill_step: Arc<KillStepFn>) {
    let mut aborted = overlay.aborted();
    let (job, step, me) = (plan.job_id, plan.step_id, plan.node_idx);
    let info = match aborted.wait_for(Option::is_some).await {
        Ok(seen) => seen.clone(),
        Err(_) => return,
    };
    let Some(info) = info else { return };
    let origin = plan.hosts.get(info.origin_node).map_or("?", String::as_str);
    error!("mpi/greedy: step {job}.{step} aborted on {origin}: {info}");
    if info.origin_node == me {
        end_step(
            &plan,
            info.code,
            format!("{origin}: {}", info.reason),
            kill_step,
        )
        .await;
    }
}

/// Tells srun the job's exit code and why (srun exits with it); logs what went wrong, never
/// waiting longer than [`REPORT_TIMEOUT`].
async fn report_to_srun(plan: &StepPlan, code: i32, reason: &str) {
    let (job, step) = (plan.job_id, plan.step_id);
    let secret = plan.secret.clone();
    let report = report_exit(
        plan.srun,
        &plan.kvsname,
        secret.as_bytes(),
        plan.node_idx,
        code,
        reason,
    );
    match tokio::time::timeout(REPORT_TIMEOUT, report).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => error!("mpi/greedy: step {job}.{step}: exit code {code} not reported: {e}"),
        Err(_) => error!(
            "mpi/greedy: step {job}.{step}: srun {} did not take exit code {code} within {REPORT_TIMEOUT:?}",
            plan.srun
        ),
    }
}

/// Ends the step from this node: reports the job's exit code (0 becomes 1: a job that ends
/// early has failed) and `reason` to srun, then asks slurmctld to kill the step.
async fn end_step(plan: &StepPlan, code: i32, reason: String, kill_step: Arc<KillStepFn>) {
    let (job, step) = (plan.job_id, plan.step_id);
    report_to_srun(plan, if code == 0 { 1 } else { code }, &reason).await;
    let done = tokio::task::spawn_blocking(move || kill_step(job, step)).await;
    if !matches!(done, Ok(true)) {
        error!("mpi/greedy: could not ask slurmctld to kill step {job}.{step}");
    }
}

/// Charm++: how long after an abort the step is killed, if its tasks have not all ended by
/// then (a client exits within milliseconds of `die`; the kill is for those still starting).
const CHARM_KILL_GRACE: Duration = Duration::from_secs(1);

/// Charm++: an abort that started at a local rank is told on that rank's stderr, which srun
/// shows (`srun -l` labels it); the reason itself names rank, host and cause.
async fn charm_abort_note(plan: StepPlan, overlay: Overlay, stdio: Stdio) {
    let mut aborted = overlay.aborted();
    let info = match aborted.wait_for(Option::is_some).await {
        Ok(seen) => seen.clone(),
        Err(_) => return,
    };
    let Some(info) = info else { return };
    if let Some(rank) = info.rank.filter(|_| info.origin_node == plan.node_idx) {
        stdio.aborted(rank, format!("job aborted: {info}")).await;
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
    /// socket (`held`, so a dead rank is an EOF), `exited` (from the task's watcher,
    /// `greedy_sys::slurm::watch_exec`) tells the client server how the rank ended (PMIx has
    /// no socket whose EOF would say so). Not a runtime task: it blocks in `read(2)`. It stops
    /// after `n_local` exits; a watcher killed before it reports (SIGKILL of the step) only
    /// leaves the thread waiting until slurmstepd exits.
    fn watch_tasks(
        &self,
        mut reader: std::io::PipeReader,
        mut held: HashMap<u32, OwnedFd>,
        n_local: usize,
    ) {
        let joined = self.joined.clone();
        let handle = self.runtime.as_ref().expect("running").handle().clone();
        let node = self.node.clone();
        let spawned = std::thread::Builder::new()
            .name("greedy-mpi-tasks".into())
            .spawn(move || {
                let mut record = [0u8; 8];
                let mut exits = 0;
                while exits < n_local && reader.read_exact(&mut record).is_ok() {
                    match TaskRecord::decode(record) {
                        TaskRecord::Forked(rank) => drop(held.remove(&rank)),
                        TaskRecord::Exited(rank, code) => {
                            exits += 1;
                            let (client, exits) = {
                                let mut st = lock(&joined);
                                let client = st.service.as_ref().map(|(_, c)| c.clone());
                                if client.is_none() {
                                    st.early_exits.push((rank, code));
                                }
                                (client, st.exits.clone())
                            };
                            if let Some(client) = client {
                                exits.spawn_on(
                                    async move { client.rank_exited(rank, code).await },
                                    &handle,
                                );
                            }
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
            job_uid: None,
            job_gid: None,
            join_timeout,
            fence_timeout: Duration::from_secs(10),
            shutdown_timeout: Duration::from_millis(500),
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

    #[test]
    fn task_records_round_trip() {
        for r in [
            TaskRecord::Forked(0),
            TaskRecord::Forked(u32::MAX),
            TaskRecord::Exited(9, 7),
            TaskRecord::Exited(3, 0),
            TaskRecord::Exited(3, 139),
        ] {
            assert_eq!(TaskRecord::decode(r.encode()), r);
        }
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
            .write_all(&TaskRecord::Exited(7, 3).encode())
            .unwrap();
        // slurmstepd reaps the task and sends its exit before its teardown.
        std::thread::sleep(Duration::from_millis(100));
        node3.shutdown();
        assert_eq!(
            *kills.lock().unwrap(),
            [(5, 0)],
            "node 3 did not end the step"
        );
        for (agent, _) in agents {
            agent.shutdown();
        }
    }
}
