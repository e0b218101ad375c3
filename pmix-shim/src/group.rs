//! Collectives over some of the job's nodes (a PMIx fence over a subset of the ranks, `PMIx_Connect`, `PMIx_Disconnect`, `PMIx_Group_construct`/`_destruct`): each participating node sends its contribution to node 0, which answers them all once every one is in.
//!
//! An overlay collective needs every node; these need only the nodes that host a
//! participant, and different subsets may run at once (two halves of a split communicator
//! fencing each on its own), so they are not numbered by the overlay. A group is named by
//! what every participating node knows alike: the operation, the sorted participants as PMIx
//! named them (always with their namespace, so a later server hosting several namespaces
//! needs no new wire format), and a per-(operation, participants) sequence number each node
//! counts by itself. Several namespaces may be served over one overlay (a job and the jobs it
//! spawned): the coordinator learns which nodes must contribute from the placements of the
//! participants' namespaces in the overlay's [`Served`] registry (a parent and its child
//! connect over both), and refuses a namespace not (or no longer) served there at once. Node 0's sans-I/O [`Coordinator`] gathers the contributions and answers
//! each with every node's data in node order, or, past the group's deadline, with an error
//! naming the nodes (and their participating ranks) that never came. A group construct is
//! answered with a [`Constructed`]: the data, and when the members asked for one, a context
//! id node 0 draws from one counter per overlay (so unique among the family's groups,
//! increasing from 1, the same for every member).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::JobSpec;
use crate::names::Ticket;
use crate::overlay::served::Served;

/// The node that coordinates subset collectives.
pub const GROUP_NODE: usize = 0;
/// How long a subset collective waits for its last node when the client named no timeout.
pub const GROUP_TIMEOUT_DEFAULT: Duration = Duration::from_secs(300);
/// The longest a subset collective waits, whatever the client asked.
pub const GROUP_TIMEOUT_MAX: Duration = Duration::from_secs(3600);
/// Most groups gathering at once on node 0.
pub const OPEN_MAX: usize = 1024;
/// Most participants a contribution may name (a rank list longer than any job).
pub const PROCS_MAX: usize = 1 << 20;

/// The rank PMIx uses for "every rank of the namespace".
pub const WILDCARD: u32 = greedy_sys::pmix::RANK_WILDCARD;

/// Which collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GroupOp {
    /// `PMIx_Fence` over a subset (`collect`: the data travels).
    Fence {
        /// `PMIX_COLLECT_DATA`.
        collect: bool,
    },
    /// `PMIx_Connect`.
    Connect,
    /// `PMIx_Disconnect`.
    Disconnect,
    /// `PMIx_Group_construct` (`context_id`: `PMIX_GROUP_ASSIGN_CONTEXT_ID`).
    Construct {
        /// Assign the group a context id.
        context_id: bool,
    },
    /// `PMIx_Group_destruct`.
    Destruct,
}

/// Node 0's answer to a group construct.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Constructed {
    /// The group's context id, when asked for.
    pub context_id: Option<u64>,
    /// Every participating node's data, in node order.
    pub data: Bytes,
}

/// The answer body carrying `c`.
pub fn encode_constructed(c: &Constructed) -> Bytes {
    Bytes::from(postcard::to_stdvec(c).unwrap_or_default())
}

/// A construct's answer from node 0's bytes.
pub fn decode_constructed(body: &[u8]) -> Result<Constructed, String> {
    postcard::from_bytes(body).map_err(|e| format!("bad group construct answer: {e}"))
}

/// One participating node's part of a subset collective (the overlay request body).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Contribution {
    /// The collective.
    pub op: GroupOp,
    /// The participants, sorted: `(namespace, rank)`, rank [`WILDCARD`] for a whole namespace.
    pub procs: Vec<(String, u32)>,
    /// How many times this node ran `op` over `procs` before.
    pub seq: u64,
    /// The client's bound (capped at [`GROUP_TIMEOUT_MAX`]).
    pub timeout: Duration,
    /// This node's data (a fence's blob; empty otherwise).
    pub data: Bytes,
}

