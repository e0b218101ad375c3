//! The node agent inside slurmstepd: the overlay, the PMI server and the ranks' sockets.
//!
//! Lifecycle (one step per slurmstepd process):
//! 1. `prefork` (root, before any task is forked) calls [`Agent::start`]: resolve this node's
//!    NodeAddr, start a tokio runtime on its own threads, join the overlay (bounded by
//!    `MpiJoinTimeout`), start the PMI server, make one socketpair per local rank and a notify
//!    pipe. It returns only when the node can serve its ranks, so a failure is an error
//!    returned to Slurm (the step fails to launch), never an abort.
//! 2. each forked task runs the task hook, which reads the immutable [`TaskTable`] (no lock:
//!    the fork may have happened while a runtime thread held one), keeps its own socket across
//!    exec and writes its rank into the notify pipe; the agent then closes slurmstepd's copy of
//!    that rank's socket, so a rank that dies is seen as EOF.
//! 3. an abort anywhere in the job (a rank's `PMI_Abort`, a malformed PMI message, a rank that
//!    closes its socket before finalize, a timeout) reaches every node over the overlay; the
//!    node where it started asks slurmctld to kill the step (`Hooks::kill_step`), which ends
//!    every task on every node.
//! 4. there is no per-step hook in slurmstepd after the tasks end: the agent stops in `fini`,
//!    which slurmstepd calls at teardown, after every task has been reaped
//!    ([`Agent::shutdown`], bounded by `MpiShutdownTimeout`).

use crate::Error;
use crate::plan::{self, Rendezvous as Choice, StepPlan};
use crate::rendezvous::SrunRendezvous;
use greedy_pmix::overlay::{Overlay, OverlayConfig};
use greedy_pmix::rendezvous::Fixed;
use greedy_pmix::server::{PmiConfig, PmiServer};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Runtime;
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
    /// The task's end of the socketpair (its number in slurmstepd, inherited by the fork).
    pub fd: RawFd,
    /// The variables to put into the task's env.
    pub env: Vec<(String, String)>,
}

/// Everything the task hook reads: immutable once `prefork` returns.
#[derive(Debug)]
pub struct TaskTable {
    /// Local ranks.
    pub ranks: HashMap<u32, RankSlot>,
    notify: std::io::PipeWriter,
}

impl TaskTable {
    /// Tells the agent that `rank`'s task has been forked (it holds its socket now), so
    /// slurmstepd can close its own copy. One `write(2)` of 4 bytes: atomic on a pipe, and
    /// async-signal-safe.
    pub fn forked(&self, rank: u32) -> std::io::Result<()> {
        (&self.notify).write_all(&rank.to_le_bytes())
    }
}

/// The running service of one node.
pub struct Agent {
    runtime: Option<Runtime>,
    overlay: Overlay,
    pmi: PmiServer,
    node: String,
    shutdown_timeout: Duration,
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

impl Agent {
    /// Starts this node's service for `plan`; returns once the overlay is joined and the
    /// ranks' sockets exist.
    pub fn start(plan: &StepPlan, hooks: &Hooks) -> Result<(Agent, TaskTable), Error> {
        let node = plan.node().to_string();
        let io = |what, source| Error::Io {
            node: node.clone(),
            what,
            source,
        };
        let shim = |source| Error::Shim {
            node: node.clone(),
            source,
        };
        let my_ip = resolve(&node, &node, hooks)?;
        let spec = plan.job_spec();
        let secret = hex_bytes(&plan.secret_hex);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("greedy-mpi")
            .enable_all()
            .build()
            .map_err(|e| io("start the runtime", e))?;
        let mut config = OverlayConfig {
            join_timeout: plan.join_timeout,
            collective_timeout: plan.fence_timeout + Duration::from_secs(30),
            ..OverlayConfig::default()
        };
        let span = info_span!("mpi", job = %plan.kvsname, node = %node);
        let started = match &plan.rendezvous {
            Choice::Ports { port } => {
                config.bind = SocketAddr::new(my_ip, *port);
                let mut known = HashMap::new();
                if let Some(parent) = plan.parent() {
                    let ip = resolve(&node, &plan.hosts[parent], hooks)?;
                    known.insert(parent, SocketAddr::new(ip, *port));
                }
                let rdv = Fixed(known);
                runtime.block_on(
                    async { Overlay::start(&spec, config, &rdv).await }.instrument(span.clone()),
                )
            }
            Choice::Srun { addr } => {
                config.bind = SocketAddr::new(my_ip, 0);
                let rdv = SrunRendezvous::new(*addr, &plan.kvsname, &secret);
                runtime.block_on(
                    async { Overlay::start(&spec, config, &rdv).await }.instrument(span.clone()),
                )
            }
        };
        let overlay = started.map_err(shim)?;
        let pmi_config = PmiConfig {
            // Socketpairs only: a loopback port would let any local user claim a rank.
            port_bind: None,
            fence_timeout: plan.fence_timeout,
            ..PmiConfig::default()
        };
        let pmi = runtime
            .block_on(PmiServer::start(&spec, overlay.clone(), pmi_config))
            .map_err(shim)?;
        let agent = Agent {
            runtime: Some(runtime),
            overlay,
            pmi,
            node: node.clone(),
            shutdown_timeout: plan.shutdown_timeout,
        };
        // From here on a failure must stop what runs: `agent` does so when dropped.
        let _enter = agent.runtime.as_ref().expect("set above").enter();
        let mut ranks = HashMap::new();
        let mut held: HashMap<u32, OwnedFd> = HashMap::new();
        for &rank in &plan.ranks[plan.node_idx] {
            let (theirs, offered) = agent.pmi.socketpair_for(rank, -1).map_err(shim)?;
            let fd = theirs.as_raw_fd();
            ranks.insert(
                rank,
                RankSlot {
                    fd,
                    env: plan::task_env(&offered, fd),
                },
            );
            held.insert(rank, OwnedFd::from(theirs));
        }
        let (reader, notify) = std::io::pipe().map_err(|e| io("notify pipe", e))?;
        close_when_forked(reader, held, &node);
        agent.watch_abort(plan, hooks.kill_step.clone(), span);
        drop(_enter);
        Ok((agent, TaskTable { ranks, notify }))
    }

