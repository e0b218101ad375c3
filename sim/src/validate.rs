//! Validation against measured launches (`docs/data/launch.csv`): fit the model per remote
//! shell and delay, then say how far each measured launch is from what the model and the
//! simulation predict.
//!
//! Two fits per (shell, delay) group:
//! - **equation 2**: SEQ, REM and a fixed overhead by least squares (greedy-tree's
//!   [`calibrate::fit_launches_with_overhead`]), the seed's Figure 4 method;
//! - **simulation**: the discrete-event launch with the emulated cluster's limits, every host
//!   sharing `cores` cores (a launch's CPU share of REM queues for them) and greedyrun's
//!   `--batch` cap on launches in flight, fitted over (SEQ, REM, CPU share, overhead ≥ 0). This is where the model breaks on one machine:
//!   64 hosts' launches cannot run in parallel on 2 cores.

use crate::launch::{Limits, SharedCpu, simulate_launch};
use crate::{Error, Noise};
use greedy_tree::calibrate::{self, Launch};
use greedy_tree::{LaunchModel, Topology, Tree};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::collections::BTreeMap;
use std::path::Path;

/// The CSV header the measurements file must start with.
pub const HEADER: &str = "shell,topology,hosts,delay_ms,rep,seconds";

/// One measured launch.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// `rsh` or `ssh`.
    pub shell: String,
    /// The launch tree shape (greedyrun's `--topology`).
    pub topology: Topology,
    /// Hosts launched (greedyrun itself is the tree's root, one position more).
    pub hosts: usize,
    /// Emulated one-way packet delay, ms.
    pub delay_ms: u32,
    /// Repetition number.
    pub rep: u32,
    /// Seconds from the launch's start to the last agent's hello.
    pub seconds: f64,
    /// 1-based line in the file.
    pub line: usize,
}

/// The error for line `line` (`text`) of the CSV file `path`.
fn bad(path: &Path, line: usize, text: &str, reason: String) -> Error {
    Error::Measured {
        path: path.to_path_buf(),
        line,
        text: text.to_string(),
        reason,
    }
}

/// The non-blank lines after `header`, which must be the file's first line, with their 1-based
/// line numbers.
fn data_lines<'a>(
    path: &Path,
    text: &'a str,
    header: &str,
) -> Result<impl Iterator<Item = (usize, &'a str)>, Error> {
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, h)) if h.trim() == header => {}
        Some((_, h)) => return Err(bad(path, 1, h, format!("expected the header {header}"))),
        None => return Err(bad(path, 1, "", "empty file".into())),
    }
    Ok(lines
        .map(|(i, raw)| (i + 1, raw))
        .filter(|(_, raw)| !raw.trim().is_empty()))
}

/// Reads `shell,topology,hosts,delay_ms,rep,seconds` rows (after the header).
pub fn parse(path: &Path, text: &str) -> Result<Vec<Measurement>, Error> {
    let bad = |line: usize, text: &str, reason: String| bad(path, line, text, reason);
    let mut rows = Vec::new();
    for (line, raw) in data_lines(path, text, HEADER)? {
        if raw.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = raw.split(',').map(str::trim).collect();
        let [shell, topology, hosts, delay, rep, seconds] = f[..] else {
            return Err(bad(
                line,
                raw,
                format!("expected 6 fields, got {}", f.len()),
            ));
        };
        let number = |name: &str, v: &str| -> Result<f64, Error> {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| bad(line, raw, format!("{name} must be a non-negative number")))
        };
        let topology: Topology = topology
            .parse()
            .map_err(|e: greedy_tree::Error| bad(line, raw, e.to_string()))?;
        let hosts = number("hosts", hosts)?;
        if hosts < 1.0 || hosts.fract() != 0.0 {
            return Err(bad(line, raw, "hosts must be a whole number ≥ 1".into()));
        }
        let seconds = number("seconds", seconds)?;
        if seconds <= 0.0 {
            return Err(bad(line, raw, "seconds must be positive".into()));
        }
        rows.push(Measurement {
            shell: shell.to_string(),
            topology,
            hosts: hosts as usize,
            delay_ms: number("delay_ms", delay)? as u32,
            rep: number("rep", rep)? as u32,
            seconds,
            line,
        });
    }
    if rows.is_empty() {
        return Err(bad(1, "", "no measurements".into()));
    }
    Ok(rows)
}

