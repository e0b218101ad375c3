//! The launcher's endpoints against a stranger, on this machine: `greedyd --connect` and the
//! listener its agents dial (`--rsh srun`, through a fake srun that runs the agent here),
//! session clients facing a socket that is not their own session's, a silent session client,
//! and SIGHUP. Tests that act as another user need root; they say so and pass otherwise.

mod common;

use std::{
    io::Read,
    os::unix::{fs::PermissionsExt, net::UnixListener},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use futures_util::SinkExt;
use greedy_launcher::proto::{App, BindTo, Down, PROTOCOL_VERSION, ParentCodec, PmiMode, Start};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::codec::FramedWrite;

use common::{
    EndsSession, GREEDYD, GREEDYRUN, is_root, localsh, processes_with, session_socket, text,
};

/// A fake `srun` in `dir`: writes its pid and its words to files beside it, waits `delay`
/// seconds (Slurm starting the step) and while a file `hold` is beside it, then runs the
/// words after `--nodelist=…` here as host `localhost`, as srun would on each node.
fn fake_srun(dir: &Path, delay: f64) -> PathBuf {
    let srun = dir.join("srun");
    std::fs::write(
        &srun,
        format!(
            "#!/bin/sh\necho $$ > {d}/srun.pid\necho \"$@\" > {d}/srun.args\nsleep {delay}\n\
             while [ -e {d}/hold ]; do sleep 0.05; done\n\
             while [ $# -gt 0 ]; do case \"$1\" in --nodelist=*) shift; break;; esac; shift; done\n\
             SLURMD_NODENAME=localhost exec \"$@\"\n",
            d = dir.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&srun, std::fs::Permissions::from_mode(0o755)).unwrap();
    srun
}

/// `greedyrun --rsh SRUN -H localhost …` with this build's agent.
fn greedyrun_srun(srun: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(GREEDYRUN);
    cmd.args(["--rsh", srun.to_str().unwrap(), "--agent", GREEDYD])
        .args(["--progress", "0", "--pmi", "none", "-H", "localhost"])
        .args(args)
        .env_remove("GREEDY_SESSION")
        .stdin(Stdio::null());
    cmd
}

/// Waits up to `secs` for `path` to hold a line; returns it.
fn wait_for_file(path: &Path, secs: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Ok(s) = std::fs::read_to_string(path)
            && s.ends_with('\n')
        {
            return s.trim().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "{} never written",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `pid` still runs (a zombie no longer does).
fn running(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'))
    })
}

/// A Start that runs `argv` on host 0, `localhost`, with a secret of its own.
fn strangers_start(argv: &[&str]) -> Start {
    Start {
        version: PROTOCOL_VERSION,
        job_id: "stranger".into(),
        node_idx: 0,
        hosts: vec!["localhost".into()],
        ranks: vec![vec![0]],
        launch_sizes: vec![1],
        apps: vec![App {
            first_rank: 0,
            argv: argv.iter().map(|s| s.to_string()).collect(),
        }],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: "/".into(),
        rsh: vec!["false".into()],
        agent: vec![GREEDYD.into()],
        batch: 1,
        retries: 0,
        hello_timeout_s: 5.0,
        grace_s: 1.0,
        lost_after_s: 60.0,
        model: greedy_tree::LaunchModel::new(0.01, 0.1).unwrap(),
        pmi: PmiMode::None,
        secret: greedy_pmix::JobSecret::generate(),
        stdin_rank: None,
        bind: BindTo::None,
        log: String::new(),
        tasks: false,
        unbuffered: false,
        universe: 0,
        bcast: Vec::new(),
    }
}

/// A stranger who took greedyrun's port: sends its own "nonce", ignores the agent's proof and
/// sends a job. The agent must refuse it, run nothing, and exit with an error.
#[tokio::test]
async fn a_listener_without_the_key_gets_nothing_run() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("pwned");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let agent = tokio::process::Command::new(GREEDYD)
        .args(["--connect", &addr])
        .env(
            "GREEDY_CONNECT_KEY",
            greedy_pmix::JobSecret::generate().to_hex(),
        )
        .env("GREEDY_CONNECT_TIMEOUT", "10")
        .env("SLURMD_NODENAME", "localhost")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let (mut conn, _) = tokio::time::timeout(Duration::from_secs(10), listener.accept())
        .await
        .expect("the agent connects")
        .unwrap();
    conn.write_all(&[7u8; 32]).await.unwrap();
    let mut hello = [0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut hello))
        .await
        .expect("the agent announces itself")
        .unwrap();
    assert!(n > 32, "a host and a proof, {n} bytes");
    let start = strangers_start(&["touch", marker.to_str().unwrap()]);
    let mut frames = FramedWrite::new(&mut conn, ParentCodec::default());
    let _ = frames.send(Down::Start(Box::new(start))).await;
    let out = tokio::time::timeout(Duration::from_secs(15), agent.wait_with_output()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!marker.exists(), "the stranger's command ran");
    let out = out.expect("the agent exits").unwrap();
    let stderr = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("not proven to be this job's greedyrun"),
        "{stderr}"
    );
}

