//! The Markdown section of docs/benchmarks.md that the simulator owns, and its SVG plots:
//! validation against the measured launches, launch and wire-up at 10^3–10^6 nodes, and the
//! allgather algorithms at 100k ranks.

use crate::plot::{self, Line};
use crate::validate::{self, Group};
use crate::wireup::{self, Allgather, Net};
use crate::{Error, Jitter, Noise, Scenario, Shape, Spread};
use greedy_tree::{LaunchModel, Topology};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

/// What the projections simulate.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Monte Carlo runs per configuration.
    pub runs: usize,
    /// Seed of the first run.
    pub seed: u64,
    /// Node counts of the scale table.
    pub nodes: Vec<usize>,
    /// Launch shapes compared.
    pub shapes: Vec<Shape>,
    /// Launch noise.
    pub noise: Noise,
    /// Message costs of the wire-up.
    pub net: Net,
    /// Ranks per node and endpoint bytes per rank in the scale table.
    pub ppn: u32,
    /// Endpoint bytes per rank.
    pub bytes_per_rank: f64,
    /// greedy-pmix's default `AllgatherRule`: the tree up to this many bytes in total…
    pub tree_max: f64,
    /// …past it the ring on up to this many nodes, Bruck's algorithm on more.
    pub ring_max_nodes: usize,
    /// Which measured shell's fitted model the projections use (its lowest delay).
    pub project_from: String,
    /// Ranks of the allgather comparison.
    pub allgather_ranks: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            runs: 7,
            seed: 1,
            nodes: vec![1_000, 10_000, 100_000, 1_000_000],
            shapes: [
                "greedy",
                "greedy-cap:16",
                "greedy-cap:50",
                "treewidth:16",
                "treewidth:50",
                "radix:64",
                "kary:32",
            ]
            .iter()
            .map(|s| s.parse().expect("valid shape names"))
            .collect(),
            noise: Noise {
                jitter: Jitter::LogNormal(0.2),
                straggler_p: 0.001,
                straggler_factor: 5.0,
            },
            // From docs/benchmarks.md's loopback overlay: ≈ 120 µs for a 2-agent allgather
            // (two hops) and ≈ 27 ms for an 8-agent ring of 1 MiB blobs (7 hops).
            net: Net {
                alpha: 50e-6,
                beta: 3.6e-9,
                gamma: 5e-6,
            },
            ppn: 1,
            bytes_per_rank: 1024.0,
            tree_max: 256.0 * 1024.0,
            ring_max_nodes: 16,
            project_from: "ssh".into(),
            allgather_ranks: 100_000,
        }
    }
}

fn secs(s: f64) -> String {
    if s >= 100.0 {
        format!("{s:.0}")
    } else if s >= 10.0 {
        format!("{s:.1}")
    } else if s >= 0.1 {
        format!("{s:.2}")
    } else {
        format!("{s:.4}")
    }
}

fn spread(s: &Spread) -> String {
    format!("{} ({}–{})", secs(s.median), secs(s.p5), secs(s.p95))
}

