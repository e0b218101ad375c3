//! The embedded wire-up (greedy-pmix): how an agent joins the overlay, and the rendezvous.
//!
//! The overlay tree is greedy-pmix's own (`greedy(n_hosts, model)` over the job's hosts); it
//! need not match the launch tree. The only thing an agent must learn is its overlay
//! parent's address, and the launcher's pipes supply it ([`PipeRendezvous`]): an agent
//! publishes its listener address up the tree as [`Up::Address`]; greedyrun routes it down as
//! [`Cmd::Address`](crate::proto::Cmd::Address) to exactly that node's overlay children, which
//! look it up on their local board. The rest of the address book travels over the overlay.

use std::{net::SocketAddr, time::Duration};

use greedy_pmix::{
    JobSpec,
    charm::server::{CharmConfig, CharmServer, OUTPUT_CAPACITY},
    overlay::{Overlay, OverlayConfig},
    peer::JobProcesses,
    pmix::{PmixConfig, PmixServer},
    rendezvous::{Memory, Rendezvous},
    server::{PmiConfig, PmiServer},
};
use tokio::sync::mpsc;

use crate::{
    Error,
    proto::{PmiMode, RankEnd, Start, Stream, Up},
};

/// The wire-up service of this host's ranks: one family per job, never both (MPICH ≥ 4.1
/// refuses a rank that has `PMI_*` and `PMIX_*` variables).
#[derive(Debug, Clone)]
pub enum Service {
    /// PMI-1/PMI-2 over a socketpair per rank (`PMI_FD`).
    Pmi(PmiServer),
    /// PMIx (Open MPI); the directory is this agent's PMIx scratch space, removed at shutdown.
    Pmix(PmixServer, std::path::PathBuf),
    /// Charm++ netlrts on loopback, admitting this agent's descendants only.
    Charm(CharmServer),
}

/// What a rank needs to reach its service: variables, and for PMI the rank's end of its
/// socketpair, to be inherited as fd [`PMI_FD`].
#[derive(Debug, Default)]
pub struct RankWireup {
    /// Variables for the rank's environment.
    pub env: Vec<(String, String)>,
    /// The descriptor the rank inherits as [`PMI_FD`].
    pub pmi_fd: Option<std::os::fd::OwnedFd>,
}

/// The descriptor number a PMI rank finds its socketpair at (the first after stdio).
pub const PMI_FD: i32 = 3;

impl Service {
    /// What a rank needs to reach the service (registers it with PMIx).
    pub async fn wireup_for(&self, rank: u32) -> Result<RankWireup, Error> {
        match self {
            Service::Pmi(pmi) => {
                let (theirs, env) = pmi.socketpair_for(rank, PMI_FD)?;
                Ok(RankWireup {
                    env,
                    pmi_fd: Some(theirs.into()),
                })
            }
            Service::Pmix(pmix, _) => Ok(RankWireup {
                env: pmix.env_for(rank).await?,
                pmi_fd: None,
            }),
            Service::Charm(charm) => Ok(RankWireup {
                env: charm.env_for(rank),
                pmi_fd: None,
            }),
        }
    }

    /// A local rank ended with `code`; an end before finalize aborts the job.
    pub async fn rank_exited(&self, rank: u32, code: i32) {
        match self {
            Service::Pmi(pmi) => pmi.rank_exited(rank, code).await,
            Service::Pmix(pmix, _) => pmix.rank_exited(rank, code).await,
            Service::Charm(charm) => charm.rank_exited(rank, code).await,
        }
    }

    /// How a rank's end is reported: a Charm++ client exits 1 when its socket is closed
    /// after `ending`, so its real code is the one it sent (research/charm-protocol.md §2).
    pub fn end_of(&self, rank: u32, end: RankEnd) -> RankEnd {
        match self {
            Service::Charm(charm) => charm.exit_code(rank).map_or(end, RankEnd::Exited),
            _ => end,
        }
    }

    /// Stops the service.
    pub async fn shutdown(&self) {
        match self {
            Service::Pmi(pmi) => pmi.shutdown().await,
            Service::Pmix(pmix, dir) => {
                pmix.shutdown().await;
                let _ = std::fs::remove_dir_all(dir);
            }
            Service::Charm(charm) => charm.shutdown().await,
        }
    }
}

/// Publishes up the launcher's pipes; looks up on the board that [`Cmd::Address`] fills.
///
/// [`Cmd::Address`]: crate::proto::Cmd::Address
#[derive(Debug, Clone)]
pub struct PipeRendezvous {
    /// Towards greedyrun.
    pub up: mpsc::Sender<Up>,
    /// Addresses routed down to this agent.
    pub board: Memory,
}

impl Rendezvous for PipeRendezvous {
    async fn publish(&self, node_idx: usize, addr: SocketAddr) -> Result<(), String> {
        self.up
            .send(Up::Address {
                node: node_idx as u32,
                addr: addr.to_string(),
            })
            .await
            .map_err(|_| "the parent pipe is closed".to_string())
    }

