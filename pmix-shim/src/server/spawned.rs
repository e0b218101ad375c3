//! The PMI server's side of spawned jobs: a rank's request on its way to the embedder, a spawned job's namespace, and its fences over the nodes hosting its ranks.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::{NodeState, Notice, Ns, Shared};
use crate::{
    Error, JobSpec,
    child::{ChildJob, SpawnApp, SpawnRequest},
    frame::Service,
    group::{self, GroupOp},
    spawn,
};

/// How much longer than the fence's own bound a node waits for node 0's answer.
const ANSWER_MARGIN: Duration = Duration::from_secs(10);

/// What rank `rank` of namespace `parent` asked for, as the embedder takes it: the info
/// keys MPICH and hydra honour (`host`/`hosts`, `wdir`, `path`) become the app's hosts,
/// working directory and program path; others are ignored, as hydra does.
pub(super) fn request(parent: &str, rank: u32, request: spawn::Request) -> SpawnRequest {
    let apps = request
        .commands
        .into_iter()
        .map(|c| {
            let mut app = SpawnApp {
                program: c.program,
                args: c.args,
                maxprocs: c.maxprocs,
                env: Vec::new(),
                cwd: None,
                hosts: Vec::new(),
                path: None,
            };
            for (key, value) in c.info {
                match key.as_str() {
                    "host" | "hosts" => app.hosts.extend(
                        value
                            .split([',', ' '])
                            .filter(|h| !h.is_empty())
                            .map(str::to_owned),
                    ),
                    "wdir" => app.cwd = Some(value),
                    "path" => app.path = Some(value),
                    _ => {}
                }
            }
            app
        })
        .collect();
    SpawnRequest {
        parent: parent.to_owned(),
        requester: rank,
        family: crate::family::Family::Pmi,
        apps,
        preput: request.preput,
    }
}

/// Asks the embedder to start `request` and hands the answer to the asking rank's handler.
pub(super) async fn ask(shared: Arc<Shared>, request: SpawnRequest, to: mpsc::Sender<Notice>) {
    let (parent, rank, procs) = (
        request.parent.clone(),
        request.requester,
        request.total_procs(),
    );
    let answer = tokio::select! {
        _ = shared.shutdown.cancelled() => return,
        a = shared.spawns.ask(request) => a,
    };
    match &answer {
        Ok(child) => info!(%parent, rank, procs, %child, "spawned"),
        // `GREEDY_LOG=warn` shows it: the program's MPI error may not say why.
        Err(why) => warn!(%parent, rank, procs, "MPI_Comm_spawn refused: {why}"),
    }
    let _ = to.send(Notice::Spawned(answer)).await;
}

/// Spawned job `child` as this node of `job`'s overlay serves it: its KVS holds the
/// preput keys from the start.
pub(super) fn namespace(job: &JobSpec, child: &ChildJob) -> Result<Ns, Error> {
    let spec = JobSpec {
        job_id: child.nspace.clone(),
        hosts: job.hosts.clone(),
        node_idx: job.node_idx,
        model: job.model,
        ranks: child.ranks.clone(),
        secret: job.secret.clone(),
    };
    // Nodes without its ranks are normal: it runs where the embedder placed it.
    spec.check(true)?;
    let app_starts: Vec<u32> = child.apps.iter().map(|a| a.first_rank).collect();
    if app_starts.first().is_some_and(|&f| f != 0) || !app_starts.is_sorted() {
        return Err(Error::InvalidJob {
            job: child.nspace.clone(),
            reason: format!("apps' first ranks {app_starts:?} do not start at 0 in order"),
        });
    }
    let state = NodeState {
        kvs: child.preput.iter().cloned().collect(),
        ..NodeState::default()
    };
    Ok(Ns {
        mapping: mapping(&spec),
        spec: Arc::new(spec),
        spawner: Some(child.parent.clone()),
        origin: None,
        app_starts,
        state: std::sync::Mutex::new(state),
    })
}

/// `spec`'s `PMI_process_mapping` over the nodes hosting its ranks only, numbered from 0 in
/// overlay order: MPICH counts a node for every number up to the highest, and a node of its
/// job without any of its ranks would make no sense to it.
fn mapping(spec: &JobSpec) -> String {
    let hosting = JobSpec {
        ranks: spec
            .ranks
            .iter()
            .filter(|r| !r.is_empty())
            .cloned()
            .collect(),
        node_idx: 0,
        ..spec.clone()
    };
    hosting.process_mapping()
}

