//! Helpers the launcher's end-to-end tests share: greedyrun through the fake remote shell that
//! runs the agent here, the processes a test left, and sessions started and ended.

// Each test file compiles this module on its own and uses only part of it.
#![allow(dead_code)]

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

pub(crate) const GREEDYRUN: &str = env!("CARGO_BIN_EXE_greedyrun");
pub(crate) const GREEDYD: &str = env!("CARGO_BIN_EXE_greedyd");

pub(crate) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub(crate) fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// tests/mpi/NAME.c built in `dir` as `NAME-SUFFIX` with `mpicc` (run with `env`); `from` says
/// what installs that compiler, for the failure message.
pub(crate) fn mpi_build(
    mpicc: &str,
    env: &[(&str, &str)],
    dir: &Path,
    name: &str,
    suffix: &str,
    from: &str,
) -> String {
    let exe = dir.join(format!("{name}-{suffix}"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tests/mpi/{name}.c"));
    let built = Command::new(mpicc)
        .envs(env.iter().copied())
        .args(["-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .status();
    assert!(built.is_ok_and(|s| s.success()), "{mpicc} ({from})");
    exe.display().to_string()
}

/// A fake remote shell `localsh` in `dir`: it ignores the host and runs the agent here.
pub(crate) fn localsh(dir: &Path) -> PathBuf {
    let sh = dir.join("localsh");
    std::fs::write(
        &sh,
        "#!/bin/sh\n# fake remote shell: ignore the host\nshift\nexec sh -c \"exec $*\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&sh, std::fs::Permissions::from_mode(0o755)).unwrap();
    sh
}

/// A temp dir with the fake remote shell `localsh` (see [`localsh`]).
pub(crate) fn shell() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let local = localsh(dir.path());
    (dir, local)
}

/// `greedyrun --rsh RSH --progress 0 ARGS…`.
pub(crate) fn greedyrun(rsh: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(GREEDYRUN);
    cmd.arg("--rsh")
        .arg(rsh)
        .args(["--progress", "0"])
        .args(args);
    cmd
}

/// Sends greedyrun (`child`) SIGINT, as Ctrl-C would.
pub(crate) fn interrupt(child: &Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
}

/// Processes whose command line contains `marker`, greedyrun's own (whose arguments may carry
/// it) included.
pub(crate) fn processes_with(marker: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let c = text(&std::fs::read(e.path().join("cmdline")).ok()?).replace('\0', " ");
            c.contains(marker).then_some(c)
        })
        .collect()
}

/// Processes whose command line contains `marker`, other than greedyrun's own.
pub(crate) fn alive(marker: &str) -> Vec<String> {
    processes_with(marker)
        .into_iter()
        .filter(|c| !c.contains("greedyrun"))
        .collect()
}

/// Waits up to `secs` seconds until `n` processes carry `marker`; else fails saying `what`.
pub(crate) fn wait_alive(marker: &str, n: usize, secs: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while alive(marker).len() < n {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Ends the session at this control socket however the test ends, so a failed assertion
/// leaves no session behind.
pub(crate) struct EndsSession(pub(crate) String);

impl Drop for EndsSession {
    fn drop(&mut self) {
        let _ = Command::new(GREEDYRUN)
            .arg("--end-session")
            .env("GREEDY_SESSION", &self.0)
            .output();
    }
}

/// A session on localhost and 127.0.0.2, `slots` slots each and `--idle-timeout IDLE`,
/// started through `local`; its socket.
pub(crate) fn two_host_session(local: &Path, slots: u32, idle: &str) -> String {
    let out = Command::new(GREEDYRUN)
        .args(["--rsh", local.to_str().unwrap()])
        .args(["-H", &format!("localhost:{slots},127.0.0.2:{slots}")])
        .args(["--start-session", "--idle-timeout", idle])
        .env_remove("GREEDY_SESSION")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    session_socket(&out)
}

/// The control socket `greedyrun --start-session` printed (`export GREEDY_SESSION=…`).
pub(crate) fn session_socket(out: &Output) -> String {
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    stdout
        .trim()
        .strip_prefix("export GREEDY_SESSION=")
        .unwrap_or_else(|| panic!("{stdout}"))
        .to_string()
}

/// The process serving the session whose control socket is `socket`.
pub(crate) fn session_process(socket: &str) -> Option<u32> {
    let wanted = format!("GREEDY_SESSION_SERVE={socket}");
    std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        // Its agents inherit the variable, and after PID wrap-around one may come first.
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        if comm.trim_end() != "greedyrun" {
            return None;
        }
        let env = std::fs::read(e.path().join("environ")).ok()?;
        env.split(|&b| b == 0)
            .any(|v| v == wanted.as_bytes())
            .then_some(pid)
    })
}

/// The JSON lines of a `--results` file, by task line.
pub(crate) fn results_by_task(path: &Path) -> std::collections::BTreeMap<u64, serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|v| (v["task"].as_u64().unwrap(), v))
        .collect()
}
