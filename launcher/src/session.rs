//! Jobs on a session's running tree: `greedyrun` with `GREEDY_SESSION` set runs its job on
//! the agents a session keeps, with no new remote shell.
//!
//! Three sides, one idea:
//! - **The client** ([`attach`], [`Attached::start`]) is greedyrun as always: it plans the job
//!   on the session's free slots and runs [`crate::head`]'s loop (terminal, signals, stdin,
//!   verdict, deadlines), whose edges are the session's control connection instead of remote
//!   shells ([`JobLink`]).
//! - **The session** ([`JobBoard`], [`serve_job`]) reserves the slots, sends the job down its
//!   tree ([`Cmd::JobStart`]), routes the client's commands to the job's hosts
//!   ([`Cmd::ForJob`]) and the job's frames ([`Up::Job`]) back to the client.
//! - **Each agent** ([`JobAgents`]) starts a greedyd of its own for its part of the job and
//!   gives it the job's Start on its stdin, exactly as a remote shell would have: so wire-up,
//!   stdio, signals, exit codes and teardown are a fresh launch's, and a job that fails takes
//!   only its own greedyd with it. Closing that greedyd's stdin is losing its remote shell.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    ops::Range,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::{
    io::{AsyncRead, AsyncWriteExt},
    net::unix::OwnedWriteHalf,
    sync::{Notify, mpsc},
};
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};
use tracing::{debug, info, warn};

use crate::{
    Error,
    allocation::Allocation,
    fanout::Fanout,
    guard::GuardHandle,
    proto::{
        ClientCodec, Cmd, Down, FromSession, JobCmd, MAX_FRAME, ParentCodec, SessionCodec, Start,
        ToSession, Up,
    },
    signals,
    slots::Slots,
    terminal::escape,
};

/// How long either side of a control connection waits for the other's next step of the
/// handshake (hosts, the job, its start).
const HANDSHAKE: Duration = Duration::from_secs(10);
/// How long a job waits quietly for an ending job's slots before its client is told why.
const ENDING_PATIENCE: Duration = Duration::from_secs(2);
/// Bytes of one job's output queued towards its client: past it the client is not reading
/// (or reads far slower than its ranks write), and its job is ended as a gone client's. The
/// session's loop never waits for a client, so this bounds its memory per job.
const JOB_BACKLOG: usize = 32 << 20;

/// A job's frames on their way from the session's loop to its client ([`serve_job`]): never
/// waited on by the loop; its output bounded (32 MiB), past which output is dropped
/// and the job is marked for ending. Exits, byes and losses always pass: the job's end is
/// seen whatever its client does.
#[derive(Debug, Clone)]
pub struct JobQueue {
    tx: mpsc::UnboundedSender<Up>,
    held: Arc<std::sync::atomic::AtomicUsize>,
    over: Arc<std::sync::atomic::AtomicBool>,
}

/// The client's side of a [`JobQueue`].
#[derive(Debug)]
pub(crate) struct JobFrames {
    rx: mpsc::UnboundedReceiver<Up>,
    held: Arc<std::sync::atomic::AtomicUsize>,
    over: Arc<std::sync::atomic::AtomicBool>,
}

/// A job's queue and its receiving end.
fn job_queue() -> (JobQueue, JobFrames) {
    let (tx, rx) = mpsc::unbounded_channel();
    let held = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let over = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let frames = JobFrames {
        rx,
        held: held.clone(),
        over: over.clone(),
    };
    (JobQueue { tx, held, over }, frames)
}

/// The bytes of `up` that count against [`JOB_BACKLOG`]: its output.
fn output_len(up: &Up) -> usize {
    match up {
        Up::Output { data, .. } | Up::TaskOutput { data, .. } => data.len(),
        _ => 0,
    }
}

impl JobQueue {
    /// Queues `up` without waiting; output past the backlog is dropped and the job marked.
    pub fn push(&self, up: Up) {
        use std::sync::atomic::Ordering::Relaxed;
        let len = output_len(&up);
        if len > 0 && (self.over.load(Relaxed) || self.held.load(Relaxed) + len > JOB_BACKLOG) {
            self.over.store(true, Relaxed);
            return;
        }
        self.held.fetch_add(len, Relaxed);
        let _ = self.tx.send(up);
    }
}

