//! PMIx's name service (`PMIx_Publish`, `PMIx_Lookup`, `PMIx_Unpublish`), connect and disconnect within the job, and fences over a subset of the nodes.
//!
//! - **Names** go to node 0's table ([`crate::names`], shared with PMI): the owner recorded
//!   is the rank libpmix authenticated, a lookup with `PMIX_WAIT` is held on node 0 until
//!   every key is published (its `PMIX_TIMEOUT`, else [`names::WAIT_DEFAULT`]).
//! - **Fences over a subset of the nodes, connect, disconnect** are subset collectives
//!   ([`crate::group`]): every node hosting a participant sends node 0 its part; the answer
//!   is every part in node order. Participants may span several namespaces of the family
//!   (a parent and its spawned child connect, and Open MPI's disconnect fences over both):
//!   the nodes that contribute are those of every namespace named; a namespace the host does
//!   not host is refused with `PMIX_ERR_NOT_FOUND`.
//! - **Group construct and destruct** (`PMIx_Group_construct`/`_destruct`, Open MPI 5's
//!   `MPI_Comm_create_from_group`, `MPI_Intercomm_create_from_groups` and sessions) are
//!   subset collectives too: each node's part is libpmix's `PMIX_GROUP_ENDPT_DATA`, the
//!   answer every part concatenated and, when asked, the context id node 0 assigned
//!   ([`greedy_sys::pmix::group`] has libpmix's contract).
//!
//! # What Open MPI asks (research)
//! Sources: open-mpi/ompi tags v5.0.10 (the newest tag read; the tests run the PyPI 5.0.11
//! wheel with its bundled OpenPMIx 5 client) and v4.1.6 (these files are unchanged since
//! Debian's 4.1.4, whose ext3x component links the system's libpmix 4.2.2), openpmix v4.2.2
//! (the server greedy links), prrte v3.0.9.
//! - `MPI_Publish_name` (5.0: ompi/mpi/c/publish_name.c l.112–116): `PMIx_Publish` of
//!   `{service: port (PMIX_STRING), PMIX_RANGE (default SESSION), PMIX_PERSISTENCE (default
//!   SESSION)}`; `PMIX_EXISTS` becomes `MPI_ERR_FILE_EXISTS` (l.122–124). 4.1 passes the same through
//!   opal_pmix.publish (ompi/mpi/c/publish_name.c l.74–152, ext3x → `PMIx_Publish`).
//! - `MPI_Lookup_name` (lookup_name.c l.92–98): `PMIx_Lookup` of one key with `PMIX_RANGE`
//!   only, **no `PMIX_WAIT`**: a name not yet published fails at once (`MPI_ERR_NAME`); the
//!   value must be a `PMIX_STRING`.
//! - `MPI_Unpublish_name` (unpublish_name.c l.97–99): `PMIx_Unpublish(keys, {PMIX_RANGE})`;
//!   `PMIX_ERR_NOT_FOUND` and `PMIX_ERR_NO_PERMISSIONS` are told apart.
//! - `MPI_Comm_accept`/`MPI_Comm_connect` (ompi/dpm/dpm.c l.215–232 in 5.0.10, l.207–232 in
//!   4.1.6): the two roots swap their side's member list ("nspace:rank:…" strings) with
//!   `opal_pmix_base_exchange` (opal/mca/pmix/base/pmix_base_fns.c l.45–80 in 5.0, l.97–150
//!   in 4.1): `PMIx_Publish({"<port>:accept"|":connect": members,
//!   PMIX_PERSISTENCE=FIRST_READ})`, then `PMIx_Lookup(the other key, {PMIX_WAIT (bool),
//!   PMIX_TIMEOUT=600 (int)})`. Then every member of both sides calls `PMIx_Connect(sorted
//!   union, {PMIX_TIMEOUT (uint32)})` (dpm.c l.395–401 in 5.0; l.398 `opal_pmix.connect` in
//!   4.1). 5.0.x does not use `PMIx_Group_construct`.
//! - `MPI_Comm_disconnect` (dpm.c `ompi_dpm_disconnect`, l.613–665 in 5.0, l.652 in 4.1):
//!   a `PMIx_Fence` over the local and remote groups, no data — not `PMIx_Disconnect` — and
//!   only for a "dynamic" communicator, one with a process of another job id (dpm.c
//!   l.1935–1960; comm_disconnect.c l.64): within one job it makes no PMIx call at all.
//! - libpmix 4.2.2's side: publish's info holds data and directives mixed, and libpmix adds
//!   `PMIX_USERID` (src/server/pmix_server_ops.c l.1246, lookup l.1358, unpublish l.1453);
//!   a connect whose participants are all local completes inside libpmix without calling
//!   the host (l.2017); `lookup_cbfunc` packs the pdata before returning
//!   (src/server/pmix_server.c l.3231).
//! - PRRTE's data server (src/runtime/data_server/ds_lookup.c l.131–137, l.249–262): with
//!   `PMIX_WAIT` a lookup missing keys is parked until a publish supplies them; without it,
//!   none found is `PMIX_ERR_NOT_FOUND`. `PMIX_PERSIST_FIRST_READ` data is deleted when
//!   returned (l.190). Ranges matter only between jobs of a session: within one job every
//!   range is the job, so greedy ignores `PMIX_RANGE`.

