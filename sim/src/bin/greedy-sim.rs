//! `greedy-sim`: simulate launch plus wire-up at any scale, validate the simulation against
//! measured launches, and write its section of docs/benchmarks.md.

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use greedy_sim::validate::{self, Setup};
use greedy_sim::{Allgather, Jitter, Limits, Net, Noise, Scenario, Shape, SharedCpu, report};
use greedy_tree::LaunchModel;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// Discrete-event simulation of a parallel job's start-up: launch over a tree under the
/// SEQ/REM model with noise, then the allgather of every node's endpoints.
///
/// EXIT STATUS: 0 on success; 1 when a file could not be read or written; 2 for bad input.
#[derive(Parser)]
#[command(version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Simulate one configuration R times and print median and p5–p95.
    Run(RunArgs),
    /// Fit the model to measured launches and print simulated vs measured per launch.
    Validate(ValidateArgs),
    /// Print the Markdown section of docs/benchmarks.md and write its SVG plots.
    Report(ReportArgs),
    /// Predict a file broadcast pipelined down a launch tree (greedyrun --bcast) against
    /// every node fetching the file from the root.
    Bcast(BcastArgs),
}

#[derive(Args)]
struct BcastArgs {
    /// Nodes (hosts), the root included; a comma-separated list runs each.
    #[arg(long, value_delimiter = ',', required = true)]
    nodes: Vec<usize>,
    /// File sizes, MB (2^20 bytes); a comma-separated list runs each.
    #[arg(long, value_delimiter = ',', default_value = "50")]
    mb: Vec<f64>,
    /// Chunk size, MB (greedyrun sends 1).
    #[arg(long, default_value_t = 1.0)]
    chunk_mb: f64,
    /// Tree shape: greedy, flat, chain, binomial, kary:K, …
    #[arg(long, default_value = "greedy")]
    topology: String,
    /// SEQ of the greedy tree, seconds.
    #[arg(long, default_value_t = 0.013)]
    seq: f64,
    /// REM of the greedy tree, seconds.
    #[arg(long, default_value_t = 0.28)]
    rem: f64,
    /// Message latency α, seconds.
    #[arg(long, default_value_t = 50e-6)]
    alpha: f64,
    /// Seconds per byte β of each node's port (8e-10: 10 Gb/s).
    #[arg(long, default_value_t = 8e-10)]
    beta: f64,
    /// Receiver CPU per chunk γ, seconds.
    #[arg(long, default_value_t = 0.0)]
    gamma: f64,
}

