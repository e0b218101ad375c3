//! srun's side of `MPI_Comm_spawn`: a rank's request started as a nested step of the job.
//!
//! As Slurm's own mpi/pmi2 does (`src/plugins/mpi/pmi2/spawn.c` `spawn_job_do_spawn`
//! @22.05.8), the user's srun runs one more srun for the children: a new step of the same job
//! with the user's authority, placed, confined, accounted and cancelled by Slurm like any
//! other. It adds `--overlap` (the parent step holds the CPUs, and 22.05 would otherwise wait
//! for them forever) and `--mpi=greedy`; the child step is a job of its own whose ranks are
//! told what a spawned job's are (`GREEDY_MPI_ORIGIN`: the spawner, the preput keys that lead
//! MPICH's children back to their parents' port, the appnums). Its output goes where this
//! srun's goes.
//!
//! Served to PMI-1/PMI-2 (MPICH, Intel MPI), whose children connect back through the preput
//! port with their own netmod. Open MPI's children need their parents' namespace in their own
//! PMIx server (`PMIx_Connect`), which a step of its own cannot give: refused, saying so.
//!
//! The requester is answered once the child step exists: the nested srun's own plugin tells
//! this srun so from its `client_prelaunch`, which Slurm calls after it created the step
//! (`C <seq> <ticket>` on this srun's listener, the ticket a secret of that spawn alone, in the
//! nested srun's environment). A nested srun that ends before (a spawn that does not fit the
//! allocation: "More processors requested than permitted") refuses the spawn with its last
//! words, so the program gets `MPI_ERR_SPAWN`, as when greedyrun finds no free slots. A child
//! step that fails after (its srun exits non-zero, as when a program cannot start) fails the
//! family: srun keeps the report (the job's exit code and why) and asks slurmctld to kill the
//! parent step. At `client_fini` srun waits for the children still running, or ends them at
//! once if the job was aborted.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use greedy_pmix::WallTime;
use greedy_pmix::child::{self, ChildJob, SpawnApp, SpawnOrigin, SpawnRequest};
use greedy_pmix::family::Family;
use tokio::sync::oneshot;

use crate::agent::KillStepFn;
use crate::plan;
use crate::rendezvous::{Answer, ExitReport, Reports, Spawner};

/// How often a nested srun's watcher looks at it.
const POLL: Duration = Duration::from_millis(50);
/// How long a nested srun has after SIGTERM (it cancels its step) before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(3);
/// How long a nested srun may take to create its step (Slurm retries a step that does not fit
/// yet): then the spawn is refused and the srun ended.
const CREATE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a nested srun waits for its spawner's word that it may launch (a PMIx child is
/// added on every node of the parent step first, `agent::ADD_CHILD_TIMEOUT`).
const TELL_TIMEOUT: Duration = Duration::from_secs(45);

/// The parent step, as the nested sruns need it.
pub struct Parent {
    /// `J.S`: the spawner's namespace, what the children are told.
    pub name: String,
    /// Its job id: the nested steps run in this job.
    pub job_id: u32,
    /// Its step id: the step killed when a child fails.
    pub step_id: u32,
    /// Its hosts, in node-index order: where a PMIx spawn's children run.
    pub hosts: Vec<String>,
    /// The srun to run (this process's own executable).
    pub srun: PathBuf,
    /// Asks slurmctld to kill a step.
    pub kill_step: Arc<KillStepFn>,
}

/// The nested sruns of one step; the [`Spawner`] srun's listener asks.
pub struct NestedSteps {
    parent: Parent,
    /// srun's listener port, where the nested sruns say their step exists.
    port: u16,
    reports: Reports,
    state: Arc<Mutex<State>>,
    watchers: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for NestedSteps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NestedSteps")
            .field("parent", &self.parent.name)
            .finish_non_exhaustive()
    }
}

/// What the watchers share with srun's listener and `client_fini`.
#[derive(Debug, Default)]
struct State {
    /// The spawns so far, by number.
    spawns: HashMap<u32, Spawn>,
    /// Set at `client_fini` when the job was aborted: the watchers end their sruns from then
    /// on, and their exits fail nothing.
    ending: bool,
    /// `client_fini` has begun: no more spawns.
    closed: bool,
}