/// A fake session server at `dir/control`: accepts every connection for the test's length
/// and counts the bytes clients send it (each connection closed after 300 ms of silence).
struct FakeSession {
    bytes: Arc<AtomicUsize>,
    conns: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    socket: PathBuf,
}

impl FakeSession {
    fn start(dir: &Path) -> FakeSession {
        let socket = dir.join("control");
        let listener = UnixListener::bind(&socket).unwrap();
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let (bytes, conns): (Arc<AtomicUsize>, Arc<AtomicUsize>) = Default::default();
        let stop: Arc<AtomicBool> = Arc::default();
        let (b, c, s) = (Arc::clone(&bytes), Arc::clone(&conns), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Ok((mut conn, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                c.fetch_add(1, Ordering::Relaxed);
                conn.set_nonblocking(false).unwrap();
                conn.set_read_timeout(Some(Duration::from_millis(300)))
                    .unwrap();
                let mut buf = [0u8; 4096];
                while let Ok(k @ 1..) = conn.read(&mut buf) {
                    b.fetch_add(k, Ordering::Relaxed);
                }
            }
        });
        FakeSession {
            bytes,
            conns,
            stop,
            socket,
        }
    }
}

impl Drop for FakeSession {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Every session client (a job, `--status`, `--end-session`, `--tasks`) pointed at `fake`:
/// each must refuse with `why` and send nothing.
fn clients_refuse(fake: &FakeSession, why: &str) {
    let dir = fake.socket.parent().unwrap();
    let tasks = dir.parent().unwrap().join("tasks");
    std::fs::write(&tasks, "true\n").unwrap();
    let marker = dir.parent().unwrap().join("ran");
    let marker = marker.to_str().unwrap();
    for args in [
        vec!["-n", "1", "touch", marker],
        vec!["--status"],
        vec!["--end-session"],
        vec!["--tasks", tasks.to_str().unwrap()],
    ] {
        let out = Command::new(GREEDYRUN)
            .args(&args)
            .env("GREEDY_SESSION", &fake.socket)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {stderr}");
        assert!(
            stderr.contains(why) && stderr.contains("not sending anything"),
            "{args:?}: {stderr}"
        );
    }
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(
        fake.bytes.load(Ordering::Relaxed),
        0,
        "bytes sent to the socket"
    );
    assert_eq!(
        fake.conns.load(Ordering::Relaxed),
        0,
        "connections to the socket"
    );
    assert!(!Path::new(marker).exists());
}

/// A stale GREEDY_SESSION whose directory and socket a stranger (uid 65534) re-created, as a
/// watcher of /tmp can once a session ends: nothing is sent to it.
#[test]
fn a_strangers_socket_at_a_stale_session_path_gets_nothing() {
    if !is_root() {
        eprintln!("skipped: making files another user's needs root");
        return;
    }
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("greedy-session.stale");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let fake = FakeSession::start(&dir);
    let nobody = Some(65534);
    std::os::unix::fs::lchown(&fake.socket, nobody, nobody).unwrap();
    std::os::unix::fs::lchown(&dir, nobody, nobody).unwrap();
    clients_refuse(&fake, "is owned by uid 65534, not you");
}

/// A session directory of our own that others may write to (mode 0755 here): whoever could
/// replace the socket in it could be the server, so nothing is sent either.
#[test]
fn a_session_directory_others_may_write_gets_nothing() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("greedy-session.open");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let fake = FakeSession::start(&dir);
    clients_refuse(&fake, "has mode 0755, not 0700");
}