fn nodes_label(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

/// Writes the plots into `out/plots/` and returns the Markdown section.
pub fn report(groups: &[Group], settings: &Settings, out: &Path) -> Result<String, Error> {
    let plots = out.join("plots");
    std::fs::create_dir_all(&plots).map_err(|e| Error::Plot {
        path: plots.clone(),
        reason: e.to_string(),
    })?;
    let mut md = String::new();
    validation_section(&mut md, groups, &plots)?;
    let source = groups
        .iter()
        .find(|g| g.shell == settings.project_from)
        .or(groups.first())
        .ok_or_else(|| Error::param("measured", "(empty)", "no measurements to project from"))?;
    let model = source.sim.model;
    scale_section(&mut md, source, &model, settings, &plots)?;
    allgather_section(&mut md, &model, settings, &plots)?;
    Ok(md)
}

fn validation_section(md: &mut String, groups: &[Group], plots: &Path) -> Result<(), Error> {
    let (eq2, sim) = validate::errors(groups);
    let n: usize = groups.iter().map(|g| g.checks.len()).sum();
    let _ = writeln!(md, "### Validation against the emulated cluster\n");
    let _ = writeln!(
        md,
        "{n} measured launches (`docs/data/launch.csv`: greedyrun `--pmi none -- true`, launch \
         start → last agent's hello). Per remote shell and delay, two fits by least squares: \
         **eq. 2** (SEQ, REM and a fixed overhead, greedy-tree's calibrate, the seed's Figure 4 \
         method) and the **simulation** (the same plus every host sharing the machine's cores: \
         a launch's CPU share of REM queues for a core, and greedyrun's `--batch 8` cap on \
         launches in flight).\n"
    );
    write_fit_table(md, groups);
    let _ = writeln!(
        md,
        "\n**Error over all {n} launches: eq. 2 mean {:.0} %, max {:.0} %; simulation mean {:.0} %, max {:.0} %.**\n",
        eq2.mean * 100.0,
        eq2.max * 100.0,
        sim.mean * 100.0,
        sim.max * 100.0
    );
    // Per configuration: median of the repetitions.
    let (eq2_points, sim_points) = write_config_table(md, groups);
    plot::scatter(
        &plots.join("sim-validation.svg"),
        "Launch time: predicted vs measured (emulated cluster)",
        &[
            Line {
                name: "eq. 2 fit".into(),
                points: eq2_points,
            },
            Line {
                name: "simulation (shared CPU, batch 8)".into(),
                points: sim_points,
            },
        ],
    )?;
    let _ = writeln!(md, "\n![predicted vs measured](plots/sim-validation.svg)\n");
    Ok(())
}

/// Per (shell, delay): both fits' parameters, R² and errors.
fn write_fit_table(md: &mut String, groups: &[Group]) {
    let _ = writeln!(
        md,
        "| shell | delay ms | eq. 2: SEQ ms | REM ms | overhead ms | R² | sim: SEQ ms | REM ms | CPU ms/launch (cores) | overhead ms | R² | eq. 2 error mean / max | sim error mean / max |"
    );
    let _ = writeln!(
        md,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for g in groups {
        let (e, s) = g.errors();
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} | {:.1} | {:.0} | {:.3} | {:.1} | {:.1} | {:.1} ({}) | {:.0} | {:.3} | {:.0} % / {:.0} % | {:.0} % / {:.0} % |",
            g.shell,
            g.delay_ms,
            g.eq2.model.seq() * 1e3,
            g.eq2.model.rem() * 1e3,
            g.eq2.overhead * 1e3,
            g.eq2.r_squared,
            g.sim.model.seq() * 1e3,
            g.sim.model.rem() * 1e3,
            g.sim.cpu.work * 1e3,
            g.sim.cpu.cores,
            g.sim.overhead * 1e3,
            g.sim.r_squared,
            e.mean * 100.0,
            e.max * 100.0,
            s.mean * 100.0,
            s.max * 100.0,
        );
    }
}

/// (measured, predicted) seconds, one per configuration.
type Points = Vec<(f64, f64)>;