    fn watch_abort(&self, plan: &StepPlan, kill_step: Arc<KillStepFn>, span: tracing::Span) {
        let mut aborted = self.overlay.aborted();
        let (job, step, me) = (plan.job_id, plan.step_id, plan.node_idx);
        let hosts = plan.hosts.clone();
        self.runtime.as_ref().expect("running").spawn(
            async move {
                let info = match aborted.wait_for(Option::is_some).await {
                    Ok(seen) => seen.clone(),
                    Err(_) => return,
                };
                let Some(info) = info else { return };
                let origin = hosts.get(info.origin_node).map_or("?", String::as_str);
                error!("mpi/greedy: step {job}.{step} aborted on {origin}: {info}");
                if info.origin_node == me {
                    let done = tokio::task::spawn_blocking(move || kill_step(job, step)).await;
                    if !matches!(done, Ok(true)) {
                        error!("mpi/greedy: could not ask slurmctld to kill step {job}.{step}");
                    }
                }
            }
            .instrument(span),
        );
    }

    /// Stops the PMI server and the overlay, then the runtime; all within
    /// `MpiShutdownTimeout`, after which remaining threads are left to die with the process.
    pub fn shutdown(mut self) {
        let Some(rt) = self.runtime.take() else {
            return;
        };
        let (pmi, overlay) = (self.pmi.clone(), self.overlay.clone());
        let deadline = self.shutdown_timeout;
        let stopped = rt.block_on(async move {
            tokio::time::timeout(deadline, async {
                pmi.shutdown().await;
                overlay.shutdown().await;
            })
            .await
        });
        if stopped.is_err() {
            error!(node = %self.node, "mpi/greedy: service did not stop within MpiShutdownTimeout ({deadline:?})");
        } else {
            info!(node = %self.node, fences = self.pmi.fences(), "mpi/greedy: service stopped");
        }
        rt.shutdown_timeout(Duration::from_millis(200));
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_millis(200));
        }
    }
}

/// A thread that closes slurmstepd's copy of each rank's socket once the task hook reports the
/// rank forked. Not a runtime task: it blocks in `read(2)` and must outlive nothing.
fn close_when_forked(mut reader: std::io::PipeReader, mut held: HashMap<u32, OwnedFd>, node: &str) {
    let node = node.to_string();
    let spawned = std::thread::Builder::new()
        .name("greedy-mpi-fork".into())
        .spawn(move || {
            let mut record = [0u8; 4];
            while !held.is_empty() && reader.read_exact(&mut record).is_ok() {
                drop(held.remove(&u32::from_le_bytes(record)));
            }
        });
    if let Err(e) = spawned {
        // Without it a dead rank is only noticed by the fence timeout; not worth failing for.
        error!(node = %node, "mpi/greedy: no fork watcher thread: {e}");
    }
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .filter_map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}
