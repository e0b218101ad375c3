//! A stream's tasks of several ranks or of MPI: each runs as a job, through a greedyrun
//! client of its own started beside the stream's loop (a session's, or greedyrun's own on a
//! private socket), so that its wire-up (one namespace per task), output, exit code and
//! teardown are a job's, with no flag. The task's slots, taken by the dispatcher, are the
//! job's: the client names their claim ([`JobBoard::claim`]), and the loop starts the job in
//! them without a plan of its own.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

use super::{board::JobBoard, dispatch::Placement};
use crate::proto::{RankEnd, Staged, Stream, TaskId, TaskJob, Up};
use crate::task_spec::TaskSpec;

/// Set in the environment of the process `--start-session` starts, to the control socket it
/// serves; its tasks' clients must not have it (each would be a session of its own).
pub const SERVE_VAR: &str = "GREEDY_SESSION_SERVE";

/// A running task's client.
struct Client {
    pid: u32,
    /// The slots it runs in ([`JobBoard::claim`]).
    claim: u64,
    /// Which of the task's runs it is: a lost host's run, forgotten, never reports.
    run: u64,
}

/// The clients of the job tasks running, and how to start more.
pub(crate) struct JobTasks {
    /// greedyrun, this very program.
    exe: PathBuf,
    /// The session's control socket, the clients' `GREEDY_SESSION`.
    socket: PathBuf,
    /// The session loop's frames: each client's output and end arrive as a task's would.
    /// Weak: the loop ends when the tree's frames end, whatever clients could still start.
    ups: mpsc::WeakSender<Up>,
    board: Arc<JobBoard>,
    /// Each running task's client, shared with the tasks that wait for them: a client's end
    /// is reported only if it is still the task's current run.
    running: Arc<Mutex<HashMap<TaskId, Client>>>,
    next_run: u64,
}

