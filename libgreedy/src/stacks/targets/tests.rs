//! Tests of rank discovery: a fake /proc in a temp dir, and one look at the real one.

use std::path::Path;
use std::process::{Child, Command};

use super::*;

/// A fake process: `pid comm ppid start` and its environment (`None`: unreadable environ).
struct Fake<'a> {
    pid: u32,
    comm: &'a str,
    ppid: u32,
    start: u64,
    env: Option<&'a [(&'a str, &'a str)]>,
}

fn fake<'a>(pid: u32, comm: &'a str, ppid: u32, env: Option<&'a [(&'a str, &'a str)]>) -> Fake<'a> {
    Fake {
        pid,
        comm,
        ppid,
        start: u64::from(pid),
        env,
    }
}

/// Writes `procs` as /proc/PID/{stat,environ} under `root`, plus entries that are not processes.
fn write_proc(root: &Path, procs: &[Fake<'_>]) {
    for p in procs {
        let dir = root.join(p.pid.to_string());
        fs::create_dir_all(&dir).unwrap();
        // Fields 3.. of a real stat line, with ppid and starttime in their places.
        let stat = format!(
            "{} ({}) S {} 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 {} 1 1\n",
            p.pid, p.comm, p.ppid, p.start
        );
        fs::write(dir.join("stat"), stat).unwrap();
        if let Some(env) = p.env {
            let environ: Vec<u8> = env
                .iter()
                .flat_map(|(k, v)| format!("{k}={v}\0").into_bytes())
                .collect();
            fs::write(dir.join("environ"), environ).unwrap();
        }
    }
    fs::create_dir_all(root.join("sys")).unwrap();
    fs::write(root.join("uptime"), "1 1\n").unwrap();
}

fn check(procs: &[Fake<'_>], job: &Job, expect: &[(u32, u32)]) {
    let dir = tempfile::tempdir().unwrap();
    write_proc(dir.path(), procs);
    let got = local_ranks_in(dir.path(), job, None).unwrap();
    let got: Vec<(u32, u32)> = got.iter().map(|r| (r.rank, r.pid)).collect();
    assert_eq!(got, expect, "{job}");
}

fn greedy(job: &str) -> Job {
    Job::Greedy {
        job: job.to_string(),
    }
}

#[test]
fn greedy_ranks_by_environment() {
    let r0: &[_] = &[("GREEDY_JOB", "j1"), ("GREEDY_RANK", "0")];
    let r1: &[_] = &[("HOME", "/"), ("GREEDY_JOB", "j1"), ("GREEDY_RANK", "1")];
    let other: &[_] = &[("GREEDY_JOB", "j2"), ("GREEDY_RANK", "0")];
    let task: &[_] = &[("GREEDY_JOB", "j1"), ("GREEDY_TASK", "3")];
    let prefix: &[_] = &[("GREEDY_JOB", "j10"), ("GREEDY_RANK", "5")];
    let procs = [
        fake(100, "greedyd", 1, Some(r0)),
        fake(102, "app", 100, Some(r1)),
        fake(101, "app", 100, Some(r0)),
        fake(103, "app", 100, Some(other)),
        fake(104, "task", 100, Some(task)),
        fake(105, "app", 100, Some(prefix)),
        fake(106, "app", 100, None),
    ];
    check(&procs, &greedy("j1"), &[(0, 101), (1, 102)]);
    check(&procs, &greedy("j2"), &[(0, 103)]);
    check(&procs, &greedy("nope"), &[]);
}

#[test]
fn with_a_host_only_that_hosts_ranks_are_taken() {
    let here: &[_] = &[
        ("GREEDY_JOB", "j"),
        ("GREEDY_RANK", "0"),
        ("GREEDY_HOST", "n1"),
    ];
    let there: &[_] = &[
        ("GREEDY_JOB", "j"),
        ("GREEDY_RANK", "1"),
        ("GREEDY_HOST", "n2"),
    ];
    let unnamed: &[_] = &[("GREEDY_JOB", "j"), ("GREEDY_RANK", "2")];
    let procs = [
        fake(10, "app", 1, Some(here)),
        fake(11, "app", 1, Some(there)),
        fake(12, "app", 1, Some(unnamed)),
    ];
    let dir = tempfile::tempdir().unwrap();
    write_proc(dir.path(), &procs);
    let got = local_ranks_in(dir.path(), &greedy("j"), Some("n1")).unwrap();
    let got: Vec<(u32, u32)> = got.iter().map(|r| (r.rank, r.pid)).collect();
    assert_eq!(got, [(0, 10), (2, 12)]);
}

#[test]
fn a_greedyrun_pid_names_its_job() {
    let job: &[_] = &[("GREEDY_JOB", "greedy42.77"), ("GREEDY_RANK", "0")];
    let other: &[_] = &[("GREEDY_JOB", "greedy420.1"), ("GREEDY_RANK", "1")];
    let procs = [
        fake(100, "app", 1, Some(job)),
        fake(101, "app", 1, Some(other)),
    ];
    check(&procs, &greedy("greedy42"), &[(0, 100)]);
    check(&procs, &greedy("greedy42.77"), &[(0, 100)]);
    check(&procs, &greedy("greedy42.7"), &[]);
}

#[test]
fn a_ranks_descendants_are_not_ranks() {
    let r0: &[_] = &[("GREEDY_JOB", "j"), ("GREEDY_RANK", "0")];
    let procs = [
        fake(50, "greedy-guard", 1, Some(r0)),
        fake(60, "sh", 50, Some(r0)),
        fake(61, "sudo", 60, None),
        fake(62, "app", 61, Some(r0)),
        fake(63, "app", 62, Some(r0)),
        fake(64, "srun", 62, Some(r0)),
    ];
    check(&procs, &greedy("j"), &[(0, 60)]);
}

#[test]
fn of_two_unrelated_claims_the_oldest_wins() {
    let r0: &[_] = &[("GREEDY_JOB", "j"), ("GREEDY_RANK", "0")];
    let mut young = fake(10, "app", 1, Some(r0));
    young.start = 900;
    let old = fake(20, "app", 1, Some(r0));
    check(&[young, old], &greedy("j"), &[(0, 20)]);
}

/// Slurm: slurmstepd's per-task watcher carries the task's environment.
fn slurm_procs<'a>(
    step0: &'a [(&'a str, &'a str)],
    step1: &'a [(&'a str, &'a str)],
) -> Vec<Fake<'a>> {
    vec![
        fake(200, "slurmstepd", 1, None),
        fake(201, "slurmstepd", 200, Some(step0)),
        fake(202, "a.out", 201, Some(step0)),
        fake(300, "slurmstepd", 1, None),
        fake(301, "slurmstepd", 300, Some(step1)),
        fake(302, "b.out", 301, Some(step1)),
    ]
}

