//! The session daemon (`greedyrun --start-session`): its own loop over the task streams its
//! clients submit, the jobs they attach ([`super::serve`]), and their control connections,
//! until `--end-session`, a signal, or no client for its idle time.

use std::{path::Path, time::Duration};

use tokio::{
    io::{AsyncBufReadExt, BufReader},
    net::{UnixListener, UnixStream, unix::OwnedWriteHalf},
    sync::mpsc,
};
use tokio_util::task::TaskTracker;

use super::{
    control::{CLIENT_STALL, LineSource, Request, frame, read_request},
    serve::{JobDesk, serve_job},
    streams::{Feed, Read, Streams},
};
use crate::{
    proto::{Cmd, Up},
    status::code,
};

/// Prints one of the session's diagnostic lines.
fn log(line: String) {
    eprintln!("greedyrun: {line}");
}

/// A client's request as [`read_client`] hands it to the session's loop, with the rest of its
/// input and its output.
type ClientRequest = (
    Option<Request>,
    LineSource,
    tokio::net::unix::OwnedWriteHalf,
);

/// Reads a client's request; a job is served here, beside the loop (several jobs run at once
/// on disjoint slots), anything else goes to the loop through `to_loop`.
async fn read_client(conn: UnixStream, desk: JobDesk, to_loop: mpsc::Sender<ClientRequest>) {
    let (rd, out) = conn.into_split();
    let boxed: Box<dyn tokio::io::AsyncRead + Unpin + Send> = Box::new(rd);
    let mut lines = BufReader::new(boxed).lines();
    let request = read_request(&mut lines).await;
    if let Some(Request::Job { claim }) = request {
        serve_job(lines.into_inner(), out, desk, claim).await;
        return;
    }
    let _ = to_loop.send((request, lines, out)).await;
}
/// The session's state beside its streams: who may connect, and its clients' writers.
struct Daemon<'a> {
    streams: Streams<'a>,
    own_uid: u32,
    /// Each client's writer: the session waits for their last frames (bounded) before it exits.
    writers: TaskTracker,
    /// Requests wait here while the loop is busy; clients are few (one per greedyrun).
    requests: mpsc::Sender<ClientRequest>,
}

/// Runs the session's `streams` on its tree, taking clients on `listener` (bound to `socket`,
/// removed at the end), until it ends; its exit code and when each host said hello. Also
/// greedyrun's own stream's loop when its tasks of several ranks or of MPI attach their jobs
/// on a socket of its own.
pub(crate) async fn run(
    streams: Streams<'_>,
    listener: &UnixListener,
    socket: &Path,
    mut lines: mpsc::Receiver<Read>,
    mut ups: mpsc::Receiver<Up>,
) -> (i32, Vec<Option<Duration>>) {
    let mut stops = crate::signals::Stops::new();
    let (requests, mut request_rx) = mpsc::channel::<ClientRequest>(16);
    let mut d = Daemon {
        streams,
        own_uid: nix::unistd::geteuid().as_raw(),
        writers: TaskTracker::new(),
        requests,
    };
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        let want_line = d.streams.step().await;
        let ending = d.streams.ending;
        tokio::select! {
            Some((stream, line)) = lines.recv(), if want_line => d.streams.on_line(stream, line).await,
            m = ups.recv() => match m {
                None => break,
                Some(up) => d.streams.on_up(up).await,
            },
            accepted = listener.accept(), if !ending => {
                if let Ok((conn, _)) = accepted {
                    d.accepted(conn);
                }
            }
            Some((request, lines, out)) = request_rx.recv(), if !ending => d.on_request(request, lines, out).await,
            sig = stops.recv() => if d.streams.on_signal(sig).await {
                break;
            },
            _ = tick.tick() => d.streams.on_tick().await,
        }
    }
    let ended = d.streams.finish().await;
    let _ = std::fs::remove_file(socket);
    d.writers.close();
    let _ = tokio::time::timeout(CLIENT_STALL, d.writers.wait()).await;
    ended
}

