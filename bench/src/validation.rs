//! Model validation, the paper's Figure 4 on our hosts: launch time of every topology across
//! host counts, emulated delays and remote shells, against the SEQ/REM model fitted by least
//! squares (greedy_tree::calibrate), and against an extended model with a shared-CPU term.

use std::{collections::BTreeMap, fmt::Write as _};

use anyhow::{Context, Result};
use greedy_tree::{
    LaunchModel, Topology,
    calibrate::{self, Fit, Launch, r_squared},
};
use serde::{Deserialize, Serialize};

use crate::{
    ctx::Ctx,
    data::{self, CalibrationRow, LaunchRow, LauncherRun},
    plot::{self, Curve, Panel},
    stats::Summary,
};

/// greedyrun's default `--batch`: remote shells a parent keeps in flight.
const BATCH: u32 = 8;

/// The model greedyrun builds its launch trees with, from its `--seq`/`--rem`: under its
/// `--batch` cap.
fn as_greedyrun_plans(m: LaunchModel) -> Result<LaunchModel> {
    m.with_launch_cap(BATCH).context("greedyrun's launch model")
}

/// Topologies measured, in legend order.
const TOPOLOGIES: [&str; 5] = ["flat", "binomial", "kary:4", "kary:8", "greedy"];

/// A launch of the validation that failed (not in launch.csv).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct LaunchFailure {
    /// `rsh` or `ssh`.
    pub(crate) shell: String,
    /// Topology.
    pub(crate) topology: String,
    /// Hosts.
    pub(crate) hosts: u32,
    /// Emulated packet delay, ms.
    pub(crate) delay_ms: u32,
    /// Repetition.
    pub(crate) rep: u32,
    /// greedyrun's exit status.
    pub(crate) rc: i32,
}

/// Runs tests/launcher/bench.sh part M once per delay (one cluster each, released between).
pub(crate) fn measure(ctx: &Ctx) -> Result<()> {
    let (default_delays, sizes): (&[u32], &str) = if ctx.quick {
        (&[0, 10], "8 16")
    } else {
        (&[0, 10, 20], "8 16 32 64")
    };
    let delays = ctx.model_delays.as_deref().unwrap_or(default_delays);
    let reps = ctx.model_reps.to_string();
    for &delay in delays {
        let out = ctx.work.join(format!("model-{delay}"));
        let results = out.join("results.csv");
        if ctx.resume && results.exists() && out.join("calibration.csv").exists() {
            eprintln!(
                "greedy-bench: model: delay {delay} ms: reusing {}",
                results.display()
            );
        } else {
            if out.exists() {
                std::fs::remove_dir_all(&out).with_context(|| format!("{}", out.display()))?;
            }
            let d = delay.to_string();
            ctx.script(
                "tests/launcher/bench.sh",
                &[],
                &[
                    ("BENCH_OUT", out.to_str().context("non-UTF-8 path")?),
                    ("PARTS", "M"),
                    ("SIZES", ""),
                    ("MSIZES", sizes),
                    ("SHELLS", "rsh ssh"),
                    ("RUNS", &reps),
                    ("DELAY", &d),
                    // Launches without MPI leave nothing running behind them: 1 s is enough.
                    ("SETTLE", "2"),
                ],
            )?;
        }
        let runs: Vec<LauncherRun> = data::read(&results)?;
        let (launches, failures) = split_runs(&runs, delay);
        let cals: Vec<CalibrationRow> = data::read(&out.join("calibration.csv"))?;
        // Each delay replaces its own rows as soon as it is measured: a later delay's failure
        // (another test took the cluster) keeps the delays already done.
        replace_delay(&ctx.data("launch.csv"), delay, launches, |r: &LaunchRow| {
            r.delay_ms
        })?;
        replace_delay(
            &ctx.data("launch-calibration.csv"),
            delay,
            cals,
            |r: &CalibrationRow| r.delay_ms,
        )?;
        replace_delay(
            &ctx.data("launch-failures.csv"),
            delay,
            failures,
            |r: &LaunchFailure| r.delay_ms,
        )?;
    }
    Ok(())
}

/// Rewrites a docs/data file with the rows of `delay_ms` replaced by `rows`.
fn replace_delay<T: serde::de::DeserializeOwned + Serialize>(
    path: &std::path::Path,
    delay_ms: u32,
    rows: Vec<T>,
    delay_of: impl Fn(&T) -> u32,
) -> Result<()> {
    let mut all: Vec<T> = data::read_if_any(path)?;
    all.retain(|r| delay_of(r) != delay_ms);
    all.extend(rows);
    data::write(path, &all)
}

