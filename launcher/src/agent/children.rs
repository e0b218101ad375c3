//! greedyd's side of `MPI_Comm_spawn`: the local ranks' requests go up to greedyrun, which
//! places the children ([`crate::children`]); this node adds each child to its node service,
//! forks its local ranks like the job's (own process group, watched by the guard, output and
//! exit up, labelled with the child's number), and kills them when greedyrun refuses the spawn.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
};

use greedy_pmix::{
    WallTime,
    child::{ChildJob, PendingSpawn},
    node::NodeService,
};
use nix::sys::signal::Signal;
use tokio::{process::Child, sync::mpsc, task::JoinHandle};
use tracing::{Instrument, debug, info_span, warn};

use super::{Agent, drain_output, end_of_child};
use crate::{
    guard::GuardHandle,
    proto::{RankEnd, Stream, Up},
    signals, spawn, stdio, wireup,
};

/// This node's spawns: requests waiting for greedyrun's answer, and the children added here.
#[derive(Default)]
pub(super) struct ChildRanks {
    /// Requests sent up, by their number on this node.
    pending: HashMap<u32, PendingSpawn>,
    next_id: u32,
    /// Children this node's service serves, by number.
    known: HashMap<u32, ChildJob>,
    /// The process groups of each child's local ranks.
    groups: HashMap<u32, Vec<u32>>,
    /// Children greedyrun killed (a refused spawn): their exits are not the family's aborts.
    killed: Arc<Mutex<HashSet<u32>>>,
}

/// What forking a child's ranks needs from the agent's main loop.
pub(super) struct Fork<'a> {
    pub(super) agent: &'a Agent,
    pub(super) service: Option<&'a NodeService>,
    pub(super) guard: &'a mut Option<GuardHandle>,
    pub(super) exit_tx: &'a mpsc::Sender<u32>,
}

impl ChildRanks {
    /// A local rank's request: sent up, kept until greedyrun answers.
    pub(super) async fn request(&mut self, spawn: PendingSpawn, up: &mpsc::Sender<Up>, node: u32) {
        let id = self.next_id;
        self.next_id += 1;
        let request = spawn.request.clone();
        self.pending.insert(id, spawn);
        debug!(id, procs = request.total_procs(), "spawn request sent up");
        let _ = up.send(Up::Spawn { node, id, request }).await;
    }

    /// greedyrun's answer to request `id`.
    pub(super) fn answer(&mut self, id: u32, result: Result<String, String>) {
        debug!(id, ok = result.is_ok(), "spawn answered");
        match (self.pending.remove(&id), result) {
            (Some(p), Ok(nspace)) => p.started(nspace),
            (Some(p), Err(why)) => p.refused(why),
            (None, _) => warn!(id, "an answer to no spawn request of this node: ignored"),
        }
    }

    /// Serves child `child` on this node; says so (or why not) up; whether it did.
    pub(super) async fn add(&mut self, child: u32, job: ChildJob, f: &Fork<'_>) -> bool {
        debug!(child, nspace = %job.nspace, "adding child");
        let checked = crate::children::check_child(&job, f.agent.start.hosts.len());
        let result = match (checked, f.service) {
            (Err(why), _) => Err(why),
            (Ok(()), Some(s)) => s.add_child(&job).await.map_err(|e| e.to_string()),
            (Ok(()), None) => Err("no wire-up service runs here (--pmi none)".into()),
        };
        if result.is_ok() {
            self.known.insert(child, job);
        }
        let added = result.is_ok();
        debug!(child, ok = added, "child added");
        let node = f.agent.node;
        let _ = f
            .agent
            .up
            .send(Up::ChildAdded {
                node,
                child,
                result,
            })
            .await;
        added
    }

    /// Forks this node's ranks of `child`; says up that they run, or which could not (the
    /// rest are then not started, and each reported not started); returns how many run.
    pub(super) async fn start(&mut self, child: u32, f: &mut Fork<'_>) -> usize {
        let (node, up) = (f.agent.node, f.agent.up.clone());
        let Some(job) = self.known.get(&child).cloned() else {
            let result = Err(format!("child {child} was never added on this node"));
            let _ = up
                .send(Up::ChildStarted {
                    node,
                    child,
                    result,
                })
                .await;
            return 0;
        };
        let local = job.ranks.get(node as usize).cloned().unwrap_or_default();
        debug!(child, ranks = local.len(), "starting child ranks");
        let mut failure = None;
        let mut unstarted = Vec::new();
        for (local_id, &rank) in local.iter().enumerate() {
            if failure.is_some() {
                unstarted.push(rank);
                continue;
            }
            let place = (local_id, local.len());
            match self.fork(child, &job, rank, place, f).await {
                Ok(pgid) => self.groups.entry(child).or_default().push(pgid),
                Err(why) => {
                    failure = Some(why);
                    unstarted.push(rank);
                }
            }
        }
        let started = local.len() - unstarted.len();
        if failure.is_some() {
            self.kill(child, f.agent);
        }
        let result = failure.map_or(Ok(()), Err);
        debug!(child, started, ok = result.is_ok(), "child ranks started");
        let _ = up
            .send(Up::ChildStarted {
                node,
                child,
                result,
            })
            .await;
        for rank in unstarted {
            let end = RankEnd::NotStarted;
            let at = WallTime::now();
            let _ = up
                .send(Up::ChildExit {
                    child,
                    rank,
                    end,
                    at,
                })
                .await;
        }
        started
    }

