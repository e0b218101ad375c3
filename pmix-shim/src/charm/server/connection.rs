//! One netlrts client connection: its frames in, their actions carried out, the node's notices out.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    sync::mpsc,
    time::Instant,
};
use tracing::{Instrument, warn};

use super::{DIE_GRACE, NOTICE_CAPACITY, Notice, Output, ScanfRequest, Shared};
use crate::{
    charm::{
        Action, InitNode, Report, Session, WireError, decode, die_frame, scanf_conversions,
        scanf_frame,
    },
    family::Family,
};

/// What the connection does after one event.
enum Flow {
    /// Keep serving.
    Go,
    /// `die` went out: decode nothing more of what was read, wait for the client's exit.
    Dying,
    /// Close the connection.
    Close,
}

/// Serves one client connection until it is closed by either side or the server stops.
pub(super) async fn serve(shared: Arc<Shared>, stream: TcpStream) {
    let (tx, notices) = mpsc::channel(NOTICE_CAPACITY);
    let mut conn = Connection {
        shared,
        stream,
        session: Session::new(),
        tx,
        buf: BytesMut::with_capacity(4096),
        closed_early: false,
        dying: None,
    };
    conn.run(notices).await;
    conn.finish().await;
}

/// The state of one connection, with one method per event.
struct Connection {
    shared: Arc<Shared>,
    stream: TcpStream,
    session: Session,
    /// This connection's notice queue: the node's handle on it (given at `initnode`), and
    /// where a `scanf` answer comes back.
    tx: mpsc::Sender<Notice>,
    buf: BytesMut,
    /// The client went away before `ending`: abort the job unless the launcher saw it exit.
    closed_early: bool,
    /// Set once `die` went out (clean end with 0, or abort): wait for the client's own exit
    /// (EOF), discard what it still sends ("aborting:" from the die handler), close at the
    /// deadline anyway.
    dying: Option<Instant>,
}

impl Connection {
    async fn run(&mut self, mut notices: mpsc::Receiver<Notice>) {
        loop {
            let flow = tokio::select! {
                _ = self.shared.shutdown.cancelled() => Flow::Close,
                _ = tokio::time::sleep_until(self.dying.unwrap_or_else(Instant::now)), if self.dying.is_some() => Flow::Close,
                Some(notice) = notices.recv() => self.notice(notice).await,
                read = self.stream.read_buf(&mut self.buf) => self.read(read).await,
            };
            if let Flow::Close = flow {
                break;
            }
        }
    }

    /// Something from the node for this client: a reply, the job's end, an abort.
    async fn notice(&mut self, notice: Notice) -> Flow {
        match notice {
            Notice::Send(bytes) => self.send(&bytes).await,
            Notice::End => {
                let clean = self
                    .session
                    .rank()
                    .and_then(|r| self.shared.lock().endings.get(&r).copied())
                    == Some(0);
                if !clean {
                    return Flow::Close;
                }
                self.die("").await
            }
            Notice::Die(msg) => self.die(&msg).await,
        }
    }

    /// Bytes arrived (or the client closed): carry out each whole frame's actions.
    async fn read(&mut self, read: std::io::Result<usize>) -> Flow {
        match read {
            Ok(0) | Err(_) => {
                self.closed_early = !self.session.ended() && self.dying.is_none();
                return Flow::Close;
            }
            Ok(_) => {}
        }
        if self.dying.is_some() {
            self.buf.clear();
            return Flow::Go;
        }
        loop {
            let frame = match decode(&mut self.buf) {
                Ok(Some(f)) => f,
                Ok(None) => return Flow::Go,
                Err(e) => {
                    self.fail(e.to_string()).await;
                    return Flow::Close;
                }
            };
            let actions = match self.session.handle(&frame) {
                Ok(a) => a,
                Err(e) => {
                    self.fail(e.to_string()).await;
                    return Flow::Close;
                }
            };
            for action in actions {
                match self.action(action).await {
                    Flow::Go => {}
                    Flow::Dying => return Flow::Go,
                    Flow::Close => return Flow::Close,
                }
            }
        }
    }

    async fn action(&mut self, action: Action) -> Flow {
        let rank = self.session.rank();
        match action {
            Action::Init(init) => return self.init(init).await,
            Action::Output { stderr, text } => {
                // An empty print would read as the end marker; it shows nothing anyway.
                if let Some(r) = rank.filter(|_| !text.is_empty()) {
                    let out = Output {
                        rank: r,
                        stderr,
                        data: text,
                    };
                    let _ = self.shared.output.send(out).await;
                }
            }
            Action::Send(bytes) => return self.send(&bytes).await,
            Action::Scanf(fmt) => return self.scanf(rank, fmt).await,
            Action::Barrier | Action::Barrier0 => {
                if let Some(r) = rank {
                    self.shared.barrier(r, action == Action::Barrier0);
                }
            }
            Action::Ending(code) => {
                if let Some(r) = rank {
                    self.shared.ending(r, code);
                }
            }
            Action::Abort(msg) => {
                self.abort(rank, &msg).await;
                return Flow::Close;
            }
        }
        Flow::Go
    }

