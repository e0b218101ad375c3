//! From parsed arguments to a validated [`Plan`]: hosts, rank placement, launch tree, timeouts.
//!
//! Nothing here touches the network or spawns a process: `greedyrun` builds the plan first and
//! refuses a bad command line before any remote shell starts (STYLE.md, CLI).
//!
//! Rank placement follows mpirun habits: ranks fill hosts in order (block placement), each host
//! taking its slots (`host slots=N`, `host:N`), or `--ppn K` per host when given, or 1 when
//! neither says. `-n` defaults to the total number of slots. Hosts left without ranks are
//! dropped from the job (an agent without ranks would never enter a PMI fence).

use std::time::Duration;

use greedy_tree::{LaunchModel, Topology, Tree, hostfile::HostSlots};

use crate::{
    Error,
    proto::{App, PmiMode},
};

/// Where the host list comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostSource {
    /// The text of a hostfile, and its path for messages.
    Hostfile {
        /// Path, for messages.
        path: String,
        /// Contents.
        text: String,
    },
    /// A comma-separated list of hosts or Slurm hostlist expressions, each optionally `:N`
    /// (`--hosts`, `-H`; the same syntax).
    List(String),
    /// The batch allocation greedyrun runs in ([`crate::allocation`]).
    Allocation(crate::allocation::Allocation),
}

/// Everything the command line says, before validation.
#[derive(Debug, Clone)]
pub struct Request {
    /// Total ranks (`-n`), or `None` for every slot.
    pub n_ranks: Option<u32>,
    /// Hosts.
    pub hosts: HostSource,
    /// Ranks per host, overriding slots.
    pub ppn: Option<u32>,
    /// How consecutive ranks are laid over the hosts.
    pub map_by: MapBy,
    /// The launch model (concurrency 1), as given (`--seq`, `--rem`).
    pub model: LaunchModel,
    /// Launch tree shape.
    pub topology: Topology,
    /// Remote shells in flight per parent.
    pub batch: u32,
    /// Launch timeout.
    pub timeout: Duration,
    /// SIGTERM → SIGKILL grace.
    pub grace: Duration,
    /// Wire-up mode.
    pub pmi: PmiMode,
    /// Program and arguments (of the first part of an MPMD command line).
    pub argv: Vec<String>,
    /// The further parts of an MPMD command line (`: -n K PROG ARGS…`); ranks are numbered
    /// across the parts, in order.
    pub more: Vec<Part>,
}

/// How consecutive ranks are laid over the hosts (`--map-by`, as Open MPI's mpirun).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MapBy {
    /// Fill each host's slots before the next host: ranks 0..k on the first host.
    #[default]
    Slot,
    /// One rank per host in turn, skipping full hosts: rank 0 on the first host, rank 1 on
    /// the second (Hydra's `-rr`, srun's `--distribution=cyclic`).
    Node,
}

/// A further part of an MPMD command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Its ranks (`-n K`).
    pub n_ranks: u32,
    /// Program and arguments.
    pub argv: Vec<String>,
}

/// A validated job plan.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Hosts that run ranks, in plan order.
    pub hosts: Vec<String>,
    /// `ranks[i]`: ranks on `hosts[i]`.
    pub ranks: Vec<Vec<u32>>,
    /// `slots[i]`: the slots of `hosts[i]` (`--ppn`, else its `slots=N`/`:N`, else 1), of
    /// which spawned children take those its ranks leave.
    pub slots: Vec<u32>,
    /// Total ranks.
    pub n_ranks: u32,
    /// The launch model (concurrency 1), as given; the wire-up overlay is built with it.
    pub model: LaunchModel,
    /// The model the launch tree is built with: `model` under the `batch` cap
    /// ([`LaunchModel::with_launch_cap`]).
    pub launch_model: LaunchModel,
    /// Shape of the launch tree.
    pub topology: Topology,
    /// The launch tree over `hosts.len() + 1` positions: position 0 is greedyrun, `p` is host
    /// `p - 1`.
    pub launch: Tree,
    /// Remote shells in flight per parent.
    pub batch: u32,
    /// Launch timeout (every agent's hello, and the wire-up join).
    pub timeout: Duration,
    /// SIGTERM → SIGKILL grace.
    pub grace: Duration,
    /// Wire-up mode.
    pub pmi: PmiMode,
    /// The programs, by first rank.
    pub apps: Vec<App>,
}

/// sshd's default `MaxStartups`: 10 unauthenticated connections to *one* sshd, past which it
/// drops new ones (research/baseline-launchers.md §4, anchors §3.12). A launch opens one
/// connection per host, so only a shared sshd (a bastion) sees several; refused shells are
/// retried (`--retries`).
pub const MAX_STARTUPS: u32 = 10;

