//! srun's side: the step's private variables, and srun's listener (a thread running
//! [`SrunBoard`] until `client_fini`): the rendezvous for steps without reserved ports, where
//! the node an abort started on reports the job's exit code, and where a rank's spawn becomes
//! a nested step ([`crate::nested`]).

use crate::Error;
use crate::agent::KillStepFn;
use crate::config::MpiConfig;
use crate::nested::{NestedSteps, Parent};
use crate::plan::{self, Protocol};
use crate::rendezvous::{ExitReport, Reports, SrunBoard};
use greedy_sys::slurm::StepLayout;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::oneshot;

/// What srun keeps between `client_prelaunch` and `client_fini`: its share of the step's
/// listener. A het step's components share one ([`HET_STEPS`]); it stops when the last
/// component's `client_fini` drops its share.
#[derive(Debug)]
pub struct Client {
    listener: Arc<Listener>,
    reports: Reports,
    /// The step's spawned jobs (none in a het step: spawn is not served there).
    nested: Option<Arc<NestedSteps>>,
}

/// srun's listener thread and its stop switch; dropping it stops the thread.
#[derive(Debug)]
struct Listener {
    stop: Mutex<Option<oneshot::Sender<()>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The het steps this srun is launching: srun calls `client_prelaunch` once per component
/// (each component is its own Slurm step, launched by its own thread: srun.c `_launch_app`),
/// with the layout of the whole het step each time. The first component plans the step (the
/// secret, the listener, the launch env); the others take the same plan, so every component's
/// nodes join one overlay. An entry lives as long as a component holds its listener.
static HET_STEPS: Mutex<Vec<HetShare>> = Mutex::new(Vec::new());

/// One het step's plan, shared by its components.
struct HetShare {
    /// The het step, `J.S`.
    name: String,
    listener: Weak<Listener>,
    reports: Reports,
    env: plan::LaunchEnv,
}

impl Client {
    /// Plans the step: the variables to put into the launch env, and srun's listener (the
    /// rendezvous of steps without reserved ports, and where the job's exit code comes back).
    /// A later component of a het step gets the plan its first component made.
    /// `kill_step` is how a failed spawned job ends the step.
    pub fn prelaunch(
        layout: &StepLayout,
        cfg: &MpiConfig,
        user_protocol: Option<&str>,
        resv_ports_in_env: bool,
        kill_step: Arc<KillStepFn>,
    ) -> Result<(Client, plan::LaunchEnv), Error> {
        if layout.het.is_none() {
            let spawns = spawn_parent(layout, kill_step)?;
            return Client::plan(layout, cfg, user_protocol, resv_ports_in_env, Some(spawns));
        }
        check_het_nodes(layout)?;
        let name = plan::client_step_name(layout);
        let mut steps = HET_STEPS.lock().unwrap_or_else(|p| p.into_inner());
        steps.retain(|s| s.listener.strong_count() > 0);
        if let Some(share) = steps.iter().find(|s| s.name == name)
            && let Some(listener) = share.listener.upgrade()
        {
            let client = Client {
                listener,
                reports: share.reports.clone(),
                nested: None,
            };
            return Ok((client, share.env.clone()));
        }
        let (client, env) = Client::plan(layout, cfg, user_protocol, resv_ports_in_env, None)?;
        steps.push(HetShare {
            name,
            listener: Arc::downgrade(&client.listener),
            reports: client.reports.clone(),
            env: env.clone(),
        });
        Ok((client, env))
    }

    /// [`Client::prelaunch`] for a step (or a het step's first component): a fresh plan;
    /// spawns served as nested steps of `spawns`, if given.
    fn plan(
        layout: &StepLayout,
        cfg: &MpiConfig,
        user_protocol: Option<&str>,
        resv_ports_in_env: bool,
        spawns: Option<Parent>,
    ) -> Result<(Client, plan::LaunchEnv), Error> {
        let srun = || "srun".to_string();
        let protocol =
            Protocol::resolve(user_protocol, cfg.protocol).map_err(|reason| Error::Malformed {
                node: srun(),
                var: plan::USER_PROTOCOL,
                value: user_protocol.unwrap_or_default().to_string(),
                reason,
            })?;
        let secret = greedy_pmix::JobSecret::generate();
        let job = plan::client_step_name(layout);
        let (port, stop, thread, reports, nested) =
            listen(&job, &secret, layout.ranks.len(), cfg.join_timeout, spawns)?;
        let client = Client {
            listener: Arc::new(Listener {
                stop: Mutex::new(Some(stop)),
                thread: Mutex::new(Some(thread)),
            }),
            reports,
            nested,
        };
        let through_srun = plan::rendezvous_through_srun(cfg, resv_ports_in_env);
        let mut env = plan::prelaunch_env(layout, &secret, cfg, protocol, port, through_srun);
        // srun sets it for the job it runs in (srun_job.c@22.05.8 `_set_env_vars`, or salloc's).
        let universe = std::env::var("SLURM_JOB_CPUS_PER_NODE").ok();
        if let Some(cpus) = universe.as_deref().and_then(plan::job_cpus) {
            env.push((plan::VAR_UNIVERSE, cpus.to_string()));
        }
        Ok((client, env))
    }