/// The shared state, also after a panic elsewhere (nothing in it is left half-changed).
fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// One spawn's nested srun, as srun's listener and its watcher see it.
#[derive(Debug)]
struct Spawn {
    nspace: String,
    /// Its nested srun's proof that it speaks for this spawn.
    ticket: greedy_pmix::JobSecret,
    /// The requester's answer, while its connection waits for it.
    reply: Option<oneshot::Sender<Result<String, String>>>,
    /// The answer given while no connection waited (a PMIx requester still adding).
    outcome: Option<Result<String, String>>,
    /// Its step exists: from now on its failure is the family's.
    created: bool,
    /// A PMIx child: whether the requester's node added it everywhere, once it says.
    added: Option<bool>,
    pmix: bool,
    /// The nested srun's wait to launch its tasks (a PMIx child not yet added everywhere).
    launch: Option<oneshot::Sender<bool>>,
}

impl Spawn {
    /// Answers the requester (once).
    fn answer(&mut self, result: Result<String, String>) {
        match self.reply.take() {
            Some(reply) => {
                let _ = reply.send(result);
            }
            None => {
                self.outcome.get_or_insert(result);
            }
        }
    }

    /// Where the requester's answer goes: given at once if there is one already.
    fn await_answer(&mut self) -> oneshot::Receiver<Result<String, String>> {
        let (tx, rx) = oneshot::channel();
        match self.outcome.take() {
            Some(result) => {
                let _ = tx.send(result);
            }
            None => self.reply = Some(tx),
        }
        rx
    }

    /// The step exists and (a PMIx child) was added everywhere: it launches, and the
    /// requester is answered.
    fn go(&mut self) {
        if let Some(launch) = self.launch.take() {
            let _ = launch.send(true);
        }
        let nspace = self.nspace.clone();
        self.answer(Ok(nspace));
    }
}

impl NestedSteps {
    /// The nested sruns of step `parent`, whose failures go into `reports`; `port` is srun's
    /// listener.
    pub fn new(parent: Parent, port: u16, reports: Reports) -> NestedSteps {
        NestedSteps {
            parent,
            port,
            reports,
            state: Arc::default(),
            watchers: Mutex::default(),
        }
    }