impl JobFrames {
    /// The next frame; `None` once the job's entry is gone.
    ///
    /// # Cancel safety
    /// Cancel safe, as `mpsc::UnboundedReceiver::recv`.
    async fn recv(&mut self) -> Option<Up> {
        let up = self.rx.recv().await?;
        self.held
            .fetch_sub(output_len(&up), std::sync::atomic::Ordering::Relaxed);
        Some(up)
    }

    /// Whether output had to be dropped: the client does not keep up.
    fn overflowed(&self) -> bool {
        self.over.load(std::sync::atomic::Ordering::Relaxed)
    }
}

// ----- the session -----

/// A job the session runs: its hosts (session host of each job host), its client's queue,
/// and what `--status` says of it.
struct Entry {
    nodes: Vec<u32>,
    up: JobQueue,
    what: String,
    /// Its client left with the verdict ([`ToSession::Detach`]): its hosts are shutting down.
    ending: bool,
}

/// What the session knows of its hosts' slots and the jobs on them.
struct Board {
    slots: Slots,
    next: u32,
    jobs: HashMap<u32, Entry>,
    /// Jobs waiting for slots that tasks hold, first come first served, with what they need.
    queue: VecDeque<(u32, Vec<(u32, u32)>)>,
    /// Jobs that got their slots and have not picked them up yet ([`JobBoard::admitted`]).
    admitted: HashSet<u32>,
    /// Jobs that will never get their slots, and why.
    refused: HashMap<u32, String>,
}

impl Board {
    /// Lets waiting jobs in, in order, while their slots are free; refuses those that need a
    /// lost host. Whether any changed.
    fn admit_waiting(&mut self, hosts: &[String]) -> bool {
        let mut changed = false;
        while let Some((job, need)) = self.queue.front() {
            let (job, need) = (*job, need.clone());
            if let Some(&(h, _)) = need.iter().find(|(h, _)| self.slots.is_lost(*h)) {
                let host = &hosts[h as usize];
                self.refused
                    .insert(job, format!("{host}, where it waited for slots, was lost"));
            } else if self.slots.fits_now(&need) {
                self.slots.hold(&need);
                self.admitted.insert(job);
            } else {
                break;
            }
            self.queue.pop_front();
            self.slots.stop_waiting(&need);
            changed = true;
        }
        changed
    }
}

/// A job the session took: its number, the session host of each job host, the slots it
/// needs there, and whether it waits for tasks to free them.
#[derive(Debug)]
pub(crate) struct Ticket {
    job: u32,
    nodes: Vec<u32>,
    need: Vec<(u32, u32)>,
    waits: bool,
}

/// The session's slots, the jobs that hold or wait for them, and where the jobs' frames go.
/// Shared by the session's loop (hosts up and lost, tasks, frames from the tree) and each
/// job's [`serve_job`].
pub struct JobBoard {
    hosts: Vec<String>,
    inner: Mutex<Board>,
    /// Told when waiting jobs were let in or refused.
    changed: Notify,
}

impl JobBoard {
    /// A board for the session's hosts with these slots, no host up yet.
    pub fn new(hosts: Vec<String>, slots: Vec<u32>) -> Arc<JobBoard> {
        Arc::new(JobBoard {
            hosts,
            inner: Mutex::new(Board {
                slots: Slots::new(slots),
                next: 1,
                jobs: HashMap::new(),
                queue: VecDeque::new(),
                admitted: HashSet::new(),
                refused: HashMap::new(),
            }),
            changed: Notify::new(),
        })
    }

    fn board(&self) -> std::sync::MutexGuard<'_, Board> {
        // A panic elsewhere cannot leave the counts half-written: each update is one store.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the board, then lets waiting jobs in if their slots are now free.
    fn update<T>(&self, f: impl FnOnce(&mut Board) -> T) -> T {
        let (out, changed) = {
            let mut b = self.board();
            let out = f(&mut b);
            (out, b.admit_waiting(&self.hosts))
        };
        if changed {
            self.changed.notify_waiters();
        }
        out
    }

    /// `node`'s agent said hello.
    pub fn host_up(&self, node: u32) {
        self.board().slots.host_up(node);
    }

    /// Whether a task could take a slot now.
    pub fn has_free_task_slot(&self) -> bool {
        self.board().slots.has_free_for_task()
    }

    /// A slot for a task: its host, or `None`.
    pub fn take_task_slot(&self) -> Option<u32> {
        self.board().slots.take_for_task()
    }

    /// A task on `node` ended: its slot goes to a job waiting for it, else to the next task.
    pub fn task_ended(&self, node: u32) {
        self.update(|b| b.slots.task_ended(node));
    }

