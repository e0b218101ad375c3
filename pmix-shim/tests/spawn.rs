//! `MPI_Comm_spawn` over PMI-1 and PMI-2: node services on loopback with a test embedder that
//! takes their spawn requests, adds the child job on every node, forks it and answers.
//!
//! The scripted test speaks PMI-1 itself (a spawned job's own KVS seeded with the preput keys,
//! its fences independent of the job's, names shared by the family, a child's exit before
//! finalize ending the family); the MPI tests run `tests/mpi/spawn.c` with MPICH 5 and Intel
//! MPI 2021 (the PyPI wheels of tests/mpi/clients.sh, skipped where absent), whose children
//! connect back to their parents through the preput port with the library's own netmod.
//! Everything has a deadline; processes are killed on drop.

mod common;

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use command_fds::{CommandFdExt, FdMapping};
use greedy_pmix::{
    AbortInfo, JobSecret, JobSpec,
    child::{ChildApp, ChildJob, PendingSpawn, SpawnOrigin},
    family::Family,
    node::{NodeConfig, NodeService, RankWireup},
    peer::JobProcesses,
    rendezvous::Memory,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::UnixStream,
    process::Command,
};
use tokio_util::sync::CancellationToken;

/// Generous: busy-polling MPICH ranks share 2 cores with other builds.
const DEADLINE: Duration = Duration::from_secs(120);

fn admit_this_process() -> JobProcesses {
    let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    JobProcesses::descendants_of(std::os::unix::process::parent_id(), uid.unwrap())
}

/// A job's node services on loopback, PMI only.
async fn services(job_id: &str, ranks: &[Vec<u32>]) -> Vec<NodeService> {
    services_from(job_id, ranks, None).await
}

/// [`services`] of a job that `origin`'s spawner spawned, served as a job of its own.
async fn services_from(
    job_id: &str,
    ranks: &[Vec<u32>],
    origin: Option<SpawnOrigin>,
) -> Vec<NodeService> {
    let (board, secret) = (Memory::default(), JobSecret::generate());
    let mut out = Vec::new();
    for node_idx in 0..ranks.len() {
        let mut config = NodeConfig::new(
            "127.0.0.1".parse().unwrap(),
            admit_this_process(),
            &[Family::Pmi],
        )
        .unwrap();
        config.overlay.collective_timeout = Duration::from_secs(60);
        config.pmi.origin = origin.clone();
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move { while rx.recv().await.is_some() {} });
        let spec = JobSpec {
            job_id: job_id.into(),
            hosts: (0..ranks.len()).map(|i| format!("h{i}")).collect(),
            node_idx,
            model: Default::default(),
            ranks: ranks.to_vec(),
            secret: secret.clone(),
        };
        let stop = CancellationToken::new();
        let service = NodeService::start(&spec, config, board.clone(), &stop, tx);
        out.push(service.await.expect("service starts"));
    }
    out
}

async fn stop(services: &[NodeService]) {
    for s in services {
        s.shutdown().await;
    }
}

fn var<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
    env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

fn socket(wireup: RankWireup) -> UnixStream {
    let s = std::os::unix::net::UnixStream::from(wireup.pmi_fd.expect("PMI is served"));
    s.set_nonblocking(true).unwrap();
    UnixStream::from_std(s).unwrap()
}

async fn line(s: &mut UnixStream) -> String {
    let mut out = Vec::new();
    loop {
        let mut b = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut b))
            .await
            .expect("a reply within 10 s")
            .unwrap();
        if b[0] == b'\n' {
            return String::from_utf8(out).unwrap();
        }
        out.push(b[0]);
    }
}

async fn ask(s: &mut UnixStream, text: &str) -> String {
    s.write_all(text.as_bytes()).await.unwrap();
    line(s).await
}

/// Sends a PMI-2 command body and returns the reply's body.
async fn ask2(s: &mut UnixStream, body: &str) -> String {
    s.write_all(format!("{:<6}{body}", body.len()).as_bytes())
        .await
        .unwrap();
    let mut len = [0u8; 6];
    let within = Duration::from_secs(10);
    tokio::time::timeout(within, s.read_exact(&mut len))
        .await
        .expect("a reply within 10 s")
        .unwrap();
    let len: usize = std::str::from_utf8(&len).unwrap().trim().parse().unwrap();
    let mut reply = vec![0u8; len];
    s.read_exact(&mut reply).await.unwrap();
    String::from_utf8(reply).unwrap()
}

