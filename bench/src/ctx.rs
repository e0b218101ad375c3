//! Where and how much to measure: the checkout, the scratch directory, the repetitions, and
//! running the checkout's scripts.

use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result, bail};

/// 20-second waits for a busy cluster before a script gives up (cluster_claim in tests/lib.sh).
const CLAIM_WAITS: &str = "90";

/// Where and how much to measure.
pub(crate) struct Ctx {
    /// The checkout: scripts are run from here, docs are written here.
    pub(crate) root: PathBuf,
    /// Scratch for the scripts' raw output (under CARGO_TARGET_DIR: visible to every
    /// emulated host, unlike /tmp).
    pub(crate) work: PathBuf,
    /// Repetitions per comparison.
    pub(crate) reps: u32,
    /// Repetitions per model-validation launch.
    pub(crate) model_reps: u32,
    /// Small sizes, one repetition.
    pub(crate) quick: bool,
    /// Delays of the model validation (default 0, 10, 20 ms).
    pub(crate) model_delays: Option<Vec<u32>>,
    /// Reuse a model-validation delay's results already in the scratch directory.
    pub(crate) resume: bool,
}

impl Ctx {
    /// A context; the scratch directory is created.
    pub(crate) fn new(root: PathBuf, reps: u32, model_reps: u32, quick: bool) -> Result<Ctx> {
        let target =
            std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
        let work = target.join("greedy-bench");
        std::fs::create_dir_all(&work).with_context(|| format!("{}", work.display()))?;
        let (reps, model_reps) = if quick {
            (1, 1)
        } else {
            (reps.max(1), model_reps.max(1))
        };
        Ok(Ctx {
            root,
            work,
            reps,
            model_reps,
            quick,
            model_delays: None,
            resume: false,
        })
    }

    /// docs/data/NAME.
    pub(crate) fn data(&self, name: &str) -> PathBuf {
        self.root.join("docs/data").join(name)
    }

    /// Where the simulator's section is kept between its run and the splice.
    pub(crate) fn sim_report(&self) -> PathBuf {
        self.work.join("sim-report.md")
    }

    /// docs/plots/NAME.
    pub(crate) fn plot(&self, name: &str) -> PathBuf {
        self.root.join("docs/plots").join(name)
    }

    /// A fresh scratch directory for one script run.
    pub(crate) fn scratch(&self, name: &str) -> Result<PathBuf> {
        let dir = self.work.join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("{}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("{}", dir.display()))?;
        Ok(dir)
    }

    /// Runs a script of the checkout with arguments and environment, output to the terminal.
    pub(crate) fn script(&self, script: &str, args: &[&str], env: &[(&str, &str)]) -> Result<()> {
        eprintln!(
            "greedy-bench: {} {} {}",
            env.iter()
                .map(|(k, v)| format!("{k}='{v}'"))
                .collect::<Vec<_>>()
                .join(" "),
            script,
            args.join(" ")
        );
        let mut cmd = Command::new(self.root.join(script));
        if std::env::var_os("GREEDY_CLAIM_WAITS").is_none() {
            // Other engineers' tests hold the one cluster for minutes at a time: wait up to
            // 30 min for it (cluster_claim in tests/lib.sh) rather than lose a section after 10.
            cmd.env("GREEDY_CLAIM_WAITS", CLAIM_WAITS);
        }
        let status = cmd
            .args(args)
            .envs(env.iter().copied())
            .current_dir(&self.root)
            .status()
            .with_context(|| format!("starting {script}"))?;
        if !status.success() {
            bail!("{script} {}: {status}", args.join(" "));
        }
        Ok(())
    }
}