    /// Slots of the hosts not lost; hosts lost; whether no host is left that could run
    /// anything (every host lost, or never up while `launch_over` says none will come).
    pub fn capacity(&self, launch_over: bool) -> (u32, usize, bool) {
        let b = self.board();
        let s = &b.slots;
        (s.total(), s.lost_hosts(), s.stranded(launch_over))
    }

    /// The session lost `nodes` (a subtree): no job gets them again, and each job on them is
    /// told it lost those hosts (an `Up::Lost` in its own numbering, on its queue).
    pub async fn hosts_lost(&self, nodes: Range<u32>, what: &str) {
        let told: Vec<(JobQueue, Vec<u32>)> = self.update(|b| {
            b.slots.hosts_lost(nodes.clone());
            (b.jobs.values())
                .map(|e| {
                    let lost = (e.nodes.iter().enumerate())
                        .filter(|(_, n)| nodes.contains(n))
                        .map(|(i, _)| i as u32);
                    (e.up.clone(), lost.collect())
                })
                .collect()
        });
        for (queue, lost) in told {
            for node in lost {
                let what = format!("the session lost this host: {what}");
                queue.push(Up::Lost {
                    node,
                    by: None,
                    what,
                });
            }
        }
    }

    /// Where frames of `job` go, if it runs.
    pub fn queue_of(&self, job: u32) -> Option<JobQueue> {
        self.board().jobs.get(&job).map(|e| e.up.clone())
    }

    /// The ending jobs on `ticket`'s hosts.
    fn ending_on(&self, ticket: &Ticket) -> Vec<u32> {
        let b = self.board();
        let mut jobs: Vec<u32> = (b.jobs.iter())
            .filter(|(_, e)| e.ending && e.nodes.iter().any(|n| ticket.nodes.contains(n)))
            .map(|(&j, _)| j)
            .collect();
        jobs.sort();
        jobs
    }

    /// Whether tasks hold slots on `ticket`'s hosts.
    fn tasks_hold(&self, ticket: &Ticket) -> bool {
        self.board().slots.tasks_on(&ticket.need)
    }

    /// Jobs running, the slots they hold, and jobs waiting for slots.
    pub fn running(&self) -> (usize, u32, usize) {
        let b = self.board();
        (b.jobs.len(), b.slots.held().0, b.queue.len())
    }

    /// One line per running job, in the order they started.
    pub fn describe(&self) -> Vec<String> {
        let b = self.board();
        let mut jobs: Vec<(&u32, &Entry)> = b.jobs.iter().collect();
        jobs.sort_by_key(|(job, _)| **job);
        (jobs.into_iter())
            .map(|(_, e)| match e.ending {
                true => format!("{} (ending)", e.what),
                false => e.what.clone(),
            })
            .collect()
    }

    /// The hosts that are up and not lost, with the slots no job holds or waits for (a job
    /// may have those, waiting for the tasks in them to end).
    fn free(&self) -> Vec<(String, u32)> {
        let b = self.board();
        (0..self.hosts.len() as u32)
            .filter(|&i| b.slots.is_usable(i))
            .map(|i| (self.hosts[i as usize].clone(), b.slots.for_jobs(i)))
            .collect()
    }

    /// Takes the slots `start`'s ranks need on the session's hosts of those names, or queues
    /// the job for the slots that tasks hold; or says why it can never have them.
    pub(crate) fn reserve(&self, start: &Start) -> Result<Ticket, String> {
        let mut b = self.board();
        let mut nodes: Vec<u32> = Vec::with_capacity(start.hosts.len());
        for (host, ranks) in start.hosts.iter().zip(&start.ranks) {
            let need = ranks.len() as u32;
            let mut named = false;
            let found = (0..self.hosts.len()).find(|&i| {
                let ours = self.hosts[i] == *host && !nodes.contains(&(i as u32));
                named |= ours;
                ours && b.slots.for_jobs(i as u32) >= need
            });
            match found {
                Some(i) => nodes.push(i as u32),
                None if !named => {
                    return Err(format!(
                        "{host} is not one of the session's hosts (unset GREEDY_SESSION to launch there afresh)"
                    ));
                }
                None => {
                    return Err(format!(
                        "{host} has fewer than the {need} free slots the job needs there (jobs running on the session hold the others, or the host is lost)"
                    ));
                }
            }
        }
        let job = b.next;
        b.next += 1;
        let need: Vec<(u32, u32)> = (nodes.iter().zip(&start.ranks))
            .map(|(&n, ranks)| (n, ranks.len() as u32))
            .collect();
        let waits = !b.queue.is_empty() || !b.slots.fits_now(&need);
        if waits {
            b.slots.wait(&need);
            b.queue.push_back((job, need.clone()));
        } else {
            b.slots.hold(&need);
            b.admitted.insert(job);
        }
        Ok(Ticket {
            job,
            nodes,
            need,
            waits,
        })
    }

