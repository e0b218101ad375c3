//! Engines for n nodes wired together in memory: every algorithm, every size, no sockets.

use std::collections::VecDeque;

use greedy_tree::LaunchModel;

use super::*;
use crate::JobSecret;

fn job(n: usize, node_idx: usize) -> JobSpec {
    JobSpec {
        job_id: "t".into(),
        hosts: (0..n).map(|i| format!("h{i}")).collect(),
        node_idx,
        model: LaunchModel::default(),
        ranks: (0..n as u32).map(|i| vec![2 * i, 2 * i + 1]).collect(),
        secret: JobSecret::from_bytes(&[1; 16]).unwrap(),
    }
}

struct Cluster {
    engines: Vec<Engine>,
    queue: VecDeque<(usize, usize, Message)>,
    done: Vec<Vec<(u64, Result<Outcome, String>)>>,
    aborted: Vec<Option<AbortInfo>>,
    sent_bytes: u64,
}

impl Cluster {
    fn new(n: usize, rule: AllgatherRule) -> Self {
        let tree = greedy_tree::greedy(n, &LaunchModel::default());
        let topo = std::sync::Arc::new(tree);
        Cluster {
            engines: (0..n)
                .map(|i| Engine::new(job(n, i), topo.clone(), rule, Duration::from_secs(5)))
                .collect(),
            queue: VecDeque::new(),
            done: vec![Vec::new(); n],
            aborted: vec![None; n],
            sent_bytes: 0,
        }
    }

    fn absorb(&mut self, from: usize, outputs: Vec<Output>) {
        for o in outputs {
            match o {
                Output::Send { to, msg } => {
                    match &msg {
                        Message::Ring { blob, .. } => self.sent_bytes += blob.len() as u64,
                        Message::Bruck { blobs, .. } => {
                            self.sent_bytes +=
                                blobs.iter().map(|(_, b)| b.len() as u64).sum::<u64>()
                        }
                        _ => {}
                    }
                    self.queue.push_back((from, to, msg))
                }
                Output::Done { seq, result } => {
                    self.done[from].push((seq, result.map_err(|e| e.to_string())))
                }
                Output::Aborted(info) => self.aborted[from] = Some(info),
            }
        }
    }

    fn start(&mut self, node: usize, op: Op, blob: &[u8]) {
        self.start_with(node, op, blob, false);
    }

    fn start_with(&mut self, node: usize, op: Op, blob: &[u8], tree_only: bool) {
        let mut out = Vec::new();
        self.engines[node].start(
            op,
            Bytes::copy_from_slice(blob),
            Instant::now(),
            None,
            tree_only,
            &mut out,
        );
        self.absorb(node, out);
    }

    /// Delivers queued messages, newest first when `lifo` (a harsh reordering), until quiet.
    fn run(&mut self, lifo: bool) {
        self.run_seeing(lifo, |_, _| true);
    }

    /// As [`Cluster::run`], showing `see` each message with its sender first; the message is
    /// lost when `see` says false.
    fn run_seeing(&mut self, lifo: bool, mut see: impl FnMut(usize, &Message) -> bool) {
        while let Some((from, to, msg)) = if lifo {
            self.queue.pop_back()
        } else {
            self.queue.pop_front()
        } {
            if see(from, &msg) {
                let mut out = Vec::new();
                self.engines[to].on_message(from, msg, &mut out);
                self.absorb(to, out);
            }
        }
    }
}

fn blob(i: usize, size: usize) -> Vec<u8> {
    (0..size).map(|k| (i * 31 + k) as u8).collect()
}

fn check_allgather(n: usize, size: usize, rule: AllgatherRule, lifo: bool) {
    let mut c = Cluster::new(n, rule);
    // Start in a scrambled order so early messages get buffered.
    for i in (0..n).rev() {
        c.start(i, Op::Allgather, &blob(i, size));
        if i % 2 == 0 {
            c.run(lifo);
        }
    }
    c.run(lifo);
    let expect: Vec<Bytes> = (0..n).map(|i| Bytes::from(blob(i, size))).collect();
    for node in 0..n {
        assert_eq!(
            c.done[node],
            vec![(0, Ok(Outcome::Allgather(expect.clone())))],
            "n={n} size={size} node={node}"
        );
    }
    let off_tree = (size * n) as u64 > rule.tree_max;
    if off_tree && n > 1 {
        // Every node sends every other node's blob once, on the ring and in Bruck's rounds.
        assert_eq!(c.sent_bytes, (n * (n - 1) * size) as u64, "n={n}");
    } else {
        assert_eq!(c.sent_bytes, 0);
    }
}