/// The body of the overlay request carrying `c`.
pub fn encode(c: &Contribution) -> Bytes {
    Bytes::from(postcard::to_stdvec(c).unwrap_or_default())
}

/// A contribution from another node's bytes; the error is the answer to send back.
pub fn decode(body: &[u8]) -> Result<Contribution, String> {
    let c: Contribution =
        postcard::from_bytes(body).map_err(|e| format!("bad group request: {e}"))?;
    if c.procs.len() > PROCS_MAX {
        return Err(format!("group request names {} processes", c.procs.len()));
    }
    Ok(c)
}

/// The nodes hosting `procs` of `job`, or why they are not all this job's ranks.
pub fn nodes_of(job: &JobSpec, procs: &[(String, u32)]) -> Result<BTreeSet<usize>, String> {
    let mut nodes = BTreeSet::new();
    for (nspace, rank) in procs {
        if *nspace != job.job_id {
            return Err(format!(
                "participant {nspace}:{rank} is not of this job's namespace {:?} (one collective, one namespace)",
                job.job_id
            ));
        }
        if *rank == WILDCARD {
            // A namespace may hold ranks on some of the overlay's nodes only.
            return Ok(crate::namespace::nodes_with_ranks(job)
                .into_iter()
                .collect());
        }
        match job.node_of_rank(*rank) {
            Some(n) => nodes.insert(n),
            None => return Err(format!("participant rank {rank} is not in the job")),
        };
    }
    if nodes.is_empty() {
        return Err("a collective with no participants".into());
    }
    Ok(nodes)
}

/// The nodes hosting `procs`, of every namespace they name, by each namespace's placement
/// in `served`, and those placements (sorted by namespace); or why they are not all served
/// participants. A parent and the child it spawned connect and fence over both
/// (`MPI_Comm_spawn`, `MPI_Comm_disconnect`).
pub fn nodes_in(
    served: &Served,
    procs: &[(String, u32)],
) -> Result<(BTreeSet<usize>, Vec<std::sync::Arc<JobSpec>>), String> {
    let mut by_ns: BTreeMap<&str, Vec<(String, u32)>> = BTreeMap::new();
    for p in procs {
        by_ns.entry(p.0.as_str()).or_default().push(p.clone());
    }
    if by_ns.is_empty() {
        return Err("a collective with no participants".into());
    }
    let mut nodes = BTreeSet::new();
    let mut jobs = Vec::new();
    for (nspace, ours) in by_ns {
        let job = served.placement(nspace).ok_or_else(|| {
            format!("namespace {nspace:?} is not served on this overlay (never added, or removed)")
        })?;
        nodes.extend(nodes_of(&job, &ours)?);
        jobs.push(job);
    }
    Ok((nodes, jobs))
}

/// What names a group across nodes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GroupId {
    op: GroupOp,
    procs: Vec<(String, u32)>,
    seq: u64,
}

/// A group gathering on node 0.
#[derive(Debug)]
struct Gathering {
    /// The participants' namespaces' placements when the group opened.
    jobs: Vec<std::sync::Arc<JobSpec>>,
    expected: BTreeSet<usize>,
    got: BTreeMap<usize, (Ticket, Bytes)>,
    since: Instant,
    deadline: Instant,
}

/// The answers to send: each ticket with the gathered data or the reason it failed.
pub type Answers = Vec<(Ticket, Result<Bytes, String>)>;

/// Node 0's bookkeeping of the subset collectives under way.
#[derive(Debug)]
pub struct Coordinator {
    /// The namespaces served on the overlay, whose placements say who must contribute.
    served: Served,
    open: HashMap<GroupId, Gathering>,
    /// The context id the next group construct asking for one gets.
    next_context_id: u64,
}

impl Coordinator {
    /// A coordinator for `job`'s namespace alone.
    pub fn new(job: std::sync::Arc<JobSpec>) -> Coordinator {
        Coordinator::over(Served::of_one(job))
    }