    /// `client_fini`: no more spawns; waits for the nested sruns still running, ending them
    /// at once (SIGTERM, then SIGKILL) if the job was `aborted`.
    pub fn finish(&self, aborted: bool) {
        {
            let mut st = self.lock();
            st.closed = true;
            st.ending = aborted;
        }
        let watchers =
            std::mem::take(&mut *self.watchers.lock().unwrap_or_else(|p| p.into_inner()));
        for w in watchers {
            let _ = w.join();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Starts spawn `seq`'s nested srun and its watcher; a PMIx spawn's child job.
    fn start(
        &self,
        node: usize,
        seq: u32,
        request: &SpawnRequest,
    ) -> Result<(Spawn, Option<ChildJob>), String> {
        let nspace = child::nspace(&self.parent.name, seq);
        let nested = command(request, &self.parent, &nspace, node)?;
        let ticket = greedy_pmix::JobSecret::generate();
        let (tail, multi_prog) = match nested.programs {
            Programs::One(argv) => (argv, None),
            Programs::Many(conf) => {
                let file = multi_prog_file(&conf, seq)?;
                (vec![file.path().display().to_string()], Some(file))
            }
        };
        let mut srun = Command::new(&self.parent.srun);
        srun.args(&nested.args)
            .args(multi_prog.as_ref().map(|_| "--multi-prog"))
            .arg("--")
            .args(&tail)
            .envs(nested.env)
            .env(
                plan::VAR_TICKET,
                format!("{} {seq} {}", self.port, ticket.to_hex()),
            )
            .stdin(Stdio::null())
            .stderr(Stdio::piped());
        let mut process = srun
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", self.parent.srun.display()))?;
        let last_words = relay_stderr(process.stderr.take());
        let watcher = Watcher {
            process,
            _multi_prog: multi_prog,
            seq,
            node,
            what: describe(request),
            last_words,
            state: self.state.clone(),
            reports: self.reports.clone(),
            kill: (
                self.parent.kill_step.clone(),
                self.parent.job_id,
                self.parent.step_id,
            ),
        };
        let handle = std::thread::Builder::new()
            .name("greedy-mpi-spawn".into())
            .spawn(move || watcher.run())
            .map_err(|e| format!("cannot watch the srun of {nspace}: {e}"))?;
        self.watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(handle);
        let spawn = Spawn {
            nspace,
            ticket,
            reply: None,
            outcome: None,
            created: false,
            added: None,
            pmix: false,
            launch: None,
        };
        Ok((spawn, nested.child))
    }
}

impl Spawner for NestedSteps {
    fn spawn(&self, node: usize, request: SpawnRequest) -> oneshot::Receiver<Answer> {
        let (tx, rx) = oneshot::channel();
        // The lock is held while the srun starts, so its watcher finds the spawn recorded.
        let mut st = self.lock();
        if st.closed {
            let _ = tx.send(Answer::Done(Err("the job is ending".into())));
            return rx;
        }
        let seq = st.spawns.len() as u32 + 1;
        match self.start(node, seq, &request) {
            Ok((mut spawn, Some(child))) => {
                let _ = tx.send(Answer::Add(seq, child));
                spawn.pmix = true;
                st.spawns.insert(seq, spawn);
            }
            Ok((mut spawn, None)) => {
                let (reply, answer) = oneshot::channel();
                spawn.reply = Some(reply);
                st.spawns.insert(seq, spawn);
                // The final answer comes when the step exists (or cannot).
                tokio::spawn(async move {
                    let result = answer
                        .await
                        .unwrap_or_else(|_| Err("srun dropped the spawn".into()));
                    let _ = tx.send(Answer::Done(result));
                });
            }
            Err(why) => {
                let _ = tx.send(Answer::Done(Err(why)));
            }
        }
        rx
    }

    fn holds(&self, seq: u32, ticket: &str) -> bool {
        let st = self.lock();
        let theirs = greedy_pmix::JobSecret::from_hex(ticket);
        st.spawns
            .get(&seq)
            .zip(theirs)
            .is_some_and(|(spawn, theirs)| spawn.ticket.same_as(&theirs))
    }

    fn created(&self, seq: u32) -> oneshot::Receiver<bool> {
        let (tx, rx) = oneshot::channel();
        let mut st = self.lock();
        let Some(spawn) = st.spawns.get_mut(&seq) else {
            let _ = tx.send(false);
            return rx;
        };
        spawn.created = true;
        spawn.launch = Some(tx);
        match (spawn.pmix, spawn.added) {
            (false, _) | (true, Some(true)) => spawn.go(),
            (true, Some(false)) => drop(spawn.launch.take()),
            (true, None) => {}
        }
        rx
    }

    fn added(
        &self,
        seq: u32,
        result: Result<(), String>,
    ) -> oneshot::Receiver<Result<String, String>> {
        let mut st = self.lock();
        let Some(spawn) = st
            .spawns
            .get_mut(&seq)
            .filter(|s| s.pmix && s.added.is_none())
        else {
            let (tx, rx) = oneshot::channel();
            let _ = tx.send(Err(format!("no PMIx spawn {seq} waits to be added")));
            return rx;
        };
        let answer = spawn.await_answer();
        spawn.added = Some(result.is_ok());
        match result {
            Err(why) => {
                // Its srun, told not to launch, fails and ends; the requester hears why now.
                drop(spawn.launch.take());
                spawn.answer(Err(why));
            }
            Ok(()) if spawn.created => spawn.go(),
            Ok(()) => {}
        }
        answer
    }
}

/// How a nested srun is run.
#[derive(Debug, PartialEq, Eq)]
pub struct NestedCommand {
    /// srun's options.
    pub args: Vec<String>,
    /// Variables on top of this srun's environment.
    pub env: Vec<(String, String)>,
    /// What its tasks run.
    pub programs: Programs,
    /// A PMIx spawn: the child job the parent step serves, on every node, before the nested
    /// step launches.
    pub child: Option<ChildJob>,
}

/// What a nested step's tasks run.
#[derive(Debug, PartialEq, Eq)]
pub enum Programs {
    /// One program: its argv.
    One(Vec<String>),
    /// Several (`MPI_Comm_spawn_multiple`): srun's `--multi-prog` configuration, one line per
    /// program over its ranks.
    Many(String),
}

/// The nested srun for `request` of a rank on `parent`'s node `node`, the child named
/// `nspace`. Several programs run as one step through `--multi-prog`. A PMI child is a job of
/// its own: when every program names its hosts, each rank goes to its program's
/// (`--distribution=arbitrary`), else Slurm places all of them on the hosts named, or anywhere
/// in the allocation. A PMIx child is served by the parent step ([`crate::attach`]): each
/// rank is placed on one of the parent's nodes here.
pub fn command(
    request: &SpawnRequest,
    parent: &Parent,
    nspace: &str,
    node: usize,
) -> Result<NestedCommand, String> {
    let apps = &request.apps;
    let first = apps.first().ok_or("a spawn of no program")?;
    if apps.iter().any(|a| a.cwd != first.cwd) {
        return Err("programs with different working directories in one spawn under srun".into());
    }
    let total: u32 = apps.iter().map(|a| a.maxprocs).sum();
    let mut args = vec![
        format!("--jobid={}", parent.job_id),
        "--overlap".into(),
        "--mpi=greedy".into(),
        format!("--ntasks={total}"),
        format!("--job-name={nspace}"),
    ];
    let mut env: Vec<(String, String)> = apps.iter().flat_map(|a| a.env.clone()).collect();
    let (child, protocol) = match request.family {
        Family::Pmi => {
            args.extend(placement(apps));
            env.push((
                plan::VAR_ORIGIN.into(),
                plan::encode_origin(&origin(request, parent)),
            ));
            (None, plan::Protocol::Pmi)
        }
        Family::Pmix => {
            let on = parent_nodes(apps, parent, node)?;
            let hosts: Vec<&str> = on.iter().map(|&n| parent.hosts[n].as_str()).collect();
            args.push(format!("--nodelist={}", hosts.join(",")));
            args.push("--distribution=arbitrary".into());
            let mut ranks = vec![Vec::new(); parent.hosts.len()];
            for (rank, &n) in on.iter().enumerate() {
                ranks[n].push(rank as u32);
            }
            let attach = plan::Attach {
                parent_step: parent.step_id,
                nspace: nspace.to_string(),
            };
            env.push((plan::VAR_ATTACH.into(), attach.encode()));
            let child = ChildJob::new(nspace.to_string(), request, ranks, None);
            (Some(child), plan::Protocol::Pmix)
        }
        Family::Charm => return Err("a spawn from a Charm++ process".into()),
    };
    if let Some(cwd) = &first.cwd {
        args.push(format!("--chdir={cwd}"));
    }
    let programs = match apps.as_slice() {
        [app] => Programs::One(
            std::iter::once(&app.program)
                .chain(&app.args)
                .cloned()
                .collect(),
        ),
        _ => Programs::Many(multi_prog(apps)?),
    };
    // The children run the parents' MPI: the step serves that family alone.
    env.push((plan::USER_PROTOCOL.into(), protocol.to_string()));
    let paths: Vec<&str> = apps.iter().filter_map(|a| a.path.as_deref()).collect();
    if !paths.is_empty() {
        let inherited = std::env::var("PATH").unwrap_or_default();
        env.push(("PATH".into(), format!("{}:{inherited}", paths.join(":"))));
    }
    Ok(NestedCommand {
        args,
        env,
        programs,
        child,
    })
}

/// What a PMI child is told of where it came from.
fn origin(request: &SpawnRequest, parent: &Parent) -> SpawnOrigin {
    let app_starts = (request.apps.iter())
        .scan(0, |next, a| {
            Some(std::mem::replace(next, *next + a.maxprocs))
        })
        .collect();
    SpawnOrigin {
        spawner: parent.name.clone(),
        preput: request.preput.clone(),
        app_starts,
    }
}

/// The parent's node each rank of a PMIx child runs on: its program's hosts in turn when it
/// names some (each must be one of the parent's nodes, which serve the child), else the
/// parent's nodes in turn from the requester's.
fn parent_nodes(apps: &[SpawnApp], parent: &Parent, node: usize) -> Result<Vec<usize>, String> {
    let n_nodes = parent.hosts.len().max(1);
    let (mut on, mut unnamed) = (Vec::new(), 0);
    for app in apps {
        let named: Vec<usize> = (app.hosts.iter())
            .map(|h| {
                (parent.hosts.iter().position(|p| p == h)).ok_or_else(|| {
                    format!(
                        "host {h}: a PMIx spawn under srun runs on the step's own nodes ({})",
                        parent.hosts.join(",")
                    )
                })
            })
            .collect::<Result<_, _>>()?;
        for i in 0..app.maxprocs as usize {
            on.push(match named.is_empty() {
                true => {
                    unnamed += 1;
                    (node + unnamed - 1) % n_nodes
                }
                false => named[i % named.len()],
            });
        }
    }
    Ok(on)
}

/// srun's placement options for `apps`: each rank on its program's hosts in turn when every
/// program names some, else the hosts named, if any.
fn placement(apps: &[SpawnApp]) -> Vec<String> {
    if apps.len() > 1 && apps.iter().all(|a| !a.hosts.is_empty()) {
        let per_rank: Vec<&str> = apps
            .iter()
            .flat_map(|a| a.hosts.iter().cycle().take(a.maxprocs as usize))
            .map(String::as_str)
            .collect();
        return vec![
            format!("--nodelist={}", per_rank.join(",")),
            "--distribution=arbitrary".into(),
        ];
    }
    let mut hosts: Vec<&str> = apps
        .iter()
        .flat_map(|a| &a.hosts)
        .map(String::as_str)
        .collect();
    hosts.dedup();
    match hosts.is_empty() {
        true => Vec::new(),
        false => vec![format!("--nodelist={}", hosts.join(","))],
    }
}

/// srun's `--multi-prog` configuration for `apps`: `first-last program args…` per program,
/// every word escaped for its parser (slurmstepd's multi_prog.c@22.05.8: a backslash takes
/// the next character as it is; `%t` and `%o` would be replaced).
fn multi_prog(apps: &[SpawnApp]) -> Result<String, String> {
    let mut conf = String::new();
    let mut first = 0;
    for app in apps {
        let last = first + app.maxprocs - 1;
        let words = std::iter::once(&app.program).chain(&app.args);
        let escaped: Result<Vec<String>, String> = words.map(|w| escape_word(w)).collect();
        conf.push_str(&format!("{first}-{last} {}\n", escaped?.join(" ")));
        first = last + 1;
    }
    Ok(conf)
}

/// One word for a `--multi-prog` line: `''` when empty, else each character that is not
/// plainly safe behind a backslash. A newline cannot be said there.
fn escape_word(word: &str) -> Result<String, String> {
    if word.contains(['\n', '\r']) {
        return Err(format!(
            "{word:?}: a line break in a program's words under srun"
        ));
    }
    if word.is_empty() {
        return Ok("''".into());
    }
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@".contains(c);
    Ok(word
        .chars()
        .flat_map(|c| (!safe(c)).then_some('\\').into_iter().chain([c]))
        .collect())
}

/// In a nested srun (its environment has [`plan::VAR_TICKET`]): tells the spawning srun that
/// the step exists, which answers the rank that asked. Called in `client_prelaunch`, after
/// Slurm created the step; an error fails the step's launch.
pub fn tell_spawner() -> Result<(), String> {
    let Ok(ticket) = std::env::var(plan::VAR_TICKET) else {
        return Ok(());
    };
    let mut words = ticket.split(' ');
    let (Some(port), Some(seq), Some(proof), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Err(format!("{}: not `port seq ticket`", plan::VAR_TICKET));
    };
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{}: bad port", plan::VAR_TICKET))?;
    let seq: u32 = seq
        .parse()
        .map_err(|_| format!("{}: bad number", plan::VAR_TICKET))?;
    let spawner = SocketAddr::from(([127, 0, 0, 1], port));
    let told = || -> std::io::Result<String> {
        let mut s = TcpStream::connect_timeout(&spawner, TELL_TIMEOUT)?;
        s.set_read_timeout(Some(TELL_TIMEOUT))?;
        writeln!(
            s,
            "{}",
            crate::rendezvous::Line::Created(seq, proof.to_string())
        )?;
        let mut answer = String::new();
        BufReader::new(s.take(16)).read_line(&mut answer)?;
        Ok(answer)
    };
    match told() {
        Ok(answer) if answer.trim_end() == "K" => Ok(()),
        Ok(_) => Err(format!("the spawning srun at {spawner} refused this step")),
        Err(e) => Err(format!("cannot tell the spawning srun at {spawner}: {e}")),
    }
}

/// The request in a few words, for messages.
fn describe(request: &SpawnRequest) -> String {
    let programs: Vec<String> = request
        .apps
        .iter()
        .map(|a| format!("{} x{}", a.program, a.maxprocs))
        .collect();
    format!("{} from rank {}", programs.join(", "), request.requester)
}

/// Copies a nested srun's stderr to this srun's as it comes, keeping its last line (why a
/// spawn was refused); the thread ends at the srun's exit.
fn relay_stderr(
    stderr: Option<std::process::ChildStderr>,
) -> Option<std::thread::JoinHandle<String>> {
    let stderr = stderr?;
    std::thread::Builder::new()
        .name("greedy-mpi-spawn-err".into())
        .spawn(move || {
            let mut last = String::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = writeln!(std::io::stderr(), "{line}");
                if !line.trim().is_empty() {
                    last = line;
                }
            }
            last
        })
        .ok()
}

/// A nested srun's `--multi-prog` configuration: a private (0600) file in the temporary
/// directory, removed when dropped (srun reads it as it starts).
fn multi_prog_file(conf: &str, seq: u32) -> Result<tempfile::NamedTempFile, String> {
    let mut file = tempfile::Builder::new()
        .prefix(&format!("greedy-spawn-{seq}-"))
        .suffix(".conf")
        .tempfile()
        .map_err(|e| format!("cannot make a --multi-prog file: {e}"))?;
    file.write_all(conf.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", file.path().display()))?;
    Ok(file)
}

/// Looks after one nested srun until it ends.
struct Watcher {
    process: Child,
    /// Its `--multi-prog` file, kept until it ends.
    _multi_prog: Option<tempfile::NamedTempFile>,
    seq: u32,
    node: usize,
    what: String,
    last_words: Option<std::thread::JoinHandle<String>>,
    state: Arc<Mutex<State>>,
    reports: Reports,
    kill: (Arc<KillStepFn>, u32, u32),
}

/// How a nested srun ended, as its watcher judges it.
enum Ended {
    /// Its step existed: a failure is the family's (unless the job was ending anyway).
    Created(ExitStatus),
    /// Before its step existed: the spawn is refused with this.
    Refused(String),
    /// Nothing to say (the job was ending, or the srun could not be waited for).
    Quietly,
}

impl Watcher {
    /// Polls the srun (signalling it only while it is known unreaped, so never another
    /// process that took its pid) and acts on its end.
    fn run(mut self) {
        let started = Instant::now();
        let mut termed: Option<Instant> = None;
        let ended = loop {
            let mut st = lock(&self.state);
            let ending = st.ending;
            let Some(spawn) = st.spawns.get_mut(&self.seq) else {
                break Ended::Quietly;
            };
            match self.process.try_wait() {
                Ok(Some(status)) if spawn.created && !ending => break Ended::Created(status),
                Ok(Some(status)) if !spawn.created => {
                    break Ended::Refused(format!("its srun exited {}", exit_code(status)));
                }
                Ok(Some(_)) | Err(_) => break Ended::Quietly,
                Ok(None) => {}
            }
            let overdue = !spawn.created && started.elapsed() > CREATE_TIMEOUT;
            if overdue {
                spawn.answer(Err(format!(
                    "its step was not created within {CREATE_TIMEOUT:?}"
                )));
            }
            if ending || overdue || termed.is_some() {
                let since = *termed.get_or_insert_with(|| {
                    send_term(self.process.id());
                    Instant::now()
                });
                if since.elapsed() > TERM_GRACE {
                    let _ = self.process.kill();
                }
            }
            drop(st);
            std::thread::sleep(POLL);
        };
        let last = self.last_words.take().and_then(|t| t.join().ok());
        match ended {
            Ended::Created(status) if !status.success() => self.fail(status),
            Ended::Refused(why) => {
                let why = match last {
                    Some(last) if !last.is_empty() => format!("{why}: {last}"),
                    _ => why,
                };
                let mut st = lock(&self.state);
                if let Some(spawn) = st.spawns.get_mut(&self.seq) {
                    spawn.answer(Err(why));
                }
            }
            _ => {}
        }
    }

    /// The child failed: the family ends with its code, saying why.
    fn fail(&self, status: ExitStatus) {
        let code = exit_code(status);
        let nspace = {
            let st = lock(&self.state);
            st.spawns
                .get(&self.seq)
                .map(|s| s.nspace.clone())
                .unwrap_or_default()
        };
        let reason = format!(
            "spawned job {nspace} ({}) failed: its srun exited {code}",
            self.what
        );
        tracing::error!("{reason}");
        self.reports.keep(ExitReport {
            node: self.node,
            code,
            at: WallTime::now(),
            reason,
        });
        let (kill, job, step) = &self.kill;
        kill(*job, *step);
    }
}

/// A process's exit code as a shell gives it: 128 + the signal that ended it.
fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// SIGTERM to `pid`: srun then cancels its step.
fn send_term(pid: u32) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use greedy_pmix::child::SpawnApp;

    fn parent() -> Parent {
        Parent {
            name: "7.0".into(),
            job_id: 7,
            step_id: 0,
            hosts: vec!["n1".into(), "n2".into(), "n3".into()],
            srun: "/bin/false".into(),
            kill_step: Arc::new(|_, _| true),
        }
    }

    fn request(family: Family, apps: usize) -> SpawnRequest {
        let app = SpawnApp {
            program: "./kid".into(),
            args: vec!["a b".into()],
            maxprocs: 3,
            env: vec![],
            cwd: Some("/work".into()),
            hosts: vec!["n1".into(), "n2".into()],
            path: None,
        };
        SpawnRequest {
            parent: "7.0".into(),
            requester: 1,
            family,
            apps: vec![app; apps],
            preput: vec![("PARENT_ROOT_PORT_NAME".into(), "port#1".into())],
        }
    }

    #[test]
    fn a_pmi_spawn_is_a_nested_overlapping_step_of_the_job_told_its_origin() {
        let NestedCommand {
            args,
            env,
            programs,
            child,
        } = command(&request(Family::Pmi, 1), &parent(), "7.0@1", 0).unwrap();
        assert_eq!(child, None);
        assert_eq!(
            args,
            [
                "--jobid=7",
                "--overlap",
                "--mpi=greedy",
                "--ntasks=3",
                "--job-name=7.0@1",
                "--nodelist=n1,n2",
                "--chdir=/work",
            ]
        );
        assert_eq!(programs, Programs::One(vec!["./kid".into(), "a b".into()]));
        let (name, hex) = &env[0];
        assert_eq!(name, plan::VAR_ORIGIN);
        assert_eq!(env[1], (plan::USER_PROTOCOL.into(), "pmi".into()));
        let origin = plan::decode_origin(hex).unwrap();
        assert_eq!(origin.spawner, "7.0");
        assert_eq!(
            origin.preput,
            [("PARENT_ROOT_PORT_NAME".into(), "port#1".into())]
        );
        assert_eq!(origin.app_starts, [0]);
    }

    #[test]
    fn several_programs_are_one_multi_prog_step_each_rank_on_its_programs_hosts() {
        let mut r = request(Family::Pmi, 2);
        r.apps[1].maxprocs = 1;
        r.apps[1].hosts = vec!["n3".into()];
        r.apps[1].args = vec!["50% it's".into(), "".into()];
        let nested = command(&r, &parent(), "7.0@2", 0).unwrap();
        assert!(nested.args.contains(&"--ntasks=4".to_string()));
        assert!(nested.args.contains(&"--nodelist=n1,n2,n1,n3".to_string()));
        assert!(
            nested
                .args
                .contains(&"--distribution=arbitrary".to_string())
        );
        let Programs::Many(conf) = nested.programs else {
            panic!("one program")
        };
        assert_eq!(conf, "0-2 ./kid a\\ b\n3-3 ./kid 50\\%\\ it\\'s ''\n");
        let origin = plan::decode_origin(&nested.env[0].1).unwrap();
        assert_eq!(origin.app_starts, [0, 3]);
        // Without hosts for every program Slurm places them all.
        r.apps[1].hosts.clear();
        let nested = command(&r, &parent(), "7.0@3", 0).unwrap();
        assert!(nested.args.contains(&"--nodelist=n1,n2".to_string()));
        assert!(!nested.args.iter().any(|a| a.starts_with("--distribution")));
        r.apps[1].args = vec!["two\nlines".into()];
        assert!(
            command(&r, &parent(), "7.0@4", 0)
                .unwrap_err()
                .contains("line break")
        );
        r.apps[1].args.clear();
        r.apps[1].cwd = None;
        assert!(
            command(&r, &parent(), "7.0@5", 0)
                .unwrap_err()
                .contains("working directories")
        );
    }

    #[test]
    fn a_pmix_spawn_runs_on_the_parents_nodes_attached_to_them() {
        let mut r = request(Family::Pmix, 2);
        r.apps[1].maxprocs = 2;
        r.apps[1].hosts = vec![];
        let nested = command(&r, &parent(), "7.0@1", 1).unwrap();
        // App 0 names n1 and n2 in turn; app 1 none: the parent's nodes in turn from the
        // requester's (n2, n3).
        assert!(
            nested
                .args
                .contains(&"--nodelist=n1,n2,n1,n2,n3".to_string())
        );
        assert!(
            nested
                .args
                .contains(&"--distribution=arbitrary".to_string())
        );
        let attach = (nested.env.iter())
            .find(|(k, _)| k == plan::VAR_ATTACH)
            .unwrap();
        assert_eq!(
            plan::Attach::decode(&attach.1).unwrap(),
            plan::Attach {
                parent_step: 0,
                nspace: "7.0@1".into()
            }
        );
        assert!(
            nested
                .env
                .contains(&(plan::USER_PROTOCOL.into(), "pmix".into()))
        );
        assert!(nested.env.iter().all(|(k, _)| k != plan::VAR_ORIGIN));
        let child = nested.child.unwrap();
        assert_eq!(child.ranks, [vec![0, 2], vec![1, 3], vec![4]]);
        assert_eq!((child.apps[1].first_rank, child.requester), (3, 1));
        // A host outside the parent step cannot serve the child.
        r.apps[0].hosts = vec!["n9".into()];
        let outside = command(&r, &parent(), "7.0@2", 0).unwrap_err();
        assert!(
            outside.contains("n9") && outside.contains("n1,n2,n3"),
            "{outside}"
        );
    }

    /// A fake srun: says its step exists (as `tell_spawner` does) unless told to fail
    /// first, then exits with the code its arguments end with.
    const FAKE_SRUN: &str = r#"#!/bin/bash
code=${@: -1}
if [[ $code == refuse ]]; then echo "srun: error: More processors requested than permitted" >&2; exit 1; fi
read -r port seq ticket <<<"$GREEDY_MPI_TICKET"
exec 3<>"/dev/tcp/127.0.0.1/$port"
echo "C $seq $ticket" >&3
read -r answer <&3
[[ $answer == K ]] || exit 99
exit "$code"
"#;

    /// srun's listener serving spawns with `srun` as the nested srun; what a stepd asks.
    struct Listener {
        addr: std::net::SocketAddr,
        secret: greedy_pmix::JobSecret,
        nested: Arc<NestedSteps>,
        reports: Reports,
        kills: Arc<Mutex<Vec<(u32, u32)>>>,
        _dir: tempfile::TempDir,
    }

    async fn listener() -> Listener {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let srun = dir.path().join("srun");
        std::fs::write(&srun, FAKE_SRUN).unwrap();
        std::fs::set_permissions(&srun, std::fs::Permissions::from_mode(0o755)).unwrap();
        let secret = greedy_pmix::JobSecret::generate();
        let idle = Duration::from_secs(30);
        let board = crate::rendezvous::SrunBoard::bind(
            "127.0.0.1:0".parse().unwrap(),
            "7.0",
            &secret,
            2,
            idle,
        )
        .await
        .unwrap();
        let addr = board.local_addr().unwrap();
        let kills = Arc::new(Mutex::new(Vec::new()));
        let k = kills.clone();
        let parent = Parent {
            srun,
            kill_step: Arc::new(move |job, step| {
                k.lock().unwrap().push((job, step));
                true
            }),
            ..parent()
        };
        let reports = board.reports();
        let nested = Arc::new(NestedSteps::new(parent, addr.port(), reports.clone()));
        board.serve_spawns(nested.clone());
        tokio::spawn(board.serve());
        Listener {
            addr,
            secret,
            nested,
            reports,
            kills,
            _dir: dir,
        }
    }

    fn with_last_arg(arg: &str) -> SpawnRequest {
        let mut r = request(Family::Pmi, 1);
        r.apps[0].args = vec![arg.into()];
        r
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_spawn_is_answered_once_its_step_exists_and_a_later_failure_ends_the_family() {
        let l = listener().await;
        let ask = |arg: &'static str| {
            let (addr, secret) = (l.addr, l.secret.clone());
            async move {
                let request = with_last_arg(arg);
                let add = async |_| Err("a PMI spawn has no child".to_string());
                crate::rendezvous::ask_spawn(addr, "7.0", &secret, 1, &request, add).await
            }
        };
        assert_eq!(ask("0").await, Ok("7.0@1".into()));
        // A step that does not fit: refused with srun's own words, the family lives on.
        let refused = ask("refuse").await.unwrap_err();
        assert!(
            refused.contains("exited 1") && refused.contains("More processors"),
            "{refused}"
        );
        assert_eq!(ask("7").await, Ok("7.0@3".into()));
        let nested = l.nested.clone();
        tokio::task::spawn_blocking(move || nested.finish(false))
            .await
            .unwrap();
        let report = l.reports.earliest().expect("the failed child's report");
        assert_eq!((report.node, report.code), (1, 7));
        assert!(
            report.reason.contains("7.0@3") && report.reason.contains("./kid x3"),
            "{report:?}"
        );
        assert_eq!(*l.kills.lock().unwrap(), [(7, 0)]);
        let late = ask("0").await.unwrap_err();
        assert!(late.contains("ending"), "{late}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stranger_cannot_say_a_step_exists() {
        let l = listener().await;
        assert!(
            !l.nested
                .holds(1, &greedy_pmix::JobSecret::generate().to_hex())
        );
        assert!(!l.nested.holds(1, "zz"));
        let nested = l.nested.clone();
        tokio::task::spawn_blocking(move || nested.finish(false))
            .await
            .unwrap();
    }
}
