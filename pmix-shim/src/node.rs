//! The node service: one node's part of a job, serving every wire-up family at once.
//!
//! Both embedders (greedyd, and mpi_greedy.so inside slurmstepd) start one [`NodeService`]
//! per job and node. It listens on the overlay and joins it in the background, starts the PMI,
//! PMIx and Charm++ servers it is asked for (all of them unless the user chose one), owns the
//! PMIx scratch directory, and gives each rank the union of what the families need
//! ([`NodeService::env_for`]). A rank is served by whichever protocol it speaks; the node's
//! shared record ([`crate::departures`]) and the family tag on every fence ([`crate::family`])
//! end a job whose ranks speak two. How the job then ends from this node (report to the
//! launcher, kill the ranks) is the service's rule too ([`NodeService::watch_end`]), the
//! embedder supplying only what its launcher does ([`crate::node::job_end::JobEnd`]).
//!
//! The variables of the families do not disturb each other's clients, with one exception:
//! MPICH from 4.1 refuses to start when it sees both `PMI_*` and `PMIX_*` variables
//! (`check_MPIR_CVAR_PMI_VERSION` in pmodels/mpich `src/util/mpir_pmi.c`) unless
//! `MPIR_CVAR_PMI_VERSION` says which to use. The service offers `MPIR_CVAR_PMI_VERSION=1`
//! as a default ([`RankWireup::defaults`]): the embedder sets it only if the user has not.
//! PMI-1 over `PMI_FD` is what every MPICH since 1.x speaks, and an MPICH built without PMI-1
//! turns 1 into the family it has (the same file). Open MPI 4.1 and 5, MPICH 4.0 and 5 and
//! charm4py start with the whole union (`tests/slurm/mpi.sh`, `tests/launcher/e2e.sh`).

pub mod job_end;

use self::job_end::{EndPolicy, JobEnd};

use std::{
    net::{IpAddr, SocketAddr},
    os::fd::OwnedFd,
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug};

use crate::frame::Service;

use crate::{
    Error, JobSpec,
    charm::server::{CharmConfig, CharmServer, Output},
    child::{ChildJob, PendingSpawn, Spawns},
    departures::Departures,
    family::Family,
    names::SharedTable,
    overlay::{Overlay, OverlayConfig},
    peer::JobProcesses,
    pmix::{PmixConfig, PmixHost, PmixServer},
    rendezvous::Rendezvous,
    server::{PmiConfig, PmiServer},
};

/// The variable that tells MPICH which of the offered families to use, and the value offered.
pub const MPICH_PMI_VERSION: (&str, &str) = ("MPIR_CVAR_PMI_VERSION", "1");

/// Whether an inherited variable names another launcher's wire-up endpoint or a rank's place
/// in another job (an outer job's `PMI_FD`, `PMIX_SERVER_URI*`, `NETSTART`, …): a rank must
/// not see those beside its own job's. Tuning passes (`PMIX_MCA_*`, `PMI_DEBUG`).
pub fn is_launcher_variable(name: &str) -> bool {
    (name.starts_with("PMI_") && name != "PMI_DEBUG")
        || (name.starts_with("PMIX_") && !name.starts_with("PMIX_MCA_"))
        || matches!(
            name,
            "NETSTART" | "NETMAGIC" | "MPI_LOCALNRANKS" | "MPI_LOCALRANKID"
        )
}

/// How one node serves its ranks.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The overlay's address and limits.
    pub overlay: OverlayConfig,
    /// The families served; every one unless the user chose ([`Family::ALL`]).
    pub families: Vec<Family>,
    /// The PMI server's settings.
    pub pmi: PmiConfig,
    /// The PMIx server's settings. Its `tmpdir` is replaced by a fresh private directory
    /// under [`NodeConfig::scratch`], which the service owns and removes at shutdown.
    pub pmix: PmixConfig,
    /// Where the PMIx directory is made.
    pub scratch: PathBuf,
    /// The netlrts server's settings.
    pub charm: CharmConfig,
    /// A PMIx server this process already runs for other jobs (a session's agent: one per
    /// host for every job); `None`: the job's own, started with it and finalized with it.
    pub pmix_host: Option<PmixHost>,
    /// A name table shared with other jobs (a session's); `None`: node 0 keeps the job's own.
    pub names: Option<Arc<dyn SharedTable>>,
    /// PMIx ranks' logged messages for their standard error go out with the netlrts prints
    /// as the rank's own output (an embedder that relays that output, greedyd); `false`:
    /// declined, and the rank prints them itself ([`crate::pmix::NamespaceConfig::log_output`]).
    pub pmix_log_to_output: bool,
}

