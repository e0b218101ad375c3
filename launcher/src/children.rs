//! greedyrun's side of `MPI_Comm_spawn`, sans I/O: where a spawned job's ranks go, and the
//! two phases that start it on the agents.
//!
//! A rank's request reaches greedyrun as [`Up::Spawn`](crate::proto::Up::Spawn). [`place`]
//! puts its processes on free slots of the job's hosts (a host's slots less the ranks, the
//! job's and its children's, that still run there), honouring each program's `hosts`; without
//! `--oversubscribe` a request that does not fit is refused at once ("no free slots: asked N,
//! free M"). Then, as PRRTE and Hydra do, the requester is answered only once the children
//! run: [`Cmd::AddChild`] goes to **every** node (each serves the new namespace, also where
//! it has none of its ranks), and only when every node said so, [`Cmd::StartChild`] to the
//! nodes that fork its ranks. A job of one node is told both at once (`AddChild` with
//! `start`): its agent forks the ranks right after it added the child, as no other node has
//! to add it first, which spares a round trip. If any node fails, the requester is refused with that node's
//! reason and the children already started are killed ([`Cmd::KillChild`]). Every phase has a
//! deadline that names the hosts that did not answer: the requester never hangs.
//!
//! Children are the job's: each of their ranks ends with exactly one
//! [`Up::ChildExit`](crate::proto::Up::ChildExit) once it was told to start, greedyrun waits
//! for them before it ends, and a child's failure is the job's (but not the exits of the
//! children of a refused spawn, which greedyrun itself killed).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::{Duration, Instant},
};

use greedy_pmix::child::{ChildJob, SpawnApp, SpawnRequest};

use crate::proto::Cmd;

/// Most processes one spawn may ask for (a bound on what a request makes greedyrun hold).
pub const MAX_PROCS: u64 = 1 << 20;

/// What an agent checks before it uses a child job sent down ([`Cmd::AddChild`]): a rank list
/// per host of the job, every rank once, programs in rank order from rank 0, none empty. The
/// error is for the requester.
pub fn check_child(job: &ChildJob, n_hosts: usize) -> Result<(), String> {
    let bad = |what: &str| Err(format!("bad spawned job {}: {what}", job.nspace));
    if job.ranks.len() != n_hosts {
        return bad("not one rank list per host");
    }
    let n = job.ranks.iter().map(Vec::len).sum::<usize>();
    let mut seen = vec![false; n];
    for &r in job.ranks.iter().flatten() {
        match seen.get_mut(r as usize) {
            Some(s) if !*s => *s = true,
            _ => return bad("ranks not numbered 0..n once each"),
        }
    }
    let ordered = job.apps.first().is_some_and(|a| a.first_rank == 0)
        && job
            .apps
            .windows(2)
            .all(|w| w[0].first_rank < w[1].first_rank)
        && job.apps.iter().all(|a| !a.argv.is_empty());
    if !ordered {
        return bad("no program, or programs not in rank order");
    }
    Ok(())
}

/// Puts the processes of `apps` on hosts with free slots, in order (each host's free slots
/// filled before the next, as `--map-by slot`): `ranks[h]` for each host of `hosts`, or why
/// not. With `oversubscribe`, what does not fit goes round the program's hosts.
pub fn place(
    apps: &[SpawnApp],
    hosts: &[String],
    free: &[u32],
    oversubscribe: bool,
) -> Result<Vec<Vec<u32>>, String> {
    if apps.is_empty() {
        return Err("the request names no program".into());
    }
    let total: u64 = apps.iter().map(|a| u64::from(a.maxprocs)).sum();
    if total > MAX_PROCS {
        return Err(format!(
            "asks for {total} processes, more than one spawn may ({MAX_PROCS})"
        ));
    }
    let mut free = free.to_vec();
    let mut ranks = vec![Vec::new(); hosts.len()];
    let mut next = 0u32;
    for app in apps {
        if app.maxprocs == 0 {
            return Err(format!("{:?} asks for no process", app.program));
        }
        let allowed = allowed_hosts(app, hosts)?;
        let mut left = app.maxprocs;
        let available: u64 = allowed.iter().map(|&h| u64::from(free[h])).sum();
        if u64::from(left) > available && !oversubscribe {
            return Err(no_free_slots(left, &allowed, hosts, &free));
        }
        for &h in &allowed {
            let take = free[h].min(left);
            ranks[h].extend(next..next + take);
            (free[h], left, next) = (free[h] - take, left - take, next + take);
        }
        for &h in allowed.iter().cycle().take(left as usize) {
            ranks[h].push(next);
            next += 1;
        }
    }
    for r in &mut ranks {
        r.sort_unstable();
    }
    Ok(ranks)
}