impl JobTasks {
    /// Clients of the session at `socket` on `board`'s slots, reporting to `ups`.
    pub(crate) fn new(socket: PathBuf, board: Arc<JobBoard>, ups: &mpsc::Sender<Up>) -> JobTasks {
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("greedyrun"));
        JobTasks {
            exe,
            socket,
            ups: ups.downgrade(),
            board,
            running: Arc::default(),
            next_run: 0,
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<TaskId, Client>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts task `id`'s client for its placement `at`, whose hosts `names` holds, its
    /// ranks given the inputs it `staged`.
    pub(crate) fn start(
        &mut self,
        id: TaskId,
        spec: &TaskSpec,
        (at, names): (&Placement, &[String]),
        staged: Vec<Staged>,
    ) {
        // None only once the loop is ending: nothing starts then.
        let Some(ups) = self.ups.upgrade() else {
            return;
        };
        let node = at.host();
        let task = TaskJob {
            staged,
            cores_per_rank: spec.cores_per_rank,
        };
        let claim = self.board.claim(at.slots(spec).collect(), task);
        let hosts: Vec<String> = (at.0.iter())
            .map(|&(h, r)| format!("{}:{r}", names[h as usize]))
            .collect();
        let t0 = Instant::now();
        let spawned = self
            .command(id, spec, &hosts.join(","), claim)
            .and_then(|mut c| {
                c.spawn()
                    .map_err(|e| format!("cannot start its job's client: {e}"))
            });
        let child = match spawned {
            Ok(child) => child,
            Err(why) => {
                self.board.unclaim(claim);
                tokio::spawn(not_started(ups, node, id, why));
                return;
            }
        };
        let run = self.next_run;
        self.next_run += 1;
        let pid = child.id().unwrap_or(0);
        self.running().insert(id, Client { pid, claim, run });
        let ending = ClientEnding {
            id,
            node,
            run,
            claim,
            t0,
            ups,
            running: self.running.clone(),
            board: self.board.clone(),
        };
        tokio::spawn(ending.wait(child));
    }

    /// greedyrun for task `id`: its ranks on `hosts` in claim `claim`'s slots, its program,
    /// environment, directory and files; or why not (a file that cannot be opened).
    fn command(
        &self,
        id: TaskId,
        spec: &TaskSpec,
        hosts: &str,
        claim: u64,
    ) -> Result<tokio::process::Command, String> {
        let mut cmd = tokio::process::Command::new(&self.exe);
        let ranks = spec.ranks.to_string();
        cmd.args(["--hosts", hosts, "-n", &ranks]).args([
            "--task-claim",
            &claim.to_string(),
            "--progress",
            "0",
        ]);
        if spec.stdin.is_none() {
            cmd.args(["--stdin", "none"]);
        }
        cmd.arg("--").args(spec.run.argv());
        cmd.env_remove(SERVE_VAR)
            .env("GREEDY_SESSION", &self.socket)
            .env("GREEDY_TASK", id.line.to_string())
            .envs(&spec.env);
        let dir = spec.cwd.as_deref().map(Path::new);
        if let Some(d) = dir {
            cmd.current_dir(d);
        }
        let file = |f: &Option<String>, write: bool| -> Result<Stdio, String> {
            let Some(name) = f else {
                return Ok(if write { Stdio::piped() } else { Stdio::null() });
            };
            let path = dir.map_or(PathBuf::from(name), |d| d.join(name));
            let opened = if write {
                std::fs::File::create(&path)
            } else {
                std::fs::File::open(&path)
            };
            (opened.map(Stdio::from)).map_err(|e| format!("{}: {e}", path.display()))
        };
        cmd.stdin(file(&spec.stdin, false)?)
            .stdout(file(&spec.stdout, true)?)
            .stderr(file(&spec.stderr, true)?);
        Ok(cmd)
    }

    /// Tasks `ids` run again elsewhere (a host of theirs was lost): their clients here are
    /// ended and their ends never reported.
    pub(crate) fn forget(&self, ids: &[TaskId]) {
        let gone: Vec<Client> = {
            let mut running = self.running();
            ids.iter().filter_map(|id| running.remove(id)).collect()
        };
        for c in gone {
            self.board.unclaim(c.claim);
            terminate(c.pid);
        }
    }

    /// Ends the clients of stream `stream`'s tasks (all, for `None`): each tears its job down
    /// as greedyrun does on SIGTERM, and its task ends.
    pub(crate) fn end(&self, stream: Option<u32>) {
        for (id, c) in self.running().iter() {
            if stream.is_none_or(|s| s == id.stream) {
                terminate(c.pid);
            }
        }
    }
}

/// SIGTERM to a client: it tears its job down and exits.
fn terminate(pid: u32) {
    if let Ok(pid @ 1..) = i32::try_from(pid) {
        let pid = nix::unistd::Pid::from_raw(pid);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    }
}

/// What reports a client's end as its task's, if it is still the task's current run.
struct ClientEnding {
    id: TaskId,
    /// The host that reports the task's end ([`Placement::host`]).
    node: u32,
    run: u64,
    claim: u64,
    t0: Instant,
    ups: mpsc::Sender<Up>,
    running: Arc<Mutex<HashMap<TaskId, Client>>>,
    board: Arc<JobBoard>,
}

impl ClientEnding {
    /// Passes the client's output on until it ends, then reports the task's end.
    async fn wait(self, mut child: tokio::process::Child) {
        let (out, err) = (child.stdout.take(), child.stderr.take());
        let forwards = async {
            tokio::join!(
                forward(out, self.id, Stream::Stdout, &self.ups),
                forward(err, self.id, Stream::Stderr, &self.ups)
            )
        };
        let (status, _) = tokio::join!(child.wait(), forwards);
        if !self.still_current() {
            return;
        }
        self.board.unclaim(self.claim);
        let (node, id) = (self.node, self.id);
        let end = status.map_or(RankEnd::NotStarted, end_of);
        let wall_us = self.t0.elapsed().as_micros() as u64;
        let _ = (self.ups.send(Up::TaskEnd {
            node,
            id,
            end,
            wall_us,
        }))
        .await;
    }

    /// Whether this is still the task's current run (not one a lost host left behind); it
    /// is not running any more from now on.
    fn still_current(&self) -> bool {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let current = running.get(&self.id).is_some_and(|c| c.run == self.run);
        if current {
            running.remove(&self.id);
        }
        current
    }
}

/// Task `id` could not start, for `why`: said on its stderr, and ended as a program that
/// could not be run.
async fn not_started(ups: mpsc::Sender<Up>, node: u32, id: TaskId, why: String) {
    let data = Bytes::from(format!("task {}: {why}\n", id.line));
    let stream = Stream::Stderr;
    let _ = ups.send(Up::TaskOutput { id, stream, data }).await;
    let (end, wall_us) = (RankEnd::NotStarted, 0);
    let _ = (ups.send(Up::TaskEnd {
        node,
        id,
        end,
        wall_us,
    }))
    .await;
}

/// A client's end as a task's.
fn end_of(status: std::process::ExitStatus) -> RankEnd {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => RankEnd::Exited(c),
        (None, Some(s)) => RankEnd::Signaled(s),
        (None, None) => RankEnd::NotStarted,
    }
}

/// Passes what a client writes on `pipe` on as task `id`'s output, chunk by chunk.
async fn forward(
    pipe: Option<impl AsyncRead + Unpin>,
    id: TaskId,
    stream: Stream,
    ups: &mpsc::Sender<Up>,
) {
    let Some(mut pipe) = pipe else {
        return;
    };
    let mut buf = vec![0u8; 64 << 10];
    while let Ok(n @ 1..) = pipe.read(&mut buf).await {
        let data = Bytes::copy_from_slice(&buf[..n]);
        if ups.send(Up::TaskOutput { id, stream, data }).await.is_err() {
            return;
        }
    }
}