    /// A coordinator for every namespace `served` holds, now or once added.
    pub fn over(served: Served) -> Coordinator {
        Coordinator {
            served,
            open: HashMap::new(),
            next_context_id: 1,
        }
    }

    /// Node `from`'s contribution `c` (its request known as `ticket`) at `now`: the answers
    /// it completes (every participating node's, when it is the last), or its own refusal.
    pub fn contribute(
        &mut self,
        ticket: Ticket,
        from: usize,
        c: Contribution,
        now: Instant,
    ) -> Answers {
        let (expected, jobs) = match nodes_in(&self.served, &c.procs) {
            Ok(n) => n,
            Err(why) => return vec![(ticket, Err(why))],
        };
        if !expected.contains(&from) {
            return vec![(
                ticket,
                Err(format!("node {from} hosts none of the participants")),
            )];
        }
        let id = GroupId {
            op: c.op,
            procs: c.procs,
            seq: c.seq,
        };
        if !self.open.contains_key(&id) && self.open.len() >= OPEN_MAX {
            return vec![(
                ticket,
                Err(format!(
                    "{OPEN_MAX} collectives already gathering on node 0"
                )),
            )];
        }
        let g = self.open.entry(id.clone()).or_insert_with(|| Gathering {
            jobs,
            expected,
            got: BTreeMap::new(),
            since: now,
            deadline: now + c.timeout.min(GROUP_TIMEOUT_MAX),
        });
        if g.got.contains_key(&from) {
            return vec![(
                ticket,
                Err(format!(
                    "node {from} entered {:?} seq {} twice",
                    id.op, id.seq
                )),
            )];
        }
        g.got.insert(from, (ticket, c.data));
        if g.got.len() < g.expected.len() {
            return Vec::new();
        }
        let Some(g) = self.open.remove(&id) else {
            return Vec::new();
        };
        let all: Vec<u8> = g
            .got
            .values()
            .flat_map(|(_, d)| d.iter().copied())
            .collect();
        let all = self.answer(id.op, Bytes::from(all));
        g.got
            .into_values()
            .map(|(t, _)| (t, Ok(all.clone())))
            .collect()
    }

    /// The answer of a completed `op` gathering `all`: the data itself, or for a construct
    /// a [`Constructed`] with the next context id if asked.
    fn answer(&mut self, op: GroupOp, all: Bytes) -> Bytes {
        let GroupOp::Construct { context_id } = op else {
            return all;
        };
        let context_id = context_id.then(|| {
            self.next_context_id += 1;
            self.next_context_id - 1
        });
        encode_constructed(&Constructed {
            context_id,
            data: all,
        })
    }

    /// The groups whose deadline passed at `now`: every node that came is told which did not.
    pub fn expire(&mut self, now: Instant) -> Answers {
        let late: Vec<GroupId> = self
            .open
            .iter()
            .filter(|(_, g)| g.deadline <= now)
            .map(|(id, _)| id.clone())
            .collect();
        let mut out = Vec::new();
        for id in late {
            let Some(g) = self.open.remove(&id) else {
                continue;
            };
            let why = self.missing(&id, &g, now);
            out.extend(g.got.into_values().map(|(t, _)| (t, Err(why.clone()))));
        }
        out
    }

    /// Why group `id` failed: the nodes that never entered, with their participating ranks.
    fn missing(&self, id: &GroupId, g: &Gathering, now: Instant) -> String {
        let missing: Vec<String> = g
            .expected
            .iter()
            .filter(|n| !g.got.contains_key(n))
            .map(|&n| {
                let ranks: Vec<String> = g
                    .jobs
                    .iter()
                    .map(|job| {
                        let ours = |r: &u32| {
                            id.procs
                                .iter()
                                .any(|(ns, p)| *ns == job.job_id && (*p == WILDCARD || p == r))
                        };
                        let ranks: Vec<u32> = job.ranks[n].iter().copied().filter(ours).collect();
                        (ranks, &job.job_id)
                    })
                    .filter(|(ranks, _)| !ranks.is_empty())
                    .map(|(ranks, ns)| match g.jobs.len() {
                        1 => format!("ranks {ranks:?}"),
                        _ => format!("{ns} ranks {ranks:?}"),
                    })
                    .collect();
                let host = g.jobs.first().map_or("?", |j| j.hosts[n].as_str());
                format!("node {n} ({host}, {})", ranks.join(", "))
            })
            .collect();
        format!(
            "{:?} over {} participants (seq {}): {} never entered within {:?}",
            id.op,
            id.procs.len(),
            id.seq,
            missing.join(", "),
            now.saturating_duration_since(g.since)
        )
    }

