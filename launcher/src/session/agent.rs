//! A session agent's side: each job it runs on this host is an agent of its own inside this
//! process, sharing the session agent's guard and PMIx server; no process is started for it.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use bytes::Bytes;
use greedy_pmix::names::{Response, SharedTable};
use nix::sys::signal::Signal;
use tokio::{
    sync::mpsc,
    task::{JoinError, JoinHandle},
};

use super::AskSession;
use crate::{
    guard::GuardHandle,
    proto::{Down, JobCmd, Start, Up},
    signals::OwnGroups,
    wireup::SharedPmix,
};

/// Frames queued from one job's agent; a full queue slows that job's ranks, not the session.
const JOB_UP_CAPACITY: usize = 256;

/// What a job run in the session agent's process shares with it.
pub struct JobShare {
    /// A handle on the session agent's guard, which watches the job's ranks too.
    pub guard: Option<GuardHandle>,
    /// The host's one PMIx server, for every job.
    pub pmix: SharedPmix,
    /// The session's name table, for every job.
    pub names: Arc<dyn SharedTable>,
    /// The job's own process groups (also the session agent's to kill if the job hangs).
    pub groups: OwnGroups,
    /// The CPUs each local rank is bound to, chosen by the session agent among its streams'
    /// tasks (a job task's ranks); empty: as the job's `--bind-to` says.
    pub cpus: BTreeMap<u32, Vec<u32>>,
}

/// One job's agent on this host.
struct JobAgent {
    /// Its commands; dropped to end it, as a lost remote shell would.
    down: Option<mpsc::UnboundedSender<Down>>,
    /// Its ranks' process groups.
    groups: OwnGroups,
}

/// What ended of a session's job on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobEnded {
    /// Its ranks here: every one reported its exit (its agent still tears down).
    Ranks(u32),
    /// Its agent: gone, its last frame relayed.
    Agent(u32),
}

/// A session agent's jobs: for each, an agent in this process, its frames relayed up as
/// [`Up::Job`].
pub struct JobAgents {
    /// This agent's node in the session.
    node: u32,
    grace: Duration,
    up: mpsc::Sender<Up>,
    pmix: SharedPmix,
    names: AskSession,
    jobs: HashMap<u32, JobAgent>,
    ended_tx: mpsc::Sender<JobEnded>,
    ended_rx: mpsc::Receiver<JobEnded>,
}

impl JobAgents {
    /// No jobs yet on session host `node`; frames go to `up`, and jobs that serve PMIx share
    /// `pmix`.
    pub fn new(node: u32, grace: Duration, up: mpsc::Sender<Up>, pmix: SharedPmix) -> JobAgents {
        let (ended_tx, ended_rx) = mpsc::channel(16);
        JobAgents {
            node,
            grace,
            names: AskSession::new(node, up.clone()),
            up,
            pmix,
            jobs: HashMap::new(),
            ended_tx,
            ended_rx,
        }
    }

    /// Starts this host's agent for `job` if the host is one of `nodes` (its position there is
    /// its node in the job); its ranks are watched by `guard`, this agent's.
    pub fn start(
        &mut self,
        job: u32,
        nodes: &[u32],
        mut start: Start,
        guard: Option<&GuardHandle>,
        cpus: BTreeMap<u32, Vec<u32>>,
    ) {
        let Some(i) = nodes.iter().position(|&n| n == self.node) else {
            return;
        };
        start.node_idx = i as u32;
        start.launch_sizes = vec![1];
        let groups = OwnGroups::default();
        let share = JobShare {
            guard: guard.map(GuardHandle::share),
            pmix: self.pmix.clone(),
            names: Arc::new(self.names.clone()),
            groups: groups.clone(),
            cpus,
        };
        let (down_tx, down_rx) = mpsc::unbounded_channel();
        let (up_tx, up_rx) = mpsc::channel(JOB_UP_CAPACITY);
        let local = start.ranks.get(i).map_or(0, Vec::len);
        let agent = tokio::spawn(crate::agent::run_in(start, down_rx, up_tx, share));
        self.relay((job, i as u32, local), agent, up_rx);
        let down = Some(down_tx);
        self.jobs.insert(job, JobAgent { down, groups });
    }

