//! The hooks' logic without I/O: srun's step layout and configuration in, the private
//! variables out ([`prelaunch_env`]); slurmstepd's record of the step and its environment in,
//! what this node must serve out ([`StepPlan::new`]). A rank's PMI variables are in the agent's
//! [`crate::agent::TaskTable`].
//!
//! Flow: srun's `client_prelaunch` puts the `GREEDY_MPI_*` variables into the launch env;
//! slurmd copies them into every stepd's job env; `prefork` checks them against slurmstepd's
//! own record (`StepRecord`: ids, counts, uid, this node), reads them with the variables the
//! daemons set (`SLURM_SRUN_COMM_HOST`, `SLURM_STEP_RESV_PORTS`; research/slurm-plugin-api.md
//! §2.2), then removes every `GREEDY_MPI_*` variable so no task inherits them (the secret
//! above all).

use crate::Error;
pub use crate::choice::{Protocol, RendezvousChoice, USER_PROTOCOL};
use crate::config::MpiConfig;
pub use greedy_sys::slurm::{HetClient, HetRecord, StepLayout, StepRecord};
use greedy_tree::LaunchModel;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

pub mod het;

/// `J.S`: the job and step ids; also the PMI kvsname.
pub const VAR_JOB: &str = "GREEDY_MPI_JOB";
/// The step's nodes, a hostlist expression in node-index order.
pub const VAR_HOSTS: &str = "GREEDY_MPI_HOSTS";
/// Ranks per node: `;`-separated nodes, each `,`-separated ranks or ranges (`0-1;2-3`).
pub const VAR_RANKS: &str = "GREEDY_MPI_RANKS";
/// The per-step secret, lowercase hex.
pub const VAR_SECRET: &str = "GREEDY_MPI_SECRET";
/// The overlay tree model, [`LaunchModel`]'s text form: `seq,rem`.
pub const VAR_MODEL: &str = "GREEDY_MPI_MODEL";
/// The protocol family served, resolved by srun: `pmi`, `pmix` or `charm`.
pub const VAR_PROTOCOL: &str = "GREEDY_MPI_PROTOCOL";
/// `ports` (find the overlay parent at its reserved port) or `srun` (through srun's listener).
pub const VAR_RENDEZVOUS: &str = "GREEDY_MPI_RENDEZVOUS";
/// srun's listener port (rendezvous, and the report of how the job ended), on the address
/// slurmd saw srun on (`SLURM_SRUN_COMM_HOST`).
pub const VAR_SRUN: &str = "GREEDY_MPI_SRUN";
/// `join,fence,shutdown` timeouts in seconds.
pub const VAR_TIMEOUTS: &str = "GREEDY_MPI_TIMEOUTS";
/// A step that another step's rank spawned ([`crate::nested`]): where it came from
/// ([`greedy_pmix::child::SpawnOrigin`], postcard, hex). Set in the nested srun's own
/// environment, which srun copies into the launch env.
pub const VAR_ORIGIN: &str = "GREEDY_MPI_ORIGIN";
/// A step whose tasks are ranks of a PMIx job spawned by another step of the job
/// (`<parent step id> <child namespace>`, [`crate::attach`]): its stepds serve nothing, and
/// hand each task to the parent step's stepd on the node, which serves the child namespace.
pub const VAR_ATTACH: &str = "GREEDY_MPI_ATTACH";
/// A nested srun's proof for its spawner (`port seq ticket`, [`crate::nested::tell_spawner`]).
pub const VAR_TICKET: &str = "GREEDY_MPI_TICKET";
/// The job's CPUs, as srun's environment gives them (`SLURM_JOB_CPUS_PER_NODE`): what
/// `MPI_UNIVERSE_SIZE` tells the ranks, the processes the job and those it spawns may have.
pub const VAR_UNIVERSE: &str = "GREEDY_MPI_UNIVERSE";
/// Every private variable, removed from the job env in `prefork`.
pub const PRIVATE_VARS: [&str; 13] = [
    VAR_JOB,
    VAR_HOSTS,
    VAR_RANKS,
    VAR_SECRET,
    VAR_MODEL,
    VAR_PROTOCOL,
    VAR_RENDEZVOUS,
    VAR_SRUN,
    VAR_TIMEOUTS,
    VAR_ORIGIN,
    VAR_TICKET,
    VAR_UNIVERSE,
    VAR_ATTACH,
];

