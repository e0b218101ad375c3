//! The client's side of a session's job: greedyrun connects, plans on the free slots, and
//! runs its job over the control connection.

use std::{path::Path, sync::Mutex};

use futures_util::{SinkExt, StreamExt};
use tokio::{io::AsyncWriteExt, net::unix::OwnedWriteHalf, sync::mpsc};
use tokio_util::codec::{FramedRead, FramedWrite};
use tracing::warn;

use super::control::{HANDSHAKE, job_request};
use crate::{
    Error,
    allocation::Allocation,
    limits::UP_CAPACITY,
    proto::{ClientCodec, Cmd, FromSession, JobCmd, Start, ToSession, Up},
    terminal::escape,
};

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

/// Connects to the session at `socket` for a job (`claim`: in the slots a stream's task
/// took for it): the session's free slots, or why not.
pub async fn attach(socket: &Path, claim: Option<u64>) -> Result<Attached, String> {
    let conn = connect_own(socket).await.map_err(|e| e.to_string())?;
    let (rd, mut wr) = conn.into_split();
    wr.write_all(job_request(claim).as_bytes())
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
        let (up_tx, up_rx) = mpsc::channel(UP_CAPACITY);
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
        let (placed_tx, placed_rx) = mpsc::channel(16);
        let n = start.hosts.len();
        tokio::spawn(relay_from_session(self.rd, up_tx, placed_tx, n));
        let writer = Mutex::new(Some(writer));
        let placed = Mutex::new(Some(placed_rx));
        Ok((JobLink { tx, writer, placed }, up_rx))
    }
}

/// greedyrun's edges when its job runs on a session: the control connection.
#[derive(Debug)]
pub(crate) struct JobLink {
    tx: mpsc::UnboundedSender<ToSession>,
    /// Writes `tx`'s messages to the session.
    writer: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The session's placements of spawned children, until greedyrun's loop takes them.
    placed: Mutex<Option<mpsc::Receiver<Placement>>>,
}

/// A spawned child's placement by the session: its number, and its ranks on each of the
/// job's hosts or why not.
pub(crate) type Placement = (u32, Result<Vec<Vec<u32>>, String>);

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

    /// Asks the session to place spawned child `child` ([`ToSession::Place`]).
    pub(crate) fn place(&self, child: u32, apps: Vec<greedy_pmix::child::SpawnApp>, over: bool) {
        let place = ToSession::Place {
            child,
            apps,
            oversubscribe: over,
        };
        let _ = self.tx.send(place);
    }

    /// The session's placements, once.
    pub(crate) fn placements(&self) -> Option<mpsc::Receiver<Placement>> {
        self.placed.lock().unwrap_or_else(|e| e.into_inner()).take()
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

/// Passes the session's frames of a job of `n` hosts on: its frames to `up_tx`, the placements
/// of its spawned children to `placed_tx`; when the session ends under the job, its hosts not
/// done are lost.
async fn relay_from_session<R: tokio::io::AsyncRead + Unpin>(
    mut rd: FramedRead<R, ClientCodec>,
    up_tx: mpsc::Sender<Up>,
    placed_tx: mpsc::Sender<Placement>,
    n: usize,
) {
    let mut done = vec![false; n];
    loop {
        let up = match rd.next().await {
            Some(Ok(FromSession::Up(up))) => up,
            Some(Ok(FromSession::Placed { child, result })) => {
                let _ = placed_tx.send((child, result)).await;
                continue;
            }
            _ => break,
        };
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
}
