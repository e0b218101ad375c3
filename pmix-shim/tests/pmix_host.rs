//! Two namespaces served at once by one `PmixHost` per agent process, with real libpmix clients of both: job A with ranks on every node, and namespace B with ranks on some of the nodes only (as a spawned child will be).
//!
//! PMIx allows one server per process, so each agent is a separate process: this test binary
//! re-executes itself with `GREEDY_PMIX_HOST_AGENT` set, which makes `host_agent_process` run
//! one agent instead of returning at once (as `tests/openmpi.rs` does). Each of the three
//! agents is node `i` of both: job A has ranks `[[0, 1], [2], [3]]`; namespace B (a
//! `NamespaceSpec` on an overlay of the same three nodes) `[[], [0], [1, 2]]`, registered on
//! node 0 too with no local rank there. The clients (`tests/mpi/pmix_two_jobs.c`) check their
//! own namespace's sizes and node count; A fences with the data, B without it so that its
//! ranks read each other's values by direct modex across nodes (B's whole-namespace fences go
//! the subset path over nodes 1 and 2). A's rank 0, on node 0, reads B's job-level keys from
//! node 0's registration. B ends first and its namespace is removed from every host, after
//! which A's rank 0 asks for B's data and fences naming B (both must fail, never hang), and A
//! fences again. A second registration of a hosted namespace is refused.
//!
//! The second test runs both over ONE overlay, as a spawned child will be: B is added at run
//! time (`PmixServer::add_namespace` on A's server, while A's ranks run) on every node, the
//! agents wait for each other before B's ranks start, and B's ranks fence with the data and
//! then read a second key by direct modex (`FENCE_COLLECT=both`), while A fences too. Once B
//! has been removed everywhere, each agent sends the overlay a late direct-modex request and
//! (nodes 1 and 2) a late subset fence naming B: both must be refused at once, naming B.

mod common;

use common::DirRendezvous;
use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use greedy_pmix::{
    JobSecret, JobSpec, NamespaceSpec,
    frame::Service,
    group::{self, Contribution, GroupOp},
    overlay::{Overlay, OverlayConfig},
    peer::JobProcesses,
    pmix::{
        Binding, HostConfig, NamespaceConfig, PmixHost, PmixServer, admit_job,
        encode_dmodex_request,
    },
};
use tokio::{io::AsyncReadExt, process::Command, task::JoinSet};

const NODES: usize = 3;
const JOB_A: [&[u32]; NODES] = [&[0, 1], &[2], &[3]];
const JOB_B: [&[u32]; NODES] = [&[], &[0], &[1, 2]];
/// Fences A's ranks run while B is added and starts (shared overlay).
const A_ROUNDS: u64 = 20;
const DEADLINE: Duration = Duration::from_secs(90);

fn job(id: &str, layout: [&[u32]; NODES], me: usize, secret: &str) -> JobSpec {
    JobSpec {
        job_id: id.into(),
        hosts: (0..NODES).map(|n| format!("node{n}")).collect(),
        node_idx: me,
        model: Default::default(),
        ranks: layout.iter().map(|r| r.to_vec()).collect(),
        secret: JobSecret::from_hex(secret).unwrap(),
    }
}

/// One namespace's part on this agent: its overlay and namespace.
struct Part {
    ns: NamespaceSpec,
    overlay: Overlay,
    pmix: PmixServer,
}

/// Serves `ns` on an overlay of `overlay_job`'s nodes.
async fn serve(host: &PmixHost, overlay_job: &JobSpec, ns: NamespaceSpec, dir: &Path) -> Part {
    let board = DirRendezvous(dir.join(format!("rendezvous-{}", ns.nspace())));
    std::fs::create_dir_all(&board.0).unwrap();
    let config = OverlayConfig {
        collective_timeout: Duration::from_secs(60),
        request_timeout: Duration::from_secs(60),
        ..Default::default()
    };
    let overlay = Overlay::start(overlay_job, config, &board)
        .await
        .expect("overlay joins");
    let pmix = host
        .serve(&ns, overlay.clone(), namespace_config())
        .await
        .expect("namespace registers");
    Part { ns, overlay, pmix }
}