    /// `initnode`: admits a free local rank, or drops the client.
    async fn init(&mut self, init: InitNode) -> Flow {
        let shared = &self.shared;
        let ok = u32::try_from(init.node_no).ok().filter(|r| {
            shared.job.local_ranks().contains(r) && {
                let mut st = shared.lock();
                !st.handlers.contains_key(r) && st.handlers.insert(*r, self.tx.clone()).is_none()
            }
        });
        let Some(r) = ok else {
            // A stray or a duplicate: drop it without touching the job;
            // a rank that never shows up is named by connect_timeout.
            warn!(
                "dropping netlrts client: {}",
                WireError::UnknownNode(init.node_no)
            );
            return Flow::Close;
        };
        self.session.accept(r);
        tracing::Span::current().record("rank", r);
        shared.first_connect.notify_one();
        if let Some((culprit, reason)) = shared.departures.spoke(r, Family::Charm) {
            shared.abort(Some(culprit), 1, reason).await;
            return Flow::Close;
        }
        // Late for an aborted job (the abort's `die` went to the
        // ranks connected then): end it the same way.
        let aborted = shared.overlay.aborted().borrow().clone();
        if let Some(info) = aborted {
            return self.die(&format!("job aborted by {info}")).await;
        }
        shared.reported(Report {
            rank: r,
            dataport: init.dataport,
            mach_id: init.mach_id,
            ip: shared.config.advertise.octets(),
        });
        Flow::Go
    }

    /// `scanf`: the embedder answers from the rank's stdin, later, through this connection's queue.
    async fn scanf(&mut self, rank: Option<u32>, fmt: String) -> Flow {
        let (Some(stdin), Some(r)) = (self.shared.config.scanf.clone(), rank) else {
            // Stdin goes to the stdin rank's own fd 0 under greedyrun;
            // serving it here too would split one stream two ways.
            self.fail(format!(
                "scanf({fmt:?}) over netlrts is not supported by this launcher"
            ))
            .await;
            return Flow::Close;
        };
        // Answered later, through this connection's own queue, so the
        // connection keeps serving (an abort's `die`) while stdin waits.
        let (reply, answer) = tokio::sync::oneshot::channel();
        let req = ScanfRequest {
            rank: r,
            conversions: scanf_conversions(&fmt),
            reply,
        };
        let (s, tx) = (self.shared.clone(), self.tx.clone());
        self.shared.tracker.spawn(
            async move {
                // The embedder may block on a terminal forever: shutdown wins.
                let answered = tokio::select! {
                    _ = s.shutdown.cancelled() => return,
                    a = async { stdin.send(req).await.ok()?; answer.await.ok() } => a,
                };
                match answered {
                    Some(Some(text)) => {
                        let _ = tx.send(Notice::Send(scanf_frame(&text))).await;
                    }
                    Some(None) => {
                        let reason = format!(
                            "rank {r} on {}: scanf({fmt:?}) at the end of its standard input",
                            s.host()
                        );
                        s.abort(Some(r), 1, reason).await;
                    }
                    None => {}
                }
            }
            .in_current_span(),
        );
        Flow::Go
    }

    /// `abort` (`CmiAbort`): the message goes to the rank's stderr, and the job is aborted.
    async fn abort(&self, rank: Option<u32>, msg: &str) {
        let who = rank.map_or_else(
            || "an unidentified netlrts client".to_string(),
            |r| format!("rank {r}"),
        );
        let msg = msg.trim_end();
        // charmrun prints the message on its stderr; here it is the
        // rank's, which also reaches a Slurm user (the abort reason
        // itself only reaches the launcher and the logs).
        if let Some(r) = rank {
            let line = Bytes::from(format!("{msg}\n"));
            let out = Output {
                rank: r,
                stderr: true,
                data: line,
            };
            let _ = self.shared.output.send(out).await;
        }
        let reason = format!("{who} on {} called CmiAbort: {msg}", self.shared.host());
        self.shared.abort(rank, 1, reason).await;
    }

    async fn send(&mut self, bytes: &[u8]) -> Flow {
        if self.stream.write_all(bytes).await.is_err() {
            self.closed_early = !self.session.ended();
            return Flow::Close;
        }
        Flow::Go
    }

    /// Sends `die` with `msg` and starts the grace for the client's own exit.
    async fn die(&mut self, msg: &str) -> Flow {
        if self.stream.write_all(&die_frame(msg)).await.is_err() {
            return Flow::Close;
        }
        self.dying = Some(Instant::now() + DIE_GRACE);
        Flow::Dying
    }

    /// A malformed stream: aborts the job naming the rank, or drops an unidentified client.
    async fn fail(&self, what: String) {
        match self.session.rank() {
            Some(r) => {
                let reason = format!("rank {r} on {}: netlrts: {what}", self.shared.host());
                self.shared.abort(Some(r), 1, reason).await;
            }
            None => warn!("dropping unidentified netlrts client: {what}"),
        }
    }

    /// After the close: the end marker of the rank's output, and an abort if the rank
    /// left before `ending` and the launcher saw no exit within `early_close_grace`.
    async fn finish(mut self) {
        let _ = self.stream.shutdown().await;
        let shared = &self.shared;
        if let Some(r) = self.session.rank() {
            let end = Output {
                rank: r,
                stderr: false,
                data: Bytes::new(),
            };
            let _ = shared.output.send(end).await;
        }
        if self.closed_early
            && let Some(r) = self.session.rank()
        {
            tokio::select! {
                _ = shared.shutdown.cancelled() => return,
                _ = tokio::time::sleep(shared.config.early_close_grace) => {}
            }
            let exited = shared.lock().exited.contains_key(&r);
            if !exited {
                let reason = format!(
                    "rank {r} on {} closed its netlrts connection before ending",
                    shared.host()
                );
                shared.abort(Some(r), 1, reason).await;
            }
        }
    }
}