#[test]
fn allgather_tree_ring_and_bruck_give_every_blob_by_node_index() {
    for n in [1, 2, 3, 5, 8, 17] {
        for (size, threshold) in [(0, 1024), (10, 1024), (100, 50), (100, 0), (7, 1)] {
            for rule in [
                AllgatherRule::ring_above(threshold),
                AllgatherRule::bruck_above(threshold),
            ] {
                check_allgather(n, size, rule, false);
                check_allgather(n, size, rule, true);
            }
        }
    }
}

#[test]
fn past_the_tree_the_root_picks_the_ring_for_few_nodes_and_bruck_for_more() {
    let rule = AllgatherRule {
        tree_max: 100,
        ring_max_nodes: 8,
    };
    let cases: [(usize, usize, &[&str]); 4] = [
        (8, 10, &[]),
        (9, 10, &[]),
        (8, 50, &["ring"]),
        (9, 50, &["bruck"]),
    ];
    for (n, size, expect) in cases {
        let mut c = Cluster::new(n, rule);
        let mut kinds = BTreeSet::new();
        for i in 0..n {
            c.start(i, Op::Allgather, &blob(i, size));
        }
        c.run_seeing(false, |_, msg| {
            if matches!(msg, Message::Ring { .. } | Message::Bruck { .. }) {
                kinds.insert(msg.kind());
            }
            true
        });
        assert!(c.done.iter().all(|d| matches!(&d[..], [(0, Ok(_))])));
        let kinds: Vec<&str> = kinds.into_iter().collect();
        assert_eq!(kinds, expect, "{n} nodes, {size} bytes each");
    }
}

#[test]
fn bruck_takes_ceil_log2_n_messages_per_node() {
    for n in [2, 3, 7, 8, 9, 33] {
        let mut c = Cluster::new(n, AllgatherRule::bruck_above(0));
        let mut sent = vec![0u32; n];
        for i in 0..n {
            c.start(i, Op::Allgather, &blob(i, 3));
        }
        c.run_seeing(true, |from, msg| {
            if matches!(msg, Message::Bruck { .. }) {
                sent[from] += 1;
            }
            true
        });
        let rounds = n.next_power_of_two().trailing_zeros();
        assert!(sent.iter().all(|&s| s == rounds), "n={n}: {sent:?}");
        assert!(c.done.iter().all(|d| matches!(&d[..], [(0, Ok(_))])));
    }
}

#[test]
fn a_bruck_message_from_the_wrong_node_is_ignored() {
    let n = 4;
    let mut c = Cluster::new(n, AllgatherRule::bruck_above(0));
    for i in 0..n {
        c.start(i, Op::Allgather, &blob(i, 3));
    }
    // Node 3's Bruck messages are lost: node 2 waits for its round 0.
    c.run_seeing(false, |from, msg| {
        from != 3 || !matches!(msg, Message::Bruck { .. })
    });
    assert!(c.done[2].is_empty());
    // Node 1 sends what node 3 should have: node 2 does not take it.
    let forged = Message::Bruck {
        seq: 0,
        round: 0,
        blobs: vec![(3, Bytes::from(blob(3, 3)))],
    };
    let mut out = Vec::new();
    c.engines[2].on_message(1, forged, &mut out);
    assert!(out.is_empty(), "{out:?}");
    let mut out = Vec::new();
    c.engines[2].on_timeout(Instant::now() + Duration::from_secs(3600), &mut out);
    let Some(Output::Done { result: Err(e), .. }) = out.first() else {
        panic!("{out:?}")
    };
    // Node 2 holds only its own blob still.
    assert!(
        e.to_string()
            .ends_with("no contribution from nodes 0-1,3 (hosts h0,h1,h3; ranks 0-3,6-7)"),
        "{e}"
    );
}

