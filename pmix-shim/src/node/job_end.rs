//! How a job ends, seen from one node: the node service's rule, and the part only its embedder
//! can do ([`JobEnd`]: tell the launcher, kill the ranks).
//!
//! Flow ([`crate::node::NodeService::watch_end`]): an abort anywhere in the job reaches every
//! node over the overlay. Each node lets its embedder act locally ([`JobEnd::aborted`]); the
//! node where the abort started tells the launcher the job's code ([`JobEnd::report`]) and
//! then has the ranks killed ([`JobEnd::kill`]), again after each of
//! [`EndPolicy::kill_again`] when the abort came before this node had joined (another node may
//! not have started its ranks when the first kill came, and a kill that comes first does not
//! stop them). Every node whose own ranks still run after the abort asks for the kill again
//! after each of [`EndPolicy::kill_stragglers`] (a launcher's kill can miss a node's ranks).
//! Until it has joined, a node hears only of aborts from the nodes it is linked to: after
//! [`EndPolicy::hear_end_after`] it also asks the launcher ([`JobEnd::hear_end`]) and takes
//! the answer as its own overlay's abort.
//!
//! The rule lives here so that every embedder ends a job the same way; what the launcher is
//! (srun, greedyrun) and how ranks are killed (slurmctld, a process group) is the embedder's.

use std::{future::Future, sync::Arc, time::Duration};

use tokio::sync::watch;

use crate::{AbortInfo, node::NodeService, overlay::Overlay};

/// Why [`JobEnd::kill`] is called: the embedder words its log lines by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kill {
    /// The first kill, on the node the abort started on, after the report.
    Ending,
    /// Again, after an abort that came before this node had joined.
    Again,
    /// Again, because `running` local ranks still run after the abort.
    Stragglers {
        /// Local ranks not ended yet.
        running: usize,
    },
}

/// What only the embedder can do when its job ends.
pub trait JobEnd: Send + Sync + 'static {
    /// Local work on every node once the job has aborted, before the node ends it (log the
    /// abort, tell a rank's own output, release what would hold the ranks' ends up).
    fn aborted(
        &self,
        _abort: &AbortInfo,
        _service: &NodeService,
    ) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Tells the job's launcher it ended with `code` (the abort's, 0 made 1: a job that ends
    /// early has failed) because of `abort`; the launcher exits with it. Bounded and logged
    /// by the embedder.
    fn report(&self, code: i32, abort: &AbortInfo) -> impl Future<Output = ()> + Send;

    /// Has every rank of the job, on every node, killed; logs a refusal. May block: it runs
    /// on a blocking thread.
    fn kill(&self, why: Kill);

    /// Waits until the launcher tells of the job's end: the abort to take as this node's
    /// own. An error says why it cannot (logged by the embedder); the node then waits for
    /// its join instead.
    ///
    /// # Cancel safety
    /// Dropped when the node joins.
    fn hear_end(&self) -> impl Future<Output = Result<AbortInfo, String>> + Send;
}

/// When a node asks again for the kill, and for the launcher's word.
#[derive(Debug, Clone, Default)]
pub struct EndPolicy {
    /// On the node the abort started on, when it came before that node had joined: the
    /// waits, each after the previous one, before the kill is asked for again.
    pub kill_again: Vec<Duration>,
    /// On every node whose ranks still run after the abort: the waits, each after the
    /// previous one, before the kill is asked for again.
    pub kill_stragglers: Vec<Duration>,
    /// How long a join may take before the node also asks the launcher for the job's end
    /// ([`JobEnd::hear_end`]); `None`: never.
    pub hear_end_after: Option<Duration>,
}

/// Waits for the job's abort and ends the job from this node (the module's flow). `running`
/// counts the local ranks not ended yet.
pub(crate) async fn watch_abort<E: JobEnd>(
    service: NodeService,
    end: Arc<E>,
    policy: EndPolicy,
    mut running: watch::Receiver<usize>,
) {
    let overlay = service.overlay().clone();
    let mut aborted = overlay.aborted();
    let info = match aborted.wait_for(Option::is_some).await {
        Ok(seen) => seen.clone(),
        Err(_) => return,
    };
    let Some(info) = info else { return };
    // (The join's state is known at once: joined, failed with this abort, or still going.)
    let joined = tokio::time::timeout(Duration::ZERO, overlay.joined()).await;
    let before_join = !matches!(joined, Ok(Ok(())));
    end.aborted(&info, &service).await;
    if info.origin_node == overlay.node_idx() {
        end_job(&end, &info, &policy, before_join).await;
    }
    for &wait in &policy.kill_stragglers {
        // Every rank gone, or the embedder (its counter) is: nothing left to kill.
        if tokio::time::timeout(wait, running.wait_for(|&n| n == 0))
            .await
            .is_ok()
        {
            return;
        }
        let left = *running.borrow();
        kill(&end, Kill::Stragglers { running: left }).await;
    }
}

/// Ends the job from the node its abort started on: the report, then the kill (again after
/// each of [`EndPolicy::kill_again`] when `before_join`).
async fn end_job<E: JobEnd>(end: &Arc<E>, info: &AbortInfo, policy: &EndPolicy, before_join: bool) {
    end.report(if info.code == 0 { 1 } else { info.code }, info)
        .await;
    kill(end, Kill::Ending).await;
    if before_join {
        for &wait in &policy.kill_again {
            tokio::time::sleep(wait).await;
            kill(end, Kill::Again).await;
        }
    }
}

/// [`JobEnd::kill`] off the runtime's workers, in the watch's span (a blocking thread has
/// none of its own), so the embedder's lines say which job and node.
async fn kill<E: JobEnd>(end: &Arc<E>, why: Kill) {
    let (end, span) = (end.clone(), tracing::Span::current());
    let _ = tokio::task::spawn_blocking(move || span.in_scope(|| end.kill(why))).await;
}

/// Until this node has joined, an abort elsewhere reaches it over the overlay only if it is
/// linked to the node the abort came from; otherwise only the kill ends its ranks, and if the
/// kill fails or misses them they wait in their first fence until the join times out. The
/// launcher keeps the report of the abort that ended the job: this node takes it as its own
/// overlay's abort, which fails its ranks' fences whatever became of the kill. Ends when the
/// node has joined (the overlay carries every abort from then on) or its join failed (which
/// aborts anyway).
pub(crate) async fn hear_end<E: JobEnd>(overlay: Overlay, end: Arc<E>, after: Duration) {
    tokio::select! {
        _ = overlay.joined() => return,
        _ = tokio::time::sleep(after) => {}
    }
    let ended = tokio::select! {
        _ = overlay.joined() => return,
        ended = end.hear_end() => ended,
    };
    if let Ok(abort) = ended {
        overlay.abort(abort).await;
    }
}
