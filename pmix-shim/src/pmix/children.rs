//! Spawned namespaces (`PMIx_Spawn`, Open MPI's `MPI_Comm_spawn`): the request handed to the embedder, and each child namespace served beside its family.
//!
//! - **Spawn**: libpmix calls `spawn` with the requester and one app per program
//!   (greedy-sys [`App`]); the requester's namespace turns them into one
//!   [`SpawnRequest`] (program = `cmd`, arguments = `argv` without argv\[0\], `maxprocs`, the
//!   app's `env`, cwd from `cwd` or `PMIX_WDIR`, hosts from `PMIX_HOST` or Open MPI's `host`
//!   info, comma-separated) and asks the embedder on the tokio runtime; PMIx hears the child
//!   namespace once every child runs, or `PMIX_ERROR` with a warning naming why
//!   (`PMIX_ERR_TIMEOUT` past the job info's `PMIX_TIMEOUT`, if any). Open MPI 5
//!   sends the parent's working directory as `PMIX_WDIR` when the user gave none
//!   (ompi/dpm/dpm.c@v5.0.10 l.1560–1578).
//! - **Child** ([`PmixServer::add_child`], on every node of the overlay, before any child
//!   rank starts): a namespace over the parent's host and overlay
//!   ([`PmixServer::add_namespace`]'s machinery), registered with `PMIX_SPAWNED`, its apps'
//!   count, and per rank `PMIX_APPNUM`/`PMIX_APPLDR`/`PMIX_APP_RANK` from its app and
//!   `PMIX_PARENT_ID` = the requester (as PRRTE, pmix_server_register_fns.c@v3.0.13
//!   l.541–543). Its bindings are not reported (children are forked after registration). It is
//!   kept in the job's server keyed by namespace, shares the family's way to the spawner (a
//!   child may spawn again) and ends with the job's server.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use greedy_sys::pmix::{
    Proc, Status,
    info::{Value, key},
    pubsub::Datum,
    spawn::{App, SpawnDone},
};
use tracing::{Instrument, debug, info_span, warn};

use super::{Binding, Bridge, PmixServer, Ties, lock_children};
use crate::{
    Error, NamespaceSpec,
    child::{ChildJob, SpawnApp, SpawnRequest},
    departures::Departures,
};

/// Open MPI's own name of the `host` info key when it passes it untranslated.
const OMPI_HOST: &str = "host";

/// The string value of info `key` among `info`, if any.
fn info_str<'a>(info: &'a [(String, Datum)], key: &str) -> Option<&'a str> {
    info.iter().find_map(|(k, v)| match v {
        Datum::Str(s) if k == key => Some(s.as_str()),
        _ => None,
    })
}

/// The spawn's `PMIX_TIMEOUT` (seconds; 0 or absent: none): the requester gives up then,
/// whatever the embedder does later (its answer goes nowhere).
fn timeout_of(job_info: &[(String, Datum)]) -> Option<Duration> {
    let want = key::TIMEOUT.to_str().ok()?;
    let secs = job_info
        .iter()
        .find(|(k, _)| k == want)
        .and_then(|(_, v)| match v {
            Datum::Int(n) | Datum::I32(n) => u64::try_from(*n).ok(),
            Datum::U32(n) => Some(u64::from(*n)),
            Datum::I64(n) => u64::try_from(*n).ok(),
            Datum::U64(n) | Datum::Size(n) => Some(*n),
            _ => None,
        })?;
    (secs > 0).then(|| Duration::from_secs(secs))
}