/// The job's hosts `app` may run on (its `hosts`, else all), in the job's order.
fn allowed_hosts(app: &SpawnApp, hosts: &[String]) -> Result<Vec<usize>, String> {
    if app.hosts.is_empty() {
        return Ok((0..hosts.len()).collect());
    }
    let mut allowed = BTreeSet::new();
    for name in &app.hosts {
        match hosts.iter().position(|h| h == name) {
            Some(i) => allowed.insert(i),
            None => {
                return Err(format!(
                    "host {name:?} is not one of the job's hosts ({})",
                    greedy_tree::hostlist::compress(hosts)
                ));
            }
        };
    }
    Ok(allowed.into_iter().collect())
}

/// The refusal of a request for `asked` processes on `allowed` hosts.
fn no_free_slots(asked: u32, allowed: &[usize], hosts: &[String], free: &[u32]) -> String {
    let total: u64 = allowed.iter().map(|&h| u64::from(free[h])).sum();
    let each: Vec<String> = allowed
        .iter()
        .map(|&h| format!("{}:{}", hosts[h], free[h]))
        .collect();
    format!(
        "no free slots: asked {asked}, free {total} (hosts {}); greedyrun --oversubscribe allows more",
        each.join(",")
    )
}

/// What greedyrun must do after an event of [`Children`].
#[derive(Debug, Default, PartialEq)]
pub struct Step {
    /// Commands to route, in order (`None`: every node).
    pub route: Vec<(Option<u32>, Cmd)>,
    /// Child ranks told to start: each ends with one exit the job waits for.
    pub ranks_added: u32,
    /// The job cannot account for its ranks any more (a node did not answer a start): end it
    /// with this message.
    pub fail_job: Option<String>,
}

impl Step {
    fn answer(node: u32, id: u32, result: Result<String, String>) -> Step {
        Step {
            route: vec![(Some(node), Cmd::SpawnAnswer { id, result })],
            ..Step::default()
        }
    }
}

/// A spawn between the request and the answer.
#[derive(Debug)]
struct InFlight {
    /// The requester's node and request number.
    node: u32,
    id: u32,
    starting: bool,
    /// Its nodes were told to start its ranks with the add (a job of one node).
    merged: bool,
    /// Nodes that have yet to answer this phase.
    waiting: BTreeSet<u32>,
    deadline: Instant,
    /// The first failure heard in this phase.
    failure: Option<String>,
    /// The request while a session places it ([`Children::ask_placement`]).
    placing: Option<Box<SpawnRequest>>,
}

/// A child whose ranks were placed: what its exits need.
#[derive(Debug)]
struct Placed {
    nspace: String,
    /// The node of each of its ranks.
    node_of: Vec<u32>,
    /// Refused after its start was sent: its exits are greedyrun's kills.
    refused: bool,
}

/// How a child rank's exit counts, for the verdict and the message.
#[derive(Debug, PartialEq, Eq)]
pub struct ChildEnd {
    /// `rank R of N (child K)`, for messages.
    pub what: String,
    /// Host index it ran on.
    pub node: u32,
    /// Its failure is the job's (not a child greedyrun killed itself).
    pub counts: bool,
}

