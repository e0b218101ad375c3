//! Tasks' input files staged to their hosts and output files collected back, end to end
//! through the fake remote shell: each task reads its inputs, byte for byte, from a directory
//! of its own on its host; a file is sent down the tree once per content (said once), again
//! when it changed, and a session keeps it for its later streams; every host's copy is gone
//! when the run or session ends; outputs come back whole and are named in the results.

mod common;

use std::{
    path::Path,
    process::{Command, Output, Stdio},
};

use common::{GREEDYRUN, greedyrun, results_by_task, session_socket, shell, text};

/// `n` tasks that each check their staged `in.bin` against `expected.bin` and say so, and
/// one whose input does not exist.
fn lines(n: usize) -> String {
    let check = r#"cmp "$GREEDY_STAGED/in.bin" expected.bin && test -L "$GREEDY_STAGED/in.bin" && echo ok $GREEDY_TASK"#;
    let task = serde_json::json!({"argv": ["sh", "-c", check], "inputs": ["in.bin"]});
    let mut lines = vec![task.to_string(); n];
    lines.push(r#"{"command":"true","inputs":["missing.bin"]}"#.into());
    lines.join("\n") + "\n"
}

/// Writes `in.bin` (and its reference copy) of 3 MiB, the byte `seed` mixed in.
fn input(dir: &Path, seed: u8) {
    let data: Vec<u8> = (0..3usize << 20).map(|i| (i % 251) as u8 ^ seed).collect();
    std::fs::write(dir.join("in.bin"), &data).unwrap();
    std::fs::write(dir.join("expected.bin"), &data).unwrap();
}

/// Checks a stream's `out`: its `n` tasks saw their input, the missing one failed naming
/// it, and the input was sent `sent` times.
fn check(out: &Output, n: usize, sent: usize) {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert_eq!(stdout.matches("ok ").count(), n, "{stdout}{stderr}");
    let line = n + 1;
    let missing = format!("task {line}: not run, input missing.bin: No such file");
    assert!(stderr.contains(&missing), "{stderr}");
    let said = stderr.matches("staged in.bin (3145728 bytes").count();
    assert_eq!(said, sent, "{stderr}");
}

/// Checks that the hosts' staging directories under `tmp` are gone (within 20 s: a session's
/// agents leave after its end).
fn assert_gone(tmp: &Path) {
    let left = || -> Vec<String> {
        let entries = std::fs::read_dir(tmp).unwrap().flatten();
        entries
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    };
    let t0 = std::time::Instant::now();
    while !left().is_empty() && t0.elapsed() < std::time::Duration::from_secs(20) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(left(), Vec::<String>::new(), "the hosts' copies are gone");
}

#[test]
fn inputs_are_staged_once_and_every_task_reads_them_on_its_host() {
    let (d, local) = shell();
    let dir = d.path();
    let tmp = dir.join("node-tmp");
    std::fs::create_dir(&tmp).unwrap();
    input(dir, 0);
    std::fs::write(dir.join("tasks"), lines(12)).unwrap();
    let out = greedyrun(
        &local,
        &["-H", "localhost:2,127.0.0.2:2", "--tasks", "tasks"],
    )
    .current_dir(dir)
    .env_remove("GREEDY_SESSION")
    .env("TMPDIR", &tmp)
    .stdin(Stdio::null())
    .output()
    .unwrap();
    check(&out, 12, 1);
    assert_gone(&tmp);
}

#[test]
fn a_session_keeps_its_inputs_and_sends_a_changed_one_again() {
    let (d, local) = shell();
    let dir = d.path();
    let tmp = dir.join("node-tmp");
    std::fs::create_dir(&tmp).unwrap();
    let started = Command::new(GREEDYRUN)
        .args([
            "--rsh",
            local.to_str().unwrap(),
            "-H",
            "localhost:2,127.0.0.2:2",
        ])
        .args(["--start-session", "--idle-timeout", "60"])
        .current_dir(dir)
        .env_remove("GREEDY_SESSION")
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let socket = session_socket(&started);
    let _ends = common::EndsSession(socket.clone());
    std::fs::write(dir.join("tasks"), lines(6)).unwrap();
    let stream = || {
        greedyrun(&local, &["--tasks", "tasks"])
            .current_dir(dir)
            .env("GREEDY_SESSION", &socket)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    input(dir, 0);
    check(&stream(), 6, 1);
    check(&stream(), 6, 0);
    input(dir, 7);
    check(&stream(), 6, 1);
    let ended = Command::new(GREEDYRUN)
        .arg("--end-session")
        .env("GREEDY_SESSION", &socket)
        .output()
        .unwrap();
    assert_eq!(ended.status.code(), Some(0));
    assert_gone(&tmp);
}

/// Runs the stream of `lines` in `dir` on two hosts through `local`, results in `dir/res`;
/// checks it succeeded and returns its stderr.
fn run_outputs_stream(dir: &Path, local: &Path, lines: &[String]) -> String {
    std::fs::write(dir.join("tasks"), lines.join("\n") + "\n").unwrap();
    let out = greedyrun(
        local,
        &["-H", "localhost:2,127.0.0.2:2", "--results", "res"],
    )
    .args(["--tasks", "tasks"])
    .current_dir(dir)
    .env_remove("GREEDY_SESSION")
    .stdin(Stdio::null())
    .output()
    .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    stderr
}

#[test]
fn outputs_come_back_whole_and_are_named_in_the_results() {
    let (d, local) = shell();
    let dir = d.path();
    std::fs::create_dir(dir.join("runs")).unwrap();
    // 1.5 MB of the task's number: more than one frame.
    let write = r#"head -c 1500000 /dev/zero | tr '\0' "$GREEDY_TASK" > out-$GREEDY_TASK.txt; echo small > note.txt"#;
    let lines = [
        serde_json::json!({"argv": ["sh", "-c", write], "cwd": "runs",
            "outputs": ["out-1.txt", "note.txt"]})
        .to_string(),
        serde_json::json!({"command": "true", "outputs": ["never-written.txt"]}).to_string(),
    ];
    let stderr = run_outputs_stream(dir, &local, &lines);
    let data = std::fs::read(dir.join("runs/out-1.txt")).unwrap();
    assert_eq!(data.len(), 1_500_000);
    assert!(
        data.iter().all(|&b| b == b'1'),
        "the output came back whole"
    );
    assert!(
        stderr.contains("task 2: output never-written.txt: No such file"),
        "{stderr}"
    );
    let res = results_by_task(&dir.join("res"));
    let first = &res[&1];
    assert_eq!(
        first["outputs"],
        serde_json::json!(["runs/out-1.txt", "runs/note.txt"])
    );
    let second = &res[&2];
    assert!(second.get("outputs").is_none(), "{second}");
    let parts: Vec<_> = std::fs::read_dir(dir.join("runs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("greedy-part"))
        .collect();
    assert!(parts.is_empty(), "{parts:?}");
}

/// A job task's outputs come back from its first rank's host; outputs a task leaves on its
/// host are named there (`host:/absolute/path`) and not sent.
#[test]
fn job_task_outputs_come_back_and_left_ones_are_named_where_they_are() {
    let (d, local) = shell();
    let dir = d.path();
    let rank0 = |cmd: &str| format!("if [ $GREEDY_RANK = 0 ]; then {cmd}; fi");
    let big = rank0(r#"head -c 1500000 /dev/zero | tr '\0' 7 > big.txt"#);
    let lines = [
        serde_json::json!({"argv": ["sh", "-c", big], "ranks": 3, "outputs": ["big.txt"]}),
        serde_json::json!({"command": "echo kept > kept.txt", "outputs": ["kept.txt"],
            "leave_outputs": true}),
        serde_json::json!({"argv": ["sh", "-c", rank0("echo kept > kept-job.txt")], "ranks": 2,
            "outputs": ["kept-job.txt"], "leave_outputs": true}),
    ];
    let lines: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    let stderr = run_outputs_stream(dir, &local, &lines);
    let res = results_by_task(&dir.join("res"));
    assert_eq!(
        res[&1]["outputs"],
        serde_json::json!(["big.txt"]),
        "{stderr}"
    );
    let data = std::fs::read(dir.join("big.txt")).unwrap();
    assert!(data.len() == 1_500_000 && data.iter().all(|&b| b == b'7'));
    let real = std::fs::canonicalize(dir).unwrap();
    for (task, file) in [(2, "kept.txt"), (3, "kept-job.txt")] {
        let at = format!(
            "{}:{}/{file}",
            res[&task]["host"].as_str().unwrap(),
            real.display()
        );
        assert_eq!(res[&task]["outputs"], serde_json::json!([at]), "{stderr}");
    }
    let parts: Vec<_> = (std::fs::read_dir(dir).unwrap().flatten())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("greedy-part"))
        .collect();
    assert!(parts.is_empty(), "{parts:?}");
}
