//! The PMI server over real sockets with scripted clients: PMI-2 across agents, and bad input.

use std::time::Duration;

use greedy_pmix::{
    AbortInfo, JobSecret, JobSpec,
    overlay::{Overlay, OverlayConfig},
    rendezvous::Memory,
    server::{PmiConfig, PmiServer},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::UnixStream,
};

/// `n` agents with `per_node` ranks each (block placement), all started.
async fn agents(n: usize, per_node: u32) -> Vec<(Overlay, PmiServer)> {
    let board = Memory::default();
    let secret = JobSecret::generate();
    let tasks: Vec<_> = (0..n)
        .map(|node_idx| {
            let job = JobSpec {
                job_id: "pmi-test".into(),
                hosts: (0..n).map(|i| format!("h{i}")).collect(),
                node_idx,
                model: Default::default(),
                ranks: (0..n as u32)
                    .map(|i| (0..per_node).map(|k| i * per_node + k).collect())
                    .collect(),
                secret: secret.clone(),
            };
            let board = board.clone();
            tokio::spawn(async move {
                let config = OverlayConfig {
                    collective_timeout: Duration::from_secs(20),
                    ..Default::default()
                };
                let overlay = Overlay::start(&job, config, &board).await.unwrap();
                let pmi = PmiServer::start(&job, overlay.clone(), PmiConfig::default())
                    .await
                    .unwrap();
                (overlay, pmi)
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

async fn stop(agents: Vec<(Overlay, PmiServer)>) {
    let tasks: Vec<_> = agents
        .into_iter()
        .map(|(o, p)| {
            tokio::spawn(async move {
                p.shutdown().await;
                o.shutdown().await;
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

fn client(pmi: &PmiServer, rank: u32) -> UnixStream {
    let (theirs, env) = pmi.socketpair_for(rank, Some(3)).unwrap();
    assert!(env.iter().any(|(k, v)| k == "PMI_FD" && v == "3"));
    assert!(
        env.iter().all(|(k, _)| !k.starts_with("PMIX_")),
        "never PMIX_* with PMI_*"
    );
    theirs.set_nonblocking(true).unwrap();
    UnixStream::from_std(theirs).unwrap()
}

/// Sends `text` and reads one reply (a line, or a PMI-2 frame).
async fn ask<S: AsyncReadExt + AsyncWriteExt + Unpin>(s: &mut S, text: &[u8]) -> String {
    s.write_all(text).await.unwrap();
    read_reply(s).await
}

async fn read_reply<S: AsyncReadExt + Unpin>(s: &mut S) -> String {
    let mut first = [0u8; 1];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut first))
        .await
        .expect("reply in time")
        .unwrap();
    if first[0].is_ascii_digit() {
        let mut len = [0u8; 5];
        s.read_exact(&mut len).await.unwrap();
        let n: usize = format!("{}{}", first[0] as char, String::from_utf8_lossy(&len))
            .trim()
            .parse()
            .unwrap();
        let mut body = vec![0u8; n];
        s.read_exact(&mut body).await.unwrap();
        String::from_utf8(body).unwrap()
    } else {
        let mut line = vec![first[0]];
        loop {
            let mut b = [0u8; 1];
            s.read_exact(&mut b).await.unwrap();
            if b[0] == b'\n' {
                break;
            }
            line.push(b[0]);
        }
        String::from_utf8(line).unwrap()
    }
}

fn frame(body: &str) -> Vec<u8> {
    format!("{:<6}{body}", body.len()).into_bytes()
}

async fn wait_abort(overlay: &Overlay) -> AbortInfo {
    let mut w = overlay.aborted();
    let got = tokio::time::timeout(Duration::from_secs(10), w.wait_for(Option::is_some))
        .await
        .expect("abort in time")
        .unwrap();
    got.clone().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pmi2_put_fence_get_across_two_agents() {
    let agents = agents(2, 1).await;
    let mut c0 = client(&agents[0].1, 0);
    let mut c1 = client(&agents[1].1, 1);
    for (c, rank) in [(&mut c0, 0), (&mut c1, 1)] {
        assert_eq!(
            ask(c, b"cmd=init pmi_version=2 pmi_subversion=0\n").await,
            "cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0"
        );
        let r = ask(
            c,
            &frame(&format!("cmd=fullinit;pmirank={rank};threaded=FALSE;")),
        )
        .await;
        assert!(
            r.starts_with(&format!(
                "cmd=fullinit-response;rc=0;pmi-version=2;pmi-subversion=0;rank={rank};size=2;"
            )),
            "{r}"
        );
        let r = ask(c, &frame("cmd=info-getjobattr;key=PMI_process_mapping;")).await;
        assert_eq!(
            r,
            "cmd=info-getjobattr-response;rc=0;found=TRUE;value=(vector,(0,2,1));"
        );
        let r = ask(
            c,
            &frame(&format!("cmd=kvs-put;key=bc-{rank};value=addr;;{rank};")),
        )
        .await;
        assert_eq!(r, "cmd=kvs-put-response;rc=0;");
    }
    // Both fence; each is released only when the other has fenced too.
    c0.write_all(&frame("cmd=kvs-fence;")).await.unwrap();
    c1.write_all(&frame("cmd=kvs-fence;")).await.unwrap();
    assert_eq!(read_reply(&mut c0).await, "cmd=kvs-fence-response;rc=0;");
    assert_eq!(read_reply(&mut c1).await, "cmd=kvs-fence-response;rc=0;");
    let r = ask(
        &mut c0,
        &frame("cmd=kvs-get;jobid=pmi-test;srcid=1;key=bc-1;"),
    )
    .await;
    assert_eq!(r, "cmd=kvs-get-response;rc=0;found=TRUE;value=addr;;1;");
    let r = ask(&mut c1, &frame("cmd=kvs-get;jobid=pmi-test;key=bc-0;")).await;
    assert_eq!(r, "cmd=kvs-get-response;rc=0;found=TRUE;value=addr;;0;");
    for c in [&mut c0, &mut c1] {
        assert_eq!(
            ask(c, &frame("cmd=finalize;")).await,
            "cmd=finalize-response;rc=0;"
        );
    }
    drop((c0, c1));
    for (o, p) in &agents {
        assert!(o.aborted().borrow().is_none());
        assert_eq!(p.fences(), 1);
    }
    stop(agents).await;
}

/// Name publishing as MPICH's PMI-2 client frames it (`infokeycount=0` and all), across three
/// agents: node 2's rank publishes, node 0's and node 1's look the name up in node 0's table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pmi2_names_across_three_agents() {
    let agents = agents(3, 1).await;
    let mut c: Vec<UnixStream> = (0..3).map(|r| client(&agents[r].1, r as u32)).collect();
    for (rank, c) in c.iter_mut().enumerate() {
        ask(c, b"cmd=init pmi_version=2 pmi_subversion=0\n").await;
        let r = ask(c, &frame(&format!("cmd=fullinit;pmirank={rank};"))).await;
        assert!(r.starts_with("cmd=fullinit-response;rc=0;"), "{r}");
    }
    let lookup = frame("cmd=name-lookup;name=svc;infokeycount=0;");
    assert_eq!(
        ask(&mut c[1], &lookup).await,
        "cmd=name-lookup-response;rc=-1;errmsg=name not published;"
    );
    let publish = frame("cmd=name-publish;name=svc;port=tag#0$a;;b$;infokeycount=0;");
    assert_eq!(
        ask(&mut c[2], &publish).await,
        "cmd=name-publish-response;rc=0;"
    );
    assert_eq!(
        ask(&mut c[0], &publish).await,
        "cmd=name-publish-response;rc=-1;errmsg=name already published;"
    );
    for rank in [0, 1] {
        assert_eq!(
            ask(&mut c[rank], &lookup).await,
            "cmd=name-lookup-response;rc=0;port=tag#0$a;;b$;"
        );
    }
    let unpublish = frame("cmd=name-unpublish;name=svc;infokeycount=0;");
    assert_eq!(
        ask(&mut c[1], &unpublish).await,
        "cmd=name-unpublish-response;rc=0;"
    );
    assert_eq!(
        ask(&mut c[2], &unpublish).await,
        "cmd=name-unpublish-response;rc=-1;errmsg=name not published;"
    );
    assert_eq!(
        ask(&mut c[0], &lookup).await,
        "cmd=name-lookup-response;rc=-1;errmsg=name not published;"
    );
    for c in &mut c {
        ask(c, &frame("cmd=finalize;")).await;
    }
    drop(c);
    for (o, _) in &agents {
        assert!(o.aborted().borrow().is_none());
    }
    stop(agents).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_line_aborts_the_job_naming_rank_and_text() {
    let agents = agents(2, 2).await;
    let mut c = client(&agents[1].1, 3);
    assert_eq!(
        ask(&mut c, b"cmd=init pmi_version=1 pmi_subversion=1\n").await,
        "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0"
    );
    // An unknown command is answered, not fatal.
    assert_eq!(
        ask(&mut c, b"cmd=frobnicate x=1\n").await,
        "cmd=frobnicate_result rc=-1 msg=unsupported_command"
    );
    c.write_all(b"cmd=put kvsname=pmi-test key=k value=v extra\n")
        .await
        .unwrap();
    for (o, _) in &agents {
        let info = wait_abort(o).await;
        assert_eq!(info.rank, Some(3));
        assert_eq!(
            info.reason,
            "node 1 rank 3: pmi1 line 3: token \"extra\" has no '=': \"cmd=put kvsname=pmi-test key=k value=v extra\\n\""
        );
    }
    stop(agents).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_long_value_aborts_naming_the_rank() {
    let agents = agents(1, 2).await;
    let mut c = client(&agents[0].1, 1);
    let long = format!(
        "cmd=put kvsname=pmi-test key=k value={}\n",
        "v".repeat(1400)
    );
    c.write_all(long.as_bytes()).await.unwrap();
    let info = wait_abort(&agents[0].0).await;
    assert!(
        info.reason
            .starts_with("node 0 rank 1: pmi1 line 1: line of 1438+ bytes exceeds 1408"),
        "{}",
        info.reason
    );
    stop(agents).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_close_aborts_naming_the_rank() {
    let agents = agents(2, 1).await;
    let mut c = client(&agents[0].1, 0);
    assert_eq!(
        ask(&mut c, b"cmd=init pmi_version=1 pmi_subversion=1\n").await,
        "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0"
    );
    drop(c);
    let info = wait_abort(&agents[1].0).await;
    assert_eq!(
        info.reason,
        "rank 0 closed its PMI connection before finalize"
    );
    stop(agents).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_timeout_names_the_local_ranks_that_did_not_enter() {
    let board = Memory::default();
    let job = JobSpec {
        job_id: "pmi-test".into(),
        hosts: vec!["h0".into()],
        node_idx: 0,
        model: Default::default(),
        ranks: vec![vec![0, 1, 2]],
        secret: JobSecret::generate(),
    };
    let overlay = Overlay::start(&job, OverlayConfig::default(), &board)
        .await
        .unwrap();
    let config = PmiConfig {
        fence_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let pmi = PmiServer::start(&job, overlay.clone(), config)
        .await
        .unwrap();
    let mut c = client(&pmi, 1);
    let _idle0 = client(&pmi, 0);
    let _idle2 = client(&pmi, 2);
    assert_eq!(
        ask(&mut c, b"cmd=init pmi_version=1 pmi_subversion=1\n").await,
        "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0"
    );
    c.write_all(b"cmd=barrier_in\n").await.unwrap();
    let info = wait_abort(&overlay).await;
    assert_eq!(
        info.reason,
        "node 0 fence #0: ranks 0,2 have not entered it after fence_timeout (300ms)"
    );
    assert_eq!(info.rank, Some(0));
    pmi.shutdown().await;
    overlay.shutdown().await;
}

/// MPICH asks for the node's topology file first thing: served when the launcher asks for
/// it, as hwloc XML with the machine's cores, and removed when the server stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_topology_file_is_served_to_mpich() {
    let board = Memory::default();
    let job = JobSpec {
        job_id: "pmi-topo".into(),
        hosts: vec!["h0".into()],
        node_idx: 0,
        model: Default::default(),
        ranks: vec![vec![0]],
        secret: JobSecret::generate(),
    };
    let overlay = Overlay::start(&job, OverlayConfig::default(), &board)
        .await
        .unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let config = PmiConfig {
        topology_dir: Some(scratch.path().to_path_buf()),
        ..Default::default()
    };
    let pmi = PmiServer::start(&job, overlay.clone(), config)
        .await
        .unwrap();
    // Nothing is written before a rank asks.
    assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 0);
    let mut c = client(&pmi, 0);
    ask(&mut c, b"cmd=init pmi_version=1 pmi_subversion=1\n").await;
    let answer = ask(&mut c, b"cmd=get kvsname=pmi-topo key=PMI_hwloc_xmlfile\n").await;
    let file = pmi.topology_file().expect("a topology file").to_string();
    assert_eq!(
        answer,
        format!("cmd=get_result rc=0 msg=success value={file}")
    );
    let xml = std::fs::read_to_string(&file).unwrap();
    assert!(xml.contains("type=\"Core\""), "{xml}");
    pmi.shutdown().await;
    assert!(!std::path::Path::new(&file).exists(), "removed at shutdown");
    overlay.shutdown().await;
}
