//! Task streams whose lines are JSON task descriptions, end to end on this machine through
//! the fake remote shell of `tests/common`: each field reaches the task, bad lines fail alone
//! naming their line, and tasks of several cores never share a host's slots.

mod common;

use std::{
    path::Path,
    process::{Output, Stdio},
};

use common::{EndsSession, greedyrun, results_by_task, shell, text, two_host_session};

/// Runs the stream of `lines` (written to `dir/tasks`) with `greedyrun ARGS --tasks tasks`
/// in `dir`, through `local`.
fn run_stream<S: AsRef<str>>(dir: &Path, local: &Path, lines: &[S], args: &[&str]) -> Output {
    let lines: Vec<&str> = lines.iter().map(AsRef::as_ref).collect();
    std::fs::write(dir.join("tasks"), lines.join("\n") + "\n").unwrap();
    greedyrun(local, args)
        .args(["--tasks", "tasks"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn json_lines_run_as_they_describe_and_bad_ones_fail_alone() {
    let (d, local) = shell();
    let dir = d.path();
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::fs::write(dir.join("in.txt"), "from-stdin\n").unwrap();
    let lines = [
        r#"{"name":"envy","argv":["sh","-c","echo $GREEDY_X $PWD"],"env":{"GREEDY_X":"set"},"cwd":"sub"}"#,
        r#"{"command":"echo to-file; echo to-err >&2","stdout":"o.txt","stderr":"e.txt","cwd":"sub"}"#,
        r#"{"argv":["cat"],"stdin":"in.txt"}"#,
        r#"{"command":"true","rank":2}"#,
        r#"{"command":"true","cores_per_rank":9}"#,
        r#"{"name":"flaky","command":"exit 3","retries":1}"#,
        r#"{"command":"true","ranks":0}"#,
        r#"{"command":"true","cwd":"missing"}"#,
        r#"{"argv":["echo","a  b","$HOME"]}"#,
        r#"{"argv":["./no-such-program"]}"#,
    ];
    let out = run_stream(dir, &local, &lines, &["-H", "a:4", "--results", "res"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let sub = std::fs::canonicalize(dir.join("sub")).unwrap();
    assert!(
        stdout.contains(&format!("set {}\n", sub.display())),
        "{stdout}"
    );
    let file = |f: &str| std::fs::read_to_string(dir.join("sub").join(f)).unwrap();
    assert_eq!(
        (file("o.txt"), file("e.txt")),
        ("to-file\n".into(), "to-err\n".into())
    );
    assert!(
        !stdout.contains("to-file") && !stderr.contains("to-err"),
        "{stdout}{stderr}"
    );
    assert!(stdout.contains("from-stdin\n"), "{stdout}");
    // argv runs without a shell: no word splitting, no expansion.
    assert!(stdout.contains("a  b $HOME\n"), "{stdout}");
    for said in [
        "task 4: not run, not a task description: unknown field `rank`",
        "task 5: not run, it needs 9 slots on one host and the largest host has 4",
        "task 6 on a ended with 3 after 2 runs: flaky",
        "task 7: not run, \"ranks\": must be at least 1",
        "task 8: cannot run \"true\": working directory",
        "task 10: cannot run \"./no-such-program\": No such file",
    ] {
        assert!(stderr.contains(said), "{said:?} in {stderr}");
    }
    let res = results_by_task(&dir.join("res"));
    assert_eq!(res.len(), lines.len(), "{res:?}");
    assert_eq!(
        (res[&1]["name"].as_str(), res[&1]["exit"].as_i64()),
        (Some("envy"), Some(0))
    );
    assert_eq!(
        (res[&6]["runs"].as_u64(), res[&6]["exit"].as_i64()),
        (Some(2), Some(3))
    );
    assert_eq!(
        (&res[&8]["exit"], &res[&10]["exit"]),
        (&127.into(), &127.into())
    );
    for bad in [4, 5, 7] {
        assert!(
            res[&bad]["error"].is_string() && res[&bad]["exit"].is_null(),
            "{res:?}"
        );
    }
}

/// Tasks of 2 cores on a host of 5 slots: never more than 2 at once, checked from inside the
/// tasks; a 1-core line after them waits its turn, then runs beside them.
#[test]
fn multi_core_tasks_never_share_a_hosts_slots() {
    let (d, local) = shell();
    let dir = d.path();
    // Each task counts itself in while it runs (mkdir is atomic) and records the most seen.
    let task = r#"mkdir in.$GREEDY_TASK && n=$(ls -d in.* | wc -l) && echo $n >> seen && sleep 0.3 && rmdir in.$GREEDY_TASK"#;
    let mut lines = vec![task.to_string(); 6];
    lines.push(format!(
        r#"{{"command":"{}","cores_per_rank":1}}"#,
        task.replace('"', "\\\"")
    ));
    let out = run_stream(dir, &local, &lines, &["-H", "a:5", "--task-cores", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let seen: Vec<u32> = std::fs::read_to_string(dir.join("seen"))
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(seen.len(), 7, "{seen:?}");
    // 2 two-core tasks take 4 of the 5 slots; the one-core task may join them: 5 cores.
    assert!(seen.iter().all(|&n| n <= 3), "{seen:?}");
    assert!(seen[..6].iter().all(|&n| n >= 1), "{seen:?}");
}

/// A session's client passes its `--task-cores` to the session: a 3-core plain line on
/// hosts of 2 slots fails at once, named.
#[test]
fn a_session_stream_gets_its_clients_defaults() {
    let (d, local) = shell();
    let socket = two_host_session(&local, 2, "60");
    let _ends = EndsSession(socket.clone());
    std::fs::write(d.path().join("tasks"), "true\n").unwrap();
    let out = greedyrun(&local, &["--task-cores", "3", "--tasks", "tasks"])
        .current_dir(d.path())
        .env("GREEDY_SESSION", &socket)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("it needs 3 slots on one host and the largest host has 2"),
        "{stderr}"
    );
}

/// With `--bind-to core`, each running task holds cores of its own, and so does each rank
/// of a job task: every task and rank claims its CPU while it runs (mkdir fails on a CPU
/// another holds) and exits 9 on a clash; a 2-core task is bound too.
#[test]
fn bound_tasks_never_share_a_core() {
    let (d, local) = shell();
    let dir = d.path();
    let claim = r#"c=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status); mkdir busy.$c || exit 9; echo $c >> cpus; sleep 0.2; rmdir busy.$c"#;
    let mut lines = vec![claim.to_string(); 6];
    let job = |more: &str| format!(r#"{{"argv":["sh","-c",{claim:?}],{more}}}"#);
    lines.insert(1, job(r#""ranks":2"#));
    lines.insert(3, job(r#""mpi":true"#));
    lines.insert(5, job(r#""ranks":2"#));
    lines.push(r#"{"argv":["sh","-c","echo $GREEDY_CPUS > wide"],"cores_per_rank":2}"#.into());
    // A host whose address resolves: job tasks wire up over it.
    let bound = ["-H", "localhost:2", "--bind-to", "core"];
    let out = run_stream(dir, &local, &lines, &bound);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let cpus = std::fs::read_to_string(dir.join("cpus")).unwrap();
    assert_eq!(cpus.lines().count(), 11, "{cpus}");
    let cores: std::collections::BTreeSet<&str> = cpus.lines().collect();
    assert_eq!(cores.len(), 2, "each task one of the 2 cores: {cpus}");
    let wide = std::fs::read_to_string(dir.join("wide")).unwrap();
    assert!(!wide.trim().is_empty(), "the 2-core task was bound: {wide}");
}