use std::time::Duration;

use greedy_sys::pmix::{
    Proc, RANK_WILDCARD, Status,
    group::{self as pmix_group, GroupDone, GroupRequest, GroupResults},
    pubsub::{self, Directives, Found, LookupDone, Published},
    server::{ModexDone, OpDone},
};
use tracing::{Instrument, debug, info_span, warn};

use super::{Bridge, lock};
use crate::{
    Error,
    frame::Service,
    group::{self, GroupOp},
    names::{self, Owner, Request, Response},
};

/// Extra time an asker gives node 0 beyond the bound node 0 itself keeps, so that node 0's
/// answer naming what is missing arrives before the asker gives up.
const ANSWER_MARGIN: Duration = Duration::from_secs(10);

/// The PMIx status of a name-service answer.
fn status_of(r: &Response) -> Status {
    match r {
        Response::Done | Response::Port(_) | Response::Found(_) => Status::SUCCESS,
        Response::AlreadyPublished | Response::Exists(_) => Status::EXISTS,
        Response::Unknown | Response::Missing(_) => Status::NOT_FOUND,
        Response::NeverPublished { .. } => Status::TIMEOUT,
        Response::NotOwner { .. } => Status::NO_PERMISSIONS,
        Response::Full => Status::OUT_OF_RESOURCE,
        Response::Failed(_) => Status::ERROR,
    }
}

/// How long a lookup may wait on node 0: `None` without `PMIX_WAIT`.
fn wait_of(d: &Directives) -> Option<Duration> {
    d.wait.then(|| {
        d.timeout
            .unwrap_or(names::WAIT_DEFAULT)
            .min(names::WAIT_MAX)
    })
}

impl Bridge {
    fn owner(p: &Proc) -> Owner {
        Owner {
            nspace: p.nspace.clone(),
            rank: p.rank,
        }
    }

    /// Asks node 0's name table, at most `limit`, and hands the answer to `finish` on a tokio
    /// thread (PMIx's thread never waits).
    fn ask_names(
        &self,
        what: &'static str,
        request: Request,
        limit: Duration,
        finish: impl FnOnce(Response) + Send + 'static,
    ) {
        if let Err(why) = names::check_request(&request) {
            warn!("{what} refused: {why}");
            return finish(Response::Failed(why));
        }
        let overlay = self.overlay.clone();
        let shutdown = self.shutdown.clone();
        let body = names::encode_request(&request);
        self.tracker.spawn_on(
            async move {
                let answer = tokio::select! {
                    // Dropping `finish` drops its completion: PMIx gets an error.
                    _ = shutdown.cancelled() => return,
                    a = overlay.request_within(names::NAMES_NODE, Service::Names, body, limit) => a,
                };
                let response = match answer {
                    Ok(bytes) => names::decode_response(&bytes),
                    Err(e) => Response::Failed(format!("name service: {e}")),
                };
                if let Some(why) = response.reason() {
                    warn!("{what}: {why}");
                }
                finish(response);
            }
            .instrument(info_span!("names", what)),
            &self.runtime,
        );
    }