/// The calibration file's header (`greedyrun --calibrate` per shell and delay).
pub const CALIBRATION_HEADER: &str = "shell,delay_ms,seq,rem";

/// Reads `shell,delay_ms,seq,rem` rows: the models greedyrun built its greedy trees with.
pub fn parse_calibration(
    path: &Path,
    text: &str,
) -> Result<Vec<(String, u32, LaunchModel)>, Error> {
    let mut rows = Vec::new();
    for (line, raw) in data_lines(path, text, CALIBRATION_HEADER)? {
        let f: Vec<&str> = raw.split(',').map(str::trim).collect();
        let parsed = match f[..] {
            [shell, delay, seq, rem] => delay
                .parse::<u32>()
                .ok()
                .zip(seq.parse::<f64>().ok().zip(rem.parse::<f64>().ok()))
                .map(|(d, (s, r))| (shell, d, s, r)),
            _ => None,
        };
        let (shell, delay, seq, rem) =
            parsed.ok_or_else(|| bad(path, line, raw, "expected SHELL,DELAY_MS,SEQ,REM".into()))?;
        let model = LaunchModel::new(seq, rem).map_err(|e| bad(path, line, raw, e.to_string()))?;
        rows.push((shell.to_string(), delay, model));
    }
    Ok(rows)
}

/// How the measured launches were run, beyond what the file says.
#[derive(Debug, Clone, PartialEq)]
pub struct Setup {
    /// The model greedyrun built its greedy trees with (its `--seq`/`--rem`), unless
    /// `calibrations` has one for the group.
    pub shape_model: LaunchModel,
    /// Per (shell, delay), the calibrated model greedyrun was given.
    pub calibrations: Vec<(String, u32, LaunchModel)>,
    /// Cores all emulated hosts share.
    pub cores: u32,
    /// greedyrun's `--batch`.
    pub batch: Option<u32>,
}

impl Default for Setup {
    /// greedyrun's defaults (SEQ 0.013 s, REM 0.28 s, `--batch 8`) on this 2-core machine.
    fn default() -> Self {
        Setup {
            shape_model: LaunchModel::new(0.013, 0.28).expect("valid constants"),
            calibrations: Vec::new(),
            cores: 2,
            batch: Some(8),
        }
    }
}

/// The simulation's fitted parameters for one group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimFit {
    /// SEQ and REM with each host on its own CPU.
    pub model: LaunchModel,
    /// Seconds outside the tree (greedyrun start-up, relaying the last hello).
    pub overhead: f64,
    /// The shared CPU: `cores` and the CPU seconds of one launch.
    pub cpu: SharedCpu,
    /// Coefficient of determination.
    pub r_squared: f64,
}

/// One measured launch and what each fit predicts for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// The measurement.
    pub measured: Measurement,
    /// Equation 2 with the fitted SEQ, REM and overhead.
    pub eq2: f64,
    /// The simulation with its fitted parameters.
    pub simulated: f64,
}

/// The fits and checks of one (shell, delay) group.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// `rsh` or `ssh`.
    pub shell: String,
    /// Emulated delay, ms.
    pub delay_ms: u32,
    /// The equation-2 fit.
    pub eq2: calibrate::Fit,
    /// The simulation's fit.
    pub sim: SimFit,
    /// Every measurement of the group, in file order.
    pub checks: Vec<Check>,
}

/// Mean and largest relative error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Errors {
    /// Mean of |predicted − measured| / measured.
    pub mean: f64,
    /// Largest of them.
    pub max: f64,
}

impl Errors {
    fn of(pairs: impl Iterator<Item = (f64, f64)>) -> Errors {
        let (mut sum, mut max, mut n) = (0.0, 0.0f64, 0usize);
        for (predicted, measured) in pairs {
            let e = (predicted - measured).abs() / measured;
            sum += e;
            max = max.max(e);
            n += 1;
        }
        Errors {
            mean: if n > 0 { sum / n as f64 } else { f64::NAN },
            max,
        }
    }
}

