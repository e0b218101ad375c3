//! Fitting SEQ and REM to measured launches by least squares, as the paper does for its
//! Figure 4, and telling how well the model explains the measurements (R²).
//!
//! A position's launch time is linear in the model: `seq · waves + rem · depth`, where `depth`
//! counts the launches on its path from the root and `waves` the SEQ intervals its ancestors
//! (and it) waited for their turn. So per-position measurements give an ordinary linear least
//! squares ([`fit_positions`]). A whole launch's time is the maximum of those (equation 2), so
//! whole-launch measurements ([`fit_launches`]) are fitted by a one-dimensional search over the
//! ratio SEQ/REM, with the best REM for each ratio in closed form. Where every measurement also
//! includes a fixed cost outside the tree (allocation, step set-up, exit), that overhead is
//! fitted too ([`fit_launches_with_overhead`]). Where every launch also pays for CPU that all
//! positions share (emulated hosts on one machine's cores), a per-position term is fitted on
//! top ([`fit_launches_shared_cpu`]): an extended model, not the paper's.

use crate::{Error, LaunchModel, Tree};

/// A model fitted to measurements, and how well it explains them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    /// The fitted SEQ and REM (concurrency as given).
    pub model: LaunchModel,
    /// Coefficient of determination of the measurements by the fitted model (1 is perfect).
    pub r_squared: f64,
    /// Root mean square of the residuals, seconds.
    pub rms_error: f64,
    /// Seconds every measurement spent outside the tree (0 unless fitted).
    pub overhead: f64,
}

/// A fit of the extended model `overhead + shared_cpu · (positions − 1) + launch time`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SharedCpuFit {
    /// SEQ, REM, overhead and how well the whole extended model explains the launches.
    pub fit: Fit,
    /// Seconds every launched position adds to the whole launch, whatever the tree: CPU that
    /// the positions' start-ups take from one shared pool (negative if the data say so).
    pub shared_cpu: f64,
}

/// A launch that was timed: the tree it followed and the seconds until its last position was up.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The tree the launch followed.
    pub tree: Tree,
    /// Measured seconds from the start until every position was up.
    pub seconds: f64,
}

/// `(waves, depth)` of every position: its launch time is `seq·waves + rem·depth`.
pub fn launch_terms(tree: &Tree, concurrency: u32) -> Vec<(u64, u32)> {
    let mut terms = vec![(0u64, 0u32); tree.len()];
    for v in 0..tree.len() {
        let (waves, depth) = terms[v];
        for (i, c) in tree.children(v).enumerate() {
            terms[c] = (waves + (i / concurrency as usize) as u64, depth + 1);
        }
    }
    terms
}

/// Fits SEQ and REM to the measured launch time of each position of `tree` (`seconds[v]`,
/// from the root's start; the root's own entry is ignored). Needs positions at two or more
/// depths or child indices, so that SEQ and REM can be told apart (a flat launch of 3+ hosts).
pub fn fit_positions(tree: &Tree, seconds: &[f64], concurrency: u32) -> Result<Fit, Error> {
    if seconds.len() != tree.len() {
        return Err(calibration("one measured time per position is needed"));
    }
    check_times(seconds)?;
    let terms = launch_terms(tree, concurrency);
    // Normal equations of t ≈ seq·w + rem·d, without intercept.
    let (mut ww, mut wd, mut dd, mut wt, mut dt) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for (&(w, d), &t) in terms.iter().zip(seconds).skip(1) {
        let (w, d) = (w as f64, f64::from(d));
        ww += w * w;
        wd += w * d;
        dd += d * d;
        wt += w * t;
        dt += d * t;
    }
    let det = ww * dd - wd * wd;
    if det.abs() <= 1e-12 * ww.max(dd).max(1.0) {
        return Err(calibration(
            "the tree cannot tell SEQ from REM: time a flat launch of 3 or more hosts",
        ));
    }
    let seq = (wt * dd - dt * wd) / det;
    let rem = (dt * ww - wt * wd) / det;
    let model = fitted(seq, rem, concurrency)?;
    let predicted: Vec<f64> = terms[1..]
        .iter()
        .map(|&(w, d)| model.seq() * w as f64 + model.rem() * f64::from(d))
        .collect();
    Ok(quality(model, &seconds[1..], &predicted))
}