/// The CPUs of a job from Slurm's `SLURM_JOB_CPUS_PER_NODE` (`4(x5),2`: 22); `None` if the
/// text is not that.
pub fn job_cpus(text: &str) -> Option<u32> {
    text.split(',').try_fold(0u32, |sum, part| {
        let (cpus, times) = match part.split_once("(x") {
            Some((cpus, rest)) => (cpus, rest.strip_suffix(')')?.parse::<u32>().ok()?),
            None => (part, 1),
        };
        sum.checked_add(cpus.parse::<u32>().ok()?.checked_mul(times)?)
    })
}

/// [`VAR_ORIGIN`]'s value for `origin`.
pub fn encode_origin(origin: &greedy_pmix::child::SpawnOrigin) -> String {
    // Plain owned strings and numbers: postcard cannot fail on them.
    greedy_pmix::auth::to_hex(&postcard::to_stdvec(origin).unwrap_or_default())
}

/// [`VAR_ORIGIN`]'s value read back; `None` if it is not one.
pub fn decode_origin(hex: &str) -> Option<greedy_pmix::child::SpawnOrigin> {
    let bytes = greedy_pmix::auth::from_hex(hex)?;
    postcard::from_bytes(&bytes).ok()
}
/// Checks srun's command line (`argv` without srun) of a Charm++ step for charmrun's process
/// options. charmrun strips `+pN`/`++n N` before its clients see them, but srun passes every
/// word on, and a non-SMP netlrts client given `+p2` exits before it connects, with its output
/// already on /dev/null (research/charm-protocol.md §1.1): refuse the step instead, saying what
/// to do. `+ppn` and other program options stay allowed.
pub fn check_charm_args(argv: &[String], n_ranks: u32) -> Result<(), String> {
    let kept = greedy_pmix::charm::launcher_args(argv, n_ranks)
        .map_err(|e| format!("{e}; with srun, drop it and give the process count with -n"))?;
    match argv.iter().find(|a| !kept.contains(a)) {
        Some(a) => Err(format!(
            "{a}: srun passes it to every process, and a non-SMP Charm++ process given a \
             charmrun option exits at once; drop it (srun -n {n_ranks} already starts \
             {n_ranks} processes)"
        )),
        None => Ok(()),
    }
}

