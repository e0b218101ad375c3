//! The process's one PMIx server and the namespaces it hosts: every upcall routed by namespace.
//!
//! libpmix allows one server per process ([`Server::init`] once), and its module gets every
//! client's upcalls, whichever namespace the client belongs to. A dynamically spawned job
//! (`MPI_Comm_spawn`) is served by the same node services as its parent, so one process must
//! host several namespaces: [`PmixHost`] owns the server and implements [`Handler`] by
//! handing each upcall to the handler of the namespace it names ([`super::PmixServer`]'s
//! per-job state: job info, local ranks, fences, direct modex, aborts, names).
//!
//! What belongs to whom:
//! - **The host** (per process, [`HostConfig`]): the libpmix server, its directory (the
//!   namespaces' directories are inside it), the uid/gid the ranks run as, the accept gate's
//!   policy (which admits the processes of every namespace hosted: they are all the
//!   embedder's descendants), how long finalize may take, and the routing table.
//! - **A namespace** (per job, [`super::NamespaceConfig`]): its [`crate::NamespaceSpec`]
//!   (ranks placed on some or all of its overlay's nodes), overlay, local ranks, bindings,
//!   fences, direct modex, aborts, counters.
//!
//! Routing: by `proc.nspace` for client events, aborts, direct modex and the name service
//! (libpmix's handshake fixed the namespace a client speaks as when it connected); by the
//! participants' namespaces for fences, connect and disconnect (over several namespaces, a
//! parent and its spawned child: to the first by name, the same on every node, whose subset
//! collective spans them all, [`crate::group`]); by the requester's for spawn. An upcall
//! naming a namespace not hosted here is answered with `PMIX_ERR_NOT_FOUND` at once (libpmix
//! sends a direct modex for an unregistered namespace up, and it must never stay pending).
//! (A fence naming a namespace libpmix does not know never comes up:
//! libpmix holds it for that namespace's registration until the client's `PMIX_TIMEOUT`.)
//!
//! libpmix does not isolate the namespaces of one server from each other (any client may
//! `PMIx_Get` a hosted namespace's job data, and a direct modex does not say who asked), so one
//! host serves one job family only (docs/security.md, "Several namespaces on one server").

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use greedy_sys::pmix::{
    Proc, Status,
    group::{GroupDone, GroupRequest, Groups},
    pubsub::{Datum, Directives, LookupDone, Published},
    server::{Handler, ModexDone, OpDone, Server, ServerConfig},
    spawn::{App, SpawnDone},
};
use tokio::sync::oneshot;
use tracing::{debug, warn};

use super::Admit;
use crate::Error;

/// Settings of the process's PMIx server, shared by every namespace it hosts.
#[derive(Clone)]
pub struct HostConfig {
    /// The server's directory (`PMIX_SERVER_TMPDIR`); each namespace's directory is made in it.
    pub tmpdir: PathBuf,
    /// `PMIX_HOSTNAME` of the server.
    pub hostname: String,
    /// `PMIX_NODEID` of the server.
    pub nodeid: u32,
    /// The server's own namespace, seen in its clients' URI.
    pub server_nspace: String,
    /// The uid and gid the ranks of every namespace run as, when not this process's.
    pub owner: Option<(u32, u32)>,
    /// The accept gate's policy: which connections reach libpmix at all, for every namespace.
    pub admit: Admit,
    /// How long [`PmixHost::shutdown`] waits for `PMIx_server_finalize`.
    pub finalize_timeout: Duration,
    /// The process exits once the host is shut down: leave libpmix to the exit instead of
    /// finalizing it (greedy-sys `Server::leave_to_exit`).
    pub leave_to_exit: bool,
    /// When PMIx groups are served ([`Groups`]: by default only with a libpmix whose answer
    /// every client reads).
    pub groups: Groups,
}