/// Fits SEQ and REM to whole launches (equation 2: each launch ends with its last position).
/// Needs two or more launches whose trees differ in shape, e.g. flat and binomial over the
/// same hosts, or flat launches of different sizes.
pub fn fit_launches(launches: &[Launch], concurrency: u32) -> Result<Fit, Error> {
    fit_launch_times(launches, concurrency, Terms::Tree).map(|(fit, _)| fit)
}

/// Fits `overhead + launch time` (equation 2) to whole launches: for measurements that include
/// a fixed cost outside the tree, such as a whole `srun`. Needs three or more launches whose
/// times do not all grow alike (e.g. flat and chain trees of a few sizes).
pub fn fit_launches_with_overhead(launches: &[Launch], concurrency: u32) -> Result<Fit, Error> {
    fit_launch_times(launches, concurrency, Terms::Overhead).map(|(fit, _)| fit)
}

/// Fits `overhead + shared_cpu · (positions − 1) + launch time` (equation 2) to whole
/// launches: the model for positions that share CPU (every launch's start-up competes with all
/// others, so the whole launch grows with their number whatever the tree). Needs four or more
/// launches of several sizes and shapes.
pub fn fit_launches_shared_cpu(
    launches: &[Launch],
    concurrency: u32,
) -> Result<SharedCpuFit, Error> {
    fit_launch_times(launches, concurrency, Terms::SharedCpu)
        .map(|(fit, shared_cpu)| SharedCpuFit { fit, shared_cpu })
}

/// Which terms a whole-launch fit has beside `REM · g(SEQ/REM)`.
#[derive(Clone, Copy, PartialEq)]
enum Terms {
    Tree,
    Overhead,
    SharedCpu,
}

impl Terms {
    /// Fewest launches that determine the terms, and the error when there are fewer.
    fn needed(self) -> (usize, &'static str) {
        match self {
            Terms::Tree => (2, "two or more timed launches are needed"),
            Terms::Overhead => (
                3,
                "three or more timed launches are needed to fit an overhead",
            ),
            Terms::SharedCpu => (
                4,
                "four or more timed launches are needed to fit an overhead and a shared CPU term",
            ),
        }
    }
}

/// The fit and the shared-CPU coefficient (0 unless fitted).
fn fit_launch_times(
    launches: &[Launch],
    concurrency: u32,
    terms: Terms,
) -> Result<(Fit, f64), Error> {
    let problem = LaunchFit::new(launches, concurrency, terms)?;
    let r = problem.best_ratio();
    let best = problem.best_for(r);
    if !best.sse.is_finite() {
        return Err(calibration(
            "the launch times do not grow with the trees: time launches of different shapes",
        ));
    }
    let model = fitted(r * best.rem, best.rem, concurrency)?;
    let fit = Fit {
        overhead: best.base,
        ..quality(model, &problem.measured, &best.predicted)
    };
    Ok((fit, best.cpu))
}

/// A whole-launch fit: launch time = rem · g(r), g(r) = max over a launch's envelope of
/// r·waves + depth, r = seq/rem, plus the `terms`. For a ratio the other coefficients are
/// linear, so only r is searched.
struct LaunchFit {
    terms: Terms,
    /// Per launch, the positions launched (the root excluded).
    launched: Vec<f64>,
    /// Per launch, its measured seconds.
    measured: Vec<f64>,
    /// Per launch, the (waves, depth) that can be last for some ratio.
    envelopes: Vec<Vec<(f64, f64)>>,
}

/// The coefficients that fit one ratio best, their predictions and their squared error.
struct Candidate {
    base: f64,
    rem: f64,
    cpu: f64,
    predicted: Vec<f64>,
    sse: f64,
}

impl LaunchFit {
    fn new(launches: &[Launch], concurrency: u32, terms: Terms) -> Result<Self, Error> {
        let (needed, too_few) = terms.needed();
        if launches.len() < needed {
            return Err(calibration(too_few));
        }
        let launched: Vec<f64> = launches
            .iter()
            .map(|l| l.tree.len().saturating_sub(1) as f64)
            .collect();
        let measured: Vec<f64> = launches.iter().map(|l| l.seconds).collect();
        check_times(&measured)?;
        let envelopes = launches
            .iter()
            .map(|l| envelope(&l.tree, concurrency))
            .collect();
        Ok(LaunchFit {
            terms,
            launched,
            measured,
            envelopes,
        })
    }

