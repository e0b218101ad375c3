//! `plan --format svg`: the tree (hosts by depth, edges, launch times) and a launch timeline
//! (one bar per host: its own launch, then its launches of its children), hand-written SVG so
//! the drawing needs no font or graphics library. Past [`DETAIL_LIMIT`] hosts the drawing
//! would be unreadable, so it becomes a summary: hosts per depth and launches over time.

use greedy_tree::{LaunchModel, Tree};
use std::io::{self, Write};

/// Most hosts drawn one by one.
pub(crate) const DETAIL_LIMIT: usize = 64;

const LEAF_DX: f64 = 34.0;
const LEVEL_DY: f64 = 80.0;
const ROW_DY: f64 = 14.0;
const LABEL_W: f64 = 90.0;
const PLOT_W: f64 = 900.0;
const STYLE: &str = "text{font-family:sans-serif;font-size:10px}\
.title{font-size:14px;font-weight:bold}.edge{stroke:#888;stroke-width:1}\
.node circle{fill:#1f77b4}.rem{fill:#aec7e8}.seq{fill:#ff7f0e}.axis{stroke:#444}\
.bar{fill:#1f77b4}.grid{stroke:#ddd}";

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Writes the plan as one SVG document.
pub(crate) fn write(
    out: &mut impl Write,
    hosts: &[String],
    tree: &Tree,
    model: &LaunchModel,
    topology: &str,
) -> io::Result<()> {
    let times = tree.launch_times(model);
    let end = times.iter().copied().fold(0.0, f64::max);
    let depth = tree.depths();
    let title = format!(
        "{topology} tree, {} hosts, SEQ {} s, REM {} s, concurrency {}: launch time {end:.3} s, depth {}, largest fan-out {}",
        tree.len(),
        model.seq(),
        model.rem(),
        model.concurrency(),
        depth.iter().max().copied().unwrap_or(0),
        tree.max_fanout()
    );
    let mut body = Vec::new();
    let (w, h) = if tree.len() <= DETAIL_LIMIT {
        detail(&mut body, hosts, tree, model, &times, &depth)?
    } else {
        summary(&mut body, tree, &times, &depth, end)?
    };
    writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" viewBox="0 0 {w:.0} {h:.0}">"#
    )?;
    writeln!(out, "<style>{STYLE}</style>")?;
    writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#)?;
    writeln!(
        out,
        r#"<text class="title" x="10" y="20">{}</text>"#,
        escape(&title)
    )?;
    out.write_all(&body)?;
    writeln!(out, "</svg>")
}

/// Every host: the tree on top, the timeline below. Returns the drawing's size.
fn detail(
    out: &mut Vec<u8>,
    hosts: &[String],
    tree: &Tree,
    model: &LaunchModel,
    times: &[f64],
    depth: &[u32],
) -> io::Result<(f64, f64)> {
    let n = tree.len();
    // Leaves left to right in preorder; a parent centred over its first and last child.
    let mut x = vec![0.0f64; n];
    let mut leaves = 0.0;
    for (v, x) in x.iter_mut().enumerate() {
        if tree.subtree_len(v) == 1 {
            *x = leaves;
            leaves += 1.0;
        }
    }
    for v in (0..n).rev() {
        let mut kids = tree.children(v);
        if let Some(first) = kids.next() {
            let last = kids.last().unwrap_or(first);
            x[v] = (x[first] + x[last]) / 2.0;
        }
    }
    let max_depth = depth.iter().copied().max().unwrap_or(0) as f64;
    let px = |v: usize| 40.0 + x[v] * LEAF_DX;
    let py = |v: usize| 60.0 + f64::from(depth[v]) * LEVEL_DY;
    writeln!(out, "<g class=\"tree\">")?;
    for v in 0..n {
        for c in tree.children(v) {
            writeln!(
                out,
                r#"<line class="edge" x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}"/>"#,
                px(v),
                py(v),
                px(c),
                py(c)
            )?;
        }
    }
    for v in 0..n {
        let host = escape(&hosts[v]);
        writeln!(
            out,
            r#"<g class="node" id="node-{v}"><title>{host}: launched at {t:.3} s, depth {d}</title><circle cx="{x:.1}" cy="{y:.1}" r="6"/><text x="{tx:.1}" y="{ty:.1}" transform="rotate(40 {tx:.1} {ty:.1})">{host} {t:.3}s</text></g>"#,
            t = times[v],
            d = depth[v],
            x = px(v),
            y = py(v),
            tx = px(v) + 4.0,
            ty = py(v) + 14.0,
        )?;
    }
    writeln!(out, "</g>")?;
    let tree_w = 80.0 + leaves * LEAF_DX;
    let top = 60.0 + max_depth * LEVEL_DY + 80.0;
    // Timeline: per host, its own launch (REM, from its parent's start of it) then its SEQ
    // intervals, one per launch of a child.
    let mut seq_end = 0.0f64;
    for (v, t) in times.iter().enumerate() {
        let k = tree.children(v).count();
        if k > 0 {
            seq_end = seq_end.max(t + model.child_offset(k) - model.rem() + model.seq());
        }
    }
    let span = times.iter().copied().fold(seq_end, f64::max).max(1e-9);
    let tx = |t: f64| LABEL_W + t / span * PLOT_W;
    writeln!(out, "<g class=\"timeline\">")?;
    writeln!(
        out,
        r#"<text x="10" y="{:.1}">Launch timeline: light = a host being launched (REM, from its parent's start), dark = the host spending SEQ on each child it launches</text>"#,
        top - 10.0
    )?;
    for i in 0..=5 {
        let t = span * f64::from(i) / 5.0;
        let gx = tx(t);
        let bottom = top + n as f64 * ROW_DY;
        writeln!(
            out,
            r#"<line class="grid" x1="{gx:.1}" y1="{top:.1}" x2="{gx:.1}" y2="{bottom:.1}"/><text x="{gx:.1}" y="{:.1}" text-anchor="middle">{t:.3} s</text>"#,
            bottom + 12.0
        )?;
    }
    for v in 0..n {
        let y = top + v as f64 * ROW_DY;
        writeln!(
            out,
            r#"<text x="10" y="{:.1}">{}</text>"#,
            y + 10.0,
            escape(&hosts[v])
        )?;
        if v > 0 {
            let start = times[v] - model.rem();
            writeln!(
                out,
                r#"<rect class="rem" x="{:.1}" y="{:.1}" width="{:.1}" height="10"><title>{} launched by {}: {:.3}–{:.3} s</title></rect>"#,
                tx(start),
                y + 1.0,
                (tx(times[v]) - tx(start)).max(0.5),
                escape(&hosts[v]),
                escape(&hosts[tree.parent(v).unwrap_or(0)]),
                start,
                times[v]
            )?;
        }
        for (i, c) in tree.children(v).enumerate() {
            let s = times[v] + model.child_offset(i + 1) - model.rem();
            writeln!(
                out,
                r#"<rect class="seq" x="{:.1}" y="{:.1}" width="{:.1}" height="6"><title>{} launches {} at {s:.3} s</title></rect>"#,
                tx(s),
                y + 3.0,
                (tx(s + model.seq()) - tx(s)).max(0.5),
                escape(&hosts[v]),
                escape(&hosts[c])
            )?;
        }
    }
    writeln!(out, "</g>")?;
    let w = tree_w.max(LABEL_W + PLOT_W + 40.0);
    Ok((w, top + n as f64 * ROW_DY + 30.0))
}

