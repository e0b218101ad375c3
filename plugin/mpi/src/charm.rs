//! Charm++ netlrts steps (`SLURM_GREEDY_PROTOCOL=charm`): the ranks' prints reach their own
//! stdout/stderr, as Slurm carries them to srun.
//!
//! A netlrts client sends its output only over the launcher protocol (charm4py puts /dev/null
//! on fds 0–2 before it connects: research/charm-protocol.md §1.1), so this node's
//! `CharmServer` hands every print to the agent, and the agent must write it where the task's
//! own output goes: slurmstepd's pipe for that task (so `srun -l` labels it), or the file of
//! `--output`. Flow:
//! 1. prefork makes one datagram socketpair ([`stdio_channel`]); the task hook, in the forked
//!    task after slurmstepd put the task's stdio on fds 0–2 (mgr.c `prepare_stdio` runs
//!    before `exec_task`), sends its rank with fds 0, 1 and 2 attached ([`send_stdio`]: one
//!    `sendmsg`, async-signal-safe, no allocation).
//! 2. a receiver thread files each task's three descriptors by rank.
//! 3. a writer thread writes each [`Output`] to its rank's descriptor, blocking (a slow srun
//!    slows the client through the bounded channel, as a full pipe would), and closes the
//!    rank's descriptors at the end marker of its output or [`CLOSE_GRACE`] after the task
//!    ended, whichever is first: slurmstepd waits for EOF on a task's pipe before the step can
//!    end, so no descriptor may outlive its task by much.
//! 4. a stdin thread answers the clients' `scanf` from the rank's own stdin (what srun sends
//!    it; charm4py's fd 0 is /dev/null), whole lines at a time
//!    ([`greedy_pmix::charm::scanf_take`]).
//!
//! Turned down: opening `/proc/PID/fd/1` from the agent (racy with the exec, and wrong for a
//! task whose stdout is a file opened with `O_APPEND`-less offsets); letting each client print
//! itself (charm4py closed its stdio before connecting).

use bytes::Bytes;
use greedy_pmix::charm::server::Output;
use greedy_pmix::charm::server::ScanfRequest;
use greedy_pmix::node::NodeService;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::warn;

/// How long after a task's end its descriptors stay open when the end marker of its output did
/// not come first (it crashed, or never connected): the server still reads what the client
/// sent just before it died, and an abort names the rank on its stderr.
pub const CLOSE_GRACE: Duration = Duration::from_millis(500);

/// How long the writer waits for a rank's descriptors when output arrives before the receiver
/// thread filed them (the task hook sent them before exec, so only a scheduling delay).
const FDS_WAIT: Duration = Duration::from_secs(2);

/// Capacity of the writer's queue: the same order as the server's output channel.
const EVENT_CAPACITY: usize = 256;

/// What the writer thread does, in arrival order.
#[derive(Debug)]
enum Event {
    /// Write (or, for the end marker, close).
    Out(Output),
    /// Close a rank's descriptors (its task ended [`CLOSE_GRACE`] ago).
    Close(u32),
    /// Close every rank's descriptors, and those still to come (the job is aborted).
    CloseAll,
    /// Put a note of ours on that rank's stderr (the job was aborted there).
    Note(u32, String),
}

/// One task's standard streams, as its task hook sent them.
struct TaskStdio {
    stdin: File,
    stdout: File,
    stderr: File,
}

/// Each local rank's streams; shared, so no write or read blocks under the lock.
#[derive(Default)]
struct Filed {
    fds: Mutex<HashMap<u32, Arc<TaskStdio>>>,
    arrived: Condvar,
    /// Ranks whose streams were closed: streams arriving after that are dropped at once
    /// (locked after `fds`).
    closed: Mutex<HashSet<u32>>,
    /// Every rank's streams were closed (the job was aborted; locked after `fds`).
    all_closed: Mutex<bool>,
    /// The node service, for the `ending` codes (set once it runs).
    server: OnceLock<NodeService>,
    /// Told (rank, code) when a rank ended with a non-zero `ending` code, which its process
    /// cannot exit with (it exits 1): the agent reports the code to srun.
    on_code: OnceLock<Box<EndedFn>>,
}

