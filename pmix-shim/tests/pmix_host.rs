//! Two jobs (two namespaces, each with its own `JobSpec` and overlay) served at once by one `PmixHost` per agent process, with real libpmix clients of both.
//!
//! PMIx allows one server per process, so each agent is a separate process: this test binary
//! re-executes itself with `GREEDY_PMIX_HOST_AGENT` set, which makes `host_agent_process` run
//! one agent instead of returning at once (as `tests/openmpi.rs` does). Each of the two agents
//! is node `i` of both jobs: job A has ranks `[[0, 1], [2]]`, job B `[[0], [1, 2, 3]]`. The
//! clients (`tests/mpi/pmix_two_jobs.c`) check their own job's sizes and fence data; job B
//! ends first and its namespace is removed from both hosts, after which job A's rank 0 asks
//! for B's data and fences naming B (both must fail, never hang), and A fences again. A second
//! registration of a hosted namespace is refused.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use greedy_pmix::{
    JobSecret, JobSpec,
    overlay::{Overlay, OverlayConfig},
    peer::JobProcesses,
    pmix::{Binding, HostConfig, NamespaceConfig, PmixHost, PmixServer, admit_job},
    rendezvous::Rendezvous,
};
use tokio::{io::AsyncReadExt, process::Command, task::JoinSet};

const JOB_A: [&[u32]; 2] = [&[0, 1], &[2]];
const JOB_B: [&[u32]; 2] = [&[0], &[1, 2, 3]];
const DEADLINE: Duration = Duration::from_secs(90);

/// Agents publish their overlay address as a file `node<i>` in a directory per job.
struct DirRendezvous(PathBuf);