    /// Once `ticket`'s job has its slots: its queue of frames (it runs from now on), or why it
    /// will never have them.
    pub(crate) async fn admitted(
        &self,
        ticket: &Ticket,
        start: &Start,
    ) -> Result<JobFrames, String> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut b = self.board();
                if let Some(why) = b.refused.remove(&ticket.job) {
                    return Err(why);
                }
                if b.admitted.remove(&ticket.job) {
                    let (tx, rx) = job_queue();
                    let ranks: usize = start.ranks.iter().map(Vec::len).sum();
                    let what = format!(
                        "job {} ({}): {ranks} ranks on {}, {}",
                        ticket.job,
                        start.job_id,
                        greedy_tree::hostlist::compress(&start.hosts),
                        start.apps[0].argv.join(" ")
                    );
                    let nodes = ticket.nodes.clone();
                    b.jobs.insert(
                        ticket.job,
                        Entry {
                            nodes,
                            up: tx,
                            what,
                            ending: false,
                        },
                    );
                    return Ok(rx);
                }
            }
            changed.await;
        }
    }

    /// `ticket`'s job will not run (its client went away while it waited): what it held or
    /// waited for is free.
    pub(crate) fn give_up(&self, ticket: &Ticket) {
        self.update(|b| {
            if b.admitted.remove(&ticket.job) {
                b.slots.release(&ticket.need, false);
            } else if let Some(i) = b.queue.iter().position(|(j, _)| *j == ticket.job) {
                b.queue.remove(i);
                b.slots.stop_waiting(&ticket.need);
            }
            b.refused.remove(&ticket.job);
        });
    }

    /// `ticket`'s job is ending (every rank ended, its client left): the next job may plan on
    /// its slots, and waits for them.
    pub(crate) fn ending(&self, ticket: &Ticket) {
        self.update(|b| {
            if let Some(e) = b.jobs.get_mut(&ticket.job)
                && !e.ending
            {
                e.ending = true;
                b.slots.ending(&ticket.need);
            }
        });
    }

    /// `ticket`'s job ended: its slots are free again.
    pub(crate) fn release(&self, ticket: &Ticket) {
        self.update(|b| {
            if let Some(e) = b.jobs.remove(&ticket.job) {
                b.slots.release(&ticket.need, e.ending);
            }
        });
    }
}

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
                    detached_until = Some(tokio::time::Instant::now() + crate::head::SHUTDOWN_TIMEOUT);
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
/// frame took longer than [`crate::tasks::CLIENT_STALL`], or output was dropped for it.
async fn relay(
    wr: &mut FramedWrite<OwnedWriteHalf, SessionCodec>,
    up: Up,
    ups: &JobFrames,
) -> bool {
    if ups.overflowed() {
        return false;
    }
    let sent = tokio::time::timeout(crate::tasks::CLIENT_STALL, wr.send(FromSession::Up(up)));
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

// ----- the client -----

/// Connects to the session socket `socket` once it is sure the session is the user's own:
/// its directory is a real directory of theirs that no one else may write (mode 0700), the
/// socket is theirs, and the process behind it runs as them (`SO_PEERCRED`). A stale
/// `GREEDY_SESSION` whose path a stranger re-created gets nothing: not the job's argv, cwd,
/// environment or stdin, not a task line.
pub async fn connect_own(socket: &Path) -> Result<tokio::net::UnixStream, Error> {
    let me = check_own_path(socket)?;
    let refuse = |what: String| Err(Error::Untrusted(format!("{what}: not sending anything")));
    let conn = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| session_gone(socket, e))?;
    match conn.peer_cred().map(|c| c.uid()) {
        Ok(uid) if uid == me => Ok(conn),
        Ok(uid) => refuse(format!(
            "the server at session socket {} runs as uid {uid}, not you",
            socket.display()
        )),
        Err(e) => refuse(format!(
            "session socket {}: whose server it is cannot be told ({e})",
            socket.display()
        )),
    }
}

