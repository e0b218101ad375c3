//! `greedy-netdelay`: holds every packet entering the emulated cluster's hosts for a time, and
//! drops some if asked.
//!
//! This kernel has no `sch_netem` (research/baseline-launchers.md §2.3), so `tc qdisc … netem
//! delay` is not available. It does have the xtables `NFQUEUE` target: `slurm-conf/testcluster`
//! puts `iptables -t mangle -A PREROUTING -i eth0 -j NFQUEUE --queue-num Q --queue-bypass` into
//! every host's network namespace, and this one process binds queue Q in each of them, holds each
//! packet for `--delay-ms`, then accepts it unchanged. That is netem's "delay every packet that
//! enters the host". `--jitter-ms J` adds a uniform 0..J ms to each packet's hold (so packets
//! overtake each other, as under netem's jitter) and `--loss P` drops P % of them:
//! `testcluster impair` runs a second delayer with these on a few hosts, on a queue of its own.
//!
//! One process serves all namespaces (rather than one per host) because a 64-host cluster would
//! otherwise need 64 processes competing for 2 cores at SCHED_FIFO, and one poll loop over 64
//! sockets costs less than 64 wake-ups. On SIGTERM/SIGINT it accepts every held packet at once,
//! unbinds its queues and exits 0; `--queue-bypass` then lets packets pass undelayed.
//!
//! Exit status: 0 after a clean stop on a signal, 1 on any error (printed once, here), 2 on a
//! usage error (clap).

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod hold;

use std::io::Write as _;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::Parser;

/// Hold every packet that an NFQUEUE rule hands over for a fixed time, then accept it.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Hold each packet this many milliseconds (fractions allowed, e.g. 0.5).
    #[arg(long, value_name = "MS")]
    delay_ms: f64,

    /// Add a uniform 0..MS milliseconds to each packet's hold.
    #[arg(long, value_name = "MS", default_value_t = 0.0)]
    jitter_ms: f64,

    /// Drop this percentage of the packets (0..=100).
    #[arg(long, value_name = "PCT", default_value_t = 0.0)]
    loss: f64,

    /// NFQUEUE number that the iptables rule in every namespace sends packets to.
    #[arg(long, value_name = "N", default_value_t = 2301)]
    queue: u16,

    /// Create this (empty) file once every queue is bound, so that a caller can wait for it.
    #[arg(long, value_name = "PATH")]
    ready_file: Option<PathBuf>,

    /// Network namespaces to serve, as files such as /run/netns/gtc-n1. None: the current one.
    #[arg(value_name = "NETNS")]
    netns: Vec<PathBuf>,
}

fn main() {
    if let Err(err) = run(Args::parse()) {
        eprintln!("greedy-netdelay: {err:#}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<()> {
    if !(args.delay_ms.is_finite() && args.delay_ms >= 0.0 && args.delay_ms <= 60_000.0) {
        bail!("--delay-ms {}: expected 0..=60000", args.delay_ms);
    }
    if !(args.jitter_ms.is_finite() && args.jitter_ms >= 0.0 && args.jitter_ms <= 60_000.0) {
        bail!("--jitter-ms {}: expected 0..=60000", args.jitter_ms);
    }
    if !(args.loss.is_finite() && (0.0..=100.0).contains(&args.loss)) {
        bail!("--loss {}: expected a percentage, 0..=100", args.loss);
    }
    let hold = hold::Hold {
        delay: Duration::from_secs_f64(args.delay_ms / 1000.0),
        jitter: Duration::from_secs_f64(args.jitter_ms / 1000.0),
        loss: args.loss / 100.0,
    };

    // The signal handler writes into a socket that the poll loop watches, so a SIGTERM that
    // arrives between two polls is not lost (a flag checked before poll would be).
    let (stop_rx, stop_tx) = UnixStream::pair().context("creating the stop socket pair")?;
    stop_rx
        .set_nonblocking(true)
        .context("stop socket: set non-blocking")?;
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let tx = stop_tx.try_clone().context("cloning the stop socket")?;
        signal_hook::low_level::pipe::register(sig, tx)
            .with_context(|| format!("registering a handler for signal {sig}"))?;
    }

    let mut ports = Vec::new();
    if args.netns.is_empty() {
        ports.push(hold::Port::open(None, args.queue)?);
    }
    for ns in &args.netns {
        ports.push(hold::Port::open(Some(ns), args.queue)?);
    }

    if let Some(path) = &args.ready_file {
        std::fs::File::create(path)
            .and_then(|mut f| f.flush())
            .with_context(|| format!("{}: writing the ready file", path.display()))?;
    }
    hold::run(&mut ports, hold, &stop_rx)
}
