//! A session's task streams with tasks of several ranks and of MPI, end to end on this
//! machine through the fake remote shell: MPICH and Open MPI tasks wire up with no flag, each
//! in its own namespace, their failures are their own, no host runs more ranks than it has
//! slots, and a cancelled stream leaves no rank behind.

mod common;

use std::{
    collections::BTreeMap,
    path::Path,
    process::{Output, Stdio},
    time::{Duration, Instant},
};

use common::{
    EndsSession, greedyrun, interrupt, mpi_build, processes_with, results_by_task, session_process,
    shell, text, two_host_session,
};

/// The environment Open MPI 5 from its venv needs here (as the spawn tests give it).
fn ompi_env() -> serde_json::Value {
    let prefix = std::env::var("GREEDY_OMPI5").unwrap_or("/var/tmp/greedy-ompi5".into());
    serde_json::json!({
        "OPAL_PREFIX": prefix,
        "OMPI_MCA_pml": "ob1",
        "OMPI_MCA_btl": "self,sm,tcp",
        "OMPI_MCA_btl_tcp_if_include": "lo",
    })
}

/// tests/mpi/wireup.c built with MPICH 5 and Open MPI 5 in `dir`: (mpich, ompi).
fn wireup_programs(dir: &Path) -> (String, String) {
    let mpich = std::env::var("GREEDY_MPICH5").unwrap_or("/var/tmp/greedy-mpich5".into());
    let ompi = std::env::var("GREEDY_OMPI5").unwrap_or("/var/tmp/greedy-ompi5".into());
    let from = "tests/mpi/clients.sh installs the PyPI libraries";
    let a = mpi_build(
        &format!("{mpich}/bin/mpicc"),
        &[],
        dir,
        "wireup",
        "mpich",
        from,
    );
    let env = [("OPAL_PREFIX", ompi.as_str())];
    let b = mpi_build(
        &format!("{ompi}/bin/mpicc"),
        &env,
        dir,
        "wireup",
        "ompi",
        from,
    );
    (a, b)
}

/// Runs the stream of `lines` on the session at `socket`, tagged, with `--results res`.
fn run_on_session(dir: &Path, local: &Path, socket: &str, lines: &[String]) -> Output {
    std::fs::write(dir.join("tasks"), lines.join("\n") + "\n").unwrap();
    greedyrun(
        local,
        &["--tag-output", "--results", "res", "--tasks", "tasks"],
    )
    .current_dir(dir)
    .env("GREEDY_SESSION", socket)
    .stdin(Stdio::null())
    .output()
    .unwrap()
}

/// Ends the session at `socket` and checks that its process exits: no client of its job
/// tasks keeps it up.
fn end_session(socket: &str) {
    // The session's own process, not an agent or guard that inherited its environment.
    let serve = session_process(socket)
        .filter(|p| {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            text(&cmd).contains("--start-session")
        })
        .expect("the session's process");
    let out = std::process::Command::new(common::GREEDYRUN)
        .arg("--end-session")
        .env("GREEDY_SESSION", socket)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let t0 = Instant::now();
    while Path::new(&format!("/proc/{serve}")).exists() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    // Its agents' guards may still be ending what a lost host left (their grace).
    let alive = Path::new(&format!("/proc/{serve}")).exists();
    assert!(!alive, "the session did not end");
}

/// The most ranks that ran at once on each host, from the results' run intervals (each
/// task's ranks live within its run).
fn most_at_once(res: &BTreeMap<u64, serde_json::Value>) -> BTreeMap<String, u64> {
    let mut events: Vec<(f64, i64, String)> = Vec::new();
    for v in res.values().filter(|v| v["exit"].is_number()) {
        let (end, wall) = (v["end_s"].as_f64().unwrap(), v["wall_s"].as_f64().unwrap());
        let hosts = match v["rank_hosts"].as_array() {
            Some(hosts) => hosts.iter().map(|h| h.as_str().unwrap()).collect(),
            None => vec![v["host"].as_str().unwrap()],
        };
        for host in hosts {
            // Ends sort before starts at one instant: results round to milliseconds.
            events.push((end - wall + 0.002, 1, host.to_string()));
            events.push((end, -1, host.to_string()));
        }
    }
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut most) = (BTreeMap::<String, i64>::new(), BTreeMap::new());
    for (_, delta, host) in events {
        let n = now.entry(host.clone()).or_default();
        *n += delta;
        let m = most.entry(host).or_insert(0u64);
        *m = (*m).max(*n as u64);
    }
    most
}