/// The script's part-M rows as launch.csv rows (successes) and failures.
fn split_runs(runs: &[LauncherRun], delay_ms: u32) -> (Vec<LaunchRow>, Vec<LaunchFailure>) {
    let (mut ok, mut failed) = (vec![], vec![]);
    for r in runs.iter().filter(|r| r.part == "M") {
        let Some((shell, topology)) = r.config.split_once('-') else {
            continue;
        };
        match r.launch_ms.filter(|_| r.succeeded()) {
            Some(ms) => ok.push(LaunchRow {
                shell: shell.into(),
                topology: topology.into(),
                hosts: r.hosts,
                delay_ms,
                rep: r.run,
                seconds: ms / 1000.0,
            }),
            None => failed.push(LaunchFailure {
                shell: shell.into(),
                topology: topology.into(),
                hosts: r.hosts,
                delay_ms,
                rep: r.run,
                rc: r.rc,
            }),
        }
    }
    (ok, failed)
}

/// Per (topology index, hosts): the runs, or their summary.
type Points<T> = BTreeMap<(usize, u32), T>;

/// The medians of one (shell, delay) and the fits to them.
struct Group {
    shell: String,
    delay_ms: u32,
    /// Calibrated model greedyrun used (its greedy trees were built with it).
    calibrated: Option<LaunchModel>,
    /// (topology, hosts) → runs.
    points: Points<Summary>,
    /// Trees in `points` order.
    launches: Vec<Launch>,
    paper: Fit,
    with_overhead: Fit,
    /// The paper's model with greedyrun's `--batch` (8 shells in flight per parent) as concurrency.
    batched: Fit,
    extended: calibrate::SharedCpuFit,
}

fn topology_index(t: &str) -> usize {
    TOPOLOGIES
        .iter()
        .position(|x| *x == t)
        .unwrap_or(TOPOLOGIES.len())
}

fn groups(rows: &[LaunchRow], cals: &[CalibrationRow]) -> Result<Vec<Group>> {
    let mut by: BTreeMap<(String, u32), Points<Vec<f64>>> = BTreeMap::new();
    for r in rows {
        by.entry((r.shell.clone(), r.delay_ms))
            .or_default()
            .entry((topology_index(&r.topology), r.hosts))
            .or_default()
            .push(r.seconds);
    }
    let mut out = vec![];
    for ((shell, delay_ms), pts) in by {
        let calibrated = cals
            .iter()
            .find(|c| c.shell == shell && c.delay_ms == delay_ms)
            .map(|c| LaunchModel::new(c.seq, c.rem))
            .transpose()
            .with_context(|| format!("calibration of {shell} at {delay_ms} ms"))?;
        // Only the greedy tree depends on the model; without a calibration, the paper's.
        let tree_model = as_greedyrun_plans(calibrated.unwrap_or_default())?;
        let points: Points<Summary> = pts
            .into_iter()
            .filter_map(|(k, v)| Summary::of(v).map(|s| (k, s)))
            .collect();
        let mut launches = vec![];
        for (&(t, hosts), s) in &points {
            let topo: Topology = TOPOLOGIES
                .get(t)
                .context("unknown topology in launch.csv")?
                .parse()
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            launches.push(Launch {
                // greedyrun is the root: one position more than hosts.
                tree: topo.build(hosts as usize + 1, &tree_model),
                seconds: s.median,
            });
        }
        let ctx = || format!("fitting {shell} at {delay_ms} ms");
        out.push(Group {
            paper: calibrate::fit_launches(&launches, 1).with_context(ctx)?,
            with_overhead: calibrate::fit_launches_with_overhead(&launches, 1).with_context(ctx)?,
            batched: calibrate::fit_launches(&launches, BATCH).with_context(ctx)?,
            extended: calibrate::fit_launches_shared_cpu(&launches, 1).with_context(ctx)?,
            shell,
            delay_ms,
            calibrated,
            points,
            launches,
        });
    }
    Ok(out)
}