/// What the writer calls for a rank that ended with a non-zero code.
pub type EndedFn = dyn Fn(u32, i32) + Send + Sync;

/// The agent's handle on the writer: cheap to clone.
#[derive(Clone)]
pub struct Stdio {
    events: mpsc::Sender<Event>,
    filed: Arc<Filed>,
}

impl std::fmt::Debug for Stdio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stdio")
    }
}

/// The prefork side of the task hook's channel: the socket the tasks send on (kept in the
/// task table) and the one the receiver thread reads.
pub fn stdio_channel() -> std::io::Result<(UnixDatagram, UnixDatagram)> {
    UnixDatagram::pair()
}

/// The task hook: sends `rank` with the task's stdin, stdout and stderr attached.
/// Async-signal-safe (one `sendmsg`, buffers on the stack), as code between fork and exec in a
/// threaded slurmstepd must be.
pub fn send_stdio(
    sock: &UnixDatagram,
    rank: u32,
    [stdin, stdout, stderr]: [BorrowedFd<'_>; 3],
) -> std::io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
    let fds = [stdin, stdout, stderr];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(std::io::Error::other("control buffer too small"));
    }
    let bytes = rank.to_le_bytes();
    let sent = sendmsg(
        sock,
        &[IoSlice::new(&bytes)],
        &mut control,
        SendFlags::empty(),
    )?;
    if sent != bytes.len() {
        return Err(std::io::Error::other("short send of the rank"));
    }
    Ok(())
}

/// Receives one task's record: its rank and its three descriptors.
fn recv_stdio(sock: &UnixDatagram) -> std::io::Result<(u32, TaskStdio)> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, recvmsg};
    let mut bytes = [0u8; 4];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = recvmsg(
        sock,
        &mut [IoSliceMut::new(&mut bytes)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = msg {
            fds.extend(received);
        }
    }
    // A longer datagram, or more descriptors than fit, arrives cut: refuse it rather than
    // read a prefix.
    let cut = got
        .flags
        .intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC);
    let rank = decode_stdio_record(&bytes[..got.bytes.min(bytes.len())], cut, fds.len())
        .map_err(std::io::Error::other)?;
    let mut files = fds.into_iter().map(File::from);
    let (Some(stdin), Some(stdout), Some(stderr)) = (files.next(), files.next(), files.next())
    else {
        unreachable!("three descriptors checked above");
    };
    let task = TaskStdio {
        stdin,
        stdout,
        stderr,
    };
    Ok((rank, task))
}

/// Reads a task hook's stdio record as it arrived: its bytes (the rank, 4 bytes little-endian,
/// as [`send_stdio`] sends it), whether the datagram or its descriptors were cut, and how many
/// descriptors came with it (3). Gives the rank.
pub fn decode_stdio_record(bytes: &[u8], cut: bool, fds: usize) -> Result<u32, String> {
    match <[u8; 4]>::try_from(bytes) {
        Ok(rank) if !cut && fds == 3 => Ok(u32::from_le_bytes(rank)),
        _ => Err(format!(
            "malformed stdio record ({} bytes{}, {fds} descriptors)",
            bytes.len(),
            if cut { ", cut" } else { "" }
        )),
    }
}