/// Variables for the launch env, in order.
pub type LaunchEnv = Vec<(&'static str, String)>;

/// srun's `client_prelaunch` output: the private variables every node gets.
///
/// `srun_port` is srun's listener; `through_srun` says whether nodes find their overlay parents
/// through it ([`rendezvous_through_srun`]) or at reserved ports.
pub fn prelaunch_env(
    layout: &StepLayout,
    secret: &greedy_pmix::JobSecret,
    cfg: &MpiConfig,
    protocol: Protocol,
    srun_port: u16,
    through_srun: bool,
) -> LaunchEnv {
    let StepLayout {
        node_list, ranks, ..
    } = layout;
    let rendezvous = if through_srun { "srun" } else { "ports" };
    vec![
        (VAR_JOB, client_step_name(layout)),
        (VAR_HOSTS, node_list.clone()),
        (VAR_RANKS, encode_ranks(ranks)),
        (VAR_SECRET, secret.to_hex()),
        (VAR_MODEL, cfg.model.to_string()),
        (VAR_PROTOCOL, protocol.to_string()),
        (VAR_RENDEZVOUS, rendezvous.to_string()),
        (VAR_SRUN, srun_port.to_string()),
        (
            VAR_TIMEOUTS,
            format!(
                "{},{},{}",
                cfg.join_timeout.as_secs_f64(),
                cfg.fence_timeout.as_secs_f64(),
                cfg.shutdown_timeout.as_secs_f64()
            ),
        ),
    ]
}

/// The step's name as srun sees it (`J.S`, with the het job id in a het step): the PMI
/// kvsname, the overlay's job id, what srun's listener signs for.
pub fn client_step_name(layout: &StepLayout) -> String {
    let job = layout.het.map_or(layout.job_id, |h| h.het_job_id);
    het::step_name(job, layout.step_id)
}

/// The step's name as slurmstepd's record gives it ([`client_step_name`]'s twin).
pub fn record_step_name(stepd: &StepRecord) -> String {
    let job = stepd.het.as_ref().map_or(stepd.job_id, |h| h.het_job_id);
    het::step_name(job, stepd.step_id)
}

/// Whether nodes find their overlay parents through srun: always unless the configuration says
/// ports only, or reserved ports are visible to srun already (every stepd will see them).
pub fn rendezvous_through_srun(cfg: &MpiConfig, resv_ports_in_srun_env: bool) -> bool {
    match cfg.rendezvous {
        RendezvousChoice::Ports => false,
        RendezvousChoice::Srun => true,
        RendezvousChoice::Auto => !resv_ports_in_srun_env,
    }
}

/// Ranks per node in the compact text form of [`VAR_RANKS`]: consecutive ranks become ranges,
/// so block placement costs a few bytes per node whatever the rank count.
pub fn encode_ranks(ranks: &[Vec<u32>]) -> String {
    let mut out = String::new();
    for (i, node) in ranks.iter().enumerate() {
        if i > 0 {
            out.push(';');
        }
        let mut j = 0;
        let mut first = true;
        while j < node.len() {
            let start = node[j];
            let mut end = start;
            // checked_add: a rank u32::MAX ends every range (no overflow).
            while j + 1 < node.len() && Some(node[j + 1]) == end.checked_add(1) {
                j += 1;
                end += 1;
            }
            if !first {
                out.push(',');
            }
            first = false;
            if start == end {
                out.push_str(&start.to_string());
            } else {
                out.push_str(&format!("{start}-{end}"));
            }
            j += 1;
        }
    }
    out
}

/// The lowest reserved port a stepd listens on: below it only root may bind.
pub const MIN_PORT: u16 = 1024;

/// Parses [`encode_ranks`]'s form, expanding at most `max` ranks over all nodes (a stepd
/// passes the step's task count: a few bytes of ranges such as `0-4294967295` must not make
/// it allocate gigabytes).
pub fn decode_ranks(text: &str, max: usize) -> Result<Vec<Vec<u32>>, String> {
    let mut total = 0usize;
    text.split(';')
        .map(|node| {
            let mut ranks = Vec::new();
            for part in node.split(',').filter(|p| !p.is_empty()) {
                let (a, b) = part.split_once('-').unwrap_or((part, part));
                let (a, b): (u32, u32) = (
                    a.parse().map_err(|_| format!("bad rank {a:?}"))?,
                    b.parse().map_err(|_| format!("bad rank {b:?}"))?,
                );
                if b < a {
                    return Err(format!("bad range {part:?}"));
                }
                total += (b - a) as usize + 1;
                if total > max {
                    return Err(format!("more than {max} ranks"));
                }
                ranks.extend(a..=b);
            }
            Ok(ranks)
        })
        .collect()
}

/// The port a node's overlay listens on when the step has reserved ports: the last one of
/// `SLURM_STEP_RESV_PORTS` (`20001-20003` or `20001,20005`). Slurm gives the step (max tasks
/// per node) + 1 ports, the same on every node; MPI libraries that read the list take the
/// first ones, so the last is the one nobody else uses (research/slurm-plugin-api.md §4).
pub fn reserved_port(list: &str) -> Option<u16> {
    let last = list.trim().rsplit(',').next()?;
    let last = last.rsplit('-').next()?;
    last.trim().parse().ok().filter(|p| *p != 0)
}

/// How this node reaches its overlay parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendezvous {
    /// Every node listens on `NodeAddr:port`; no exchange.
    Ports {
        /// The reserved port.
        port: u16,
    },
    /// Nodes publish and look up through srun's listener.
    Srun {
        /// srun's address as slurmd saw it.
        addr: SocketAddr,
    },
}