/// The families asked for cannot be served on the node's address.
#[derive(Debug, thiserror::Error)]
#[error("Charm++ netlrts needs an IPv4 address to advertise, and {0} is not one")]
pub struct CharmNeedsIpv4(pub IpAddr);

impl NodeConfig {
    /// Serves the `wanted` families (usually [`Family::ALL`]), with the overlay listening on
    /// `ip` and the PMIx and netlrts endpoints admitting `admit` only. Charm++ needs an IPv4
    /// address to advertise: on an IPv6 `ip` it is left out, and asking for it alone fails.
    pub fn new(
        ip: IpAddr,
        admit: JobProcesses,
        wanted: &[Family],
    ) -> Result<NodeConfig, CharmNeedsIpv4> {
        let mut families = wanted.to_vec();
        let advertise = match ip {
            IpAddr::V4(v4) => v4,
            IpAddr::V6(_) => {
                families.retain(|f| *f != Family::Charm);
                if families.is_empty() && !wanted.is_empty() {
                    return Err(CharmNeedsIpv4(ip));
                }
                std::net::Ipv4Addr::LOCALHOST
            }
        };
        Ok(NodeConfig {
            overlay: OverlayConfig {
                bind: SocketAddr::new(ip, 0),
                ..OverlayConfig::default()
            },
            families,
            pmi: PmiConfig::default(),
            pmix: PmixConfig {
                admit: crate::pmix::admit_job(admit),
                ..PmixConfig::new(PathBuf::new())
            },
            scratch: std::env::temp_dir(),
            charm: CharmConfig::new(advertise, admit),
            pmix_host: None,
            names: None,
            pmix_log_to_output: false,
        })
    }
}

impl NodeConfig {
    /// Says how many processes the job and those it spawns may have in all (the launcher's
    /// slots), to every family: what `MPI_UNIVERSE_SIZE` tells the ranks.
    pub fn set_universe(&mut self, slots: u32) {
        self.pmi.universe = Some(slots);
        self.pmix.universe = Some(slots);
    }
}

/// What a rank needs to reach the service.
#[derive(Debug, Default)]
pub struct RankWireup {
    /// Variables for the rank's environment.
    pub env: Vec<(String, String)>,
    /// Variables to set only where the rank's environment has none of that name.
    pub defaults: Vec<(String, String)>,
    /// The rank's end of its PMI socketpair, which it must inherit (under the number its
    /// `PMI_FD` names).
    pub pmi_fd: Option<OwnedFd>,
}

/// One node's wire-up service for one job; cheap to clone.
#[derive(Debug, Clone)]
pub struct NodeService {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    overlay: Overlay,
    departures: Departures,
    servers: Servers,
    /// Local ranks' spawn requests, on their way to the embedder.
    spawns: Spawns,
}

/// The servers of the families served (while starting: those started so far, stopped again
/// if a later one fails).
#[derive(Debug, Default)]
struct Servers {
    pmi: Option<PmiServer>,
    /// The job's namespace, and the directory to remove with it when the server is its own.
    pmix: Option<(PmixServer, Option<PathBuf>)>,
    charm: Option<CharmServer>,
}

impl Servers {
    /// The families served, in [`Family::ALL`] order.
    fn served(&self) -> impl Iterator<Item = Family> {
        [
            self.pmi.as_ref().map(|_| Family::Pmi),
            self.pmix.as_ref().map(|_| Family::Pmix),
            self.charm.as_ref().map(|_| Family::Charm),
        ]
        .into_iter()
        .flatten()
    }