impl Stdio {
    /// Starts the receiver thread (reads `n_local` records from `sock`), the writer thread,
    /// a runtime task that moves `output` into the writer's queue, and the stdin thread that
    /// answers `scanf`. `node` names this host in log lines.
    pub fn start(
        rt: &tokio::runtime::Handle,
        sock: UnixDatagram,
        n_local: usize,
        mut output: mpsc::Receiver<Output>,
        mut scanf: mpsc::Receiver<ScanfRequest>,
        node: &str,
    ) -> std::io::Result<Stdio> {
        let filed = Arc::new(Filed::default());
        let shared = filed.clone();
        let (events, mut rx) = mpsc::channel::<Event>(EVENT_CAPACITY);
        let (f, n) = (filed.clone(), node.to_string());
        std::thread::Builder::new()
            .name("greedy-charm-fds".into())
            .spawn(move || {
                for _ in 0..n_local {
                    match recv_stdio(&sock) {
                        Ok((rank, task)) => {
                            let mut fds = f.fds.lock().unwrap_or_else(|p| p.into_inner());
                            let closed = f.closed.lock().unwrap_or_else(|p| p.into_inner());
                            let all = *f.all_closed.lock().unwrap_or_else(|p| p.into_inner());
                            // A task that ended before its streams were filed: drop them.
                            if !closed.contains(&rank) && !all {
                                fds.insert(rank, Arc::new(task));
                            }
                            drop((closed, fds));
                            f.arrived.notify_all();
                        }
                        Err(e) => {
                            warn!(node = %n, "mpi/greedy: charm task stdio: {e}");
                            return;
                        }
                    }
                }
            })?;
        let (f, n) = (filed.clone(), node.to_string());
        std::thread::Builder::new()
            .name("greedy-charm-in".into())
            .spawn(move || {
                // What was read from each rank's stdin and not yet handed out.
                let mut read: HashMap<u32, String> = HashMap::new();
                while let Some(req) = scanf.blocking_recv() {
                    let text = match task_of(&f, req.rank, &n) {
                        Some(task) => {
                            let buf = read.entry(req.rank).or_default();
                            scanf_from(&task.stdin, buf, req.conversions)
                        }
                        None => None,
                    };
                    let _ = req.reply.send(text);
                }
            })?;
        let n = node.to_string();
        std::thread::Builder::new()
            .name("greedy-charm-out".into())
            .spawn(move || {
                let mut closed = HashSet::new();
                while let Some(ev) = rx.blocking_recv() {
                    write_event(&filed, &mut closed, ev, &n);
                }
            })?;
        let tx = events.clone();
        rt.spawn(async move {
            while let Some(o) = output.recv().await {
                if tx.send(Event::Out(o)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Stdio {
            events,
            filed: shared,
        })
    }

    /// Gives the writer the running node service, whose `ending` codes it reports.
    pub fn set_service(&self, server: NodeService) {
        let _ = self.filed.server.set(server);
    }

    /// What to do when a rank ends with a non-zero `ending` code (`charm.exit(3)`).
    pub fn on_nonzero_end(&self, f: Box<EndedFn>) {
        let _ = self.filed.on_code.set(f);
    }

    /// The task of `rank` ended: close its descriptors, after [`CLOSE_GRACE`] if it is a
    /// netlrts client (`charm`), whose last prints may still be on their way (if the end
    /// marker of its output did not close them already). Any other task's close at once:
    /// slurmstepd ends the step only when every task's pipes are closed.
    pub async fn exited(&self, rank: u32, charm: bool) {
        if charm {
            tokio::time::sleep(CLOSE_GRACE).await;
        }
        let _ = self.events.send(Event::Close(rank)).await;
    }

    /// The job is aborted: close every task's descriptors now and any still to come. A task
    /// killed with the step (SIGKILL to its process group) can die before its exit is
    /// recorded, and slurmstepd ends a step only once every task's pipes are closed.
    pub async fn release_all(&self) {
        let _ = self.events.send(Event::CloseAll).await;
    }

    /// The job was aborted by local `rank` with `reason`: say so on its stderr, where an srun
    /// user looks (the agent's own log is slurmd's).
    pub async fn aborted(&self, rank: u32, reason: String) {
        let note = format!("mpi/greedy: {reason}\n");
        let _ = self.events.send(Event::Note(rank, note)).await;
    }
}

/// One event of the writer thread. Write errors are logged once per rank and the rank's
/// descriptors dropped: a vanished reader (srun gone) must not stall the other ranks.
fn write_event(filed: &Filed, closed: &mut HashSet<u32>, ev: Event, node: &str) {
    let (rank, stderr, data) = match ev {
        Event::Close(rank) => {
            close(filed, closed, rank);
            return;
        }
        Event::CloseAll => {
            let mut fds = filed.fds.lock().unwrap_or_else(|p| p.into_inner());
            *filed.all_closed.lock().unwrap_or_else(|p| p.into_inner()) = true;
            closed.extend(fds.drain().map(|(rank, _)| rank));
            return;
        }
        Event::Out(o) if o.is_end() => {
            // After a clean end a client exits 0 (`die`) or 1 (socket closed): the real code
            // goes to srun, before the process exits.
            let code = filed.server.get().and_then(|s| s.charm_exit_code(o.rank));
            if let (Some(code), Some(f)) = (code.filter(|c| *c != 0), filed.on_code.get()) {
                f(o.rank, code);
            }
            close(filed, closed, o.rank);
            return;
        }
        Event::Out(o) => (o.rank, o.stderr, o.data),
        Event::Note(rank, note) => (rank, true, Bytes::from(note)),
    };
    if closed.contains(&rank) {
        return;
    }
    let Some(task) = task_of(filed, rank, node) else {
        closed.insert(rank);
        return;
    };
    let mut file = if stderr { &task.stderr } else { &task.stdout };
    if let Err(e) = file.write_all(&data) {
        warn!(
            node,
            rank, "mpi/greedy: charm output of rank {rank}: {e}; dropping the rest"
        );
        close(filed, closed, rank);
    }
}

/// A rank's streams, waiting up to [`FDS_WAIT`] for the receiver thread to file them.
fn task_of(filed: &Filed, rank: u32, node: &str) -> Option<Arc<TaskStdio>> {
    let fds = filed.fds.lock().unwrap_or_else(|p| p.into_inner());
    let (fds, waited) = filed
        .arrived
        .wait_timeout_while(fds, FDS_WAIT, |f| !f.contains_key(&rank))
        .unwrap_or_else(|p| p.into_inner());
    let task = fds.get(&rank).cloned();
    if task.is_none() && waited.timed_out() {
        warn!(
            node,
            rank, "mpi/greedy: rank {rank}: its task hook sent no stdio"
        );
    }
    task
}

/// Reads `stdin` into `buf` until a `scanf` of `conversions` values can be answered; `None`
/// at the end of input (or a read error) with too little read.
fn scanf_from(mut stdin: &File, buf: &mut String, conversions: usize) -> Option<String> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(text) = greedy_pmix::charm::scanf_take(buf, conversions) {
            return Some(text);
        }
        match stdin.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.push_str(&String::from_utf8_lossy(&chunk[..n])),
        }
    }
}