impl Group {
    /// Errors of the equation-2 fit and of the simulation over this group's rows.
    pub fn errors(&self) -> (Errors, Errors) {
        errors(std::slice::from_ref(self))
    }
}

/// Errors of the equation-2 fit and of the simulation over every row of `groups`.
pub fn errors(groups: &[Group]) -> (Errors, Errors) {
    let rows = || groups.iter().flat_map(|g| &g.checks);
    (
        Errors::of(rows().map(|c| (c.eq2, c.measured.seconds))),
        Errors::of(rows().map(|c| (c.simulated, c.measured.seconds))),
    )
}

/// Fits and checks every (shell, delay) group of `rows`.
pub fn validate(rows: &[Measurement], setup: &Setup) -> Result<Vec<Group>, Error> {
    let mut groups: BTreeMap<(String, u32), Vec<&Measurement>> = BTreeMap::new();
    for m in rows {
        groups
            .entry((m.shell.clone(), m.delay_ms))
            .or_default()
            .push(m);
    }
    groups
        .into_iter()
        .map(|((shell, delay_ms), rows)| fit_group(shell, delay_ms, &rows, setup))
        .collect()
}

fn fit_group(
    shell: String,
    delay_ms: u32,
    rows: &[&Measurement],
    setup: &Setup,
) -> Result<Group, Error> {
    let shape_model = setup
        .calibrations
        .iter()
        .find(|(s, d, _)| *s == shell && *d == delay_ms)
        .map_or(setup.shape_model, |c| c.2);
    // greedyrun builds its trees under its `--batch` cap.
    let shape_model = match setup.batch {
        Some(b) => shape_model.with_launch_cap(b)?,
        None => shape_model,
    };
    // greedyrun is the root: the tree has one position more than there are hosts.
    let trees: Vec<Tree> = rows
        .iter()
        .map(|m| m.topology.build(m.hosts + 1, &shape_model))
        .collect();
    let launches: Vec<Launch> = trees
        .iter()
        .zip(rows)
        .map(|(tree, m)| Launch {
            tree: tree.clone(),
            seconds: m.seconds,
        })
        .collect();
    let eq2 = calibrate::fit_launches_with_overhead(&launches, 1).map_err(|e| {
        Error::param(
            "measured",
            format!("{shell} delay {delay_ms} ms"),
            match e {
                greedy_tree::Error::Calibration { .. } => {
                    "cannot fit SEQ, REM and overhead: measure 3+ launches of different shapes"
                }
                _ => "cannot fit SEQ, REM and overhead",
            },
        )
    })?;
    let measured: Vec<f64> = rows.iter().map(|m| m.seconds).collect();
    let sim = fit_simulation(&trees, &measured, &eq2.model, setup);
    let checks = rows
        .iter()
        .zip(&trees)
        .map(|(m, tree)| Check {
            measured: (*m).clone(),
            eq2: eq2.overhead + tree.launch_time(&eq2.model),
            simulated: sim.overhead + simulate(tree, &sim.model, &sim.cpu, setup.batch),
        })
        .collect();
    Ok(Group {
        shell,
        delay_ms,
        eq2,
        sim,
        checks,
    })
}

/// Noise-free simulated launch time with shared CPU and batch cap.
fn simulate(tree: &Tree, model: &LaunchModel, cpu: &SharedCpu, batch: Option<u32>) -> f64 {
    let limits = Limits {
        cpu: Some(*cpu),
        batch,
    };
    let up = simulate_launch(
        tree,
        model,
        &Noise::NONE,
        &limits,
        &mut StdRng::seed_from_u64(0),
    );
    up.into_iter().fold(0.0, f64::max)
}

