//! Fence and allgather timings over loopback: `cargo bench -p greedy-pmix --bench fence`.
//!
//! Starts K overlay agents as tasks of this process (one tokio runtime, 2 worker threads, real
//! TCP on 127.0.0.1) and times collectives, printing Markdown tables for docs/benchmarks.md:
//! 1. fence latency vs K: an allgather of a 2 KiB blob per node (4 MPICH ranks' UCX addresses,
//!    research/pmix-pmi.md §4), and a PMI fence through the PMI-1 server with one client per node;
//! 2. tree vs ring vs Bruck allgather by blob size at K = 8 and 16, to place the tree's limit;
//! 3. the same at K = 128, 256 and 512, to choose between the ring and Bruck past it
//!    (`BENCH_AGENTS="128 256"` picks the sizes; each agent holds a listener and its links, so
//!    512 needs about 3000 descriptors).
//!
//! Set `BENCH_QUICK=1` for a smoke run with few iterations.

use std::time::{Duration, Instant};

use bytes::Bytes;
use greedy_pmix::{
    JobSecret, JobSpec,
    collectives::AllgatherRule,
    overlay::{Overlay, OverlayConfig},
    rendezvous::Memory,
    server::{PmiConfig, PmiServer},
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

fn job(n: usize, node_idx: usize, secret: &JobSecret) -> JobSpec {
    JobSpec {
        job_id: "bench".into(),
        hosts: (0..n).map(|i| format!("n{i}")).collect(),
        node_idx,
        model: Default::default(),
        ranks: (0..n as u32).map(|i| vec![i]).collect(),
        secret: secret.clone(),
    }
}

async fn start(n: usize, allgather: AllgatherRule) -> Vec<Overlay> {
    let board = Memory::default();
    let secret = JobSecret::generate();
    let config = OverlayConfig {
        allgather,
        ..Default::default()
    };
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (job, board, config) = (job(n, i, &secret), board.clone(), config.clone());
            tokio::spawn(async move { Overlay::start(&job, config, &board).await.expect("join") })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

async fn stop(overlays: Vec<Overlay>) {
    let tasks: Vec<_> = overlays
        .into_iter()
        .map(|o| tokio::spawn(async move { o.shutdown().await }))
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

/// Median and 90th percentile of `iters` allgathers of `size` bytes per node.
async fn time_allgather(overlays: &[Overlay], size: usize, iters: usize) -> (Duration, Duration) {
    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        let tasks: Vec<_> = overlays
            .iter()
            .map(|o| {
                let o = o.clone();
                tokio::spawn(async move {
                    o.allgather(Bytes::from(vec![7u8; size]))
                        .await
                        .expect("allgather")
                        .len()
                })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap(), overlays.len());
        }
        samples.push(t0.elapsed());
    }
    samples.sort();
    (samples[iters / 2], samples[iters * 9 / 10])
}

/// A PMI-1 client per node doing put + barrier_in, as MPICH's init does; median fence time.
async fn time_pmi_fence(n: usize, iters: usize) -> (Duration, Duration) {
    let overlays = start(n, TREE).await;
    // The PMI server uses the job description only for ranks and names; the secret is unused here.
    let secret = JobSecret::generate();
    let mut clients = Vec::new();
    let mut servers = Vec::new();
    for (i, o) in overlays.iter().enumerate() {
        let j = job(n, i, &secret);
        let pmi = PmiServer::start(&j, o.clone(), PmiConfig::default())
            .await
            .unwrap();
        let (theirs, _env) = pmi.socketpair_for(i as u32, Some(3)).unwrap();
        theirs.set_nonblocking(true).unwrap();
        let stream = tokio::net::UnixStream::from_std(theirs).unwrap();
        let (r, mut w) = stream.into_split();
        let mut r = BufReader::new(r);
        let mut line = String::new();
        w.write_all(b"cmd=init pmi_version=1 pmi_subversion=1\n")
            .await
            .unwrap();
        r.read_line(&mut line).await.unwrap();
        clients.push((r, w));
        servers.push(pmi);
    }
    let value = "a".repeat(488); // one hex UCX address, §4
    let mut samples = Vec::with_capacity(iters);
    for it in 0..iters {
        let t0 = Instant::now();
        let tasks: Vec<_> = std::mem::take(&mut clients)
            .into_iter()
            .enumerate()
            .map(|(i, (mut r, mut w))| {
                let value = value.clone();
                tokio::spawn(async move {
                    let mut line = String::new();
                    w.write_all(
                        format!(
                            "cmd=put kvsname=bench key=k{it}-{i} value={value}\ncmd=barrier_in\n"
                        )
                        .as_bytes(),
                    )
                    .await
                    .unwrap();
                    r.read_line(&mut line).await.unwrap();
                    line.clear();
                    r.read_line(&mut line).await.unwrap();
                    assert_eq!(line, "cmd=barrier_out rc=0\n");
                    (r, w)
                })
            })
            .collect();
        for t in tasks {
            clients.push(t.await.unwrap());
        }
        samples.push(t0.elapsed());
    }
    for (mut r, mut w) in clients {
        let mut line = String::new();
        w.write_all(b"cmd=finalize\n").await.unwrap();
        r.read_line(&mut line).await.unwrap();
    }
    for s in &servers {
        s.shutdown().await;
    }
    stop(overlays).await;
    samples.sort();
    (samples[iters / 2], samples[iters * 9 / 10])
}

/// Every allgather on the tree, whatever its size.
const TREE: AllgatherRule = AllgatherRule {
    tree_max: u64::MAX,
    ring_max_nodes: 0,
};

/// The title and head of a table of [`compare`] rows.
fn compare_head(title: &str, iters: usize) {
    println!("\n### {title} (loopback, {iters} iterations, p50 µs)\n");
    println!(
        "| agents | bytes/node | total | tree p50 µs | ring p50 µs | Bruck p50 µs | fastest |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---|");
}

/// One table row per size: the p50 of each algorithm at `n` agents, and the fastest. One
/// algorithm's agents run at a time (three sets of 512 would need 9000 descriptors), and each
/// set does one unmeasured allgather first, which opens its direct links.
async fn compare(n: usize, sizes: &[usize], iters: usize) {
    let mut rows = vec![Vec::new(); sizes.len()];
    for rule in [
        TREE,
        AllgatherRule::ring_above(0),
        AllgatherRule::bruck_above(0),
    ] {
        let overlays = start(n, rule).await;
        time_allgather(&overlays, 1, 1).await;
        for (row, &size) in rows.iter_mut().zip(sizes) {
            row.push(time_allgather(&overlays, size, iters).await.0);
        }
        stop(overlays).await;
    }
    for (row, &size) in rows.iter().zip(sizes) {
        let best = ["tree", "ring", "Bruck"][(0..3).min_by_key(|&i| row[i]).unwrap_or(0)];
        println!(
            "| {n} | {size} | {} | {} | {} | {} | {best} |",
            size * n,
            us(row[0]),
            us(row[1]),
            us(row[2])
        );
    }
}

fn us(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e6)
}

fn main() {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let iters = if quick { 5 } else { 200 };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        println!("### Fence latency vs number of agents (loopback, 2 cores, {iters} iterations)\n");
        println!("| agents | overlay allgather 2 KiB/node p50 µs | p90 µs | PMI-1 put+barrier_in p50 µs | p90 µs |");
        println!("|---:|---:|---:|---:|---:|");
        for n in [2, 4, 8, 16, 32, 64] {
            let overlays = start(n, TREE).await;
            let (p50, p90) = time_allgather(&overlays, 2048, iters).await;
            stop(overlays).await;
            let (f50, f90) = time_pmi_fence(n, iters).await;
            println!("| {n} | {} | {} | {} | {} |", us(p50), us(p90), us(f50), us(f90));
        }

        let iters = if quick { 3 } else { 20 };
        compare_head("Allgather: tree vs ring vs Bruck by blob size per node", iters);
        let sizes = [1usize << 10, 4 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 1 << 20];
        for n in [8, 16] {
            compare(n, &sizes, iters).await;
        }

        let agents: Vec<usize> = std::env::var("BENCH_AGENTS")
            .unwrap_or_else(|_| "128 256 512".into())
            .split_whitespace()
            .map(|k| k.parse().expect("BENCH_AGENTS: numbers"))
            .collect();
        let iters = if quick { 3 } else { 10 };
        let sizes = [64usize, 1 << 10, 4 << 10, 16 << 10];
        compare_head(
            "Allgather at scale: tree vs ring vs Bruck by blob size per node",
            iters,
        );
        for n in agents {
            compare(n, &sizes, iters).await;
        }
    });
}
