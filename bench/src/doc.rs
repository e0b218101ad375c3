//! docs/benchmarks.md: every section's generated block spliced between its markers, and the
//! simulator's report between `<!-- sim:begin -->` and `<!-- sim:end -->`.

use std::process::Command;

use anyhow::{Context, Result};

use crate::{
    data,
    load::LoadRecord,
    section::{Ctx, Section},
    splice::{bench_markers, splice},
};

/// Markers of the simulator's block (its own, since greedy-sim writes the content).
const SIM_MARKERS: (&str, &str) = ("<!-- sim:begin -->", "<!-- sim:end -->");

/// Renders every measured section from docs/data and rewrites docs/benchmarks.md.
pub(crate) fn regenerate(ctx: &Ctx) -> Result<()> {
    let path = ctx.root.join("docs/benchmarks.md");
    let mut doc = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    std::fs::create_dir_all(ctx.plot("")).context("docs/plots")?;
    let loads: Vec<LoadRecord> = data::read_if_any(&ctx.data("load.csv"))?;
    for s in Section::ALL {
        if s == Section::Sim {
            continue;
        }
        let load = loads.iter().find(|l| l.section == s.name());
        let Some(body) = s
            .render(ctx, load)
            .with_context(|| format!("rendering {}", s.name()))?
        else {
            continue;
        };
        let (b, e) = bench_markers(s.name());
        doc = splice(&doc, &b, &e, &body).with_context(|| format!("{}", path.display()))?;
    }
    let sim = ctx.work.join("sim-report.md");
    if let Ok(text) = std::fs::read_to_string(&sim) {
        doc = splice(&doc, SIM_MARKERS.0, SIM_MARKERS.1, &text)
            .with_context(|| format!("{}", path.display()))?;
    }
    std::fs::write(&path, doc).with_context(|| format!("{}", path.display()))?;
    eprintln!("greedy-bench: wrote {}", path.display());
    Ok(())
}

/// Runs the simulator's report on docs/data/launch.csv (greedy-sim, the `sim/` crate) and
/// keeps its stdout for [`regenerate`]; skips with a message where it does not exist.
pub(crate) fn simulate(ctx: &Ctx) -> Result<()> {
    let sim_report = ctx.work.join("sim-report.md");
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