#[test]
fn mpi_tasks_of_both_families_wire_up_in_a_session_stream() {
    let (d, local) = shell();
    let dir = d.path();
    let (mpich, ompi) = wireup_programs(dir);
    let socket = two_host_session(&local, 4, "60");
    let _ends = EndsSession(socket.clone());
    let task = |prog: &str, ranks: u32, arg: Option<&str>| {
        let mut env = if prog == ompi {
            ompi_env()
        } else {
            serde_json::json!({})
        };
        env["EXPECT_SIZE"] = ranks.to_string().into();
        let mut argv = vec![prog.to_string()];
        argv.extend(arg.map(String::from));
        serde_json::json!({"argv": argv, "ranks": ranks, "mpi": true, "env": env}).to_string()
    };
    let mut lines = Vec::new();
    for i in 0..8 {
        let prog = if i % 2 == 0 { &mpich } else { &ompi };
        lines.push(task(prog, 2 + i % 3, None));
    }
    // Line 9: rank 1 crashes after MPI_Init; line 10 is too big for the hosts; line 11 is a
    // plain command beside them; 12 and 13 span both hosts.
    lines.push(task(&mpich, 2, Some("exit-after-init=1:5")));
    lines.push(task(&mpich, 9, None));
    lines.push("echo plain".into());
    lines.push(task(&mpich, 6, None));
    lines.push(task(&ompi, 7, None));
    let out = run_on_session(dir, &local, &socket, &lines);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let ranks_of = |line: u32| match line {
        12 => 6,
        13 => 7,
        _ => 2 + (line - 1) % 3,
    };
    for line in (1..=8).chain([12, 13]) {
        let ranks = ranks_of(line);
        for r in 0..ranks {
            let ok = format!("[task {line}] rank {r} of {ranks}: ok");
            assert!(stdout.contains(&ok), "{ok} in {stdout}{stderr}");
        }
    }
    assert!(stdout.contains("[task 11] plain"), "{stdout}");
    assert!(
        stderr.contains(
            "task 10: not run, it needs 9 ranks of 1 slots and the hosts have room for 8"
        ),
        "{stderr}"
    );
    let res = results_by_task(&dir.join("res"));
    assert_eq!(res.len(), 13, "every task reported once: {res:?}");
    for line in (1..=8).chain([11, 12, 13]) {
        assert_eq!(res[&line]["exit"], 0, "task {line}: {:?}", res[&line]);
    }
    assert_eq!(res[&9]["exit"], 5, "{:?}\n{stderr}", res[&9]);
    assert!(stderr.contains("task 9 on "), "{stderr}");
    assert_eq!(res[&3]["rank_hosts"].as_array().map(Vec::len), Some(4));
    for line in [12, 13] {
        let hosts: std::collections::BTreeSet<_> =
            (res[&line]["rank_hosts"].as_array().unwrap().iter())
                .map(|h| h.as_str())
                .collect();
        assert_eq!(
            hosts.len(),
            2,
            "task {line} spans both hosts: {:?}",
            res[&line]
        );
    }
    for (host, n) in most_at_once(&res) {
        assert!(n <= 4, "{host} ran {n} ranks at once: {res:?}");
    }
    end_session(&socket);
}

/// Ctrl-C on a stream whose job tasks (three ranks each, no MPI) run: the session ends their
/// jobs, no rank is left on any host, and the session runs on, idle.
#[test]
fn a_cancelled_stream_leaves_no_rank_of_its_job_tasks() {
    let (d, local) = shell();
    let dir = d.path();
    let socket = two_host_session(&local, 4, "60");
    let _ends = EndsSession(socket.clone());
    let marker = format!("job-task-{}", std::process::id());
    let line =
        serde_json::json!({"argv": ["sh", "-c", format!("sleep 30; : {marker}")], "ranks": 3});
    let lines = [line.to_string(), line.to_string()];
    std::fs::write(dir.join("tasks"), lines.join("\n") + "\n").unwrap();
    let child = greedyrun(&local, &["--tasks", "tasks"])
        .current_dir(dir)
        .env("GREEDY_SESSION", &socket)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while processes_with(&marker).len() < 6 && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    interrupt(&child);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
    // The session saw its client go: it ends the tasks' jobs and runs on, idle.
    let left = Instant::now();
    let busy = || {
        let status = greedyrun(&local, &["--status"])
            .env("GREEDY_SESSION", &socket)
            .output()
            .unwrap();
        let said = text(&status.stderr) + &text(&status.stdout);
        !said.contains("0 tasks running, 0 jobs running") || !processes_with(&marker).is_empty()
    };
    while busy() && left.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(processes_with(&marker), Vec::<String>::new());
    assert!(!busy(), "the session still runs the stream's jobs");
    end_session(&socket);
}