/// Least squares over (SEQ, REM, CPU share of REM): a coarse grid and the equation-2 fit, then
/// a compass search from the three best points. The overhead is solved in closed form for each point (the mean
/// residual, at least 0): the max-plus launch time is not smooth, so a local search alone
/// stops at the first kink.
fn fit_simulation(trees: &[Tree], measured: &[f64], eq2: &LaunchModel, setup: &Setup) -> SimFit {
    let search = SimSearch::new(trees, measured, setup);
    let mut grid = search.starts(eq2);
    grid.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut best = grid[0];
    for &(x, f) in grid.iter().take(3) {
        let (x, f) = search.descend(x, f);
        if f < best.1 {
            best = (x, f);
        }
    }
    let (model, cpu) = search.params(&best.0).expect("the search stays feasible");
    let overhead = search.sse(&best.0).1;
    let mean = measured.iter().sum::<f64>() / measured.len() as f64;
    let sst: f64 = measured.iter().map(|m| (m - mean).powi(2)).sum();
    SimFit {
        model,
        overhead,
        cpu,
        r_squared: if sst > 0.0 { 1.0 - best.1 / sst } else { 1.0 },
    }
}

/// The search of [`fit_simulation`] over x = [SEQ, REM, CPU share of REM]: a grid of starts,
/// then a compass search from the best few.
struct SimSearch<'a> {
    /// Distinct trees are few (shapes × sizes); repetitions share a simulation.
    distinct: Vec<(&'a Tree, Vec<f64>)>,
    measured: &'a [f64],
    setup: &'a Setup,
    /// The slowest launch (at least 1 ms): the scale of SEQ and REM.
    top: f64,
}

impl<'a> SimSearch<'a> {
    fn new(trees: &'a [Tree], measured: &'a [f64], setup: &'a Setup) -> Self {
        let mut distinct: Vec<(&Tree, Vec<f64>)> = Vec::new();
        for (tree, &m) in trees.iter().zip(measured) {
            match distinct.iter_mut().find(|(t, _)| *t == tree) {
                Some((_, ms)) => ms.push(m),
                None => distinct.push((tree, vec![m])),
            }
        }
        let top = measured.iter().copied().fold(0.0, f64::max).max(1e-3);
        SimSearch {
            distinct,
            measured,
            setup,
            top,
        }
    }

    /// The model and shared CPU of a point, if it is feasible.
    fn params(&self, x: &[f64; 3]) -> Option<(LaunchModel, SharedCpu)> {
        let model = LaunchModel::new(x[0], x[1]).ok()?;
        let cpu = SharedCpu::new(self.setup.cores, x[1] * x[2]).ok()?;
        (0.0..=1.0).contains(&x[2]).then_some((model, cpu))
    }

    /// (squared error, overhead) of a point.
    fn sse(&self, x: &[f64; 3]) -> (f64, f64) {
        let Some((model, cpu)) = self.params(x) else {
            return (f64::INFINITY, 0.0);
        };
        let distinct = &self.distinct;
        let times: Vec<f64> = distinct
            .iter()
            .map(|(tree, _)| simulate(tree, &model, &cpu, self.setup.batch))
            .collect();
        let residual: f64 = distinct
            .iter()
            .zip(&times)
            .map(|((_, ms), t)| ms.iter().map(|m| m - t).sum::<f64>())
            .sum();
        let overhead = residual / self.measured.len() as f64;
        let sse = distinct
            .iter()
            .zip(&times)
            .map(|((_, ms), t)| ms.iter().map(|m| (m - t - overhead).powi(2)).sum::<f64>())
            .sum();
        (sse, overhead)
    }

    /// Starting points and their squared errors: a grid, and the equation-2 fit.
    fn starts(&self, eq2: &LaunchModel) -> Vec<([f64; 3], f64)> {
        let top = self.top;
        let mut grid: Vec<([f64; 3], f64)> = Vec::new();
        for seq in [0.0, 0.002, 0.005, 0.01, 0.02, 0.05] {
            for i in 0..15 {
                let rem = top * 10f64.powf(-2.0 + 2.0 * f64::from(i) / 14.0);
                for share in 0..=10 {
                    let x = [seq * top, rem, f64::from(share) / 10.0];
                    grid.push((x, self.sse(&x).0));
                }
            }
        }
        // The equation-2 fit without shared CPU is a start too.
        for share in [0.0, 0.2] {
            let x = [eq2.seq(), eq2.rem(), share];
            grid.push((x, self.sse(&x).0));
        }
        grid
    }

