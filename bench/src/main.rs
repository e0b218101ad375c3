//! greedy-bench: one command that runs every side-by-side benchmark on the emulated cluster
//! and regenerates docs/benchmarks.md, docs/data/*.csv and docs/plots/*.svg.
//!
//! Flow: each section runs its existing script (tests/launcher/bench.sh, tests/charm/bench.sh,
//! tests/slurm/mpi-bench.sh, tests/slurm/route-bench.sh), which takes the one emulated
//! cluster, interleaves the competitors within each repetition, writes one CSV row per run
//! and releases the cluster, so other engineers' tests can slip in between sections. This
//! binary records the machine's load average meanwhile, copies the rows to docs/data/, and
//! renders every section from docs/data alone (`report` redoes that without measuring):
//! medians, min–max, ratios, SEQ/REM fits, plots, spliced between `<!-- bench:NAME:begin -->`
//! and `<!-- bench:NAME:end -->` so the hand-written text around them survives.
//!
//! Non-goals: measuring anything itself (the scripts do), or running in CI (too long).

mod ctx;
mod data;
mod doc;
mod load;
mod plot;
mod section;
mod splice;
mod stats;
mod validation;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use crate::{ctx::Ctx, section::Section};

/// Runs every side-by-side benchmark on the emulated cluster and regenerates
/// docs/benchmarks.md with plots (needs root, as the cluster scripts do).
///
/// Exit status: 0 all done, 1 a section failed (the message names it; every other section
/// was still measured and written), 2 bad arguments.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
    /// Checkout to measure and write into (default: the one this binary was built from).
    #[arg(long, global = true)]
    root: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Every section in turn (≈ 35 min), then the doc.
    All(RunArgs),
    /// The named sections only, then the doc.
    Run {
        /// launchers, charm, slurm-mpi, route, model, sim.
        #[arg(required = true, value_parser = Section::parse)]
        sections: Vec<Section>,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Regenerate the doc and plots from docs/data without measuring.
    Report,
}

#[derive(clap::Args, Clone)]
struct RunArgs {
    /// Repetitions of each side-by-side comparison.
    #[arg(long, default_value_t = 5)]
    reps: u32,
    /// Repetitions of each model-validation launch (topology × hosts × delay × shell).
    #[arg(long, default_value_t = 3)]
    model_reps: u32,
    /// Few sizes and one repetition: to check the pipeline in a few minutes, not to publish.
    #[arg(long)]
    quick: bool,
    /// Emulated delays of the model validation, ms (default 0,10,20); each delay's rows in
    /// docs/data replace that delay's only.
    #[arg(long, value_delimiter = ',')]
    model_delays: Option<Vec<u32>>,
    /// Model validation: reuse a delay's results already measured into the scratch directory
    /// (after an interrupted run) instead of measuring it again.
    #[arg(long)]
    resume: bool,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("greedy-bench: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<()> {
    let root = match args.root {
        Some(r) => r,
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."),
    };
    let root = root
        .canonicalize()
        .with_context(|| format!("checkout {}", root.display()))?;
    let (sections, run) = match args.cmd {
        Cmd::All(run) => (Section::ALL.to_vec(), Some(run)),
        Cmd::Run { sections, run } => (sections, Some(run)),
        Cmd::Report => (vec![], None),
    };
    let mut ctx = Ctx::new(
        root,
        run.as_ref().map_or(5, |r| r.reps),
        run.as_ref().map_or(3, |r| r.model_reps),
        run.as_ref().is_some_and(|r| r.quick),
    )?;
    if let Some(r) = run {
        ctx.model_delays = r.model_delays;
        ctx.resume = r.resume;
    }
    let mut failed = vec![];
    for s in sections {
        eprintln!("greedy-bench: section {} …", s.name());
        // A failed section (e.g. another engineer's cluster held the machine past a script's
        // 10-minute wait) keeps its old block; the others still run.
        if let Err(e) = s.measure(&ctx) {
            eprintln!("greedy-bench: section {} failed: {e:#}", s.name());
            failed.push(s.name());
            continue;
        }
        // The doc after every section: a later failure keeps what was measured.
        doc::regenerate(&ctx)?;
    }
    doc::regenerate(&ctx)?;
    if !failed.is_empty() {
        anyhow::bail!(
            "sections failed (their blocks in docs/benchmarks.md are unchanged): {}",
            failed.join(", ")
        );
    }
    Ok(())
}