/// Fence `generation` of spawned job `ns` with this node's `blob`: every hosting node's
/// blob in node order, gathered by node 0 over those nodes only. A failure aborts the job.
pub(super) async fn fence(
    shared: &Shared,
    ns: &Ns,
    generation: u64,
    blob: Bytes,
) -> Result<Vec<Bytes>, Error> {
    let timeout = shared.config.fence_timeout.min(group::GROUP_TIMEOUT_MAX);
    let body = group::encode(&group::Contribution {
        op: GroupOp::Fence { collect: true },
        procs: vec![(ns.id().to_owned(), group::WILDCARD)],
        seq: generation,
        timeout,
        data: blob,
    });
    let answer = tokio::select! {
        _ = shared.shutdown.cancelled() => return Err(Error::Shutdown { node: shared.job.node_idx }),
        a = shared.overlay.request_within(group::GROUP_NODE, Service::Group, body, timeout + ANSWER_MARGIN) => a,
    };
    let all = match answer {
        Ok(all) => all,
        Err(e) => {
            let reason = format!(
                "node {} spawned job {} fence #{generation}: {e}",
                shared.job.node_idx,
                ns.id()
            );
            shared.abort(None, 1, reason).await;
            return Err(e);
        }
    };
    split(&all).map_err(|reason| Error::InvalidJob {
        job: ns.id().to_owned(),
        reason,
    })
}

/// The hosting nodes' blobs, which node 0 sent back to back.
fn split(mut all: &[u8]) -> Result<Vec<Bytes>, String> {
    let mut blobs = Vec::new();
    while !all.is_empty() {
        let (_, rest) = postcard::take_from_bytes::<Vec<(String, String)>>(all)
            .map_err(|e| format!("undecodable fence answer: {e}"))?;
        let used = all.len() - rest.len();
        blobs.push(Bytes::copy_from_slice(&all[..used]));
        all = rest;
    }
    Ok(blobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_keys_become_hosts_directory_and_path() {
        let asked = spawn::Request {
            commands: vec![spawn::Command {
                program: "./a".into(),
                maxprocs: 2,
                args: vec!["-x".into()],
                info: vec![
                    ("hosts".into(), "n1,n2".into()),
                    ("wdir".into(), "/tmp".into()),
                    ("path".into(), "/opt/bin".into()),
                    ("soft".into(), "1:2".into()),
                ],
            }],
            preput: vec![("PARENT_ROOT_PORT_NAME".into(), "p".into())],
        };
        let r = request("j", 3, asked);
        assert_eq!((r.parent.as_str(), r.requester), ("j", 3));
        let app = &r.apps[0];
        assert_eq!(app.hosts, ["n1", "n2"]);
        assert_eq!(app.cwd.as_deref(), Some("/tmp"));
        assert_eq!(app.path.as_deref(), Some("/opt/bin"));
        assert_eq!(
            (app.maxprocs, app.args.as_slice()),
            (2, &["-x".to_string()][..])
        );
        assert_eq!(r.preput, [("PARENT_ROOT_PORT_NAME".into(), "p".into())]);
    }

    fn child(ranks: Vec<Vec<u32>>, firsts: &[u32]) -> ChildJob {
        let app = |&first_rank: &u32| crate::child::ChildApp {
            first_rank,
            argv: vec!["a".into()],
            env: vec![],
            cwd: None,
        };
        ChildJob {
            nspace: "j.1".into(),
            parent: "j".into(),
            requester: 0,
            ranks,
            apps: firsts.iter().map(app).collect(),
            preput: vec![("PARENT_ROOT_PORT_NAME".into(), "p".into())],
        }
    }

    fn job() -> JobSpec {
        JobSpec {
            job_id: "j".into(),
            hosts: vec!["h0".into(), "h1".into(), "h2".into()],
            node_idx: 1,
            model: Default::default(),
            ranks: vec![vec![0], vec![1], vec![2]],
            secret: crate::JobSecret::generate(),
        }
    }

    #[test]
    fn a_child_namespace_starts_with_its_preput_keys_and_maps_its_own_nodes() {
        let ns = namespace(&job(), &child(vec![vec![], vec![0, 1], vec![2]], &[0, 2])).unwrap();
        assert_eq!(ns.spec.local_ranks(), [0, 1]);
        assert_eq!(ns.spawner.as_deref(), Some("j"));
        assert_eq!(ns.app_starts, [0, 2]);
        assert_eq!(
            ns.lock()
                .kvs
                .get("PARENT_ROOT_PORT_NAME")
                .map(String::as_str),
            Some("p")
        );
        // Node 0 hosts none of its ranks: its mapping counts two nodes, not three.
        assert_eq!(ns.mapping, "(vector,(0,1,2),(1,1,1))");
        let bad = |c: ChildJob| namespace(&job(), &c).unwrap_err().to_string();
        assert!(bad(child(vec![vec![0], vec![0], vec![]], &[0])).contains("placed twice"));
        assert!(bad(child(vec![vec![0], vec![1], vec![]], &[1])).contains("do not start at 0"));
        assert!(bad(child(vec![vec![], vec![], vec![]], &[0])).contains("no ranks"));
    }

    #[test]
    fn a_fence_answer_splits_into_node_blobs() {
        let a = postcard::to_stdvec(&vec![("k".to_string(), "v".to_string())]).unwrap();
        let b = postcard::to_stdvec(&Vec::<(String, String)>::new()).unwrap();
        let all = [a.clone(), b.clone()].concat();
        assert_eq!(split(&all).unwrap(), [Bytes::from(a), Bytes::from(b)]);
        assert!(split(&[0xff]).is_err());
    }
}
