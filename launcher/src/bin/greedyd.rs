//! `greedyd`: the per-host agent of greedyrun, started over rsh/ssh; not run by hand.

use std::time::Duration;

use clap::Parser;

/// The per-host agent of greedyrun: reads its job from stdin, starts its part of the launch
/// tree and its local ranks, and reports on stdout. Started by greedyrun over rsh/ssh.
#[derive(Debug, Parser)]
#[command(version)]
pub(crate) struct Args {
    /// Internal: run as the guard of an agent's ranks, killing them (SIGTERM, SIGKILL after
    /// SECS) if the agent dies.
    #[arg(long, value_name = "SECS")]
    guard: Option<f64>,

    /// Internal: marks this agent (and the remote shell that started it) for `--reap`.
    #[arg(long, value_name = "TOKEN")]
    launch: Option<String>,

    /// Internal: connect to greedyrun at ADDR instead of reading stdin (an agent that one srun
    /// step started on every host; the job key is in GREEDY_CONNECT_KEY).
    #[arg(long, value_name = "ADDR")]
    connect: Option<String>,

    /// Internal: kill this user's processes marked `--launch TOKEN` on this host, with their
    /// descendants, and print how many; run by a parent that gave up on this host's agent.
    #[arg(long, value_name = "TOKEN")]
    reap: Option<String>,
}

fn main() {
    let args = Args::parse();
    if let Some(grace) = args.guard {
        greedy_launcher::guard::run(Duration::from_secs_f64(grace.max(0.0)));
        return;
    }
    if let Some(token) = args.reap {
        match greedy_launcher::reap::reap(&token) {
            Ok(n) => println!("{n}"),
            Err(e) => {
                eprintln!("greedyd --reap: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    // Logs go to stderr, which the parent forwards to greedyrun as notes (escaped: no colours):
    // keep it quiet unless asked (GREEDY_LOG uses RUST_LOG syntax), and time what was asked
    // for, to the microsecond, so that a phase can be measured from the log.
    let asked = tracing_subscriber::EnvFilter::try_from_env("GREEDY_LOG").ok();
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false);
    match asked {
        Some(filter) => logs.with_env_filter(filter).init(),
        None => logs
            .with_env_filter(tracing_subscriber::EnvFilter::new("error"))
            .without_time()
            .init(),
    }
    greedy_launcher::agent::prepare_pmix();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("greedyd: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let run = async {
        match &args.connect {
            Some(addr) => {
                let (down, up, key) = greedy_launcher::connect::dial_from_env(addr).await?;
                greedy_launcher::agent::run_on(down, up, Some(&key)).await
            }
            None => greedy_launcher::agent::run().await,
        }
    };
    let code = match rt.block_on(run) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("greedyd: {e}");
            1
        }
    };
    rt.shutdown_timeout(Duration::from_millis(100));
    std::process::exit(code);
}