impl Group {
    fn predicted(&self, f: impl Fn(&Launch) -> f64) -> Vec<f64> {
        self.launches.iter().map(f).collect()
    }
    fn measured(&self) -> Vec<f64> {
        self.launches.iter().map(|l| l.seconds).collect()
    }
    fn paper_of(&self, l: &Launch) -> f64 {
        l.tree.launch_time(&self.paper.model)
    }
    fn extended_of(&self, l: &Launch) -> f64 {
        let e = &self.extended;
        e.fit.overhead + e.shared_cpu * (l.tree.len() - 1) as f64 + l.tree.launch_time(&e.fit.model)
    }
    /// The fit table's calibrated SEQ / REM and its R², or dashes without a calibration.
    fn calibrated_cells(&self) -> Result<(String, String)> {
        let m = self.measured();
        self.calibrated.map_or(Ok(("—".into(), "—".into())), |c| {
            let capped = as_greedyrun_plans(c)?;
            let p = self.predicted(|l| l.tree.launch_time(&capped));
            anyhow::Ok((
                format!("{:.1} / {:.0}", c.seq() * 1e3, c.rem() * 1e3),
                format!("{:.2}", r_squared(&m, &p)),
            ))
        })
    }
    /// This group's plot panel: one curve per measured topology, against the paper's or the
    /// extended model.
    fn panel(&self, extended: bool) -> Panel {
        let r2 = if extended {
            self.extended.fit.r_squared
        } else {
            self.paper.r_squared
        };
        Panel {
            title: format!("{}, {} ms delay, R² {r2:.2}", self.shell, self.delay_ms),
            curves: TOPOLOGIES
                .iter()
                .enumerate()
                .map(|(t, name)| self.curve(t, name, extended))
                .filter(|c| !c.measured.is_empty())
                .collect(),
        }
    }
    /// Measured and modeled launch time of topology `t` by host count.
    fn curve(&self, t: usize, name: &str, extended: bool) -> Curve {
        let mut c = Curve {
            name: name.into(),
            measured: vec![],
            modeled: vec![],
        };
        for (i, (&(pt, hosts), s)) in self.points.iter().enumerate() {
            if pt == t {
                let l = &self.launches[i];
                let m = if extended {
                    self.extended_of(l)
                } else {
                    self.paper_of(l)
                };
                c.measured.push((f64::from(hosts), *s));
                c.modeled.push((f64::from(hosts), m));
            }
        }
        c
    }
}

/// Tables, plots and the model's break-down points from launch.csv.
pub(crate) fn render(ctx: &Ctx) -> Result<String> {
    let rows: Vec<LaunchRow> = data::read_if_any(&ctx.data("launch.csv"))?;
    if rows.is_empty() {
        return Ok(String::new());
    }
    let cals: Vec<CalibrationRow> = data::read_if_any(&ctx.data("launch-calibration.csv"))?;
    let failures: Vec<LaunchFailure> = data::read_if_any(&ctx.data("launch-failures.csv"))?;
    let groups = groups(&rows, &cals)?;
    let mut out = String::new();
    write_intro(&mut out, &rows, failures.len())?;
    write_fit_table(&mut out, &groups)?;
    write_largest_table(&mut out, &groups, &rows)?;
    for (file, label, extended) in [
        ("model.svg", "the paper's model fitted", false),
        ("model-extended.svg", "the extended model fitted", true),
    ] {
        let panels: Vec<Panel> = groups.iter().map(|g| g.panel(extended)).collect();
        let cols = groups
            .iter()
            .map(|g| g.delay_ms)
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        let title = format!("Launch: measured (solid, min–max) vs {label} (dashed)");
        plot::model_panels(&ctx.plot(file), &title, &panels, cols)?;
        writeln!(out, "\n![{title}](plots/{file})")?;
    }
    out.push('\n');
    Ok(out)
}

/// The opening sentence: how many launches, how many failed, how they were timed.
fn write_intro(out: &mut String, rows: &[LaunchRow], n_failures: usize) -> Result<()> {
    let reps = rows.iter().map(|r| r.rep).max().unwrap_or(0);
    writeln!(
        out,
        "{} launches ({} failed), {reps} per point; fits use the median of each (topology, hosts) \
         point, as the paper fits averages. Seconds from greedyrun's start until the last \
         agent's hello (`greedyrun -v`).\n",
        rows.len(),
        n_failures
    )?;
    Ok(())
}

/// One row per (shell, delay): each model's parameters and R².
fn write_fit_table(out: &mut String, groups: &[Group]) -> Result<()> {
    out.push_str(
        "| shell | delay | calibrated SEQ / REM ms | R² calibrated | paper fit SEQ / REM ms | R² paper | \
         R² + overhead | R² concurrency 8 | extended: SEQ / REM / overhead ms, shared CPU ms/host | R² extended |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for g in groups {
        let (cal, cal_r2) = g.calibrated_cells()?;
        let e = &g.extended;
        writeln!(
            out,
            "| {} | {} ms | {} | {} | {:.1} / {:.0} | {:.2} | {:.2} | {:.2} | {:.1} / {:.0} / {:.0}, {:.1} | {:.2} |",
            g.shell,
            g.delay_ms,
            cal,
            cal_r2,
            g.paper.model.seq() * 1e3,
            g.paper.model.rem() * 1e3,
            g.paper.r_squared,
            g.with_overhead.r_squared,
            g.batched.r_squared,
            e.fit.model.seq() * 1e3,
            e.fit.model.rem() * 1e3,
            e.fit.overhead * 1e3,
            e.shared_cpu * 1e3,
            e.fit.r_squared,
        )?;
    }
    Ok(())
}