/// [`connect_own`]'s checks of the path: the directory, then the socket (`lstat`, so a
/// symbolic link is refused); returns the user's uid.
fn check_own_path(socket: &Path) -> Result<u32, Error> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let me = nix::unistd::geteuid().as_raw();
    let refuse = |what: String| Err(Error::Untrusted(format!("{what}: not sending anything")));
    let gone = |e| session_gone(socket, e);
    let dir = socket
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let d = std::fs::symlink_metadata(dir).map_err(gone)?;
    if !d.file_type().is_dir() {
        return refuse(format!(
            "session directory {} is not a directory (a symbolic link?)",
            dir.display()
        ));
    }
    if d.uid() != me {
        return refuse(format!(
            "session directory {} is owned by uid {}, not you",
            dir.display(),
            d.uid()
        ));
    }
    if d.mode() & 0o077 != 0 {
        return refuse(format!(
            "session directory {} has mode {:04o}, not 0700 (others could replace its socket)",
            dir.display(),
            d.mode() & 0o7777
        ));
    }
    let f = std::fs::symlink_metadata(socket).map_err(gone)?;
    if !f.file_type().is_socket() {
        return refuse(format!(
            "session socket {} is not a socket",
            socket.display()
        ));
    }
    if f.uid() != me {
        return refuse(format!(
            "session socket {} is owned by uid {}, not you",
            socket.display(),
            f.uid()
        ));
    }
    Ok(me)
}

/// The error of a session socket that is not there (any more).
fn session_gone(socket: &Path, source: std::io::Error) -> Error {
    Error::Io {
        what: format!(
            "GREEDY_SESSION={} (has the session ended?)",
            socket.display()
        ),
        source,
    }
}

/// A client's control connection to a session, with the session's free slots.
pub struct Attached {
    rd: FramedRead<tokio::net::unix::OwnedReadHalf, ClientCodec>,
    wr: FramedWrite<OwnedWriteHalf, ClientCodec>,
    /// The session's hosts that are up, with their free slots.
    hosts: Vec<(String, u32)>,
    what: String,
}

/// Connects to the session at `socket` for a job: the session's free slots, or why not.
pub async fn attach(socket: &Path) -> Result<Attached, String> {
    let conn = connect_own(socket).await.map_err(|e| e.to_string())?;
    let (rd, mut wr) = conn.into_split();
    wr.write_all(crate::tasks::job_request().as_bytes())
        .await
        .map_err(|e| format!("GREEDY_SESSION={}: {e}", socket.display()))?;
    let mut rd = FramedRead::new(rd, ClientCodec::default());
    let hosts = match tokio::time::timeout(HANDSHAKE, rd.next()).await {
        Ok(Some(Ok(FromSession::Hosts(h)))) => h,
        Ok(Some(Ok(FromSession::Refused(why)))) => return Err(escape(&why).into_owned()),
        Err(_) => {
            return Err(format!(
                "the session did not answer within {} s (is it busy with a task stream?)",
                HANDSHAKE.as_secs()
            ));
        }
        _ => return Err("the session sent no hosts".into()),
    };
    Ok(Attached {
        rd,
        wr: FramedWrite::new(wr, ClientCodec::default()),
        hosts,
        what: format!("the session GREEDY_SESSION={}", socket.display()),
    })
}

impl Attached {
    /// The session's free slots as an allocation, for the plan.
    pub fn allocation(&self) -> Allocation {
        let hostfile = self
            .hosts
            .iter()
            .filter(|(_, free)| *free > 0)
            .map(|(h, free)| format!("{h} slots={free}\n"))
            .collect();
        Allocation {
            what: self.what.clone(),
            hostfile,
        }
    }

