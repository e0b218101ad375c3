//! This crate's TCP listeners: bound with errors naming the node ([`bind`]), and their accept
//! loops, gated for overlay links ([`accept_gated`]), capped for netlrts clients ([`accept_loop`]).

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use tokio::{
    net::{TcpListener, TcpStream},
    sync::Semaphore,
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{debug, warn};

use crate::{
    Error,
    auth::{Gate, Unproven},
};

/// Binds node `node`'s listener at `addr`; returns it with the address it got. `what` names
/// the listener in the error.
pub(crate) async fn bind(
    node: usize,
    addr: SocketAddr,
    what: &'static str,
) -> Result<(TcpListener, SocketAddr), Error> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { node, addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| Error::Io { node, what, source })?;
    Ok((listener, local))
}

/// Accepts connections until `shutdown`, serving at most `max_connections` at once, each by the
/// future `serve` makes for it, on its own task in `tracker`.
///
/// The cap makes a flood of connections wait in the kernel's backlog instead of costing tasks
/// and memory; a failed accept (out of file descriptors and the like) backs off 100 ms instead
/// of spinning. `what` names the server in that log line.
pub(crate) async fn accept_loop<F, Fut>(
    listener: TcpListener,
    max_connections: usize,
    shutdown: &CancellationToken,
    tracker: &TaskTracker,
    what: &'static str,
    mut serve: F,
) where
    F: FnMut(TcpStream, SocketAddr) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let limit = Arc::new(Semaphore::new(max_connections));
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => return,
            p = limit.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
        };
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, peer)) => {
                let connection = serve(stream, peer);
                tracker.spawn(async move {
                    connection.await;
                    drop(permit);
                });
            }
            Err(e) => {
                warn!("{what} accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Accepts connections until `shutdown`, never waiting for a slot: each new connection takes an
/// [`Unproven`] slot of `gate` and is served by the future `serve` makes for it, on its own task
/// in `tracker`; one over the gate's limits is closed at once (with a reset, so the server
/// keeps no TIME_WAIT for it). The future gives up the slot once its peer proved the secret, so
/// proven links never wait behind strangers; a failed accept backs off 100 ms.
pub(crate) async fn accept_gated<F, Fut>(
    listener: TcpListener,
    gate: Arc<Gate>,
    shutdown: &CancellationToken,
    tracker: &TaskTracker,
    what: &'static str,
    mut serve: F,
) where
    F: FnMut(TcpStream, SocketAddr, Unproven) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, peer)) => match gate.admit(peer.ip()) {
                Some(slot) => {
                    tracker.spawn(serve(stream, peer, slot));
                }
                None => {
                    debug!(%peer, "{what}: too many unproven connections, dropped");
                    drop_now(stream);
                }
            },
            Err(e) => {
                warn!("{what} accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Closes `stream` with a reset: a connection refused for load costs the server no TIME_WAIT.
fn drop_now(stream: TcpStream) {
    let _ = stream.set_zero_linger();
}
