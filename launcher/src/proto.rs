//! The control-plane protocol on each tree edge: frames over the remote shell's stdin (down) and stdout (up).
//!
//! Every edge of the launch tree *is* a remote shell (`ssh host greedyd`): the parent writes
//! [`Down`] frames to the shell's stdin and reads [`Up`] frames from its stdout. A frame is a
//! 4-byte big-endian length followed by a postcard body ([`FrameCodec`]). The first down frame
//! to an agent is always [`Down::Start`]; the first up frame from it is [`Up::Hello`]. EOF on a
//! child's stdout before it said [`Up::Bye`] means that subtree is lost.
//!
//! Frames are routed, not flooded: a [`Down::Route`] names a target node (or every node), and
//! each agent forwards it only to the child whose subtree holds the target. Up frames carry
//! their origin node and are relayed unchanged, so the head sees every event of every host.
//!
//! This is a boundary: the types here are the only serialised launcher types, and an agent
//! refuses a [`Start`] of another [`PROTOCOL_VERSION`].

use std::{net::SocketAddr, time::Duration};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use tokio_util::codec::{Decoder, Encoder};

use greedy_pmix::{
    JobSecret,
    child::{ChildJob, SpawnApp, SpawnRequest},
    names,
};
use greedy_tree::LaunchModel;

use crate::Error;
use crate::task_spec::{Outputs, TaskSpec};

/// Bumped on every incompatible change of [`Down`], [`Up`] or [`Start`].
pub const PROTOCOL_VERSION: u32 = 21;

/// Largest frame accepted: a Start for thousands of hosts is far below it, and it bounds what
/// a corrupt length can make us reserve.
pub const MAX_FRAME: usize = 64 << 20;

/// How ranks reach the wire-up service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PmiMode {
    /// No PMI server: plain programs (`hostname`, scripts).
    None,
    /// Serve every family at once (PMI-1/PMI-2, PMIx, Charm++ netlrts); each rank is served
    /// by the one it speaks, and a rank that speaks none and exits 0 is not an error, so
    /// non-MPI programs run too (greedy-pmix `node`).
    Auto,
    /// Serve PMI-1 and PMI-2 only (greedy-pmix tells them apart per connection).
    Strict,
    /// Serve PMIx only (Open MPI); ranks get no `PMI_*`.
    Pmix,
    /// Serve Charm++'s netlrts launcher protocol only (what charmrun does; greedy-pmix
    /// `charm`): every rank must send `ending`, whose code becomes the rank's exit code.
    Charm,
}

/// What each local rank is bound to (`--bind-to`): the n-th rank of a host to its n-th core or
/// package, round-robin; or nothing (the default), where the ranks run on every CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum BindTo {
    /// No binding.
    #[default]
    None,
    /// One core each (all its hardware threads).
    Core,
    /// One package (socket) each.
    Socket,
}

/// One program of the job and the ranks from `first_rank` up to the next app's that run it
/// (an MPMD command line, `greedyrun -n 2 ./a : -n 6 ./b`, has one per part).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct App {
    /// The first rank that runs it.
    pub first_rank: u32,
    /// The program and its arguments.
    pub argv: Vec<String>,
}

/// Everything an agent needs to run its part of the job. Sent once, as the first frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Start {
    /// Must equal [`PROTOCOL_VERSION`].
    pub version: u32,
    /// Job id: PMI kvsname, tracing field, and tag of the agent's processes.
    pub job_id: String,
    /// This agent's host index in `hosts`.
    pub node_idx: u32,
    /// Every host of the job in plan order.
    pub hosts: Vec<String>,
    /// `ranks[node_idx]`: the ranks on each host, ascending.
    pub ranks: Vec<Vec<u32>>,
    /// Subtree sizes (preorder) of this agent's part of the launch tree, itself first.
    /// Launch position `p` is host `p - 1`; position 0 is greedyrun. Sent explicitly so that
    /// every topology (not only greedy, whose subtrees are greedy trees) forwards correctly.
    pub launch_sizes: Vec<u32>,
    /// The programs: one for every rank, or one per part of an MPMD command line.
    pub apps: Vec<App>,
    /// The ranks' environment (the wire-up adds its own variables).
    pub env: Vec<(String, String)>,
    /// Working directory of the ranks.
    pub cwd: String,
    /// Remote shell command words; the host and the agent command are appended.
    pub rsh: Vec<String>,
    /// The agent command run on each child host.
    pub agent: Vec<String>,
    /// Remote shells a parent keeps in flight before their agents said hello.
    pub batch: u32,
    /// Retries of a remote shell that failed before its agent said hello (MaxStartups).
    pub retries: u32,
    /// Seconds a parent waits for a child agent's hello (`--timeout`).
    pub hello_timeout_s: f64,
    /// Seconds between SIGTERM and SIGKILL on teardown.
    pub grace_s: f64,
    /// Seconds of silence after which a parent takes a child as lost and an agent its parent
    /// as gone (`--lost-after`; 0: never); [`crate::heartbeat`].
    pub lost_after_s: f64,
    /// Launch model of the overlay tree.
    pub model: LaunchModel,
    /// How ranks reach the wire-up service.
    pub pmi: PmiMode,
    /// Per-job secret for the overlay's authentication; never logged (its `Debug` redacts).
    pub secret: JobSecret,
    /// The rank whose stdin is greedyrun's stdin; every other rank reads /dev/null.
    pub stdin_rank: Option<u32>,
    /// What each local rank is bound to.
    pub bind: BindTo,
    /// Log filter for the agent (`RUST_LOG` syntax) or empty.
    pub log: String,
    /// A task stream (`greedyrun --tasks`): the agents start no ranks; `ranks` counts each
    /// host's slots, and greedyrun sends [`Cmd::Task`]s to fill them.
    pub tasks: bool,
    /// Output goes up in the chunks it was read (`--unbuffered`), not in whole lines.
    pub unbuffered: bool,
    /// The job's slots on all its hosts: how many processes it and the jobs it spawns may
    /// run without `--oversubscribe` (`MPI_UNIVERSE_SIZE`; 0: its ranks).
    pub universe: u32,
    /// Files `--bcast` copies to every host before the ranks start: file `i` comes down as
    /// staging `i` ([`Cmd::Stage`]), and the ranks start once every one is on their host.
    pub bcast: Vec<BcastFile>,
}

