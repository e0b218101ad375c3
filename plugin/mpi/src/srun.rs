//! srun's side: the step's private variables, and the rendezvous listener for steps without
//! reserved ports (a thread running [`SrunBoard`] until `client_fini`).

use crate::Error;
use crate::config::MpiConfig;
use crate::plan::{self, Protocol};
use crate::rendezvous::SrunBoard;
use greedy_sys::slurm::StepLayout;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::oneshot;

/// What srun keeps between `client_prelaunch` and `client_fini`.
#[derive(Debug)]
pub struct Client {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Client {
    /// Plans the step: the variables to put into the launch env, and the listener if any.
    pub fn prelaunch(
        layout: &StepLayout,
        cfg: &MpiConfig,
        user_protocol: Option<&str>,
        detected: Option<Protocol>,
        resv_ports_in_env: bool,
        pmix_built: bool,
    ) -> Result<(Client, plan::LaunchEnv), Error> {
        let srun = || "srun".to_string();
        let protocol = Protocol::resolve(user_protocol, cfg.protocol, detected, pmix_built)
            .map_err(|reason| Error::Malformed {
                node: srun(),
                var: plan::USER_PROTOCOL,
                value: user_protocol.unwrap_or_default().to_string(),
                reason,
            })?;
        let secret = greedy_pmix::JobSecret::generate().to_hex();
        let job = format!("{}.{}", layout.job_id, layout.step_id);
        let mut client = Client {
            stop: None,
            thread: None,
        };
        let mut port = None;
        if plan::srun_needs_listener(cfg, resv_ports_in_env) {
            let (p, stop, thread) = listen(&job, &secret, layout.ranks.len(), cfg.join_timeout)?;
            port = Some(p);
            client.stop = Some(stop);
            client.thread = Some(thread);
        }
        let env = plan::prelaunch_env(layout, &secret, cfg, protocol, port);
        Ok((client, env))
    }

    /// Stops the listener (the step has ended).
    pub fn fini(mut self) {
        self.stop_listener();
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

/// Binds the listener on every IPv4 address (slurmd tells each stepd the address it saw srun
/// on, `SLURM_SRUN_COMM_HOST`) and serves it on its own thread with a one-thread runtime.
fn listen(
    job: &str,
    secret_hex: &str,
    n_nodes: usize,
    idle: Duration,
) -> Result<(u16, oneshot::Sender<()>, std::thread::JoinHandle<()>), Error> {
    let io = |what, source| Error::Io {
        node: "srun".into(),
        what,
        source,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| io("rendezvous runtime", e))?;
    let secret: Vec<u8> = (0..secret_hex.len())
        .step_by(2)
        .filter_map(|i| u8::from_str_radix(&secret_hex[i..i + 2], 16).ok())
        .collect();
    let board = rt
        .block_on(SrunBoard::bind(
            SocketAddr::from(([0, 0, 0, 0], 0)),
            job,
            &secret,
            n_nodes,
            idle,
        ))
        .map_err(|e| io("rendezvous listener", e))?;
    let port = board
        .local_addr()
        .map_err(|e| io("rendezvous listener", e))?
        .port();
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
    Ok((port, stop, thread))
}

/// Up to [`plan::DETECT_READ_MAX`] bytes of the file an srun argument names: a path (with a
/// `/`), or a bare name found in `PATH`; `None` for anything else (options, missing files).
pub fn read_program(arg: &str) -> Option<Vec<u8>> {
    use std::io::Read;
    if arg.starts_with('-') || arg.contains('=') {
        return None;
    }
    let path = if arg.contains('/') {
        std::path::PathBuf::from(arg)
    } else {
        std::env::split_paths(&std::env::var_os("PATH")?)
            .map(|d| d.join(arg))
            .find(|p| p.is_file())?
    };
    if !path.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    std::fs::File::open(&path)
        .ok()?
        .take(plan::DETECT_READ_MAX as u64)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}
