//! docs/benchmarks.md: every section's generated block spliced between its markers, and the
//! simulator's report between `<!-- sim:begin -->` and `<!-- sim:end -->`.

use anyhow::{Context, Result};

use crate::{
    ctx::Ctx,
    data,
    load::LoadRecord,
    section::Section,
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
    let sim = ctx.sim_report();
    if let Ok(text) = std::fs::read_to_string(&sim) {
        doc = splice(&doc, SIM_MARKERS.0, SIM_MARKERS.1, &text)
            .with_context(|| format!("{}", path.display()))?;
    }
    std::fs::write(&path, doc).with_context(|| format!("{}", path.display()))?;
    eprintln!("greedy-bench: wrote {}", path.display());
    Ok(())
}
