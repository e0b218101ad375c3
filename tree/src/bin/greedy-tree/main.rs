//! `greedy-tree`: plan a launch tree for a host list, and compare topologies under a model.

mod render;
mod svg;

use render::Hosts;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use greedy_tree::treewidth::{self, SlurmRelease};
use greedy_tree::{LaunchModel, Topology, Tree, calibrate, hostfile, hostlist};
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// Plan and compare process-launch trees under the SEQ/REM model.
///
/// A parent spends SEQ seconds between two consecutive launches; a launched child can launch
/// its own children REM seconds after its parent started it. The greedy tree is the fastest
/// tree under that model (Goehner et al., IEEE Cluster 2012).
///
/// EXIT STATUS: 0 on success; 1 when output could not be written or a file not read;
/// 2 for bad input (bad numbers, unknown topology, empty or malformed host list).
#[derive(Parser)]
#[command(version, about, long_about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Lay a launch tree over a host list and print it.
    Plan(PlanArgs),
    /// Rank topologies by modeled launch time, fastest first.
    Compare(CompareArgs),
    /// Fit SEQ and REM to timed launches, and say how well the model explains them.
    Calibrate(CalibrateArgs),
}

#[derive(Args)]
struct ModelArgs {
    /// Seconds a parent spends between two consecutive launches (SEQ).
    ///
    /// The default is the paper's local-file-cache measurement.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 0.015,
        allow_negative_numbers = true
    )]
    seq: f64,
    /// Seconds from a launch's start until the child can launch its own (REM).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 0.227,
        allow_negative_numbers = true
    )]
    rem: f64,
    /// Launches a parent keeps in flight at once (cores it can launch from).
    #[arg(long, value_name = "C", default_value_t = 1)]
    concurrency: u32,
    /// Most children a parent may launch (e.g. Slurm's TreeWidth); unbounded by default.
    #[arg(long, value_name = "K")]
    max_fanout: Option<u32>,
}

impl ModelArgs {
    fn model(&self) -> Result<LaunchModel, greedy_tree::Error> {
        let model = LaunchModel::new(self.seq, self.rem)?.with_concurrency(self.concurrency)?;
        match self.max_fanout {
            Some(k) => model.with_max_fanout(k),
            None => Ok(model),
        }
    }
}

#[derive(Args)]
#[group(required = true, multiple = false)]
struct HostsArgs {
    /// Number of hosts, the root included (hosts are then named by index).
    #[arg(long, value_name = "N", value_parser = node_count)]
    nodes: Option<usize>,
    /// A Slurm hostlist expression, e.g. `n[1-4,7],gpu[01-02]`.
    #[arg(long, value_name = "EXPR")]
    hosts: Option<String>,
    /// A hostfile: Open MPI (`host slots=N`), MPICH (`host:N`) or one host per line.
    #[arg(long, value_name = "FILE")]
    hostfile: Option<PathBuf>,
}

#[derive(Args)]
struct PlanArgs {
    #[command(flatten)]
    hosts: HostsArgs,
    #[command(flatten)]
    model: ModelArgs,
    /// Tree shape: greedy, flat, chain, binomial or kary:K; with --slurm-release, greedy or
    /// treewidth (Slurm's own fan-out).
    #[arg(long, value_name = "T", default_value = "greedy")]
    topology: String,
    /// The tree a Slurm launch of this release follows: host 0 is srun, the rest the sorted
    /// node list, --max-fanout is TreeWidth (default: the release's). With greedy, every split
    /// is topology/greedy's (route/greedy's on 22.05) except srun's own from 25.05, which is
    /// Slurm's; with treewidth, every split is Slurm's.
    #[arg(long, value_name = "YY.MM")]
    slurm_release: Option<SlurmRelease>,
    /// Output: one line per host, JSON, Graphviz, a one-line summary (text or JSON), or an SVG
    /// drawing. Per-host formats stream: memory stays at 4 bytes per host.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

/// How `plan` prints the tree.
#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// One line per host: index, host, parent, child index, depth, launch time.
    Text,
    /// One JSON object with the model, the launch time and every host.
    Json,
    /// A Graphviz digraph, edges labelled with the child index.
    Dot,
    /// Hosts, depth, largest fan-out and launch time.
    Summary,
    /// The summary as one JSON object.
    SummaryJson,
    /// A drawing: the tree and a launch timeline (a summary past 64 hosts).
    Svg,
}