impl Daemon<'_> {
    /// A control connection: its request is read beside the loop, so a client that says
    /// nothing holds no one.
    fn accepted(&self, conn: UnixStream) {
        // The socket's directory is the owner's alone (0700); the peer's uid, from the
        // kernel, is checked anyway.
        let uid = conn.peer_cred().map(|c| c.uid());
        let own_uid = self.own_uid;
        if uid.as_ref().ok() != Some(&own_uid) {
            log(format!(
                "refused a control connection from uid {uid:?}: the session is uid {own_uid}'s"
            ));
            return;
        }
        let desk = JobDesk {
            board: self.streams.board.clone(),
            fanout: self.streams.fanout.clone(),
            stager: self.streams.stager.clone(),
        };
        tokio::spawn(read_client(conn, desk, self.requests.clone()));
    }

    /// A client's request other than a job's.
    async fn on_request(
        &mut self,
        request: Option<Request>,
        lines: LineSource,
        out: OwnedWriteHalf,
    ) {
        // greedyrun's own stream takes only its job tasks' jobs on its socket.
        if !self.streams.session() {
            log(
                "a control connection asked greedyrun's own stream for more than a job: closed"
                    .into(),
            );
            return;
        }
        let feed = Feed::client(out, &self.writers);
        match request {
            // Streams share the slots with each other and with jobs (crate::slots).
            Some(Request::Tasks {
                retries,
                tag,
                progress_ms,
                defaults,
            }) => {
                let progress = Duration::from_millis(progress_ms);
                (self.streams)
                    .open(feed, lines, retries, defaults, tag, progress)
                    .await;
            }
            Some(Request::Status) => self.status(feed).await,
            Some(Request::End) => self.end(feed).await,
            Some(Request::Job { .. }) => {}
            None => log("a control connection said nothing greedyrun understands: closed".into()),
        }
    }

    /// Tells the client how the session is: counts as a result line, then in words.
    async fn status(&self, mut feed: Feed) {
        let s = &self.streams;
        let (jobs, busy, waiting) = s.board.running();
        let (slots, lost) = s.board.capacity();
        let n = s.plan.hosts.len();
        let up = s.hello_at.iter().filter(|h| h.is_some()).count();
        let n_streams = s.streams.len();
        let plural = if n_streams == 1 { "" } else { "s" };
        let text = format!(
            "session of {n} hosts ({up} up, {lost} lost), {slots} slots, {} tasks running, {jobs} jobs running on {busy} slots, {waiting} jobs waiting for slots, {n_streams} task stream{plural}, up {:.0} s, idle {:.0} s",
            s.dispatch.running(),
            s.t0.elapsed().as_secs_f64(),
            s.idle_since.elapsed().as_secs_f64(),
        );
        let counts = serde_json::json!({
            "hosts": n, "up": up, "lost": lost,
            "slots": slots, "running": s.dispatch.running(), "streams": n_streams,
            "jobs": jobs, "job_slots": busy, "jobs_waiting": waiting,
        });
        feed.send(frame::RESULT, counts.to_string().as_bytes())
            .await;
        feed.send(frame::SAY, text.as_bytes()).await;
        for line in s.board.describe() {
            feed.send(frame::SAY, line.as_bytes()).await;
        }
        feed.finish(0).await;
    }

    /// `--end-session`: the streams end with the session; what runs is ended, what is not
    /// read is not run.
    async fn end(&mut self, feed: Feed) {
        feed.finish(0).await;
        let s = &mut self.streams;
        s.ending = true;
        for (&stream, cur) in s.streams.iter_mut() {
            let text = format!(
                "the session is being ended (--end-session): {} running tasks are ended, the stream is not read past line {}",
                s.dispatch.running_of(stream),
                cur.line_no
            );
            cur.feed.say(text).await;
            cur.exit_code = code::LAUNCHER;
            cur.cancel(stream, &mut s.dispatch);
        }
        if s.streams.is_empty() {
            s.end_run(Cmd::Shutdown).await;
        } else {
            s.end_run(Cmd::Teardown).await;
        }
    }
}
