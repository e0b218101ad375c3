//! The sections: how each one is measured (which script, with which sizes) and how its rows
//! become a table and a plot.

use std::{collections::BTreeMap, fmt::Write as _, path::Path, process::Command};

use anyhow::{Context, Result, bail};

use crate::{
    ctx::Ctx,
    data::{self, CharmRun, LauncherRun, MpiStep, RouteRun},
    load::{LoadRecord, Recorder},
    plot::{self, BarGroup},
    stats::{Summary, Times, ratio},
    validation,
};

/// Emulated packet delay of the launcher and charm comparisons (login↔host RTT 10 ms).
pub(crate) const DELAY_MS: u32 = 10;

/// One part of docs/benchmarks.md that is measured and rendered together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Section {
    /// greedyrun vs Hydra vs Open MPI mpirun (tests/launcher/bench.sh parts A and C).
    Launchers,
    /// greedyrun --pmi charm vs charmrun (tests/charm/bench.sh).
    Charm,
    /// srun --mpi=greedy vs pmi2 / pmix (tests/slurm/mpi-bench.sh).
    SlurmMpi,
    /// route/greedy vs route/default (tests/slurm/route-bench.sh).
    Route,
    /// Measured vs modeled launch times (tests/launcher/bench.sh part M per delay).
    Model,
    /// The simulator's report on the model-validation data (greedy-sim, if built).
    Sim,
}

impl Section {
    /// Every section, in the order `all` runs them; the model validation first: it is the longest and the simulator's input.
    pub(crate) const ALL: [Section; 6] = [
        Section::Model,
        Section::Launchers,
        Section::Charm,
        Section::SlurmMpi,
        Section::Route,
        Section::Sim,
    ];

    /// Name on the command line, in markers and in docs/data/load.csv.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Section::Launchers => "launchers",
            Section::Charm => "charm",
            Section::SlurmMpi => "slurm-mpi",
            Section::Route => "route",
            Section::Model => "model",
            Section::Sim => "sim",
        }
    }

    /// Parses a name (clap's value parser).
    pub(crate) fn parse(s: &str) -> Result<Section, String> {
        Section::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Section::ALL.iter().map(|x| x.name()).collect();
                format!("unknown section {s:?}; one of {}", names.join(", "))
            })
    }

    /// Runs the section's measurement, records the load meanwhile, writes docs/data.
    pub(crate) fn measure(self, ctx: &Ctx) -> Result<()> {
        if self == Section::Sim {
            // Not a measurement: the simulator reads docs/data; doc::regenerate splices it.
            return simulate(ctx);
        }
        let rec = Recorder::start(self.name())?;
        match self {
            Section::Launchers => measure_launchers(ctx)?,
            Section::Charm => measure_charm(ctx)?,
            Section::SlurmMpi => measure_slurm_mpi(ctx)?,
            Section::Route => measure_route(ctx)?,
            Section::Model => validation::measure(ctx)?,
            Section::Sim => unreachable!("handled above"),
        }
        save_load(ctx, rec.finish())
    }

    /// The markdown between this section's markers; `None` when docs/data has nothing for it
    /// yet (the block is then left as it is).
    pub(crate) fn render(self, ctx: &Ctx, load: Option<&LoadRecord>) -> Result<Option<String>> {
        let body = match self {
            Section::Launchers => render_launchers(ctx)?,
            Section::Charm => render_charm(ctx)?,
            Section::SlurmMpi => render_slurm_mpi(ctx)?,
            Section::Route => render_route(ctx)?,
            Section::Model => validation::render(ctx)?,
            Section::Sim => String::new(),
        };
        Ok(match (body.is_empty(), load) {
            (true, _) => None,
            (false, Some(l)) => Some(format!("{}\n\n{body}", l.sentence())),
            (false, None) => Some(body),
        })
    }
}

/// Replaces this section's row of docs/data/load.csv.
fn save_load(ctx: &Ctx, rec: LoadRecord) -> Result<()> {
    let path = ctx.data("load.csv");
    let mut rows: Vec<LoadRecord> = data::read_if_any(&path)?;
    rows.retain(|r| r.section != rec.section);
    rows.push(rec);
    data::write(&path, &rows)
}

/// Stands for the CSV file's path in [`csv_script`]'s arguments and environment.
const CSV: &str = "{csv}";

