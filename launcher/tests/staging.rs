//! Tasks' input files staged to their hosts and output files collected back, end to end
//! through the fake remote shell: each task reads its inputs, byte for byte, from a directory
//! of its own on its host; a file is sent down the tree once per content (said once), again
//! when it changed, and a session keeps it for its later streams; every host's copy is gone
//! when the run or session ends; outputs come back whole and are named in the results.

mod common;

use std::{
    collections::BTreeSet,
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

/// Checks that the entries under `tmp` whose names start with `prefix` (the hosts' staging
/// directories) are gone, within 20 s: agents leave a little after their job or session.
fn assert_gone(tmp: &Path, prefix: &str) {
    let left = || -> Vec<String> {
        let entries = std::fs::read_dir(tmp).unwrap().flatten();
        (entries.map(|e| e.file_name().to_string_lossy().into_owned()))
            .filter(|n| n.starts_with(prefix))
            .collect()
    };
    let t0 = std::time::Instant::now();
    while !left().is_empty() && t0.elapsed() < std::time::Duration::from_secs(20) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(left(), Vec::<String>::new(), "the hosts' copies are gone");
}

/// A session on two hosts of 2 slots through `local`, started in `dir` with its agents'
/// `TMPDIR` at `tmp`: its socket, and what ends it.
fn start_session(dir: &Path, local: &Path, tmp: &Path) -> (String, common::EndsSession) {
    let started = Command::new(GREEDYRUN)
        .args(["--rsh", local.to_str().unwrap()])
        .args(["-H", "localhost:2,127.0.0.2:2"])
        .args(["--start-session", "--idle-timeout", "60"])
        .current_dir(dir)
        .env_remove("GREEDY_SESSION")
        .env("TMPDIR", tmp)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let socket = session_socket(&started);
    (socket.clone(), common::EndsSession(socket))
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
    assert_gone(&tmp, "");
}

#[test]
fn a_session_keeps_its_inputs_and_sends_a_changed_one_again() {
    let (d, local) = shell();
    let dir = d.path();
    let tmp = dir.join("node-tmp");
    std::fs::create_dir(&tmp).unwrap();
    let (socket, _ends) = start_session(dir, &local, &tmp);
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
    assert_gone(&tmp, "");
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

/// A filter for what goes down to a host: the byte after the first `GREEDY-BCAST-MARK` that
/// passes is flipped, once (the end of a read that may begin the mark waits 100 ms for more).
const DAMAGE: &str = r#"import os, select
mark = b"GREEDY-BCAST-MARK"
held, done = b"", False
while True:
    if held and not select.select([0], [], [], 0.1)[0]:
        data, held = held, b""
        while data:
            data = data[os.write(1, data):]
        continue
    data = os.read(0, 65536)
    if not data:
        break
    data = held + data
    i = -1 if done else data.find(mark)
    if 0 <= i and i + len(mark) < len(data):
        j = i + len(mark)
        data = data[:j] + bytes([data[j] ^ 0xFF]) + data[j + 1:]
        done = True
    keep = 0
    if not done:
        keep = next((k for k in range(min(len(mark), len(data)), 0, -1) if mark.startswith(data[-k:])), 0)
    data, held = data[: len(data) - keep], data[len(data) - keep :]
    while data:
        data = data[os.write(1, data):]
while held:
    held = held[os.write(1, held):]
"#;

/// The fake remote shell, but what goes down to host 127.0.0.2 passes [`DAMAGE`].
fn damaging_shell(dir: &Path) -> std::path::PathBuf {
    std::fs::write(dir.join("damage.py"), DAMAGE).unwrap();
    let sh = dir.join("damagesh");
    let script = format!(
        "#!/bin/sh\nhost=$1; shift\nif [ \"$host\" = 127.0.0.2 ]; then python3 {} | sh -c \"exec $*\"; exit; fi\nexec sh -c \"exec $*\"\n",
        dir.join("damage.py").display()
    );
    std::fs::write(&sh, script).unwrap();
    let exec = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(&sh, exec).unwrap();
    sh
}

#[test]
fn bcast_copies_program_and_files_to_every_host_and_sends_a_damaged_copy_again() {
    let (d, _) = shell();
    let dir = d.path();
    let tmp = dir.join("node-tmp");
    std::fs::create_dir(&tmp).unwrap();
    let mut data: Vec<u8> = (0..3usize << 20).map(|i| (i % 251) as u8).collect();
    data.splice(1_500_000..1_500_000, b"GREEDY-BCAST-MARK".iter().copied());
    std::fs::write(dir.join("data.bin"), &data).unwrap();
    let check = "#!/bin/sh\necho \"$GREEDY_RANK $(sha256sum < \"$GREEDY_BCAST/data.bin\" | cut -c1-64) $0\"\n";
    std::fs::write(dir.join("check.sh"), check).unwrap();
    let exec = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(dir.join("check.sh"), exec).unwrap();
    let expected = Command::new("sh")
        .args(["-c", "sha256sum < data.bin | cut -c1-64"])
        .current_dir(dir)
        .output()
        .unwrap();
    let expected = text(&expected.stdout).trim().to_string();

    let damaging = damaging_shell(dir);
    let out = greedyrun(&damaging, &["-H", "localhost:2,127.0.0.2:2,127.0.0.3:1"])
        .args(["-n", "5", "--bcast=check.sh,data.bin", "./check.sh"])
        .current_dir(dir)
        .env_remove("GREEDY_SESSION")
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let mut ranks = Vec::new();
    for line in stdout.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        assert_eq!(words.len(), 3, "{line}");
        assert_eq!(words[1], expected, "rank {}'s copy", words[0]);
        // Each rank ran its host's copy of the program, not the original.
        assert!(words[2].starts_with(tmp.to_str().unwrap()), "{line}");
        ranks.push(words[0].parse::<u32>().unwrap());
    }
    ranks.sort();
    assert_eq!(ranks, [0, 1, 2, 3, 4], "{stdout}");
    let again = format!(
        "127.0.0.2: --bcast {}/data.bin arrived damaged (SHA-256 differs): sending it again",
        dir.display()
    );
    assert_eq!(stderr.matches(&again).count(), 1, "{stderr}");
    assert_gone(&tmp, "");

    // A file that is not there is named before anything starts.
    let out = greedyrun(
        &damaging,
        &["-H", "localhost", "--bcast=nothing.bin", "true"],
    )
    .current_dir(dir)
    .env_remove("GREEDY_SESSION")
    .stdin(Stdio::null())
    .output()
    .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("nothing.bin"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_session_keeps_broadcast_files_for_later_jobs_and_sends_a_changed_one_again() {
    let (d, local) = shell();
    let dir = d.path();
    let tmp = dir.join("node-tmp");
    std::fs::create_dir(&tmp).unwrap();
    input(dir, 3);
    let (socket, ends) = start_session(dir, &local, &tmp);
    let job = || {
        let check = r#"cmp "$GREEDY_BCAST/in.bin" expected.bin && echo ok $GREEDY_RANK"#;
        let out = greedyrun(&local, &["-n", "4", "--bcast=in.bin", "sh", "-c", check])
            .current_dir(dir)
            .env("GREEDY_SESSION", &socket)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
        assert_eq!(stdout.matches("ok ").count(), 4, "{stdout}{stderr}");
    };
    // The session agents' caches: each content by its SHA-256, with its inode (a content
    // sent again would be a new file).
    let cached = || -> BTreeSet<(String, u64)> {
        let mut found = BTreeSet::new();
        for cache in std::fs::read_dir(&tmp).unwrap().flatten() {
            for f in std::fs::read_dir(cache.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let name = f.file_name().to_string_lossy().into_owned();
                if name.len() == 64 {
                    found.insert((
                        name,
                        std::os::unix::fs::MetadataExt::ino(&f.metadata().unwrap()),
                    ));
                }
            }
        }
        found
    };
    job();
    let first = cached();
    assert_eq!(first.len(), 2, "one copy on each of the 2 hosts: {first:?}");
    // A later job finds the copies there: nothing is sent again.
    job();
    assert_eq!(cached(), first);
    // A changed file is sent again, beside the old content.
    input(dir, 9);
    job();
    assert_eq!(cached().len(), 4);
    assert!(first.is_subset(&cached()));
    // The jobs' own directories went with them; the caches go with the session.
    drop(ends);
    assert_gone(&tmp, "greedy-staged.");
}