/// The job's spawned children and their slots, with one method per event.
#[derive(Debug)]
pub struct Children {
    job_id: String,
    hosts: Vec<String>,
    slots: Vec<u32>,
    /// Ranks placed and not ended, per host: the job's and its children's.
    live: Vec<u32>,
    oversubscribe: bool,
    timeout: Duration,
    /// The ranks' `PATH`, after which a program's `path` is searched.
    path: Option<String>,
    next: u32,
    in_flight: BTreeMap<u32, InFlight>,
    placed: HashMap<u32, Placed>,
}

/// How a job's children are placed and waited for.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Slots of each host of the job.
    pub slots: Vec<u32>,
    /// Beyond them, processes may share slots.
    pub oversubscribe: bool,
    /// Each phase's deadline.
    pub timeout: Duration,
    /// The ranks' `PATH`.
    pub path: Option<String>,
}

impl Children {
    /// The children of job `job_id` on `hosts`, whose ranks `ranks[h]` run now.
    pub fn new(job_id: &str, hosts: &[String], ranks: &[Vec<u32>], limits: Limits) -> Children {
        Children {
            job_id: job_id.to_string(),
            hosts: hosts.to_vec(),
            live: ranks.iter().map(|r| r.len() as u32).collect(),
            slots: limits.slots,
            oversubscribe: limits.oversubscribe,
            timeout: limits.timeout,
            path: limits.path,
            next: 1,
            in_flight: BTreeMap::new(),
            placed: HashMap::new(),
        }
    }