#[derive(Args)]
struct RunArgs {
    /// Nodes (hosts), the root included; a comma-separated list runs each.
    #[arg(long, value_delimiter = ',', required = true)]
    nodes: Vec<usize>,
    /// Launch shape: greedy, greedy-cap:K, flat, chain, binomial, kary:K, treewidth:K, radix:K.
    #[arg(long, default_value = "greedy")]
    topology: String,
    /// SEQ, seconds.
    #[arg(long, default_value_t = 0.015)]
    seq: f64,
    /// REM, seconds.
    #[arg(long, default_value_t = 0.227)]
    rem: f64,
    /// Launches a parent starts at once.
    #[arg(long, default_value_t = 1)]
    concurrency: u32,
    /// Most launches a parent keeps in flight until they are up (greedyrun's --batch).
    #[arg(long)]
    batch: Option<u32>,
    /// Cores shared by every host (the emulated cluster); needs --cpu-work.
    #[arg(long, requires = "cpu_work")]
    cores: Option<u32>,
    /// CPU seconds of each launch (part of REM) when hosts share --cores.
    #[arg(long)]
    cpu_work: Option<f64>,
    /// Per-launch jitter: none, uniform:F or lognormal:SIGMA.
    #[arg(long, default_value = "none")]
    jitter: String,
    /// Probability that a launch straggles.
    #[arg(long, default_value_t = 0.0)]
    straggler_p: f64,
    /// Slowdown of a straggling launch's REM.
    #[arg(long, default_value_t = 1.0)]
    straggler_factor: f64,
    #[command(flatten)]
    wireup: WireupArgs,
    /// Monte Carlo runs.
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// Seed of the first run (run i uses seed + i).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Args)]
struct WireupArgs {
    /// Allgather after the launch: tree, ring or bruck (none: launch only).
    #[arg(long)]
    allgather: Option<String>,
    /// Ranks per node.
    #[arg(long, default_value_t = 1)]
    ppn: u32,
    /// Endpoint bytes per rank.
    #[arg(long, default_value_t = 1024.0)]
    bytes: f64,
    /// Message latency α, seconds.
    #[arg(long, default_value_t = 50e-6)]
    alpha: f64,
    /// Seconds per byte β.
    #[arg(long, default_value_t = 3.6e-9)]
    beta: f64,
    /// Receiver CPU per message γ, seconds.
    #[arg(long, default_value_t = 5e-6)]
    gamma: f64,
    /// Seconds from a node's agent being up to its ranks entering the allgather.
    #[arg(long, default_value_t = 0.0)]
    rank_start: f64,
}

#[derive(Args)]
struct SetupArgs {
    /// Measured launches: CSV `shell,topology,hosts,delay_ms,rep,seconds`.
    #[arg(long, value_name = "FILE")]
    measured: PathBuf,
    /// Cores the emulated hosts shared.
    #[arg(long, default_value_t = 2)]
    cores: u32,
    /// greedyrun's --batch during the measurements (0: no cap).
    #[arg(long, default_value_t = 8)]
    batch: u32,
    /// greedyrun's calibrations per shell and delay (`shell,delay_ms,seq,rem`): its greedy
    /// trees were built with them [default: launch-calibration.csv beside --measured, if any].
    #[arg(long, value_name = "FILE")]
    calibration: Option<PathBuf>,
    /// SEQ greedyrun built its greedy trees with, where no calibration says.
    #[arg(long, default_value_t = 0.013)]
    shape_seq: f64,
    /// REM greedyrun built its greedy trees with, where no calibration says.
    #[arg(long, default_value_t = 0.28)]
    shape_rem: f64,
}

#[derive(Args)]
struct ValidateArgs {
    #[command(flatten)]
    setup: SetupArgs,
}

#[derive(Args)]
struct ReportArgs {
    #[command(flatten)]
    setup: SetupArgs,
    /// Directory of docs/benchmarks.md: plots go to OUT/plots/.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Monte Carlo runs per configuration.
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Largest node count of the scale table (1k, 10k, … up to it).
    #[arg(long, default_value_t = 1_000_000)]
    max_nodes: usize,
    /// Whose fitted model the projections use (a shell of the measurements; its lowest delay).
    #[arg(long, default_value = "ssh")]
    project_from: String,
    /// Ranks of the tree/ring/Bruck allgather comparison.
    #[arg(long, default_value_t = 100_000)]
    allgather_ranks: usize,
    /// Instead of printing the section, put it into FILE between the lines
    /// `<!-- sim:begin -->` and `<!-- sim:end -->`.
    #[arg(long, value_name = "FILE")]
    splice: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = match greedy_tree::cli::parse::<Cli>("greedy-sim") {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("greedy-sim: {e:#}");
            let bad_input = e.chain().any(|c| {
                c.is::<greedy_sim::Error>()
                    && !matches!(c.downcast_ref(), Some(greedy_sim::Error::Plot { .. }))
            });
            ExitCode::from(if bad_input { 2 } else { 1 })
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let mut out = io::BufWriter::new(io::stdout().lock());
    match cli.command {
        Command::Run(a) => simulate(&a, &mut out)?,
        Command::Validate(a) => print_validation(&a, &mut out)?,
        Command::Report(a) => write_report(&a, &mut out)?,
        Command::Bcast(a) => predict_bcast(&a, &mut out)?,
    }
    out.flush()?;
    Ok(())
}

/// `bcast`: one line per (nodes, size): the tree's time, every node fetching, their ratio.
fn predict_bcast(a: &BcastArgs, out: &mut impl Write) -> Result<()> {
    let net = Net::new(a.alpha, a.beta, a.gamma)?;
    let model = LaunchModel::new(a.seq, a.rem)?;
    let shape: Shape = a.topology.parse()?;
    writeln!(out, "# nodes mb {}_s fetch_s tree/fetch", a.topology)?;
    for &n in &a.nodes {
        let tree = shape.build(n, &model)?;
        for &mb in &a.mb {
            let bytes = mb * f64::from(1u32 << 20);
            let chunk = a.chunk_mb * f64::from(1u32 << 20);
            let t = greedy_sim::bcast::pipelined(&tree, bytes, chunk, &net)?;
            let f = greedy_sim::bcast::fetch_all(n, bytes, &net);
            writeln!(out, "{n} {mb} {t:.3} {f:.3} {:.3}", t / f)?;
        }
    }
    Ok(())
}

/// `validate`: one line per measured launch, then one per (shell, delay) fit, then the total.
fn print_validation(a: &ValidateArgs, out: &mut impl Write) -> Result<()> {
    let groups = groups(&a.setup)?;
    writeln!(
        out,
        "# shell delay_ms topology hosts rep measured_s eq2_s sim_s sim_error"
    )?;
    for g in &groups {
        for c in &g.checks {
            let m = &c.measured;
            writeln!(
                out,
                "{} {} {} {} {} {:.4} {:.4} {:.4} {:+.1}%",
                m.shell,
                m.delay_ms,
                m.topology,
                m.hosts,
                m.rep,
                m.seconds,
                c.eq2,
                c.simulated,
                (c.simulated - m.seconds) / m.seconds * 100.0
            )?;
        }
    }
    for g in &groups {
        let (e, s) = g.errors();
        writeln!(
            out,
            "# {} delay {} ms: eq2 seq {:.4} rem {:.4} overhead {:.4} r2 {:.3} error mean {:.1}% max {:.1}%; sim seq {:.4} rem {:.4} cpu {:.4}x{} overhead {:.4} r2 {:.3} error mean {:.1}% max {:.1}%",
            g.shell,
            g.delay_ms,
            g.eq2.model.seq(),
            g.eq2.model.rem(),
            g.eq2.overhead,
            g.eq2.r_squared,
            e.mean * 100.0,
            e.max * 100.0,
            g.sim.model.seq(),
            g.sim.model.rem(),
            g.sim.cpu.work,
            g.sim.cpu.cores,
            g.sim.overhead,
            g.sim.r_squared,
            s.mean * 100.0,
            s.max * 100.0
        )?;
    }
    let (e, s) = validate::errors(&groups);
    writeln!(
        out,
        "# all: eq2 error mean {:.1}% max {:.1}%; sim error mean {:.1}% max {:.1}%",
        e.mean * 100.0,
        e.max * 100.0,
        s.mean * 100.0,
        s.max * 100.0
    )?;
    Ok(())
}

/// `report`: the Markdown section, printed or spliced, and its plots.
fn write_report(a: &ReportArgs, out: &mut impl Write) -> Result<()> {
    let groups = groups(&a.setup)?;
    let mut settings = report::Settings {
        runs: a.runs,
        project_from: a.project_from.clone(),
        allgather_ranks: a.allgather_ranks,
        ..Default::default()
    };
    settings.nodes.retain(|&n| n <= a.max_nodes);
    if settings.nodes.is_empty() {
        return Err(greedy_sim::Error::param(
            "max-nodes",
            a.max_nodes,
            "must be at least 1000 (the smallest size of the scale table)",
        )
        .into());
    }
    if a.allgather_ranks == 0 {
        let reason = "must be at least 1";
        return Err(greedy_sim::Error::param("allgather-ranks", 0, reason).into());
    }
    let md = report::report(&groups, &settings, &a.out)?;
    match &a.splice {
        None => out.write_all(md.as_bytes())?,
        Some(path) => splice(path, &md)?,
    }
    Ok(())
}

/// Replaces what lies between the sim markers of `path` with `section`.
fn splice(path: &std::path::Path, section: &str) -> Result<()> {
    const BEGIN: &str = "<!-- sim:begin -->";
    const END: &str = "<!-- sim:end -->";
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let markers = text.find(BEGIN).zip(text.find(END)).filter(|(b, e)| b < e);
    let Some((b, e)) = markers else {
        return Err(greedy_sim::Error::param(
            "splice",
            path.display(),
            "needs the lines <!-- sim:begin --> and <!-- sim:end -->, in that order",
        )
        .into());
    };
    let spliced = format!("{}{BEGIN}\n{section}{}", &text[..b], &text[e..]);
    std::fs::write(path, spliced).with_context(|| format!("{}", path.display()))?;
    Ok(())
}

fn groups(a: &SetupArgs) -> Result<Vec<validate::Group>> {
    let text = std::fs::read_to_string(&a.measured)
        .with_context(|| format!("{}", a.measured.display()))?;
    let rows = validate::parse(&a.measured, &text)?;
    let beside = a.measured.with_file_name("launch-calibration.csv");
    let calibration = match &a.calibration {
        Some(path) => Some(path.clone()),
        None => beside.exists().then_some(beside),
    };
    let calibrations = match calibration {
        Some(path) => {
            let text =
                std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
            validate::parse_calibration(&path, &text)?
        }
        None => Vec::new(),
    };
    let setup = Setup {
        shape_model: LaunchModel::new(a.shape_seq, a.shape_rem)?,
        calibrations,
        cores: a.cores,
        batch: (a.batch > 0).then_some(a.batch),
    };
    Ok(validate::validate(&rows, &setup)?)
}

fn simulate(a: &RunArgs, out: &mut impl Write) -> Result<()> {
    let model = LaunchModel::new(a.seq, a.rem)?.with_concurrency(a.concurrency)?;
    let shape: Shape = a.topology.parse()?;
    let jitter: Jitter = a.jitter.parse()?;
    let noise = Noise::new(jitter, a.straggler_p, a.straggler_factor)?;
    let cpu = match (a.cores, a.cpu_work) {
        (Some(c), Some(w)) => Some(SharedCpu::new(c, w)?),
        _ => None,
    };
    let w = &a.wireup;
    let allgather: Option<Allgather> = w.allgather.as_deref().map(str::parse).transpose()?;
    let net = Net::new(w.alpha, w.beta, w.gamma)?;
    writeln!(
        out,
        "# topology nodes ppn runs depth max_fanout launch_median_s launch_p5 launch_p95 wired_median_s wired_p5 wired_p95 sim_seconds"
    )?;
    for &nodes in &a.nodes {
        let scenario = Scenario {
            nodes,
            ppn: w.ppn,
            bytes_per_rank: w.bytes,
            shape,
            model,
            noise,
            limits: Limits {
                cpu,
                batch: a.batch,
            },
            rank_start: w.rank_start,
            allgather,
            net,
        };
        let started = std::time::Instant::now();
        let s = scenario.run(a.runs, a.seed)?;
        writeln!(
            out,
            "{shape} {nodes} {} {} {} {} {:.6} {:.6} {:.6} {:.6} {:.6} {:.6} {:.3}",
            w.ppn,
            a.runs,
            s.depth,
            s.max_fanout,
            s.launched.median,
            s.launched.p5,
            s.launched.p95,
            s.wired.median,
            s.wired.p5,
            s.wired.p95,
            started.elapsed().as_secs_f64()
        )?;
    }
    Ok(())
}