    /// Hands the session the job; once it took it, the link for greedyrun's loop and the
    /// job's frames. A job the session refused is an error saying why.
    pub(crate) async fn start(
        mut self,
        start: &Start,
    ) -> Result<(JobLink, mpsc::Receiver<Up>), String> {
        let gone = |e: crate::Error| format!("the session went away: {e}");
        self.wr
            .send(ToSession::Start(Box::new(start.clone())))
            .await
            .map_err(gone)?;
        // A job that waits for slots waits as long as the tasks in them run.
        let mut patience = Some(HANDSHAKE);
        loop {
            let next = match patience {
                Some(p) => tokio::time::timeout(p, self.rd.next()).await,
                None => Ok(self.rd.next().await),
            };
            match next {
                Ok(Some(Ok(FromSession::Started))) => break,
                Ok(Some(Ok(FromSession::Waiting(why)))) => {
                    if !why.is_empty() {
                        eprintln!("greedyrun: {}", escape(&why));
                    }
                    patience = None;
                }
                Ok(Some(Ok(FromSession::Refused(why)))) => {
                    return Err(format!("the session cannot run the job: {}", escape(&why)));
                }
                Ok(Some(Err(e))) => return Err(gone(e)),
                _ => return Err("the session did not take the job".into()),
            }
        }
        let (up_tx, up_rx) = mpsc::channel(crate::head::UP_CAPACITY);
        let (tx, mut rx) = mpsc::unbounded_channel::<ToSession>();
        let mut wr = self.wr;
        let writer = tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                let last = matches!(m, ToSession::Detach);
                if wr.send(m).await.is_err() || last {
                    break;
                }
            }
        });
        let mut rd = self.rd;
        let n = start.hosts.len();
        tokio::spawn(async move {
            let mut done = vec![false; n];
            while let Some(Ok(FromSession::Up(up))) = rd.next().await {
                if let Up::Bye { node } | Up::Lost { node, .. } = &up
                    && let Some(d) = done.get_mut(*node as usize)
                {
                    *d = true;
                }
                if up_tx.send(up).await.is_err() {
                    return;
                }
            }
            // The session ended under the job: its hosts are lost to it.
            for node in (0..n as u32).filter(|&i| !done[i as usize]) {
                let what = "the session ended".to_string();
                let lost = Up::Lost {
                    node,
                    by: None,
                    what,
                };
                if up_tx.send(lost).await.is_err() {
                    return;
                }
            }
        });
        let writer = Mutex::new(Some(writer));
        Ok((JobLink { tx, writer }, up_rx))
    }
}

/// greedyrun's edges when its job runs on a session: the control connection.
#[derive(Debug)]
pub(crate) struct JobLink {
    tx: mpsc::UnboundedSender<ToSession>,
    /// Writes `tx`'s messages to the session.
    writer: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl JobLink {
    /// Sends `cmd` to the job's host `to` (every host when `None`).
    pub(crate) fn route(&self, to: Option<u32>, cmd: Cmd) {
        match JobCmd::of(cmd) {
            Some(cmd) => {
                let _ = self.tx.send(ToSession::Route { to, cmd });
            }
            None => warn!("not a command for a session's job: dropped"),
        }
    }

    /// Ends the job at once, as killing its remote shells would.
    pub(crate) fn kill_all(&self) {
        let _ = self.tx.send(ToSession::Kill);
    }

    /// Leaves the job to the session (after every rank ended and the shutdown was sent): returns
    /// once the session has been told, at most [`HANDSHAKE`] later.
    pub(crate) async fn detach(&self) {
        let _ = self.tx.send(ToSession::Detach);
        let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = writer {
            let _ = tokio::time::timeout(HANDSHAKE, w).await;
        }
    }
}

// ----- each agent -----

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
        let lost = move |what: String| Up::Lost {
            node: i,
            by: None,
            what,
        };
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
                let frame = encode(&lost(format!("cannot start greedyd for the job: {e}")));
                let _ = self.up.send(Up::Job { job, frame }).await;
                return;
            }
        };
        let pgid = child.id().unwrap_or(0);
        self.groups.adopt(pgid);
        if let Some(g) = guard.as_mut() {
            g.watch(pgid).await;
        }
        let (down_tx, mut down_rx) = mpsc::unbounded_channel::<Down>();
        let _ = down_tx.send(Down::Start(Box::new(start)));
        let mut stdin =
            FramedWrite::new(child.stdin.take().expect("piped"), ParentCodec::default());
        // Its bye closes its stdin (it waits for that before it exits, as after a remote
        // shell's parent read its bye).
        let (bye_tx, mut bye_rx) = tokio::sync::oneshot::channel::<()>();
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
                let frame = encode(&lost(format!("its greedyd for the job ended ({how})")));
                let _ = up.send(Up::Job { job, frame }).await;
            }
            let _ = ended.send(job).await;
        });
        self.jobs.insert(
            job,
            JobAgent {
                down: Some(down_tx),
                pgid,
            },
        );
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