/// A file broadcast to every host of a job (`greedyrun --bcast`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BcastFile {
    /// Its path where greedyrun read it: an app whose program is this path runs the copy.
    pub path: String,
    /// Its name in the ranks' directory of copies (`GREEDY_BCAST`).
    pub name: String,
    /// The copy may be executed.
    pub executable: bool,
    /// On a session: its content's SHA-256, which the session has already put in every one of
    /// its agents' caches (no staging comes for it; the copy is linked from there).
    pub cached: Option<String>,
}

impl Start {
    /// What an agent checks before it uses a Start (it indexes and converts these fields): the
    /// protocol version, this node among the hosts, one rank list per host, the launch subtree
    /// inside the host list, and timeouts that are durations. The error is for the user.
    pub fn check(&self) -> Result<(), String> {
        if self.version != PROTOCOL_VERSION {
            return Err(format!(
                "greedyd speaks protocol {PROTOCOL_VERSION}, greedyrun {}: install the same version on every host",
                self.version
            ));
        }
        let n = self.hosts.len();
        if self.node_idx as usize >= n || self.ranks.len() != n {
            return Err(format!(
                "bad Start: node {} of {n} hosts with {} rank lists",
                self.node_idx,
                self.ranks.len()
            ));
        }
        if self.subtree_hosts().end > n {
            return Err(format!(
                "bad Start: launch subtree {:?} beyond {n} hosts",
                self.subtree_hosts()
            ));
        }
        let ordered = self.apps.first().is_some_and(|a| a.first_rank == 0)
            && self
                .apps
                .windows(2)
                .all(|w| w[0].first_rank < w[1].first_rank)
            && self.apps.iter().all(|a| !a.argv.is_empty());
        if !ordered {
            return Err("bad Start: no program, or programs not in rank order".into());
        }
        let mut names = std::collections::HashSet::new();
        for f in &self.bcast {
            let plain =
                !f.name.is_empty() && f.name != ".." && f.name != "." && !f.name.contains('/');
            if !plain || !names.insert(&f.name) {
                return Err(format!("bad Start: broadcast file name {:?}", f.name));
            }
        }
        for (what, s) in [
            ("hello timeout", self.hello_timeout_s),
            ("grace", self.grace_s),
            ("lost-after", self.lost_after_s),
        ] {
            if Duration::try_from_secs_f64(s).is_err() {
                return Err(format!("bad Start: {what} of {s} s"));
            }
        }
        Ok(())
    }

    /// The program and arguments `rank` runs (checked: [`Start::check`]).
    pub fn argv_of(&self, rank: u32) -> &[String] {
        let i = self.apps.partition_point(|a| a.first_rank <= rank);
        &self.apps[i.saturating_sub(1)].argv
    }

    /// The host range `[first, end)` of this agent's launch subtree.
    pub fn subtree_hosts(&self) -> std::ops::Range<usize> {
        let first = self.node_idx as usize;
        first..first + self.launch_sizes.first().copied().unwrap_or(1) as usize
    }
}

/// An input of a task, staged to its host: the name the task finds it by (in
/// `GREEDY_STAGED`) and its content's SHA-256, its name in the host's cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Staged {
    /// The file's name in the task's staging directory.
    pub name: String,
    /// SHA-256 of its content, lowercase hex.
    pub hash: String,
}

/// What a stream's task brings to the job that runs it ([`Cmd::JobStart`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskJob {
    /// The inputs it staged, linked for its ranks on each host (`GREEDY_STAGED`).
    pub staged: Vec<Staged>,
    /// The cores each rank takes: bound to that many of the host's free cores when the
    /// stream binds its tasks.
    pub cores_per_rank: u32,
}

/// A task of a task stream: the stream (a session runs several at once) and the task's line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TaskId {
    /// The stream's number in its session (0 for greedyrun's own stream).
    pub stream: u32,
    /// The task's line in its stream, from 1: its name in results and messages.
    pub line: u64,
}

