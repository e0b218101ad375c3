//! The session's side of a client's job: slots, the start down the tree, the relay both ways.

use std::{sync::Arc, time::Duration};

use futures_util::{SinkExt, StreamExt};
use tokio::{
    io::{AsyncRead, AsyncWriteExt},
    net::unix::OwnedWriteHalf,
};
use tokio_util::codec::{FramedRead, FramedWrite};
use tracing::{debug, info, warn};

use super::{
    board::JobBoard,
    control::{CLIENT_STALL, HANDSHAKE},
    queue::JobFrames,
};
use crate::{
    fanout::Fanout,
    limits::SHUTDOWN_TIMEOUT,
    proto::{Cmd, FromSession, SessionCodec, ToSession, Up},
};

/// How long a job waits quietly for an ending job's slots before its client is told why.
const ENDING_PATIENCE: Duration = Duration::from_secs(2);

/// The session's side of a client's job, from its request line to the job's end: offers the
/// free slots, takes the job, sends it down the tree, and relays both ways until every host
/// of the job said bye or was lost. A client that goes away ends its job ([`Cmd::EndJob`]).
pub async fn serve_job<R: AsyncRead + Unpin>(
    rd: R,
    wr: OwnedWriteHalf,
    board: Arc<JobBoard>,
    fanout: Arc<Fanout>,
) {
    let mut rd = FramedRead::new(rd, SessionCodec::default());
    let mut wr = FramedWrite::new(wr, SessionCodec::default());
    if wr.send(FromSession::Hosts(board.free())).await.is_err() {
        return;
    }
    let start = match tokio::time::timeout(HANDSHAKE, rd.next()).await {
        Ok(Some(Ok(ToSession::Start(s)))) => s,
        _ => return,
    };
    if let Err(why) = start.check() {
        let _ = wr.send(FromSession::Refused(why)).await;
        return;
    }
    let ticket = match board.reserve(&start) {
        Ok(t) => t,
        Err(why) => {
            let _ = wr.send(FromSession::Refused(why)).await;
            return;
        }
    };
    // Slots of an ending job free within its shutdown: the client waits without a word, and
    // is told which job it waits for only should that take long.
    let mut quiet = ticket.waits && !board.tasks_hold(&ticket);
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
        if wr.send(FromSession::Waiting(why)).await.is_err() {
            board.give_up(&ticket);
            return;
        }
    }
    // A client that goes away (or sends anything) while its job waits gives the slots up.
    let admitted = loop {
        tokio::select! {
            a = board.admitted(&ticket, &start) => break a,
            _ = rd.next() => {
                board.give_up(&ticket);
                return;
            }
            _ = tokio::time::sleep(ENDING_PATIENCE), if quiet => {
                quiet = false;
                let jobs = board.ending_on(&ticket);
                let list = jobs.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
                let why = match jobs.len() {
                    0 => format!("waiting behind {} jobs that wait for slots", board.running().2.saturating_sub(1)),
                    1 => format!("waiting for the slots of job {list}, which is ending (not all its hosts have said bye)"),
                    _ => format!("waiting for the slots of jobs {list}, which are ending (not all their hosts have said bye)"),
                };
                if wr.send(FromSession::Waiting(why)).await.is_err() {
                    board.give_up(&ticket);
                    return;
                }
            }
        }
    };
    let mut ups = match admitted {
        Ok(ups) => ups,
        Err(why) => {
            let _ = wr.send(FromSession::Refused(why)).await;
            return;
        }
    };
    let (job, nodes) = (ticket.job, ticket.nodes.clone());
    info!(job, hosts = nodes.len(), id = %start.job_id, "job attached");
    let _ = wr.send(FromSession::Started).await;
    let cmd = Cmd::JobStart {
        job,
        nodes: nodes.clone(),
        start: start.clone(),
    };
    fanout.route(None, cmd).await;
    let mut done = vec![false; nodes.len()];
    let mut left = nodes.len();
    let mut client = true;
    // A detached job's hosts get as long to say bye as greedyrun would have given them; then
    // they are ended as when a client goes away.
    let mut detached_until: Option<tokio::time::Instant> = None;
    while left > 0 {
        tokio::select! {
            f = rd.next(), if client => match f {
                Some(Ok(ToSession::Route { to, cmd })) => {
                    let to = match to {
                        None => None,
                        Some(i) => match nodes.get(i as usize) {
                            Some(&n) => Some(n),
                            None => continue,
                        },
                    };
                    fanout.route(to, Cmd::ForJob { job, cmd }).await;
                }
                Some(Ok(ToSession::Kill)) => fanout.route(None, Cmd::EndJob { job }).await,
                Some(Ok(ToSession::Detach)) => {
                    debug!(job, "the job's client has its verdict: the job ends without it");
                    client = false;
                    board.ending(&ticket);
                    detached_until = Some(tokio::time::Instant::now() + SHUTDOWN_TIMEOUT);
                }
                Some(Ok(ToSession::Start(_))) => {}
                None | Some(Err(_)) => {
                    debug!(job, "the job's client went away: the job ends");
                    client = false;
                    fanout.route(None, Cmd::EndJob { job }).await;
                }
            },
            _ = tokio::time::sleep_until(detached_until.unwrap_or_else(tokio::time::Instant::now)),
                if detached_until.is_some() => {
                warn!(job, hosts = left, "a detached job's hosts did not say bye in time: ending them");
                detached_until = None;
                fanout.route(None, Cmd::EndJob { job }).await;
            }
            up = ups.recv() => {
                let Some(up) = up else { break };
                if let Up::Bye { node } | Up::Lost { node, .. } = &up
                    && let Some(d) = done.get_mut(*node as usize)
                    && !*d
                {
                    *d = true;
                    left -= 1;
                }
                if client && !relay(&mut wr, up, &ups).await {
                    debug!(job, "the job's client went away or stopped reading: the job ends");
                    client = false;
                    fanout.route(None, Cmd::EndJob { job }).await;
                }
            }
        }
    }
    board.release(&ticket);
    info!(job, "job ended");
    let _ = wr.get_mut().shutdown().await;
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