fn close(filed: &Filed, closed: &mut HashSet<u32>, rank: u32) {
    closed.insert(rank);
    let mut fds = filed.fds.lock().unwrap_or_else(|p| p.into_inner());
    filed
        .closed
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(rank);
    fds.remove(&rank);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::{AsFd, OwnedFd};

    /// A task's three pipes: the ends the task hook hands over (stdin's read end, the write
    /// ends of stdout and stderr), and the far ends srun's side holds.
    struct Task {
        ends: [File; 3],
        stdin: std::io::PipeWriter,
        stdout: std::io::PipeReader,
        stderr: std::io::PipeReader,
    }

    fn task() -> Task {
        let (r0, w0) = std::io::pipe().unwrap();
        let (r1, w1) = std::io::pipe().unwrap();
        let (r2, w2) = std::io::pipe().unwrap();
        Task {
            ends: [OwnedFd::from(r0), OwnedFd::from(w1), OwnedFd::from(w2)].map(File::from),
            stdin: w0,
            stdout: r1,
            stderr: r2,
        }
    }

    fn hand_over(sock: &UnixDatagram, rank: u32, t: &mut Task) {
        let [a, b, c] = &t.ends;
        send_stdio(sock, rank, [a.as_fd(), b.as_fd(), c.as_fd()]).unwrap();
        // The task's own copies close at exec/exit; only the agent's must remain.
        t.ends = [(); 3].map(|_| File::open("/dev/null").unwrap());
    }

    fn read_all(mut r: std::io::PipeReader) -> String {
        let mut s = String::new();
        r.read_to_string(&mut s).unwrap();
        s
    }

    fn out(rank: u32, stderr: bool, text: &str) -> Output {
        Output {
            rank,
            stderr,
            data: Bytes::from(text.to_string()),
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn stdio_records_of_another_size_are_refused() {
        assert_eq!(decode_stdio_record(&7u32.to_le_bytes(), false, 3), Ok(7));
        assert!(decode_stdio_record(&[7, 0, 0], false, 3).is_err());
        assert!(decode_stdio_record(&7u32.to_le_bytes(), true, 3).is_err());
        assert!(decode_stdio_record(&7u32.to_le_bytes(), false, 2).is_err());
        // An 8-byte datagram arrives cut to the 4 bytes of a rank: refused, not read as one.
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
        let (task_side, agent_side) = stdio_channel().unwrap();
        let t = task();
        let fds = [t.ends[0].as_fd(), t.ends[1].as_fd(), t.ends[2].as_fd()];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
        let long = [7u8, 0, 0, 0, 1, 2, 3, 4];
        sendmsg(
            &task_side,
            &[IoSlice::new(&long)],
            &mut control,
            SendFlags::empty(),
        )
        .unwrap();
        let e = recv_stdio(&agent_side).err().expect("refused");
        assert!(e.to_string().contains("cut"), "{e}");
    }

    /// Prints reach the rank's own descriptors, in order, through the real socket hand-over;
    /// the end marker closes them (the reader sees EOF while the agent keeps running).
    #[test]
    fn prints_reach_the_tasks_own_stdio_and_the_end_marker_closes_it() {
        let rt = runtime();
        let (task_side, agent_side) = stdio_channel().unwrap();
        let (tx, rx) = mpsc::channel(8);
        let (_scanf_tx, scanf_rx) = mpsc::channel(1);
        let stdio = Stdio::start(rt.handle(), agent_side, 2, rx, scanf_rx, "n1").unwrap();
        let (mut t3, mut t4) = (task(), task());
        hand_over(&task_side, 3, &mut t3);
        hand_over(&task_side, 4, &mut t4);
        rt.block_on(async {
            tx.send(out(3, false, "hello ")).await.unwrap();
            tx.send(out(4, true, "oops\n")).await.unwrap();
            tx.send(out(3, false, "world\n")).await.unwrap();
            tx.send(out(3, false, "")).await.unwrap();
            stdio
                .aborted(4, "rank 4 on n1 called CmiAbort".into())
                .await;
        });
        assert_eq!(read_all(t3.stdout), "hello world\n");
        assert_eq!(read_all(t3.stderr), "");
        // Rank 4 has no end marker: its task's end closes it after the grace.
        rt.block_on(stdio.exited(4, true));
        assert_eq!(read_all(t4.stdout), "");
        // The note takes a shorter path than prints still in flight: both arrive, in any order.
        let mut lines: Vec<String> = read_all(t4.stderr).lines().map(String::from).collect();
        lines.sort();
        assert_eq!(lines, ["mpi/greedy: rank 4 on n1 called CmiAbort", "oops"]);
    }

    /// `scanf` reads the rank's own stdin, keeps what it did not need for the next one, and
    /// answers `None` at its end.
    #[test]
    fn scanf_reads_the_ranks_own_stdin() {
        let rt = runtime();
        let (task_side, agent_side) = stdio_channel().unwrap();
        let (_tx, rx) = mpsc::channel(8);
        let (scanf_tx, scanf_rx) = mpsc::channel(1);
        let _stdio = Stdio::start(rt.handle(), agent_side, 1, rx, scanf_rx, "n1").unwrap();
        let mut t = task();
        hand_over(&task_side, 5, &mut t);
        let ask = |conversions| {
            let (reply, answer) = tokio::sync::oneshot::channel();
            let req = ScanfRequest {
                rank: 5,
                conversions,
                reply,
            };
            rt.block_on(async {
                scanf_tx.send(req).await.unwrap();
                answer.await.unwrap()
            })
        };
        t.stdin.write_all(b"7\n8 9\n").unwrap();
        assert_eq!(ask(1), Some("7 ".into()));
        assert_eq!(ask(2), Some("8 9 ".into()));
        t.stdin.write_all(b"10").unwrap();
        drop(t.stdin);
        assert_eq!(ask(1), None);
    }
}