impl Plan {
    /// Validates a request into a plan.
    pub fn new(req: Request) -> Result<Plan, Error> {
        let bad = |m: String| Err(Error::Plan(m));
        if req.argv.is_empty() {
            return bad("no program given (greedyrun [OPTIONS] -- PROG ARGS…)".into());
        }
        let (n_wanted, apps) = apps(&req)?;
        let hosts = parse_hosts(&req.hosts)?;
        if hosts.is_empty() {
            return bad("the host list is empty".into());
        }
        if req.ppn == Some(0) {
            return bad("--ppn must be at least 1".into());
        }
        if req.n_ranks == Some(0) {
            return bad("-n must be at least 1".into());
        }
        if req.batch == 0 {
            return bad("--batch must be at least 1".into());
        }
        if req.timeout.is_zero() {
            return bad("--timeout must be positive".into());
        }
        let (hosts, ranks, slots) = place_ranks(&hosts, n_wanted, req.ppn, req.map_by)?;
        let n_ranks = ranks.iter().map(|r| r.len() as u32).sum();
        let launch_model = req
            .model
            .with_launch_cap(req.batch)
            .map_err(|e| Error::Plan(format!("launch model: {e}")))?;
        let launch = req.topology.build(hosts.len() + 1, &launch_model);
        Ok(Plan {
            hosts,
            ranks,
            slots,
            n_ranks,
            model: req.model,
            launch_model,
            topology: req.topology,
            launch,
            batch: req.batch,
            timeout: req.timeout,
            grace: req.grace,
            pmi: req.pmi,
            apps,
        })
    }

    /// The host index that runs `rank`.
    pub fn node_of_rank(&self, rank: u32) -> Option<usize> {
        self.ranks.iter().position(|r| r.contains(&rank))
    }
}

/// Parses `--hostfile`, `--hosts` or `-H` into hosts with optional slots.
pub fn parse_hosts(source: &HostSource) -> Result<Vec<HostSlots>, Error> {
    match source {
        HostSource::Hostfile { path, text } => {
            greedy_tree::hostfile::parse(text).map_err(|error| Error::Hosts {
                what: format!("hostfile {path}"),
                error,
            })
        }
        HostSource::Allocation(a) => {
            greedy_tree::hostfile::parse(&a.hostfile).map_err(|error| Error::Hosts {
                what: a.what.clone(),
                error,
            })
        }
        HostSource::List(list) => {
            // One entry per line for the parser; its "line N" is our entry N.
            let lines = split_top_level(list).join("\n");
            greedy_tree::hostfile::parse(&lines).map_err(|error| match error {
                greedy_tree::Error::Hostfile {
                    line, text, reason, ..
                } => Error::Plan(format!(
                    "host list {list:?}: entry {line} {text:?}: {reason}"
                )),
                greedy_tree::Error::NoHosts { .. } => {
                    Error::Plan(format!("host list {list:?}: no hosts"))
                }
                error => Error::Hosts {
                    what: format!("host list {list:?}"),
                    error,
                },
            })
        }
    }
}