/// What this node's `prefork` must set up, from its job env.
#[derive(Debug, Clone)]
pub struct StepPlan {
    /// Job id (in a het job, this component's): the one a root stepd kills, from slurmstepd's
    /// record and checked against the job credential by slurmd. Never the het job id, which
    /// only the launch request (the user's srun) gives.
    pub job_id: u32,
    /// In a het step, which component each rank (and this node) belongs to.
    pub het: Option<het::Components>,
    /// Step id.
    pub step_id: u32,
    /// `job.step`: PMI kvsname and the overlay's job id.
    pub kvsname: String,
    /// The step's hosts, node-index order.
    pub hosts: Vec<String>,
    /// This node's index.
    pub node_idx: usize,
    /// Ranks per node.
    pub ranks: Vec<Vec<u32>>,
    /// The step secret (its `Debug` redacts it).
    pub secret: greedy_pmix::JobSecret,
    /// The overlay tree model.
    pub model: LaunchModel,
    /// Protocol family.
    pub protocol: Protocol,
    /// Rendezvous.
    pub rendezvous: Rendezvous,
    /// srun's listener: where the node an abort started on reports the job's exit code.
    pub srun: SocketAddr,
    /// The uid the tasks run as (slurmstepd's record): who may reach this step's PMIx and
    /// netlrts endpoints and owns its directory.
    pub job_uid: u32,
    /// Their primary gid (slurmstepd's record).
    pub job_gid: u32,
    /// `GreedyJoinTimeout`.
    pub join_timeout: Duration,
    /// `GreedyFenceTimeout`.
    pub fence_timeout: Duration,
    /// `GreedyShutdownTimeout`.
    pub shutdown_timeout: Duration,
    /// Where the step came from if another step's rank spawned it ([`VAR_ORIGIN`]).
    pub origin: Option<greedy_pmix::child::SpawnOrigin>,
    /// The job's CPUs ([`VAR_UNIVERSE`]), if srun said.
    pub universe: Option<u32>,
    /// The step's tasks are a PMIx child of another step ([`VAR_ATTACH`]).
    pub attach: Option<Attach>,
}

/// A step whose tasks another step serves ([`VAR_ATTACH`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attach {
    /// The parent step (of the same job: the job id is Slurm's record of this step).
    pub parent_step: u32,
    /// The child namespace the tasks are ranks of.
    pub nspace: String,
}

impl Attach {
    /// [`VAR_ATTACH`]'s value.
    pub fn encode(&self) -> String {
        format!("{} {}", self.parent_step, self.nspace)
    }

    /// [`VAR_ATTACH`]'s value read back.
    pub fn decode(text: &str) -> Option<Attach> {
        let (step, nspace) = text.split_once(' ')?;
        let ok = !nspace.is_empty() && !nspace.contains(char::is_whitespace);
        ok.then(|| {
            Some(Attach {
                parent_step: step.parse().ok()?,
                nspace: nspace.to_string(),
            })
        })?
    }
}

/// srun's listener, from the job env: `SLURM_SRUN_COMM_HOST` (slurmd's view of srun's
/// address) and the port srun put into [`VAR_SRUN`]. One rule for the plan and for the report
/// of a refused step (`agent::report_refusal`), which must find the same srun. `node` names
/// this node in errors.
pub fn srun_address(node: &str, get: impl Fn(&str) -> Option<String>) -> Result<SocketAddr, Error> {
    let env = StepEnv {
        node: node.to_string(),
        get,
    };
    env.srun()
}

/// A stepd's job env being read: every error names this node and the variable.
struct StepEnv<G> {
    node: String,
    get: G,
}

/// The parts of the plan checked against slurmstepd's record.
struct Layout {
    job_id: u32,
    het: Option<het::Components>,
    kvsname: String,
    hosts: Vec<String>,
    node_idx: usize,
    ranks: Vec<Vec<u32>>,
}

/// The parts of the plan only the env gives: nothing in Slurm's record to check them against.
struct OwnFields {
    secret: greedy_pmix::JobSecret,
    model: LaunchModel,
    protocol: Protocol,
    srun: SocketAddr,
    rendezvous: Rendezvous,
    /// Join, fence, shutdown.
    timeouts: [Duration; 3],
    origin: Option<greedy_pmix::child::SpawnOrigin>,
    universe: Option<u32>,
    attach: Option<Attach>,
}

impl<G: Fn(&str) -> Option<String>> StepEnv<G> {
    fn need(&self, var: &'static str) -> Result<String, Error> {
        (self.get)(var).ok_or_else(|| Error::Missing {
            node: self.node.clone(),
            var,
        })
    }

    fn bad(&self, var: &'static str, value: &str, reason: String) -> Error {
        Error::Malformed {
            node: self.node.clone(),
            var,
            value: value.to_string(),
            reason,
        }
    }

    fn contradicts(&self, var: &'static str, value: &str, slurm: String) -> Error {
        Error::Contradicts {
            node: self.node.clone(),
            var,
            value: value.to_string(),
            slurm,
        }
    }