/// Runs a script that appends its runs to a CSV file (given where [`CSV`] stands) in a fresh
/// scratch directory, then keeps them as docs/data/NAME.csv.
fn csv_script<T: serde::de::DeserializeOwned + serde::Serialize>(
    ctx: &Ctx,
    name: &str,
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<()> {
    let csv = ctx.scratch(name)?.join(format!("{name}.csv"));
    let path = csv.to_str().context("non-UTF-8 path")?;
    let args: Vec<&str> = args
        .iter()
        .map(|a| if *a == CSV { path } else { a })
        .collect();
    let env: Vec<(&str, &str)> = env
        .iter()
        .map(|&(k, v)| (k, if v == CSV { path } else { v }))
        .collect();
    ctx.script(script, &args, &env)?;
    keep::<T>(ctx, &csv, &format!("{name}.csv"))
}

/// Copies a script's CSV into docs/data after checking it parses as `T`.
fn keep<T: serde::de::DeserializeOwned + serde::Serialize>(
    ctx: &Ctx,
    from: &Path,
    name: &str,
) -> Result<()> {
    let rows: Vec<T> = data::read(from)?;
    if rows.is_empty() {
        bail!("{}: no runs recorded", from.display());
    }
    data::write(&ctx.data(name), &rows)
}

// --- launchers -------------------------------------------------------------------------------

fn measure_launchers(ctx: &Ctx) -> Result<()> {
    let out = ctx.scratch("launchers")?;
    let reps = ctx.reps.to_string();
    let (sizes, csize) = if ctx.quick { ("4", "8") } else { ("16", "64") };
    let delay = DELAY_MS.to_string();
    ctx.script(
        "tests/launcher/bench.sh",
        &[],
        &[
            ("BENCH_OUT", out.to_str().context("non-UTF-8 path")?),
            ("PARTS", "A C"),
            ("SIZES", sizes),
            ("CSIZE", csize),
            ("RUNS", &reps),
            ("DELAY", &delay),
            // At most 5 s waiting for an idle machine per run: with other builds running it
            // is never idle, and 15 s per run would triple the section.
            ("SETTLE", "10"),
        ],
    )?;
    keep::<LauncherRun>(ctx, &out.join("results.csv"), "launchers.csv")
}

/// Launcher configurations in table order, and what each one is.
const LAUNCHERS: [(&str, &str); 7] = [
    (
        "gr-greedy",
        "greedyrun defaults (greedy tree, cheap ssh hops)",
    ),
    ("gr-greedy-pmi", "the same with the PMI wire-up started"),
    ("gr-greedy-rsh", "greedyrun over rsh"),
    ("gr-flat", "greedyrun --topology flat (cheap hops, no tree)"),
    (
        "gr-flat-kex",
        "greedyrun flat with Debian's default ssh KEX (Hydra's hops)",
    ),
    ("hydra", "MPICH 5.0.2 mpiexec.hydra -launcher ssh"),
    ("ompi", "Open MPI 4.1.4 mpirun (tree spawn)"),
];

fn render_launchers(ctx: &Ctx) -> Result<String> {
    let rows: Vec<LauncherRun> = data::read_if_any(&ctx.data("launchers.csv"))?;
    let mut out = String::new();
    for (part, what, file) in [
        (
            "A",
            "MPI hello (tests/mpi/wireup.c), 1 rank per host",
            "launchers-mpi.svg",
        ),
        ("C", "`hostname` (launch only)", "launchers-hostname.svg"),
    ] {
        let rows: Vec<&LauncherRun> = rows.iter().filter(|r| r.part == part).collect();
        let Some(hosts) = rows.first().map(|r| r.hosts) else {
            continue;
        };
        let wall = |cfg: &str| {
            Summary::of(
                rows.iter()
                    .filter(|r| r.config == cfg && r.succeeded())
                    .map(|r| r.wall_ms),
            )
        };
        let reference = wall("gr-greedy");
        writeln!(
            out,
            "**{what}, {hosts} hosts, {DELAY_MS} ms delay** (wall ms, launcher start to exit; \
             median (min–max) of the successful runs):\n"
        )?;
        out.push_str(
            "| config | what | wall ms | ok | CPU-s | launch ms | model ms | vs greedyrun |\n",
        );
        out.push_str("|---|---|---|---|---|---|---|---|\n");
        let mut bars = vec![];
        for (cfg, desc) in LAUNCHERS {
            let runs: Vec<&&LauncherRun> = rows.iter().filter(|r| r.config == cfg).collect();
            if runs.is_empty() {
                continue;
            }
            let ok = runs.iter().filter(|r| r.succeeded()).count();
            let w = wall(cfg);
            let cpu = Summary::of(runs.iter().map(|r| r.cpu_s));
            let launch = Summary::of(runs.iter().filter_map(|r| r.launch_ms));
            let model = Summary::of(runs.iter().filter_map(|r| r.model_ms));
            let opt = |s: Option<Summary>, d: usize| {
                s.map_or(String::new(), |s| format!("{:.d$}", s.median))
            };
            writeln!(
                out,
                "| {cfg} | {desc} | {} | {ok}/{} | {} | {} | {} | {} |",
                w.map_or("all failed".into(), |s| s.cell(0)),
                runs.len(),
                opt(cpu, 2),
                opt(launch, 0),
                opt(model, 0),
                Times(ratio(w, reference)),
            )?;
            if let Some(w) = w {
                bars.push((cfg.to_owned(), w));
            }
        }
        out.push('\n');
        let title = format!(
            "{}, {hosts} hosts, {DELAY_MS} ms: {}",
            if part == "A" { "MPI hello" } else { "hostname" },
            ratio_title(&bars, "gr-greedy", &["hydra", "ompi"])
        );
        plot::bars(
            &ctx.plot(file),
            &title,
            "wall ms (median, min–max)",
            &one_bar_each(&bars),
        )?;
        writeln!(out, "![{title}](plots/{file})\n")?;
    }
    Ok(out)
}

/// "0.89–1.11": the range of some ratios ("—" for none).
fn span(ratios: &[f64]) -> String {
    let (lo, hi) = ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    if ratios.is_empty() {
        "—".into()
    } else {
        format!("{lo:.2}–{hi:.2}")
    }
}

/// One group per competitor, labelled with its name.
fn one_bar_each(bars: &[(String, Summary)]) -> Vec<BarGroup> {
    bars.iter()
        .map(|(name, s)| BarGroup {
            label: name.clone(),
            bars: vec![(name.clone(), *s)],
        })
        .collect()
}

/// "hydra 1.07×, ompi 1.21× gr-greedy": the others' medians over the reference's.
fn ratio_title(bars: &[(String, Summary)], reference: &str, others: &[&str]) -> String {
    let get = |n: &str| bars.iter().find(|(s, _)| s == n).map(|(_, s)| *s);
    let parts: Vec<String> = others
        .iter()
        .filter_map(|o| ratio(get(o), get(reference)).map(|r| format!("{o} {r:.2}×")))
        .collect();
    if parts.is_empty() {
        reference.to_owned()
    } else {
        format!("{} {reference}", parts.join(", "))
    }
}

// --- charm -----------------------------------------------------------------------------------

fn measure_charm(ctx: &Ctx) -> Result<()> {
    let (reps, delay) = (ctx.reps.to_string(), DELAY_MS.to_string());
    let nodes = if ctx.quick { "4" } else { "16" };
    csv_script::<CharmRun>(
        ctx,
        "charm",
        "tests/charm/bench.sh",
        &[],
        &[
            ("CSV", CSV),
            ("RUNS", &reps),
            ("NODES", nodes),
            ("DELAY", &delay),
        ],
    )
}

fn render_charm(ctx: &Ctx) -> Result<String> {
    let rows: Vec<CharmRun> = data::read_if_any(&ctx.data("charm.csv"))?;
    let Some(first) = rows.first() else {
        return Ok(String::new());
    };
    let (nodes, delay) = (first.nodes, first.delay_ms);
    let by = |l: &str| Summary::of(rows.iter().filter(|r| r.launcher == l).map(|r| r.ms));
    let g = by("greedy");
    let mut out =
        String::from("| launcher | median (min–max), ms | vs greedyrun |\n|---|---|---|\n");
    let mut bars = vec![];
    for (l, label, short) in [
        ("greedy", "greedyrun `--pmi charm`", "greedyrun"),
        ("charmrun", "charmrun, ssh, default", "charmrun"),
        (
            "charmrun_batch",
            "charmrun, ssh, `++batch 4`",
            "charmrun ++batch 4",
        ),
    ] {
        if let Some(s) = by(l) {
            writeln!(
                out,
                "| {label} | {} | {} |",
                s.cell(0),
                Times(ratio(Some(s), g))
            )?;
            bars.push((short.to_owned(), s));
        }
    }
    let title = format!(
        "charm4py, {nodes} hosts, {delay} ms: {}",
        ratio_title(&bars, "greedyrun", &["charmrun", "charmrun ++batch 4"])
    );
    plot::bars(
        &ctx.plot("charm.svg"),
        &title,
        "start to finish, ms",
        &one_bar_each(&bars),
    )?;
    writeln!(
        out,
        "\n({} runs each, {nodes} hosts, --delay {delay})\n\n![{title}](plots/charm.svg)\n",
        by("greedy").map_or(0, |s| s.n)
    )?;
    Ok(out)
}

// --- slurm-mpi -------------------------------------------------------------------------------

fn measure_slurm_mpi(ctx: &Ctx) -> Result<()> {
    let reps = ctx.reps.to_string();
    let mut args = vec!["--reps", &reps, "--csv", CSV];
    if ctx.quick {
        args.extend(["--delays", "0", "--nodes", "4"]);
    }
    csv_script::<MpiStep>(ctx, "slurm-mpi", "tests/slurm/mpi-bench.sh", &args, &[])
}

fn render_slurm_mpi(ctx: &Ctx) -> Result<String> {
    let rows: Vec<MpiStep> = data::read_if_any(&ctx.data("slurm-mpi.csv"))?;
    if rows.is_empty() {
        return Ok(String::new());
    }
    let cells = mpi_cells(&rows);
    let mut out = String::from(
        "| delay | nodes x ranks | MPI | metric | greedy ms (median, min–max) | other ms (median, min–max) | greedy/other |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let mut groups = vec![];
    let mut ratios = vec![];
    for (delay, nodes, ranks, mpi) in &cells {
        let other = if mpi == "mpich" { "pmi2" } else { "pmix" };
        let steps = |plugin: &str| mpi_steps(&rows, (*delay, *nodes, *ranks, mpi), plugin);
        let (g, o) = (steps("greedy"), steps(other));
        for (metric, label) in [("init", "all ranks past MPI_Init"), ("exit", "srun exit")] {
            let pick = |s: &&MpiStep| {
                if metric == "init" {
                    s.init_ms
                } else {
                    s.exit_ms
                }
            };
            let gs = Summary::of(g.iter().filter_map(pick));
            let os = Summary::of(o.iter().filter_map(pick));
            let r = ratio(gs, os);
            writeln!(
                out,
                "| {delay} ms | {nodes} x {ranks} | {mpi}: greedy vs {other} | {label} | {} | {} | {} |",
                mpi_cell(gs, &g),
                mpi_cell(os, &o),
                r.map_or("—".into(), |r| format!("{r:.2}")),
            )?;
            if metric == "init" {
                ratios.extend(r);
                let mut bars = vec![];
                bars.extend(gs.map(|s| ("srun --mpi=greedy".to_owned(), s)));
                bars.extend(os.map(|s| ("Slurm's pmi2 (MPICH) / pmix (Open MPI)".to_owned(), s)));
                groups.push(BarGroup {
                    label: format!("{mpi} {nodes}×{ranks} {delay}ms"),
                    bars,
                });
            }
        }
    }
    let title = format!(
        "srun, last rank past MPI_Init: greedy / Slurm's own {}",
        span(&ratios)
    );
    plot::bars(
        &ctx.plot("slurm-mpi.svg"),
        &title,
        "ms from srun start (median, min–max)",
        &groups,
    )?;
    writeln!(out, "\n![{title}](plots/slurm-mpi.svg)\n")?;
    Ok(out)
}

/// The (delay, nodes, ranks, mpi) of `rows` in the order measured.
fn mpi_cells(rows: &[MpiStep]) -> Vec<(u32, u32, u32, String)> {
    let mut cells: Vec<(u32, u32, u32, String)> = vec![];
    for r in rows {
        let key = (r.delay_ms, r.nodes, r.ranks, r.mpi.clone());
        if !cells.contains(&key) {
            cells.push(key);
        }
    }
    cells
}

/// The steps of one (delay, nodes, ranks, mpi) cell launched through `plugin`.
fn mpi_steps<'a>(
    rows: &'a [MpiStep],
    (delay, nodes, ranks, mpi): (u32, u32, u32, &str),
    plugin: &str,
) -> Vec<&'a MpiStep> {
    rows.iter()
        .filter(|r| {
            (r.delay_ms, r.nodes, r.ranks) == (delay, nodes, ranks)
                && r.mpi == mpi
                && r.plugin == plugin
        })
        .collect()
}

