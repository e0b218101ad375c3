//! How a job ends from each node (`NodeService::watch_end`), over real sockets: the node an
//! abort started on reports and kills once, the others only see it; a node that cannot join
//! takes the launcher's word as its abort.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use greedy_pmix::{
    AbortInfo, JobSecret, JobSpec, WallTime,
    family::Family,
    node::{
        NodeConfig, NodeService,
        job_end::{EndPolicy, JobEnd, Kill},
    },
    peer::JobProcesses,
    rendezvous::Memory,
};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// A launcher that writes down what the rule asks of it, and whose word on the job's end is
/// `end` (none: it has none to give).
struct Recorder {
    node: usize,
    calls: Arc<Mutex<Vec<String>>>,
    end: Option<AbortInfo>,
}

impl JobEnd for Recorder {
    async fn aborted(&self, abort: &AbortInfo, _service: &NodeService) {
        self.note(format!("aborted from {}", abort.origin_node));
    }

    async fn report(&self, code: i32, abort: &AbortInfo) {
        self.note(format!("report {code} from {}", abort.origin_node));
    }

    fn kill(&self, why: Kill) {
        self.note(format!("kill {why:?}"));
    }

    async fn hear_end(&self) -> Result<AbortInfo, String> {
        match &self.end {
            Some(end) => Ok(end.clone()),
            None => std::future::pending().await,
        }
    }
}

impl Recorder {
    fn note(&self, what: String) {
        self.calls
            .lock()
            .unwrap()
            .push(format!("{}: {what}", self.node));
    }
}

fn job(node_idx: usize, n_nodes: usize, secret: &JobSecret) -> JobSpec {
    JobSpec {
        job_id: "end-test".into(),
        hosts: (0..n_nodes).map(|i| format!("h{i}")).collect(),
        node_idx,
        model: Default::default(),
        ranks: (0..n_nodes as u32).map(|r| vec![r]).collect(),
        secret: secret.clone(),
    }
}

/// Node `node_idx` of an `n_nodes` PMI job (one rank per node) on loopback, joining within
/// `join_timeout`.
async fn service(
    node_idx: usize,
    n_nodes: usize,
    secret: &JobSecret,
    board: &Memory,
    join_timeout: Duration,
) -> NodeService {
    let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    let admit = JobProcesses::descendants_of(std::os::unix::process::parent_id(), uid.unwrap());
    let mut config = NodeConfig::new("127.0.0.1".parse().unwrap(), admit, &[Family::Pmi]).unwrap();
    config.overlay.join_timeout = join_timeout;
    let (out, _) = mpsc::channel(1);
    let spec = job(node_idx, n_nodes, secret);
    NodeService::start(&spec, config, board.clone(), &CancellationToken::new(), out)
        .await
        .unwrap()
}

fn policy() -> EndPolicy {
    EndPolicy {
        kill_again: vec![Duration::from_millis(50)],
        kill_stragglers: vec![Duration::from_millis(100)],
        hear_end_after: Some(Duration::from_millis(100)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_an_abort_started_on_reports_and_kills_once() {
    let (board, secret) = (Memory::default(), JobSecret::generate());
    let calls = Arc::new(Mutex::new(Vec::new()));
    let mut nodes = Vec::new();
    let mut watches = Vec::new();
    // Node 1's rank still runs; node 0's ended with the abort.
    let (_running0, ended) = watch::channel(0);
    let (running1, still) = watch::channel(1);
    for (i, running) in [ended, still].into_iter().enumerate() {
        let node = service(i, 2, &secret, &board, Duration::from_secs(10)).await;
        let end = Recorder {
            node: i,
            calls: calls.clone(),
            end: None,
        };
        watches.push(node.watch_end(Arc::new(end), policy(), running));
        nodes.push(node);
    }
    for node in &nodes {
        node.overlay().joined().await.unwrap();
    }
    // Rank 0 fails before finalize: node 0 aborts the job.
    nodes[0].rank_exited(0, 3).await;
    for watch in watches {
        tokio::time::timeout(Duration::from_secs(10), watch)
            .await
            .expect("the watch ends once the ranks have")
            .unwrap();
    }
    drop(running1);
    let mut calls = calls.lock().unwrap().clone();
    calls.sort();
    assert_eq!(
        calls,
        [
            "0: aborted from 0",
            "0: kill Ending",
            "0: report 3 from 0",
            "1: aborted from 0",
            "1: kill Stragglers { running: 1 }",
        ]
    );
    for node in nodes {
        node.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_cannot_join_takes_the_launchers_word_as_its_abort() {
    let secret = JobSecret::generate();
    let calls = Arc::new(Mutex::new(Vec::new()));
    // Node 0 never comes: node 1's join waits.
    let node1 = service(1, 2, &secret, &Memory::default(), Duration::from_secs(30)).await;
    let word = AbortInfo {
        origin_node: 0,
        rank: None,
        code: 7,
        reason: "rank 0 exited with code 7".into(),
        at: WallTime::now(),
    };
    let end = Recorder {
        node: 1,
        calls: calls.clone(),
        end: Some(word),
    };
    let (_running, none) = watch::channel(0);
    let watch = node1.watch_end(Arc::new(end), policy(), none);
    tokio::time::timeout(Duration::from_secs(5), watch)
        .await
        .expect("heard within 5 s")
        .unwrap();
    let abort = node1.overlay().aborted().borrow().clone().unwrap();
    assert_eq!((abort.origin_node, abort.code), (0, 7), "{abort}");
    // Not this node's abort: it neither reports nor kills.
    assert_eq!(*calls.lock().unwrap(), ["1: aborted from 0"]);
    node1.shutdown().await;
}