#[test]
fn mixed_sizes_pick_the_same_algorithm_everywhere() {
    // Only node 3 is big; everyone must still agree on the ring.
    let n = 6;
    let mut c = Cluster::new(n, AllgatherRule::ring_above(100));
    for i in 0..n {
        let size = if i == 3 { 500 } else { 1 };
        c.start(i, Op::Allgather, &blob(i, size));
    }
    c.run(false);
    for node in 0..n {
        let Ok(Outcome::Allgather(all)) = &c.done[node][0].1 else {
            panic!("{:?}", c.done[node])
        };
        assert_eq!(all[3].len(), 500);
    }
    assert!(c.sent_bytes > 0, "ring used");
}

#[test]
fn barrier_broadcast_gather_in_sequence() {
    let n = 7;
    let mut c = Cluster::new(n, AllgatherRule::ring_above(1 << 20));
    for i in 0..n {
        c.start(i, Op::Barrier, b"");
        c.start(i, Op::Broadcast, if i == 0 { b"hello" } else { b"ignored" });
        c.start(i, Op::Gather, &[i as u8]);
    }
    c.run(true);
    for node in 0..n {
        let gathered = if node == 0 {
            Some((0..n as u8).map(|i| Bytes::from(vec![i])).collect())
        } else {
            None
        };
        let mut got = c.done[node].clone();
        got.sort_by_key(|(seq, _)| *seq);
        assert_eq!(
            got,
            vec![
                (0, Ok(Outcome::Barrier)),
                (1, Ok(Outcome::Broadcast(Bytes::from_static(b"hello")))),
                (2, Ok(Outcome::Gather(gathered))),
            ],
            "node {node}"
        );
    }
}

#[test]
fn timeout_names_missing_nodes_and_ranks_then_aborts_everyone() {
    let n = 8;
    let mut c = Cluster::new(n, AllgatherRule::ring_above(1 << 20));
    let tree = greedy_tree::greedy(n, &LaunchModel::default());
    let late = n - 1;
    for i in 0..n {
        if i != late {
            c.start(i, Op::Allgather, b"x");
        }
    }
    c.run(false);
    let parent = tree.parent(late).unwrap();
    let mut out = Vec::new();
    // Deadlines are staggered by depth; an hour later every one has passed.
    c.engines[parent].on_timeout(Instant::now() + Duration::from_secs(3600), &mut out);
    c.absorb(parent, out);
    c.run(false);
    let (seq, err) = &c.done[parent][0];
    assert_eq!(*seq, 0);
    let err = err.as_ref().unwrap_err();
    assert!(
        err.starts_with(&format!("node {parent}: allgather #0 timed out after ")),
        "{err}"
    );
    assert!(
        err.ends_with("; no contribution from nodes 7 (hosts h7; ranks 14-15)"),
        "{err}"
    );
    for node in 0..n {
        let info = c.aborted[node]
            .as_ref()
            .unwrap_or_else(|| panic!("node {node} not aborted"));
        assert_eq!(info.origin_node, parent);
        if node != parent && node != late {
            assert!(
                c.done[node][0]
                    .1
                    .as_ref()
                    .unwrap_err()
                    .starts_with("job aborted by node"),
                "{:?}",
                c.done[node]
            );
        }
    }
    // A collective started after the abort fails at once.
    c.start(late, Op::Barrier, b"");
    assert!(c.done[late].last().unwrap().1.is_err());
}

#[test]
fn tree_only_allgather_ignores_the_threshold() {
    // The overlay's join gathers the addresses the ring would need, so it must stay on the tree.
    let n = 5;
    let mut c = Cluster::new(n, AllgatherRule::ring_above(0));
    for i in 0..n {
        c.start_with(i, Op::Allgather, &blob(i, 100), true);
    }
    c.run(false);
    assert_eq!(c.sent_bytes, 0, "no ring traffic");
    assert!(
        c.done
            .iter()
            .all(|d| matches!(&d[0].1, Ok(Outcome::Allgather(all)) if all.len() == n))
    );
}