    /// Gives up this share of the listener (stopping it when it was the last: the step, or
    /// every component of the het step, has ended) and returns how the job ended, if a node
    /// said. srun exits with the highest code its components' `client_fini` return.
    /// Spawned jobs still running are waited for, or ended at once if the job was aborted.
    pub fn fini(self) -> Option<ExitReport> {
        let Client {
            listener,
            reports,
            nested,
        } = self;
        if let Some(nested) = nested {
            nested.finish(reports.earliest().is_some());
        }
        drop(listener);
        reports.earliest()
    }
}

/// The step as its nested sruns need it: its name, ids, this srun's executable.
fn spawn_parent(layout: &StepLayout, kill_step: Arc<KillStepFn>) -> Result<Parent, Error> {
    let srun =
        std::env::current_exe().map_err(|e| Error::io("srun")("find srun's own executable", e))?;
    Ok(Parent {
        name: plan::client_step_name(layout),
        hosts: step_hosts(layout)?,
        job_id: layout.job_id,
        step_id: layout.step_id,
        srun,
        kill_step,
    })
}

/// The step's hosts in node-index order, from srun's node list.
fn step_hosts(layout: &StepLayout) -> Result<Vec<String>, Error> {
    greedy_tree::hostlist::expand_at_most(&layout.node_list, layout.ranks.len()).map_err(|e| {
        Error::Malformed {
            node: "srun".into(),
            var: "step node list",
            value: layout.node_list.clone(),
            reason: e.to_string(),
        }
    })
}

/// Refuses a het step with a node in two components (srun's node list then names it twice):
/// each component runs its own slurmstepd there, and an overlay has one node service per node.
fn check_het_nodes(layout: &StepLayout) -> Result<(), Error> {
    let hosts = step_hosts(layout)?;
    match plan::het::shared_node(&hosts, &layout.ranks, None) {
        Some((host, components)) => Err(Error::SharedNode {
            node: "srun".into(),
            step: plan::client_step_name(layout),
            host,
            components,
        }),
        None => Ok(()),
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let stop = self
            .stop
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(stop) = stop {
            let _ = stop.send(());
        }
        let thread = self
            .thread
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// How long srun may still wait for its tasks once a node has reported the job's end (and
/// asked slurmctld to kill the step, which ends every task of a live node within seconds).
/// Past it srun waits for the tasks of a node that is gone: they never report, and
/// slurmctld's "Node failure" does not release srun (docs/reliability.md, under Slurm).
const SRUN_GIVE_UP: Duration = Duration::from_secs(30);

/// Once the job's end was reported [`SRUN_GIVE_UP`] ago and srun still waits, says why and
/// sends srun SIGTERM, which makes it abort the step's wait ("forcing job termination") and
/// exit after Slurm's own bound.
async fn give_up_on_lost_tasks(reports: Reports) {
    let report = reports.first().await;
    tokio::time::sleep(SRUN_GIVE_UP).await;
    tracing::error!(
        "mpi/greedy: the job ended {} s ago ({}), but srun still waits for tasks that never report (a node that is gone): ending srun",
        SRUN_GIVE_UP.as_secs(),
        report.reason
    );
    let me = rustix::process::getpid();
    let _ = rustix::process::kill_process(me, rustix::process::Signal::TERM);
}

/// srun's listener thread: its port, its stop switch, the thread, its exit reports and the
/// nested steps it starts.
type Started = (
    u16,
    oneshot::Sender<()>,
    std::thread::JoinHandle<()>,
    Reports,
    Option<Arc<NestedSteps>>,
);

/// Binds the listener on every IPv4 address (slurmd tells each stepd the address it saw srun
/// on, `SLURM_SRUN_COMM_HOST`) and serves it on its own thread with a one-thread runtime.
/// Anyone on the network can connect: the board's default `Limits` (first signed line within
/// 2 s, unproven connections capped in all and per source) keep strangers from holding it.
fn listen(
    job: &str,
    secret: &greedy_pmix::JobSecret,
    n_nodes: usize,
    idle: Duration,
    spawns: Option<Parent>,
) -> Result<Started, Error> {
    let io = Error::io("srun");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| io("rendezvous runtime", e))?;
    let board = rt
        .block_on(SrunBoard::bind(
            SocketAddr::from(([0, 0, 0, 0], 0)),
            job,
            secret,
            n_nodes,
            idle,
        ))
        .map_err(|e| io("rendezvous listener", e))?;
    let port = board
        .local_addr()
        .map_err(|e| io("rendezvous listener", e))?
        .port();
    let reports = board.reports();
    let nested = spawns.map(|parent| Arc::new(NestedSteps::new(parent, port, reports.clone())));
    if let Some(nested) = &nested {
        board.serve_spawns(nested.clone());
    }
    let (stop, stopped) = oneshot::channel::<()>();
    let watch = reports.clone();
    let thread = std::thread::Builder::new()
        .name("greedy-mpi-rdv".into())
        .spawn(move || {
            rt.block_on(async move {
                tokio::select! {
                    _ = board.serve() => {}
                    _ = stopped => {}
                    () = give_up_on_lost_tasks(watch) => {}
                }
            });
            rt.shutdown_timeout(Duration::from_millis(100));
        })
        .map_err(|e| io("rendezvous thread", e))?;
    Ok((port, stop, thread, reports, nested))
}