/// A command routed down the tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Cmd {
    /// Bytes for the stdin of the target's `stdin_rank`.
    Stdin(Bytes),
    /// Close that stdin.
    StdinEof,
    /// The overlay address of `node`, for the rendezvous of its overlay children.
    Address {
        /// Overlay node the address belongs to.
        node: u32,
        /// The overlay listener's address.
        addr: SocketAddr,
    },
    /// The job is over (every rank exited): stop services, wait for the subtree, exit.
    Shutdown,
    /// End the job: SIGTERM every rank's process group, SIGKILL after the grace period,
    /// then leave like [`Cmd::Shutdown`].
    Teardown,
    /// End every task of `stream` running on the target host: SIGTERM to each task's process
    /// group, SIGKILL after the grace period (a session's client went away mid-stream).
    CancelTasks {
        /// The stream whose tasks end.
        stream: u32,
    },
    /// Run task `id` on the target host as `spec` says, over the job's environment and
    /// working directory, in its own process group (stdin /dev/null unless it names a file).
    Task {
        /// The task.
        id: TaskId,
        /// What it runs, checked by greedyrun.
        spec: Box<TaskSpec>,
        /// Its inputs, staged to the host already ([`Cmd::Stage`]).
        staged: Vec<Staged>,
    },
    /// To the first rank's host of task `id`, a job that ended with `end` after `wall_us`:
    /// send its `outputs` up (or name them, if they stay), then its [`Up::TaskEnd`].
    TaskOutputs {
        /// The task.
        id: TaskId,
        /// Its working directory, relative to the stream's.
        cwd: Option<String>,
        /// The files.
        outputs: Outputs,
        /// How its job ended.
        end: RankEnd,
        /// Its job's wall time, in microseconds.
        wall_us: u64,
    },
    /// To every host, down the tree: bytes `offset..` of the file being staged as `id`.
    Stage {
        /// The staging's number (greedyrun's).
        id: u64,
        /// Where these bytes go in the file.
        offset: u64,
        /// The bytes.
        data: Bytes,
    },
    /// To every host: the file staged as `id` is complete; its content's SHA-256 is `hash`
    /// (lowercase hex), its name in each host's cache.
    StageEnd {
        /// The staging's number.
        id: u64,
        /// The content's SHA-256.
        hash: String,
    },
    /// A session's job ([`crate::session`]): the target hosts listed in `nodes` (the job's
    /// host `i` is the session's host `nodes[i]`) each run an agent of the job in their own
    /// process, given `start` as its Start with their index in `nodes`.
    JobStart {
        /// The job's number in the session.
        job: u32,
        /// The session host of each of the job's hosts.
        nodes: Vec<u32>,
        /// The job, as greedyrun made it.
        start: Box<Start>,
        /// A stream's task's job: what the task brings; `None` for a client's own job.
        task: Option<TaskJob>,
    },
    /// A command for the agent of a session's job on the target host.
    ForJob {
        /// The job's number in the session.
        job: u32,
        /// The command.
        cmd: JobCmd,
    },
    /// End a session's job on the target host as a lost remote shell would: its agent's
    /// commands end (it tears its ranks down), and what is left of its ranks is killed 5 s
    /// after the grace period.
    EndJob {
        /// The job's number in the session.
        job: u32,
    },
    /// Spawn phase 1, to every node: serve spawned job `job` (`NodeService::add_child`) and
    /// keep it for [`Cmd::StartChild`]; answered by [`Up::ChildAdded`].
    AddChild {
        /// The child's number in the job (its namespace is `<job id>.<child>`).
        child: u32,
        /// The child as every node learns it.
        job: Box<ChildJob>,
        /// Phase 2 too, once added here, as if [`Cmd::StartChild`] followed: sent only when
        /// the job has one node, which is then every node that must add the child first.
        start: bool,
    },
    /// Spawn phase 2, to the nodes holding its ranks (every node added it): fork the local
    /// ranks of child `child`; answered by [`Up::ChildStarted`], and each of its ranks ends
    /// with one [`Up::ChildExit`] (started or not).
    StartChild {
        /// The child's number.
        child: u32,
    },
    /// The spawn of child `child` was refused after some of its ranks started: end them
    /// (TERM, KILL after the grace period); their exits abort nothing.
    KillChild {
        /// The child's number.
        child: u32,
    },
    /// The answer to spawn request `id` of the target node ([`Up::Spawn`]): the child's
    /// namespace once every child rank runs, or why nothing runs.
    SpawnAnswer {
        /// The request's number on its node.
        id: u32,
        /// The namespace, or the refusal.
        result: Result<String, String>,
    },
    /// The session's answer to name request `ticket` of the target host ([`Up::Names`]).
    Names {
        /// The request's number on its host.
        ticket: u64,
        /// The answer.
        response: names::Response,
    },
}