async fn abort_of(node: &NodeService) -> AbortInfo {
    let mut aborted = node.overlay().aborted();
    tokio::time::timeout(Duration::from_secs(10), aborted.wait_for(Option::is_some))
        .await
        .expect("an abort within 10 s")
        .unwrap()
        .clone()
        .unwrap()
}

/// A child job of `n` ranks, rank `r` on node `r % nodes`, seeded with `preput`.
fn child_job(nspace: &str, parent: &str, nodes: usize, n: u32, argv: Vec<String>) -> ChildJob {
    let mut ranks = vec![Vec::new(); nodes];
    for r in 0..n {
        ranks[r as usize % nodes].push(r);
    }
    ChildJob {
        nspace: nspace.into(),
        parent: parent.into(),
        requester: 0,
        ranks,
        apps: vec![ChildApp {
            first_rank: 0,
            argv,
            env: vec![],
            cwd: None,
        }],
        preput: vec![],
    }
}

/// Without a launcher above the nodes (a Slurm step), the requester's node adds a child on
/// every node itself: each then serves its ranks; a node that cannot is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_adds_a_child_on_every_node() {
    let job = "everywhere";
    let nodes = services(job, &[vec![0], vec![1], vec![2]]).await;
    let child = child_job("everywhere@1", job, 3, 4, vec!["./kid".into()]);
    let limit = Duration::from_secs(10);
    nodes[1].add_child_everywhere(&child, limit).await.unwrap();
    for r in 0..4u32 {
        let node = &nodes[r as usize % 3];
        let w = node.child_env(&child.nspace, r, Some(3)).await.unwrap();
        assert_eq!(var(&w.env, "PMI_JOBID"), Some(child.nspace.as_str()));
        assert_eq!(var(&w.env, "PMI_RANK"), Some(r.to_string().as_str()));
    }
    // A child placed on a fourth node, which the job does not have: refused, never a hang.
    let beyond = child_job("everywhere@2", job, 4, 4, vec!["./kid".into()]);
    let err = nodes[0]
        .add_child_everywhere(&beyond, limit)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("4 rank lists"), "{err}");
    // A node that cannot serve it (gone) is named.
    nodes[2].shutdown().await;
    let late = child_job("everywhere@3", job, 3, 3, vec!["./kid".into()]);
    let quick = Duration::from_secs(1);
    let err = nodes[0]
        .add_child_everywhere(&late, quick)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("node 2 could not serve it"),
        "{err}"
    );
    stop(&nodes).await;
}

