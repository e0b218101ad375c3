//! The netlrts service over real sockets with scripted clients: how a job ends (`die` for a
//! rank that ended with 0, a close for the others), the end marker of each rank's output, and
//! a `CmiAbort` message on the rank's stderr.

mod common;

use std::net::Ipv4Addr;
use std::time::Duration;

use greedy_pmix::{
    AbortInfo, JobSecret, JobSpec,
    charm::{
        self,
        server::{CharmConfig, CharmServer, Output, ScanfRequest},
    },
    overlay::{Overlay, OverlayConfig},
    peer::JobProcesses,
    rendezvous::Memory,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    sync::mpsc,
};

/// Two agents with two ranks each; every print and end marker of the job in one channel;
/// `scanf` requests to `scanf` if given.
async fn agents(
    scanf: Option<mpsc::Sender<ScanfRequest>>,
) -> (Vec<(Overlay, CharmServer)>, mpsc::Receiver<Output>) {
    // This test process plays every rank: admit it as a descendant of its parent.
    let me = JobProcesses::of_this_process().unwrap();
    let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    let admit = JobProcesses::descendants_of(std::os::unix::process::parent_id(), uid.unwrap());
    assert_ne!(admit, me);
    agents_admitting(scanf, admit).await
}

/// [`agents`] whose servers admit `admit`'s processes.
async fn agents_admitting(
    scanf: Option<mpsc::Sender<ScanfRequest>>,
    admit: JobProcesses,
) -> (Vec<(Overlay, CharmServer)>, mpsc::Receiver<Output>) {
    let board = Memory::default();
    let secret = JobSecret::generate();
    let (tx, rx) = mpsc::channel(64);
    let mut tasks = Vec::new();
    for node_idx in 0..2usize {
        let job = JobSpec {
            job_id: "charm-test".into(),
            hosts: vec!["h0".into(), "h1".into()],
            node_idx,
            model: Default::default(),
            ranks: vec![vec![0, 1], vec![2, 3]],
            secret: secret.clone(),
        };
        let (board, tx, scanf) = (board.clone(), tx.clone(), scanf.clone());
        tasks.push(tokio::spawn(async move {
            let config = OverlayConfig {
                collective_timeout: Duration::from_secs(20),
                ..Default::default()
            };
            let overlay = Overlay::start(&job, config, &board).await.unwrap();
            let mut config = CharmConfig::new(Ipv4Addr::LOCALHOST, admit);
            config.scanf = scanf;
            let charm = CharmServer::start(&job, overlay.clone(), config, tx)
                .await
                .unwrap();
            (overlay, charm)
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    (out, rx)
}

/// Connects as `rank` the way libcharm does: NETSTART's address, then `initnode`.
async fn connect(server: &CharmServer, rank: u32) -> TcpStream {
    common::charm_connect(&server.env_for(rank), rank).await
}

/// Reads one frame's type and payload; `None` at EOF.
async fn frame(s: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut hdr = [0u8; charm::HEADER_LEN];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut hdr))
        .await
        .expect("a frame or EOF within 10 s")
        .ok()?;
    let len = u32::from_be_bytes(hdr[..4].try_into().unwrap()) as usize;
    let kind = String::from_utf8_lossy(&hdr[4..])
        .trim_end_matches('\0')
        .to_string();
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).await.unwrap();
    Some((kind, payload))
}

async fn send(s: &mut TcpStream, kind: &str, text: &str) {
    let mut p = text.as_bytes().to_vec();
    p.push(0);
    s.write_all(&charm::encode(kind, &p)).await.unwrap();
}

/// Outputs until `n` end markers have arrived, rendered `rank:err?:text` / `rank:end`.
/// How the job was aborted, as `overlay` saw it (within 10 s).
async fn abort_of(overlay: &Overlay) -> AbortInfo {
    let mut aborted = overlay.aborted();
    tokio::time::timeout(Duration::from_secs(10), aborted.wait_for(Option::is_some))
        .await
        .expect("no abort within 10 s")
        .expect("the overlay is gone")
        .clone()
        .expect("waited for Some")
}

async fn outputs(rx: &mut mpsc::Receiver<Output>, n: usize) -> Vec<String> {
    let mut seen = Vec::new();
    let mut ends = 0;
    while ends < n {
        let o = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("output within 10 s")
            .unwrap();
        if o.is_end() {
            ends += 1;
            seen.push(format!("{}:end", o.rank));
        } else {
            let text = String::from_utf8_lossy(&o.data).into_owned();
            seen.push(format!(
                "{}:{}{text}",
                o.rank,
                if o.stderr { "err:" } else { "" }
            ));
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_end_sends_die_to_ranks_that_ended_with_0_and_closes_the_others() {
    let (agents, mut rx) = agents(None).await;
    let mut clients = Vec::new();
    for rank in 0..4u32 {
        clients.push(connect(&agents[rank as usize / 2].1, rank).await);
    }
    for (rank, c) in clients.iter_mut().enumerate() {
        let (kind, table) = frame(c).await.unwrap();
        assert_eq!(kind, "initnodetab");
        assert_eq!(table.len(), 8 + 4 * charm::ENTRY_LEN);
        assert_eq!(table[4..8], (rank as u32).to_be_bytes());
    }
    send(&mut clients[2], "print", "hello from 2\n").await;
    // Rank 0 ends with 3 (charm.exit(3) sends 3 from PE 0 and 0 from the others).
    for (rank, c) in clients.iter_mut().enumerate() {
        send(c, "ending", if rank == 0 { "3" } else { "0" }).await;
    }
    // Rank 0: closed without die (its process exits 1); the others: die, then they exit.
    assert_eq!(frame(&mut clients[0]).await, None);
    for c in &mut clients[1..] {
        let (kind, _) = frame(c).await.unwrap();
        assert_eq!(kind, "die");
        // What a dying client still prints is dropped; its exit (EOF) ends the connection.
        send(c, "printerr", "aborting: \n").await;
        c.shutdown().await.unwrap();
    }
    drop(clients);
    let mut seen = outputs(&mut rx, 4).await;
    seen.sort();
    assert_eq!(
        seen,
        ["0:end", "1:end", "2:end", "2:hello from 2\n", "3:end"]
    );
    assert_eq!(agents[0].1.exit_code(0), Some(3));
    assert_eq!(agents[1].1.exit_code(3), Some(0));
    for (o, c) in agents {
        c.shutdown().await;
        o.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cmi_abort_puts_its_message_on_the_ranks_stderr_then_ends_its_output() {
    let (agents, mut rx) = agents(None).await;
    let mut c = connect(&agents[1].1, 3).await;
    let mut abort = b"Fatal error on PE 3> ".to_vec();
    abort.extend_from_slice(b"deliberate\0");
    c.write_all(&charm::encode("abort", &abort)).await.unwrap();
    let seen = outputs(&mut rx, 1).await;
    assert_eq!(seen, ["3:err:Fatal error on PE 3> deliberate\n", "3:end"]);
    let info = abort_of(&agents[0].0).await;
    assert_eq!(info.rank, Some(3));
    assert!(
        info.reason.contains("rank 3 on h1 called CmiAbort"),
        "{info}"
    );
    for (o, c) in agents {
        c.shutdown().await;
        o.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scanf_is_answered_from_the_embedders_stdin_and_its_end_aborts_naming_the_rank() {
    let (stdin_tx, mut stdin) = mpsc::channel(4);
    let (agents, _rx) = agents(Some(stdin_tx)).await;
    let mut c = connect(&agents[1].1, 2).await;
    send(&mut c, "scanf", "%d %d").await;
    let req = stdin.recv().await.unwrap();
    assert_eq!((req.rank, req.conversions), (2, 2));
    let mut input = "4\n2\nnext\n".to_string();
    let text = charm::scanf_take(&mut input, req.conversions);
    req.reply.send(text).unwrap();
    assert_eq!(
        frame(&mut c).await,
        Some(("scanf-data".into(), b"4 2 \0".to_vec()))
    );
    // At the end of input the job ends, naming rank and host, as charmrun exits at EOF.
    send(&mut c, "scanf", "%s").await;
    stdin.recv().await.unwrap().reply.send(None).unwrap();
    let info = abort_of(&agents[0].0).await;
    assert_eq!(info.rank, Some(2));
    assert!(
        info.reason
            .contains("rank 2 on h1: scanf(\"%s\") at the end of its standard input"),
        "{info}"
    );
    assert_eq!(frame(&mut c).await.map(|f| f.0), Some("die".into()));
    for (o, c) in agents {
        c.shutdown().await;
        o.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_stdin_scanf_aborts_naming_the_rank() {
    let (agents, _rx) = agents(None).await;
    let mut c = connect(&agents[0].1, 1).await;
    send(&mut c, "scanf", "%d").await;
    let info = abort_of(&agents[1].0).await;
    assert!(
        info.reason
            .contains("rank 1 on h0: netlrts: scanf(\"%d\") over netlrts is not supported"),
        "{info}"
    );
    for (o, c) in agents {
        c.shutdown().await;
        o.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_outside_the_job_is_closed_before_it_can_claim_a_rank_or_abort() {
    // The servers admit the descendants of a `sleep` only; this test process is not one.
    let mut job_root = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    let admit = JobProcesses::descendants_of(job_root.id(), uid.unwrap());
    let (agents, mut rx) = agents_admitting(None, admit).await;
    let mut stranger = connect(&agents[0].1, 0).await;
    let _ = stranger
        .write_all(&charm::encode("abort", b"stranger's text\0"))
        .await;
    assert_eq!(frame(&mut stranger).await, None, "closed without a reply");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(agents[0].0.aborted().borrow().is_none(), "the job lives on");
    assert!(rx.try_recv().is_err(), "nothing printed for the stranger");
    for (overlay, charm) in agents {
        charm.shutdown().await;
        overlay.shutdown().await;
    }
    job_root.kill().unwrap();
    job_root.wait().unwrap();
}