/// A table cell: the summary of one metric and how many of `steps` failed.
fn mpi_cell(s: Option<Summary>, steps: &[&MpiStep]) -> String {
    let failed = steps.iter().filter(|s| s.ok == 0).count();
    let base = s.map_or("all failed".into(), |s| s.cell(0));
    if failed > 0 {
        format!("{base}, {failed} failed")
    } else {
        base
    }
}

// --- route -----------------------------------------------------------------------------------

fn measure_route(ctx: &Ctx) -> Result<()> {
    let reps = ctx.reps.to_string();
    let rounds = if ctx.quick { "1" } else { "2" };
    let args = ["--reps", &reps, "--rounds", rounds, "--csv", CSV];
    csv_script::<RouteRun>(ctx, "route", "tests/slurm/route-bench.sh", &args, &[])
}

fn render_route(ctx: &Ctx) -> Result<String> {
    let rows: Vec<RouteRun> = data::read_if_any(&ctx.data("route.csv"))?;
    let Some(first) = rows.first() else {
        return Ok(String::new());
    };
    let mut by: BTreeMap<(std::cmp::Reverse<u32>, &str), Vec<f64>> = BTreeMap::new();
    for r in &rows {
        by.entry((std::cmp::Reverse(r.treewidth), r.route.as_str()))
            .or_default()
            .push(r.ms);
    }
    let mut widths: Vec<u32> = rows.iter().map(|r| r.treewidth).collect();
    widths.sort_unstable_by(|a, b| b.cmp(a));
    widths.dedup();
    let mut out = String::from(
        "| TreeWidth | route/default ms | route/greedy ms | greedy / default |\n|---|---|---|---|\n",
    );
    let mut groups = vec![];
    let mut ratios = vec![];
    for w in widths {
        let s = |route: &str| {
            by.get(&(std::cmp::Reverse(w), route))
                .and_then(|v| Summary::of(v.iter().copied()))
        };
        let (d, g) = (s("default"), s("greedy"));
        let r = ratio(g, d);
        ratios.extend(r);
        writeln!(
            out,
            "| {w} | {} | {} | {} |",
            d.map_or("—".into(), |s| s.cell(0)),
            g.map_or("—".into(), |s| s.cell(0)),
            r.map_or("—".into(), |r| format!("{r:.2}"))
        )?;
        let mut bars = vec![];
        bars.extend(d.map(|s| ("route/default".to_owned(), s)));
        bars.extend(g.map(|s| ("route/greedy".to_owned(), s)));
        groups.push(BarGroup {
            label: format!("TreeWidth {w}"),
            bars,
        });
    }
    let n = by.values().map(Vec::len).min().unwrap_or(0);
    let title = format!(
        "srun -N16 true, {} ms: greedy / default {}",
        first.delay_ms,
        span(&ratios)
    );
    plot::bars(
        &ctx.plot("route.svg"),
        &title,
        "srun wall ms (median, min–max)",
        &groups,
    )?;
    writeln!(
        out,
        "\n({n} runs each, --delay {})\n\n![{title}](plots/route.svg)\n",
        first.delay_ms
    )?;
    Ok(out)
}

