//! `greedyrun --calibrate`: measure SEQ and REM of this site's remote shell on the given hosts.
//!
//! REM is the time from starting a remote shell until its greedyd says hello, alone (median
//! of [`REM_SAMPLES`] one-host launches). SEQ is what each further child of one parent adds to
//! the launch: greedyrun launches [`SEQ_HOSTS`] hosts flat with every shell in flight, and
//! `SEQ = (last hello − REM) / (hosts − 1)`.
//!
//! Why the span and not the slope of the hello times: on a CPU-bound launcher (here every
//! handshake of every emulated host runs on the same 2 cores) concurrent handshakes share the
//! CPU and finish together, so the hello times are bunched at the end (slope ≈ 4 ms with ssh)
//! while the burst still took ≈ 20 ms per extra host. The model's "a parent pays SEQ per
//! child" is that per-host cost, measured from the span.

use std::time::Duration;

use greedy_tree::{LaunchModel, Topology};

use crate::{
    head::{self, JobConfig},
    plan::Plan,
    proto::{App, PmiMode},
};

/// One-host launches whose median is REM.
pub const REM_SAMPLES: usize = 5;
/// Hosts launched at once for SEQ.
pub const SEQ_HOSTS: usize = 16;

/// Measured SEQ and REM.
#[derive(Debug, Clone, Copy)]
pub struct Calibration {
    /// SEQ: seconds per extra child of one parent; REM: seconds from a launch's start to the
    /// child's hello.
    pub model: LaunchModel,
    /// Hosts in the SEQ burst.
    pub burst: usize,
}

fn job(base: &JobConfig, hosts: &[String], batch: u32) -> JobConfig {
    let mut plan: Plan = base.plan.clone();
    plan.hosts = hosts.to_vec();
    plan.ranks = (0..hosts.len() as u32).map(|r| vec![r]).collect();
    plan.n_ranks = hosts.len() as u32;
    plan.topology = Topology::Flat;
    // A flat tree is the same under every model.
    plan.launch = Topology::Flat.build(hosts.len() + 1, &base.plan.launch_model);
    plan.batch = batch;
    plan.pmi = PmiMode::None;
    plan.apps = vec![App {
        first_rank: 0,
        argv: vec!["true".into()],
    }];
    JobConfig {
        plan,
        stdin_rank: None,
        quiet: true,
        bcast: Vec::new(),
        oversubscribe: false,
        verbose: false,
        progress: Duration::ZERO,
        ..base.clone()
    }
}

/// SEQ from a flat burst: the time the last of `hosts` children took beyond one launch,
/// per extra child.
pub fn span_seq(last: f64, rem: f64, hosts: usize) -> f64 {
    if hosts < 2 {
        return 0.0;
    }
    ((last - rem) / (hosts - 1) as f64).max(0.0)
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
    let last = r
        .hello_at
        .iter()
        .flatten()
        .map(Duration::as_secs_f64)
        .fold(0.0, f64::max);
    let seq = span_seq(last, rem, burst.len());
    let model =
        LaunchModel::new(seq, rem).map_err(|e| format!("the measured launch model: {e}"))?;
    Ok(Calibration {
        model,
        burst: burst.len(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn seq_from_the_span_of_a_burst() {
        assert!((super::span_seq(0.58, 0.26, 17) - 0.02).abs() < 1e-12);
        assert_eq!(super::span_seq(0.2, 0.26, 16), 0.0);
        assert_eq!(super::span_seq(0.3, 0.26, 1), 0.0);
    }
}