/// Beyond [`DETAIL_LIMIT`] hosts: hosts per depth, hosts by fan-out (powers of two), and hosts
/// up over time (20 bins).
fn summary(
    out: &mut Vec<u8>,
    tree: &Tree,
    times: &[f64],
    depth: &[u32],
    end: f64,
) -> io::Result<(f64, f64)> {
    // Bucket 0: leaves; bucket b ≥ 1: fan-out in [2^(b-1), 2^b).
    let mut per_fanout: Vec<usize> = Vec::new();
    for v in 0..tree.len() {
        let k = tree.children(v).count();
        let b = if k == 0 { 0 } else { k.ilog2() as usize + 1 };
        if per_fanout.len() <= b {
            per_fanout.resize(b + 1, 0);
        }
        per_fanout[b] += 1;
    }
    let mut per_depth = vec![0usize; depth.iter().copied().max().unwrap_or(0) as usize + 1];
    for &d in depth {
        per_depth[d as usize] += 1;
    }
    let bins = 20usize;
    let mut per_bin = vec![0usize; bins];
    for &t in times {
        let b = if end > 0.0 {
            ((t / end) * bins as f64) as usize
        } else {
            0
        };
        per_bin[b.min(bins - 1)] += 1;
    }
    let mut y = 50.0;
    let mut chart = |out: &mut Vec<u8>,
                     title: &str,
                     rows: Vec<(String, usize)>|
     -> io::Result<()> {
        let most = rows.iter().map(|r| r.1).max().unwrap_or(1).max(1) as f64;
        writeln!(out, r#"<text x="10" y="{y:.1}">{}</text>"#, escape(title))?;
        y += 8.0;
        for (label, count) in rows {
            let w = count as f64 / most * PLOT_W * 0.8;
            writeln!(
                out,
                r#"<text x="10" y="{:.1}">{}</text><rect class="bar" x="{LABEL_W}" y="{y:.1}" width="{w:.1}" height="11"/><text x="{:.1}" y="{:.1}">{count}</text>"#,
                y + 10.0,
                escape(&label),
                LABEL_W + w + 4.0,
                y + 10.0
            )?;
            y += ROW_DY;
        }
        y += 30.0;
        Ok(())
    };
    chart(
        out,
        "Hosts per depth (the tree is too large to draw host by host)",
        per_depth
            .iter()
            .enumerate()
            .map(|(d, &c)| (format!("depth {d}"), c))
            .collect(),
    )?;
    chart(
        out,
        "Hosts by fan-out (children launched)",
        per_fanout
            .iter()
            .enumerate()
            .map(|(b, &c)| {
                let label = match b {
                    0 => "0 (leaf)".to_string(),
                    1 => "1".to_string(),
                    b => format!("{}–{}", 1usize << (b - 1), (1usize << b) - 1),
                };
                (label, c)
            })
            .collect(),
    )?;
    chart(
        out,
        "Hosts up per interval of the launch",
        per_bin
            .iter()
            .enumerate()
            .map(|(b, &c)| (format!("≤ {:.3} s", end * (b + 1) as f64 / bins as f64), c))
            .collect(),
    )?;
    Ok((LABEL_W + PLOT_W + 40.0, y))
}
