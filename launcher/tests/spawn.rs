//! MPI_Comm_spawn under greedyrun with real MPI libraries: PyPI's MPICH 5 (PMI-1) and Open MPI 5
//! (PMIx), and Debian's Open MPI 4.1 (PMIx), on loopback pseudo-hosts started by a fake remote
//! shell (tests/mpi/spawn_multiple.c, spawn.c).
//!
//! - `MPI_Comm_spawn_multiple` of two programs pinned to two hosts (info `host`): the children
//!   run where they were asked, know their command (`MPI_APPNUM`) and talk to their parents;
//! - a spawn of a program that does not exist, and one asking for more processes than there are
//!   slots, fail at once on every parent rank with an MPI error (Hydra waits for ever on the
//!   first: measured, docs/user-guide.md);
//! - a child that exits 7 before `MPI_Finalize` ends the job with 7, naming the spawned job;
//! - `MPI_UNIVERSE_SIZE` is the job's slots, so a program sizing its spawn by it fits.

mod common;

use std::{
    path::Path,
    process::{Output, Stdio},
    time::{Duration, Instant},
};

use common::{greedyrun, shell, text};

/// The libraries: the name in messages, the compiler, its variables, and the variables the
/// ranks need (Open MPI: TCP over loopback and shared memory, as tests/mpi/clients.sh).
struct Library {
    name: &'static str,
    mpicc: String,
    env: Vec<String>,
}

fn mpich5() -> Library {
    let prefix = std::env::var("GREEDY_MPICH5").unwrap_or("/var/tmp/greedy-mpich5".into());
    Library {
        name: "mpich5",
        mpicc: format!("{prefix}/bin/mpicc"),
        env: vec![],
    }
}

fn ompi5() -> Library {
    let prefix = std::env::var("GREEDY_OMPI5").unwrap_or("/var/tmp/greedy-ompi5".into());
    Library {
        name: "ompi5",
        mpicc: format!("{prefix}/bin/mpicc"),
        env: vec![
            format!("OPAL_PREFIX={prefix}"),
            "OMPI_MCA_pml=ob1".into(),
            "OMPI_MCA_btl=self,sm,tcp".into(),
            "OMPI_MCA_btl_tcp_if_include=lo".into(),
        ],
    }
}

fn ompi41() -> Library {
    Library {
        name: "ompi41",
        mpicc: "mpicc.openmpi".into(),
        env: vec![
            "OMPI_MCA_pml=ob1".into(),
            "OMPI_MCA_btl=self,vader,tcp".into(),
            "OMPI_MCA_btl_tcp_if_include=lo".into(),
            "OMPI_MCA_oob_tcp_if_include=lo".into(),
        ],
    }
}

impl Library {
    /// Builds tests/mpi/`name`.c into `dir`.
    fn build(&self, dir: &Path, name: &str) -> String {
        let env: Vec<(&str, &str)> = self.env.iter().filter_map(|v| v.split_once('=')).collect();
        let from =
            "tests/mpi/clients.sh installs the PyPI libraries, scripts/install-deps Debian's";
        common::mpi_build(&self.mpicc, &env, dir, name, self.name, from)
    }

    /// greedyrun `args`, then the library's variables and `command` through `env`.
    fn run(&self, rsh: &Path, args: &[&str], command: &[&str]) -> (Output, Duration) {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--timeout", "60", "--tag-output", "--", "env"]);
        all.extend(self.env.iter().map(String::as_str));
        all.extend(command);
        let t0 = Instant::now();
        let out = greedyrun(rsh, &all).stdin(Stdio::null()).output().unwrap();
        (out, t0.elapsed())
    }
}

/// Two pseudo-hosts, one parent rank on each (`--map-by node`), with 2 and 1 slots free.
const TWO_HOSTS: [&str; 6] = [
    "-H",
    "127.0.0.2:3,127.0.0.3:2",
    "--map-by",
    "node",
    "-n",
    "2",
];

fn spawn_multiple_across_hosts(lib: Library) {
    let (d, local) = shell();
    let exe = lib.build(d.path(), "spawn_multiple");
    let (out, _) = lib.run(
        &local,
        &TWO_HOSTS,
        &[&exe, "across", "127.0.0.2", "127.0.0.3"],
    );
    let stdout = text(&out.stdout);
    let all = format!("{stdout}{}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{}: {all}", lib.name);
    // Children 0 and 1 run the first command on the first host, child 2 the second on the
    // second host; greedyrun labels them [1:rank] (the job's first spawned job).
    for (rank, app, node) in [(0, 0, 0), (1, 0, 0), (2, 1, 1)] {
        let seen = format!("[0] parent: child {rank} app {app} on node{node}");
        assert!(stdout.contains(&seen), "{}: {seen} in {all}", lib.name);
        let own = format!("[1:{rank}] child {rank} of 3 app {app}: parent size 2");
        assert!(stdout.contains(&own), "{}: {own} in {all}", lib.name);
    }
}