/// What greedyrun sends to the ranks' side of a job: the commands of [`Cmd`] a job's own
/// greedyd takes, and nothing that nests (so a frame is never a tower of jobs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum JobCmd {
    /// [`Cmd::Stdin`].
    Stdin(Bytes),
    /// [`Cmd::StdinEof`].
    StdinEof,
    /// [`Cmd::Address`].
    Address {
        /// Overlay node the address belongs to.
        node: u32,
        /// The overlay listener's address.
        addr: SocketAddr,
    },
    /// [`Cmd::Shutdown`].
    Shutdown,
    /// [`Cmd::Teardown`].
    Teardown,
    /// [`Cmd::SpawnAnswer`].
    SpawnAnswer {
        /// The request's number on its node.
        id: u32,
        /// The namespace, or the refusal.
        result: Result<String, String>,
    },
    /// [`Cmd::AddChild`].
    AddChild {
        /// The child's number in the job.
        child: u32,
        /// The child as every node learns it.
        job: Box<ChildJob>,
        /// Phase 2 too ([`Cmd::AddChild`]'s `start`).
        start: bool,
    },
    /// [`Cmd::StartChild`].
    StartChild {
        /// The child's number.
        child: u32,
    },
    /// [`Cmd::KillChild`].
    KillChild {
        /// The child's number.
        child: u32,
    },
    /// [`Cmd::Stage`]: the job's `--bcast` files, into its own agents' caches.
    Stage {
        /// The staging's number.
        id: u64,
        /// Where these bytes go in the file.
        offset: u64,
        /// The bytes.
        data: Bytes,
    },
    /// [`Cmd::StageEnd`].
    StageEnd {
        /// The staging's number.
        id: u64,
        /// The content's SHA-256.
        hash: String,
    },
}

impl JobCmd {
    /// The job-level command `cmd` is, if it is one.
    pub fn of(cmd: Cmd) -> Option<JobCmd> {
        Some(match cmd {
            Cmd::Stdin(b) => JobCmd::Stdin(b),
            Cmd::StdinEof => JobCmd::StdinEof,
            Cmd::Address { node, addr } => JobCmd::Address { node, addr },
            Cmd::Shutdown => JobCmd::Shutdown,
            Cmd::Teardown => JobCmd::Teardown,
            Cmd::SpawnAnswer { id, result } => JobCmd::SpawnAnswer { id, result },
            Cmd::AddChild { child, job, start } => JobCmd::AddChild { child, job, start },
            Cmd::StartChild { child } => JobCmd::StartChild { child },
            Cmd::KillChild { child } => JobCmd::KillChild { child },
            Cmd::Stage { id, offset, data } => JobCmd::Stage { id, offset, data },
            Cmd::StageEnd { id, hash } => JobCmd::StageEnd { id, hash },
            _ => return None,
        })
    }
}

impl From<JobCmd> for Cmd {
    fn from(cmd: JobCmd) -> Cmd {
        match cmd {
            JobCmd::Stdin(b) => Cmd::Stdin(b),
            JobCmd::StdinEof => Cmd::StdinEof,
            JobCmd::Address { node, addr } => Cmd::Address { node, addr },
            JobCmd::Shutdown => Cmd::Shutdown,
            JobCmd::Teardown => Cmd::Teardown,
            JobCmd::SpawnAnswer { id, result } => Cmd::SpawnAnswer { id, result },
            JobCmd::AddChild { child, job, start } => Cmd::AddChild { child, job, start },
            JobCmd::StartChild { child } => Cmd::StartChild { child },
            JobCmd::KillChild { child } => Cmd::KillChild { child },
            JobCmd::Stage { id, offset, data } => Cmd::Stage { id, offset, data },
            JobCmd::StageEnd { id, hash } => Cmd::StageEnd { id, hash },
        }
    }
}

/// A frame travelling down an edge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Down {
    /// The job description; the first frame on every edge.
    Start(Box<Start>),
    /// A command for one node (`Some(idx)`) or for every node (`None`).
    Route {
        /// Target host index, or `None` for all.
        to: Option<u32>,
        /// The command.
        cmd: Cmd,
    },
    /// Nothing else went down for a while: the parent is still there ([`crate::heartbeat`]).
    Ping,
}

/// Which output stream of a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// How a rank ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RankEnd {
    /// It exited with this code.
    Exited(i32),
    /// It was killed by this signal.
    Signaled(i32),
    /// It could not be started at all (the exec failed); reported like a shell does, 127.
    NotStarted,
}

impl RankEnd {
    /// The exit code a shell would report: the code, 128+signal, or 127.
    pub fn code(self) -> i32 {
        match self {
            RankEnd::Exited(c) => c,
            // Saturating: the number comes off the wire, and 128 + i32::MAX overflowed.
            RankEnd::Signaled(s) => 128i32.saturating_add(s),
            RankEnd::NotStarted => 127,
        }
    }

    /// Whether this end counts as a failure.
    pub fn failed(self) -> bool {
        self.code() != 0
    }
}