    /// g(r) per launch.
    fn g(&self, r: f64) -> Vec<f64> {
        self.envelopes
            .iter()
            .map(|e| e.iter().map(|&(w, d)| r * w + d).fold(0.0, f64::max))
            .collect()
    }

    /// For a ratio, the best (overhead, REM, shared CPU) by ordinary least squares.
    fn best_for(&self, r: f64) -> Candidate {
        let gs = self.g(r);
        let ones = vec![1.0; gs.len()];
        let columns: Vec<&[f64]> = match self.terms {
            Terms::Tree => vec![&gs],
            Terms::Overhead => vec![&ones, &gs],
            Terms::SharedCpu => vec![&ones, &gs, &self.launched],
        };
        let coef =
            least_squares(&columns, &self.measured).unwrap_or_else(|| vec![0.0; columns.len()]);
        let (base, rem, cpu) = match self.terms {
            Terms::Tree => (0.0, coef[0], 0.0),
            Terms::Overhead => (coef[0], coef[1], 0.0),
            Terms::SharedCpu => (coef[0], coef[1], coef[2]),
        };
        let predicted: Vec<f64> = gs
            .iter()
            .zip(&self.launched)
            .map(|(&g, &h)| base + rem * g + cpu * h)
            .collect();
        let sse = predicted
            .iter()
            .zip(&self.measured)
            .map(|(p, m)| (m - p).powi(2))
            .sum::<f64>();
        // A non-positive REM explains nothing: rank it last.
        let sse = if rem > 0.0 { sse } else { f64::INFINITY };
        Candidate {
            base,
            rem,
            cpu,
            predicted,
            sse,
        }
    }

    /// The ratio SEQ/REM with the least squared error: a coarse log grid, then golden-section
    /// refinement around the best grid point.
    fn best_ratio(&self) -> f64 {
        let grid: Vec<f64> = std::iter::once(0.0)
            .chain((0..=480).map(|i| 10f64.powf(-6.0 + i as f64 / 40.0)))
            .collect();
        let best = (0..grid.len())
            .min_by(|&a, &b| {
                self.best_for(grid[a])
                    .sse
                    .total_cmp(&self.best_for(grid[b]).sse)
            })
            .expect("a non-empty grid");
        let (mut lo, mut hi) = (
            grid[best.saturating_sub(1)],
            grid[(best + 1).min(grid.len() - 1)],
        );
        let phi = (5f64.sqrt() - 1.0) / 2.0;
        for _ in 0..100 {
            let (a, b) = (hi - phi * (hi - lo), lo + phi * (hi - lo));
            if self.best_for(a).sse <= self.best_for(b).sse {
                hi = b;
            } else {
                lo = a;
            }
        }
        (lo + hi) / 2.0
    }
}

/// The (waves, depth) positions of `tree` that can be last for some ratio: per depth, the most
/// waves.
fn envelope(tree: &Tree, concurrency: u32) -> Vec<(f64, f64)> {
    let mut most = Vec::<u64>::new();
    for (w, d) in launch_terms(tree, concurrency) {
        let d = d as usize;
        if most.len() <= d {
            most.resize(d + 1, 0);
        }
        most[d] = most[d].max(w);
    }
    most.iter()
        .enumerate()
        .map(|(d, &w)| (w as f64, d as f64))
        .collect()
}