#[derive(Args)]
struct CompareArgs {
    /// Number of hosts, the root included.
    #[arg(long, value_name = "N", value_parser = node_count)]
    nodes: usize,
    #[command(flatten)]
    model: ModelArgs,
    /// Comma-separated topologies [default: greedy,flat,chain,binomial,kary:2,…,kary:512].
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    topologies: Vec<String>,
    /// Print a JSON array of {"topology", "launch_time", …}, fastest first.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct CalibrateArgs {
    /// Timed launches, one per line: `TOPOLOGY NODES SECONDS` (e.g. `flat 16 0.93`); `#`
    /// starts a comment. Use two or more shapes or sizes so SEQ and REM can be told apart.
    #[arg(long, value_name = "FILE")]
    launches: PathBuf,
    /// Launches a parent kept in flight during the measurements.
    #[arg(long, value_name = "C", default_value_t = 1)]
    concurrency: u32,
}

/// Input the user must correct (a malformed line of a measurements file): exit status 2.
#[derive(Debug)]
struct BadInput(String);

impl std::fmt::Display for BadInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadInput {}

fn main() -> ExitCode {
    let cli = match greedy_tree::cli::parse::<Cli>("greedy-tree") {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("greedy-tree: {e:#}");
            let bad_input = e
                .chain()
                .any(|c| c.is::<greedy_tree::Error>() || c.is::<BadInput>());
            ExitCode::from(if bad_input { 2 } else { 1 })
        }
    }
}

/// The largest TreeWidth slurm.conf accepts.
const MAX_TREE_WIDTH: u16 = 65533;

/// `--nodes`: a whole number of at least 1 (the root counts).
fn node_count(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        Ok(_) => Err("must be at least 1 (the root counts)".into()),
        Err(_) => Err("expected a whole number".into()),
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<io::Error>())
        .any(|io| io.kind() == io::ErrorKind::BrokenPipe)
}

fn run(cli: Cli) -> Result<()> {
    let mut out = io::BufWriter::new(io::stdout().lock());
    match cli.command {
        Command::Plan(args) => plan(&args, &mut out)?,
        Command::Compare(args) => {
            let model = args.model.model()?;
            let topologies = if args.topologies.is_empty() {
                Topology::default_set()
            } else {
                args.topologies
                    .iter()
                    .map(|t| t.parse())
                    .collect::<Result<_, _>>()?
            };
            let n = args.nodes;
            let ranking = render::rank(&topologies, n, &model);
            if args.json {
                render::ranking_json(&mut out, &ranking)?;
            } else {
                render::ranking_text(&mut out, &ranking, n, &model)?;
            }
        }
        Command::Calibrate(args) => {
            let text = std::fs::read_to_string(&args.launches)
                .with_context(|| format!("{}", args.launches.display()))?;
            let launches = parse_launches(&text, args.concurrency)
                .with_context(|| format!("{}", args.launches.display()))?;
            let fit = calibrate::fit_launches(&launches, args.concurrency)?;
            writeln!(
                out,
                "seq {:.6} rem {:.6} r_squared {:.4} rms_error {:.6} launches {}",
                fit.model.seq(),
                fit.model.rem(),
                fit.r_squared,
                fit.rms_error,
                launches.len()
            )?;
            writeln!(
                out,
                "# use: --seq {:.6} --rem {:.6}",
                fit.model.seq(),
                fit.model.rem()
            )?;
        }
    }
    out.flush()?;
    Ok(())
}

