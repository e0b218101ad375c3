//! The session's side of a client's job: slots, the start down the tree, the relay both ways.

use std::{sync::Arc, time::Duration};

use futures_util::{SinkExt, StreamExt};
use tokio::{
    io::{AsyncRead, AsyncWriteExt},
    net::unix::OwnedWriteHalf,
};
use tokio_util::codec::{FramedRead, FramedWrite};
use tracing::{debug, info, warn};

use tokio::sync::Mutex;

use super::{
    board::{JobBoard, Ticket},
    control::{CLIENT_STALL, HANDSHAKE},
    queue::JobFrames,
    staging::Stager,
};
use crate::{
    fanout::Fanout,
    limits::SHUTDOWN_TIMEOUT,
    proto::{Cmd, FromSession, SessionCodec, Start, ToSession, Up},
};

/// How long a job waits quietly for an ending job's slots before its client is told why.
const ENDING_PATIENCE: Duration = Duration::from_secs(2);

/// What the session shares with each job it serves beside its loop.
#[derive(Clone)]
pub(super) struct JobDesk {
    /// The slots.
    pub(super) board: Arc<JobBoard>,
    /// The session's tree.
    pub(super) fanout: Arc<Fanout>,
    /// What its agents hold in their caches (tasks' inputs, jobs' `--bcast` files).
    pub(super) stager: Arc<Mutex<Stager>>,
}

/// The session's side of a client's job, from its request line to the job's end: offers the
/// free slots, takes the job (its `--bcast` files into the agents' caches first), sends it
/// down the tree, and relays both ways until every host of the job said bye or was lost. A
/// client that goes away ends its job ([`Cmd::EndJob`]). A job with a `claim` runs in the
/// slots a stream's task took for it.
pub(super) async fn serve_job<R: AsyncRead + Unpin>(
    rd: R,
    wr: OwnedWriteHalf,
    desk: JobDesk,
    claim: Option<u64>,
) {
    let JobDesk {
        board,
        fanout,
        stager,
    } = desk;
    let mut client = Client {
        rd: FramedRead::new(rd, SessionCodec::default()),
        wr: FramedWrite::new(wr, SessionCodec::default()),
    };
    let Some((start, ticket)) = client.take_job(&board, claim, (&stager, &fanout)).await else {
        return;
    };
    let Some(ups) = client.wait_for_slots(&board, &ticket, &start).await else {
        return;
    };
    let (job, nodes) = (ticket.job, ticket.nodes.clone());
    info!(job, hosts = nodes.len(), id = %start.job_id, "job attached");
    let _ = client.wr.send(FromSession::Started).await;
    let cmd = Cmd::JobStart {
        job,
        nodes: nodes.clone(),
        start: start.clone(),
        task: ticket.task.clone(),
    };
    fanout.route(None, cmd).await;
    let served = Served {
        job,
        done: vec![false; nodes.len()],
        left: nodes.len(),
        nodes,
        board,
        fanout,
        ticket,
        wr: client.wr,
        client: true,
        detached_until: None,
    };
    served.relay_until_ended(client.rd, ups).await;
}

/// A job's client's control connection, before its job runs.
struct Client<R> {
    rd: FramedRead<R, SessionCodec>,
    wr: FramedWrite<OwnedWriteHalf, SessionCodec>,
}

impl<R: AsyncRead + Unpin> Client<R> {
    /// Offers the free slots and takes the client's job on them: the job and its ticket, or
    /// `None` (it was refused, and told why, or the client went away).
    async fn take_job(
        &mut self,
        board: &JobBoard,
        claim: Option<u64>,
        cache: (&Mutex<Stager>, &Fanout),
    ) -> Option<(Box<Start>, Ticket)> {
        let wr = &mut self.wr;
        if wr.send(FromSession::Hosts(board.free())).await.is_err() {
            return None;
        }
        let mut start = match tokio::time::timeout(HANDSHAKE, self.rd.next()).await {
            Ok(Some(Ok(ToSession::Start(s)))) => s,
            _ => return None,
        };
        let checked = start.check();
        let cached = match checked {
            Ok(()) => cache_bcast(&mut start, cache.0, cache.1).await,
            Err(why) => Err(why),
        };
        if let Err(why) = cached {
            let _ = wr.send(FromSession::Refused(why)).await;
            return None;
        }
        let ticket = match claim {
            Some(c) => board.reserve_claimed(&start, c),
            None => board.reserve(&start),
        };
        match ticket {
            Ok(t) => Some((start, t)),
            Err(why) => {
                let _ = wr.send(FromSession::Refused(why)).await;
                None
            }
        }
    }

