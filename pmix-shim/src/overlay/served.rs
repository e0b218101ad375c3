//! The namespaces served on one overlay, on this node: where each one's direct-modex requests go, and (on node 0) each one's placement for the subset-collective coordinator.
//!
//! An overlay has one queue per service ([`Overlay::incoming`]), handed out once; several
//! namespaces served over the same overlay (a job and the jobs it spawns, `MPI_Comm_spawn`)
//! share them. Every overlay holds one [`Served`] registry ([`Overlay::served`]), filled by
//! each namespace's server when it opens ([`crate::pmix::PmixHost::serve`]) and emptied of it
//! when it shuts down. The first namespace served on the overlay starts the router on the
//! overlay's own tasks, which hands each direct-modex request to the queue of the namespace
//! its body names; node 0's [`crate::group::Coordinator`] looks each contribution's namespace
//! up here to know which nodes must contribute. A request for a namespace not (or no longer)
//! served here is answered at once with an error naming it, never left pending; requests
//! already queued for a namespace being removed are answered with an error when its queue is
//! dropped ([`Incoming`]'s drop). The name table stays one per overlay (a job family shares
//! names).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::mpsc;
use tracing::debug;

use super::{Incoming, Overlay};
use crate::JobSpec;

/// One namespace served on the overlay.
#[derive(Debug, Clone)]
struct Entry {
    /// Its ranks in the overlay's numbering.
    placement: Arc<JobSpec>,
    /// The queue of its direct-modex server on this node (`None`: its placement only).
    modex: Option<mpsc::Sender<Incoming>>,
}

/// The namespaces served on one overlay on this node, keyed by name; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Served {
    namespaces: Arc<Mutex<HashMap<String, Entry>>>,
}

/// Why a request could not be handed to its namespace (the answer to the asking node).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unserved {
    /// The namespace was never added here, or was removed.
    #[error("node {node}: namespace {nspace:?} is not served on this overlay")]
    Unknown {
        /// This node.
        node: usize,
        /// The namespace asked for.
        nspace: String,
    },
    /// Its server's queue is full or closing.
    #[error("node {node}: namespace {nspace:?} cannot take more requests now")]
    Busy {
        /// This node.
        node: usize,
        /// The namespace asked for.
        nspace: String,
    },
}

impl Served {
    /// A registry holding `placement` only (no direct-modex server): a coordinator of one
    /// namespace, as in tests and fuzzing.
    pub fn of_one(placement: Arc<JobSpec>) -> Served {
        let served = Served::default();
        served.insert(placement, None);
        served
    }