/// Splits at commas outside `[...]`, so `n[1-3,5]:2,m1` gives `n[1-3,5]:2` and `m1`.
fn split_top_level(list: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(list[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(list[start..].trim());
    out.retain(|s| !s.is_empty());
    out
}

/// The programs of a request by first rank, and how many ranks it asks for (`None`: every
/// slot, possible only without MPMD parts).
fn apps(req: &Request) -> Result<(Option<u32>, Vec<App>), Error> {
    let mut apps = vec![App {
        first_rank: 0,
        argv: req.argv.clone(),
    }];
    if req.more.is_empty() {
        return Ok((req.n_ranks, apps));
    }
    let mut next = req.n_ranks.ok_or_else(|| {
        Error::Plan("an MPMD command line needs -n for every part (-n 2 ./a : -n 6 ./b)".into())
    })?;
    for (i, part) in req.more.iter().enumerate() {
        if part.n_ranks == 0 || part.argv.is_empty() {
            return Err(Error::Plan(format!(
                "MPMD part {}: expected -n K PROG ARGS… with K ≥ 1",
                i + 2
            )));
        }
        apps.push(App {
            first_rank: next,
            argv: part.argv.clone(),
        });
        next = next
            .checked_add(part.n_ranks)
            .ok_or_else(|| Error::Plan("more than 2^32 ranks".into()))?;
    }
    Ok((Some(next), apps))
}

/// Hosts that run ranks, their ranks and their slots.
type Placement = (Vec<String>, Vec<Vec<u32>>, Vec<u32>);

/// Block placement: hosts in order, each taking its capacity, until `n_ranks` are placed.
fn place_ranks(
    hosts: &[HostSlots],
    n_ranks: Option<u32>,
    ppn: Option<u32>,
    map_by: MapBy,
) -> Result<Placement, Error> {
    let capacity = |h: &HostSlots| ppn.or(h.slots).unwrap_or(1);
    let total: u64 = hosts.iter().map(|h| u64::from(capacity(h))).sum();
    let n = match n_ranks {
        Some(n) => n,
        None => u32::try_from(total).map_err(|_| Error::Plan("too many slots".into()))?,
    };
    if u64::from(n) > total {
        let how = if ppn.is_some() {
            "--ppn"
        } else {
            "slots (1 for a host without slots=N or :N)"
        };
        return Err(Error::Plan(format!(
            "-n {n} needs {n} slots but {} hosts offer {total} by {how}; raise --ppn or add hosts",
            hosts.len()
        )));
    }
    let mut placed: Vec<Vec<u32>> = vec![Vec::new(); hosts.len()];
    match map_by {
        MapBy::Slot => {
            let mut next = 0u32;
            for (h, ranks) in hosts.iter().zip(&mut placed) {
                let take = capacity(h).min(n - next);
                ranks.extend(next..next + take);
                next += take;
            }
        }
        MapBy::Node => {
            // Rounds over the hosts with room left; n ≤ total, so every round places a rank.
            let mut next = 0u32;
            while next < n {
                for (h, ranks) in hosts.iter().zip(&mut placed) {
                    if next < n && (ranks.len() as u64) < u64::from(capacity(h)) {
                        ranks.push(next);
                        next += 1;
                    }
                }
            }
        }
    }
    // Hosts left without a rank do not take part.
    let (mut out_hosts, mut out_ranks, mut out_slots) = (Vec::new(), Vec::new(), Vec::new());
    for (h, r) in hosts.iter().zip(placed).filter(|(_, r)| !r.is_empty()) {
        out_hosts.push(h.host.clone());
        out_ranks.push(r);
        out_slots.push(capacity(h));
    }
    Ok((out_hosts, out_ranks, out_slots))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(hosts: HostSource, n: Option<u32>, ppn: Option<u32>) -> Request {
        Request {
            n_ranks: n,
            hosts,
            ppn,
            map_by: MapBy::Slot,
            model: LaunchModel::new(0.01, 0.1).unwrap(),
            topology: Topology::Greedy,
            batch: 8,
            timeout: Duration::from_secs(30),
            grace: Duration::from_secs(3),
            pmi: PmiMode::Auto,
            argv: vec!["hostname".into()],
            more: Vec::new(),
        }
    }

    #[test]
    fn the_launch_tree_follows_the_batch_cap() {
        // ssh over 20 ms on the emulated cluster: SEQ 6 ms, REM 388 ms. Uncapped, the greedy
        // tree is flat; with 8 shells in flight the root brings up 8 hosts per REM, and a
        // tree whose hosts launch their own beats flat by far.
        let hosts = HostSource::List(
            (0..64)
                .map(|i| format!("n{i}"))
                .collect::<Vec<_>>()
                .join(","),
        );
        let mut req = request(hosts, None, None);
        req.model = LaunchModel::new(0.006, 0.388).unwrap();
        let capped = Plan::new(req.clone()).unwrap();
        let uncapped = Plan::new(Request { batch: 64, ..req }).unwrap();
        assert_eq!(uncapped.launch.children(0).count(), 64);
        // Two waves from the root (they beat the children's first wave by a hair), then the
        // first wave's hosts launch the rest.
        assert_eq!(capped.launch.children(0).count(), 16);
        let t = |p: &Plan| p.launch.launch_time(&capped.launch_model);
        assert!(
            t(&capped) * 2.0 < t(&uncapped),
            "{} vs {}",
            t(&capped),
            t(&uncapped)
        );
        assert_eq!(
            capped.model.concurrency(),
            1,
            "the overlay's model is the one given"
        );
    }

    /// Renders the placement as `host:ranks` words, or the error.
    fn check(hosts: HostSource, n: Option<u32>, ppn: Option<u32>, expect: &str) {
        check_map(hosts, n, ppn, MapBy::Slot, expect);
    }

    fn check_map(hosts: HostSource, n: Option<u32>, ppn: Option<u32>, by: MapBy, expect: &str) {
        let req = Request {
            map_by: by,
            ..request(hosts, n, ppn)
        };
        let got = match Plan::new(req) {
            Ok(p) => p
                .hosts
                .iter()
                .zip(&p.ranks)
                .map(|(h, r)| {
                    format!(
                        "{h}:{}",
                        r.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
                    )
                })
                .collect::<Vec<_>>()
                .join(" "),
            Err(e) => format!("error: {e}"),
        };
        assert_eq!(got, expect);
    }

    fn list(s: &str) -> HostSource {
        HostSource::List(s.into())
    }

    fn file(s: &str) -> HostSource {
        HostSource::Hostfile {
            path: "hosts".into(),
            text: s.into(),
        }
    }

    #[test]
    fn placement() {
        check(list("n[1-3]"), None, None, "n1:0 n2:1 n3:2");
        check(list("n[1-3]"), Some(2), None, "n1:0 n2:1");
        check(list("n[1-2]"), Some(4), Some(2), "n1:0,1 n2:2,3");
        check(list("n[1-4]"), Some(3), Some(2), "n1:0,1 n2:2");
        check(list("n1:2,n2"), None, None, "n1:0,1 n2:2");
        check(list("n[1-2]:2, m1"), Some(5), None, "n1:0,1 n2:2,3 m1:4");
        check(
            file("# x\nn1 slots=2\nn2:3\n"),
            Some(4),
            None,
            "n1:0,1 n2:2,3",
        );
        check(file("n1\nn1 slots=2\n"), None, None, "n1:0,1,2");
        check(file("n[1-2] slots=2"), None, Some(1), "n1:0 n2:1");
    }

    #[test]
    fn placement_by_node_goes_round_the_hosts_with_room() {
        let node = MapBy::Node;
        check_map(list("n[1-3]"), Some(5), Some(2), node, "n1:0,3 n2:1,4 n3:2");
        check_map(list("n1:3,n2"), None, None, node, "n1:0,2,3 n2:1");
        check_map(list("n[1-4]"), Some(2), Some(2), node, "n1:0 n2:1");
        check_map(list("n[1-2]"), Some(4), Some(2), node, "n1:0,2 n2:1,3");
        check_map(
            list("n[1-2]"),
            Some(5),
            Some(2),
            node,
            "error: -n 5 needs 5 slots but 2 hosts offer 4 by --ppn; raise --ppn or add hosts",
        );
    }

    #[test]
    fn refusals() {
        check(
            list("n[1-2]"),
            Some(3),
            None,
            "error: -n 3 needs 3 slots but 2 hosts offer 2 by slots (1 for a host without slots=N or :N); raise --ppn or add hosts",
        );
        check(
            list("n[1-2]"),
            Some(5),
            Some(2),
            "error: -n 5 needs 5 slots but 2 hosts offer 4 by --ppn; raise --ppn or add hosts",
        );
        check(list(""), None, None, "error: host list \"\": no hosts");
        check(list("n1"), Some(0), None, "error: -n must be at least 1");
        check(list("n1"), None, Some(0), "error: --ppn must be at least 1");
        assert!(check_err(list("n[3-1]")).starts_with("host list \"n[3-1]\""));
        assert_eq!(
            check_err(list("n1,-oProxyCommand=sh")),
            "host list \"n1,-oProxyCommand=sh\": entry 2 \"-oProxyCommand=sh\": a host name part cannot begin or end with '-': \"-oProxyCommand=sh\""
        );
        let text = "n1\nn2;reboot\n".to_string();
        let err = check_err(HostSource::Hostfile {
            path: "hf".into(),
            text,
        });
        assert_eq!(
            err,
            "hostfile hf: hostfile line 2 column 1: ';' is not allowed in a host name (letters, digits, '-' and '.' only): \"n2;reboot\""
        );
    }

    #[test]
    fn a_host_named_twice_is_two_slots() {
        let plan = Plan::new(request(list("n1,n1,n2"), Some(3), None)).unwrap();
        assert_eq!(plan.hosts, ["n1", "n2"]);
        assert_eq!(plan.ranks, [vec![0, 1], vec![2]]);
        assert_eq!(plan.slots, [2, 1]);
        let plan = Plan::new(request(list("n1:4,n2:3,n3"), Some(5), None)).unwrap();
        assert_eq!(
            plan.slots,
            [4, 3],
            "spawned children find 2 slots free on n2"
        );
    }

    fn check_err(hosts: HostSource) -> String {
        Plan::new(request(hosts, None, None))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn launch_tree_has_greedyrun_at_position_zero() {
        let plan = Plan::new(request(list("n[1-8]"), None, None)).unwrap();
        assert_eq!(plan.launch.len(), 9);
        assert_eq!(plan.launch.subtree_len(0), 9);
        let mut flat = request(list("n[1-8]"), None, None);
        flat.topology = Topology::Flat;
        let plan = Plan::new(flat).unwrap();
        assert_eq!(plan.launch.children(0).count(), 8);
        assert_eq!(plan.node_of_rank(5), Some(5));
    }

    #[test]
    fn split_keeps_brackets() {
        assert_eq!(split_top_level("n[1-3,5]:2,m1"), vec!["n[1-3,5]:2", "m1"]);
        assert_eq!(split_top_level(" a , b ,"), vec!["a", "b"]);
    }
}