/// Raises this process's open-file limit to `want` (or the hard limit); returns it.
fn raise_fd_limit(want: u64) -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let to = want.min(hard).max(soft);
    setrlimit(Resource::RLIMIT_NOFILE, to, hard).unwrap();
    to
}

/// A stranger keeps opening silent connections to greedyrun's agents' listener (from its own
/// address, 127.0.0.2), more than greedyrun has fds: the agent, which srun starts once a
/// thousand are open, still connects and the job ends in normal time.
#[test]
fn a_flood_of_silent_connections_does_not_keep_agents_out() {
    let limit = raise_fd_limit(6000);
    let flood = (limit as usize).saturating_sub(200).min(3000);
    if flood < 1000 {
        eprintln!("skipped: {limit} fds are too few for a flood of 1000 connections");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let srun = fake_srun(dir.path(), 0.0);
    let hold = dir.path().join("hold");
    std::fs::write(&hold, "").unwrap();
    // greedyrun gets 256 fds, soft and hard, so raising the soft limit does not help it.
    let run = greedyrun_srun(&srun, &["-n", "1", "--timeout", "40", "true"]);
    let mut sh = Command::new("sh");
    sh.arg("-c")
        .arg("ulimit -n 256 && exec \"$0\" \"$@\"")
        .arg(run.get_program())
        .args(run.get_args());
    sh.env_remove("GREEDY_SESSION").stdin(Stdio::null());
    let child = sh
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let args = wait_for_file(&dir.path().join("srun.args"), 10);
    let addr: std::net::SocketAddr = args.rsplit(' ').next().unwrap().parse().unwrap();
    let (done, opened) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let flooder = {
        let (done, opened) = (done.clone(), opened.clone());
        std::thread::spawn(move || flood_until(addr, flood, &opened, &done))
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while opened.load(Ordering::Relaxed) < 1000 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let t0 = Instant::now();
    std::fs::remove_file(&hold).unwrap();
    let out = wait_output(child, Duration::from_secs(40));
    let took = t0.elapsed();
    done.store(true, Ordering::Relaxed);
    flooder.join().unwrap();
    let stderr = text(&out.stderr);
    let opened = opened.load(Ordering::Relaxed);
    assert!(opened >= 1000, "the flood opened only {opened} connections");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(took < Duration::from_secs(8), "took {took:?}: {stderr}");
}

/// Keeps up to `n` silent connections from 127.0.0.2 to `addr` open, opening new ones as
/// fast as it can (counted in `opened`), until `done`.
fn flood_until(addr: std::net::SocketAddr, n: usize, opened: &AtomicUsize, done: &AtomicBool) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut held = std::collections::VecDeque::new();
        while !done.load(Ordering::Relaxed) {
            let sock = tokio::net::TcpSocket::new_v4().unwrap();
            // Closed with a reset, not FIN: thousands of TIME_WAIT sockets on 127.0.0.2 would
            // keep later tests' listeners there from binding for a minute.
            sock.set_zero_linger().unwrap();
            sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
            if let Ok(Ok(s)) =
                tokio::time::timeout(Duration::from_millis(200), sock.connect(addr)).await
            {
                opened.fetch_add(1, Ordering::Relaxed);
                held.push_back(s);
                if held.len() > n {
                    held.pop_front();
                }
            }
        }
    })
}