    /// Forks `rank` of `child` (the `place.0`-th of `place.1` on this node): its process
    /// group, or why it could not start.
    async fn fork(
        &self,
        child: u32,
        job: &ChildJob,
        rank: u32,
        place: (usize, usize),
        f: &mut Fork<'_>,
    ) -> Result<u32, String> {
        let agent = f.agent;
        let host = &agent.start.hosts[agent.node as usize];
        let (_, app) = job
            .app_of(rank)
            .ok_or_else(|| format!("child {} has no program for rank {rank}", job.nspace))?;
        let mut env = agent.job_env();
        env.extend(app.env.iter().cloned());
        env.extend([
            ("GREEDY_JOB".to_string(), job.nspace.clone()),
            ("GREEDY_RANK".to_string(), rank.to_string()),
            ("GREEDY_SIZE".to_string(), job.n_ranks().to_string()),
            ("GREEDY_LOCAL_RANK".to_string(), place.0.to_string()),
            ("GREEDY_LOCAL_SIZE".to_string(), place.1.to_string()),
        ]);
        let inherit = match f.service {
            Some(s) => child_wireup(s, &job.nspace, rank, &mut env).await?,
            None => None,
        };
        debug!(child, rank, "child rank's wire-up ready");
        let spec = spawn::RankSpec {
            argv: &app.argv,
            env: &env,
            cwd: app.cwd.as_deref().unwrap_or(&agent.start.cwd),
            stdin: false,
            inherit,
            cpus: None,
            files: None,
        };
        let program = &app.argv[0];
        let process = spawn::spawn(spec)
            .map_err(|e| format!("cannot run {program:?} on host {host}: {e}"))?;
        debug!(child, rank, "child rank forked");
        Ok(self.watch(child, job, rank, process, f).await)
    }

    /// Looks after a forked child rank: its group (the guard's too), its output, its end.
    async fn watch(
        &self,
        child: u32,
        job: &ChildJob,
        rank: u32,
        mut process: Child,
        f: &mut Fork<'_>,
    ) -> u32 {
        let agent = f.agent;
        let pgid = process.id().unwrap_or(0);
        agent.groups.adopt(pgid);
        if let Some(g) = f.guard.as_mut() {
            g.watch(pgid).await;
        }
        let unbuffered = agent.start.unbuffered;
        let frame = move |stream| {
            move |data| Up::ChildOutput {
                child,
                rank,
                stream,
                data,
            }
        };
        let out = tokio::spawn(stdio::forward_as(
            process.stdout.take().expect("piped"),
            agent.up.clone(),
            unbuffered,
            frame(Stream::Stdout),
        ));
        let err = tokio::spawn(stdio::forward_as(
            process.stderr.take().expect("piped"),
            agent.up.clone(),
            unbuffered,
            frame(Stream::Stderr),
        ));
        let ending = ChildEnding {
            child,
            nspace: job.nspace.clone(),
            rank,
            pgid,
            up: agent.up.clone(),
            exits: f.exit_tx.clone(),
            service: f.service.cloned(),
            own: agent.groups.clone(),
            killed: self.killed.clone(),
        };
        let span = info_span!("child", nspace = %job.nspace, rank);
        tokio::spawn(ending.wait(process, out, err).instrument(span));
        pgid
    }

    /// Ends the local ranks of `child` (a refused spawn): TERM, KILL after the grace period;
    /// their exits abort nothing.
    pub(super) fn kill(&mut self, child: u32, agent: &Agent) {
        self.killed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(child);
        let groups = self.groups.remove(&child).unwrap_or_default();
        for &g in &groups {
            agent.groups.signal(g, Signal::SIGTERM);
        }
        let (grace, own) = (agent.grace, agent.groups.clone());
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            for g in groups {
                own.signal(g, Signal::SIGKILL);
            }
        });
    }
}

/// Adds the wire-up service's variables for `rank` of child `nspace` to `env` (its defaults
/// only where `env` has none); the PMI socket the rank inherits, if any.
async fn child_wireup(
    service: &NodeService,
    nspace: &str,
    rank: u32,
    env: &mut Vec<(String, String)>,
) -> Result<Option<(std::os::fd::OwnedFd, i32)>, String> {
    let w = service
        .child_env(nspace, rank, Some(wireup::PMI_FD))
        .await
        .map_err(|e| format!("no wire-up for rank {rank} of {nspace}: {e}"))?;
    Ok(super::add_wireup(w, env))
}

/// What reports a child rank's end up once it exited and its output drained.
struct ChildEnding {
    child: u32,
    nspace: String,
    rank: u32,
    pgid: u32,
    up: mpsc::Sender<Up>,
    /// The main loop's count of ended processes.
    exits: mpsc::Sender<u32>,
    service: Option<NodeService>,
    own: signals::OwnGroups,
    killed: Arc<Mutex<HashSet<u32>>>,
}

impl ChildEnding {
    /// Waits for the rank, tells the node service (unless greedyrun killed it), reports up.
    async fn wait(self, mut process: Child, out: JoinHandle<()>, err: JoinHandle<()>) {
        let end = end_of_child(&mut process).await;
        let at = WallTime::now();
        self.own.forget_if_empty(self.pgid);
        drain_output(out, err).await;
        self.own.forget_if_empty(self.pgid);
        let killed = (self.killed.lock().unwrap_or_else(|p| p.into_inner())).contains(&self.child);
        if let (Some(s), false) = (&self.service, killed) {
            s.child_exited(&self.nspace, self.rank, end.code()).await;
        }
        let (child, rank) = (self.child, self.rank);
        let _ = self
            .up
            .send(Up::ChildExit {
                child,
                rank,
                end,
                at,
            })
            .await;
        let _ = self.exits.send(self.pgid).await;
    }
}
