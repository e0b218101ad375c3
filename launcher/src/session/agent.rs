//! A session agent's side: each job it runs gets a greedyd of its own on this host.

use std::{collections::HashMap, time::Duration};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};

use crate::{
    guard::GuardHandle,
    proto::{Down, JobCmd, MAX_FRAME, ParentCodec, Start, Up},
    signals,
};

/// The greedyd of one job on this host.
struct JobAgent {
    /// Frames for its stdin; dropped to close it.
    down: Option<mpsc::UnboundedSender<Down>>,
    pgid: u32,
}

/// A session agent's jobs: for each, a greedyd of its own, its frames relayed up as
/// [`Up::Job`].
pub struct JobAgents {
    node: u32,
    grace: Duration,
    up: mpsc::Sender<Up>,
    jobs: HashMap<u32, JobAgent>,
    ended_tx: mpsc::Sender<u32>,
    ended_rx: mpsc::Receiver<u32>,
    /// The agent's own groups: a job's greedyd is signalled only while its group is the job's.
    groups: signals::OwnGroups,
}

impl JobAgents {
    /// No jobs yet, on session host `node`, frames going to `up`, process groups kept in
    /// `groups`.
    pub fn new(
        node: u32,
        grace: Duration,
        up: mpsc::Sender<Up>,
        groups: signals::OwnGroups,
    ) -> JobAgents {
        let (ended_tx, ended_rx) = mpsc::channel(16);
        JobAgents {
            node,
            grace,
            up,
            jobs: HashMap::new(),
            ended_tx,
            ended_rx,
            groups,
        }
    }

    /// Starts this host's greedyd for `job` if the host is one of `nodes`. Its ranks' guard
    /// is its own; `guard` (this agent's) watches its process group, so killing this agent
    /// ends it too.
    pub async fn start(
        &mut self,
        job: u32,
        nodes: &[u32],
        mut start: Start,
        guard: &mut Option<GuardHandle>,
    ) {
        let Some(i) = nodes.iter().position(|&n| n == self.node) else {
            return;
        };
        let i = i as u32;
        start.node_idx = i;
        start.launch_sizes = vec![1];
        let spawned = std::env::current_exe().and_then(|exe| {
            tokio::process::Command::new(exe)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .process_group(0)
                .kill_on_drop(false)
                .spawn()
        });
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                let frame = encode(&lost(i, format!("cannot start greedyd for the job: {e}")));
                let _ = self.up.send(Up::Job { job, frame }).await;
                return;
            }
        };
        let pgid = child.id().unwrap_or(0);
        self.groups.adopt(pgid);
        if let Some(g) = guard.as_mut() {
            g.watch(pgid).await;
        }
        let (down_tx, bye_tx) = write_stdin(child.stdin.take().expect("piped"), start);
        self.relay(job, i, child, pgid, bye_tx);
        self.jobs.insert(
            job,
            JobAgent {
                down: Some(down_tx),
                pgid,
            },
        );
    }

    /// Relays the frames `child` (`job`'s greedyd, host `i` of the job, in group `pgid`)
    /// writes up as [`Up::Job`]; tells `bye` of its bye, and `ended` once it is gone.
    fn relay(
        &self,
        job: u32,
        i: u32,
        mut child: tokio::process::Child,
        pgid: u32,
        bye_tx: oneshot::Sender<()>,
    ) {
        let stdout = child.stdout.take().expect("piped");
        let (up, ended, own) = (self.up.clone(), self.ended_tx.clone(), self.groups.clone());
        tokio::spawn(async move {
            let codec = LengthDelimitedCodec::builder()
                .length_field_length(4)
                .max_frame_length(MAX_FRAME)
                .new_codec();
            let mut frames = FramedRead::new(stdout, codec);
            let mut bye = Some(bye_tx);
            while let Some(Ok(frame)) = frames.next().await {
                let frame: Bytes = frame.freeze();
                if matches!(postcard::from_bytes::<Up>(&frame), Ok(Up::Bye { .. })) {
                    bye.take().map(|b| b.send(()));
                }
                let _ = up.send(Up::Job { job, frame }).await;
            }
            let status = child.wait().await;
            own.forget_if_empty(pgid);
            if bye.is_some() {
                let how = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                let frame = encode(&lost(i, format!("its greedyd for the job ended ({how})")));
                let _ = up.send(Up::Job { job, frame }).await;
            }
            let _ = ended.send(job).await;
        });
    }

    /// Passes `cmd` to `job`'s greedyd, if it runs here.
    pub fn deliver(&self, job: u32, cmd: JobCmd) {
        if let Some(down) = self.jobs.get(&job).and_then(|j| j.down.as_ref()) {
            let _ = down.send(Down::Route {
                to: None,
                cmd: cmd.into(),
            });
        }
    }

    /// Ends `job` here as a lost remote shell would: its greedyd's stdin closes (it tears its
    /// ranks down and says bye); SIGKILL to its group after the grace period and 5 s more.
    pub fn end(&mut self, job: u32) {
        if let Some(j) = self.jobs.get_mut(&job)
            && j.down.take().is_some()
        {
            let (pgid, wait) = (j.pgid, self.grace + Duration::from_secs(5));
            let own = self.groups.clone();
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                // Only if its greedyd still runs: once reaped, the number may be a stranger's.
                own.signal(pgid, nix::sys::signal::Signal::SIGKILL);
            });
        }
    }

    /// The next job whose greedyd is gone (its last frame relayed).
    pub async fn ended(&mut self) -> u32 {
        self.ended_rx.recv().await.expect("a sender is kept")
    }

    /// Forgets `job` (its greedyd is gone); its process group, for the guard to unwatch.
    pub fn forget(&mut self, job: u32) -> Option<u32> {
        self.jobs.remove(&job).map(|j| j.pgid)
    }

    /// Ends every job (this agent is ending) and waits for their greedyds, at most `limit`;
    /// those still there are killed.
    pub async fn end_all(&mut self, limit: Duration) {
        let jobs: Vec<u32> = self.jobs.keys().copied().collect();
        for &job in &jobs {
            if let Some(j) = self.jobs.get_mut(&job) {
                j.down = None;
            }
        }
        let deadline = tokio::time::Instant::now() + limit;
        while !self.jobs.is_empty() {
            tokio::select! {
                Some(job) = self.ended_rx.recv() => { self.jobs.remove(&job); }
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        for j in self.jobs.values() {
            self.groups
                .signal(j.pgid, nix::sys::signal::Signal::SIGKILL);
        }
    }

    /// Whether no job runs here.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}

/// Writes a job's greedyd's stdin: its `start`, then what is sent on the returned channel,
/// until its bye (the returned sender) closes it, as after a remote shell's parent read its
/// bye (it waits for that before it exits).
fn write_stdin(
    stdin: tokio::process::ChildStdin,
    start: Start,
) -> (mpsc::UnboundedSender<Down>, oneshot::Sender<()>) {
    let (down_tx, mut down_rx) = mpsc::unbounded_channel::<Down>();
    let _ = down_tx.send(Down::Start(Box::new(start)));
    let mut stdin = FramedWrite::new(stdin, ParentCodec::default());
    let (bye_tx, mut bye_rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                f = down_rx.recv() => {
                    let Some(f) = f else { break };
                    if stdin.send(f).await.is_err() {
                        break;
                    }
                }
                _ = &mut bye_rx => break,
            }
        }
        // Dropped here: its stdin closes, as a lost remote shell's would.
    });
    (down_tx, bye_tx)
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
