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
    fn new(n: usize, threshold: u64) -> Self {
        let tree = greedy_tree::greedy(n, &LaunchModel::default());
        let topo = std::sync::Arc::new(tree);
        Cluster {
            engines: (0..n)
                .map(|i| Engine::new(job(n, i), topo.clone(), threshold, Duration::from_secs(5)))
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
                    if let Message::Ring { blob, .. } = &msg {
                        self.sent_bytes += blob.len() as u64;
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
        while let Some((from, to, msg)) = if lifo {
            self.queue.pop_back()
        } else {
            self.queue.pop_front()
        } {
            let mut out = Vec::new();
            self.engines[to].on_message(from, msg, &mut out);
            self.absorb(to, out);
        }
    }
}

fn blob(i: usize, size: usize) -> Vec<u8> {
    (0..size).map(|k| (i * 31 + k) as u8).collect()
}

fn check_allgather(n: usize, size: usize, threshold: u64, lifo: bool) {
    let mut c = Cluster::new(n, threshold);
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
    let ring = (size * n) as u64 > threshold;
    if ring && n > 1 {
        // Every blob crosses n-1 ring links.
        assert_eq!(c.sent_bytes, (n * (n - 1) * size) as u64, "n={n}");
    } else {
        assert_eq!(c.sent_bytes, 0);
    }
}

#[test]
fn allgather_tree_and_ring_give_every_blob_by_node_index() {
    for n in [1, 2, 3, 5, 8, 17] {
        for (size, threshold) in [(0, 1024), (10, 1024), (100, 50), (100, 0), (7, 1)] {
            check_allgather(n, size, threshold, false);
            check_allgather(n, size, threshold, true);
        }
    }
}

#[test]
fn mixed_sizes_pick_the_same_algorithm_everywhere() {
    // Only node 3 is big; everyone must still agree on the ring.
    let n = 6;
    let mut c = Cluster::new(n, 100);
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
    let mut c = Cluster::new(n, 1 << 20);
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
    let mut c = Cluster::new(n, 1 << 20);
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
    let mut c = Cluster::new(n, 0);
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
    let mut c = Cluster::new(n, 1 << 20);
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
    let mut c = Cluster::new(n, 1 << 20);
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
    let mut c = Cluster::new(n, 1 << 20);
    for i in 0..n - 1 {
        c.start_with(i, Op::Allgather, &blob(i, 4), true);
    }
    c.depart(n - 1);
    c.run(false);
    assert!(c.aborted.iter().all(Option::is_none));
}