/// A nested step under srun is a job of its own whose ranks are told what a child's are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_spawned_as_a_job_of_its_own_is_told_its_spawner_appnums_and_preput_keys() {
    let origin = SpawnOrigin {
        spawner: "7.0".into(),
        preput: vec![("PARENT_ROOT_PORT_NAME".into(), "port#9".into())],
        app_starts: vec![0, 1],
    };
    let job = "7.1";
    let nodes = services_from(job, &[vec![0], vec![1]], Some(origin)).await;
    let w = nodes[0].env_for(0, Some(3)).await.unwrap();
    assert_eq!(var(&w.env, "PMI_SPAWNED"), Some("1"));
    let mut pmi1 = socket(w);
    ask(&mut pmi1, "cmd=init pmi_version=1 pmi_subversion=1\n").await;
    let port = format!("cmd=get kvsname={job} key=PARENT_ROOT_PORT_NAME\n");
    assert_eq!(
        ask(&mut pmi1, &port).await,
        "cmd=get_result rc=0 msg=success value=port#9"
    );
    let mut pmi2 = socket(nodes[1].env_for(1, Some(3)).await.unwrap());
    ask(&mut pmi2, "cmd=init pmi_version=2 pmi_subversion=0\n").await;
    let init = ask2(&mut pmi2, "cmd=fullinit;pmirank=1;").await;
    assert!(
        init.contains(";rank=1;size=2;appnum=1;") && init.ends_with(";spawner-jobid=7.0;"),
        "{init}"
    );
    // An unspawned job's ranks hear none of it.
    let plain = services("8.0", &[vec![0]]).await;
    let w = plain[0].env_for(0, Some(3)).await.unwrap();
    assert_eq!(var(&w.env, "PMI_SPAWNED"), None);
    stop(&plain).await;
    stop(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawned_job_has_its_own_kvs_and_fences_and_shares_the_family_names() {
    let job = "spawn-scripted";
    let nodes = services(job, &[vec![0], vec![1]]).await;
    let mut spawns = nodes[0].take_spawns().expect("spawns taken once");
    assert!(nodes[0].take_spawns().is_none());
    let mut parents = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        let mut c = socket(node.env_for(n as u32, Some(3)).await.unwrap());
        ask(&mut c, "cmd=init pmi_version=1 pmi_subversion=1\n").await;
        let put = format!("cmd=put kvsname={job} key=pk value=parent{n}\n");
        assert_eq!(ask(&mut c, &put).await, "cmd=put_result rc=0 msg=success");
        parents.push(c);
    }
    assert_eq!(
        ask(
            &mut parents[0],
            "cmd=publish_name service=svc port=p-of-parent\n"
        )
        .await,
        "cmd=publish_result rc=0 msg=success"
    );
    // Parent rank 0 asks; the embedder adds the child on every node, then answers.
    let block = "mcmd=spawn\nnprocs=3\nexecname=./kid\ntotspawns=1\nspawnssofar=1\nargcnt=1\n\
                 arg1=two words\npreput_num=1\npreput_key_0=PARENT_ROOT_PORT_NAME\n\
                 preput_val_0=port#0\ninfo_num=1\ninfo_key_0=wdir\ninfo_val_0=/tmp\nendcmd\n";
    parents[0].write_all(block.as_bytes()).await.unwrap();
    let pending: PendingSpawn = tokio::time::timeout(Duration::from_secs(10), spawns.recv())
        .await
        .expect("the request within 10 s")
        .unwrap();
    let asked = &pending.request;
    assert_eq!((asked.parent.as_str(), asked.requester), (job, 0));
    assert_eq!(asked.apps[0].args, ["two words"]);
    assert_eq!(asked.apps[0].cwd.as_deref(), Some("/tmp"));
    let mut child = child_job("spawn-scripted.1", job, 2, 3, vec!["./kid".into()]);
    child.preput = asked.preput.clone();
    // Two programs (`MPI_Comm_spawn_multiple`): rank 2 runs the second, appnum 1.
    let second = ChildApp {
        first_rank: 2,
        ..child.apps[0].clone()
    };
    child.apps.push(second);
    for node in &nodes {
        node.add_child(&child).await.expect("child added");
        node.add_child(&child)
            .await
            .expect("adding it again is a no-op");
    }
    let mut kids = Vec::new();
    for r in 0..3u32 {
        let node = &nodes[r as usize % 2];
        let w = node.child_env(&child.nspace, r, Some(3)).await.unwrap();
        assert_eq!(var(&w.env, "PMI_SPAWNED"), Some("1"));
        assert_eq!(var(&w.env, "PMI_JOBID"), Some(child.nspace.as_str()));
        assert_eq!(var(&w.env, "PMI_SIZE"), Some("3"));
        assert_eq!(var(&w.env, "PMI_RANK"), Some(r.to_string().as_str()));
        kids.push(socket(w));
    }
    let mut pmi2_kid = kids.pop().unwrap();
    assert!(nodes[0].child_env(&child.nspace, 0, Some(3)).await.is_err());
    pending.started(child.nspace.clone());
    assert_eq!(
        line(&mut parents[0]).await,
        "cmd=spawn_result rc=0 errcodes=0,0,0"
    );

    // The children fence among themselves while the parents are not fencing.
    let ns = &child.nspace;
    for (r, kid) in kids.iter_mut().enumerate() {
        ask(kid, "cmd=init pmi_version=1 pmi_subversion=1\n").await;
        assert_eq!(
            ask(kid, "cmd=get_appnum\n").await,
            "cmd=appnum rc=0 appnum=0"
        );
        assert_eq!(
            ask(kid, "cmd=get_my_kvsname\n").await,
            format!("cmd=my_kvsname rc=0 kvsname={ns}")
        );
        let port = format!("cmd=get kvsname={ns} key=PARENT_ROOT_PORT_NAME\n");
        assert_eq!(
            ask(kid, &port).await,
            "cmd=get_result rc=0 msg=success value=port#0"
        );
        let put = format!("cmd=put kvsname={ns} key=ck value=kid{r}\n");
        assert_eq!(ask(kid, &put).await, "cmd=put_result rc=0 msg=success");
        kid.write_all(b"cmd=barrier_in\n").await.unwrap();
    }
    // Rank 2 speaks PMI-2: it learns its spawner, and fences with the PMI-1 ranks.
    let c = &mut pmi2_kid;
    assert_eq!(
        ask(c, "cmd=init pmi_version=2 pmi_subversion=0\n").await,
        "cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0"
    );
    let init = ask2(c, "cmd=fullinit;pmirank=2;").await;
    assert!(
        init.contains(";rank=2;size=3;appnum=1;")
            && init.ends_with(&format!(";spawner-jobid={job};")),
        "{init}"
    );
    let port = ask2(c, "cmd=kvs-get;key=PARENT_ROOT_PORT_NAME;").await;
    assert!(port.ends_with(";found=TRUE;value=port#0;"), "{port}");
    ask2(c, "cmd=kvs-put;key=ck2;value=kid2;").await;
    assert_eq!(
        ask2(c, "cmd=kvs-fence;").await,
        "cmd=kvs-fence-response;rc=0;"
    );
    let theirs = ask2(c, "cmd=kvs-get;key=ck;").await;
    assert!(theirs.contains(";found=TRUE;value=kid"), "{theirs}");
    let name = ask2(c, "cmd=name-lookup;name=svc;").await;
    assert!(name.ends_with(";rc=0;port=p-of-parent;"), "{name}");
    for (r, kid) in kids.iter_mut().enumerate() {
        assert_eq!(line(kid).await, "cmd=barrier_out rc=0");
        let get = format!("cmd=get kvsname={ns} key=ck\n");
        let got = ask(kid, &get).await;
        assert!(
            got.starts_with("cmd=get_result rc=0 msg=success value=kid"),
            "{r}: {got}"
        );
        let theirs = format!("cmd=get kvsname={job} key=pk\n");
        assert_eq!(
            ask(kid, &theirs).await,
            "cmd=get_result rc=-1 msg=key_not_found",
            "the parent's KVS is not the child's"
        );
        assert_eq!(
            ask(kid, "cmd=lookup_name service=svc\n").await,
            "cmd=lookup_result rc=0 msg=success port=p-of-parent"
        );
    }
    assert_eq!(nodes[0].fences(), 0, "the parents did not fence");
    for c in &mut parents {
        c.write_all(b"cmd=barrier_in\n").await.unwrap();
    }
    for c in &mut parents {
        assert_eq!(line(c).await, "cmd=barrier_out rc=0");
        let get = format!("cmd=get kvsname={job} key=ck\n");
        assert_eq!(ask(c, &get).await, "cmd=get_result rc=-1 msg=key_not_found");
    }

    // A child's own spawn reaches its node's embedder, named as its namespace's; a node
    // whose embedder takes no spawns refuses at once.
    let again = "mcmd=spawn\nnprocs=1\nexecname=./grandkid\ntotspawns=1\nspawnssofar=1\n\
                 argcnt=0\npreput_num=0\ninfo_num=0\nendcmd\n";
    kids[0].write_all(again.as_bytes()).await.unwrap();
    let pending = tokio::time::timeout(Duration::from_secs(10), spawns.recv())
        .await
        .expect("the request within 10 s")
        .unwrap();
    assert_eq!(
        (pending.request.parent.as_str(), pending.request.requester),
        (ns.as_str(), 0)
    );
    pending.refused("no free slots".into());
    assert_eq!(
        line(&mut kids[0]).await,
        "cmd=spawn_result rc=-1 msg=no_free_slots"
    );
    kids[1].write_all(again.as_bytes()).await.unwrap();
    assert_eq!(
        line(&mut kids[1]).await,
        "cmd=spawn_result rc=-1 msg=spawn_is_not_served_by_this_launcher"
    );

    // A child that exits before finalize ends the family, naming namespace, rank, host.
    assert_eq!(
        ask(&mut kids[0], "cmd=finalize\n").await,
        "cmd=finalize_ack rc=0"
    );
    nodes[0].child_exited(ns, 0, 0).await;
    nodes[1].child_exited(ns, 1, 7).await;
    let abort = abort_of(&nodes[0]).await;
    assert_eq!(abort.code, 7);
    assert!(
        abort
            .reason
            .contains(&format!("spawned job {ns} rank 1 on h1 exited with code 7")),
        "{abort:?}"
    );
    stop(&nodes).await;
}