    /// `PMIx_Publish`: every key of `what` under `proc_`'s name, or none.
    pub(super) fn publish_names(&self, proc_: Proc, what: Published, done: OpDone) {
        if what.data.is_empty() {
            return done.complete(Status::BAD_PARAM);
        }
        let request = Request::Put {
            owner: Self::owner(&proc_),
            data: what.data,
            first_read: what.directives.persistence == Some(pubsub::PERSIST_FIRST_READ),
        };
        let limit = self.overlay_request_limit();
        let state = self.state.clone();
        self.ask_names("publish", request, limit, move |r| {
            if r == Response::Done {
                lock(&state).dynamic.published += 1;
            }
            done.complete(status_of(&r))
        });
    }

    /// `PMIx_Lookup`: the keys' values and publishers, waiting if asked to.
    pub(super) fn lookup_names(
        &self,
        proc_: Proc,
        keys: Vec<String>,
        directives: Directives,
        done: LookupDone,
    ) {
        if keys.is_empty() {
            return done.complete(Status::BAD_PARAM, Vec::new());
        }
        let wait = wait_of(&directives);
        let limit = wait.map_or(self.overlay_request_limit(), |w| w + ANSWER_MARGIN);
        let nspace = proc_.nspace;
        let state = self.state.clone();
        self.ask_names("lookup", Request::Get { keys, wait }, limit, move |r| {
            let status = status_of(&r);
            let Response::Found(items) = r else {
                return done.complete(status, Vec::new());
            };
            lock(&state).dynamic.looked_up += 1;
            let found = items
                .into_iter()
                .map(|(key, owner, value)| Found {
                    // A PMI publish has no rank: the job as a whole published it.
                    owner: owner.map_or(
                        Proc {
                            nspace: nspace.clone(),
                            rank: RANK_WILDCARD,
                        },
                        |o| Proc {
                            nspace: o.nspace,
                            rank: o.rank,
                        },
                    ),
                    key,
                    value,
                })
                .collect();
            done.complete(status, found);
        });
    }

    /// `PMIx_Unpublish`: the caller's keys (all of them when `keys` is empty).
    pub(super) fn unpublish_names(&self, proc_: Proc, keys: Vec<String>, done: OpDone) {
        let request = Request::Withdraw {
            owner: Self::owner(&proc_),
            keys,
        };
        let limit = self.overlay_request_limit();
        let state = self.state.clone();
        self.ask_names("unpublish", request, limit, move |r| {
            if r == Response::Done {
                lock(&state).dynamic.unpublished += 1;
            }
            done.complete(status_of(&r))
        });
    }

    /// The bound of a request node 0 answers at once.
    fn overlay_request_limit(&self) -> Duration {
        names::WAIT_DEFAULT
    }

    /// A fence whose participants leave out whole nodes: a subset collective carrying the
    /// blobs of the participating nodes.
    pub(super) fn subset_fence(
        &self,
        procs: Vec<Proc>,
        collect: bool,
        data: Vec<u8>,
        done: ModexDone,
    ) {
        let data = if collect { data } else { Vec::new() };
        self.subset(
            GroupOp::Fence { collect },
            procs,
            data,
            None,
            move |r| match r {
                Ok(all) => done.complete(Status::SUCCESS, all),
                Err(s) => done.complete(s, Vec::new()),
            },
        );
    }

    /// `PMIx_Connect` (`disconnect` false) or `PMIx_Disconnect`: every participant's node has
    /// called once the subset collective completes.
    pub(super) fn connect_procs(
        &self,
        procs: Vec<Proc>,
        disconnect: bool,
        timeout: Option<Duration>,
        done: OpDone,
    ) {
        let op = if disconnect {
            GroupOp::Disconnect
        } else {
            GroupOp::Connect
        };
        self.subset(op, procs, Vec::new(), timeout, move |r| {
            done.complete(r.err().unwrap_or(Status::SUCCESS))
        });
    }

    /// `PMIx_Group_construct` or `PMIx_Group_destruct` over `request.procs`: the members'
    /// servers' endpoint data concatenated, and the context id node 0 assigned if asked.
    pub(super) fn group_op(&self, request: GroupRequest, done: GroupDone) {
        let GroupRequest {
            op,
            id,
            procs,
            directives,
        } = request;
        let (op, data) = match op {
            pmix_group::GroupOp::Construct => (
                GroupOp::Construct {
                    context_id: directives.assign_context_id,
                },
                directives.endpoint_data,
            ),
            pmix_group::GroupOp::Destruct => (GroupOp::Destruct, Vec::new()),
        };
        self.subset(op, procs, data, directives.timeout, move |r| {
            let all = match r {
                Ok(all) => all,
                Err(s) => return done.failed(s),
            };
            if op == GroupOp::Destruct {
                return done.complete(Status::SUCCESS, GroupResults::default());
            }
            match group::decode_constructed(&all) {
                Ok(c) => done.complete(
                    Status::SUCCESS,
                    GroupResults {
                        context_id: c.context_id,
                        endpoint_data: c.data.to_vec(),
                    },
                ),
                Err(why) => {
                    warn!(group = %id, "{why}");
                    done.failed(Status::ERROR)
                }
            }
        });
    }