/// Runs the simulator's report on docs/data/launch.csv (greedy-sim, the `sim/` crate) and
/// keeps its stdout for `doc::regenerate`; skips with a message where it does not exist.
pub(crate) fn simulate(ctx: &Ctx) -> Result<()> {
    let sim_report = ctx.sim_report();
    let _ = std::fs::remove_file(&sim_report);
    if !ctx.root.join("sim/Cargo.toml").exists() {
        eprintln!(
            "greedy-bench: sim: skipped: this checkout has no sim/ crate (greedy-sim); the sim block stays as it is"
        );
        return Ok(());
    }
    if !ctx.data("launch.csv").exists() {
        eprintln!(
            "greedy-bench: sim: skipped: no docs/data/launch.csv yet (run the model section first)"
        );
        return Ok(());
    }
    let out = Command::new("cargo")
        .args([
            "run",
            "--release",
            "-q",
            "-p",
            "greedy-sim",
            "--",
            "report",
            "--measured",
            "docs/data/launch.csv",
            "--out",
            "docs/",
        ])
        .current_dir(&ctx.root)
        .output()
        .context("starting cargo run -p greedy-sim")?;
    if !out.status.success() {
        eprintln!(
            "greedy-bench: sim: skipped: `greedy-sim report` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
        return Ok(());
    }
    std::fs::write(&sim_report, &out.stdout).with_context(|| format!("{}", sim_report.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn section_names_parse_back_and_unknown_ones_are_named() {
        for s in Section::ALL {
            assert_eq!(Section::parse(s.name()), Ok(s));
        }
        let err = Section::parse("lunch").unwrap_err();
        assert!(
            err.contains("\"lunch\"") && err.contains("slurm-mpi"),
            "{err}"
        );
    }

    #[test]
    fn ratio_titles_name_each_competitor_against_the_reference() {
        let s = |v: f64| Summary::of([v]).unwrap();
        let bars = vec![
            ("gr-greedy".to_owned(), s(2.0)),
            ("hydra".to_owned(), s(3.0)),
        ];
        assert_eq!(
            ratio_title(&bars, "gr-greedy", &["hydra", "ompi"]),
            "hydra 1.50× gr-greedy"
        );
        assert_eq!(
            ratio_title(&bars[..1], "gr-greedy", &["hydra"]),
            "gr-greedy"
        );
    }
}