    /// The ids, hosts and ranks, each checked against slurmstepd's record of the step.
    fn layout(&self, stepd: &StepRecord) -> Result<Layout, Error> {
        match &stepd.het {
            Some(h) => self.het_layout(stepd, h),
            None => self.step_layout(stepd),
        }
    }

    /// [`Self::layout`] of a step that is not a het step.
    fn step_layout(&self, stepd: &StepRecord) -> Result<Layout, Error> {
        let job = self.need(VAR_JOB)?;
        let kvsname = format!("{}.{}", stepd.job_id, stepd.step_id);
        if job != kvsname {
            return Err(self.contradicts(VAR_JOB, &job, format!("step {kvsname}")));
        }
        let hosts_expr = self.need(VAR_HOSTS)?;
        let hosts = greedy_tree::hostlist::expand_at_most(&hosts_expr, stepd.nnodes as usize)
            .map_err(|e| self.bad(VAR_HOSTS, &hosts_expr, e.to_string()))?;
        let node_idx = stepd.nodeid as usize;
        if hosts.len() != stepd.nnodes as usize
            || (!stepd.node_name.is_empty() && hosts.get(node_idx) != Some(&stepd.node_name))
        {
            return Err(self.contradicts(
                VAR_HOSTS,
                &hosts_expr,
                format!(
                    "{} nodes, this one {} at index {node_idx}",
                    stepd.nnodes, self.node
                ),
            ));
        }
        let ranks_text = self.need(VAR_RANKS)?;
        let ranks = decode_ranks(&ranks_text, stepd.ntasks as usize)
            .map_err(|r| self.bad(VAR_RANKS, &ranks_text, r))?;
        let n_ranks: usize = ranks.iter().map(Vec::len).sum();
        if ranks.len() != hosts.len()
            || n_ranks != stepd.ntasks as usize
            || ranks[node_idx].len() != stepd.node_tasks as usize
        {
            return Err(self.contradicts(
                VAR_RANKS,
                &ranks_text,
                format!(
                    "{} tasks on {} nodes, {} on this one",
                    stepd.ntasks, stepd.nnodes, stepd.node_tasks
                ),
            ));
        }
        Ok(Layout {
            job_id: stepd.job_id,
            het: None,
            kvsname,
            hosts,
            node_idx,
            ranks,
        })
    }

    /// [`Self::layout`] of a component of a het step: the hosts and ranks of every component
    /// (the record's `het_job_*`), this node found by name among them.
    fn het_layout(&self, stepd: &StepRecord, h: &HetRecord) -> Result<Layout, Error> {
        let kvsname = record_step_name(stepd);
        let job = self.need(VAR_JOB)?;
        if job != kvsname {
            return Err(self.contradicts(VAR_JOB, &job, format!("het step {kvsname}")));
        }
        let n_nodes = h.ranks.len();
        let n_ranks: usize = h.ranks.iter().map(Vec::len).sum();
        let hosts_expr = self.need(VAR_HOSTS)?;
        let hosts = greedy_tree::hostlist::expand_at_most(&hosts_expr, n_nodes)
            .map_err(|e| self.bad(VAR_HOSTS, &hosts_expr, e.to_string()))?;
        let record_hosts = greedy_tree::hostlist::expand_at_most(&h.node_list, n_nodes)
            .ok()
            .filter(|r| r.len() == n_nodes);
        if record_hosts.as_ref() != Some(&hosts) {
            return Err(self.contradicts(
                VAR_HOSTS,
                &hosts_expr,
                format!("het step nodes {} ({n_nodes})", h.node_list),
            ));
        }
        if let Some((host, components)) =
            het::shared_node(&hosts, &h.ranks, h.rank_components.as_deref())
        {
            return Err(Error::SharedNode {
                node: self.node.clone(),
                step: kvsname,
                host,
                components,
            });
        }
        let ranks_text = self.need(VAR_RANKS)?;
        let ranks =
            decode_ranks(&ranks_text, n_ranks).map_err(|r| self.bad(VAR_RANKS, &ranks_text, r))?;
        let node_idx = hosts.iter().position(|x| *x == stepd.node_name);
        let local = node_idx.and_then(|i| h.ranks.get(i)).map(Vec::len);
        if ranks != h.ranks || local != Some(stepd.node_tasks as usize) {
            return Err(self.contradicts(
                VAR_RANKS,
                &ranks_text,
                format!(
                    "het step ranks {}, {} on {} (component {})",
                    encode_ranks(&h.ranks),
                    stepd.node_tasks,
                    self.node,
                    h.component
                ),
            ));
        }
        Ok(Layout {
            job_id: stepd.job_id,
            het: Some(het::Components {
                own: h.component,
                of_rank: h.rank_components.clone().filter(|c| c.len() == n_ranks),
            }),
            kvsname,
            hosts,
            node_idx: node_idx.unwrap_or_default(),
            ranks,
        })
    }