impl std::fmt::Debug for HostConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostConfig")
            .field("tmpdir", &self.tmpdir)
            .field("hostname", &self.hostname)
            .field("nodeid", &self.nodeid)
            .field("server_nspace", &self.server_nspace)
            .field("owner", &self.owner)
            .field("finalize_timeout", &self.finalize_timeout)
            .field("leave_to_exit", &self.leave_to_exit)
            .finish_non_exhaustive()
    }
}

/// The process's PMIx server and the namespaces registered with it; cheap to clone.
#[derive(Clone, Debug)]
pub struct PmixHost {
    inner: Arc<HostInner>,
}

#[derive(Debug)]
struct HostInner {
    config: HostConfig,
    server: Mutex<Option<Arc<Server>>>,
    routes: Arc<Routes>,
}

/// The namespaces hosted, each with the handler of its upcalls.
#[derive(Default)]
pub(crate) struct Routes {
    namespaces: RwLock<HashMap<String, Arc<dyn Handler>>>,
}

impl std::fmt::Debug for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.hosted()).finish()
    }
}

/// Where an upcall naming several processes goes.
enum Target {
    One(Arc<dyn Handler>),
    Refused(Status),
}

impl Routes {
    fn hosted(&self) -> Vec<String> {
        let map = self.namespaces.read().unwrap_or_else(|p| p.into_inner());
        map.keys().cloned().collect()
    }

    fn of(&self, nspace: &str) -> Option<Arc<dyn Handler>> {
        let map = self.namespaces.read().unwrap_or_else(|p| p.into_inner());
        map.get(nspace).cloned()
    }

    /// Adds `nspace`; false if it is hosted already.
    pub(crate) fn add(&self, nspace: &str, handler: Arc<dyn Handler>) -> bool {
        let mut map = self.namespaces.write().unwrap_or_else(|p| p.into_inner());
        if map.contains_key(nspace) {
            return false;
        }
        map.insert(nspace.to_string(), handler);
        true
    }

    /// Forgets `nspace`: its later upcalls are refused.
    pub(crate) fn remove(&self, nspace: &str) {
        let mut map = self.namespaces.write().unwrap_or_else(|p| p.into_inner());
        map.remove(nspace);
    }

    /// The handler of the first (by name) of the participants' namespaces, all hosted here,
    /// or the status refusing them. Every node of a family hosts all of its namespaces, so
    /// every node hands a collective over several to the same namespace's handler, whose
    /// per-group sequence numbers then agree.
    fn of_participants(&self, procs: &[Proc]) -> Target {
        let spaces: BTreeSet<&str> = procs.iter().map(|p| p.nspace.as_str()).collect();
        let Some(first) = spaces.first() else {
            return Target::Refused(Status::BAD_PARAM);
        };
        if let Some(missing) = spaces.iter().find(|n| self.of(n).is_none()) {
            warn!(
                nspace = missing,
                "collective over a namespace not hosted here refused"
            );
            return Target::Refused(Status::NOT_FOUND);
        }
        match self.of(first) {
            Some(h) => Target::One(h),
            None => Target::Refused(Status::NOT_FOUND),
        }
    }

    /// The handler of `proc_`'s namespace; logs the refusal of one not hosted.
    fn of_proc(&self, proc_: &Proc, what: &str) -> Option<Arc<dyn Handler>> {
        let found = self.of(&proc_.nspace);
        if found.is_none() {
            debug!(nspace = %proc_.nspace, rank = proc_.rank, "{what} for a namespace not hosted here refused");
        }
        found
    }
}

impl Handler for Routes {
    fn client_connected(&self, proc_: Proc) {
        if let Some(h) = self.of_proc(&proc_, "client connected") {
            h.client_connected(proc_);
        }
    }

    fn client_finalized(&self, proc_: Proc, done: OpDone) {
        match self.of_proc(&proc_, "finalize") {
            Some(h) => h.client_finalized(proc_, done),
            None => done.complete(Status::NOT_FOUND),
        }
    }