    /// Waits until `ticket`'s job has its slots: its queue of frames, or `None` (it was
    /// refused, or the client went away and its slots were given up).
    async fn wait_for_slots(
        &mut self,
        board: &JobBoard,
        ticket: &Ticket,
        start: &Start,
    ) -> Option<JobFrames> {
        // Slots of an ending job free within its shutdown: the client waits without a word,
        // and is told which job it waits for only should that take long.
        let mut quiet = ticket.waits && !board.tasks_hold(ticket);
        if ticket.waits {
            let why = if quiet {
                String::new()
            } else {
                let (jobs, _, queued) = board.running();
                format!(
                    "waiting for slots that the task stream's tasks hold ({jobs} jobs running, {} waiting before this one)",
                    queued.saturating_sub(1)
                )
            };
            if self.wr.send(FromSession::Waiting(why)).await.is_err() {
                board.give_up(ticket);
                return None;
            }
        }
        // A client that goes away (or sends anything) while its job waits gives the slots up.
        let admitted = loop {
            tokio::select! {
                a = board.admitted(ticket, start) => break a,
                _ = self.rd.next() => {
                    board.give_up(ticket);
                    return None;
                }
                _ = tokio::time::sleep(ENDING_PATIENCE), if quiet => {
                    quiet = false;
                    if self.wr.send(FromSession::Waiting(waits_for(board, ticket))).await.is_err() {
                        board.give_up(ticket);
                        return None;
                    }
                }
            }
        };
        match admitted {
            Ok(ups) => Some(ups),
            Err(why) => {
                let _ = self.wr.send(FromSession::Refused(why)).await;
                None
            }
        }
    }
}

/// `start`'s `--bcast` files into every agent's cache, each content once for the session's
/// life (a changed file is read and sent again): the job's agents link them, and its client
/// sends none. Why not, for the client.
async fn cache_bcast(
    start: &mut Start,
    stager: &Mutex<Stager>,
    fanout: &Fanout,
) -> Result<(), String> {
    if start.bcast.is_empty() {
        return Ok(());
    }
    let mut stager = stager.lock().await;
    for f in &mut start.bcast {
        let (hash, sent) = (stager
            .stage_file(std::path::Path::new(&f.path), fanout)
            .await)
            .map_err(|e| format!("--bcast {}: {e}", f.path))?;
        match sent {
            Some(bytes) => info!(file = %f.path, bytes, "--bcast: into every agent's cache"),
            None => debug!(file = %f.path, "--bcast: already in every agent's cache"),
        }
        f.cached = Some(hash);
    }
    Ok(())
}

/// What a job that waited quietly for [`ENDING_PATIENCE`] waits for.
fn waits_for(board: &JobBoard, ticket: &Ticket) -> String {
    let jobs = board.ending_on(ticket);
    let list = jobs
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    match jobs.len() {
        0 => format!(
            "waiting behind {} jobs that wait for slots",
            board.running().2.saturating_sub(1)
        ),
        1 => format!(
            "waiting for the slots of job {list}, which is ending (not all its hosts have said bye)"
        ),
        _ => format!(
            "waiting for the slots of jobs {list}, which are ending (not all their hosts have said bye)"
        ),
    }
}

/// A running job of a client, with one method per event of its relay.
struct Served {
    job: u32,
    /// The session host of each job host.
    nodes: Vec<u32>,
    /// Which job hosts said bye or were lost, and how many did not yet.
    done: Vec<bool>,
    left: usize,
    board: Arc<JobBoard>,
    fanout: Arc<Fanout>,
    ticket: Ticket,
    wr: FramedWrite<OwnedWriteHalf, SessionCodec>,
    /// The client is there: it neither went away nor detached.
    client: bool,
    /// A detached job's hosts get as long to say bye as greedyrun would have given them;
    /// then they are ended as when a client goes away.
    detached_until: Option<tokio::time::Instant>,
}