    /// The secret, model, protocol, srun, rendezvous and timeouts, in that order.
    fn own_fields(&self) -> Result<OwnFields, Error> {
        let secret =
            greedy_pmix::JobSecret::from_hex(&self.need(VAR_SECRET)?).ok_or_else(|| {
                self.bad(
                    VAR_SECRET,
                    "<redacted>",
                    "not a hex secret of 16 bytes or more".into(),
                )
            })?;
        let model_text = self.need(VAR_MODEL)?;
        let model: LaunchModel = model_text
            .parse()
            .map_err(|e: greedy_tree::Error| self.bad(VAR_MODEL, &model_text, e.to_string()))?;
        let proto_text = self.need(VAR_PROTOCOL)?;
        let protocol = proto_text
            .parse()
            .map_err(|r: String| self.bad(VAR_PROTOCOL, &proto_text, r))?;
        let srun = self.srun()?;
        let rendezvous = self.rendezvous(srun)?;
        let timeouts = self.timeouts()?;
        let origin =
            match (self.get)(VAR_ORIGIN) {
                Some(hex) => Some(decode_origin(&hex).ok_or_else(|| {
                    self.bad(VAR_ORIGIN, &hex, "not a spawned step's origin".into())
                })?),
                None => None,
            };
        let universe = match (self.get)(VAR_UNIVERSE) {
            Some(n) => Some(
                n.parse()
                    .map_err(|_| self.bad(VAR_UNIVERSE, &n, "not a number of CPUs".into()))?,
            ),
            None => None,
        };
        let attach = match (self.get)(VAR_ATTACH) {
            Some(text) => Some(Attach::decode(&text).ok_or_else(|| {
                self.bad(VAR_ATTACH, &text, "not `<parent step> <namespace>`".into())
            })?),
            None => None,
        };
        Ok(OwnFields {
            secret,
            model,
            protocol,
            srun,
            rendezvous,
            timeouts,
            origin,
            universe,
            attach,
        })
    }

    /// srun's listener ([`srun_address`]).
    fn srun(&self) -> Result<SocketAddr, Error> {
        let srun_text = self.need(VAR_SRUN)?;
        let srun_port: u16 = srun_text
            .parse()
            .map_err(|_| self.bad(VAR_SRUN, &srun_text, "not a port".into()))?;
        let host = self.need("SLURM_SRUN_COMM_HOST")?;
        let srun_ip: IpAddr = host
            .parse()
            .map_err(|_| self.bad("SLURM_SRUN_COMM_HOST", &host, "not an IP address".into()))?;
        Ok(SocketAddr::new(srun_ip, srun_port))
    }

    /// The reserved port when the step has one, else srun's board if the env asks for it.
    fn rendezvous(&self, srun: SocketAddr) -> Result<Rendezvous, Error> {
        let rdv_text = self.need(VAR_RENDEZVOUS)?;
        let resv_text = (self.get)("SLURM_STEP_RESV_PORTS");
        let resv = resv_text.as_deref().and_then(reserved_port);
        // Root binds the overlay there: never on a port only root may bind.
        if let (Some(port), Some(text)) = (resv, &resv_text)
            && port < MIN_PORT
        {
            return Err(self.bad(
                "SLURM_STEP_RESV_PORTS",
                text,
                format!("port {port} is below {MIN_PORT}, reserved to root"),
            ));
        }
        match (resv, rdv_text.as_str()) {
            // Reserved ports win whenever the step has them: no exchange at all.
            (Some(port), "ports" | "srun") => Ok(Rendezvous::Ports { port }),
            (None, "srun") => Ok(Rendezvous::Srun { addr: srun }),
            (None, "ports") => Err(self.bad(
                VAR_RENDEZVOUS,
                &rdv_text,
                "GreedyRendezvous=ports but the step has no SLURM_STEP_RESV_PORTS \
                 (set MpiParams=ports=A-B in slurm.conf or use srun --resv-ports)"
                    .into(),
            )),
            _ => Err(self.bad(VAR_RENDEZVOUS, &rdv_text, "expected ports or srun".into())),
        }
    }