    /// When the next open group expires.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.open.values().map(|g| g.deadline).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JobSecret;

    fn job() -> std::sync::Arc<JobSpec> {
        std::sync::Arc::new(JobSpec {
            job_id: "j".into(),
            hosts: vec!["a".into(), "b".into(), "c".into()],
            node_idx: 0,
            model: Default::default(),
            ranks: vec![vec![0, 1], vec![2, 3], vec![4, 5]],
            secret: JobSecret::generate(),
        })
    }

    fn part(op: GroupOp, ranks: &[u32], seq: u64, data: &'static [u8]) -> Contribution {
        Contribution {
            op,
            procs: ranks.iter().map(|&r| ("j".to_string(), r)).collect(),
            seq,
            timeout: Duration::from_secs(5),
            data: Bytes::from_static(data),
        }
    }

    const FENCE: GroupOp = GroupOp::Fence { collect: true };

    #[test]
    fn a_whole_namespace_on_some_nodes_gathers_those_nodes_only() {
        let mut sparse = (*job()).clone();
        sparse.ranks = vec![vec![], vec![0], vec![1, 2]];
        let whole = [("j".to_string(), WILDCARD)];
        assert_eq!(nodes_of(&sparse, &whole).unwrap(), BTreeSet::from([1, 2]));
        assert_eq!(nodes_of(&job(), &whole).unwrap(), BTreeSet::from([0, 1, 2]));
        let mut c = Coordinator::new(std::sync::Arc::new(sparse));
        let t0 = Instant::now();
        let wild = |data| Contribution {
            procs: whole.to_vec(),
            ..part(FENCE, &[], 0, data)
        };
        assert!(c.contribute(2, 1, wild(b"B"), t0).is_empty());
        let done = c.contribute(1, 2, wild(b"C"), t0);
        let got: Vec<_> = done.into_iter().map(|(t, r)| (t, r.unwrap())).collect();
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|(_, all)| &all[..] == b"BC"));
    }

    #[test]
    fn a_subset_completes_when_its_nodes_are_in() {
        let mut c = Coordinator::new(job());
        let t0 = Instant::now();
        // Ranks 2 and 4: nodes 1 and 2, node 0 not involved.
        assert!(
            c.contribute(1, 2, part(FENCE, &[2, 4], 0, b"C"), t0)
                .is_empty()
        );
        // Another subset, and the same subset's next fence, do not mix in.
        assert!(
            c.contribute(2, 1, part(FENCE, &[2, 5], 0, b"x"), t0)
                .is_empty()
        );
        assert!(
            c.contribute(3, 1, part(FENCE, &[2, 4], 1, b"y"), t0)
                .is_empty()
        );
        let mut done = c.contribute(4, 1, part(FENCE, &[2, 4], 0, b"B"), t0);
        done.sort_by_key(|(t, _)| *t);
        let bc = Ok(Bytes::from_static(b"BC"));
        assert_eq!(done, vec![(1, bc.clone()), (4, bc)]);
        // A node-local subset completes with its only node.
        assert_eq!(
            c.contribute(5, 1, part(GroupOp::Connect, &[2, 3], 0, b""), t0),
            vec![(5, Ok(Bytes::new()))]
        );
        assert_eq!(c.open.len(), 2);
    }

    #[test]
    fn refusals_name_the_reason() {
        let mut c = Coordinator::new(job());
        let t0 = Instant::now();
        let err = |a: Answers| a[0].1.clone().unwrap_err();
        assert!(
            err(c.contribute(1, 0, part(FENCE, &[2, 3], 0, b""), t0)).contains("node 0 hosts none")
        );
        assert!(
            err(c.contribute(1, 1, part(FENCE, &[9], 0, b""), t0))
                .contains("rank 9 is not in the job")
        );
        let other = Contribution {
            procs: vec![("k".into(), 0)],
            ..part(GroupOp::Connect, &[], 0, b"")
        };
        assert!(err(c.contribute(1, 0, other, t0)).contains("\"k\" is not served"));
        let mixed = Contribution {
            procs: vec![("j".into(), 0), ("k".into(), 0)],
            ..part(GroupOp::Connect, &[], 0, b"")
        };
        assert!(err(c.contribute(1, 0, mixed, t0)).contains("\"k\" is not served"));
        assert!(
            c.contribute(1, 1, part(FENCE, &[2, 4], 0, b""), t0)
                .is_empty()
        );
        assert!(err(c.contribute(2, 1, part(FENCE, &[2, 4], 0, b""), t0)).contains("twice"));
    }

    /// A parent and the child it spawned over the same overlay connect, then fence over
    /// both (Open MPI's `MPI_Comm_spawn` and `MPI_Comm_disconnect`).
    #[test]
    fn a_group_over_two_namespaces_gathers_the_nodes_of_both() {
        let served = Served::of_one(job());
        let mut child = (*job()).clone();
        child.job_id = "j.1".into();
        child.ranks = vec![vec![], vec![], vec![0, 1]];
        let (modex, _queue) = tokio::sync::mpsc::channel(1);
        assert!(served.add(std::sync::Arc::new(child), modex));
        let mut c = Coordinator::over(served);
        let t0 = Instant::now();
        let both = |data| Contribution {
            procs: vec![("j".into(), 0), ("j.1".into(), WILDCARD)],
            ..part(GroupOp::Connect, &[], 0, data)
        };
        assert!(c.contribute(1, 0, both(b"P"), t0).is_empty());
        assert!(
            c.contribute(9, 1, both(b""), t0)[0]
                .1
                .clone()
                .unwrap_err()
                .contains("node 1 hosts none")
        );
        let late = c.expire(t0 + Duration::from_secs(6));
        let why = late[0].1.clone().unwrap_err();
        assert!(why.contains("node 2 (c, j.1 ranks [0, 1])"), "{why}");
        assert!(c.contribute(1, 0, both(b"P"), t0).is_empty());
        let mut done = c.contribute(2, 2, both(b"C"), t0);
        done.sort_by_key(|(t, _)| *t);
        let pc = Ok(Bytes::from_static(b"PC"));
        assert_eq!(done, vec![(1, pc.clone()), (2, pc)]);
    }

    #[test]
    fn a_late_group_names_missing_nodes_and_ranks() {
        let mut c = Coordinator::new(job());
        let t0 = Instant::now();
        assert!(
            c.contribute(1, 0, part(GroupOp::Disconnect, &[0, 3, 5], 0, b""), t0)
                .is_empty()
        );
        assert!(
            c.contribute(2, 2, part(GroupOp::Disconnect, &[0, 3, 5], 0, b""), t0)
                .is_empty()
        );
        assert_eq!(c.next_deadline(), Some(t0 + Duration::from_secs(5)));
        assert!(c.expire(t0 + Duration::from_secs(4)).is_empty());
        let late = c.expire(t0 + Duration::from_secs(5));
        assert_eq!(late.len(), 2);
        let why = late[0].1.clone().unwrap_err();
        assert!(why.contains("node 1 (b, ranks [3])"), "{why}");
        assert!(!why.contains("node 2"), "{why}");
        assert_eq!(c.next_deadline(), None);
        // A whole namespace names every rank of the missing node.
        let whole = Contribution {
            procs: vec![("j".into(), WILDCARD)],
            ..part(FENCE, &[], 0, b"")
        };
        assert!(c.contribute(3, 0, whole, t0).is_empty());
        let why = c.expire(t0 + Duration::from_secs(5))[0]
            .1
            .clone()
            .unwrap_err();
        assert!(
            why.contains("node 1 (b, ranks [2, 3]), node 2 (c, ranks [4, 5])"),
            "{why}"
        );
    }

    #[test]
    fn namespaces_added_later_gather_their_own_nodes_and_removed_ones_are_refused() {
        let served = Served::of_one(job());
        let mut c = Coordinator::over(served.clone());
        let t0 = Instant::now();
        let child = |ranks: &[u32], data| Contribution {
            procs: ranks.iter().map(|&r| ("k".to_string(), r)).collect(),
            ..part(FENCE, &[], 0, data)
        };
        let err = |a: Answers| a[0].1.clone().unwrap_err();
        assert!(err(c.contribute(1, 1, child(&[0, 1], b""), t0)).contains("\"k\" is not served"));
        let mut k = (*job()).clone();
        k.job_id = "k".into();
        k.ranks = vec![vec![], vec![0], vec![1]];
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        assert!(served.add(std::sync::Arc::new(k), tx));
        // k's ranks 0 and 1 are on nodes 1 and 2 (j's ranks 0 and 1 are on node 0).
        assert!(c.contribute(2, 2, child(&[0, 1], b"C"), t0).is_empty());
        let done = c.contribute(3, 1, child(&[0, 1], b"B"), t0);
        assert_eq!(done.len(), 2);
        assert!(done.iter().all(|(_, r)| r.as_deref() == Ok(&b"BC"[..])));
        // j keeps its own placement meanwhile.
        let mine = c.contribute(4, 0, part(GroupOp::Connect, &[0, 1], 0, b""), t0);
        assert_eq!(mine, vec![(4, Ok(Bytes::new()))]);
        served.remove("k");
        assert!(err(c.contribute(5, 1, child(&[0, 1], b""), t0)).contains("removed"));
    }

    /// Every member node of a construct gets the same context id; the next group asking gets
    /// a greater one, and one not asking gets none.
    #[test]
    fn constructs_get_one_context_id_each() {
        let mut c = Coordinator::new(job());
        let t0 = Instant::now();
        let ctx = GroupOp::Construct { context_id: true };
        let answers = |a: Answers| -> Vec<Constructed> {
            a.into_iter()
                .map(|(_, r)| decode_constructed(&r.unwrap()).unwrap())
                .collect()
        };
        assert!(
            c.contribute(1, 0, part(ctx, &[0, 2], 0, b"A"), t0)
                .is_empty()
        );
        // A node-local group completes meanwhile, with its only node: id 1.
        let local = answers(c.contribute(2, 2, part(ctx, &[4, 5], 0, b"Y"), t0));
        assert_eq!(local.len(), 1);
        assert_eq!(local[0].context_id, Some(1));
        let first = answers(c.contribute(3, 1, part(ctx, &[0, 2], 0, b"B"), t0));
        let want = Constructed {
            context_id: Some(2),
            data: Bytes::from_static(b"AB"),
        };
        assert_eq!(first, vec![want.clone(), want]);
        let plain = GroupOp::Construct { context_id: false };
        let third = answers(c.contribute(5, 1, part(plain, &[2, 3], 0, b""), t0));
        assert_eq!(third[0].context_id, None);
        let next = answers(c.contribute(6, 1, part(ctx, &[2, 3], 0, b""), t0));
        assert_eq!(next[0].context_id, Some(3));
        // A destruct is answered like a connect: the data alone.
        let gone = c.contribute(7, 1, part(GroupOp::Destruct, &[2, 3], 0, b""), t0);
        assert_eq!(gone, vec![(7, Ok(Bytes::new()))]);
        assert!(decode_constructed(b"\xff\xff").is_err());
    }

    #[test]
    fn contributions_round_trip_and_garbage_is_refused() {
        let c = part(FENCE, &[1, 2], 3, b"data");
        assert_eq!(decode(&encode(&c)), Ok(c));
        assert!(
            decode(b"\xff")
                .unwrap_err()
                .starts_with("bad group request")
        );
    }
}