/// An [`Up`] as its codec's body: what a job's greedyd would have written.
fn encode(up: &Up) -> Bytes {
    postcard::to_stdvec(up).map(Bytes::from).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{App, BindTo, PROTOCOL_VERSION, PmiMode};

    /// A job of `ranks[i]` ranks on `hosts[i]`.
    fn job(hosts: &[&str], ranks: &[u32]) -> Start {
        let mut next = 0;
        let ranks = ranks
            .iter()
            .map(|&k| {
                next += k;
                (next - k..next).collect()
            })
            .collect();
        Start {
            version: PROTOCOL_VERSION,
            job_id: "j".into(),
            node_idx: 0,
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            ranks,
            launch_sizes: vec![1],
            apps: vec![App {
                first_rank: 0,
                argv: vec!["true".into()],
            }],
            env: vec![],
            cwd: "/".into(),
            rsh: vec![],
            agent: vec![],
            batch: 1,
            retries: 0,
            hello_timeout_s: 1.0,
            grace_s: 1.0,
            model: greedy_tree::LaunchModel::new(0.01, 0.1).unwrap(),
            pmi: PmiMode::Auto,
            secret: greedy_pmix::JobSecret::generate(),
            stdin_rank: None,
            bind: BindTo::None,
            log: String::new(),
            tasks: false,
            unbuffered: false,
        }
    }

    /// The job's queue once the board let it in.
    #[test]
    fn a_jobs_queue_drops_output_past_its_backlog_but_never_its_end() {
        let (q, mut frames) = job_queue();
        let chunk = Bytes::from(vec![b'x'; 1 << 20]);
        let output = |data: &Bytes| Up::Output {
            rank: 0,
            stream: crate::proto::Stream::Stdout,
            data: data.clone(),
        };
        for _ in 0..(JOB_BACKLOG >> 20) + 3 {
            q.push(output(&chunk));
        }
        q.push(Up::Bye { node: 0 });
        assert!(frames.overflowed());
        let mut n = 0;
        while let Ok(up) = frames.rx.try_recv() {
            n += 1;
            frames
                .held
                .fetch_sub(output_len(&up), std::sync::atomic::Ordering::Relaxed);
            if n == (JOB_BACKLOG >> 20) + 1 {
                assert_eq!(up, Up::Bye { node: 0 });
            }
        }
        assert_eq!(n, (JOB_BACKLOG >> 20) + 1);
    }

    fn queue(board: &JobBoard, t: &Ticket, start: &Start) -> JobFrames {
        futures_util::FutureExt::now_or_never(board.admitted(t, start))
            .expect("admitted at once")
            .unwrap()
    }

    #[test]
    fn jobs_hold_disjoint_slots_until_released() {
        let board = JobBoard::new(vec!["a".into(), "b".into(), "c".into()], vec![2, 2, 2]);
        assert!(board.free().is_empty(), "no host up yet");
        (0..3).for_each(|i| board.host_up(i));
        let first = job(&["a", "b"], &[2, 2]);
        let t1 = board.reserve(&first).unwrap();
        assert!(!t1.waits);
        assert_eq!(t1.nodes, [0, 1]);
        let _q1 = queue(&board, &t1, &first);
        assert_eq!(board.running(), (1, 4, 0));
        assert_eq!(
            board.free(),
            [("a".into(), 0), ("b".into(), 0), ("c".into(), 2)]
        );
        let e = board.reserve(&job(&["a"], &[1])).unwrap_err();
        assert!(e.contains("a has fewer than the 1 free slots"), "{e}");
        let e = board.reserve(&job(&["z"], &[1])).unwrap_err();
        assert!(e.contains("z is not one of the session's hosts"), "{e}");
        let second = job(&["c"], &[2]);
        let t2 = board.reserve(&second).unwrap();
        let _q2 = queue(&board, &t2, &second);
        assert_eq!(
            board.describe(),
            [
                format!("job {} (j): 4 ranks on a,b, true", t1.job),
                format!("job {} (j): 2 ranks on c, true", t2.job)
            ]
        );
        assert_eq!(t2.nodes, [2]);
        assert_ne!(t1.job, t2.job);
        board.release(&t1);
        assert_eq!(board.running(), (1, 2, 0));
        assert!(board.queue_of(t1.job).is_none());
    }

    #[tokio::test]
    async fn the_next_job_waits_quietly_for_an_ending_jobs_slots() {
        let board = JobBoard::new(vec!["a".into()], vec![2]);
        board.host_up(0);
        let first = job(&["a"], &[2]);
        let t1 = board.reserve(&first).unwrap();
        let _q1 = queue(&board, &t1, &first);
        board.ending(&t1);
        assert_eq!(board.free(), [("a".into(), 2)], "planned on as if free");
        assert_eq!(
            board.describe(),
            [format!("job {} (j): 2 ranks on a, true (ending)", t1.job)]
        );
        let t2 = board.reserve(&first).unwrap();
        assert!(t2.waits && !board.tasks_hold(&t2), "waits, for no task");
        assert_eq!(board.ending_on(&t2), [t1.job]);
        let waiter = {
            let (board, start) = (board.clone(), first.clone());
            tokio::spawn(async move { board.admitted(&t2, &start).await.is_ok() })
        };
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "the ending job still holds the slots"
        );
        board.release(&t1);
        assert!(waiter.await.unwrap());
        assert_eq!(board.running(), (1, 2, 0));
    }

    #[tokio::test]
    async fn a_job_waits_for_the_slots_of_tasks_which_take_none_of_them_meanwhile() {
        let board = JobBoard::new(vec!["a".into(), "b".into()], vec![2, 1]);
        (0..2).for_each(|i| board.host_up(i));
        let on: Vec<u32> = (0..3).map(|_| board.take_task_slot().unwrap()).collect();
        assert_eq!(on, [0, 0, 1], "a task stream fills every slot");
        // A job asks for a's two slots: the tasks hold them, so it waits.
        assert_eq!(board.free(), [("a".into(), 2), ("b".into(), 1)]);
        let start = job(&["a"], &[2]);
        let t = board.reserve(&start).unwrap();
        assert!(t.waits);
        assert_eq!(board.running(), (0, 0, 1));
        let waiter = {
            let board = board.clone();
            let start = start.clone();
            tokio::spawn(async move {
                let t = t;
                board.admitted(&t, &start).await.map(|_| t)
            })
        };
        // Slots freed on a go to the job, not to the next task; b's to the next task.
        board.task_ended(0);
        board.task_ended(1);
        assert_eq!(board.take_task_slot(), Some(1));
        assert_eq!(board.take_task_slot(), None);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "one of a's slots is still a task's");
        board.task_ended(0);
        let t = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("let in once both slots were free")
            .unwrap()
            .unwrap();
        assert_eq!(board.running(), (1, 2, 0));
        assert_eq!(board.take_task_slot(), None, "the job holds a");
        board.release(&t);
        assert_eq!(board.take_task_slot(), Some(0));
    }

    #[test]
    fn a_waiting_job_that_gives_up_or_loses_its_host_frees_what_it_waited_for() {
        let board = JobBoard::new(vec!["a".into(), "b".into()], vec![1, 1]);
        (0..2).for_each(|i| board.host_up(i));
        assert_eq!(board.take_task_slot(), Some(0));
        let start = job(&["a"], &[1]);
        let t = board.reserve(&start).unwrap();
        assert!(t.waits);
        board.give_up(&t);
        board.task_ended(0);
        assert_eq!(board.take_task_slot(), Some(1));
        assert_eq!(
            board.take_task_slot(),
            Some(0),
            "nobody waits for a any more"
        );
        let t = board.reserve(&start).unwrap();
        futures_util::FutureExt::now_or_never(board.hosts_lost(0..1, "shell ended"))
            .expect("no job to tell");
        let why = futures_util::FutureExt::now_or_never(board.admitted(&t, &start))
            .expect("answered at once")
            .unwrap_err();
        assert!(
            why.contains("a, where it waited for slots, was lost"),
            "{why}"
        );
        assert_eq!(board.running(), (0, 0, 0));
    }

    #[test]
    fn a_lost_host_is_lost_to_the_jobs_on_it_and_to_later_ones() {
        let board = JobBoard::new(vec!["a".into(), "b".into(), "c".into()], vec![1, 1, 1]);
        (0..3).for_each(|i| board.host_up(i));
        let start = job(&["b", "c"], &[1, 1]);
        let t = board.reserve(&start).unwrap();
        let mut q = queue(&board, &t, &start);
        futures_util::FutureExt::now_or_never(board.hosts_lost(2..3, "shell ended"))
            .expect("room on the job's queue");
        assert!(
            matches!(q.rx.try_recv(), Ok(Up::Lost { node: 1, by: None, what }) if what.contains("shell ended"))
        );
        assert!(
            q.rx.try_recv().is_err(),
            "the job is told once, of its one lost host"
        );
        assert_eq!(board.free(), [("a".into(), 1), ("b".into(), 0)]);
        assert!(board.reserve(&job(&["c"], &[1])).is_err());
    }
}