/// How to build an MPI program: the compiler and the arguments after the source.
struct Toolchain {
    cc: String,
    libs: Vec<String>,
}

impl Toolchain {
    /// MPICH's wrapper `MPICC`, else the PyPI mpich 5 wheel's (`GREEDY_MPICH5`, default
    /// `/var/tmp/greedy-mpich5`, tests/mpi/mpich5.sh), if any. Not Debian's MPICH 4.0.2: its
    /// ch4:ucx cannot open a port, so its spawn fails before asking, under hydra too.
    fn mpich() -> Option<Toolchain> {
        let cc = std::env::var("MPICC").ok().or_else(|| {
            let prefix = std::env::var("GREEDY_MPICH5").unwrap_or("/var/tmp/greedy-mpich5".into());
            let cc = format!("{prefix}/bin/mpicc");
            Path::new(&cc).exists().then_some(cc)
        })?;
        Some(Toolchain { cc, libs: vec![] })
    }

    /// Intel MPI under `GREEDY_IMPI` (default `/var/tmp/greedy-impi`, the PyPI wheels' venv of
    /// tests/mpi/clients.sh), if there.
    fn intel_installed() -> Option<Toolchain> {
        let prefix = std::env::var("GREEDY_IMPI").unwrap_or("/var/tmp/greedy-impi".into());
        Path::new(&prefix)
            .join("include/mpi.h")
            .exists()
            .then(|| Toolchain::intel(&prefix))
    }

