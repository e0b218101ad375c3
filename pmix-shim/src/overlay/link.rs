//! The overlay's links: the accept loop, both sides of the authenticated handshake, and the
//! reader and writer tasks that carry an established link's frames to and from the engine.

use std::{net::SocketAddr, time::Duration};

use futures_util::{SinkExt, StreamExt};
use tokio::{
    net::{
        TcpListener, TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::mpsc,
};
use tokio_util::{
    codec::{FramedRead, FramedWrite},
    sync::CancellationToken,
};
use tracing::{Instrument, debug, info_span, warn};

use super::{Event, LINK_CAPACITY, Shared};
use crate::{
    Error, auth,
    frame::{FrameCodec, FrameError, HANDSHAKE_MAX_BODY, Link, Message},
    listener,
};

pub(super) async fn accept_loop(shared: Shared, listener: TcpListener) {
    let gate = auth::Gate::new(shared.config.admission);
    let (shutdown, tracker) = (&shared.shutdown, &shared.tracker);
    listener::accept_gated(
        listener,
        gate,
        shutdown,
        tracker,
        "overlay",
        |stream, addr, slot| {
            let shared = shared.clone();
            async move {
                // Debug, not warn: anyone on the network can connect, and a stranger's probe
                // must not write into the job's stderr (srun prints slurmstepd's warnings). A
                // real peer that fails the proof is named by the join timeout instead.
                if let Err(reason) = serve_link(&shared, stream, addr, slot).await {
                    debug!(%addr, "refused overlay connection: {reason}");
                }
            }
            .in_current_span()
        },
    )
    .await
}

type Reader = FramedRead<OwnedReadHalf, FrameCodec>;
type Writer = FramedWrite<OwnedWriteHalf, FrameCodec>;

/// Frames a fresh connection with the handshake's small frame limit; [`run_link`] raises it.
fn framed(stream: TcpStream) -> (Reader, Writer) {
    let _ = stream.set_nodelay(true);
    let codec = FrameCodec {
        max_body: HANDSHAKE_MAX_BODY,
    };
    let (r, w) = stream.into_split();
    (FramedRead::new(r, codec), FramedWrite::new(w, codec))
}

/// Why a handshake frame did not come.
enum Missing {
    /// The peer closed or reset the connection, or did not answer in time: what an overloaded
    /// peer that gave up on us looks like, so the dialing side may try again.
    Dropped(String),
    /// The peer sent something that is not the frame expected.
    Bad(String),
}

impl From<Missing> for String {
    fn from(m: Missing) -> String {
        match m {
            Missing::Dropped(r) | Missing::Bad(r) => r,
        }
    }
}

/// The next handshake frame, within `wait`: what is left of `hello_timeout` where a stranger may
/// be on the other end (the accepting side), else up to the join's deadline ([`handshake_wait`]).
async fn next_frame(
    reader: &mut Reader,
    expecting: &str,
    wait: Duration,
) -> Result<Message, Missing> {
    match tokio::time::timeout(wait, reader.next()).await {
        Err(_) => Err(Missing::Dropped(format!("no {expecting} within {wait:?}"))),
        Ok(None) => Err(Missing::Dropped(format!("closed before {expecting}"))),
        Ok(Some(Err(FrameError::Io(e)))) => Err(Missing::Dropped(e.to_string())),
        Ok(Some(Err(e))) => Err(Missing::Bad(e.to_string())),
        Ok(Some(Ok(m))) => Ok(m),
    }
}

/// Server side of a link: challenge, check the proof (within `hello_timeout` of the accept,
/// holding `slot` until then), welcome, then run the link.
async fn serve_link(
    shared: &Shared,
    stream: TcpStream,
    addr: SocketAddr,
    slot: auth::Unproven,
) -> Result<(), String> {
    let job = &shared.job;
    let me = job.node_idx;
    let (mut reader, mut writer) = framed(stream);
    let server_nonce = auth::nonce();
    let until = tokio::time::Instant::now() + shared.config.hello_timeout;
    let send = writer.send(Message::Challenge {
        nonce: server_nonce,
    });
    tokio::time::timeout_at(until, send)
        .await
        .map_err(|_| "challenge not sent within hello_timeout".to_string())?
        .map_err(|e| e.to_string())?;
    let left = until.saturating_duration_since(tokio::time::Instant::now());
    let hello = next_frame(&mut reader, "hello", left).await?;
    let auth::Accepted { peer, link, proof } =
        auth::accept_hello(job, |n| shared.topo.parent(n), &server_nonce, &hello)?;
    slot.proven();
    writer
        .send(Message::Welcome {
            node_idx: me as u32,
            mac: proof,
        })
        .await
        .map_err(|e| e.to_string())?;
    debug!(peer, %addr, ?link, "accepted link");
    run_link(shared.clone(), peer, reader, writer).await;
    Ok(())
}

/// Client side: connect, prove, check the server's proof, run the link. With a `deadline`, a
/// refused connection or a handshake the peer dropped is tried again until then: the accepting
/// side waits only `hello_timeout` for a hello, a node starved of CPU (600 agents on 2 cores in
/// CI) can be slower than that to send it, and a listener full of strangers drops new
/// connections at once.
pub(super) async fn connect(
    shared: &Shared,
    peer: usize,
    addr: SocketAddr,
    link: Link,
    deadline: Option<tokio::time::Instant>,
) -> Result<(), Error> {
    let me = shared.job.node_idx;
    let mut backoff = Duration::from_millis(10);
    loop {
        // A node that leaves stops trying; no link exists yet, so nobody waits for a bye.
        let failure = tokio::select! {
            dialed = dial(shared, peer, addr, link, deadline) => match dialed {
                Ok((reader, writer)) => {
                    debug!(peer, %addr, ?link, "link up");
                    shared
                        .tracker
                        .spawn(run_link(shared.clone(), peer, reader, writer).in_current_span());
                    return Ok(());
                }
                Err(Dial::Final(e)) => return Err(e),
                Err(Dial::Again(e)) => e,
            },
            _ = shared.shutdown.cancelled() => return Err(Error::Shutdown { node: me }),
        };
        if deadline.is_none_or(|d| tokio::time::Instant::now() + backoff >= d) {
            return Err(failure);
        }
        debug!(peer, %addr, "trying again in {backoff:?}: {failure}");
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shared.shutdown.cancelled() => return Err(Error::Shutdown { node: me }),
        }
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
}

/// How one dial ended when it did not bring a link up.
enum Dial {
    /// Worth another try before the join's deadline: refused, dropped, or unanswered.
    Again(Error),
    /// The peer answered with something wrong; trying again would get the same.
    Final(Error),
}

/// One connection and handshake to `peer`; the authenticated halves on success.
async fn dial(
    shared: &Shared,
    peer: usize,
    addr: SocketAddr,
    link: Link,
    deadline: Option<tokio::time::Instant>,
) -> Result<(Reader, Writer), Dial> {
    let job = &shared.job;
    let me = job.node_idx;
    let stream = tokio::time::timeout(shared.config.connect_timeout, TcpStream::connect(addr))
        .await
        .unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connect_timeout",
            ))
        })
        .map_err(|source| {
            Dial::Again(Error::Connect {
                node: me,
                peer_node: peer,
                addr,
                source,
            })
        })?;
    let refused = |reason: String| Error::Handshake {
        node: me,
        peer: format!("node {peer} at {addr}"),
        reason,
    };
    let missing = |m: Missing| match m {
        Missing::Dropped(r) => Dial::Again(refused(r)),
        Missing::Bad(r) => Dial::Final(refused(r)),
    };
    let (mut reader, mut writer) = framed(stream);
    let challenge = next_frame(&mut reader, "challenge", handshake_wait(shared, deadline))
        .await
        .map_err(missing)?;
    let Message::Challenge {
        nonce: server_nonce,
    } = challenge
    else {
        return Err(Dial::Final(refused(format!(
            "expected challenge, got {}",
            challenge.kind()
        ))));
    };
    let nonce = auth::nonce();
    let mac = auth::Transcript {
        secret: &job.secret,
        job_id: &job.job_id,
        node_idx: me as u32,
        server: &server_nonce,
        client: &nonce,
    }
    .client_proof(link);
    let hello = Message::Hello {
        job_id: job.job_id.clone(),
        node_idx: me as u32,
        link,
        nonce,
        mac,
    };
    writer
        .send(hello)
        .await
        .map_err(|e| Dial::Again(refused(e.to_string())))?;
    let welcome = next_frame(&mut reader, "welcome", handshake_wait(shared, deadline))
        .await
        .map_err(missing)?;
    auth::check_welcome(job, peer, &server_nonce, &nonce, &welcome)
        .map_err(|r| Dial::Final(refused(r)))?;
    Ok((reader, writer))
}