/// A host lost under a job task (its rank kills the host's agent): the task runs again on
/// the other host, every task is reported once, and the lost run's ranks are gone.
#[test]
fn a_lost_hosts_job_tasks_run_again_elsewhere() {
    let (d, local) = shell();
    let dir = d.path();
    let socket = two_host_session(&local, 4, "60");
    let _ends = EndsSession(socket.clone());
    let killed = dir.join("killed");
    let kill = format!(
        "if [ $GREEDY_RANK = 0 ] && [ ! -e {k} ]; then touch {k}; sleep 0.3; kill -9 $PPID; sleep 30; fi; sleep 0.05; echo ran",
        k = killed.display()
    );
    let lines: Vec<String> = (1..=6)
        .map(|i| {
            let cmd = if i == 3 {
                kill.clone()
            } else {
                "sleep 0.05; echo ran".into()
            };
            serde_json::json!({"argv": ["sh", "-c", cmd], "ranks": 2}).to_string()
        })
        .collect();
    let out = run_on_session(dir, &local, &socket, &lines);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stderr.contains(" lost"), "{stderr}");
    let res = results_by_task(&dir.join("res"));
    assert_eq!(
        res.keys().copied().collect::<Vec<_>>(),
        (1..=6).collect::<Vec<_>>()
    );
    assert!(res.values().all(|v| v["exit"] == 0), "{res:?}");
    // Task 3's first run may have got as far as its rank 1's line before the host went.
    for i in [1, 2, 4, 5, 6] {
        assert_eq!(
            stdout.matches(&format!("[task {i}] ran\n")).count(),
            2,
            "{stdout}"
        );
    }
    assert!(stdout.matches("[task 3] ran\n").count() >= 2, "{stdout}");
    let lost = stderr
        .split("host ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .unwrap();
    assert_ne!(res[&3]["host"], lost, "{stderr}");
    let marker = format!("{} ]", killed.display());
    let left = Instant::now();
    while !processes_with(&marker).is_empty() && left.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(processes_with(&marker), Vec::<String>::new());
    end_session(&socket);
}

/// greedyrun's own stream (no session) runs MPI tasks too, on a socket of its own that it
/// removes at its end; a failing rank is its task's failure.
#[test]
fn mpi_tasks_run_in_greedyruns_own_stream() {
    let (d, local) = shell();
    let dir = d.path();
    let (mpich, _) = wireup_programs(dir);
    let runtime = dir.join("runtime");
    std::fs::create_dir(&runtime).unwrap();
    let task = |ranks: u32, arg: &str| {
        let env = serde_json::json!({"EXPECT_SIZE": ranks.to_string()});
        serde_json::json!({"argv": [mpich, arg], "ranks": ranks, "mpi": true, "env": env})
            .to_string()
    };
    let lines = [task(3, "-"), task(2, "exit-after-init=0:6"), task(5, "-")];
    std::fs::write(dir.join("tasks"), lines.join("\n") + "\n").unwrap();
    let out = greedyrun(&local, &["-H", "localhost:4,127.0.0.2:2", "--tag-output"])
        .args(["--results", "res", "--tasks", "tasks"])
        .current_dir(dir)
        .env_remove("GREEDY_SESSION")
        .env("XDG_RUNTIME_DIR", &runtime)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    for (line, ranks) in [(1, 3), (3, 5)] {
        for r in 0..ranks {
            let ok = format!("[task {line}] rank {r} of {ranks}: ok");
            assert!(stdout.contains(&ok), "{ok} in {stdout}{stderr}");
        }
    }
    let res = results_by_task(&dir.join("res"));
    let exits: Vec<_> = (1..=3).map(|l| res[&l]["exit"].as_i64()).collect();
    assert_eq!(exits, [Some(0), Some(6), Some(0)], "{res:?}");
    let left: Vec<_> = std::fs::read_dir(&runtime).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A task of several ranks that lists an input: each rank finds it on its own host, linked in
/// that host's directory for the job (`GREEDY_STAGED`).
#[test]
fn a_job_tasks_ranks_find_its_inputs_on_their_hosts() {
    let (d, local) = shell();
    let dir = d.path();
    let input = dir.join("in.txt");
    std::fs::write(&input, "the input\n").unwrap();
    let socket = two_host_session(&local, 2, "60");
    let _ends = EndsSession(socket.clone());
    let check = r#"test "$(cat "$GREEDY_STAGED/in.txt")" = "the input" && echo ok $GREEDY_RANK $GREEDY_STAGED"#;
    let line = serde_json::json!({"argv": ["sh", "-c", check], "ranks": 3, "inputs": [input]});
    let out = run_on_session(dir, &local, &socket, &[line.to_string()]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let dirs: std::collections::BTreeSet<&str> = (stdout.lines())
        .filter_map(|l| l.strip_prefix("[task 1] ok "))
        .map(|l| l.split(' ').nth(1).unwrap())
        .collect();
    assert_eq!(stdout.matches("] ok ").count(), 3, "{stdout}{stderr}");
    assert_eq!(
        dirs.len(),
        2,
        "one directory on each of the two hosts: {stdout}"
    );
    end_session(&socket);
}
