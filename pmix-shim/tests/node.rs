//! The node service over real sockets: every family offered at once, ranks served by the one
//! they speak, a job mixing two families ended naming a rank of each, ranks started before
//! the node has joined.
//!
//! One PMIx server per process (libpmix), so node 0 serves every family and the other nodes
//! PMI and Charm++; the scripted clients speak PMI-1 and netlrts.

mod common;

use std::time::Duration;

use greedy_pmix::{
    AbortInfo, JobSecret, JobSpec,
    family::Family,
    node::{MPICH_PMI_VERSION, NodeConfig, NodeService, RankWireup},
    peer::JobProcesses,
    rendezvous::Memory,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpStream, UnixStream},
    sync::mpsc,
};
use tokio_util::sync::CancellationToken;

const JOB: &str = "node-test";

fn job(node_idx: usize, ranks: &[Vec<u32>], secret: &JobSecret) -> JobSpec {
    JobSpec {
        job_id: JOB.into(),
        hosts: (0..ranks.len()).map(|i| format!("h{i}")).collect(),
        node_idx,
        model: Default::default(),
        ranks: ranks.to_vec(),
        secret: secret.clone(),
    }
}

/// This test process plays every rank: admit it as a descendant of its parent.
fn admit_this_process() -> JobProcesses {
    let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    JobProcesses::descendants_of(std::os::unix::process::parent_id(), uid.unwrap())
}

/// Node `node_idx`'s service on loopback: every family on node 0 if `pmix`, PMI and
/// Charm++ elsewhere (libpmix serves once per process, so one test only may ask).
async fn service(
    node_idx: usize,
    ranks: &[Vec<u32>],
    secret: &JobSecret,
    board: &Memory,
    pmix: bool,
) -> NodeService {
    let families: &[Family] = if node_idx == 0 && pmix {
        &Family::ALL
    } else {
        &[Family::Pmi, Family::Charm]
    };
    let mut config =
        NodeConfig::new("127.0.0.1".parse().unwrap(), admit_this_process(), families).unwrap();
    config.overlay.collective_timeout = Duration::from_secs(20);
    config.scratch = std::env::temp_dir();
    let (out, mut out_rx) = mpsc::channel(64);
    tokio::spawn(async move { while out_rx.recv().await.is_some() {} });
    let spec = job(node_idx, ranks, secret);
    NodeService::start(&spec, config, board.clone(), &CancellationToken::new(), out)
        .await
        .expect("service starts")
}

async fn services(ranks: &[Vec<u32>], pmix: bool) -> Vec<NodeService> {
    let (board, secret) = (Memory::default(), JobSecret::generate());
    let mut out = Vec::new();
    for i in 0..ranks.len() {
        out.push(service(i, ranks, &secret, &board, pmix).await);
    }
    out
}

async fn stop(services: Vec<NodeService>) {
    for s in services {
        s.shutdown().await;
    }
}

fn var<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
    env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// A PMI-1 client of `rank`: its socket, from the rank's wire-up.
async fn pmi_client(node: &NodeService, rank: u32) -> UnixStream {
    socket(node.env_for(rank, Some(3)).await.unwrap())
}

fn socket(wireup: RankWireup) -> UnixStream {
    let fd = wireup.pmi_fd.expect("PMI is served");
    let s = std::os::unix::net::UnixStream::from(fd);
    s.set_nonblocking(true).unwrap();
    UnixStream::from_std(s).unwrap()
}

async fn line<S: AsyncReadExt + Unpin>(s: &mut S) -> String {
    let mut out = Vec::new();
    loop {
        let mut b = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut b))
            .await
            .expect("a reply within 10 s")
            .unwrap();
        if b[0] == b'\n' {
            return String::from_utf8(out).unwrap();
        }
        out.push(b[0]);
    }
}

async fn ask(s: &mut UnixStream, text: &str) -> String {
    s.write_all(text.as_bytes()).await.unwrap();
    line(s).await
}

/// Connects as netlrts `rank`, the way libcharm does.
async fn charm_client(node: &NodeService, rank: u32) -> TcpStream {
    let env = node.env_for(rank, Some(3)).await.unwrap().env;
    common::charm_connect(&env, rank).await
}