    /// `GreedyJoinTimeout`, `GreedyFenceTimeout`, `GreedyShutdownTimeout`, each positive.
    fn timeouts(&self) -> Result<[Duration; 3], Error> {
        let t_text = self.need(VAR_TIMEOUTS)?;
        let t: Vec<Duration> = t_text
            .split(',')
            .map(|s| {
                // try_: a huge number of seconds is refused, not a panic.
                s.parse::<f64>()
                    .ok()
                    .and_then(|v| Duration::try_from_secs_f64(v).ok())
                    .filter(|d| !d.is_zero())
            })
            .collect::<Option<_>>()
            .filter(|v: &Vec<Duration>| v.len() == 3)
            .ok_or_else(|| {
                self.bad(
                    VAR_TIMEOUTS,
                    &t_text,
                    "expected JOIN,FENCE,SHUTDOWN seconds".into(),
                )
            })?;
        Ok([t[0], t[1], t[2]])
    }
}

impl StepPlan {
    /// The plan of the step slurmstepd runs (`stepd`, Slurm's own record) from its job env
    /// (`get` looks a variable up). The env comes from the user's srun, so what a root stepd
    /// acts on (ids, uid, gid, this node, the counts) is Slurm's, and an env that says
    /// otherwise is refused rather than believed.
    pub fn new(
        stepd: &StepRecord,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<StepPlan, Error> {
        let node = if stepd.node_name.is_empty() {
            format!("node {}", stepd.nodeid)
        } else {
            stepd.node_name.clone()
        };
        let env = StepEnv { node, get };
        // First what Slurm's record can contradict, then what only the env says.
        let layout = env.layout(stepd)?;
        let own = env.own_fields()?;
        let [join_timeout, fence_timeout, shutdown_timeout] = own.timeouts;
        Ok(StepPlan {
            job_id: layout.job_id,
            het: layout.het,
            step_id: stepd.step_id,
            kvsname: layout.kvsname,
            hosts: layout.hosts,
            node_idx: layout.node_idx,
            ranks: layout.ranks,
            secret: own.secret,
            model: own.model,
            protocol: own.protocol,
            rendezvous: own.rendezvous,
            srun: own.srun,
            job_uid: stepd.uid,
            job_gid: stepd.gid,
            join_timeout,
            fence_timeout,
            shutdown_timeout,
            origin: own.origin,
            universe: own.universe,
            attach: own.attach,
        })
    }

    /// This node's NodeName.
    pub fn node(&self) -> &str {
        &self.hosts[self.node_idx]
    }

    /// The overlay parent's index (the same greedy tree greedy-pmix computes), if any.
    pub fn parent(&self) -> Option<usize> {
        greedy_pmix::overlay::tree(self.hosts.len(), &self.model).parent(self.node_idx)
    }

    /// The greedy-pmix job description.
    pub fn job_spec(&self) -> greedy_pmix::JobSpec {
        greedy_pmix::JobSpec {
            job_id: self.kvsname.clone(),
            hosts: self.hosts.clone(),
            node_idx: self.node_idx,
            model: self.model,
            ranks: self.ranks.clone(),
            secret: self.secret.clone(),
        }
    }

    /// One line for the log, without the secret.
    pub fn describe(&self) -> String {
        format!(
            "step {} node {} ({} of {} nodes, {} local ranks of {}), {}, rendezvous {}",
            self.kvsname,
            self.node(),
            self.node_idx,
            self.hosts.len(),
            self.ranks[self.node_idx].len(),
            self.ranks.iter().map(Vec::len).sum::<usize>(),
            self.protocol,
            match &self.rendezvous {
                Rendezvous::Ports { port } => format!("reserved port {port}"),
                Rendezvous::Srun { addr } => format!("srun {addr}"),
            }
        )
    }
}

#[cfg(test)]
mod tests;