/// Waits for `child` to exit within `limit` (killing it after), with its output.
fn wait_output(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// SIGHUP (the terminal or the ssh session went away) ends a running job like SIGTERM: exit
/// 129, and srun, the agent and the rank are gone.
#[test]
fn sighup_tears_a_running_job_down() {
    let dir = tempfile::tempdir().unwrap();
    let srun = fake_srun(dir.path(), 0.0);
    let rank_pid = dir.path().join("rank.pid");
    let script = format!("echo $$ > {}; exec sleep 4271", rank_pid.display());
    let child = greedyrun_srun(&srun, &["-n", "1", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let rank = wait_for_file(&rank_pid, 15);
    let srun_pid = wait_for_file(&dir.path().join("srun.pid"), 5);
    hangup(&child);
    let out = wait_output(child, Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(129), "{}", text(&out.stderr));
    gone(&[&rank, &srun_pid], "sleep 4271");
}

/// SIGHUP while srun is still starting the agents (the window a stranger could take the port
/// in): greedyrun stops srun before it exits, so no agent starts after it.
#[test]
fn sighup_before_the_agents_connect_stops_srun() {
    let dir = tempfile::tempdir().unwrap();
    let srun = fake_srun(dir.path(), 3.0);
    let child = greedyrun_srun(&srun, &["-n", "1", "sleep", "4272"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let srun_pid = wait_for_file(&dir.path().join("srun.pid"), 5);
    std::thread::sleep(Duration::from_millis(300));
    hangup(&child);
    let out = wait_output(child, Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(129), "{}", text(&out.stderr));
    assert!(!running(&srun_pid), "srun outlived greedyrun");
    // Past the fake srun's delay: had it lived, its agent would run now.
    std::thread::sleep(Duration::from_secs(3));
    let args = wait_for_file(&dir.path().join("srun.args"), 1);
    let addr = args.rsplit(' ').next().unwrap();
    gone(&[], &format!("--connect {addr}"));
    gone(&[], "sleep 4272");
}

/// SIGHUP ends a task stream (no session) like SIGTERM: exit 129, its running task ended.
#[test]
fn sighup_ends_a_task_stream_like_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let sh = localsh(dir.path());
    let task_pid = dir.path().join("task.pid");
    let tasks = dir.path().join("tasks");
    let line = format!(
        "sh -c 'echo $$ > {}; exec sleep 4274'\n",
        task_pid.display()
    );
    std::fs::write(&tasks, line).unwrap();
    let child = Command::new(GREEDYRUN)
        .args(["--rsh", sh.to_str().unwrap(), "--agent", GREEDYD])
        .args(["-H", "localhost:1", "--tasks", tasks.to_str().unwrap()])
        .env_remove("GREEDY_SESSION")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let task = wait_for_file(&task_pid, 15);
    hangup(&child);
    let out = wait_output(child, Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(129), "{}", text(&out.stderr));
    gone(&[&task], "sleep 4274");
}

fn hangup(child: &Child) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
}

/// Waits up to 5 s for `pids` and every process carrying `marker` to be gone.
fn gone(pids: &[&str], marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|p| running(p)) || !processes_with(marker).is_empty() {
        assert!(
            Instant::now() < deadline,
            "left behind: {:?} {:?}",
            pids.iter().filter(|p| running(p)).collect::<Vec<_>>(),
            processes_with(marker)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A client that connects to a session and says nothing delays no one: `--status` answers
/// at once beside it.
#[test]
fn a_silent_session_client_does_not_delay_status() {
    let dir = tempfile::tempdir().unwrap();
    let sh = localsh(dir.path());
    let out = Command::new(GREEDYRUN)
        .args(["--rsh", sh.to_str().unwrap(), "--agent", GREEDYD])
        .args([
            "-H",
            "localhost:1",
            "--start-session",
            "--idle-timeout",
            "60",
        ])
        .env_remove("GREEDY_SESSION")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let socket = session_socket(&out);
    let _end = EndsSession(socket.clone());
    let status = || {
        let t0 = Instant::now();
        let out = Command::new(GREEDYRUN)
            .arg("--status")
            .env("GREEDY_SESSION", &socket)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        t0.elapsed()
    };
    let alone = status();
    let _silent = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let beside = status();
    assert!(
        beside < alone + Duration::from_secs(1),
        "--status took {beside:?} beside a silent client, {alone:?} alone"
    );
}