/// Ordinary least squares `y ≈ Σ coef_j · column_j` by the normal equations (at most a few
/// columns); `None` when the columns are (nearly) linearly dependent.
fn least_squares(columns: &[&[f64]], y: &[f64]) -> Option<Vec<f64>> {
    let k = columns.len();
    // Augmented normal matrix [XᵀX | Xᵀy], solved by Gaussian elimination with partial pivoting.
    let mut a: Vec<Vec<f64>> = (0..k)
        .map(|i| {
            let mut row: Vec<f64> = (0..k)
                .map(|j| columns[i].iter().zip(columns[j]).map(|(x, z)| x * z).sum())
                .collect();
            row.push(columns[i].iter().zip(y).map(|(x, y)| x * y).sum());
            row
        })
        .collect();
    let scale = (0..k).map(|i| a[i][i].abs()).fold(1.0, f64::max);
    for col in 0..k {
        let pivot = (col..k).max_by(|&p, &q| a[p][col].abs().total_cmp(&a[q][col].abs()))?;
        if a[pivot][col].abs() <= 1e-12 * scale {
            return None;
        }
        a.swap(col, pivot);
        let pivot_row = a[col].clone();
        for (i, row) in a.iter_mut().enumerate() {
            if i != col {
                let f = row[col] / pivot_row[col];
                for (x, p) in row.iter_mut().zip(&pivot_row).skip(col) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..k).map(|i| a[i][k] / a[i][i]).collect())
}

fn check_times(seconds: &[f64]) -> Result<(), Error> {
    if seconds.iter().all(|t| t.is_finite() && *t >= 0.0) {
        Ok(())
    } else {
        Err(calibration(
            "measured times must be finite and not negative",
        ))
    }
}

/// A fitted model; a slightly negative SEQ from noise is clamped to 0.
fn fitted(seq: f64, rem: f64, concurrency: u32) -> Result<LaunchModel, Error> {
    LaunchModel::new(seq.max(0.0), rem)?.with_concurrency(concurrency)
}

fn quality(model: LaunchModel, measured: &[f64], predicted: &[f64]) -> Fit {
    let sse: f64 = measured
        .iter()
        .zip(predicted)
        .map(|(m, p)| (m - p).powi(2))
        .sum();
    Fit {
        model,
        r_squared: r_squared(measured, predicted),
        rms_error: (sse / measured.len() as f64).sqrt(),
        overhead: 0.0,
    }
}

/// Coefficient of determination of `measured` by `predicted`: 1 − SSE/SST (1 is perfect, 0
/// no better than the mean, negative worse; NaN when the measurements do not vary).
pub fn r_squared(measured: &[f64], predicted: &[f64]) -> f64 {
    let n = measured.len() as f64;
    let mean = measured.iter().sum::<f64>() / n;
    let sse: f64 = measured
        .iter()
        .zip(predicted)
        .map(|(m, p)| (m - p).powi(2))
        .sum();
    let sst: f64 = measured.iter().map(|m| (m - mean).powi(2)).sum();
    if sst > 0.0 { 1.0 - sse / sst } else { f64::NAN }
}

fn calibration(reason: &'static str) -> Error {
    Error::Calibration { reason }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Topology;

    fn truth() -> LaunchModel {
        LaunchModel::new(0.012, 0.21).unwrap()
    }

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn positions_of_a_flat_launch_give_back_the_model() {
        let tree = Topology::Flat.build(16, &truth());
        let times = tree.launch_times(&truth());
        let fit = fit_positions(&tree, &times, 1).unwrap();
        assert!(close(fit.model.seq(), 0.012, 1e-9) && close(fit.model.rem(), 0.21, 1e-9));
        assert!(close(fit.r_squared, 1.0, 1e-9), "{fit:?}");
    }

    #[test]
    fn whole_launches_give_back_the_model() {
        let launches: Vec<Launch> = ["flat", "binomial", "kary:4", "chain", "greedy"]
            .iter()
            .flat_map(|t| [8, 16, 64].map(move |n| (t.parse::<Topology>().unwrap(), n)))
            .map(|(t, n)| {
                let tree = t.build(n, &truth());
                Launch {
                    seconds: tree.launch_time(&truth()),
                    tree,
                }
            })
            .collect();
        let fit = fit_launches(&launches, 1).unwrap();
        assert!(close(fit.model.seq(), 0.012, 1e-6), "{fit:?}");
        assert!(close(fit.model.rem(), 0.21, 1e-6), "{fit:?}");
        assert!(fit.r_squared > 0.999_999 && fit.rms_error < 1e-6, "{fit:?}");
    }

    #[test]
    fn whole_launches_with_a_fixed_overhead_give_back_both() {
        let launches: Vec<Launch> = [("flat", 2), ("flat", 8), ("flat", 16), ("chain", 4)]
            .iter()
            .chain(&[("chain", 8), ("kary:4", 16)])
            .map(|&(t, n)| {
                let tree = t.parse::<Topology>().unwrap().build(n, &truth());
                Launch {
                    seconds: 0.21 + tree.launch_time(&truth()),
                    tree,
                }
            })
            .collect();
        let fit = fit_launches_with_overhead(&launches, 1).unwrap();
        assert!(close(fit.model.seq(), 0.012, 1e-5), "{fit:?}");
        assert!(
            close(fit.model.rem(), 0.21, 1e-4) && close(fit.overhead, 0.21, 1e-4),
            "{fit:?}"
        );
        let two = &launches[..2];
        assert!(fit_launches_with_overhead(two, 1).is_err());
    }

    #[test]
    fn whole_launches_with_shared_cpu_give_back_every_term() {
        let launches: Vec<Launch> = ["flat", "binomial", "kary:4", "kary:8", "greedy"]
            .iter()
            .flat_map(|t| [8, 16, 32, 64].map(move |n| (t.parse::<Topology>().unwrap(), n)))
            .map(|(t, n)| {
                let tree = t.build(n + 1, &truth());
                Launch {
                    seconds: 0.05 + 0.006 * n as f64 + tree.launch_time(&truth()),
                    tree,
                }
            })
            .collect();
        let ext = fit_launches_shared_cpu(&launches, 1).unwrap();
        assert!(close(ext.fit.model.seq(), 0.012, 1e-4), "{ext:?}");
        assert!(close(ext.fit.model.rem(), 0.21, 1e-3), "{ext:?}");
        assert!(close(ext.fit.overhead, 0.05, 1e-3), "{ext:?}");
        assert!(close(ext.shared_cpu, 0.006, 1e-4), "{ext:?}");
        assert!(ext.fit.r_squared > 0.999_999, "{ext:?}");
        // The paper's model cannot absorb the shared term: a worse fit of the same launches.
        let plain = fit_launches(&launches, 1).unwrap();
        assert!(plain.r_squared < ext.fit.r_squared, "{plain:?}");
        assert!(fit_launches_shared_cpu(&launches[..3], 1).is_err());
    }

    #[test]
    fn r_squared_is_one_for_a_perfect_prediction_and_zero_for_the_mean() {
        let m = [1.0, 2.0, 3.0];
        assert_eq!(r_squared(&m, &m), 1.0);
        assert_eq!(r_squared(&m, &[2.0, 2.0, 2.0]), 0.0);
        assert!(r_squared(&[1.0, 1.0], &[1.0, 2.0]).is_nan());
    }

    #[test]
    fn least_squares_solves_exact_systems_and_refuses_dependent_columns() {
        let (x, ones) = ([1.0, 2.0, 3.0, 4.0], [1.0; 4]);
        let y: Vec<f64> = x.iter().map(|x| 0.5 + 2.0 * x).collect();
        let coef = least_squares(&[&ones, &x], &y).unwrap();
        assert!(
            close(coef[0], 0.5, 1e-12) && close(coef[1], 2.0, 1e-12),
            "{coef:?}"
        );
        let twice = x.map(|x| 2.0 * x);
        assert!(least_squares(&[&x, &twice], &y).is_none());
    }

    #[test]
    fn noise_lowers_r_squared_but_keeps_the_fit_close() {
        let tree = Topology::Flat.build(32, &truth());
        let times: Vec<f64> = tree
            .launch_times(&truth())
            .iter()
            .enumerate()
            .map(|(i, t)| t + if i % 2 == 0 { 0.004 } else { -0.004 })
            .collect();
        let fit = fit_positions(&tree, &times, 1).unwrap();
        assert!(close(fit.model.seq(), 0.012, 0.001) && close(fit.model.rem(), 0.21, 0.01));
        assert!(fit.r_squared < 1.0 && fit.r_squared > 0.95, "{fit:?}");
    }

    #[test]
    fn refuses_what_cannot_be_fitted() {
        let chain = Topology::Chain.build(5, &truth());
        let err = fit_positions(&chain, &chain.launch_times(&truth()), 1).unwrap_err();
        assert!(
            err.to_string().contains("cannot tell SEQ from REM"),
            "{err}"
        );
        let one = [Launch {
            tree: chain.clone(),
            seconds: 1.0,
        }];
        assert!(fit_launches(&one, 1).is_err());
        let bad = [
            Launch {
                tree: chain.clone(),
                seconds: f64::NAN,
            },
            one[0].clone(),
        ];
        assert!(
            fit_launches(&bad, 1)
                .unwrap_err()
                .to_string()
                .contains("finite")
        );
    }
}