    fn log(&self, proc_: Proc, stderr: Option<String>, done: OpDone) {
        match self.of_proc(&proc_, "log") {
            Some(h) => h.log(proc_, stderr, done),
            None => greedy_sys::pmix::server::decline_log(done),
        }
    }

    fn abort(
        &self,
        proc_: Proc,
        status: i32,
        msg: String,
        targets: Option<Vec<Proc>>,
        done: OpDone,
    ) {
        match self.of_proc(&proc_, "abort") {
            Some(h) => h.abort(proc_, status, msg, targets, done),
            None => done.complete(Status::NOT_FOUND),
        }
    }

    fn fence(&self, procs: Vec<Proc>, collect: bool, data: Vec<u8>, done: ModexDone) {
        match self.of_participants(&procs) {
            Target::One(h) => h.fence(procs, collect, data, done),
            Target::Refused(s) => done.complete(s, Vec::new()),
        }
    }

    fn direct_modex(&self, proc_: Proc, key: Option<String>, done: ModexDone) {
        match self.of_proc(&proc_, "direct modex") {
            Some(h) => h.direct_modex(proc_, key, done),
            None => done.complete(Status::NOT_FOUND, Vec::new()),
        }
    }

    fn publish(&self, proc_: Proc, what: Published, done: OpDone) {
        match self.of_proc(&proc_, "publish") {
            Some(h) => h.publish(proc_, what, done),
            None => done.complete(Status::NOT_FOUND),
        }
    }

    fn lookup(&self, proc_: Proc, keys: Vec<String>, directives: Directives, done: LookupDone) {
        match self.of_proc(&proc_, "lookup") {
            Some(h) => h.lookup(proc_, keys, directives, done),
            None => done.complete(Status::NOT_FOUND, Vec::new()),
        }
    }

    fn unpublish(&self, proc_: Proc, keys: Vec<String>, directives: Directives, done: OpDone) {
        match self.of_proc(&proc_, "unpublish") {
            Some(h) => h.unpublish(proc_, keys, directives, done),
            None => done.complete(Status::NOT_FOUND),
        }
    }

    fn connect(&self, procs: Vec<Proc>, timeout: Option<Duration>, done: OpDone) {
        match self.of_participants(&procs) {
            Target::One(h) => h.connect(procs, timeout, done),
            Target::Refused(s) => done.complete(s),
        }
    }

    fn disconnect(&self, procs: Vec<Proc>, timeout: Option<Duration>, done: OpDone) {
        match self.of_participants(&procs) {
            Target::One(h) => h.disconnect(procs, timeout, done),
            Target::Refused(s) => done.complete(s),
        }
    }

    fn group(&self, request: GroupRequest, done: GroupDone) {
        match self.of_participants(&request.procs) {
            Target::One(h) => h.group(request, done),
            Target::Refused(s) => done.failed(s),
        }
    }

    fn spawn(
        &self,
        requester: Proc,
        job_info: Vec<(String, Datum)>,
        apps: Vec<App>,
        done: SpawnDone,
    ) {
        match self.of_proc(&requester, "spawn") {
            Some(h) => h.spawn(requester, job_info, apps, done),
            None => done.failed(Status::NOT_FOUND),
        }
    }

    fn callback_panicked(&self, callback: &'static str, message: String) {
        // Which namespace's call panicked is unknown here: a panic makes the whole process
        // suspect, so every job it hosts ends.
        let all: Vec<Arc<dyn Handler>> = {
            let map = self.namespaces.read().unwrap_or_else(|p| p.into_inner());
            map.values().cloned().collect()
        };
        for h in all {
            h.callback_panicked(callback, message.clone());
        }
    }
}

