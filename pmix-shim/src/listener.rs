//! The accept loop every TCP server of this crate runs: overlay links and netlrts clients.

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use tokio::{
    net::{TcpListener, TcpStream},
    sync::Semaphore,
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::warn;

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