impl Served {
    /// Relays both ways until every host of the job said bye or was lost; then its slots
    /// are free.
    async fn relay_until_ended<R: AsyncRead + Unpin>(
        mut self,
        mut rd: FramedRead<R, SessionCodec>,
        mut ups: JobFrames,
    ) {
        let job = self.job;
        while self.left > 0 {
            let detached_until = self.detached_until;
            tokio::select! {
                f = rd.next(), if self.client => self.on_client_frame(f).await,
                _ = tokio::time::sleep_until(detached_until.unwrap_or_else(tokio::time::Instant::now)),
                    if detached_until.is_some() => {
                    warn!(job, hosts = self.left, "a detached job's hosts did not say bye in time: ending them");
                    self.detached_until = None;
                    self.end_job().await;
                }
                up = ups.recv() => {
                    let Some(up) = up else { break };
                    self.on_job_frame(up, &ups).await;
                }
            }
        }
        self.board.release(&self.ticket);
        info!(job, "job ended");
        let _ = self.wr.get_mut().shutdown().await;
    }

    /// Ends the job on its hosts, as when its client goes away.
    async fn end_job(&self) {
        let job = self.job;
        self.fanout.route(None, Cmd::EndJob { job }).await;
    }

    /// A frame from the client (or its end).
    async fn on_client_frame(&mut self, f: Option<Result<ToSession, crate::Error>>) {
        let job = self.job;
        match f {
            Some(Ok(ToSession::Route { to, cmd })) => {
                let to = match to {
                    None => None,
                    Some(i) => match self.nodes.get(i as usize) {
                        Some(&n) => Some(n),
                        None => return,
                    },
                };
                self.fanout.route(to, Cmd::ForJob { job, cmd }).await;
            }
            Some(Ok(ToSession::Place {
                child,
                apps,
                oversubscribe,
            })) => {
                let result = (self.board).place_child(&mut self.ticket, &apps, oversubscribe);
                let _ = self.wr.send(FromSession::Placed { child, result }).await;
            }
            Some(Ok(ToSession::Kill)) => self.end_job().await,
            Some(Ok(ToSession::Detach)) => {
                debug!(
                    job,
                    "the job's client has its verdict: the job ends without it"
                );
                self.client = false;
                self.board.ending(&self.ticket);
                self.detached_until = Some(tokio::time::Instant::now() + SHUTDOWN_TIMEOUT);
            }
            Some(Ok(ToSession::Start(_))) => {}
            None | Some(Err(_)) => {
                debug!(job, "the job's client went away: the job ends");
                self.client = false;
                self.end_job().await;
            }
        }
    }

    /// A frame of the job from the tree: counted if a host is done, passed to the client.
    async fn on_job_frame(&mut self, up: Up, ups: &JobFrames) {
        if let Up::Bye { node } | Up::Lost { node, .. } = &up
            && let Some(d) = self.done.get_mut(*node as usize)
            && !*d
        {
            *d = true;
            self.left -= 1;
        }
        if self.client && !relay(&mut self.wr, up, ups).await {
            let job = self.job;
            debug!(
                job,
                "the job's client went away or stopped reading: the job ends"
            );
            self.client = false;
            self.end_job().await;
        }
    }
}

/// Passes `up` to a job's client; false when the client is gone: its connection failed, one
/// frame took longer than [`CLIENT_STALL`], or output was dropped for it.
async fn relay(
    wr: &mut FramedWrite<OwnedWriteHalf, SessionCodec>,
    up: Up,
    ups: &JobFrames,
) -> bool {
    if ups.overflowed() {
        return false;
    }
    let sent = tokio::time::timeout(CLIENT_STALL, wr.send(FromSession::Up(up)));
    matches!(sent.await, Ok(Ok(())))
}

/// A frame of a job as the session's loop got it from the tree, to the job's queue.
pub fn job_frame(board: &JobBoard, job: u32, frame: &[u8]) {
    match postcard::from_bytes::<Up>(frame) {
        Ok(up) => {
            if let Some(q) = board.queue_of(job) {
                q.push(up);
            }
        }
        Err(e) => warn!(job, "undecodable frame of a job: {e}"),
    }
}