impl PmixHost {
    /// Initialises the process's PMIx server (`PMIx_server_init`) hosting no namespace yet.
    /// Fails if a PMIx server already ran in this process.
    pub fn start(config: HostConfig) -> Result<PmixHost, Error> {
        let routes = Arc::new(Routes::default());
        std::fs::create_dir_all(&config.tmpdir).map_err(|source| Error::Io {
            node: config.nodeid as usize,
            what: "creating the PMIx directory",
            source,
        })?;
        let server = Server::init(
            routes.clone(),
            &ServerConfig {
                tmpdir: config.tmpdir.clone(),
                hostname: config.hostname.clone(),
                nodeid: config.nodeid,
                server_nspace: config.server_nspace.clone(),
                server_rank: config.nodeid,
                admit: config.admit.clone(),
                groups: config.groups,
            },
        )
        .map_err(|e| Error::Pmix {
            node: config.nodeid as usize,
            what: "PMIx_server_init".into(),
            status: e.to_string(),
        })?;
        Ok(PmixHost {
            inner: Arc::new(HostInner {
                config,
                server: Mutex::new(Some(Arc::new(server))),
                routes,
            }),
        })
    }

    /// The host's settings.
    pub fn config(&self) -> &HostConfig {
        &self.inner.config
    }

    /// The namespaces hosted now.
    pub fn namespaces(&self) -> Vec<String> {
        self.inner.routes.hosted()
    }

    /// The server, unless the host is shut down.
    pub(crate) fn server(&self) -> Option<Arc<Server>> {
        let s = self.inner.server.lock().unwrap_or_else(|p| p.into_inner());
        s.clone()
    }

    /// Routes `nspace`'s upcalls to `handler`; false if it is hosted already.
    pub(crate) fn route(&self, nspace: &str, handler: Arc<dyn Handler>) -> bool {
        self.inner.routes.add(nspace, handler)
    }

    /// Stops routing `nspace`'s upcalls (a namespace that failed to open); no libpmix call.
    pub(crate) fn unroute(&self, nspace: &str) {
        self.inner.routes.remove(nspace);
    }

    /// Deregisters `nspace` (and so its clients) with libpmix, then refuses its upcalls; at
    /// most `limit`. The server keeps serving the other namespaces.
    pub(crate) async fn remove(&self, nspace: &str, limit: Duration) {
        if let Some(server) = self.server() {
            let (tx, rx) = oneshot::channel();
            server.deregister_nspace(nspace, move |s| {
                let _ = tx.send(s);
            });
            drop(server);
            if tokio::time::timeout(limit, rx).await.is_err() {
                warn!(
                    nspace,
                    "PMIx_server_deregister_nspace still running after {limit:?}"
                );
            }
        }
        self.inner.routes.remove(nspace);
    }

    /// Finalizes the server (at most `finalize_timeout`; a finalize still running then is
    /// left behind on its own thread, greedy-sys never runs it on the caller's). Namespaces
    /// still hosted lose their clients.
    pub async fn shutdown(&self) {
        self.shutdown_within(self.inner.config.finalize_timeout)
            .await
    }

