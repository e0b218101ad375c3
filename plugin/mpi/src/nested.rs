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
//! A child step that fails (its srun exits non-zero, as when a program cannot start) fails the
//! family: srun keeps the report (the job's exit code and why) and asks slurmctld to kill the
//! parent step. At `client_fini` srun waits for the children still running, or ends them at
//! once if the job was aborted.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use greedy_pmix::WallTime;
use greedy_pmix::child::{self, SpawnOrigin, SpawnRequest};
use greedy_pmix::family::Family;

use crate::plan;
use crate::rendezvous::{ExitReport, Reports, Spawner};

/// How often a nested srun's watcher looks at it.
const POLL: Duration = Duration::from_millis(50);
/// How long a nested srun has after SIGTERM (it cancels its step) before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(3);

/// Kills every task of step (job, step); false if slurmctld refused.
pub type KillStepFn = dyn Fn(u32, u32) -> bool + Send + Sync;

/// The parent step, as the nested sruns need it.
pub struct Parent {
    /// `J.S`: the spawner's namespace, what the children are told.
    pub name: String,
    /// Its job id: the nested steps run in this job.
    pub job_id: u32,
    /// Its step id: the step killed when a child fails.
    pub step_id: u32,
    /// The srun to run (this process's own executable).
    pub srun: PathBuf,
    /// Asks slurmctld to kill a step.
    pub kill_step: Arc<KillStepFn>,
}

/// The nested sruns of one step; the [`Spawner`] srun's listener asks.
pub struct NestedSteps {
    parent: Parent,
    next: AtomicU32,
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

/// What the watchers share with srun's `client_fini`.
#[derive(Debug, Default)]
struct State {
    /// Running nested sruns: namespace by pid.
    running: HashMap<u32, String>,
    /// Set at `client_fini` when the job was aborted: the watchers end their sruns from then
    /// on, and their exits fail nothing.
    ending: Option<Instant>,
    /// `client_fini` has begun: no more spawns.
    closed: bool,
}

impl NestedSteps {
    /// The nested sruns of step `parent`, whose failures go into `reports`.
    pub fn new(parent: Parent, reports: Reports) -> NestedSteps {
        NestedSteps {
            parent,
            next: AtomicU32::new(1),
            reports,
            state: Arc::default(),
            watchers: Mutex::default(),
        }
    }

    /// `client_fini`: no more spawns; waits for the nested sruns still running, ending them
    /// at once (SIGTERM, then SIGKILL) if the job was `aborted`.
    pub fn finish(&self, aborted: bool) {
        {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.closed = true;
            if aborted {
                st.ending = Some(Instant::now());
            }
        }
        let watchers =
            std::mem::take(&mut *self.watchers.lock().unwrap_or_else(|p| p.into_inner()));
        for w in watchers {
            let _ = w.join();
        }
    }

