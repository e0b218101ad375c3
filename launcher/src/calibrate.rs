//! `greedyrun --calibrate`: measure SEQ and REM of this site's remote shell on the given hosts.
//!
//! REM is the time from starting a remote shell until its greedyd says hello, alone (median
//! of up to [`REM_SAMPLES`] one-host launches). SEQ is the extra delay each further child of
//! one parent costs: greedyrun launches up to [`SEQ_HOSTS`] hosts flat with all shells in
//! flight, and SEQ is the least-squares slope of the sorted hello times. On a CPU-bound
//! launcher (one machine's cores doing every handshake) this slope is the handshake CPU cost
//! divided by the cores, which is the interval the model needs.

use std::time::Duration;

use greedy_tree::{LaunchModel, Topology};

use crate::{
    head::{self, JobConfig},
    plan::Plan,
    proto::PmiMode,
};

/// One-host launches whose median is REM.
pub const REM_SAMPLES: usize = 5;
/// Hosts launched at once for SEQ.
pub const SEQ_HOSTS: usize = 16;

/// Measured SEQ and REM, seconds.
#[derive(Debug, Clone, Copy)]
pub struct Calibration {
    /// Seconds per extra child of one parent.
    pub seq: f64,
    /// Seconds from a launch's start to the child's hello.
    pub rem: f64,
    /// Hosts in the SEQ burst.
    pub burst: usize,
}

fn job(base: &JobConfig, hosts: &[String], batch: u32) -> JobConfig {
    let model = LaunchModel::default();
    let mut plan: Plan = base.plan.clone();
    plan.hosts = hosts.to_vec();
    plan.ranks = (0..hosts.len() as u32).map(|r| vec![r]).collect();
    plan.n_ranks = hosts.len() as u32;
    plan.topology = Topology::Flat;
    plan.launch = Topology::Flat.build(hosts.len() + 1, &model);
    plan.batch = batch;
    plan.pmi = PmiMode::None;
    plan.argv = vec!["true".into()];
    JobConfig {
        plan,
        stdin_rank: None,
        quiet: true,
        verbose: false,
        progress: Duration::ZERO,
        ..base.clone()
    }
}

/// Least-squares slope of `ys` against 0, 1, 2, ….
pub fn slope(ys: &[f64]) -> f64 {
    let n = ys.len() as f64;
    if ys.len() < 2 {
        return 0.0;
    }
    let mx = (n - 1.0) / 2.0;
    let my = ys.iter().sum::<f64>() / n;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (i, y) in ys.iter().enumerate() {
        let dx = i as f64 - mx;
        sxy += dx * (y - my);
        sxx += dx * dx;
    }
    sxy / sxx
}

/// Runs the measurement launches on `base`'s hosts.
pub async fn calibrate(base: &JobConfig) -> Result<Calibration, String> {
    let hosts = &base.plan.hosts;
    let mut rems = Vec::new();
    for i in 0..REM_SAMPLES {
        let h = &hosts[i % hosts.len()];
        let r = head::run(job(base, std::slice::from_ref(h), 1)).await;
        match (r.exit_code, r.hello_at[0]) {
            (0, Some(t)) => rems.push(t.as_secs_f64()),
            (c, _) => return Err(format!("one-host launch on {h} failed with exit code {c}")),
        }
    }
    rems.sort_by(f64::total_cmp);
    let rem = rems[rems.len() / 2];
    let burst: Vec<String> = hosts.iter().take(SEQ_HOSTS).cloned().collect();
    let r = head::run(job(base, &burst, burst.len() as u32)).await;
    if r.exit_code != 0 {
        return Err(format!(
            "the {}-host burst failed with exit code {}",
            burst.len(),
            r.exit_code
        ));
    }
    let mut ys: Vec<f64> = r
        .hello_at
        .iter()
        .flatten()
        .map(Duration::as_secs_f64)
        .collect();
    ys.sort_by(f64::total_cmp);
    let seq = slope(&ys).max(0.0);
    Ok(Calibration {
        seq,
        rem,
        burst: burst.len(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn slope_of_a_line() {
        let s = super::slope(&[0.1, 0.15, 0.2, 0.25]);
        assert!((s - 0.05).abs() < 1e-12);
        assert_eq!(super::slope(&[0.3]), 0.0);
    }
}