/// A frame travelling up an edge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Up {
    /// The agent of `node` runs (sent first).
    Hello {
        /// Host index.
        node: u32,
    },
    /// Output of a rank: whole lines, a partial one after a delay ([`crate::stdio::Lines`]), or
    /// each chunk as read with [`Start::unbuffered`].
    Output {
        /// The rank.
        rank: u32,
        /// Which stream.
        stream: Stream,
        /// The bytes, in the order written.
        data: Bytes,
    },
    /// A rank ended; all its output was sent before this.
    Exit {
        /// The rank.
        rank: u32,
        /// How.
        end: RankEnd,
        /// When its agent saw it end (a failure before an abort started is the abort's cause).
        at: greedy_pmix::WallTime,
        /// It was served a wire-up and never spoke to it.
        silent: bool,
    },
    /// The first local rank of `node` spoke a wire-up protocol, of this family.
    Spoke {
        /// Host index.
        node: u32,
        /// What it spoke.
        family: greedy_pmix::family::Family,
    },
    /// The overlay address of `node` (rendezvous).
    Address {
        /// Host index.
        node: u32,
        /// The overlay listener's address.
        addr: SocketAddr,
    },
    /// A host could not be started, its remote shell ended early, or (in a task stream or
    /// session) it was cut off when the host that started it was lost.
    Lost {
        /// The host index. In a job its launch subtree is lost with it; in a stream or
        /// session only the host itself (its parent starts the rest, `fanout`).
        node: u32,
        /// The host index of the parent that noticed (that started it), or `None` for
        /// greedyrun.
        by: Option<u32>,
        /// What was waited for or what happened, with the remote shell's last words.
        what: String,
    },
    /// The job's wire-up was aborted: the abort `node`'s service heard of first.
    Aborted {
        /// Host index.
        node: u32,
        /// The abort, with where and when it started.
        abort: greedy_pmix::AbortInfo,
    },
    /// An agent-level failure (a rank that could not start, a bad Start, the wire-up's start).
    Failed {
        /// Host index.
        node: u32,
        /// The exit code the job should end with.
        code: i32,
        /// What happened.
        what: String,
    },
    /// A diagnostic line (stderr of a remote shell, a warning) to print once.
    Note {
        /// Host index it concerns.
        node: u32,
        /// The text.
        text: String,
    },
    /// The agent of `node` and its whole subtree are done; nothing more will come from it.
    Bye {
        /// Host index.
        node: u32,
    },
    /// A host whose agent never said hello could not be cleaned up ([`crate::reap`]): what
    /// its remote shell started there may still run. Printed even during teardown.
    Unclean {
        /// Host index.
        node: u32,
        /// Why not.
        what: String,
    },
    /// Bytes `offset..` of an output file of task `id`, collected after it ended and before
    /// its [`Up::TaskEnd`]; `last` on the file's final frame.
    TaskFile {
        /// The task.
        id: TaskId,
        /// The file, relative to the stream's working directory (as the task's `cwd` and
        /// `outputs` name it).
        path: String,
        /// Where these bytes go in the file.
        offset: u64,
        /// The bytes.
        data: Bytes,
        /// The file is complete.
        last: bool,
    },
    /// An output file of task `id` stays on host `node`, at `path` there ([`Outputs::leave`]);
    /// sent where [`Up::TaskFile`] would be.
    TaskFileLeft {
        /// Host index.
        node: u32,
        /// The task.
        id: TaskId,
        /// The file's absolute path on the host.
        path: String,
    },
    /// The file staged as `id` reached host `node` other than it was sent (its SHA-256
    /// differs): greedyrun sends it to that host again.
    StageAgain {
        /// Host index.
        node: u32,
        /// The staging's number.
        id: u64,
    },
    /// Output of a task, cut as a rank's is ([`Up::Output`]).
    TaskOutput {
        /// The task.
        id: TaskId,
        /// Which stream.
        stream: Stream,
        /// The bytes, in the order written.
        data: Bytes,
    },
    /// The stdin rank on `node` took one more [`Cmd::Stdin`] chunk: greedyrun may send
    /// another. Stdin's flow control: greedyrun keeps a few chunks in flight, so every hop
    /// holds at most those whatever the rank reads.
    StdinTaken {
        /// Host index.
        node: u32,
    },
    /// A task ended on `node` (all its output was sent before this).
    TaskEnd {
        /// Host index.
        node: u32,
        /// The task.
        id: TaskId,
        /// How.
        end: RankEnd,
        /// From its fork to its end, in microseconds.
        wall_us: u64,
    },
    /// A session's host asks the session's name table, for a job of the session whose name
    /// service is there (its node 0): answered by [`Cmd::Names`], so that separate jobs on one
    /// session find each other's names.
    Names {
        /// The session host asking.
        node: u32,
        /// The request's number on that host.
        ticket: u64,
        /// The request (checked by the job's node 0).
        request: names::Request,
    },
    /// A local rank asks to spawn a job (`MPI_Comm_spawn`): greedyrun places it and answers
    /// with [`Cmd::SpawnAnswer`] (the requester waits for it).
    Spawn {
        /// Host index of the requester.
        node: u32,
        /// The request's number on that node.
        id: u32,
        /// What it asks for.
        request: SpawnRequest,
    },
    /// `node` added child `child` ([`Cmd::AddChild`]), or why not.
    ChildAdded {
        /// Host index.
        node: u32,
        /// The child's number.
        child: u32,
        /// Done, or the node service's error.
        result: Result<(), String>,
    },
    /// `node` forked its ranks of child `child` ([`Cmd::StartChild`]), or why one failed
    /// (`cannot run X on host H: …`; the rest were not started).
    ChildStarted {
        /// Host index.
        node: u32,
        /// The child's number.
        child: u32,
        /// Done, or the first failure.
        result: Result<(), String>,
    },
    /// Output of rank `rank` of child `child`, cut as a rank's is ([`Up::Output`]).
    ChildOutput {
        /// The child's number.
        child: u32,
        /// The rank in the child.
        rank: u32,
        /// Which stream.
        stream: Stream,
        /// The bytes, in the order written.
        data: Bytes,
    },
    /// Rank `rank` of child `child` ended (or was not started); all its output was sent
    /// before this.
    ChildExit {
        /// The child's number.
        child: u32,
        /// The rank in the child.
        rank: u32,
        /// How.
        end: RankEnd,
        /// When its agent saw it end.
        at: greedy_pmix::WallTime,
    },
    /// A frame of a session's job, from that job's greedyd: an [`Up`] as its codec wrote it
    /// (postcard), relayed without being decoded on the way, so frames never nest.
    Job {
        /// The job's number in the session.
        job: u32,
        /// The job's frame; its node numbers are the job's.
        frame: Bytes,
    },
    /// Nothing else went up for a while: the child is still there ([`crate::heartbeat`]);
    /// its parent takes it and sends it no further (last: the variants before keep their
    /// numbers, so an agent of another version still reaches its parent's error).
    Ping,
}

