//! Shared by the gate tests: a recording handler, a job of two registered ranks, a real libpmix client built with `cc`, and the test policy (the peer's socket must be open in an allowed process).
#![allow(dead_code)] // each test file uses a part

use std::collections::HashSet;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use greedy_sys::pmix::{
    Proc, Status,
    gate::Policy,
    info::{InfoArray, Value, key},
    server::{Handler, ModexDone, OpDone, Server, ServerConfig},
};

/// The job's namespace.
pub(crate) const NSPACE: &str = "gate.1";

/// Records which ranks libpmix reported connected and finalized.
#[derive(Default)]
pub(crate) struct Recorder {
    pub(crate) connected: Mutex<Vec<u32>>,
    pub(crate) finalized: Mutex<Vec<u32>>,
}

impl Handler for Recorder {
    fn client_connected(&self, p: Proc) {
        self.connected.lock().unwrap().push(p.rank);
    }
    fn client_finalized(&self, p: Proc, done: OpDone) {
        self.finalized.lock().unwrap().push(p.rank);
        done.complete(Status::SUCCESS);
    }
    fn abort(&self, _: Proc, _: i32, _: String, _: Option<Vec<Proc>>, done: OpDone) {
        done.complete(Status::SUCCESS);
    }
    fn fence(&self, _: Vec<Proc>, _: bool, _: Vec<u8>, done: ModexDone) {
        done.complete(Status::NOT_SUPPORTED, Vec::new());
    }
    fn direct_modex(&self, _: Proc, _: Option<String>, done: ModexDone) {
        done.complete(Status::NOT_FOUND, Vec::new());
    }
    fn callback_panicked(&self, callback: &'static str, message: String) {
        eprintln!("{callback} panicked: {message}");
    }
}

/// The pids whose sockets the policy admits.
pub(crate) type Allowed = Arc<Mutex<HashSet<u32>>>;

/// The inode of the TCP socket whose local end is `peer` and remote end `local`
/// (/proc/net/tcp: addresses as the kernel's `%08X:%04X` of the raw IPv4 word and the port).
fn socket_inode(peer: SocketAddr, local: SocketAddr) -> Option<u64> {
    let parse = |s: &str| -> Option<SocketAddr> {
        let (a, p) = s.split_once(':')?;
        let a = u32::from_str_radix(a, 16).ok()?;
        let p = u16::from_str_radix(p, 16).ok()?;
        Some(SocketAddr::new(Ipv4Addr::from(a.to_le_bytes()).into(), p))
    };
    let text = std::fs::read_to_string("/proc/net/tcp").ok()?;
    text.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() >= 10 && parse(f[1]) == Some(peer) && parse(f[2]) == Some(local))
            .then(|| f[9].parse().ok())
            .flatten()
            .filter(|&i| i != 0)
    })
}

fn holds(pid: u32, inode: u64) -> bool {
    let target = format!("socket:[{inode}]");
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    dir.flatten()
        .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == target.as_str()))
}

/// The stub of the embedders' policy: the client's socket must be open in an allowed process.
pub(crate) fn policy(allowed: &Allowed) -> Policy {
    let allowed = allowed.clone();
    Arc::new(move |peer, local| {
        let Some(inode) = socket_inode(peer, local) else {
            return false;
        };
        let pids: Vec<u32> = allowed.lock().unwrap().iter().copied().collect();
        pids.into_iter().any(|pid| holds(pid, inode))
    })
}

/// A running server with namespace [`NSPACE`], ranks 0 and 1 registered, and their
/// `setup_fork` environments.
pub(crate) struct Job {
    pub(crate) server: Server,
    pub(crate) recorder: Arc<Recorder>,
    pub(crate) env: Vec<Vec<(String, String)>>,
    pub(crate) port: u16,
    pub(crate) allowed: Allowed,
    pub(crate) client: PathBuf,
    pub(crate) dir: tempfile::TempDir,
}

fn wait(rx: &mpsc::Receiver<Status>, what: &str) -> Status {
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what}: no callback within 20 s"))
}

/// Builds the client, starts the server with the gate and registers the job.
pub(crate) fn start() -> Job {
    let dir = tempfile::tempdir().unwrap();
    let client = compile_client(dir.path());
    let allowed = Allowed::default();
    let recorder = Arc::new(Recorder::default());
    let config = ServerConfig {
        tmpdir: dir.path().join("pmix"),
        hostname: "n0".into(),
        nodeid: 0,
        server_nspace: "gate-test".into(),
        server_rank: 0,
        admit: policy(&allowed),
        groups: Default::default(),
    };
    std::fs::create_dir(&config.tmpdir).unwrap();
    let server = Server::init(recorder.clone(), &config).expect("PMIx_server_init");
    let info = InfoArray::new(&[
        (key::JOB_SIZE, Value::U32(2)),
        (key::UNIV_SIZE, Value::U32(2)),
        (key::MAX_PROCS, Value::U32(2)),
        (key::LOCAL_SIZE, Value::U32(2)),
        (
            key::NODE_MAP,
            Value::Regex(server.generate_regex("n0").unwrap()),
        ),
        (
            key::PROC_MAP,
            Value::Regex(server.generate_ppn("0,1").unwrap()),
        ),
        (key::LOCAL_PEERS, Value::Str("0,1".into())),
    ])
    .unwrap();
    let (tx, rx) = mpsc::channel();
    server
        .register_nspace(NSPACE, 2, info, move |s| tx.send(s).unwrap())
        .unwrap();
    assert_eq!(wait(&rx, "register_nspace"), Status::SUCCESS);
    let mut env = Vec::new();
    for rank in 0..2 {
        let p = Proc {
            nspace: NSPACE.into(),
            rank,
        };
        let (tx, rx) = mpsc::channel();
        server
            .register_client(&p, None, move |s| tx.send(s).unwrap())
            .unwrap();
        assert_eq!(wait(&rx, "register_client"), Status::SUCCESS);
        env.push(server.setup_fork(&p).unwrap());
    }
    let uri = env[0]
        .iter()
        .find(|(k, _)| k == "PMIX_SERVER_URI41")
        .map(|(_, v)| v.clone())
        .expect("a server URI");
    let port = uri
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {uri}"));
    Job {
        server,
        recorder,
        env,
        port,
        allowed,
        client,
        dir,
    }
}

/// `cc` the client of `common/pmix_client.c` against the installed libpmix.
fn compile_client(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/common/pmix_client.c");
    let exe = dir.join("pmix_client");
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "pmix"])
        .output()
        .expect("pkg-config runs");
    let flags = String::from_utf8(flags.stdout).unwrap();
    let out = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .args(flags.split_whitespace())
        .output()
        .expect("cc runs");
    assert!(
        out.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

impl Job {
    /// Starts the client as `rank`; if `allow`, its pid is admitted before it runs (it waits
    /// on its stdin until then, so it cannot connect before the policy knows it).
    pub(crate) fn spawn(&self, rank: usize, allow: bool) -> Child {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "read _ && exec \"$0\""])
            .arg(&self.client)
            .envs(self.env[rank].iter().cloned())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, _) in std::env::vars() {
            if k.starts_with("PMIX_") && !self.env[rank].iter().any(|(n, _)| *n == k) {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd.spawn().expect("spawn the client");
        if allow {
            self.allowed.lock().unwrap().insert(child.id());
        }
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        child
    }
}

/// Waits for `child` at most `limit`; `None` (after killing it) if it was still running.
pub(crate) fn wait_child(mut child: Child, limit: Duration) -> Option<(ExitStatus, String)> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            return Some((status, text));
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