    /// Compass search from `x` (squared error `f`), halving the steps until REM's is
    /// below 10⁻⁴ of REM.
    fn descend(&self, mut x: [f64; 3], mut f: f64) -> ([f64; 3], f64) {
        let mut step = [self.top * 0.01, x[1] * 0.25, 0.05];
        for _ in 0..400 {
            let mut improved = false;
            for i in 0..3 {
                for dir in [1.0, -1.0] {
                    let mut y = x;
                    y[i] += dir * step[i];
                    let fy = self.sse(&y).0;
                    if fy < f {
                        (x, f, improved) = (y, fy, true);
                    }
                }
            }
            if !improved {
                step.iter_mut().for_each(|s| *s *= 0.5);
                if step[1] < 1e-4 * x[1] {
                    break;
                }
            }
        }
        (x, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(rows: &str) -> String {
        format!("{HEADER}\n{rows}")
    }

    #[test]
    fn parse_names_line_and_reason() {
        let p = Path::new("launch.csv");
        let ok = parse(
            p,
            &file("rsh,kary:4,16,10,1,0.25\n\nssh,greedy,8,0,2,1.5\n"),
        )
        .unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!(
            (ok[1].shell.as_str(), ok[1].hosts, ok[1].line),
            ("ssh", 8, 4)
        );
        for (text, line, why) in [
            ("x,y\n".to_string(), 1, "header"),
            (file("rsh,tree,16,10,1,0.2\n"), 2, "topology"),
            (file("rsh,flat,16,10,1\n"), 2, "6 fields"),
            (file("rsh,flat,1.5,10,1,0.2\n"), 2, "whole number"),
            (file("rsh,flat,4,10,1,-3\n"), 2, "seconds"),
            (file(""), 1, "no measurements"),
        ] {
            let err = parse(p, &text).unwrap_err().to_string();
            assert!(
                err.contains(&format!("line {line}:")) && err.contains(why),
                "{text:?}: {err}"
            );
        }
    }

    #[test]
    fn calibrations_parse_and_name_bad_lines() {
        let p = Path::new("launch-calibration.csv");
        let ok = parse_calibration(p, "shell,delay_ms,seq,rem\nrsh,10,0.004,0.06\n").unwrap();
        assert_eq!(
            (ok[0].0.as_str(), ok[0].1, ok[0].2.rem()),
            ("rsh", 10, 0.06)
        );
        let err = parse_calibration(p, "shell,delay_ms,seq,rem\nssh,10,x,0.2\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2") && err.contains("SEQ"), "{err}");
        let err = parse_calibration(p, "shell,delay_ms,seq,rem\nssh,10,0.01,0\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2") && err.contains("rem"), "{err}");
    }

    #[test]
    fn recovers_a_known_model_from_its_own_simulation() {
        // Measurements made by the simulation itself (2 cores, batch 8): the fit must
        // reproduce them closely and the equation-2 fit must not (it has no shared CPU).
        let setup = Setup::default();
        let truth = LaunchModel::new(0.004, 0.06).unwrap();
        let cpu = SharedCpu::new(2, 0.02).unwrap();
        let mut rows = Vec::new();
        for hosts in [8, 32] {
            for t in ["flat", "binomial", "kary:4", "kary:8", "greedy"] {
                let topology: Topology = t.parse().unwrap();
                let tree = topology.build(hosts + 1, &setup.shape_model);
                rows.push(Measurement {
                    shell: "rsh".into(),
                    topology,
                    hosts,
                    delay_ms: 10,
                    rep: 1,
                    seconds: 0.1 + simulate(&tree, &truth, &cpu, setup.batch),
                    line: rows.len() + 2,
                });
            }
        }
        let groups = validate(&rows, &setup).unwrap();
        assert_eq!(groups.len(), 1);
        let (eq2, sim) = groups[0].errors();
        assert!(sim.max < 0.03, "simulation error {sim:?}");
        assert!(eq2.max > sim.max, "eq2 {eq2:?} vs sim {sim:?}");
        assert!(groups[0].sim.r_squared > 0.99);
    }
}