    fn map(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.namespaces.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `placement`'s namespace with its direct-modex queue; false if served already
    /// with a queue, or with another placement. A namespace added by its placement only
    /// ([`Served::add_placement`], the PMI server's spawned job) takes the queue.
    pub(crate) fn add(&self, placement: Arc<JobSpec>, modex: mpsc::Sender<Incoming>) -> bool {
        self.insert(placement, Some(modex))
    }

    /// Adds `placement`'s namespace without a direct-modex queue (a spawned job PMI serves,
    /// which PMIx may add later with its queue); true also if it is served already with the
    /// same placement, false if with another.
    pub(crate) fn add_placement(&self, placement: Arc<JobSpec>) -> bool {
        self.insert(placement, None)
    }

    fn insert(&self, placement: Arc<JobSpec>, modex: Option<mpsc::Sender<Incoming>>) -> bool {
        let mut map = self.map();
        let Some(entry) = map.get_mut(&placement.job_id) else {
            map.insert(placement.job_id.clone(), Entry { placement, modex });
            return true;
        };
        if !same_placement(&entry.placement, &placement) {
            return false;
        }
        match (modex, entry.modex.is_some()) {
            (None, _) => true,
            (Some(_), true) => false,
            (Some(queue), false) => {
                entry.modex = Some(queue);
                true
            }
        }
    }

    /// Forgets `nspace`: its later requests are refused.
    pub(crate) fn remove(&self, nspace: &str) {
        self.map().remove(nspace);
    }

    /// The namespaces served now, sorted.
    pub fn namespaces(&self) -> Vec<String> {
        let mut names: Vec<String> = self.map().keys().cloned().collect();
        names.sort();
        names
    }

    /// `nspace`'s placement in the overlay's numbering, if it is served.
    pub fn placement(&self, nspace: &str) -> Option<Arc<JobSpec>> {
        self.map().get(nspace).map(|e| e.placement.clone())
    }

    /// Hands `req` to `nspace`'s direct-modex queue without waiting; `node` is this node.
    fn dispatch(
        &self,
        node: usize,
        nspace: &str,
        req: Incoming,
    ) -> Result<(), (Incoming, Unserved)> {
        let queue = self.map().get(nspace).and_then(|e| e.modex.clone());
        let Some(queue) = queue else {
            let nspace = nspace.to_string();
            return Err((req, Unserved::Unknown { node, nspace }));
        };
        queue.try_send(req).map_err(|e| {
            let req = match e {
                mpsc::error::TrySendError::Full(r) | mpsc::error::TrySendError::Closed(r) => r,
            };
            let nspace = nspace.to_string();
            (req, Unserved::Busy { node, nspace })
        })
    }
}

/// Whether two placements put the same ranks on the same hosts (who adds them, and the
/// node's own index, may differ).
fn same_placement(a: &JobSpec, b: &JobSpec) -> bool {
    a.job_id == b.job_id && a.hosts == b.hosts && a.ranks == b.ranks
}

/// Takes `overlay`'s direct-modex queue, unless taken already, and routes it by namespace
/// (`nspace_of` reads the namespace a request body names) on the overlay's own tasks: it
/// outlives any one namespace and ends with the overlay.
pub(crate) fn start_modex_router(
    overlay: &Overlay,
    nspace_of: fn(&[u8]) -> Result<String, String>,
) {
    if let Some(incoming) = overlay.incoming(crate::frame::Service::Modex) {
        let served = overlay.served().clone();
        let node = overlay.node_idx();
        overlay.spawn_task(route_modex(incoming, served, node, nspace_of));
    }
}

/// Hands each direct-modex request to its namespace's queue; answers the rest at once.
async fn route_modex(
    mut incoming: mpsc::Receiver<Incoming>,
    served: Served,
    node: usize,
    nspace_of: fn(&[u8]) -> Result<String, String>,
) {
    while let Some(req) = incoming.recv().await {
        let nspace = match nspace_of(&req.body) {
            Ok(n) => n,
            Err(why) => {
                req.respond(Err(why)).await;
                continue;
            }
        };
        if let Err((req, why)) = served.dispatch(node, &nspace, req) {
            debug!(from = req.from, "direct modex refused: {why}");
            req.respond(Err(why.to_string())).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JobSecret;

    fn placement(id: &str, ranks: Vec<Vec<u32>>) -> Arc<JobSpec> {
        Arc::new(JobSpec {
            job_id: id.into(),
            hosts: vec!["h0".into(), "h1".into()],
            node_idx: 0,
            model: Default::default(),
            ranks,
            secret: JobSecret::generate(),
        })
    }

    #[test]
    fn namespaces_are_added_once_looked_up_and_removed() {
        let served = Served::of_one(placement("a", vec![vec![0], vec![1]]));
        let (tx, _rx) = mpsc::channel(1);
        assert!(served.add(placement("b", vec![vec![], vec![0]]), tx.clone()));
        assert!(!served.add(placement("b", vec![vec![0], vec![]]), tx));
        assert_eq!(served.namespaces(), ["a", "b"]);
        assert_eq!(served.placement("b").unwrap().ranks[1], [0]);
        served.remove("b");
        assert!(served.placement("b").is_none());
        assert_eq!(served.namespaces(), ["a"]);
    }

    #[test]
    fn a_placement_added_alone_takes_its_queue_later_once() {
        let served = Served::default();
        let child = || placement("j.1", vec![vec![0], vec![]]);
        assert!(served.add_placement(child()));
        assert!(served.add_placement(child()));
        assert!(!served.add_placement(placement("j.1", vec![vec![], vec![0]])));
        let (tx, mut rx) = mpsc::channel(1);
        assert!(served.add(child(), tx.clone()));
        assert!(!served.add(child(), tx));
        assert!(served.add_placement(child()));
        let req = Incoming {
            from: 1,
            body: bytes::Bytes::new(),
            id: 0,
            answers: None,
        };
        assert!(served.dispatch(0, "j.1", req).is_ok());
        assert!(rx.try_recv().is_ok());
    }

    #[test]
    fn refusals_name_node_and_namespace() {
        let unknown = Unserved::Unknown {
            node: 2,
            nspace: "b".into(),
        };
        assert_eq!(
            unknown.to_string(),
            "node 2: namespace \"b\" is not served on this overlay"
        );
    }
}