    /// Whether a spawn waits for its answer (the job does not end meanwhile).
    pub fn busy(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// Free slots per host now.
    fn free(&self) -> Vec<u32> {
        (self.slots.iter().zip(&self.live))
            .map(|(s, l)| s.saturating_sub(*l))
            .collect()
    }

    /// Rank `request.requester` on `node` asks for a spawn (its number `id` there): placed and
    /// added on every node, or refused at once.
    pub fn request(&mut self, node: u32, id: u32, request: SpawnRequest, now: Instant) -> Step {
        let ranks = match place(&request.apps, &self.hosts, &self.free(), self.oversubscribe) {
            Ok(r) => r,
            Err(why) => return Step::answer(node, id, Err(why)),
        };
        let child = self.ask_placement(node, id, request, now);
        self.placement(child, Ok(ranks), now)
    }

    /// Rank `request.requester` on `node` asks for a spawn that another places (a session,
    /// which holds the slots): the child's number, for [`Children::placement`].
    pub fn ask_placement(
        &mut self,
        node: u32,
        id: u32,
        request: SpawnRequest,
        now: Instant,
    ) -> u32 {
        let child = self.next;
        self.next += 1;
        let flight = InFlight {
            node,
            id,
            starting: false,
            merged: false,
            waiting: BTreeSet::new(),
            deadline: now + self.timeout,
            failure: None,
            placing: Some(Box::new(request)),
        };
        self.in_flight.insert(child, flight);
        child
    }

    /// `child` was placed as `ranks` (`ranks[h]` on host `h`), or refused: added on every
    /// node, or its requester refused.
    pub fn placement(
        &mut self,
        child: u32,
        ranks: Result<Vec<Vec<u32>>, String>,
        now: Instant,
    ) -> Step {
        let Some(f) = self.in_flight.get_mut(&child) else {
            return Step::default();
        };
        let Some(request) = f.placing.take() else {
            return Step::default();
        };
        let job = ranks
            .map(|r| self.child_job(child, &request, r))
            .and_then(|job| check_child(&job, self.hosts.len()).map(|()| job));
        let job = match job {
            Ok(job) => job,
            Err(why) => {
                let f = self.in_flight.remove(&child).expect("in flight");
                return Step::answer(f.node, f.id, Err(why));
            }
        };
        let mut node_of = vec![0; job.n_ranks() as usize];
        for (h, r) in job.ranks.iter().enumerate() {
            self.live[h] += r.len() as u32;
            for &rank in r {
                node_of[rank as usize] = h as u32;
            }
        }
        let nspace = job.nspace.clone();
        let refused = false;
        self.placed.insert(
            child,
            Placed {
                nspace,
                node_of,
                refused,
            },
        );
        let f = self.in_flight.get_mut(&child).expect("in flight");
        f.waiting = (0..self.hosts.len() as u32).collect();
        f.deadline = now + self.timeout;
        // With one node, the node that adds it is every node that must: it may start at once.
        f.merged = self.hosts.len() == 1;
        let (job, start) = (Box::new(job), f.merged);
        Step {
            route: vec![(None, Cmd::AddChild { child, job, start })],
            ..Step::default()
        }
    }

    /// The child job every node learns for `request`, numbered `child`, placed as `ranks`.
    fn child_job(&self, child: u32, request: &SpawnRequest, ranks: Vec<Vec<u32>>) -> ChildJob {
        let nspace = greedy_pmix::child::nspace(&self.job_id, child);
        ChildJob::new(nspace, request, ranks, self.path.as_deref())
    }

    /// `node` added child `child`, or failed to: once every node did, its ranks start.
    pub fn added(&mut self, node: u32, child: u32, result: Result<(), String>) -> Step {
        let Some(f) =
            (self.in_flight.get_mut(&child)).filter(|f| !f.starting && f.placing.is_none())
        else {
            return Step::default();
        };
        f.waiting.remove(&node);
        if let Err(why) = result {
            let host = &self.hosts[node as usize];
            f.failure
                .get_or_insert(format!("{host} cannot serve the child: {why}"));
        }
        if !f.waiting.is_empty() {
            return Step::default();
        }
        if let Some(why) = f.failure.take() {
            return self.unplace(child, why);
        }
        let holders: BTreeSet<u32> = self.placed[&child].node_of.iter().copied().collect();
        let n = self.placed[&child].node_of.len() as u32;
        let f = self.in_flight.get_mut(&child).expect("checked");
        (f.starting, f.waiting) = (true, holders.clone());
        f.deadline = Instant::now() + self.timeout;
        // Merged: the node forks them already, having added the child.
        let route = match f.merged {
            true => Vec::new(),
            false => (holders.into_iter())
                .map(|h| (Some(h), Cmd::StartChild { child }))
                .collect(),
        };
        Step {
            route,
            ranks_added: n,
            fail_job: None,
        }
    }

    /// Nothing of `child` was started: its slots are free again, the requester refused.
    fn unplace(&mut self, child: u32, why: String) -> Step {
        let f = self.in_flight.remove(&child).expect("in flight");
        if let Some(p) = self.placed.remove(&child) {
            for h in p.node_of {
                self.live[h as usize] -= 1;
            }
        }
        Step::answer(f.node, f.id, Err(why))
    }

    /// `node` forked its ranks of `child`, or failed to: once every node answered, the
    /// requester is answered (and on a failure the children are killed).
    pub fn started(&mut self, node: u32, child: u32, result: Result<(), String>) -> Step {
        let Some(f) = self.in_flight.get_mut(&child).filter(|f| f.starting) else {
            return Step::default();
        };
        f.waiting.remove(&node);
        if let Err(why) = result {
            f.failure.get_or_insert(why);
            // From now on its ranks' exits are the kills to come, not failures of the job.
            if let Some(p) = self.placed.get_mut(&child) {
                p.refused = true;
            }
        }
        if !f.waiting.is_empty() {
            return Step::default();
        }
        let f = self.in_flight.remove(&child).expect("checked");
        match f.failure {
            None => {
                let nspace = self.placed[&child].nspace.clone();
                Step::answer(f.node, f.id, Ok(nspace))
            }
            Some(why) => self.refuse_started(child, (f.node, f.id), why),
        }
    }

    /// The start of `child` failed somewhere: its ranks are killed, the requester refused.
    fn refuse_started(&mut self, child: u32, (node, id): (u32, u32), why: String) -> Step {
        if let Some(p) = self.placed.get_mut(&child) {
            p.refused = true;
        }
        let mut step = Step::answer(node, id, Err(why));
        step.route.insert(0, (None, Cmd::KillChild { child }));
        step
    }

    /// The deadlines: a phase whose nodes did not all answer in time refuses its requester,
    /// naming them (a start that did not finish also ends the job).
    pub fn tick(&mut self, now: Instant) -> Step {
        let late: Vec<u32> = (self.in_flight.iter())
            .filter(|(_, f)| now >= f.deadline)
            .map(|(&c, _)| c)
            .collect();
        let mut out = Step::default();
        for child in late {
            let step = self.timed_out(child);
            out.route.extend(step.route);
            out.fail_job = out.fail_job.or(step.fail_job);
        }
        out
    }

    /// `child`'s phase passed its deadline: its requester refused, naming who did not answer.
    fn timed_out(&mut self, child: u32) -> Step {
        let f = &self.in_flight[&child];
        let secs = self.timeout.as_secs_f64();
        let missing: Vec<&String> = (f.waiting.iter())
            .map(|&h| &self.hosts[h as usize])
            .collect();
        let missing = greedy_tree::hostlist::compress(&missing);
        let why = match (&f.placing, f.starting) {
            (Some(_), _) => format!("spawn timed out after {secs} s: the session did not place it"),
            (None, false) => format!(
                "spawn timed out after {secs} s: no answer from {missing} (asked to add the child)"
            ),
            (None, true) => format!(
                "spawn timed out after {secs} s: no answer from {missing} (asked to start its ranks)"
            ),
        };
        if !f.starting {
            return self.unplace(child, why);
        }
        let f = self.in_flight.remove(&child).expect("listed");
        let mut step = self.refuse_started(child, (f.node, f.id), why.clone());
        step.fail_job = Some(why);
        step
    }

    /// One of the job's own ranks ended on host `node`: its slot is free.
    pub fn rank_ended(&mut self, node: usize) {
        if let Some(l) = self.live.get_mut(node) {
            *l = l.saturating_sub(1);
        }
    }

    /// Rank `rank` of `child` ended: its slot is free; how its end counts (`None` for a rank
    /// greedyrun never placed).
    pub fn child_ended(&mut self, child: u32, rank: u32) -> Option<ChildEnd> {
        let p = self.placed.get(&child)?;
        let node = *p.node_of.get(rank as usize)?;
        let what = format!(
            "rank {rank} of spawned job {} on {}",
            p.nspace, self.hosts[node as usize]
        );
        let counts = !p.refused;
        self.rank_ended(node as usize);
        Some(ChildEnd { what, node, counts })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(program: &str, maxprocs: u32, hosts: &[&str]) -> SpawnApp {
        SpawnApp {
            program: program.into(),
            args: vec!["x".into()],
            maxprocs,
            env: vec![],
            cwd: None,
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            path: None,
        }
    }

    fn hosts() -> Vec<String> {
        vec!["n1".into(), "n2".into(), "n3".into()]
    }

    #[test]
    fn placement_fills_free_slots_in_order_honouring_hosts() {
        let h = hosts();
        assert_eq!(
            place(&[app("a", 3, &[])], &h, &[1, 0, 4], false),
            Ok(vec![vec![0], vec![], vec![1, 2]])
        );
        // Two programs, the second on n1 only; ranks run on across them.
        assert_eq!(
            place(
                &[app("a", 2, &["n3"]), app("b", 1, &["n1"])],
                &h,
                &[1, 0, 4],
                false
            ),
            Ok(vec![vec![2], vec![], vec![0, 1]])
        );
        assert_eq!(
            place(&[app("a", 3, &[])], &h, &[0, 1, 0], false),
            Err("no free slots: asked 3, free 1 (hosts n1:0,n2:1,n3:0); greedyrun --oversubscribe allows more".into())
        );
        // The second program finds the first's slots taken.
        let e = place(
            &[app("a", 1, &[]), app("b", 1, &["n1"])],
            &h,
            &[1, 0, 0],
            false,
        );
        assert_eq!(
            e.unwrap_err(),
            "no free slots: asked 1, free 0 (hosts n1:0); greedyrun --oversubscribe allows more"
        );
        assert!(
            place(&[app("a", 1, &["m9"])], &h, &[1, 1, 1], false)
                .unwrap_err()
                .contains("\"m9\" is not one of the job's hosts (n[1-3])")
        );
        assert!(place(&[app("a", 0, &[])], &h, &[1, 1, 1], false).is_err());
        let huge = [app("a", u32::MAX, &[]), app("b", u32::MAX, &[])];
        assert!(
            place(&huge, &h, &[1, 1, 1], true)
                .unwrap_err()
                .starts_with("asks for 8589934590 processes")
        );
        assert!(place(&[], &h, &[1, 1, 1], false).is_err());
    }

    #[test]
    fn oversubscription_goes_round_the_programs_hosts() {
        let h = hosts();
        assert_eq!(
            place(&[app("a", 5, &[])], &h, &[1, 0, 0], true),
            Ok(vec![vec![0, 1, 4], vec![2], vec![3]])
        );
        assert_eq!(
            place(&[app("a", 2, &["n2"])], &h, &[0, 0, 0], true),
            Ok(vec![vec![], vec![0, 1], vec![]])
        );
    }

    fn children(slots: Vec<u32>) -> Children {
        let limits = Limits {
            slots,
            oversubscribe: false,
            timeout: Duration::from_secs(10),
            path: Some("/usr/bin".into()),
        };
        Children::new("j", &hosts(), &[vec![0], vec![1], vec![]], limits)
    }

    fn request(apps: Vec<SpawnApp>) -> SpawnRequest {
        SpawnRequest {
            parent: "j".into(),
            requester: 1,
            family: greedy_pmix::family::Family::Pmi,
            apps,
            preput: vec![("PARENT_ROOT_PORT_NAME".into(), "p".into())],
        }
    }

    fn answer(step: &Step) -> Option<(u32, u32, Result<String, String>)> {
        step.route.iter().find_map(|(to, c)| match c {
            Cmd::SpawnAnswer { id, result } => Some((to.unwrap(), *id, result.clone())),
            _ => None,
        })
    }

    #[test]
    fn a_spawn_is_added_everywhere_then_started_where_its_ranks_are_then_answered() {
        let mut c = children(vec![2, 1, 1]);
        let now = Instant::now();
        let mut a = app("prog", 2, &[]);
        a.path = Some("/opt/x".into());
        let step = c.request(1, 7, request(vec![a]), now);
        let [
            (
                None,
                Cmd::AddChild {
                    child: 1,
                    job,
                    start: false,
                },
            ),
        ] = &step.route[..]
        else {
            panic!("{step:?}")
        };
        assert_eq!(job.nspace, "j@1");
        assert_eq!(check_child(job, 3), Ok(()));
        assert!(check_child(job, 2).is_err());
        let mut twice = (**job).clone();
        twice.ranks[1].push(0);
        assert!(check_child(&twice, 3).unwrap_err().contains("once each"));
        let mut empty = (**job).clone();
        empty.apps[0].argv.clear();
        assert!(check_child(&empty, 3).is_err());
        assert_eq!(
            job.ranks,
            [vec![0], vec![], vec![1]],
            "n1 has one free slot, n2 none"
        );
        assert_eq!(job.apps[0].argv, ["prog", "x"]);
        assert_eq!(job.apps[0].env, [("PATH".into(), "/opt/x:/usr/bin".into())]);
        assert_eq!(job.preput.len(), 1);
        assert!(c.busy());
        // Slots are held from the placement on: a second request finds none.
        let refused = c.request(0, 1, request(vec![app("b", 1, &[])]), now);
        assert!(
            answer(&refused)
                .unwrap()
                .2
                .unwrap_err()
                .starts_with("no free slots: asked 1, free 0")
        );
        assert_eq!(c.added(0, 1, Ok(())), Step::default());
        assert_eq!(c.added(2, 1, Ok(())), Step::default());
        let start = c.added(1, 1, Ok(()));
        assert_eq!(start.ranks_added, 2);
        let to: Vec<_> = start.route.iter().map(|(to, _)| *to).collect();
        assert_eq!(to, [Some(0), Some(2)]);
        assert_eq!(c.started(0, 1, Ok(())), Step::default());
        let done = c.started(2, 1, Ok(()));
        assert_eq!(answer(&done), Some((1, 7, Ok("j@1".into()))));
        assert!(!c.busy());
        let end = c.child_ended(1, 1).unwrap();
        assert_eq!((end.node, end.counts), (2, true));
        assert_eq!(end.what, "rank 1 of spawned job j@1 on n3");
        assert!(c.child_ended(1, 9).is_none() && c.child_ended(5, 0).is_none());
        // Its slot on n3 is free again.
        let again = c.request(0, 2, request(vec![app("b", 1, &["n3"])]), now);
        assert!(matches!(
            again.route[0],
            (None, Cmd::AddChild { child: 2, .. })
        ));
    }

    #[test]
    fn a_job_of_one_node_adds_and_starts_in_one_command() {
        let limits = Limits {
            slots: vec![2],
            oversubscribe: false,
            timeout: Duration::from_secs(10),
            path: None,
        };
        let mut c = Children::new("j", &["n1".into()], &[vec![0]], limits);
        let t0 = Instant::now();
        let step = c.request(0, 4, request(vec![app("p", 1, &[])]), t0);
        assert!(matches!(
            &step.route[..],
            [(
                None,
                Cmd::AddChild {
                    child: 1,
                    start: true,
                    ..
                }
            )]
        ));
        // The add's answer asks nothing more of the node: it forks already.
        let added = c.added(0, 1, Ok(()));
        assert_eq!((added.route, added.ranks_added), (vec![], 1));
        let done = c.started(0, 1, Ok(()));
        assert_eq!(answer(&done), Some((0, 4, Ok("j@1".into()))));
        c.child_ended(1, 0);
        // A node that cannot add forks nothing: refused, the slot free again.
        let step = c.request(0, 5, request(vec![app("p", 1, &[])]), t0);
        assert!(matches!(
            &step.route[..],
            [(None, Cmd::AddChild { child: 2, .. })]
        ));
        let refused = c.added(0, 2, Err("not served".into()));
        assert_eq!(
            answer(&refused),
            Some((0, 5, Err("n1 cannot serve the child: not served".into())))
        );
        assert_eq!(refused.ranks_added, 0);
        assert_eq!(c.free(), [1]);
        // A start that does not finish names the node and ends the job, as in two phases.
        c.request(0, 6, request(vec![app("p", 1, &[])]), t0);
        c.added(0, 3, Ok(()));
        let late = c.tick(Instant::now() + Duration::from_secs(11));
        assert!(
            late.fail_job
                .is_some_and(|w| w.contains("no answer from n1 (asked to start its ranks)"))
        );
    }

    #[test]
    fn a_node_that_cannot_add_refuses_the_spawn_naming_it_and_frees_the_slots() {
        let mut c = children(vec![2, 2, 2]);
        c.request(0, 3, request(vec![app("p", 3, &[])]), Instant::now());
        c.added(0, 1, Ok(()));
        c.added(1, 1, Err("spawn is not served yet".into()));
        let step = c.added(2, 1, Ok(()));
        assert_eq!(
            answer(&step),
            Some((
                0,
                3,
                Err("n2 cannot serve the child: spawn is not served yet".into())
            ))
        );
        assert_eq!(step.ranks_added, 0);
        assert!(!c.busy());
        assert_eq!(c.free(), [1, 1, 2]);
    }

    #[test]
    fn a_failed_start_kills_the_children_and_their_exits_do_not_count() {
        let mut c = children(vec![2, 2, 2]);
        c.request(0, 3, request(vec![app("p", 3, &[])]), Instant::now());
        for n in 0..3 {
            c.added(n, 1, Ok(()));
        }
        c.started(
            0,
            1,
            Err("cannot run \"p\" on host n1: No such file".into()),
        );
        // Its ranks elsewhere that end meanwhile are the kills to come.
        assert!(!c.child_ended(1, 1).unwrap().counts);
        c.started(1, 1, Ok(()));
        let step = c.started(2, 1, Ok(()));
        assert_eq!(step.route[0], (None, Cmd::KillChild { child: 1 }));
        assert_eq!(
            answer(&step).unwrap().2,
            Err("cannot run \"p\" on host n1: No such file".into())
        );
        assert!(!c.child_ended(1, 0).unwrap().counts);
    }

    #[test]
    fn a_session_places_the_child_and_the_phases_follow() {
        let mut c = children(vec![1, 1, 1]);
        let t0 = Instant::now();
        let child = c.ask_placement(1, 5, request(vec![app("p", 2, &[])]), t0);
        assert!(c.busy());
        // Adds before the placement are not this phase's.
        assert_eq!(c.added(0, child, Ok(())), Step::default());
        let step = c.placement(child, Ok(vec![vec![], vec![0], vec![1]]), t0);
        assert!(matches!(
            &step.route[..],
            [(None, Cmd::AddChild { child: 1, .. })]
        ));
        assert_eq!(c.placement(child, Ok(vec![]), t0), Step::default(), "once");
        // A refused placement, or one that does not fit the job, refuses the requester.
        let refused = c.ask_placement(0, 6, request(vec![app("p", 1, &[])]), t0);
        let step = c.placement(refused, Err("no free slots: asked 1, free 0".into()), t0);
        assert_eq!(
            answer(&step),
            Some((0, 6, Err("no free slots: asked 1, free 0".into())))
        );
        let bad = c.ask_placement(0, 7, request(vec![app("p", 1, &[])]), t0);
        let step = c.placement(bad, Ok(vec![vec![0]]), t0);
        assert!(
            answer(&step)
                .unwrap()
                .2
                .unwrap_err()
                .contains("one rank list per host")
        );
        // A session that never answers: refused by the deadline.
        let silent = c.ask_placement(0, 8, request(vec![app("p", 1, &[])]), t0);
        let step = c.tick(t0 + Duration::from_secs(11));
        let why = step.route.iter().find_map(|(_, cmd)| match cmd {
            Cmd::SpawnAnswer { id: 8, result } => result.clone().err(),
            _ => None,
        });
        assert!(
            why.is_some_and(|w| w.contains("the session did not place it")),
            "{silent}"
        );
    }

    #[test]
    fn deadlines_name_the_hosts_that_did_not_answer() {
        let mut c = children(vec![2, 2, 2]);
        let t0 = Instant::now();
        c.request(0, 3, request(vec![app("p", 1, &[])]), t0);
        c.added(0, 1, Ok(()));
        assert_eq!(c.tick(t0 + Duration::from_secs(1)), Step::default());
        let step = c.tick(t0 + Duration::from_secs(11));
        let why = answer(&step).unwrap().2.unwrap_err();
        assert!(
            why.contains("no answer from n[2-3] (asked to add the child)"),
            "{why}"
        );
        assert!(step.fail_job.is_none() && !c.busy());
        // A start that does not finish ends the job too.
        c.request(0, 4, request(vec![app("p", 2, &[])]), t0);
        for n in 0..3 {
            c.added(n, 2, Ok(()));
        }
        let step = c.tick(Instant::now() + Duration::from_secs(11));
        assert_eq!(step.route[0], (None, Cmd::KillChild { child: 2 }));
        assert!(
            step.fail_job
                .unwrap()
                .contains("no answer from n[1-2] (asked to start its ranks)")
        );
    }
}
