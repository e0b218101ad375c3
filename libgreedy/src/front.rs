//! The front end: launches a session's members and talks to its master.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::backend::{Backend, MasterPrefix};
use crate::channel;
use crate::distribution::Distribution;
use crate::error::{Error, Result};

/// Launcher error lines kept to say why a session ended.
const TAIL: usize = 8;

/// What starts sessions: the greedyrun it runs (`GREEDYRUN`, else the one beside this
/// program, as the packages install them, else `greedyrun` on PATH).
#[derive(Debug, Clone)]
pub struct FrontEnd {
    greedyrun: String,
}

impl Default for FrontEnd {
    fn default() -> Self {
        FrontEnd::new()
    }
}

impl FrontEnd {
    /// A front end using `$GREEDYRUN`, the greedyrun beside this program, or the one on
    /// PATH for the greedyrun back ends.
    pub fn new() -> FrontEnd {
        let beside = || {
            let path = std::env::current_exe().ok()?.with_file_name("greedyrun");
            path.exists().then(|| path.display().to_string())
        };
        let greedyrun = std::env::var("GREEDYRUN")
            .ok()
            .or_else(beside)
            .unwrap_or_else(|| "greedyrun".into());
        FrontEnd { greedyrun }
    }

    /// A front end running this greedyrun.
    pub fn with_greedyrun(greedyrun: impl Into<String>) -> FrontEnd {
        FrontEnd {
            greedyrun: greedyrun.into(),
        }
    }

    /// Starts `distribution`'s members through `backend`; returns once the launcher runs
    /// (the members may still be starting).
    pub fn launch(&self, distribution: &Distribution, backend: &Backend) -> Result<Session> {
        // srun's host file (SLURM_HOSTFILE), in a private directory that goes once srun
        // ended (`wait`) or the session is dropped; the greedyrun back ends need none.
        let dir = match backend {
            Backend::Srun | Backend::SlurmJob { .. } => Some(
                tempfile::Builder::new()
                    .prefix("greedy-libi.")
                    .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
                    .tempdir()
                    .map_err(|source| Error::Launch {
                        program: "a private directory".into(),
                        source,
                    })?,
            ),
            _ => None,
        };
        let hostfile = dir.as_ref().map(|d| d.path().join("hosts"));
        let launch = backend.launch(distribution, &self.greedyrun, hostfile.as_deref())?;
        let mut command = launch.command;
        let shown = command.get_program().to_string_lossy().into_owned();
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| Error::Launch {
                program: shown,
                source,
            })?;
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let (tx, messages) = mpsc::channel();
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let readers = vec![
            relay_stdout(stdout.expect("piped"), launch.master_prefix, tx),
            relay_stderr(stderr.expect("piped"), Arc::clone(&tail)),
        ];
        Ok(Session {
            stdin: child.stdin.take(),
            child,
            messages,
            tail,
            readers,
            dir,
        })
    }
}

/// Rank 0's messages to the channel; every other line to this process's stdout.
fn relay_stdout(
    out: impl std::io::Read + Send + 'static,
    prefix: MasterPrefix,
    tx: mpsc::Sender<Vec<u8>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = channel::Reader::default();
        for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
            match prefix.strip(&line).and_then(|l| reader.line(l)) {
                Some(Some(data)) => {
                    let _ = tx.send(data);
                }
                Some(None) => {}
                None => println!("{line}"),
            }
        }
    })
}

/// The launcher's stderr passed on, its last lines kept for the error of a failed session.
fn relay_stderr(
    err: impl std::io::Read + Send + 'static,
    tail: Arc<Mutex<VecDeque<String>>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(|l| l.ok()) {
            eprintln!("{line}");
            let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
            if tail.len() == TAIL {
                tail.pop_front();
            }
            tail.push_back(line);
        }
    })
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The launcher's exit code (128 + N when a signal N ended it): 0 when every member
    /// exited 0, else the first failure's (greedyrun's and srun's rules).
    pub code: i32,
    /// The launcher's last error lines, which name the host and rank at fault.
    pub why: String,
}

impl Outcome {
    /// Every member ended well.
    pub fn success(&self) -> bool {
        self.code == 0
    }
}

/// A launched session: its master's messages, its end.
#[derive(Debug)]
pub struct Session {
    child: Child,
    stdin: Option<ChildStdin>,
    messages: Receiver<Vec<u8>>,
    tail: Arc<Mutex<VecDeque<String>>>,
    readers: Vec<JoinHandle<()>>,
    dir: Option<tempfile::TempDir>,
}

impl Session {
    /// Sends `data` to the master, which reads it with `recv_from_front`.
    pub fn send(&mut self, data: &[u8]) -> Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| Error::SessionEnded("the channel to the master was closed".into()))?;
        channel::write(stdin, data)
            .and_then(|()| stdin.flush())
            .map_err(|_| Error::SessionEnded(self.why()))
    }

    /// The master's next message; waits at most `timeout` (for ever with `None`).
    pub fn recv(&mut self, timeout: Option<Duration>) -> Result<Vec<u8>> {
        let got = match timeout {
            Some(t) => self.messages.recv_timeout(t),
            None => self
                .messages
                .recv()
                .map_err(|_| RecvTimeoutError::Disconnected),
        };
        match got {
            Ok(data) => Ok(data),
            Err(RecvTimeoutError::Timeout) => Err(Error::Timeout(timeout.unwrap_or_default())),
            Err(RecvTimeoutError::Disconnected) => {
                let outcome = self.wait()?;
                Err(Error::SessionEnded(format!(
                    "exit {}: {}",
                    outcome.code, outcome.why
                )))
            }
        }
    }

    /// Closes the channel to the master and waits for every member's end.
    pub fn wait(&mut self) -> Result<Outcome> {
        self.stdin = None;
        let status = self.child.wait().map_err(|source| Error::Launch {
            program: "the launcher (wait)".into(),
            source,
        })?;
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        self.dir = None;
        use std::os::unix::process::ExitStatusExt;
        let code = status
            .code()
            .or_else(|| status.signal().map(|s| 128 + s))
            .unwrap_or(1);
        Ok(Outcome {
            code,
            why: self.why(),
        })
    }

    /// Ends every member (the launcher's SIGTERM: members get SIGTERM, then SIGKILL).
    pub fn kill(&mut self) -> Result<Outcome> {
        if let Ok(None) = self.child.try_wait() {
            let pid = Pid::from_raw(self.child.id() as i32);
            let _ = kill(pid, Signal::SIGTERM);
        }
        self.wait()
    }

    /// The launcher's last error lines.
    fn why(&self) -> String {
        let tail = self.tail.lock().unwrap_or_else(|e| e.into_inner());
        tail.iter().cloned().collect::<Vec<_>>().join("; ")
    }
}

impl Drop for Session {
    /// A session dropped while it runs is killed, never left behind.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.kill();
        }
    }
}