impl Rendezvous for DirRendezvous {
    async fn publish(&self, node_idx: usize, addr: SocketAddr) -> Result<(), String> {
        let tmp = self.0.join(format!(".node{node_idx}.tmp"));
        std::fs::write(&tmp, addr.to_string()).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, self.0.join(format!("node{node_idx}"))).map_err(|e| e.to_string())
    }

    async fn lookup(&self, node_idx: usize) -> Result<SocketAddr, String> {
        let path = self.0.join(format!("node{node_idx}"));
        loop {
            if let Ok(s) = std::fs::read_to_string(&path) {
                return s.trim().parse().map_err(|e| format!("{path:?}: {e}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn job(id: &str, layout: [&[u32]; 2], me: usize, secret: &str) -> JobSpec {
    JobSpec {
        job_id: id.into(),
        hosts: vec!["node0".into(), "node1".into()],
        node_idx: me,
        model: Default::default(),
        ranks: layout.iter().map(|r| r.to_vec()).collect(),
        secret: JobSecret::from_hex(secret).unwrap(),
    }
}

/// One job's part on this agent: its overlay and namespace.
struct Part {
    job: JobSpec,
    overlay: Overlay,
    pmix: PmixServer,
}

async fn serve(host: &PmixHost, job: JobSpec, dir: &Path) -> Part {
    let board = DirRendezvous(dir.join(format!("rendezvous-{}", job.job_id)));
    std::fs::create_dir_all(&board.0).unwrap();
    let config = OverlayConfig {
        collective_timeout: Duration::from_secs(60),
        request_timeout: Duration::from_secs(60),
        ..Default::default()
    };
    let overlay = Overlay::start(&job, config, &board)
        .await
        .expect("overlay joins");
    let pmix = host
        .serve(&job, overlay.clone(), namespace_config())
        .await
        .expect("namespace registers");
    Part { job, overlay, pmix }
}

fn namespace_config() -> NamespaceConfig {
    NamespaceConfig {
        register_timeout: Duration::from_secs(30),
        exit_grace: Duration::from_millis(500),
        binding: Binding::Known(Default::default()),
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
    let local = part.job.local_ranks();
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
            .env("EXPECT_SIZE", part.job.n_ranks().to_string())
            .env("EXPECT_LOCAL_SIZE", local.len().to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn rank");
        let (pmix, id) = (part.pmix.clone(), part.job.job_id.clone());
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

/// Leaves `part`'s job once every node is done with it; the host keeps serving.
async fn finish(part: Part) -> (u64, Option<String>) {
    if part.overlay.aborted().borrow().is_none() {
        let _ = part.overlay.barrier().await;
    }
    let abort = part.overlay.aborted().borrow().clone().map(|a| a.reason);
    let fences = part.pmix.fences();
    part.pmix.shutdown().await;
    part.overlay.shutdown().await;
    (fences, abort)
}

/// What the agent reports, one line each: `code <job> <rank> <code>`, `fences <job> <n>`,
/// `abort <job> <reason>`, `after-b <namespaces>`, then `output` and the ranks' text.
async fn run_agent(
    me: usize,
    dir: PathBuf,
    exe: PathBuf,
    ids: [String; 2],
    secrets: [String; 2],
) -> String {
    let node_dir = dir.join(format!("node{me}"));
    let host = PmixHost::start(HostConfig {
        tmpdir: node_dir.join("pmix"),
        hostname: format!("node{me}"),
        nodeid: me as u32,
        server_nspace: format!("greedy-host-{me}"),
        owner: None,
        admit: admit_job(JobProcesses::of_this_process().unwrap()),
        finalize_timeout: Duration::from_secs(2),
    })
    .expect("PMIx host starts");
    let a = serve(&host, job(&ids[0], JOB_A, me, &secrets[0]), &dir).await;
    let b = serve(&host, job(&ids[1], JOB_B, me, &secrets[1]), &dir).await;
    // A namespace is hosted once: a second registration of A is refused, A keeps serving.
    let twice = host
        .serve(
            &job(&ids[0], JOB_A, me, &secrets[0]),
            a.overlay.clone(),
            namespace_config(),
        )
        .await;
    let dup = match twice {
        Ok(_) => "dup-accepted\n".to_string(),
        Err(e) => format!("dup-refused {e}\n"),
    };
    let gone = dir.join(format!("b-gone-{me}"));
    let to_a = [
        ("OTHER_NS".to_string(), ids[1].clone()),
        ("OTHER_GONE".to_string(), gone.display().to_string()),
    ];
    let (mut a_waits, mut b_waits) = (JoinSet::new(), JoinSet::new());
    start_ranks(&a, &exe, &to_a, &mut a_waits).await;
    start_ranks(&b, &exe, &[], &mut b_waits).await;
    let mut report = String::new();
    let mut output = String::new();
    let mut record = |(id, rank, code, text): (String, u32, i32, String)| {
        report += &format!("code {id} {rank} {code}\n");
        output += &text;
    };
    while let Some(done) = b_waits.join_next().await {
        record(done.unwrap());
    }
    let (fences, abort) = finish(b).await;
    let mut after: Vec<String> = host.namespaces();
    after.sort();
    std::fs::write(&gone, "").unwrap();
    while let Some(done) = a_waits.join_next().await {
        record(done.unwrap());
    }
    let mut lines = format!("fences {} {fences}\nafter-b {}\n", ids[1], after.join(","));
    if let Some(reason) = abort {
        lines += &format!("abort {} {reason}\n", ids[1]);
    }
    let (fences, abort) = finish(a).await;
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
    let f: Vec<&str> = spec.split('\n').collect();
    let me: usize = f[0].parse().unwrap();
    let dir = PathBuf::from(f[1]);
    let run = run_agent(
        me,
        dir.clone(),
        f[2].into(),
        [f[3].into(), f[4].into()],
        [f[5].into(), f[6].into()],
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_jobs_share_each_agents_pmix_host_and_one_leaves_first() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path());
    let pid = std::process::id();
    let ids = [format!("hostA.{pid}"), format!("hostB.{pid}")];
    let secrets = [
        JobSecret::generate().to_hex(),
        JobSecret::generate().to_hex(),
    ];
    let mut agents = Vec::new();
    for me in 0..2 {
        let spec = [
            me.to_string(),
            dir.path().display().to_string(),
            exe.display().to_string(),
            ids[0].clone(),
            ids[1].clone(),
            secrets[0].clone(),
            secrets[1].clone(),
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
    let results: Vec<String> = (0..2)
        .map(|i| std::fs::read_to_string(dir.path().join(format!("result{i}"))).unwrap())
        .collect();
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
    // Three ranks' job A and four ranks' job B print "of 3" and "of 4" respectively.
    assert_eq!(all.matches(" of 3: ok").count(), 3, "{all}");
    assert_eq!(all.matches(" of 4: ok").count(), 4, "{all}");
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
    for r in &results {
        assert!(
            r.contains("dup-refused ") && r.contains("hosted here already"),
            "{all}"
        );
        // Once B was removed, the host still served A alone.
        assert!(r.contains(&format!("after-b {}\n", ids[0])), "{all}");
        // B: its one collecting fence and the one before finalize at least; A: one more.
        let fences = |id: &str| -> u64 {
            let prefix = format!("fences {id} ");
            let line = r.lines().find(|l| l.starts_with(&prefix)).unwrap();
            line[prefix.len()..].parse().unwrap()
        };
        assert!(fences(&ids[1]) >= 2, "{all}");
        assert!(fences(&ids[0]) >= 2, "{all}");
    }
}