#[test]
fn mpich5_spawn_multiple_runs_each_command_on_its_host() {
    spawn_multiple_across_hosts(mpich5());
}

#[test]
fn openmpi5_spawn_multiple_runs_each_command_on_its_host() {
    spawn_multiple_across_hosts(ompi5());
}

#[test]
fn openmpi41_spawn_multiple_runs_each_command_on_its_host() {
    spawn_multiple_across_hosts(ompi41());
}

/// A missing program and a spawn beyond the slots fail at once on every parent rank with the
/// library's spawn error, and the job goes on to a clean end; greedyrun says why.
fn failing_spawns_fail_at_once(lib: Library, class: &str) {
    let (d, local) = shell();
    let exe = lib.build(d.path(), "spawn_multiple");
    for (mode, why) in [
        ("missing", "/nonexistent/greedy-spawn-child"),
        ("many", "no free slots"),
    ] {
        let (out, took) = lib.run(&local, &TWO_HOSTS, &[&exe, mode]);
        let stdout = text(&out.stdout);
        let all = format!("{stdout}{}", text(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{} {mode}: {all}", lib.name);
        for rank in 0..2 {
            let line = format!("[{rank}] rank {rank}: spawn error class {class}");
            assert!(
                stdout.contains(&line),
                "{} {mode}: {line} in {all}",
                lib.name
            );
        }
        assert!(
            all.contains(why),
            "{} {mode}: no {why:?} in {all}",
            lib.name
        );
        assert!(
            took < Duration::from_secs(20),
            "{} {mode}: {took:?}",
            lib.name
        );
    }
}

#[test]
fn mpich5_failing_spawns_fail_at_once() {
    // MPI_ERR_OTHER: PMI_Spawn_multiple's failure.
    failing_spawns_fail_at_once(mpich5(), "15");
}

#[test]
fn openmpi5_failing_spawns_fail_at_once() {
    // MPI_ERR_UNKNOWN: PMIx_Spawn's error as Open MPI 5 passes it to every rank.
    failing_spawns_fail_at_once(ompi5(), "14");
}

/// A child that exits 7 while its parents wait for it ends the whole job with 7, naming the
/// spawned job's rank and host, within seconds.
fn a_crashing_child_ends_the_job(lib: Library) {
    let (d, local) = shell();
    let exe = lib.build(d.path(), "spawn_multiple");
    let (out, took) = lib.run(&local, &TWO_HOSTS, &[&exe, "crash"]);
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    // The child's code; or, when its agent reaped it after its parent, whose connection to
    // it was refused, had aborted (a busy host), the abort's code with the child named.
    let code = out.status.code();
    assert!(
        code == Some(7) || all.contains("perhaps the abort's cause"),
        "{}: {all}",
        lib.name
    );
    assert!(all.contains("spawned job"), "{}: {all}", lib.name);
    assert!(all.contains("exited with code 7"), "{}: {all}", lib.name);
    assert!(took < Duration::from_secs(30), "{}: {took:?}", lib.name);
}

#[test]
fn mpich5_crashing_child_ends_the_job() {
    a_crashing_child_ends_the_job(mpich5());
}

#[test]
fn openmpi5_crashing_child_ends_the_job() {
    a_crashing_child_ends_the_job(ompi5());
}

/// `MPI_UNIVERSE_SIZE` is the job's slots (3 + 2), not its ranks (2): what a program sizes a
/// spawn by (mpi4py's `MPIPoolExecutor` starts `UNIVERSE_SIZE - 1` workers).
fn universe_is_the_slots(lib: Library) {
    let (d, local) = shell();
    let exe = lib.build(d.path(), "spawn_multiple");
    let (out, _) = lib.run(&local, &TWO_HOSTS, &[&exe, "universe"]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}: {stdout}{}",
        lib.name,
        text(&out.stderr)
    );
    for rank in 0..2 {
        let line = format!("[{rank}] rank {rank}: universe 5");
        assert!(stdout.contains(&line), "{}: {line} in {stdout}", lib.name);
    }
}

#[test]
fn mpich5_universe_is_the_slots() {
    universe_is_the_slots(mpich5());
}

#[test]
fn openmpi5_universe_is_the_slots() {
    universe_is_the_slots(ompi5());
}