/// What a client sends a session for a job ([`crate::session`]), after its request line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToSession {
    /// Run this job (its hosts are among the session's; `launch_sizes` is ignored).
    Start(Box<Start>),
    /// A command for the job's host `to` (every host of the job when `None`).
    Route {
        /// The job's host index.
        to: Option<u32>,
        /// The command.
        cmd: JobCmd,
    },
    /// Place spawned child `child` of the job on the session's free slots of the job's hosts
    /// (held for the job until it ends); answered by [`FromSession::Placed`].
    Place {
        /// The child's number in the job.
        child: u32,
        /// Its programs.
        apps: Vec<SpawnApp>,
        /// Beyond the free slots, processes may share slots.
        oversubscribe: bool,
    },
    /// End the job at once, as killing its remote shells would.
    Kill,
    /// The client has the job's verdict (every rank ended, the shutdown is on its way) and
    /// leaves: the session sees the job's hosts through their shutdown without it (the last
    /// frame).
    Detach,
}

/// What a session sends a job's client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FromSession {
    /// The session's hosts that are up, with their free slots (the first frame).
    Hosts(Vec<(String, u32)>),
    /// The job cannot run: why (the last frame).
    Refused(String),
    /// The job waits for slots that tasks or an ending job hold: why, for the user (empty for
    /// an ending job's, which free within its shutdown); `Started` follows.
    Waiting(String),
    /// The session took the job: its slots are the job's, and its hosts are starting it.
    Started,
    /// A frame of the job; node numbers are the job's.
    Up(Up),
    /// Where child `child` runs ([`ToSession::Place`]): its ranks on each of the job's hosts,
    /// or why it cannot.
    Placed {
        /// The child's number in the job.
        child: u32,
        /// `ranks[h]` on the job's host `h`, or the refusal.
        result: Result<Vec<Vec<u32>>, String>,
    },
}

/// Length-delimited postcard frames of type `T` in and `U` out.
#[derive(Debug)]
pub struct FrameCodec<In, Out> {
    _types: std::marker::PhantomData<fn(Out) -> In>,
}

impl<In, Out> Default for FrameCodec<In, Out> {
    fn default() -> Self {
        FrameCodec {
            _types: std::marker::PhantomData,
        }
    }
}

impl<In: serde::de::DeserializeOwned, Out> Decoder for FrameCodec<In, Out> {
    type Item = In;
    type Error = Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<In>, Error> {
        if src.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([src[0], src[1], src[2], src[3]]) as usize;
        if len > MAX_FRAME {
            return Err(Error::Frame(format!(
                "frame of {len} bytes exceeds {MAX_FRAME}"
            )));
        }
        if src.len() < 4 + len {
            src.reserve(4 + len - src.len());
            return Ok(None);
        }
        src.advance(4);
        let body = src.split_to(len);
        postcard::from_bytes(&body)
            .map(Some)
            .map_err(|e| Error::Frame(format!("undecodable frame of {len} bytes: {e}")))
    }
}

impl<In, Out: Serialize> Encoder<Out> for FrameCodec<In, Out> {
    type Error = Error;

    fn encode(&mut self, item: Out, dst: &mut BytesMut) -> Result<(), Error> {
        let body = postcard::to_stdvec(&item).map_err(|e| Error::Frame(e.to_string()))?;
        if body.len() > MAX_FRAME {
            return Err(Error::Frame(format!(
                "frame of {} bytes exceeds {MAX_FRAME}",
                body.len()
            )));
        }
        dst.reserve(4 + body.len());
        dst.put_u32(body.len() as u32);
        dst.put_slice(&body);
        Ok(())
    }
}