    /// Starts the nested srun of `nspace` and its watcher.
    fn start(&self, node: usize, nspace: &str, request: &SpawnRequest) -> Result<(), String> {
        let nested = command(request, &self.parent, nspace)?;
        let mut srun = Command::new(&self.parent.srun);
        srun.args(&nested.args)
            .envs(nested.env)
            .stdin(Stdio::null());
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.closed {
            return Err("the job is ending".into());
        }
        let process = srun
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", self.parent.srun.display()))?;
        st.running.insert(process.id(), nspace.to_string());
        drop(st);
        let watcher = Watcher {
            process,
            nspace: nspace.to_string(),
            node,
            what: describe(request),
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
        Ok(())
    }
}

impl Spawner for NestedSteps {
    fn spawn(&self, node: usize, request: SpawnRequest) -> Result<String, String> {
        let nspace = child::nspace(&self.parent.name, self.next.fetch_add(1, Ordering::Relaxed));
        self.start(node, &nspace, &request)?;
        Ok(nspace)
    }
}

/// How a nested srun is run.
#[derive(Debug, PartialEq, Eq)]
pub struct NestedCommand {
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables on top of this srun's environment.
    pub env: Vec<(String, String)>,
}

/// The nested srun for `request` of `parent`'s rank, the child named `nspace`. One program
/// only; PMI only.
pub fn command(
    request: &SpawnRequest,
    parent: &Parent,
    nspace: &str,
) -> Result<NestedCommand, String> {
    if request.family != Family::Pmi {
        return Err(format!(
            "spawn under srun --mpi=greedy serves PMI-1/PMI-2 (MPICH, Intel MPI); {} spawn \
             (Open MPI) needs greedyrun",
            request.family
        ));
    }
    let [app] = request.apps.as_slice() else {
        return Err(format!(
            "spawn of {} programs at once (MPI_Comm_spawn_multiple) under srun is not served",
            request.apps.len()
        ));
    };
    let mut args = vec![
        format!("--jobid={}", parent.job_id),
        "--overlap".into(),
        "--mpi=greedy".into(),
        format!("--ntasks={}", app.maxprocs),
        format!("--job-name={nspace}"),
    ];
    if !app.hosts.is_empty() {
        args.push(format!("--nodelist={}", app.hosts.join(",")));
    }
    if let Some(cwd) = &app.cwd {
        args.push(format!("--chdir={cwd}"));
    }
    args.push("--".into());
    args.push(app.program.clone());
    args.extend(app.args.iter().cloned());
    let origin = SpawnOrigin {
        spawner: parent.name.clone(),
        preput: request.preput.clone(),
        app_starts: vec![0],
    };
    let mut env = app.env.clone();
    env.push((plan::VAR_ORIGIN.into(), plan::encode_origin(&origin)));
    if let Some(path) = &app.path {
        let inherited = std::env::var("PATH").unwrap_or_default();
        env.push(("PATH".into(), format!("{path}:{inherited}")));
    }
    Ok(NestedCommand { args, env })
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

/// Looks after one nested srun until it ends.
struct Watcher {
    process: Child,
    nspace: String,
    node: usize,
    what: String,
    state: Arc<Mutex<State>>,
    reports: Reports,
    kill: (Arc<KillStepFn>, u32, u32),
}

impl Watcher {
    /// Polls the srun (signalling it only while it is known unreaped, so never another
    /// process that took its pid), then reports a failure unless the job was ending.
    fn run(mut self) {
        let pid = self.process.id();
        let mut termed = None;
        let status = loop {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            match self.process.try_wait() {
                Ok(Some(status)) => {
                    st.running.remove(&pid);
                    break Some((status, st.ending.is_some()));
                }
                Ok(None) => {}
                Err(_) => {
                    st.running.remove(&pid);
                    break None;
                }
            }
            if st.ending.is_some() {
                let since = *termed.get_or_insert_with(|| {
                    send_term(pid);
                    Instant::now()
                });
                if since.elapsed() > TERM_GRACE {
                    let _ = self.process.kill();
                }
            }
            drop(st);
            std::thread::sleep(POLL);
        };
        if let Some((status, false)) = status
            && !status.success()
        {
            self.fail(status);
        }
    }

    /// The child failed: the family ends with its code, saying why.
    fn fail(&self, status: ExitStatus) {
        let code = exit_code(status);
        let reason = format!(
            "spawned job {} ({}) failed: its srun exited {code}",
            self.nspace, self.what
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
        let NestedCommand { args, env } =
            command(&request(Family::Pmi, 1), &parent(), "7.0@1").unwrap();
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
                "--",
                "./kid",
                "a b"
            ]
        );
        let (name, hex) = &env[0];
        assert_eq!(name, plan::VAR_ORIGIN);
        let origin = plan::decode_origin(hex).unwrap();
        assert_eq!(origin.spawner, "7.0");
        assert_eq!(
            origin.preput,
            [("PARENT_ROOT_PORT_NAME".into(), "port#1".into())]
        );
        assert_eq!(origin.app_starts, [0]);
    }

    #[test]
    fn pmix_and_several_programs_are_refused_saying_why() {
        let pmix = command(&request(Family::Pmix, 1), &parent(), "7.0@1").unwrap_err();
        assert!(pmix.contains("greedyrun"), "{pmix}");
        let two = command(&request(Family::Pmi, 2), &parent(), "7.0@1").unwrap_err();
        assert!(two.contains("2 programs"), "{two}");
    }

    #[test]
    fn a_child_srun_that_fails_ends_the_family_with_its_code() {
        let kills = Arc::new(Mutex::new(Vec::new()));
        let k = kills.clone();
        let parent = Parent {
            kill_step: Arc::new(move |job, step| {
                k.lock().unwrap().push((job, step));
                true
            }),
            ..parent()
        };
        let reports = crate::rendezvous::test_reports();
        let nested = NestedSteps::new(parent, reports.clone());
        assert_eq!(nested.spawn(2, request(Family::Pmi, 1)), Ok("7.0@1".into()));
        nested.finish(false);
        let report = reports.earliest().expect("a failure report");
        assert_eq!((report.node, report.code), (2, 1));
        assert!(report.reason.contains("7.0@1") && report.reason.contains("./kid x3"));
        assert_eq!(*kills.lock().unwrap(), [(7, 0)]);
        let late = nested.spawn(0, request(Family::Pmi, 1)).unwrap_err();
        assert!(late.contains("ending"), "{late}");
    }
}