/// Per configuration, the median measured launch and both predictions; returns the
/// (measured, predicted) points of eq. 2 and of the simulation.
fn write_config_table(md: &mut String, groups: &[Group]) -> (Points, Points) {
    let _ = writeln!(
        md,
        "| shell | delay ms | hosts | topology | measured s, median (min–max) | eq. 2 s | sim s | sim error |"
    );
    let _ = writeln!(md, "|---|---:|---:|---|---:|---:|---:|---:|");
    let mut eq2_points = Vec::new();
    let mut sim_points = Vec::new();
    for g in groups {
        for ((hosts, topology), checks) in configs(g) {
            let measured: Vec<f64> = checks.iter().map(|c| c.measured.seconds).collect();
            let m = Spread::of(&measured);
            let (lo, hi) = measured
                .iter()
                .fold((f64::MAX, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
            let (e2, si) = (checks[0].eq2, checks[0].simulated);
            eq2_points.push((m.median, e2));
            sim_points.push((m.median, si));
            let _ = writeln!(
                md,
                "| {} | {} | {hosts} | {topology} | {:.3} ({:.3}–{:.3}) | {:.3} | {:.3} | {:+.0} % |",
                g.shell,
                g.delay_ms,
                m.median,
                lo,
                hi,
                e2,
                si,
                (si - m.median) / m.median * 100.0
            );
        }
    }
    (eq2_points, sim_points)
}

/// A group's checks by (hosts, topology).
fn configs(g: &Group) -> BTreeMap<(usize, String), Vec<&validate::Check>> {
    let mut configs: BTreeMap<(usize, String), Vec<&validate::Check>> = BTreeMap::new();
    for c in &g.checks {
        configs
            .entry((c.measured.hosts, c.measured.topology.to_string()))
            .or_default()
            .push(c);
    }
    configs
}

fn scale_section(
    md: &mut String,
    source: &Group,
    model: &LaunchModel,
    s: &Settings,
    plots: &Path,
) -> Result<(), Error> {
    write_scale_intro(md, source, model, s);
    let header: String = s
        .nodes
        .iter()
        .map(|&n| format!(" {} |", nodes_label(n)))
        .collect();
    let rule: String = s.nodes.iter().map(|_| "---:|").collect();
    let mut launch_rows = String::new();
    let mut wired_rows = String::new();
    let mut lines = Vec::new();
    let mut marks = Vec::new();
    for shape in &s.shapes {
        let row = ScaleRow::of(*shape, model, s)?;
        launch_rows.push_str(&row.launch);
        launch_rows.push('\n');
        wired_rows.push_str(&row.wired);
        wired_rows.push('\n');
        lines.push(Line {
            name: shape.to_string(),
            points: row.quiet,
        });
        marks.push(Line {
            name: shape.to_string(),
            points: row.noisy,
        });
    }
    let _ = writeln!(
        md,
        "Launch, seconds: noise-free (the model) / with noise, median (p5–p95); d = depth, f = largest fan-out:\n\n| shape |{header}\n|---|{rule}\n{launch_rows}"
    );
    let _ = writeln!(
        md,
        "Launch + wire-up, seconds:\n\n| shape |{header}\n|---|{rule}\n{wired_rows}"
    );
    plot::by_nodes(
        &plots.join("sim-scale.svg"),
        "Launch time: lines noise-free (the model), dots the median with noise",
        "seconds",
        false,
        &lines,
        &marks,
    )?;
    let _ = writeln!(md, "![launch time by nodes](plots/sim-scale.svg)\n");
    Ok(())
}

/// The projection's heading and the paragraph saying what it simulates.
fn write_scale_intro(md: &mut String, source: &Group, model: &LaunchModel, s: &Settings) {
    let _ = writeln!(md, "### Projection: 1k–1M nodes\n");
    let _ = writeln!(
        md,
        "The simulation's {} fit at {} ms delay (SEQ {:.1} ms, REM {:.1} ms) with every host on its own CPU, no \
         batch cap (as the model), launch noise {} per SEQ and REM and {:.1} % stragglers × {}; \
         median (p5–p95) of {} runs, seconds. Then the wire-up: {} rank(s) per node × {} bytes \
         allgathered as greedy-pmix does (tree up to {} KiB in total, else the ring on up to {} \
         nodes and Bruck's algorithm on more), α {} µs, β {} \
         ns/byte, γ {} µs per message. `greedy-cap:K` is greedy under Slurm's TreeWidth K \
         (route/greedy), `kary:K` Slurm's own TreeWidth K fan-out (K = 16, 50), Open MPI's \
         radix 64, and k-ary 32.\n",
        source.shell,
        source.delay_ms,
        model.seq() * 1e3,
        model.rem() * 1e3,
        s.noise.jitter,
        s.noise.straggler_p * 100.0,
        s.noise.straggler_factor,
        s.runs,
        s.ppn,
        s.bytes_per_rank,
        s.tree_max / 1024.0,
        s.ring_max_nodes,
        s.net.alpha * 1e6,
        s.net.beta * 1e9,
        s.net.gamma * 1e6,
    );
}

/// One shape across the scale table's node counts.
struct ScaleRow {
    /// Launch table cells, `| shape |` first, no newline.
    launch: String,
    /// Launch + wire-up table cells, likewise.
    wired: String,
    /// (nodes, noise-free launch seconds).
    quiet: Vec<(f64, f64)>,
    /// (nodes, median launch seconds with noise).
    noisy: Vec<(f64, f64)>,
}

impl ScaleRow {
    /// Simulates `shape` at every node count of `s`, with and without noise.
    fn of(shape: Shape, model: &LaunchModel, s: &Settings) -> Result<Self, Error> {
        let mut row = ScaleRow {
            launch: format!("| {shape} |"),
            wired: format!("| {shape} |"),
            quiet: Vec::new(),
            noisy: Vec::new(),
        };
        for &n in &s.nodes {
            let alg = allgather_rule(n, s);
            let scenario = Scenario {
                nodes: n,
                ppn: s.ppn,
                bytes_per_rank: s.bytes_per_rank,
                shape,
                model: *model,
                noise: s.noise,
                limits: Default::default(),
                rank_start: 0.0,
                allgather: Some(alg),
                net: s.net,
            };
            let sum = scenario.run(s.runs, s.seed)?;
            let quiet = Scenario {
                noise: Noise::NONE,
                allgather: None,
                ..scenario
            }
            .run(1, 0)?;
            let _ = write!(
                row.launch,
                " {} / {} d{} f{} |",
                secs(quiet.launched.median),
                spread(&sum.launched),
                sum.depth,
                sum.max_fanout
            );
            let _ = write!(row.wired, " {} ({alg}) |", spread(&sum.wired));
            row.quiet.push((n as f64, quiet.launched.median));
            row.noisy.push((n as f64, sum.launched.median));
        }
        Ok(row)
    }
}

/// The allgather greedy-pmix picks for `n` nodes (its default `AllgatherRule`).
fn allgather_rule(n: usize, s: &Settings) -> Allgather {
    let total = n as f64 * f64::from(s.ppn) * s.bytes_per_rank;
    if total <= s.tree_max {
        Allgather::Tree
    } else if n <= s.ring_max_nodes {
        Allgather::Ring
    } else {
        Allgather::Bruck
    }
}

fn allgather_section(
    md: &mut String,
    model: &LaunchModel,
    s: &Settings,
    plots: &Path,
) -> Result<(), Error> {
    let ranks = s.allgather_ranks;
    let _ = writeln!(
        md,
        "### Allgather at {} ranks × {} bytes: tree vs ring vs Bruck\n",
        nodes_label(ranks),
        s.bytes_per_rank
    );
    let _ = writeln!(
        md,
        "Every node ready at 0 (the allgather alone), same α/β/γ; the tree is the greedy tree \
         over the nodes; each node contributes its ranks' blobs. Seconds.\n"
    );
    let _ = writeln!(md, "| nodes × ranks/node | tree | ring | Bruck |");
    let _ = writeln!(md, "|---|---:|---:|---:|");
    let algs = [Allgather::Tree, Allgather::Ring, Allgather::Bruck];
    for ppn in [1usize, 8, 64] {
        let nodes = ranks.div_ceil(ppn);
        let overlay = Topology::Greedy.build(nodes, model);
        let ready = vec![0.0; nodes];
        let bytes = ppn as f64 * s.bytes_per_rank;
        let t: Vec<String> = algs
            .iter()
            .map(|&a| secs(wireup::allgather(a, &overlay, &ready, bytes, &s.net)))
            .collect();
        let _ = writeln!(md, "| {nodes} × {ppn} | {} | {} | {} |", t[0], t[1], t[2]);
    }
    let mut lines: Vec<Line> = algs
        .iter()
        .map(|a| Line {
            name: a.to_string(),
            points: Vec::new(),
        })
        .collect();
    let largest = s.nodes.iter().copied().max().unwrap_or(1_000);
    let sizes = [
        1_000usize, 3_000, 10_000, 30_000, 100_000, 300_000, 1_000_000,
    ];
    for &n in sizes.iter().filter(|&&n| n <= largest.max(1_000)) {
        let overlay = Topology::Greedy.build(n, model);
        let ready = vec![0.0; n];
        for (line, &a) in lines.iter_mut().zip(&algs) {
            let t = wireup::allgather(a, &overlay, &ready, s.bytes_per_rank, &s.net);
            line.points.push((n as f64, t));
        }
    }
    plot::by_nodes(
        &plots.join("sim-allgather.svg"),
        "Allgather of 1 KB per node (1 rank each), simulated",
        "seconds",
        true,
        &lines,
        &[],
    )?;
    let _ = writeln!(md, "\n![allgather by nodes](plots/sim-allgather.svg)\n");
    Ok(())
}