fn namespace_config() -> NamespaceConfig {
    NamespaceConfig {
        register_timeout: Duration::from_secs(30),
        exit_grace: Duration::from_millis(500),
        binding: Binding::Known(Default::default()),
        universe: None,
        log_output: None,
    }
}

/// Starts `part`'s local ranks with `extra` variables; each waiter reports (job, rank, code,
/// output) after telling the namespace the exit.
async fn start_ranks(
    part: &Part,
    exe: &Path,
    extra: &[(String, String)],
    waits: &mut JoinSet<(String, u32, i32, String)>,
) {
    let local = part.ns.local_ranks();
    let nodes = part.ns.nodes().len();
    for &rank in local {
        let env = part.pmix.env_for(rank).await.expect("rank registers");
        let mut cmd = Command::new(exe);
        for (k, _) in std::env::vars() {
            if k.starts_with("PMI") || k.starts_with("GREEDY_") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(env)
            .envs(extra.iter().cloned())
            .env("EXPECT_SIZE", part.ns.n_ranks().to_string())
            .env("EXPECT_LOCAL_SIZE", local.len().to_string())
            .env("EXPECT_NODES", nodes.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn rank");
        let (pmix, id) = (part.pmix.clone(), part.ns.nspace().to_string());
        waits.spawn(async move {
            let mut text = String::new();
            let _ = child.stdout.take().unwrap().read_to_string(&mut text).await;
            let _ = child.stderr.take().unwrap().read_to_string(&mut text).await;
            let code = child.wait().await.expect("wait").code().unwrap_or(-1);
            pmix.rank_exited(rank, code).await;
            (id, rank, code, text)
        });
    }
}

/// Leaves `part`'s job once every node is done with it; the host keeps serving. Returns its
/// fences, direct-modex requests sent, and abort reason.
async fn finish(part: Part) -> (u64, u64, Option<String>) {
    if part.overlay.aborted().borrow().is_none() {
        let _ = part.overlay.barrier().await;
    }
    let abort = part.overlay.aborted().borrow().clone().map(|a| a.reason);
    let (fences, asked) = (part.pmix.fences(), part.pmix.dmodex_counts().asked);
    part.pmix.shutdown().await;
    part.overlay.shutdown().await;
    (fences, asked, abort)
}

/// The agent's PMIx host.
fn start_host(me: usize, dir: &Path) -> PmixHost {
    PmixHost::start(HostConfig {
        tmpdir: dir.join(format!("node{me}")).join("pmix"),
        hostname: format!("node{me}"),
        nodeid: me as u32,
        server_nspace: format!("greedy-host-{me}"),
        owner: None,
        admit: admit_job(JobProcesses::of_this_process().unwrap()),
        finalize_timeout: Duration::from_secs(2),
        leave_to_exit: false,
        groups: Default::default(),
    })
    .expect("PMIx host starts")
}

/// Says this agent reached `step`, then waits until every agent has (agents share `dir`).
async fn all_reached(dir: &Path, step: &str, me: usize) {
    std::fs::write(dir.join(format!("{step}-{me}")), "").unwrap();
    for n in 0..NODES {
        while !dir.join(format!("{step}-{n}")).exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Collects the waiters' reports into `report` (code lines) and `output` (the ranks' text).
async fn record_all(
    waits: &mut JoinSet<(String, u32, i32, String)>,
    report: &mut String,
    output: &mut String,
) {
    while let Some(done) = waits.join_next().await {
        let (id, rank, code, text) = done.unwrap();
        *report += &format!("code {id} {rank} {code}\n");
        *output += &text;
    }
}

/// Requests naming namespace `b` (removed everywhere) that this node sends over `overlay`:
/// a direct modex of `b`'s rank on another node and, from nodes hosting `b`'s ranks, a subset
/// fence; one `late-<what> <ms> <error>` line each (`answered` if one was not refused).
async fn late_requests(overlay: &Overlay, b: &str, me: usize) -> String {
    let (target, rank) = if me == 2 { (1, 0) } else { (2, 1) };
    let proc_ = greedy_sys::pmix::Proc {
        nspace: b.into(),
        rank,
    };
    let body = encode_dmodex_request(&proc_, None).unwrap();
    let mut lines = timed("modex", overlay.request(target, Service::Modex, body)).await;
    if me > 0 {
        let c = Contribution {
            op: GroupOp::Fence { collect: true },
            procs: vec![(b.to_string(), group::WILDCARD)],
            seq: 0,
            timeout: Duration::from_secs(30),
            data: Default::default(),
        };
        let asked = overlay.request(group::GROUP_NODE, Service::Group, group::encode(&c));
        lines += &timed("group", asked).await;
    }
    lines
}

/// `late-<what> <ms> <error>` for `asked`'s answer.
async fn timed(
    what: &str,
    asked: impl std::future::Future<Output = Result<bytes::Bytes, greedy_pmix::Error>>,
) -> String {
    let t = std::time::Instant::now();
    let answer = asked.await;
    let ms = t.elapsed().as_millis();
    match answer {
        Ok(_) => format!("late-{what} {ms} answered\n"),
        Err(e) => format!("late-{what} {ms} {e}\n"),
    }
}

/// The shared-overlay agent: A on its overlay, B added over the same overlay while A runs.
async fn run_shared_agent(
    me: usize,
    dir: PathBuf,
    exe: PathBuf,
    ids: [String; 2],
    secrets: [String; 2],
) -> String {
    let host = start_host(me, &dir);
    let job_a = job(&ids[0], JOB_A, me, &secrets[0]);
    let a = serve(&host, &job_a, NamespaceSpec::of_job(&job_a).unwrap(), &dir).await;
    let ready = dir.join(format!("b-added-{me}"));
    let seen = dir.join("b-seen");
    let to_a = [
        ("OTHER_NS".to_string(), ids[1].clone()),
        ("OTHER_SIZE".to_string(), "3".to_string()),
        ("OTHER_NODES".to_string(), "2".to_string()),
        (
            "OTHER_GONE".to_string(),
            dir.join(format!("b-gone-{me}")).display().to_string(),
        ),
        ("OTHER_READY".to_string(), ready.display().to_string()),
        ("FENCE_ROUNDS".to_string(), A_ROUNDS.to_string()),
        ("OTHER_SEEN".to_string(), seen.display().to_string()),
    ];
    let (mut a_waits, mut b_waits) = (JoinSet::new(), JoinSet::new());
    start_ranks(&a, &exe, &to_a, &mut a_waits).await;
    // B at run time, over A's overlay, on every node before any of B's ranks starts.
    let b_ranks: Vec<Vec<u32>> = JOB_B.iter().map(|r| r.to_vec()).collect();
    let b = Part {
        ns: NamespaceSpec::on_overlay(&job_a, &ids[1], b_ranks.clone()).unwrap(),
        overlay: a.overlay.clone(),
        pmix: a
            .pmix
            .add_namespace(&ids[1], b_ranks, namespace_config())
            .await
            .expect("B is added over A's overlay"),
    };
    let mut report = format!("served {}\n", a.overlay.served().namespaces().join(","));
    all_reached(&dir, "b-added", me).await;
    let to_b = [("FENCE_COLLECT".to_string(), "both".to_string())];
    start_ranks(&b, &exe, &to_b, &mut b_waits).await;
    let mut output = String::new();
    record_all(&mut b_waits, &mut report, &mut output).await;
    // A's rank 0 reads B's job-level keys before B goes.
    while !seen.exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    all_reached(&dir, "b-done", me).await;
    let (fences, asked) = (b.pmix.fences(), b.pmix.dmodex_counts().asked);
    b.pmix.shutdown().await;
    let mut after = host.namespaces();
    after.sort();
    report += &format!(
        "fences {} {fences}\ndmodex {} {asked}\nafter-b {}\nserved-after-b {}\n",
        ids[1],
        ids[1],
        after.join(","),
        a.overlay.served().namespaces().join(",")
    );
    all_reached(&dir, "b-gone", me).await;
    report += &late_requests(&a.overlay, &ids[1], me).await;
    record_all(&mut a_waits, &mut report, &mut output).await;
    let (fences, _, abort) = finish(a).await;
    report += &format!("fences {} {fences}\n", ids[0]);
    if let Some(reason) = abort {
        report += &format!("abort {} {reason}\n", ids[0]);
    }
    host.shutdown().await;
    format!("{report}output\n{output}")
}

/// What the agent reports, one line each: `code <job> <rank> <code>`, `fences <job> <n>`,
/// `dmodex <job> <asked>`, `abort <job> <reason>`, `after-b <namespaces>`, then `output` and
/// the ranks' text.
async fn run_agent(
    me: usize,
    dir: PathBuf,
    exe: PathBuf,
    ids: [String; 2],
    secrets: [String; 2],
) -> String {
    let host = start_host(me, &dir);
    let job_a = job(&ids[0], JOB_A, me, &secrets[0]);
    let ns_a = NamespaceSpec::of_job(&job_a).unwrap();
    let a = serve(&host, &job_a, ns_a.clone(), &dir).await;
    // B's overlay: the same three nodes (a job's overlay); B's own ranks on nodes 1 and 2.
    let overlay_b = job(&ids[1], JOB_A, me, &secrets[1]);
    let b_ranks = JOB_B.iter().map(|r| r.to_vec()).collect();
    let ns_b = NamespaceSpec::on_overlay(&overlay_b, &ids[1], b_ranks).unwrap();
    let b = serve(&host, &overlay_b, ns_b, &dir).await;
    // A namespace is hosted once: a second registration of A is refused, A keeps serving.
    let twice = host
        .serve(&ns_a, a.overlay.clone(), namespace_config())
        .await;
    let dup = match twice {
        Ok(_) => "dup-accepted\n".to_string(),
        Err(e) => format!("dup-refused {e}\n"),
    };
    let gone = dir.join(format!("b-gone-{me}"));
    let to_a = [
        ("OTHER_NS".to_string(), ids[1].clone()),
        ("OTHER_SIZE".to_string(), b.ns.n_ranks().to_string()),
        ("OTHER_NODES".to_string(), b.ns.nodes().len().to_string()),
        ("OTHER_GONE".to_string(), gone.display().to_string()),
    ];
    let to_b = [("FENCE_COLLECT".to_string(), "0".to_string())];
    let (mut a_waits, mut b_waits) = (JoinSet::new(), JoinSet::new());
    start_ranks(&a, &exe, &to_a, &mut a_waits).await;
    start_ranks(&b, &exe, &to_b, &mut b_waits).await;
    let mut report = String::new();
    let mut output = String::new();
    let mut record = |(id, rank, code, text): (String, u32, i32, String)| {
        report += &format!("code {id} {rank} {code}\n");
        output += &text;
    };
    while let Some(done) = b_waits.join_next().await {
        record(done.unwrap());
    }
    let (fences, asked, abort) = finish(b).await;
    let mut after: Vec<String> = host.namespaces();
    after.sort();
    std::fs::write(&gone, "").unwrap();
    while let Some(done) = a_waits.join_next().await {
        record(done.unwrap());
    }
    let mut lines = format!(
        "fences {} {fences}\ndmodex {} {asked}\nafter-b {}\n",
        ids[1],
        ids[1],
        after.join(",")
    );
    if let Some(reason) = abort {
        lines += &format!("abort {} {reason}\n", ids[1]);
    }
    let (fences, _, abort) = finish(a).await;
    lines += &format!("fences {} {fences}\n", ids[0]);
    if let Some(reason) = abort {
        lines += &format!("abort {} {reason}\n", ids[0]);
    }
    host.shutdown().await;
    format!("{report}{dup}{lines}output\n{output}")
}

/// The entry point of an agent process; without `GREEDY_PMIX_HOST_AGENT` it does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_agent_process() {
    let Ok(spec) = std::env::var("GREEDY_PMIX_HOST_AGENT") else {
        return;
    };
    if std::env::var_os("GREEDY_TEST_DEBUG").is_some() {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(tracing::Level::DEBUG)
            .init();
    }
    let f: Vec<&str> = spec.split('\n').collect();
    let me: usize = f[0].parse().unwrap();
    let dir = PathBuf::from(f[1]);
    let (exe, ids, secrets) = (
        f[2].into(),
        [f[3].into(), f[4].into()],
        [f[5].into(), f[6].into()],
    );
    let run = async {
        match f[7] {
            "shared" => run_shared_agent(me, dir.clone(), exe, ids, secrets).await,
            _ => run_agent(me, dir.clone(), exe, ids, secrets).await,
        }
    };
    let text = tokio::time::timeout(DEADLINE, run)
        .await
        .unwrap_or_else(|_| format!("output\nagent {me} hit its deadline\n"));
    std::fs::write(dir.join(format!("result{me}")), text).unwrap();
}

fn compile(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/mpi/pmix_two_jobs.c");
    let exe = dir.join("pmix_two_jobs");
    let flags = std::process::Command::new("pkg-config")
        .args(["--cflags", "--libs", "pmix"])
        .output()
        .expect("pkg-config runs (libpmix-dev)");
    let flags = String::from_utf8_lossy(&flags.stdout).to_string();
    let out = std::process::Command::new("cc")
        .arg("-O1")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .args(flags.split_whitespace())
        .output()
        .expect("cc runs");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
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

/// Runs the three agents in `mode` (`separate` or `shared` overlays); each one's report, and
/// the namespaces A and B.
async fn run_agents(mode: &str) -> (Vec<String>, [String; 2]) {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path());
    let pid = std::process::id();
    let ids = [format!("hostA{mode}.{pid}"), format!("hostB{mode}.{pid}")];
    let secrets = [
        JobSecret::generate().to_hex(),
        JobSecret::generate().to_hex(),
    ];
    let mut agents = Vec::new();
    for me in 0..NODES {
        let spec = [
            me.to_string(),
            dir.path().display().to_string(),
            exe.display().to_string(),
            ids[0].clone(),
            ids[1].clone(),
            secrets[0].clone(),
            secrets[1].clone(),
            mode.to_string(),
        ]
        .join("\n");
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "host_agent_process",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("GREEDY_PMIX_HOST_AGENT", spec)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn agent");
        let group = Group(child.id().unwrap());
        agents.push((child, group));
    }
    tokio::time::timeout(DEADLINE + Duration::from_secs(20), async {
        for (child, _) in agents.iter_mut() {
            assert!(
                child.wait().await.unwrap().success(),
                "agent process failed"
            );
        }
    })
    .await
    .expect("both agents finished");
    let results: Vec<String> = (0..NODES)
        .map(|i| std::fs::read_to_string(dir.path().join(format!("result{i}"))).unwrap())
        .collect();
    (results, ids)
}

/// What both modes must show: every rank of both passed its checks, B's fences were subset
/// fences and its data crossed nodes by direct modex, A kept serving after B was removed.
fn check_both_served(results: &[String], ids: &[String; 2]) {
    let all = results.concat();
    if std::env::var_os("GREEDY_TEST_DEBUG").is_some() {
        eprintln!("{all}");
    }
    assert!(!all.contains("abort "), "no job aborted:\n{all}");
    assert!(!all.contains("FAILED"), "every check passed:\n{all}");
    for (id, layout) in [(&ids[0], JOB_A), (&ids[1], JOB_B)] {
        let n: usize = layout.iter().map(|r| r.len()).sum();
        for (node, ranks) in layout.iter().enumerate() {
            for rank in *ranks {
                let line = format!("code {id} {rank} 0\n");
                assert!(
                    results[node].contains(&line),
                    "{line:?} on node {node}:\n{all}"
                );
                let ok = format!("rank {rank} of {n}: ok");
                assert!(all.matches(&ok).count() >= 1, "{ok:?}:\n{all}");
            }
        }
    }
    // Four ranks' job A and three ranks' namespace B print "of 4" and "of 3" respectively.
    assert_eq!(all.matches(" of 4: ok").count(), 4, "{all}");
    assert_eq!(all.matches(" of 3: ok").count(), 3, "{all}");
    // Node 0, with no rank of B, answered B's job-level keys from its registration.
    assert!(
        all.contains("rank 0: other namespace: 3 ranks on 2 nodes\n"),
        "{all}"
    );
    // A namespace no longer hosted: direct modex is refused by the host at once; a fence is
    // held by libpmix itself (it waits for the namespace to be registered) until the client's
    // PMIX_TIMEOUT, never reaching the host.
    assert!(
        all.contains("get of the other namespace: NOT-FOUND in 0."),
        "{all}"
    );
    assert!(
        all.contains("fence naming the other namespace: TIMEOUT"),
        "{all}"
    );
    for r in results {
        // Once B was removed, the host still served A alone.
        assert!(r.contains(&format!("after-b {}\n", ids[0])), "{all}");
        // B: its one collecting fence and the one before finalize at least; A: one more.
        let fences = |id: &str| -> u64 {
            let prefix = format!("fences {id} ");
            let line = r.lines().find(|l| l.starts_with(&prefix)).unwrap();
            line[prefix.len()..].parse().unwrap()
        };
        assert!(fences(&ids[0]) >= 2, "{all}");
    }
    // B's fences were subset fences (node 0 saw none); its ranks read each other's values
    // through direct modex between nodes 1 and 2.
    let count = |r: &str, what: &str| -> u64 {
        let prefix = format!("{what} {} ", ids[1]);
        let line = r.lines().find(|l| l.starts_with(&prefix)).unwrap();
        line[prefix.len()..].parse().unwrap()
    };
    for (node, r) in results.iter().enumerate() {
        assert_eq!(
            count(r, "fences"),
            0,
            "node {node} ran no overlay fence of B:\n{all}"
        );
        let asked = count(r, "dmodex");
        assert_eq!(asked > 0, node > 0, "node {node} asked {asked}:\n{all}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_jobs_share_each_agents_pmix_host_and_one_leaves_first() {
    let (results, ids) = run_agents("separate").await;
    check_both_served(&results, &ids);
    for r in &results {
        assert!(
            r.contains("dup-refused ") && r.contains("hosted here already"),
            "{r}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_added_over_a_running_jobs_overlay_is_served_then_removed() {
    let (results, ids) = run_agents("shared").await;
    check_both_served(&results, &ids);
    let all = results.concat();
    let both = format!("served {},{}\n", ids[0], ids[1]);
    for (node, r) in results.iter().enumerate() {
        assert!(
            r.contains(&both),
            "node {node} served both over one overlay:\n{all}"
        );
        assert!(r.contains(&format!("served-after-b {}\n", ids[0])), "{all}");
        let a_fences = format!("fences {} {}\n", ids[0], 2 + A_ROUNDS);
        assert!(
            r.contains(&a_fences),
            "node {node}: every fence of A:\n{all}"
        );
        // Late requests naming B: refused at once, naming B, never held.
        let late: Vec<&str> = r.lines().filter(|l| l.starts_with("late-")).collect();
        assert_eq!(late.len(), if node == 0 { 1 } else { 2 }, "{all}");
        for line in late {
            let ms: u64 = line.split(' ').nth(1).unwrap().parse().unwrap();
            assert!(ms < 2000, "node {node}: {line}");
            assert!(
                line.contains("not served on this overlay"),
                "node {node}: {line}"
            );
            assert!(line.contains(&ids[1]), "node {node}: {line}");
        }
    }
}