/// Codec of a parent's end of an edge: writes [`Down`], reads [`Up`].
pub type ParentCodec = FrameCodec<Up, Down>;
/// Codec of a child's end of an edge: reads [`Down`], writes [`Up`].
pub type ChildCodec = FrameCodec<Down, Up>;
/// Codec of a session's end of a job's control connection.
pub type SessionCodec = FrameCodec<ToSession, FromSession>;
/// Codec of a job client's end of its control connection.
pub type ClientCodec = FrameCodec<FromSession, ToSession>;

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip_down(msg: Down) {
        let mut buf = BytesMut::new();
        ParentCodec::default()
            .encode(msg.clone(), &mut buf)
            .unwrap();
        // Feed byte by byte: partial frames must wait, not fail.
        let mut dec = ChildCodec::default();
        let mut src = BytesMut::new();
        let mut got = None;
        for b in buf {
            src.put_u8(b);
            if let Some(m) = dec.decode(&mut src).unwrap() {
                got = Some(m);
            }
        }
        assert_eq!(got, Some(msg));
        assert!(src.is_empty());
    }

    /// A well-formed Start for node 2 of three hosts.
    fn sample_start() -> Start {
        Start {
            version: PROTOCOL_VERSION,
            job_id: "j1".into(),
            node_idx: 2,
            hosts: vec!["n1".into(), "n2".into(), "n3".into()],
            ranks: vec![vec![0], vec![1], vec![2]],
            launch_sizes: vec![1],
            apps: vec![App {
                first_rank: 0,
                argv: vec!["hostname".into()],
            }],
            env: vec![("A".into(), "b".into())],
            cwd: "/".into(),
            rsh: vec!["rsh".into()],
            agent: vec!["/x/greedyd".into()],
            batch: 8,
            retries: 2,
            hello_timeout_s: 30.0,
            grace_s: 3.0,
            lost_after_s: 60.0,
            model: LaunchModel::new(0.01, 0.1).unwrap(),
            pmi: PmiMode::Auto,
            secret: JobSecret::from_bytes(&[0; 32]).unwrap(),
            stdin_rank: Some(0),
            bind: BindTo::None,
            log: String::new(),
            tasks: false,
            unbuffered: false,
            universe: 0,
            bcast: Vec::new(),
        }
    }

    #[test]
    fn frames_roundtrip_in_pieces() {
        roundtrip_down(Down::Route {
            to: Some(3),
            cmd: Cmd::Stdin(Bytes::from_static(b"hello\n")),
        });
        roundtrip_down(Down::Route {
            to: None,
            cmd: Cmd::Teardown,
        });
        roundtrip_down(Down::Start(Box::new(sample_start())));
    }

    fn roundtrip_up(msg: Up) {
        let mut buf = BytesMut::new();
        ChildCodec::default().encode(msg.clone(), &mut buf).unwrap();
        assert_eq!(ParentCodec::default().decode(&mut buf).unwrap(), Some(msg));
        assert!(buf.is_empty());
    }

    #[test]
    fn spawn_frames_roundtrip_typed() {
        use greedy_pmix::child::{ChildApp, SpawnApp};
        let request = SpawnRequest {
            parent: "j".into(),
            requester: 3,
            family: greedy_pmix::family::Family::Pmix,
            apps: vec![SpawnApp {
                program: "./child".into(),
                args: vec!["a b".into()],
                maxprocs: 2,
                env: vec![("OMPI_PARENT_PORT".into(), "p:1".into())],
                cwd: Some("/tmp".into()),
                hosts: vec!["n2".into()],
                path: None,
            }],
            preput: vec![("PARENT_ROOT_PORT_NAME".into(), "tag#0$".into())],
        };
        roundtrip_up(Up::Spawn {
            node: 1,
            id: 4,
            request,
        });
        let job = ChildJob {
            nspace: "j.1".into(),
            parent: "j".into(),
            requester: 3,
            ranks: vec![vec![], vec![0, 1]],
            apps: vec![ChildApp {
                first_rank: 0,
                argv: vec!["./child".into()],
                env: vec![],
                cwd: None,
            }],
            preput: vec![],
        };
        roundtrip_down(Down::Route {
            to: None,
            cmd: Cmd::AddChild {
                child: 1,
                job: Box::new(job.clone()),
                start: false,
            },
        });
        let add_and_start = Cmd::AddChild {
            child: 2,
            job: Box::new(job),
            start: true,
        };
        roundtrip_down(Down::Route {
            to: None,
            cmd: add_and_start.clone(),
        });
        assert_eq!(
            JobCmd::of(add_and_start.clone()).map(Cmd::from),
            Some(add_and_start)
        );
        for cmd in [
            Cmd::StartChild { child: 1 },
            Cmd::KillChild { child: 1 },
            Cmd::SpawnAnswer {
                id: 4,
                result: Ok("j.1".into()),
            },
            Cmd::SpawnAnswer {
                id: 5,
                result: Err("no free slots".into()),
            },
        ] {
            roundtrip_down(Down::Route { to: Some(1), cmd });
        }
        roundtrip_up(Up::ChildAdded {
            node: 0,
            child: 1,
            result: Err("n1: not served".into()),
        });
        roundtrip_up(Up::ChildStarted {
            node: 1,
            child: 1,
            result: Ok(()),
        });
        roundtrip_up(Up::ChildOutput {
            child: 1,
            rank: 0,
            stream: Stream::Stderr,
            data: Bytes::from_static(b"hi\n"),
        });
        roundtrip_up(Up::ChildExit {
            child: 1,
            rank: 1,
            end: RankEnd::NotStarted,
            at: greedy_pmix::WallTime(1_795_000_000_000_000),
        });
        // A session's job takes every spawn command.
        let answer = Cmd::SpawnAnswer {
            id: 1,
            result: Err("x".into()),
        };
        assert_eq!(JobCmd::of(answer.clone()).map(Cmd::from), Some(answer));
        let start = Cmd::StartChild { child: 1 };
        assert_eq!(JobCmd::of(start.clone()).map(Cmd::from), Some(start));
        assert_eq!(JobCmd::of(Cmd::EndJob { job: 1 }), None);
    }

    #[test]
    fn two_up_frames_in_one_read() {
        let mut buf = BytesMut::new();
        let mut enc = ChildCodec::default();
        enc.encode(Up::Hello { node: 1 }, &mut buf).unwrap();
        enc.encode(
            Up::Exit {
                rank: 4,
                end: RankEnd::Signaled(9),
                silent: true,
                at: greedy_pmix::WallTime(7),
            },
            &mut buf,
        )
        .unwrap();
        let mut dec = ParentCodec::default();
        assert_eq!(dec.decode(&mut buf).unwrap(), Some(Up::Hello { node: 1 }));
        assert_eq!(
            dec.decode(&mut buf).unwrap(),
            Some(Up::Exit {
                rank: 4,
                end: RankEnd::Signaled(9),
                silent: true,
                at: greedy_pmix::WallTime(7),
            })
        );
        assert_eq!(dec.decode(&mut buf).unwrap(), None);
    }

    #[test]
    fn oversized_and_garbage_frames_are_errors() {
        let mut dec = ParentCodec::default();
        let mut src = BytesMut::from(&[0xff, 0xff, 0xff, 0xff][..]);
        assert!(
            dec.decode(&mut src)
                .unwrap_err()
                .to_string()
                .contains("exceeds")
        );
        // A shell's banner ("Welcome…") read as a frame length is refused, not waited for.
        let mut src = BytesMut::from(&b"Welcome to n3\n"[..]);
        assert!(dec.decode(&mut src).is_err());
        let mut src = BytesMut::from(&[0, 0, 0, 1, 0xff][..]);
        assert!(
            dec.decode(&mut src)
                .unwrap_err()
                .to_string()
                .contains("undecodable")
        );
    }

    #[test]
    fn each_rank_runs_its_parts_program() {
        let app = |first_rank, p: &str| App {
            first_rank,
            argv: vec![p.to_string()],
        };
        let s = Start {
            apps: vec![app(0, "a"), app(2, "b"), app(3, "c")],
            ..sample_start()
        };
        assert_eq!(s.check(), Ok(()));
        let progs: Vec<_> = (0..5).map(|r| s.argv_of(r)[0].as_str()).collect();
        assert_eq!(progs, ["a", "a", "b", "c", "c"]);
        for apps in [vec![], vec![app(1, "a")], vec![app(0, "a"), app(0, "b")]] {
            assert!(
                Start {
                    apps,
                    ..sample_start()
                }
                .check()
                .is_err()
            );
        }
    }

    #[test]
    fn an_agent_refuses_a_start_it_could_not_use() {
        let good = Start {
            node_idx: 1,
            launch_sizes: vec![2, 1],
            ..sample_start()
        };
        assert_eq!(good.check(), Ok(()));
        let bad = |f: &dyn Fn(&mut Start), want: &str| {
            let mut s = good.clone();
            f(&mut s);
            let e = s.check().unwrap_err();
            assert!(e.contains(want), "{e}");
        };
        bad(
            &|s| s.version = 1,
            &format!("protocol {PROTOCOL_VERSION}, greedyrun 1"),
        );
        bad(&|s| s.node_idx = 3, "node 3 of 3 hosts");
        bad(&|s| s.ranks.pop().map(drop).unwrap_or(()), "2 rank lists");
        bad(&|s| s.launch_sizes = vec![3, 1, 1], "beyond 3 hosts");
        // Duration::from_secs_f64 panics on these; the agent used to call it unchecked.
        bad(&|s| s.grace_s = 1e300, "grace");
        bad(&|s| s.hello_timeout_s = f64::NAN, "hello timeout");
        bad(&|s| s.grace_s = -1.0, "grace");
    }

    #[test]
    fn rank_end_codes() {
        assert_eq!(RankEnd::Exited(3).code(), 3);
        assert_eq!(RankEnd::Signaled(15).code(), 143);
        assert_eq!(RankEnd::NotStarted.code(), 127);
        assert!(!RankEnd::Exited(0).failed());
        assert_eq!(RankEnd::Signaled(i32::MAX).code(), i32::MAX);
    }
}