    /// As [`PmixHost::shutdown`], waiting at most `limit`; with
    /// [`HostConfig::leave_to_exit`], returns at once and leaves the server to the exit.
    pub async fn shutdown_within(&self, limit: Duration) {
        let server = self
            .inner
            .server
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some(server) = server else { return };
        if self.inner.config.leave_to_exit {
            return server.leave_to_exit();
        }
        let server = match Arc::try_unwrap(server) {
            Ok(s) => s,
            // A PMIx_Get of a cancelled direct-modex answer still holds it: whoever drops it
            // last starts the finalize (in the background, as here).
            Err(shared) => {
                debug!("PMIx server still referenced; finalized by its last holder");
                return drop(shared);
            }
        };
        let (done_tx, done_rx) = oneshot::channel();
        server.finalize(move |status| {
            let _ = done_tx.send(status);
        });
        // PMIx_server_finalize can hang in pmix_rte_finalize after clients were killed
        // mid-connect (measured, 1 run in ~8 of the crash test); a blocking thread of the
        // runtime would keep the runtime (and the process) from exiting.
        match tokio::time::timeout(limit, done_rx).await {
            Ok(Ok(status)) if !status.is_success() => {
                debug!(%status, "PMIx_server_finalize returned an error")
            }
            Ok(_) => {}
            Err(_) => warn!(
                "PMIx_server_finalize still running after finalize_timeout ({limit:?}); left behind"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records which namespace's handler got a call.
    struct Named(&'static str, Arc<Mutex<Vec<&'static str>>>);

    impl Handler for Named {
        fn client_finalized(&self, _: Proc, done: OpDone) {
            self.1.lock().unwrap().push(self.0);
            drop(done);
        }
        fn abort(&self, _: Proc, _: i32, _: String, _: Option<Vec<Proc>>, done: OpDone) {
            drop(done);
        }
        fn fence(&self, _: Vec<Proc>, _: bool, _: Vec<u8>, done: ModexDone) {
            self.1.lock().unwrap().push(self.0);
            drop(done);
        }
        fn direct_modex(&self, _: Proc, _: Option<String>, done: ModexDone) {
            self.1.lock().unwrap().push(self.0);
            drop(done);
        }
        fn callback_panicked(&self, _: &'static str, _: String) {
            self.1.lock().unwrap().push(self.0);
        }
    }

    fn p(nspace: &str, rank: u32) -> Proc {
        Proc {
            nspace: nspace.into(),
            rank,
        }
    }

    fn routes() -> (Routes, Arc<Mutex<Vec<&'static str>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let r = Routes::default();
        assert!(r.add("a", Arc::new(Named("a", seen.clone()))));
        assert!(r.add("b", Arc::new(Named("b", seen.clone()))));
        assert!(!r.add("a", Arc::new(Named("dup", seen.clone()))));
        (r, seen)
    }

    #[test]
    fn participants_of_one_hosted_namespace_reach_its_handler_only() {
        let (r, seen) = routes();
        assert!(matches!(
            r.of_participants(&[p("b", 0), p("b", 3)]),
            Target::One(_)
        ));
        let Target::One(h) = r.of_participants(&[p("a", 1)]) else {
            panic!("a is hosted")
        };
        h.callback_panicked("x", String::new());
        assert_eq!(*seen.lock().unwrap(), ["a"]);
        assert!(r.of_proc(&p("b", 0), "t").is_some());
    }

    #[test]
    fn unknown_mixed_and_empty_participants_are_refused_at_once() {
        let (r, _) = routes();
        let refused = |procs: &[Proc]| match r.of_participants(procs) {
            Target::Refused(s) => s,
            Target::One(_) => panic!("{procs:?} routed"),
        };
        assert_eq!(refused(&[p("c", 0)]), Status::NOT_FOUND);
        assert_eq!(refused(&[p("a", 0), p("c", 0)]), Status::NOT_FOUND);
        assert_eq!(refused(&[]), Status::BAD_PARAM);
        assert!(r.of_proc(&p("c", 0), "t").is_none());
        r.remove("a");
        assert_eq!(refused(&[p("a", 0)]), Status::NOT_FOUND);
        assert_eq!(r.hosted(), ["b"]);
    }

    #[test]
    fn participants_of_several_hosted_namespaces_reach_the_first_by_name() {
        let (r, seen) = routes();
        let Target::One(h) = r.of_participants(&[p("b", 0), p("a", 2)]) else {
            panic!("a and b are hosted")
        };
        h.callback_panicked("x", String::new());
        assert_eq!(*seen.lock().unwrap(), ["a"]);
    }

    #[test]
    fn a_panic_ends_every_hosted_namespace() {
        let (r, seen) = routes();
        r.callback_panicked("fence", "boom".into());
        let mut got = seen.lock().unwrap().clone();
        got.sort();
        assert_eq!(got, ["a", "b"]);
    }
}