/// `greedy-tree plan`.
fn plan(args: &PlanArgs, out: &mut impl Write) -> Result<()> {
    let hosts = read_hosts(&args.hosts)?;
    let (tree, model, name) = match args.slurm_release {
        None => {
            let model = args.model.model()?;
            let topology: Topology = args.topology.parse()?;
            if matches!(args.format, Format::Summary | Format::SummaryJson) {
                // The library gives the shape without a tree where it can (the greedy tree:
                // 10^7 hosts in ~40 ms, no per-host memory).
                let summary = render::Summary {
                    topology: &topology.to_string(),
                    model: &model,
                    nodes: hosts.len(),
                    shape: topology.shape(hosts.len(), &model),
                };
                match args.format {
                    Format::SummaryJson => summary.json(out)?,
                    _ => summary.text(out)?,
                }
                return Ok(());
            }
            (
                topology.build(hosts.len(), &model),
                model,
                topology.to_string(),
            )
        }
        Some(release) => slurm_plan(args, release, hosts.len())?,
    };
    let plan = render::Plan {
        hosts: &hosts,
        tree: &tree,
        model: &model,
        topology: &name,
        slurm: args.slurm_release,
    };
    match args.format {
        Format::Text => plan.text(out)?,
        Format::Json => plan.json(out)?,
        Format::Dot => plan.dot(out)?,
        Format::Summary => plan.summary().text(out)?,
        Format::SummaryJson => plan.summary().json(out)?,
        Format::Svg => plan.svg(out)?,
    }
    Ok(())
}

/// The tree, the model (capped at TreeWidth) and the shape's name of `plan --slurm-release`
/// over `n` positions, srun first.
fn slurm_plan(
    args: &PlanArgs,
    release: SlurmRelease,
    n: usize,
) -> Result<(Tree, LaunchModel, String)> {
    let tree_width = match args.model.max_fanout {
        None => release.default_tree_width(),
        Some(k) => u16::try_from(k)
            .ok()
            .filter(|&k| k <= MAX_TREE_WIDTH)
            .ok_or_else(|| {
                BadInput(format!(
                    "TreeWidth {k}: Slurm allows at most {MAX_TREE_WIDTH}"
                ))
            })?,
    };
    let model = args.model.model()?.with_max_fanout(u32::from(tree_width))?;
    let tree = match args.topology.as_str() {
        "greedy" => release.greedy_plan(n - 1, tree_width, &model),
        "treewidth" => treewidth::tree(release.split_rule(), n - 1, tree_width),
        other => {
            return Err(BadInput(format!(
                "--topology {other:?} with --slurm-release: expected greedy or treewidth"
            ))
            .into());
        }
    };
    Ok((tree, model, format!("slurm-{release}:{}", args.topology)))
}

/// `TOPOLOGY NODES SECONDS` lines; the trees are built with any model (shapes other than
/// greedy ignore it; a timed greedy launch should be given as the shape it really had).
fn parse_launches(text: &str, concurrency: u32) -> Result<Vec<calibrate::Launch>> {
    let shape_model = LaunchModel::default().with_concurrency(concurrency)?;
    let mut launches = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("");
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.is_empty() {
            continue;
        }
        let bad = |what: &str| BadInput(format!("line {}: {what}: {raw:?}", i + 1));
        let [topology, nodes, seconds] = words[..] else {
            return Err(bad("expected TOPOLOGY NODES SECONDS").into());
        };
        let topology: Topology = topology.parse().map_err(|e| bad(&format!("{e}")))?;
        let nodes = node_count(nodes).map_err(|e| bad(&format!("nodes {e}")))?;
        let seconds: f64 = seconds
            .parse()
            .map_err(|_| bad("seconds must be a number"))?;
        launches.push(calibrate::Launch {
            tree: topology.build(nodes, &shape_model),
            seconds,
        });
    }
    Ok(launches)
}

fn read_hosts(args: &HostsArgs) -> Result<Hosts> {
    if let Some(n) = args.nodes {
        return Ok(Hosts::Numbered(n));
    }
    if let Some(expr) = &args.hosts {
        return Ok(Hosts::Named(hostlist::expand(expr)?));
    }
    let path = args.hostfile.as_ref().context("no hosts given")?;
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let hosts = hostfile::parse(&text).with_context(|| format!("{}", path.display()))?;
    Ok(Hosts::Named(hosts.into_iter().map(|h| h.host).collect()))
}