async fn abort_of(node: &NodeService) -> AbortInfo {
    let mut aborted = node.overlay().aborted();
    tokio::time::timeout(Duration::from_secs(10), aborted.wait_for(Option::is_some))
        .await
        .expect("an abort within 10 s")
        .unwrap()
        .clone()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_family_is_offered_and_pmi_ranks_wire_up_across_nodes() {
    let ranks = vec![vec![0, 1], vec![2]];
    let nodes = services(&ranks, true).await;
    // Node 0 offers all three families, and the default that keeps MPICH from refusing the
    // union; node 1 (no PMIx here) offers PMI and Charm++ only, and needs no default.
    let w0 = nodes[0].env_for(0, Some(3)).await.unwrap();
    let w = nodes[0].env_for(1, Some(3)).await.unwrap();
    assert_eq!(var(&w.env, "PMI_FD"), Some("3"));
    assert_eq!(var(&w.env, "PMI_RANK"), Some("1"));
    assert_eq!(var(&w.env, "PMIX_RANK"), Some("1"));
    assert_eq!(var(&w.env, "PMIX_NAMESPACE"), Some(JOB));
    // Each client keeps its own copy of the job's data: no 8 MiB shared store per node.
    assert_eq!(var(&w.env, "PMIX_GDS_MODULE"), Some("hash"));
    assert!(var(&w.env, "NETSTART").is_some_and(|v| v.starts_with("1 127.0.0.1 ")));
    assert_eq!(
        w.defaults,
        [(MPICH_PMI_VERSION.0.into(), MPICH_PMI_VERSION.1.into())]
    );
    let w2 = nodes[1].env_for(2, None).await.unwrap();
    let own = std::os::fd::AsRawFd::as_raw_fd(w2.pmi_fd.as_ref().unwrap());
    assert_eq!(
        var(&w2.env, "PMI_FD"),
        Some(own.to_string().as_str()),
        "inherited as it is"
    );
    assert!(var(&w2.env, "PMIX_RANK").is_none() && w2.defaults.is_empty());

    let mut clients = Vec::new();
    for (rank, wireup) in [(0, w0), (1, w), (2, w2)] {
        let mut c = socket(wireup);
        assert_eq!(
            ask(&mut c, "cmd=init pmi_version=1 pmi_subversion=1\n").await,
            "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0"
        );
        let put = format!("cmd=put kvsname={JOB} key=k{rank} value=v{rank}\n");
        assert_eq!(ask(&mut c, &put).await, "cmd=put_result rc=0 msg=success");
        c.write_all(b"cmd=barrier_in\n").await.unwrap();
        clients.push((rank, c));
    }
    for (_, c) in &mut clients {
        assert_eq!(line(c).await, "cmd=barrier_out rc=0");
    }
    for (rank, c) in &mut clients {
        let other = (*rank + 1) % 3;
        let get = format!("cmd=get kvsname={JOB} key=k{other}\n");
        assert_eq!(
            ask(c, &get).await,
            format!("cmd=get_result rc=0 msg=success value=v{other}")
        );
        assert_eq!(nodes[0].overlay().aborted().borrow().clone(), None);
    }
    assert_eq!(nodes[0].family_of(0), Some(Family::Pmi));
    assert_eq!(nodes[0].fences(), 1);
    stop(nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_families_on_two_nodes_end_the_job_naming_a_rank_of_each() {
    let ranks = vec![vec![0], vec![1]];
    let nodes = services(&ranks, false).await;
    let mut pmi = pmi_client(&nodes[0], 0).await;
    ask(&mut pmi, "cmd=init pmi_version=1 pmi_subversion=1\n").await;
    pmi.write_all(b"cmd=barrier_in\n").await.unwrap();
    let _charm = charm_client(&nodes[1], 1).await;
    let info = abort_of(&nodes[0]).await;
    assert!(
        info.reason
            .starts_with("rank 0 on h0 speaks PMI-1/PMI-2 while rank 1 on h1 speaks Charm++"),
        "{info}"
    );
    assert_eq!(abort_of(&nodes[1]).await.reason, info.reason, "one message");
    stop(nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_families_on_one_node_end_the_job_at_the_second_ones_first_word() {
    let ranks = vec![vec![0, 1], vec![2]];
    let nodes = services(&ranks, false).await;
    let mut pmi = pmi_client(&nodes[0], 0).await;
    ask(&mut pmi, "cmd=init pmi_version=1 pmi_subversion=1\n").await;
    let _charm = charm_client(&nodes[0], 1).await;
    let info = abort_of(&nodes[0]).await;
    assert_eq!(info.rank, Some(1), "{info}");
    assert!(
        info.reason
            .starts_with("rank 1 speaks Charm++ netlrts while rank 0 speaks PMI-1/PMI-2"),
        "{info}"
    );
    stop(nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_start_before_their_node_has_joined_and_wire_up_once_it_has() {
    let ranks = vec![vec![0], vec![1]];
    let (board, secret) = (Memory::default(), JobSecret::generate());
    let node0 = service(0, &ranks, &secret, &board, false).await;
    // Node 1 is not there yet: node 0 serves its rank anyway.
    let mut c0 = pmi_client(&node0, 0).await;
    ask(&mut c0, "cmd=init pmi_version=1 pmi_subversion=1\n").await;
    c0.write_all(b"cmd=barrier_in\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let node1 = service(1, &ranks, &secret, &board, false).await;
    let mut c1 = pmi_client(&node1, 1).await;
    ask(&mut c1, "cmd=init pmi_version=1 pmi_subversion=1\n").await;
    c1.write_all(b"cmd=barrier_in\n").await.unwrap();
    assert_eq!(line(&mut c0).await, "cmd=barrier_out rc=0");
    assert_eq!(line(&mut c1).await, "cmd=barrier_out rc=0");
    node0.overlay().joined().await.unwrap();
    stop(vec![node0, node1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_that_times_out_aborts_the_job_saying_why() {
    let ranks = vec![vec![0], vec![1]];
    let secret = JobSecret::generate();
    let mut config = NodeConfig::new(
        "127.0.0.1".parse().unwrap(),
        admit_this_process(),
        &[Family::Pmi],
    )
    .unwrap();
    config.overlay.join_timeout = Duration::from_millis(300);
    let (out, _rx) = mpsc::channel(1);
    // Node 1 waits for node 0, which never comes.
    let node1 = NodeService::start(
        &job(1, &ranks, &secret),
        config,
        Memory::default(),
        &CancellationToken::new(),
        out,
    )
    .await
    .unwrap();
    let info = abort_of(&node1).await;
    assert!(info.reason.contains("join_timeout"), "{info}");
    assert!(node1.overlay().joined().await.is_err());
    node1.shutdown().await;
}