    async fn lookup(&self, node_idx: usize) -> Result<SocketAddr, String> {
        self.board.lookup(node_idx).await
    }
}

/// The greedy-pmix job description of this agent.
pub fn job_spec(start: &Start) -> Result<JobSpec, Error> {
    Ok(JobSpec {
        job_id: start.job_id.clone(),
        hosts: start.hosts.clone(),
        node_idx: start.node_idx as usize,
        model: start.model,
        ranks: start.ranks.clone(),
        secret: start.secret.clone(),
    })
}

/// Joins the overlay and starts the PMI (or, for [`PmiMode::Pmix`], PMIx) server for this
/// node's ranks.
///
/// The overlay listens on the address this host's name resolves to (it must be reachable by
/// the other hosts, so not loopback); every wait is bounded by `join_timeout` (`--timeout`).
pub async fn start(
    start: &Start,
    rendezvous: &PipeRendezvous,
    join_timeout: Duration,
) -> Result<(Overlay, Service), Error> {
    let spec = job_spec(start)?;
    let host = &start.hosts[start.node_idx as usize];
    let addrs: Vec<std::net::IpAddr> = tokio::net::lookup_host((host.as_str(), 0))
        .await
        .map_err(|source| Error::Io {
            what: format!("resolve {host} for the overlay listener"),
            source,
        })?
        .map(|a| a.ip())
        .collect();
    // Prefer an address other hosts can reach. Only-loopback is fine for a job whose hosts
    // are all this machine (tests); on a cluster it means the host maps its own name to
    // 127.0.1.1 (Debian's default), and the join timeout will name the nodes it cut off.
    let ip = addrs
        .iter()
        .find(|ip| !ip.is_loopback())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| Error::Plan(format!("{host} resolves to no address")))?;
    let config = OverlayConfig {
        bind: SocketAddr::new(ip, 0),
        join_timeout,
        ..OverlayConfig::default()
    };
    let overlay = Overlay::start(&spec, config, rendezvous).await?;
    let service = if start.pmi == PmiMode::Pmix {
        // PMIx's rendezvous files and the job's session directories, private to this agent
        // (several agents of one job may share a machine): a fresh 0700 directory with an
        // unguessable name, so its path reveals nothing (not even the namespace) and nobody
        // could plant anything there.
        let dir = greedy_pmix::pmix::private_dir(&std::env::temp_dir(), "greedy-pmix.").map_err(
            |source| Error::Io {
                what: "create the PMIx directory".into(),
                source,
            },
        )?;
        // Only this agent's descendants (its ranks) reach libpmix at all.
        let config = PmixConfig {
            admit: greedy_pmix::pmix::admit_job(admit_ranks()?),
            ..PmixConfig::new(dir.clone())
        };
        match PmixServer::start(&spec, overlay.clone(), config).await {
            Ok(pmix) => Service::Pmix(pmix, dir),
            Err(e) => {
                overlay.shutdown().await;
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e.into());
            }
        }
    } else if start.pmi == PmiMode::Charm {
        // Clients connect over loopback and only this agent's descendants are admitted; the
        // node table advertises the cluster address. Their prints take the ranks'
        // stdout/stderr path up the tree.
        let (out_tx, mut out_rx) =
            mpsc::channel::<greedy_pmix::charm::server::Output>(OUTPUT_CAPACITY);
        let up = rendezvous.up.clone();
        tokio::spawn(async move {
            while let Some(o) = out_rx.recv().await {
                // The rank's own stdio pipes carry its end of output already.
                if o.is_end() {
                    continue;
                }
                let stream = if o.stderr {
                    Stream::Stderr
                } else {
                    Stream::Stdout
                };
                let msg = Up::Output {
                    rank: o.rank,
                    stream,
                    data: o.data,
                };
                if up.send(msg).await.is_err() {
                    break;
                }
            }
        });
        let advertise = match ip {
            std::net::IpAddr::V4(v4) => v4,
            std::net::IpAddr::V6(_) => {
                return Err(Error::Plan(format!(
                    "{host}: Charm++ netlrts needs an IPv4 address, and {ip} is not"
                )));
            }
        };
        let config = CharmConfig::new(advertise, admit_ranks()?);
        match CharmServer::start(&spec, overlay.clone(), config, out_tx).await {
            Ok(charm) => Service::Charm(charm),
            Err(e) => {
                overlay.shutdown().await;
                return Err(e.into());
            }
        }
    } else {
        Service::Pmi(PmiServer::start(&spec, overlay.clone(), PmiConfig::default()).await?)
    };
    Ok((overlay, service))
}

/// Who may reach this agent's PMIx and netlrts endpoints: its descendants (the ranks it
/// forks), running as its own user.
fn admit_ranks() -> Result<JobProcesses, Error> {
    JobProcesses::of_this_process().map_err(|source| Error::Io {
        what: "read this agent's own uid".into(),
        source,
    })
}