    /// Intel MPI under `prefix` (the PyPI impi-devel wheel: its mpicc wrapper looks for its
    /// headers elsewhere, so gcc with the wheel's paths).
    fn intel(prefix: &str) -> Toolchain {
        Toolchain {
            cc: "gcc".into(),
            libs: vec![
                format!("-I{prefix}/include"),
                format!("-L{prefix}/lib"),
                "-lmpi".into(),
                format!("-Wl,-rpath,{prefix}/lib"),
            ],
        }
    }

    /// Compiles `tests/mpi/<program>.c` into `dir`.
    fn compile(&self, dir: &Path, program: &str) -> PathBuf {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tests/mpi/{program}.c"));
        let exe = dir.join(program);
        let out = std::process::Command::new(&self.cc)
            .arg("-O1")
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .args(&self.libs)
            .output()
            .expect("the MPI compiler runs");
        assert!(
            out.status.success(),
            "{} failed: {}",
            self.cc,
            String::from_utf8_lossy(&out.stderr)
        );
        exe
    }
}

/// What one process did: its namespace, rank, exit code and output.
#[derive(Debug, Clone)]
struct Exit {
    nspace: String,
    rank: u32,
    code: i32,
    output: String,
}

/// The test's launcher: forks ranks with their wire-up, reports their exits, serves spawns.
struct Embedder {
    /// The job's namespace (the others are spawned).
    job: String,
    nodes: Vec<NodeService>,
    env: Vec<(String, String)>,
    exits: Mutex<Vec<tokio::task::JoinHandle<Exit>>>,
    spawned: std::sync::atomic::AtomicU32,
}