/// How long the dialing side waits for its peer's next handshake frame: `handshake_timeout`, or
/// what is left of the join if that is longer. The peer is the node it chose to reach, which
/// may be slow, not a stranger: with hundreds of nodes on a few cores (600 agents on 2 here)
/// an agent starting its PMIx server answered after more than 5 s.
fn handshake_wait(shared: &Shared, deadline: Option<tokio::time::Instant>) -> Duration {
    let left = deadline.map_or(Duration::ZERO, |d| {
        d.saturating_duration_since(tokio::time::Instant::now())
    });
    left.max(shared.config.handshake_timeout)
}

/// Runs an authenticated link: registers it with the engine, then pumps frames both ways.
async fn run_link(shared: Shared, peer: usize, mut reader: Reader, mut writer: Writer) {
    reader.decoder_mut().max_body = shared.config.max_frame;
    writer.encoder_mut().max_body = shared.config.max_frame;
    let id = shared
        .next_link_id
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (tx, rx) = mpsc::channel::<Message>(LINK_CAPACITY);
    // A link that comes up while this node leaves (its handshake was under way) is one the
    // engine never says goodbye on: the writer below says it, else the peer would take the
    // close as a crash.
    if shared.shutdown.is_cancelled()
        || shared
            .events
            .send(Event::Linked { node: peer, id, tx })
            .await
            .is_err()
    {
        let bye = async {
            writer.send(Message::Bye).await?;
            writer.close().await
        };
        let _ = tokio::time::timeout(shared.config.handshake_timeout, bye).await;
        return;
    }
    let span = info_span!("link", peer);
    shared
        .tracker
        .spawn(write_link(writer, rx, shared.shutdown.clone()).instrument(span.clone()));
    let (clean, reason) = read_link(&shared, peer, reader).instrument(span).await;
    let _ = shared
        .events
        .send(Event::Closed {
            node: peer,
            id,
            clean,
            reason,
        })
        .await;
}

