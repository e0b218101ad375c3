//! Real MPICH (Debian's mpich 4.0.2) wires up across node agents through the shim, on loopback.
//!
//! Each test compiles `tests/mpi/wireup.c` (or `names.c`) with `mpicc.mpich` into its own temp dir, starts K agents
//! as tasks of this process (each owning an overlay node and a PMI server), and forks each
//! agent's ranks the way a launcher would: PMI_FD over a socketpair mapped to fd 3.
//! Everything has a deadline; ranks are killed on drop, so no process outlives a test.

mod common;

use std::{
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use command_fds::{CommandFdExt, FdMapping};
use greedy_pmix::{
    AbortInfo, JobSecret, JobSpec,
    overlay::{Overlay, OverlayConfig},
    rendezvous::Memory,
    server::{PmiConfig, PmiServer},
};
use tokio::process::Command;

/// Generous: 16 busy-polling MPICH ranks share 2 cores with other builds.
const JOB_DEADLINE: Duration = Duration::from_secs(120);

/// Compiles `tests/mpi/<program>.c` into `dir`.
fn compile(dir: &Path, program: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tests/mpi/{program}.c"));
    let exe = dir.join(program);
    // mpicc.mpich, not mpicc: with Open MPI installed too, the mpicc alternative may be Open MPI's.
    // MPICC picks another MPICH build (e.g. the PyPI mpich 5 wheel's, with
    // MPIR_CVAR_PMI_VERSION=2 in the environment to make its ranks speak PMI-2).
    let mpicc = std::env::var("MPICC").unwrap_or_else(|_| "mpicc.mpich".into());
    let out = std::process::Command::new(&mpicc)
        .arg("-O1")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("mpicc.mpich runs (scripts/install-deps installs Debian's mpich and libmpich-dev)");
    assert!(
        out.status.success(),
        "mpicc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

#[derive(Debug)]
struct JobResult {
    /// (rank, exit code) for every rank.
    codes: Vec<(u32, i32)>,
    abort: Option<AbortInfo>,
    output: String,
    fences: Vec<u64>,
}

async fn run_agent(job: JobSpec, board: Memory, exe: PathBuf, args: Vec<String>) -> JobResult {
    let overlay = Overlay::start(
        &job,
        OverlayConfig {
            collective_timeout: Duration::from_secs(60),
            ..Default::default()
        },
        &board,
    )
    .await
    .expect("overlay joins");
    let pmi = PmiServer::start(&job, overlay.clone(), PmiConfig::default())
        .await
        .expect("pmi server starts");
    let mut children = Vec::new();
    for &rank in job.local_ranks() {
        let mut cmd = Command::new(&exe);
        cmd.args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, _) in std::env::vars() {
            if k.starts_with("PMI_") || k.starts_with("PMIX_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("EXPECT_SIZE", job.n_ranks().to_string());
        // UCX over shared memory only: every agent is on this one host, so sm reaches every
        // rank. Its tcp transport enumerates network devices at MPI_Init, which fails ("No
        // such device") when another test is creating or deleting interfaces at that moment,
        // and Debian's MPICH over UCX tcp can hang in MPI_Finalize (research/slurm-testcluster.md
        // §7.1). The wire-up under test is the same either way. An explicit UCX_TLS wins.
        if std::env::var_os("UCX_TLS").is_none() {
            cmd.env("UCX_TLS", "self,sm");
        }
        let (child_end, env) = pmi.socketpair_for(rank, Some(3)).expect("socketpair");
        cmd.fd_mappings(vec![FdMapping {
            parent_fd: OwnedFd::from(child_end),
            child_fd: 3,
        }])
        .expect("fd mapping");
        cmd.envs(env);
        let child = cmd.spawn().expect("spawn rank");
        // The command (and the parent's copy of the socketpair end) is dropped here.
        children.push((rank, child));
    }
    let mut aborted = overlay.aborted();
    let mut codes = Vec::new();
    let mut output = String::new();
    let mut waits = tokio::task::JoinSet::new();
    for (rank, child) in children {
        let pmi = pmi.clone();
        let aborted = overlay.aborted();
        waits.spawn(async move {
            let (code, text) = common::rank_end(child, aborted, Duration::from_secs(600)).await;
            pmi.rank_exited(rank, code).await;
            (rank, code, text)
        });
    }
    while let Some(joined) = waits.join_next().await {
        let (rank, code, text) = joined.expect("rank waiter");
        codes.push((rank, code));
        output += &text;
    }
    let abort = aborted.borrow_and_update().clone();
    let fences = vec![pmi.fences()];
    pmi.shutdown().await;
    overlay.shutdown().await;
    JobResult {
        codes,
        abort,
        output,
        fences,
    }
}

/// Runs one job of `wireup.c` over `ranks` (rank lists per node) and returns every agent's result.
async fn run_job(ranks: Vec<Vec<u32>>, args: &[&str]) -> (Vec<JobResult>, Duration) {
    run_program("wireup", ranks, args).await
}

/// Runs one job of `tests/mpi/<program>.c` over `ranks` and returns every agent's result.
async fn run_program(
    program: &str,
    ranks: Vec<Vec<u32>>,
    args: &[&str],
) -> (Vec<JobResult>, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), program);
    let board = Memory::default();
    let secret = JobSecret::generate();
    let n = ranks.len();
    // Unique per job: MPICH 5 names its shared-memory segments after the kvsname, so two
    // concurrent tests, or a rerun after killed ranks left segments behind, must not share one.
    static JOBS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let job_id = format!(
        "mpich.{}.{}",
        std::process::id(),
        JOBS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let started = Instant::now();
    let agents: Vec<_> = (0..n)
        .map(|node_idx| {
            let job = JobSpec {
                job_id: job_id.clone(),
                hosts: (0..n).map(|i| format!("node{i}")).collect(),
                node_idx,
                model: Default::default(),
                ranks: ranks.clone(),
                secret: secret.clone(),
            };
            tokio::spawn(run_agent(
                job,
                board.clone(),
                exe.clone(),
                args.iter().map(|s| s.to_string()).collect(),
            ))
        })
        .collect();
    let results = tokio::time::timeout(JOB_DEADLINE, async {
        let mut results = Vec::new();
        for a in agents {
            results.push(a.await.expect("agent task"));
        }
        results
    })
    .await
    .expect("job finished within its deadline");
    (results, started.elapsed())
}

fn block(nodes: u32, per_node: u32) -> Vec<Vec<u32>> {
    (0..nodes)
        .map(|n| (0..per_node).map(|i| n * per_node + i).collect())
        .collect()
}

fn cyclic(nodes: u32, per_node: u32) -> Vec<Vec<u32>> {
    (0..nodes)
        .map(|n| (0..per_node).map(|i| i * nodes + n).collect())
        .collect()
}

fn assert_all_ok(results: &[JobResult], n_ranks: usize) {
    let output: String = results.iter().map(|r| r.output.as_str()).collect();
    for r in results {
        assert_eq!(
            r.abort,
            None,
            "no abort expected; abort {:?}; output:\n{output}",
            r.abort.as_ref().map(ToString::to_string)
        );
        for (rank, code) in &r.codes {
            assert_eq!(*code, 0, "rank {rank} failed; output:\n{output}");
        }
    }
    for rank in 0..n_ranks {
        assert!(
            output.contains(&format!("rank {rank} of {n_ranks}: ok")),
            "rank {rank} did not report ok; output:\n{output}"
        );
    }
    // MPI_Init and MPI_Finalize each fence at least once on every node.
    assert!(
        results.iter().all(|r| r.fences[0] >= 2),
        "fences: {:?}",
        results.iter().map(|r| r.fences[0]).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mpich_4_agents_x_4_ranks_block_placement_pmi_fd() {
    let (results, took) = run_job(block(4, 4), &[]).await;
    assert_all_ok(&results, 16);
    eprintln!("4x4 block over PMI_FD took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mpich_4_agents_x_4_ranks_cyclic_placement_pmi_fd() {
    let (results, took) = run_job(cyclic(4, 4), &[]).await;
    assert_all_ok(&results, 16);
    eprintln!("4x4 cyclic over PMI_FD took {took:?}");
}

/// A deeper greedy tree: 16 agents with one rank each (the ring threshold is not reached).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mpich_16_agents_x_1_rank_pmi_fd() {
    let (results, took) = run_job(block(16, 1), &[]).await;
    assert_all_ok(&results, 16);
    eprintln!("16x1 over PMI_FD took {took:?}");
}

/// MPI name publishing (issue 37): rank 0 publishes a port, the ranks of all three agents look
/// it up in node 0's table (node 0's own rank 3 included), an unknown name fails with
/// MPI_ERR_NAME at once, and after the unpublish so does the published one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mpich_names_publish_lookup_unpublish_across_3_agents() {
    let (results, took) = run_program("names", cyclic(3, 2), &[]).await;
    assert_all_ok(&results, 6);
    eprintln!("names over 3x2 cyclic took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rank_exiting_before_mpi_init_fails_the_job_fast_naming_rank_and_code() {
    let (results, took) = run_job(block(4, 2), &["fail-before-init=5:3"]).await;
    let output: String = results.iter().map(|r| r.output.as_str()).collect();
    for r in &results {
        let abort = r
            .abort
            .as_ref()
            .unwrap_or_else(|| panic!("every node sees the abort; output:\n{output}"));
        assert_eq!(abort.rank, Some(5), "{abort}");
        assert_eq!(abort.code, 3, "{abort}");
        assert!(
            abort.to_string().contains(
                "rank 5 on node2 exited with code 3 before connecting to any wire-up service"
            ),
            "{abort}"
        );
    }
    assert!(took < Duration::from_secs(30), "failing took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mpi_abort_fails_the_job_naming_rank_and_code() {
    let (results, took) = run_job(cyclic(4, 2), &["abort-after-init=6:42"]).await;
    let output: String = results.iter().map(|r| r.output.as_str()).collect();
    for r in &results {
        let abort = r
            .abort
            .as_ref()
            .unwrap_or_else(|| panic!("every node sees the abort; output:\n{output}"));
        assert_eq!((abort.rank, abort.code), (Some(6), 42), "{abort}");
        assert!(
            abort.reason.starts_with("rank 6 called abort (code 42)"),
            "{abort}"
        );
    }
    assert!(took < Duration::from_secs(30), "aborting took {took:?}");
}