#[test]
fn slurm_steps() {
    let env = |step, rank| -> Vec<(&str, &str)> {
        vec![
            ("SLURM_JOB_ID", "77"),
            ("SLURM_STEP_ID", step),
            ("SLURM_PROCID", rank),
        ]
    };
    let (s0, s1, batch) = (env("0", "4"), env("1", "4"), env("4294967291", "0"));
    let procs = slurm_procs(&s0, &s1);
    check(
        &procs,
        &Job::Slurm {
            job: 77,
            step: Some(0),
        },
        &[(4, 202)],
    );
    check(
        &procs,
        &Job::Slurm {
            job: 77,
            step: Some(1),
        },
        &[(4, 302)],
    );
    check(
        &procs,
        &Job::Slurm {
            job: 78,
            step: None,
        },
        &[],
    );
    // One step here, plus the batch script's special step: the step is meant.
    let procs = slurm_procs(&s0, &batch);
    check(
        &procs,
        &Job::Slurm {
            job: 77,
            step: None,
        },
        &[(4, 202)],
    );
    check(
        &procs,
        &Job::Slurm {
            job: 77,
            step: Some(4294967291),
        },
        &[(0, 302)],
    );
}

#[test]
fn slurm_job_with_two_steps_here_needs_a_step() {
    let s0 = [
        ("SLURM_JOB_ID", "77"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_PROCID", "0"),
    ];
    let s1 = [
        ("SLURM_JOB_ID", "77"),
        ("SLURM_STEP_ID", "1"),
        ("SLURM_PROCID", "0"),
    ];
    let dir = tempfile::tempdir().unwrap();
    write_proc(dir.path(), &slurm_procs(&s0, &s1));
    let err = local_ranks_in(
        dir.path(),
        &Job::Slurm {
            job: 77,
            step: None,
        },
        None,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "slurm job 77: steps [0, 1] run on this node: name one (JOB.STEP)"
    );
}

#[test]
fn missing_proc_root_names_it() {
    let err = local_ranks_in(Path::new("/nonexistent/proc"), &greedy("j"), None).unwrap_err();
    assert!(err.to_string().starts_with("/nonexistent/proc: "), "{err}");
}

#[test]
fn stat_names_with_parentheses_and_spaces() {
    let line = "42 (a (b) c) S 7 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 12345 1 1";
    let stat = parse_stat(line).unwrap();
    assert_eq!(
        stat,
        Stat {
            comm: "a (b) c".to_string(),
            ppid: 7,
            start: 12345
        }
    );
    assert_eq!(parse_stat("42 (x) S"), None);
}

/// Kills and reaps a spawned process when the test ends, passed or not.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn finds_real_processes_in_proc() {
    let job = format!("stacks-test-{}", std::process::id());
    let spawn = |rank: &str, cmd: &str| {
        let child = Command::new("sh")
            .args(["-c", cmd])
            .env("GREEDY_JOB", &job)
            .env("GREEDY_RANK", rank)
            .spawn()
            .unwrap();
        Reaped(child)
    };
    // `; true` keeps sh from exec'ing sleep, so rank 3 is sh with a sleep child claiming 3 too.
    let (r3, r7) = (spawn("3", "sleep 30; true"), spawn("7", "exec sleep 30"));
    let got = local_ranks(&greedy(&job), None).unwrap();
    let expect = [
        RankProcess {
            rank: 3,
            pid: r3.0.id(),
        },
        RankProcess {
            rank: 7,
            pid: r7.0.id(),
        },
    ];
    assert_eq!(got, expect);
}

#[test]
fn jobs_are_named_as_slurm_shows_them_and_cross_to_the_daemons_intact() {
    let step = Job::slurm("12.3").unwrap();
    assert_eq!(
        step,
        Job::Slurm {
            job: 12,
            step: Some(3)
        }
    );
    assert_eq!(
        Job::slurm("12").unwrap(),
        Job::Slurm {
            job: 12,
            step: None
        }
    );
    for job in [step, Job::slurm("7").unwrap(), greedy("greedy4242")] {
        assert_eq!(Job::from_arg(&job.to_arg()).unwrap(), job);
    }
    for bad in ["", "12.", ".3", "12.x", "j12", "12.3.4", "-1"] {
        let e = Job::slurm(bad).unwrap_err().to_string();
        assert!(e.contains(&format!("{bad:?}")) && e.contains("J.S"), "{e}");
    }
    for bad in ["greedy:", "12", "pbs:3", "slurm:x"] {
        assert!(Job::from_arg(bad).is_err(), "{bad}");
    }
}