/// Where the paper's model breaks: the largest host count, measured vs each model.
fn write_largest_table(out: &mut String, groups: &[Group], rows: &[LaunchRow]) -> Result<()> {
    let top = rows.iter().map(|r| r.hosts).max().unwrap_or(0);
    writeln!(
        out,
        "\nAt {top} hosts, ms: measured median (min–max), the paper's fitted model, the extended \
         fit, and greedyrun's own prediction from its calibration:\n"
    )?;
    out.push_str("| shell | delay | topology | measured | paper fit | extended fit | calibrated |\n|---|---|---|---|---|---|---|\n");
    for g in groups {
        for (i, (&(t, hosts), s)) in g.points.iter().enumerate() {
            if hosts != top {
                continue;
            }
            let l = &g.launches[i];
            writeln!(
                out,
                "| {} | {} ms | {} | {} | {:.0} | {:.0} | {} |",
                g.shell,
                g.delay_ms,
                TOPOLOGIES[t],
                Summary {
                    median: s.median * 1e3,
                    min: s.min * 1e3,
                    max: s.max * 1e3,
                    n: s.n
                }
                .cell(0),
                g.paper_of(l) * 1e3,
                g.extended_of(l) * 1e3,
                g.calibrated.map_or("—".into(), |c| format!(
                    "{:.0}",
                    l.tree.launch_time(&c) * 1e3
                )),
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(config: &str, hosts: u32, run: u32, rc: i32, launch_ms: Option<f64>) -> LauncherRun {
        LauncherRun {
            part: "M".into(),
            hosts,
            config: config.into(),
            run,
            wall_ms: 500.0,
            rc,
            ok: 0,
            cpu_s: 0.5,
            launch_ms,
            model_ms: Some(100.0),
        }
    }

    #[test]
    fn script_rows_become_launch_rows_and_failures() {
        let runs = vec![
            run("rsh-kary:4", 64, 2, 0, Some(466.0)),
            run("ssh-greedy", 8, 1, 1, None),
            LauncherRun {
                part: "A".into(),
                ..run("hydra", 16, 1, 0, None)
            },
        ];
        let (ok, failed) = split_runs(&runs, 10);
        assert_eq!(
            ok,
            vec![LaunchRow {
                shell: "rsh".into(),
                topology: "kary:4".into(),
                hosts: 64,
                delay_ms: 10,
                rep: 2,
                seconds: 0.466
            }]
        );
        assert_eq!(failed.len(), 1);
        assert_eq!(
            (
                failed[0].shell.as_str(),
                failed[0].topology.as_str(),
                failed[0].rc
            ),
            ("ssh", "greedy", 1)
        );
    }

    #[test]
    fn fits_recover_a_synthetic_machine_and_the_extended_model_explains_shared_cpu() {
        let truth = LaunchModel::new(0.004, 0.06).unwrap();
        // The greedy rows' trees are greedyrun's: built under its --batch cap.
        let plans = as_greedyrun_plans(truth).unwrap();
        let mut rows = vec![];
        for t in TOPOLOGIES {
            for hosts in [8u32, 16, 32, 64] {
                let tree = t
                    .parse::<Topology>()
                    .unwrap()
                    .build(hosts as usize + 1, &plans);
                for rep in 1..=3 {
                    rows.push(LaunchRow {
                        shell: "rsh".into(),
                        topology: t.into(),
                        hosts,
                        delay_ms: 0,
                        rep,
                        seconds: 0.03 + 0.005 * f64::from(hosts) + tree.launch_time(&truth),
                    });
                }
            }
        }
        let cal = [CalibrationRow {
            shell: "rsh".into(),
            delay_ms: 0,
            seq: 0.004,
            rem: 0.06,
        }];
        let g = &groups(&rows, &cal).unwrap()[0];
        assert_eq!(g.points.len(), 20);
        assert!(
            (g.extended.shared_cpu - 0.005).abs() < 1e-4,
            "{:?}",
            g.extended
        );
        assert!(g.extended.fit.r_squared > 0.9999);
        assert!(g.paper.r_squared < g.extended.fit.r_squared);
        let dir = tempfile::tempdir().unwrap();
        let ctx = Ctx::new(dir.path().to_owned(), 1, 1, false).unwrap();
        data::write(&ctx.data("launch.csv"), &rows).unwrap();
        data::write(&ctx.data("launch-calibration.csv"), &cal).unwrap();
        let md = render(&ctx).unwrap();
        assert!(md.contains("| rsh | 0 ms | 4.0 / 60 | "), "{md}");
        assert!(md.contains("plots/model.svg") && ctx.plot("model-extended.svg").exists());
    }
}