    async fn shutdown(&self) {
        if let Some(pmi) = &self.pmi {
            pmi.shutdown().await;
        }
        if let Some((pmix, dir)) = &self.pmix {
            pmix.shutdown().await;
            if let Some(dir) = dir {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        if let Some(charm) = &self.charm {
            charm.shutdown().await;
        }
    }
}

impl NodeService {
    /// Listens on the overlay, starts the servers of `config.families` and returns while the
    /// node joins in the background: ranks can be started at once, and their first fence
    /// waits for the join. A join that fails aborts the job ([`Overlay::aborted`] says why).
    /// Cancelling `leave` leaves the overlay, mid-join too, saying `Bye`. Netlrts clients'
    /// prints go to `charm_output`.
    pub async fn start<R: Rendezvous + 'static>(
        job: &JobSpec,
        config: NodeConfig,
        rendezvous: R,
        leave: &CancellationToken,
        charm_output: mpsc::Sender<Output>,
    ) -> Result<NodeService, Error> {
        if config.families.is_empty() {
            return Err(Error::InvalidJob {
                job: job.job_id.clone(),
                reason: "no wire-up family to serve".into(),
            });
        }
        let overlay = Overlay::begin(job, config.overlay.clone(), rendezvous, leave).await?;
        if let Some(table) = &config.names {
            crate::node0::forward_names(job, &overlay, table.clone());
        }
        let departures = Departures::default();
        let spawns = Spawns::default();
        let mut servers = Servers::default();
        let shared = (&departures, &spawns);
        let started =
            Self::start_servers(job, &config, &overlay, shared, charm_output, &mut servers).await;
        if let Err(e) = started {
            servers.shutdown().await;
            overlay.shutdown().await;
            return Err(e);
        }
        let service = NodeService {
            inner: Arc::new(Inner {
                overlay,
                departures,
                servers,
                spawns,
            }),
        };
        service.serve_children();
        Ok(service)
    }

    /// Serves the children another node of the family asks this one to add
    /// ([`NodeService::add_child_everywhere`]) until the overlay ends. Holds the service
    /// weakly: the task never keeps it alive.
    fn serve_children(&self) {
        let Some(mut incoming) = self.inner.overlay.incoming(Service::Children) else {
            return;
        };
        let service = Arc::downgrade(&self.inner);
        tokio::spawn(
            async move {
                while let Some(req) = incoming.recv().await {
                    let Some(inner) = service.upgrade() else {
                        req.respond(Err("the node is shutting down".into())).await;
                        continue;
                    };
                    let service = NodeService { inner };
                    let added = match postcard::from_bytes::<ChildJob>(&req.body) {
                        Ok(child) => service.add_child(&child).await.map_err(|e| e.to_string()),
                        Err(e) => Err(format!("undecodable child job: {e}")),
                    };
                    req.respond(added.map(|()| bytes::Bytes::new())).await;
                }
            }
            .in_current_span(),
        );
    }

    async fn start_servers(
        job: &JobSpec,
        config: &NodeConfig,
        overlay: &Overlay,
        (departures, spawns): (&Departures, &Spawns),
        charm_output: mpsc::Sender<Output>,
        servers: &mut Servers,
    ) -> Result<(), Error> {
        for family in &config.families {
            match family {
                Family::Pmi if servers.pmi.is_none() => {
                    let pmi = PmiServer::start_on(
                        job,
                        overlay.clone(),
                        config.pmi.clone(),
                        departures.clone(),
                        spawns.clone(),
                    );
                    servers.pmi = Some(pmi.await?);
                }
                Family::Pmix if servers.pmix.is_none() => {
                    let ties = (departures.clone(), spawns.clone());
                    let log = (config.pmix_log_to_output).then(|| charm_output.clone());
                    servers.pmix = Some(Self::start_pmix(job, config, overlay, ties, log).await?);
                }
                Family::Charm if servers.charm.is_none() => {
                    let charm = CharmServer::start_on(
                        job,
                        overlay.clone(),
                        config.charm.clone(),
                        charm_output.clone(),
                        departures.clone(),
                    );
                    servers.charm = Some(charm.await?);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The job's PMIx namespace: on the process's server when the embedder runs one for
    /// several jobs, else on a server of its own in a fresh private directory (removed with it).
    async fn start_pmix(
        job: &JobSpec,
        config: &NodeConfig,
        overlay: &Overlay,
        (departures, spawns): (Departures, Spawns),
        log_output: Option<mpsc::Sender<Output>>,
    ) -> Result<(PmixServer, Option<PathBuf>), Error> {
        if let Some(host) = &config.pmix_host {
            let ns = crate::pmix::NamespaceConfig {
                log_output,
                ..config.pmix.namespace_config()
            };
            let served =
                PmixServer::serve_on(host.clone(), job, overlay.clone(), ns, departures, spawns);
            return Ok((served.await?, None));
        }
        // PMIx's rendezvous files and the job's session directories, private to this node's
        // service (several nodes of a job may share a machine): fresh, 0700, with an
        // unguessable name, so nothing can have been planted there.
        let dir = crate::pmix::private_dir(&config.scratch, "greedy-pmix.").map_err(|source| {
            Error::Io {
                node: job.node_idx,
                what: "creating the PMIx directory",
                source,
            }
        })?;
        let pmix_config = PmixConfig {
            tmpdir: dir.clone(),
            ..config.pmix.clone()
        };
        let ties = (departures, spawns);
        let started =
            PmixServer::start_on(job, overlay.clone(), pmix_config, ties, log_output).await;
        if started.is_err() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Ok((started?, Some(dir)))
    }

    /// The overlay this node belongs to (its abort watch, its join).
    pub fn overlay(&self) -> &Overlay {
        &self.inner.overlay
    }

    /// Ends the job from this node when it aborts, with `end` doing what only the embedder
    /// can ([`crate::node::job_end`]); `running` counts the local ranks not ended yet. Spawns the
    /// abort watch in the current span and returns it: on the node the abort started on, the
    /// embedder's shutdown lets it finish (the other nodes' ranks may run on otherwise).
    /// Also spawns, outside any span, the wait for the launcher's word on the job's end
    /// ([`EndPolicy::hear_end_after`]).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn watch_end<E: JobEnd>(
        &self,
        end: Arc<E>,
        policy: EndPolicy,
        running: watch::Receiver<usize>,
    ) -> JoinHandle<()> {
        if let Some(after) = policy.hear_end_after {
            tokio::spawn(job_end::hear_end(
                self.overlay().clone(),
                end.clone(),
                after,
            ));
        }
        tokio::spawn(job_end::watch_abort(self.clone(), end, policy, running).in_current_span())
    }

    /// What local `rank` needs: every served family's variables (PMIx registers the rank),
    /// and for PMI the rank's end of its socketpair, which it sees as `pmi_fd` (`None`: under
    /// its own number, inherited as it is).
    pub async fn env_for(&self, rank: u32, pmi_fd: Option<i32>) -> Result<RankWireup, Error> {
        let mut wireup = RankWireup::default();
        if let Some(pmi) = &self.inner.servers.pmi {
            let (theirs, env) = pmi.socketpair_for(rank, pmi_fd)?;
            wireup.env.extend(env);
            wireup.pmi_fd = Some(theirs.into());
        }
        if let Some((pmix, _)) = &self.inner.servers.pmix {
            wireup.env.extend(pmix.env_for(rank).await?);
            if self.inner.servers.pmi.is_some() {
                let (name, value) = MPICH_PMI_VERSION;
                wireup.defaults.push((name.into(), value.into()));
            }
        }
        if let Some(charm) = &self.inner.servers.charm {
            wireup.env.extend(charm.env_for(rank));
        }
        Ok(wireup)
    }

    /// The family `rank` is served by: the one it spoke, else its node's (its silence then
    /// fails the job, since its neighbours' fences wait for it), else the first served.
    fn family_for(&self, rank: u32) -> Family {
        let d = &self.inner.departures;
        d.family_of(rank)
            .or_else(|| d.node_family())
            .or_else(|| self.inner.servers.served().next())
            .unwrap_or(Family::Pmi)
    }

    /// The launcher reports that local `rank` has started, bound to the `bound` CPUs or
    /// unbound: under [`crate::pmix::Binding::Reported`] PMIx registers the job, telling the
    /// ranks where they run, once every local rank has started.
    pub fn rank_started(&self, rank: u32, bound: Option<Vec<u32>>) {
        if let Some((pmix, _)) = &self.inner.servers.pmix {
            pmix.rank_started(rank, bound);
        }
    }

    /// Whether PMIx has registered the job (waits for it under
    /// [`crate::pmix::Binding::Reported`]); true when PMIx is not served. A PMIx client must
    /// not connect before.
    pub async fn pmix_registered(&self) -> bool {
        match &self.inner.servers.pmix {
            Some((pmix, _)) => pmix.registered().await,
            None => true,
        }
    }

    /// The launcher reports that local `rank` exited with `code` (128+signal for a signal);
    /// the server of its family decides whether that ends the job.
    pub async fn rank_exited(&self, rank: u32, code: i32) {
        let family = self.family_for(rank);
        debug!(rank, code, %family, "rank exited");
        // A rank that never said it started will not now.
        self.rank_started(rank, None);
        match family {
            Family::Pmi => {
                if let Some(pmi) = &self.inner.servers.pmi {
                    pmi.rank_exited(rank, code).await;
                }
            }
            Family::Pmix => {
                if let Some((pmix, _)) = &self.inner.servers.pmix {
                    pmix.rank_exited(rank, code).await;
                }
            }
            Family::Charm => {
                if let Some(charm) = &self.inner.servers.charm {
                    charm.rank_exited(rank, code).await;
                }
            }
        }
    }

    /// The local ranks' spawn requests (`MPI_Comm_spawn`), for the embedder to place, start
    /// and answer ([`crate::child`]); `Some` once. Until it is taken every request is refused
    /// at once ([`crate::child::NOT_SERVED`]).
    pub fn take_spawns(&self) -> Option<mpsc::Receiver<PendingSpawn>> {
        self.inner.spawns.take()
    }

    /// Serves spawned job `child` on this node beside the job (every family, on every node of
    /// the overlay, also those with none of its ranks). Call it on every node, and start no
    /// rank of the child before every node has returned ([`crate::child`]).
    pub async fn add_child(&self, child: &ChildJob) -> Result<(), Error> {
        if let Some(pmi) = &self.inner.servers.pmi {
            pmi.add_child(child)?;
        }
        if let Some((pmix, _)) = &self.inner.servers.pmix {
            pmix.add_child(child).await?;
        }
        Ok(())
    }

    /// Serves spawned job `child` on every node of the overlay: here, and through each other
    /// node's service ([`crate::frame::Service::Children`]); returns once every node has, or
    /// with the first failure (naming its node). For embedders without a launcher above the
    /// nodes (a Slurm step): start no rank of the child before it returns.
    pub async fn add_child_everywhere(
        &self,
        child: &ChildJob,
        limit: Duration,
    ) -> Result<(), Error> {
        let overlay = &self.inner.overlay;
        let me = self.inner.overlay.node_idx();
        let body =
            bytes::Bytes::from(postcard::to_stdvec(child).map_err(|e| Error::InvalidJob {
                job: child.nspace.clone(),
                reason: format!("cannot encode the child job: {e}"),
            })?);
        let others = (0..child.ranks.len()).filter(|&n| n != me).map(|n| {
            let body = body.clone();
            async move {
                let answer = overlay
                    .request_within(n, Service::Children, body, limit)
                    .await;
                match answer {
                    Ok(_) => Ok(()),
                    Err(e) => Err(Error::InvalidJob {
                        job: child.nspace.clone(),
                        reason: format!("node {n} could not serve it: {e}"),
                    }),
                }
            }
        });
        let (here, there) = tokio::join!(
            self.add_child(child),
            futures_util::future::join_all(others)
        );
        here?;
        there.into_iter().collect()
    }

    /// What local `rank` of child namespace `nspace` needs: as [`NodeService::env_for`].
    pub async fn child_env(
        &self,
        nspace: &str,
        rank: u32,
        pmi_fd: Option<i32>,
    ) -> Result<RankWireup, Error> {
        let mut wireup = RankWireup::default();
        if let Some(pmi) = &self.inner.servers.pmi {
            let (theirs, env) = pmi.child_socketpair_for(nspace, rank, pmi_fd)?;
            wireup.env.extend(env);
            wireup.pmi_fd = Some(theirs.into());
        }
        if let Some((pmix, _)) = &self.inner.servers.pmix {
            wireup.env.extend(pmix.child_env(nspace, rank).await?);
            if self.inner.servers.pmi.is_some() {
                let (name, value) = MPICH_PMI_VERSION;
                wireup.defaults.push((name.into(), value.into()));
            }
        }
        Ok(wireup)
    }

    /// [`NodeService::child_env`] for a child served by PMIx alone, whose ranks another process
    /// forks (a step of their own under Slurm): they cannot inherit a PMI socket from here.
    pub async fn child_pmix_env(&self, nspace: &str, rank: u32) -> Result<RankWireup, Error> {
        let Some((pmix, _)) = &self.inner.servers.pmix else {
            return Err(Error::InvalidJob {
                job: nspace.to_string(),
                reason: "this node serves no PMIx".into(),
            });
        };
        Ok(RankWireup {
            env: pmix.child_env(nspace, rank).await?,
            ..RankWireup::default()
        })
    }

    /// The launcher reports that local `rank` of child namespace `nspace` exited with `code`:
    /// as [`NodeService::rank_exited`] (an exit before finalize aborts the family).
    pub async fn child_exited(&self, nspace: &str, rank: u32, code: i32) {
        debug!(nspace, rank, code, "child rank exited");
        if let Some(pmi) = &self.inner.servers.pmi {
            pmi.child_exited(nspace, rank, code).await;
        }
        if let Some((pmix, _)) = &self.inner.servers.pmix {
            pmix.child_exited(nspace, rank, code).await;
        }
    }

    /// The family `rank` spoke, if it has spoken.
    pub fn family_of(&self, rank: u32) -> Option<Family> {
        self.inner.departures.family_of(rank)
    }

    /// Changes to `Some` when the first local rank speaks a protocol (its family): a launcher
    /// that sees ranks end without a word elsewhere in the job can tell they were singletons.
    pub fn spoken(&self) -> tokio::sync::watch::Receiver<Option<Family>> {
        self.inner.departures.watch_node_family()
    }

    /// The family this node's ranks speak, once one has spoken; the only one served, if so.
    pub fn family(&self) -> Option<Family> {
        let mut served = self.inner.servers.served();
        match (served.next(), served.next()) {
            (Some(only), None) => Some(only),
            _ => self.inner.departures.node_family(),
        }
    }

    /// A netlrts rank's real exit code, the one it sent in `ending` (the client itself exits
    /// 1 when its socket closes: research/charm-protocol.md §2).
    pub fn charm_exit_code(&self, rank: u32) -> Option<i32> {
        self.inner.servers.charm.as_ref()?.exit_code(rank)
    }

    /// Fences completed on this node, every family.
    pub fn fences(&self) -> u64 {
        let pmi = self.inner.servers.pmi.as_ref().map_or(0, PmiServer::fences);
        let pmix = self
            .inner
            .servers
            .pmix
            .as_ref()
            .map_or(0, |(s, _)| s.fences());
        pmi + pmix
    }

    /// Leaves the overlay while it stops every server and removes the PMIx directory. The
    /// `Bye`s go out first: on a loaded node finalizing PMIx can outlast the embedder's
    /// shutdown timeout, and a link closed without `Bye` makes its peer abort a finished job
    /// (seen at 600 Slurm nodes on 2 cores).
    pub async fn shutdown(&self) {
        tokio::join!(self.inner.overlay.shutdown(), self.inner.servers.shutdown());
    }
}

#[cfg(test)]
mod tests {
    use super::{Family, NodeConfig, is_launcher_variable};
    use crate::peer::JobProcesses;

    #[test]
    fn charm_is_left_out_on_ipv6_and_alone_it_is_an_error() {
        let admit = || JobProcesses::of_this_process().unwrap();
        let v6 = "::1".parse().unwrap();
        let all = NodeConfig::new(v6, admit(), &Family::ALL).unwrap();
        assert_eq!(all.families, [Family::Pmi, Family::Pmix]);
        let err = NodeConfig::new(v6, admit(), &[Family::Charm]).unwrap_err();
        assert!(err.to_string().contains("::1"), "{err}");
        let v4 = NodeConfig::new("10.123.0.1".parse().unwrap(), admit(), &[Family::Charm]);
        assert_eq!(v4.unwrap().families, [Family::Charm]);
    }

    #[test]
    fn an_outer_jobs_endpoints_are_launcher_variables_and_tuning_is_not() {
        for outer in [
            "PMI_FD",
            "PMI_RANK",
            "PMI_PORT",
            "PMIX_SERVER_URI41",
            "PMIX_NAMESPACE",
            "NETSTART",
            "MPI_LOCALRANKID",
        ] {
            assert!(is_launcher_variable(outer), "{outer}");
        }
        for tuning in [
            "PMIX_MCA_ptl",
            "PMI_DEBUG",
            "MPIR_CVAR_PMI_VERSION",
            "PATH",
            "PMIXY",
        ] {
            assert!(!is_launcher_variable(tuning), "{tuning}");
        }
    }
}