impl Cluster {
    /// Node `gone` said `Bye` to its tree neighbours.
    fn depart(&mut self, gone: usize) {
        let tree = self.engines[0].topo.clone();
        let neighbours: Vec<usize> = tree
            .parent(gone)
            .into_iter()
            .chain(tree.children(gone))
            .collect();
        for n in neighbours {
            let mut out = Vec::new();
            self.engines[n].neighbour_left(gone, &mut out);
            self.absorb(n, out);
        }
    }
}

#[test]
fn a_neighbour_that_left_fails_the_collective_waiting_for_it_at_once() {
    // Node 3's ranks ended 0 without a word (singletons) and its agent left; the others fence.
    let n = 6;
    let mut c = Cluster::new(n, AllgatherRule::ring_above(1 << 20));
    for i in (0..n).filter(|&i| i != 3) {
        c.start(i, Op::Allgather, &blob(i, 4));
    }
    c.run(false);
    assert!(c.aborted.iter().all(Option::is_none), "waiting, not failed");
    c.depart(3);
    c.run(false);
    for node in (0..n).filter(|&i| i != 3) {
        let info = c.aborted[node].as_ref().expect("every other node aborted");
        assert!(
            info.reason
                .starts_with("nodes 3 (hosts h3; ranks 6-7) left the job while allgather 0")
                && info.reason.contains("singletons"),
            "{info:?}"
        );
        assert!(
            matches!(&c.done[node][..], [(0, Err(_))]),
            "{:?}",
            c.done[node]
        );
    }
}

#[test]
fn a_neighbour_that_left_after_the_last_collective_fails_nothing_until_one_needs_it() {
    let n = 5;
    let mut c = Cluster::new(n, AllgatherRule::ring_above(1 << 20));
    for i in 0..n {
        c.start(i, Op::Barrier, b"");
    }
    c.run(false);
    // Every node is done; node 4 leaves, as at the end of every job.
    c.depart(4);
    c.run(false);
    assert!(c.aborted.iter().all(Option::is_none));
    // A later collective that needs node 4 fails at once where it is started.
    let tree = c.engines[0].topo.clone();
    let parent = tree.parent(4).unwrap();
    c.start(parent, Op::Barrier, b"");
    c.run(false);
    assert!(
        c.aborted[parent]
            .as_ref()
            .is_some_and(|i| i.reason.contains("barrier 1"))
    );
}

#[test]
fn a_node_leaving_mid_join_is_left_to_the_join_timeout() {
    let n = 4;
    let mut c = Cluster::new(n, AllgatherRule::ring_above(1 << 20));
    for i in 0..n - 1 {
        c.start_with(i, Op::Allgather, &blob(i, 4), true);
    }
    c.depart(n - 1);
    c.run(false);
    assert!(c.aborted.iter().all(Option::is_none));
}

proptest::proptest! {
    /// Bruck's and the ring's allgathers give every node every blob, for any number of nodes
    /// and any order of delivery.
    #[test]
    fn off_tree_allgathers_survive_any_delivery_order(
        n in 1usize..40,
        size in 0usize..24,
        bruck in proptest::bool::ANY,
        picks in proptest::collection::vec(proptest::num::usize::ANY, 1..64),
    ) {
        let rule = if bruck { AllgatherRule::bruck_above(0) } else { AllgatherRule::ring_above(0) };
        let mut c = Cluster::new(n, rule);
        for i in 0..n {
            c.start(i, Op::Allgather, &blob(i, size));
        }
        let mut step = 0;
        while !c.queue.is_empty() {
            let at = picks[step % picks.len()] % c.queue.len();
            step += 1;
            let (from, to, msg) = c.queue.remove(at).expect("in range");
            let mut out = Vec::new();
            c.engines[to].on_message(from, msg, &mut out);
            c.absorb(to, out);
        }
        let expect: Vec<Bytes> = (0..n).map(|i| Bytes::from(blob(i, size))).collect();
        for node in 0..n {
            proptest::prop_assert_eq!(&c.done[node], &vec![(0, Ok(Outcome::Allgather(expect.clone())))]);
        }
    }
}
