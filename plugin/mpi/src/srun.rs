//! srun's side: the step's private variables, and srun's listener (a thread running
//! [`SrunBoard`] until `client_fini`): the rendezvous for steps without reserved ports, and
//! where the node an abort started on reports the job's exit code.

use crate::Error;
use crate::config::MpiConfig;
use crate::plan::{self, Protocol};
use crate::rendezvous::{ExitReport, Reports, SrunBoard};
use greedy_sys::slurm::StepLayout;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::oneshot;

/// What srun keeps between `client_prelaunch` and `client_fini`.
#[derive(Debug)]
pub struct Client {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    reports: Reports,
}

impl Client {
    /// Plans the step: the variables to put into the launch env, and srun's listener (the
    /// rendezvous of steps without reserved ports, and where the job's exit code comes back).
    pub fn prelaunch(
        layout: &StepLayout,
        cfg: &MpiConfig,
        user_protocol: Option<&str>,
        resv_ports_in_env: bool,
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
        let job = format!("{}.{}", layout.job_id, layout.step_id);
        let (port, stop, thread, reports) =
            listen(&job, &secret, layout.ranks.len(), cfg.join_timeout)?;
        let client = Client {
            stop: Some(stop),
            thread: Some(thread),
            reports,
        };
        let through_srun = plan::rendezvous_through_srun(cfg, resv_ports_in_env);
        let env = plan::prelaunch_env(layout, &secret, cfg, protocol, port, through_srun);
        Ok((client, env))
    }

    /// Stops the listener (the step has ended) and returns how the job ended, if a node said.
    pub fn fini(mut self) -> Option<ExitReport> {
        self.stop_listener();
        self.reports.earliest()
    }

    fn stop_listener(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop_listener();
    }
}

/// srun's listener thread: its port, its stop switch, the thread, and its exit reports.
type Listener = (
    u16,
    oneshot::Sender<()>,
    std::thread::JoinHandle<()>,
    Reports,
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
) -> Result<Listener, Error> {
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
    let (stop, stopped) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("greedy-mpi-rdv".into())
        .spawn(move || {
            rt.block_on(async move {
                tokio::select! {
                    _ = board.serve() => {}
                    _ = stopped => {}
                }
            });
            rt.shutdown_timeout(Duration::from_millis(100));
        })
        .map_err(|e| io("rendezvous thread", e))?;
    Ok((port, stop, thread, reports))
}