    /// Runs subset collective `op` over `procs` with this node's `data`; `finish` gets every
    /// participating node's data in node order, or the status to answer PMIx with.
    fn subset(
        &self,
        op: GroupOp,
        procs: Vec<Proc>,
        data: Vec<u8>,
        timeout: Option<Duration>,
        finish: impl FnOnce(Result<Vec<u8>, Status>) + Send + 'static,
    ) {
        let mut procs: Vec<(String, u32)> = procs.into_iter().map(|p| (p.nspace, p.rank)).collect();
        procs.sort();
        procs.dedup();
        if let Err(why) = group::nodes_in(self.overlay.served(), &procs) {
            warn!(?op, "refused: {why}");
            return finish(Err(Status::NOT_SUPPORTED));
        }
        let seq = {
            let mut st = lock(&self.state);
            let n = st.group_seq.entry((op, procs.clone())).or_insert(0);
            *n += 1;
            *n - 1
        };
        let timeout = timeout
            .unwrap_or(group::GROUP_TIMEOUT_DEFAULT)
            .min(group::GROUP_TIMEOUT_MAX);
        let body = group::encode(&group::Contribution {
            op,
            procs,
            seq,
            timeout,
            data: data.into(),
        });
        let overlay = self.overlay.clone();
        let shutdown = self.shutdown.clone();
        let state = self.state.clone();
        debug!("subset collective asked of node 0");
        self.tracker.spawn_on(
            async move {
                let answer = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    a = overlay.request_within(group::GROUP_NODE, Service::Group, body, timeout + ANSWER_MARGIN) => a,
                };
                match answer {
                    Ok(all) => {
                        let mut st = lock(&state);
                        let n = &mut st.dynamic;
                        *match op {
                            GroupOp::Fence { .. } => &mut n.subset_fences,
                            GroupOp::Connect => &mut n.connected,
                            GroupOp::Disconnect => &mut n.disconnected,
                            GroupOp::Construct { .. } => &mut n.groups_constructed,
                            GroupOp::Destruct => &mut n.groups_destructed,
                        } += 1;
                        drop(st);
                        debug!("subset collective done");
                        finish(Ok(all.to_vec()))
                    }
                    Err(e) => {
                        warn!(?op, seq, "subset collective failed: {e}");
                        let status = match &e {
                            Error::Timeout { .. } => Status::TIMEOUT,
                            Error::Refused { reason, .. } if reason.contains("never entered") => {
                                Status::TIMEOUT
                            }
                            _ => Status::ERROR,
                        };
                        finish(Err(status));
                    }
                }
            }
            .instrument(info_span!("group", ?op, seq)),
            &self.runtime,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_map_to_statuses() {
        assert_eq!(status_of(&Response::Exists("k".into())), Status::EXISTS);
        assert_eq!(status_of(&Response::Missing(vec![])), Status::NOT_FOUND);
        let never = Response::NeverPublished {
            keys: vec![],
            waited: Duration::ZERO,
        };
        assert_eq!(status_of(&never), Status::TIMEOUT);
        let not_owner = Response::NotOwner {
            key: "k".into(),
            owner: None,
        };
        assert_eq!(status_of(&not_owner), Status::NO_PERMISSIONS);
    }

    #[test]
    fn waits_follow_the_directives() {
        let mut d = Directives::default();
        assert_eq!(wait_of(&d), None);
        d.wait = true;
        assert_eq!(wait_of(&d), Some(names::WAIT_DEFAULT));
        d.timeout = Some(Duration::from_secs(600));
        assert_eq!(wait_of(&d), Some(Duration::from_secs(600)));
        d.timeout = Some(Duration::from_secs(1 << 20));
        assert_eq!(wait_of(&d), Some(names::WAIT_MAX));
    }
}