/// A link's writer: the engine's frames to the peer until the engine drops the link's sender.
async fn write_link(
    mut writer: Writer,
    mut rx: mpsc::Receiver<Message>,
    stopping: CancellationToken,
) {
    let mut said_bye = false;
    while let Some(msg) = rx.recv().await {
        let bye = matches!(msg, Message::Bye);
        if let Err(e) = writer.send(msg).await {
            debug!("write failed: {e}");
            let _ = writer.close().await;
            return;
        }
        said_bye |= bye;
    }
    // The engine dropped this link's sender: the link closed, or this node is leaving
    // and the engine stopped before it saw the link (then no bye came from it).
    if stopping.is_cancelled() && !said_bye {
        let _ = writer.send(Message::Bye).await;
    }
    let _ = writer.close().await;
}

/// A link's reader: the peer's frames to the engine until the peer says bye or the link ends;
/// whether it ended cleanly, and if not why.
async fn read_link(shared: &Shared, peer: usize, mut reader: Reader) -> (bool, String) {
    // After our shutdown starts, keep reading (and discarding) until the peer's bye or close,
    // for at most `shutdown_linger`: closing a socket with unread data sends a reset, which can
    // destroy our own bye before the peer reads it and make it abort a finished job.
    let linger = async {
        shared.shutdown.cancelled().await;
        tokio::time::sleep(shared.config.shutdown_linger).await;
    };
    tokio::pin!(linger);
    loop {
        let frame = tokio::select! {
            _ = &mut linger => return (true, String::new()),
            f = reader.next() => f,
        };
        if let Some(end) = on_frame(shared, peer, frame).await {
            return end;
        }
    }
}

/// One read from the peer: passes a collective or point-to-point frame to the engine, or says
/// how the link ended (cleanly, and if not why).
async fn on_frame(
    shared: &Shared,
    peer: usize,
    frame: Option<Result<Message, FrameError>>,
) -> Option<(bool, String)> {
    let stopping = shared.shutdown.is_cancelled();
    match frame {
        None if stopping => Some((true, String::new())),
        None => Some((false, "connection closed without bye".to_string())),
        Some(Err(_)) if stopping => Some((true, String::new())),
        Some(Err(e)) => {
            warn!("refused frame: {e}");
            Some((false, e.to_string()))
        }
        Some(Ok(Message::Bye)) => Some((true, String::new())),
        Some(Ok(_)) if stopping => None,
        Some(Ok(
            msg @ (Message::Up { .. }
            | Message::Down { .. }
            | Message::Ring { .. }
            | Message::Bruck { .. }
            | Message::Abort(_)
            | Message::Request { .. }
            | Message::Response { .. }),
        )) => {
            // The engine may be gone (shutting down): keep draining.
            let _ = shared.events.send(Event::Frame { from: peer, msg }).await;
            None
        }
        Some(Ok(other)) => Some((
            false,
            format!("unexpected {} on an established link", other.kind()),
        )),
    }
}