/// One app as the embedder's request wants it.
fn spawn_app(app: App) -> SpawnApp {
    fn text(k: &'static std::ffi::CStr) -> &'static str {
        k.to_str().unwrap_or_default()
    }
    let cwd = app
        .cwd
        .clone()
        .or_else(|| info_str(&app.info, text(key::WDIR)).map(str::to_string));
    let hosts = info_str(&app.info, text(key::HOST))
        .or_else(|| info_str(&app.info, OMPI_HOST))
        .map(|h| {
            h.split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    SpawnApp {
        program: app.cmd,
        args: app.argv.into_iter().skip(1).collect(),
        maxprocs: app.maxprocs,
        env: app.env,
        cwd,
        hosts,
        path: None,
    }
}

/// `requester`'s `PMIx_Spawn` of `apps` as one request; `Err` says why it cannot be one.
pub(super) fn spawn_request(requester: &Proc, apps: Vec<App>) -> Result<SpawnRequest, String> {
    if apps.is_empty() {
        return Err("no application to start".into());
    }
    if let Some(bad) = apps.iter().find(|a| a.cmd.is_empty() || a.maxprocs == 0) {
        return Err(format!(
            "application {:?} asks for {} processes",
            bad.cmd, bad.maxprocs
        ));
    }
    Ok(SpawnRequest {
        parent: requester.nspace.clone(),
        requester: requester.rank,
        family: crate::family::Family::Pmix,
        apps: apps.into_iter().map(spawn_app).collect(),
        preput: Vec::new(),
    })
}

impl Bridge {
    /// `PMIx_Spawn`: asks the embedder (never on PMIx's thread) and answers with the child
    /// namespace once it runs.
    pub(super) fn spawn_apps(
        &self,
        requester: Proc,
        job_info: Vec<(String, Datum)>,
        apps: Vec<App>,
        done: SpawnDone,
    ) {
        let limit = timeout_of(&job_info);
        let rank = requester.rank;
        let request = match spawn_request(&requester, apps) {
            Ok(r) => r,
            Err(why) => {
                warn!(rank, "spawn refused: {why}");
                return done.failed(Status::BAD_PARAM);
            }
        };
        let spawns = self.spawns.clone();
        let shutdown = self.shutdown.clone();
        debug!(rank, procs = request.total_procs(), "PMIx_Spawn asked");
        self.tracker.spawn_on(
            async move {
                let asked = async {
                    match limit {
                        Some(l) => tokio::time::timeout(l, spawns.ask(request)).await.ok(),
                        None => Some(spawns.ask(request).await),
                    }
                };
                let answer = tokio::select! {
                    // Dropping `done` answers PMIx with an error.
                    _ = shutdown.cancelled() => return,
                    a = asked => a,
                };
                match answer {
                    Some(Ok(nspace)) => {
                        debug!(%nspace, "PMIx_Spawn answered");
                        done.started(&nspace)
                    }
                    Some(Err(why)) => {
                        warn!(rank, "spawn failed: {why}");
                        done.failed(Status::ERROR);
                    }
                    None => {
                        warn!(
                            rank,
                            "spawn not answered within the client's PMIX_TIMEOUT ({limit:?})"
                        );
                        done.failed(Status::TIMEOUT);
                    }
                }
            }
            .instrument(info_span!("spawn", rank)),
            &self.runtime,
        );
    }
}

/// Replaces a child rank's app keys (a job's are app 0's) by its app's, and names its parent.
pub(super) fn child_keys(
    data: &mut Vec<(&'static std::ffi::CStr, Value)>,
    child: &ChildJob,
    rank: u32,
) {
    let (appnum, first) = child
        .app_of(rank)
        .map_or((0, 0), |(i, a)| (i as u32, a.first_rank));
    data.retain(|(k, _)| ![key::APPNUM, key::APPLDR, key::APP_RANK].contains(k));
    data.extend([
        (key::APPNUM, Value::U32(appnum)),
        (key::APPLDR, Value::Rank(first)),
        (key::APP_RANK, Value::Rank(rank - first)),
        (
            key::PARENT_ID,
            Value::Proc(Proc {
                nspace: child.parent.clone(),
                rank: child.requester,
            }),
        ),
    ]);
}

/// How long a child's registration may take at most, whatever the job's setting.
const CHILD_REGISTER_MIN: Duration = Duration::from_secs(5);

impl PmixServer {
    /// Serves spawned job `child` on this node beside this namespace, over the same host and
    /// overlay (registered with no local process where it has no rank here; its ranks'
    /// `PMIX_PARENT_ID` the requester). Call it on every node before any child rank starts.
    pub async fn add_child(&self, child: &ChildJob) -> Result<(), Error> {
        let inner = &self.inner;
        if lock_children(inner).contains_key(&child.nspace) {
            return Err(Error::InvalidJob {
                job: child.nspace.clone(),
                reason: format!("node {}: spawned twice", inner.job.node_idx),
            });
        }
        let ns = NamespaceSpec::on_overlay(&inner.job, &child.nspace, child.ranks.clone())?;
        let config = super::NamespaceConfig {
            register_timeout: inner.config.register_timeout.max(CHILD_REGISTER_MIN),
            exit_grace: inner.config.exit_grace,
            binding: Binding::Known(BTreeMap::new()),
            universe: inner.config.universe,
            log_output: None,
        };
        // The family's processes here so far: the job's and its earlier children's.
        let earlier: usize = (lock_children(inner).values())
            .map(|c| c.inner.job.local_ranks().len())
            .sum();
        let ties = Ties {
            departures: Departures::default(),
            spawns: inner.spawns.clone(),
            child: Some(Arc::new(child.clone())),
            shares_overlay: true,
            neighbours: inner.job.local_ranks().len() + earlier,
        };
        let host = inner.host.clone();
        let served =
            PmixServer::open(host, false, &ns, inner.overlay.clone(), config, ties).await?;
        lock_children(inner).insert(child.nspace.clone(), served);
        Ok(())
    }

    /// The served child namespace `nspace`.
    fn child(&self, nspace: &str) -> Result<PmixServer, Error> {
        lock_children(&self.inner)
            .get(nspace)
            .cloned()
            .ok_or_else(|| Error::InvalidJob {
                job: nspace.into(),
                reason: format!(
                    "node {}: no spawned namespace of that name here",
                    self.inner.job.node_idx
                ),
            })
    }

    /// As [`PmixServer::env_for`], for local `rank` of child namespace `nspace`.
    pub async fn child_env(&self, nspace: &str, rank: u32) -> Result<Vec<(String, String)>, Error> {
        self.child(nspace)?.env_for(rank).await
    }

    /// As [`PmixServer::rank_exited`], for local `rank` of child namespace `nspace` (an exit
    /// before `PMIx_Finalize` aborts the family, naming the namespace, rank and host).
    pub async fn child_exited(&self, nspace: &str, rank: u32, code: i32) {
        match self.child(nspace) {
            Ok(c) => c.rank_exited(rank, code).await,
            Err(e) => warn!(rank, code, "exit of a rank not served: {e}"),
        }
    }

    /// The spawned namespaces served here, sorted.
    pub fn children(&self) -> Vec<String> {
        let mut names: Vec<String> = lock_children(&self.inner).keys().cloned().collect();
        names.sort();
        names
    }

    /// The family's spawn requests (`PMIx_Spawn` of this namespace's ranks and of its
    /// children's), for an embedder that runs [`PmixServer`] itself; `Some` once. Under
    /// [`crate::node::NodeService`] the node service has taken them already.
    pub fn take_spawns(&self) -> Option<tokio::sync::mpsc::Receiver<crate::child::PendingSpawn>> {
        self.inner.spawns.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(info: Vec<(String, Datum)>, cwd: Option<&str>) -> App {
        App {
            cmd: "/bin/prog".into(),
            argv: vec!["/bin/prog".into(), "-v".into()],
            env: vec![("OMPI_PARENT_PORT".into(), "p".into())],
            cwd: cwd.map(Into::into),
            maxprocs: 2,
            info,
        }
    }

    #[test]
    fn apps_become_the_request_with_hosts_and_wdir_from_their_info() {
        let me = Proc {
            nspace: "j".into(),
            rank: 1,
        };
        let info = vec![
            ("pmix.host".into(), Datum::Str("a, b,".into())),
            ("pmix.wdir".into(), Datum::Str("/w".into())),
        ];
        let req = spawn_request(
            &me,
            vec![
                app(info, None),
                app(vec![("host".into(), Datum::Str("c".into()))], Some("/x")),
            ],
        )
        .unwrap();
        assert_eq!((req.parent.as_str(), req.requester), ("j", 1));
        let a = &req.apps[0];
        assert_eq!(a.program, "/bin/prog");
        assert_eq!(a.args, ["-v"]);
        assert_eq!(a.hosts, ["a", "b"]);
        assert_eq!(a.cwd.as_deref(), Some("/w"));
        assert_eq!(a.env, [("OMPI_PARENT_PORT".to_string(), "p".to_string())]);
        assert_eq!(req.apps[1].hosts, ["c"]);
        assert_eq!(req.apps[1].cwd.as_deref(), Some("/x"));
        assert!(req.preput.is_empty());
        assert!(spawn_request(&me, vec![]).is_err());
        let none = App {
            maxprocs: 0,
            ..app(vec![], None)
        };
        assert!(
            spawn_request(&me, vec![none])
                .unwrap_err()
                .contains("0 processes")
        );
    }

    #[test]
    fn the_clients_timeout_bounds_the_wait() {
        let t = |v| timeout_of(&[("pmix.timeout".into(), v)]);
        assert_eq!(t(Datum::Int(600)), Some(Duration::from_secs(600)));
        assert_eq!(t(Datum::U32(5)), Some(Duration::from_secs(5)));
        assert_eq!(t(Datum::Int(0)), None);
        assert_eq!(t(Datum::Int(-1)), None);
        assert_eq!(t(Datum::Str("5".into())), None);
        assert_eq!(timeout_of(&[]), None);
    }

    #[test]
    fn a_child_rank_gets_its_apps_keys_and_its_parent() {
        let child = ChildJob {
            nspace: "j.1".into(),
            parent: "j".into(),
            requester: 3,
            ranks: vec![vec![0], vec![1, 2]],
            apps: vec![
                crate::child::ChildApp {
                    first_rank: 0,
                    argv: vec!["a".into()],
                    env: vec![],
                    cwd: None,
                },
                crate::child::ChildApp {
                    first_rank: 1,
                    argv: vec!["b".into()],
                    env: vec![],
                    cwd: None,
                },
            ],
            preput: vec![],
        };
        let mut data = vec![
            (key::RANK, Value::Rank(2)),
            (key::APPNUM, Value::U32(0)),
            (key::APPLDR, Value::Rank(0)),
            (key::APP_RANK, Value::Rank(2)),
        ];
        child_keys(&mut data, &child, 2);
        let get = |k| data.iter().find(|(x, _)| *x == k).map(|(_, v)| v.clone());
        assert_eq!(get(key::APPNUM), Some(Value::U32(1)));
        assert_eq!(get(key::APPLDR), Some(Value::Rank(1)));
        assert_eq!(get(key::APP_RANK), Some(Value::Rank(1)));
        assert_eq!(
            get(key::PARENT_ID),
            Some(Value::Proc(Proc {
                nspace: "j".into(),
                rank: 3
            }))
        );
        assert_eq!(data.len(), 5);
    }
}