    /// Relays what `job`'s agent (host `i` of the job, `local` ranks here) sends up as
    /// [`Up::Job`]; tells `ended` once every local rank exited, and once the agent returned
    /// (then says it is lost if it said no bye).
    fn relay(
        &self,
        (job, i, local): (u32, u32, usize),
        mut agent: JoinHandle<i32>,
        mut rx: mpsc::Receiver<Up>,
    ) {
        let (up, ended) = (self.up.clone(), self.ended_tx.clone());
        tokio::spawn(async move {
            let (mut bye, mut exits) = (false, 0);
            let returned = loop {
                tokio::select! {
                    Some(msg) = rx.recv() => {
                        exits += usize::from(matches!(msg, Up::Exit { .. }));
                        bye |= forward(&up, job, msg).await;
                        if exits == local && local > 0 {
                            let _ = ended.send(JobEnded::Ranks(job)).await;
                        }
                    }
                    returned = &mut agent => break returned,
                }
            };
            while let Ok(msg) = rx.try_recv() {
                bye |= forward(&up, job, msg).await;
            }
            if !bye {
                forward(&up, job, lost(i, ended_how(returned))).await;
            }
            let _ = ended.send(JobEnded::Agent(job)).await;
        });
    }

    /// The session answered name request `ticket` of this host.
    pub fn names_answered(&self, ticket: u64, response: Response) {
        self.names.answered(ticket, response);
    }

    /// Passes `cmd` to `job`'s agent, if it runs here.
    pub fn deliver(&self, job: u32, cmd: JobCmd) {
        if let Some(down) = self.jobs.get(&job).and_then(|j| j.down.as_ref()) {
            let _ = down.send(Down::Route {
                to: None,
                cmd: cmd.into(),
            });
        }
    }

    /// Ends `job` here as a lost remote shell would: its agent tears its ranks down and says
    /// bye; SIGKILL to what is left of its groups after the grace period and 5 s more.
    pub fn end(&mut self, job: u32) {
        if let Some(j) = self.jobs.get_mut(&job)
            && j.down.take().is_some()
        {
            let (groups, wait) = (j.groups.clone(), self.grace + Duration::from_secs(5));
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                kill_all(&groups);
            });
        }
    }

    /// The next job whose ranks here all exited, or whose agent is gone (its last frame
    /// relayed).
    pub async fn ended(&mut self) -> JobEnded {
        self.ended_rx.recv().await.expect("a sender is kept")
    }

    /// Forgets `job`, whose agent is gone.
    pub fn forget(&mut self, job: u32) {
        self.jobs.remove(&job);
    }

    /// Ends every job (this agent is ending) and waits for their agents, at most `limit`;
    /// what is left of their ranks is killed. Then the host's PMIx server is finalized.
    pub async fn end_all(&mut self, limit: Duration) {
        for j in self.jobs.values_mut() {
            j.down = None;
        }
        let deadline = tokio::time::Instant::now() + limit;
        while !self.jobs.is_empty() {
            tokio::select! {
                Some(ended) = self.ended_rx.recv() => if let JobEnded::Agent(job) = ended {
                    self.jobs.remove(&job);
                },
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        for j in self.jobs.values() {
            kill_all(&j.groups);
        }
        self.pmix.shutdown().await;
    }

    /// Whether no job runs here.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}

/// Relays `msg` of `job`'s agent up as [`Up::Job`]; whether it was its bye.
async fn forward(up: &mpsc::Sender<Up>, job: u32, msg: Up) -> bool {
    let bye = matches!(msg, Up::Bye { .. });
    let _ = up
        .send(Up::Job {
            job,
            frame: encode(&msg),
        })
        .await;
    bye
}

/// SIGKILL to every group still the job's.
fn kill_all(groups: &OwnGroups) {
    for g in groups.all() {
        groups.signal(g, Signal::SIGKILL);
    }
}

/// Why a job's agent ended without a bye.
fn ended_how(returned: Result<i32, JoinError>) -> String {
    match returned {
        Ok(code) => format!("its agent for the job ended with code {code} before saying bye"),
        Err(e) => format!("its agent for the job failed: {e}"),
    }
}

/// Host `node` of a job is lost to it, for `what`.
fn lost(node: u32, what: String) -> Up {
    Up::Lost {
        node,
        by: None,
        what,
    }
}

/// An [`Up`] as its codec's body: what a job's greedyd would have written.
fn encode(up: &Up) -> Bytes {
    postcard::to_stdvec(up).map(Bytes::from).unwrap_or_default()
}