impl Embedder {
    /// Forks `argv` as rank `rank` of `nspace` on node `node` (`child`: a spawned job's).
    async fn fork(self: &Arc<Self>, node: usize, nspace: &str, rank: u32, argv: &[String]) {
        let service = &self.nodes[node];
        let wireup = if nspace == self.job {
            service.env_for(rank, Some(3)).await
        } else {
            service.child_env(nspace, rank, Some(3)).await
        };
        let wireup = wireup.expect("wire-up for a rank");
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, _) in std::env::vars() {
            if k.starts_with("PMI_") || k.starts_with("PMIX_") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(self.env.iter().cloned()).envs(wireup.env);
        let fd = wireup.pmi_fd.expect("PMI served");
        cmd.fd_mappings(vec![FdMapping {
            parent_fd: fd,
            child_fd: 3,
        }])
        .expect("fd mapping");
        let child = cmd.spawn().expect("fork a rank");
        let (me, nspace) = (self.clone(), nspace.to_owned());
        let waiter = tokio::spawn(async move { me.wait(node, nspace, rank, child).await });
        self.exits.lock().unwrap().push(waiter);
    }

    /// Waits for a rank (killed once the job is aborted) and reports its exit.
    async fn wait(
        &self,
        node: usize,
        nspace: String,
        rank: u32,
        child: tokio::process::Child,
    ) -> Exit {
        let service = &self.nodes[node];
        let aborted = service.overlay().aborted();
        let (code, output) = common::rank_end(child, aborted, DEADLINE).await;
        if nspace == self.job {
            service.rank_exited(rank, code).await;
        } else {
            service.child_exited(&nspace, rank, code).await;
        }
        Exit {
            nspace,
            rank,
            code,
            output,
        }
    }

    /// Serves one node's spawn requests until its service stops.
    async fn serve(self: Arc<Self>, node: usize) {
        let mut spawns = self.nodes[node].take_spawns().expect("spawns taken once");
        while let Some(pending) = spawns.recv().await {
            self.start(pending).await;
        }
    }

    /// Places a request's ranks round-robin over the nodes, adds the child everywhere,
    /// forks it, then answers.
    async fn start(self: &Arc<Self>, pending: PendingSpawn) {
        let request = pending.request.clone();
        let n = 1 + self
            .spawned
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nspace = greedy_pmix::child::nspace(&request.parent, n);
        let nodes = self.nodes.len();
        let mut ranks = vec![Vec::new(); nodes];
        let mut apps = Vec::new();
        let mut next = 0u32;
        for app in &request.apps {
            if !Path::new(&app.program).exists() {
                return pending.refused(format!("program {} not found", app.program));
            }
            let argv = std::iter::once(app.program.clone()).chain(app.args.iter().cloned());
            apps.push(ChildApp {
                first_rank: next,
                argv: argv.collect(),
                env: app.env.clone(),
                cwd: app.cwd.clone(),
            });
            for _ in 0..app.maxprocs {
                ranks[next as usize % nodes].push(next);
                next += 1;
            }
        }
        let child = ChildJob {
            nspace: nspace.clone(),
            parent: request.parent.clone(),
            requester: request.requester,
            ranks,
            apps,
            preput: request.preput.clone(),
        };
        for node in &self.nodes {
            if let Err(e) = node.add_child(&child).await {
                return pending.refused(e.to_string());
            }
        }
        for (node, ranks) in child.ranks.iter().enumerate() {
            for &rank in ranks {
                let (_, app) = child.app_of(rank).expect("every rank runs an app");
                self.fork(node, &nspace, rank, &app.argv).await;
            }
        }
        pending.started(nspace);
    }

    /// Every process's exit, the spawned ones' too, once all have ended.
    async fn exits(&self) -> Vec<Exit> {
        let mut out = Vec::new();
        loop {
            let waiting: Vec<_> = std::mem::take(&mut *self.exits.lock().unwrap());
            if waiting.is_empty() {
                return out;
            }
            for w in waiting {
                out.push(w.await.expect("waiter"));
            }
        }
    }
}

/// What a run of `spawn.c` did.
struct Run {
    job: String,
    exits: Vec<Exit>,
    abort: Option<AbortInfo>,
}

/// Runs `spawn.c` as a job of `ranks` and returns every process's exit and the job's abort.
async fn run_spawn(
    tools: Toolchain,
    ranks: Vec<Vec<u32>>,
    args: &[&str],
    env: &[(&str, &str)],
) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let exe = tools.compile(dir.path(), "spawn");
    static JOBS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    // Unique: MPICH names its shared-memory segments after the kvsname.
    let job_id = format!(
        "spawn.{}.{}",
        std::process::id(),
        JOBS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let nodes = services(&job_id, &ranks).await;
    let mut env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if std::env::var_os("UCX_TLS").is_none() {
        env.push(("UCX_TLS".into(), "self,sm,tcp".into()));
    }
    let embedder = Arc::new(Embedder {
        job: job_id.clone(),
        nodes: nodes.clone(),
        env,
        exits: Mutex::new(Vec::new()),
        spawned: Default::default(),
    });
    for node in 0..nodes.len() {
        tokio::spawn(embedder.clone().serve(node));
    }
    let mut argv = vec![exe.to_string_lossy().into_owned()];
    argv.extend(args.iter().map(|a| a.to_string()));
    for (node, ranks) in ranks.iter().enumerate() {
        for &rank in ranks {
            embedder.fork(node, &job_id, rank, &argv).await;
        }
    }
    let exits = tokio::time::timeout(DEADLINE + Duration::from_secs(10), embedder.exits())
        .await
        .expect("every process ends");
    let abort = nodes[0].overlay().aborted().borrow().clone();
    stop(&nodes).await;
    Run {
        job: job_id,
        exits,
        abort,
    }
}

/// Parents say they spawned and heard from their children (exit 3), the children that they
/// heard from their parents (exit 0).
fn check_spawn(run: Run, parents: u32) {
    let all: String = run
        .exits
        .iter()
        .map(|e| format!("{}:{} exit {}\n{}", e.nspace, e.rank, e.code, e.output))
        .collect();
    assert_eq!(run.abort, None, "{all}");
    let (dads, kids): (Vec<&Exit>, Vec<&Exit>) =
        run.exits.iter().partition(|e| e.nspace == run.job);
    assert_eq!(dads.len() as u32, parents, "{all}");
    for p in &dads {
        assert_eq!(p.code, 3, "{all}");
        assert!(
            p.output
                .contains(&format!("rank {} of {parents}: spawned 2", p.rank)),
            "{all}"
        );
    }
    assert!(
        dads.iter().any(|p| p.output.contains("children ok")),
        "{all}"
    );
    assert_eq!(kids.len(), 2, "{all}");
    for k in &kids {
        assert_eq!(k.code, 0, "{all}");
        assert!(
            k.output
                .contains(&format!("child {} of 2: parent ok", k.rank)),
            "{all}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mpich_spawns_over_pmi1_and_children_connect_back() {
    let Some(mpich) = Toolchain::mpich() else {
        eprintln!("skipped: no MPICH that can spawn (MPICC, GREEDY_MPICH5)");
        return;
    };
    check_spawn(run_spawn(mpich, vec![vec![0], vec![1]], &[], &[]).await, 2);
}

/// Children that exit 7 before connecting back end the family at once (the parents would
/// wait in `MPI_Comm_spawn` forever), naming a child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mpich_children_dying_before_connecting_end_the_family() {
    let Some(mpich) = Toolchain::mpich() else {
        eprintln!("skipped: no MPICH that can spawn (MPICC, GREEDY_MPICH5)");
        return;
    };
    let t0 = std::time::Instant::now();
    let run = run_spawn(mpich, vec![vec![0], vec![1]], &["--children-die"], &[]).await;
    let abort = run.abort.expect("the family was aborted");
    assert_eq!(abort.code, 7, "{abort:?}");
    assert!(
        abort
            .reason
            .contains(&format!("spawned job {}@1 rank", run.job))
            && abort
                .reason
                .contains("exited with code 7 before connecting"),
        "{abort:?}"
    );
    assert_eq!(run.exits.len(), 4, "two parents, two children");
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
}

/// Intel MPI 2021 over its default PMI-1; skipped where it is not installed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intel_mpi_spawns_over_pmi1_and_children_connect_back() {
    let Some(intel) = Toolchain::intel_installed() else {
        eprintln!("skipped: no Intel MPI (GREEDY_IMPI)");
        return;
    };
    let env = [("FI_PROVIDER", "tcp"), ("I_MPI_FABRICS", "shm:ofi")];
    check_spawn(
        run_spawn(intel, vec![vec![0, 1], vec![2]], &[], &env).await,
        3,
    );
}
