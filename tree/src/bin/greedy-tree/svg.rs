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
    let (x, leaves) = layout(tree);
    let max_depth = depth.iter().copied().max().unwrap_or(0) as f64;
    write_tree(out, hosts, tree, times, depth, &x)?;
    let tree_w = 80.0 + leaves * LEAF_DX;
    let top = 60.0 + max_depth * LEVEL_DY + 80.0;
    Timeline::new(hosts, tree, model, times, top).write(out)?;
    let w = tree_w.max(LABEL_W + PLOT_W + 40.0);
    Ok((w, top + n as f64 * ROW_DY + 30.0))
}

/// Each host's x in leaf widths, and the number of leaves: leaves left to right in preorder,
/// a parent centred over its first and last child.
fn layout(tree: &Tree) -> (Vec<f64>, f64) {
    let n = tree.len();
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
    (x, leaves)
}

/// The tree: an edge per launch, a labelled dot per host at `x` (from [`layout`]) and its depth.
fn write_tree(
    out: &mut Vec<u8>,
    hosts: &[String],
    tree: &Tree,
    times: &[f64],
    depth: &[u32],
    x: &[f64],
) -> io::Result<()> {
    let px = |v: usize| 40.0 + x[v] * LEAF_DX;
    let py = |v: usize| 60.0 + f64::from(depth[v]) * LEVEL_DY;
    writeln!(out, "<g class=\"tree\">")?;
    for v in 0..tree.len() {
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
    for v in 0..tree.len() {
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
    writeln!(out, "</g>")
}

/// The launch timeline: per host, its own launch (REM, from its parent's start of it) then its
/// SEQ intervals, one per launch of a child.
struct Timeline<'a> {
    hosts: &'a [String],
    tree: &'a Tree,
    model: &'a LaunchModel,
    times: &'a [f64],
    /// y of the first row.
    top: f64,
    /// Seconds the plot's width covers.
    span: f64,
}

impl<'a> Timeline<'a> {
    fn new(
        hosts: &'a [String],
        tree: &'a Tree,
        model: &'a LaunchModel,
        times: &'a [f64],
        top: f64,
    ) -> Self {
        // The last launch, or the end of the last SEQ interval if later.
        let mut seq_end = 0.0f64;
        for (v, t) in times.iter().enumerate() {
            let k = tree.children(v).count();
            if k > 0 {
                seq_end = seq_end.max(t + model.child_offset(k) - model.rem() + model.seq());
            }
        }
        let span = times.iter().copied().fold(seq_end, f64::max).max(1e-9);
        Timeline {
            hosts,
            tree,
            model,
            times,
            top,
            span,
        }
    }

    /// x of `t` seconds.
    fn x(&self, t: f64) -> f64 {
        LABEL_W + t / self.span * PLOT_W
    }

    /// The caption, the time grid, then one row per host.
    fn write(&self, out: &mut Vec<u8>) -> io::Result<()> {
        let n = self.tree.len();
        let top = self.top;
        writeln!(out, "<g class=\"timeline\">")?;
        writeln!(
            out,
            r#"<text x="10" y="{:.1}">Launch timeline: light = a host being launched (REM, from its parent's start), dark = the host spending SEQ on each child it launches</text>"#,
            top - 10.0
        )?;
        for i in 0..=5 {
            let t = self.span * f64::from(i) / 5.0;
            let gx = self.x(t);
            let bottom = top + n as f64 * ROW_DY;
            writeln!(
                out,
                r#"<line class="grid" x1="{gx:.1}" y1="{top:.1}" x2="{gx:.1}" y2="{bottom:.1}"/><text x="{gx:.1}" y="{:.1}" text-anchor="middle">{t:.3} s</text>"#,
                bottom + 12.0
            )?;
        }
        for v in 0..n {
            self.write_row(out, v)?;
        }
        writeln!(out, "</g>")
    }

    /// Host `v`'s row: its name, its REM bar (not the root's) and a SEQ bar per child.
    fn write_row(&self, out: &mut Vec<u8>, v: usize) -> io::Result<()> {
        let (hosts, times, model) = (self.hosts, self.times, self.model);
        let y = self.top + v as f64 * ROW_DY;
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
                self.x(start),
                y + 1.0,
                (self.x(times[v]) - self.x(start)).max(0.5),
                escape(&hosts[v]),
                escape(&hosts[self.tree.parent(v).unwrap_or(0)]),
                start,
                times[v]
            )?;
        }
        for (i, c) in self.tree.children(v).enumerate() {
            let s = times[v] + model.child_offset(i + 1) - model.rem();
            writeln!(
                out,
                r#"<rect class="seq" x="{:.1}" y="{:.1}" width="{:.1}" height="6"><title>{} launches {} at {s:.3} s</title></rect>"#,
                self.x(s),
                y + 3.0,
                (self.x(s + model.seq()) - self.x(s)).max(0.5),
                escape(&hosts[v]),
                escape(&hosts[c])
            )?;
        }
        Ok(())
    }
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
    let bins = 20usize;
    let mut y = 50.0;
    write_bars(
        out,
        &mut y,
        "Hosts per depth (the tree is too large to draw host by host)",
        per_depth(depth)
            .iter()
            .enumerate()
            .map(|(d, &c)| (format!("depth {d}"), c))
            .collect(),
    )?;
    write_bars(
        out,
        &mut y,
        "Hosts by fan-out (children launched)",
        per_fanout(tree)
            .iter()
            .enumerate()
            .map(|(b, &c)| (fanout_label(b), c))
            .collect(),
    )?;
    write_bars(
        out,
        &mut y,
        "Hosts up per interval of the launch",
        per_bin(times, end, bins)
            .iter()
            .enumerate()
            .map(|(b, &c)| (format!("≤ {:.3} s", end * (b + 1) as f64 / bins as f64), c))
            .collect(),
    )?;
    Ok((LABEL_W + PLOT_W + 40.0, y))
}

/// Hosts per depth.
fn per_depth(depth: &[u32]) -> Vec<usize> {
    let mut per_depth = vec![0usize; depth.iter().copied().max().unwrap_or(0) as usize + 1];
    for &d in depth {
        per_depth[d as usize] += 1;
    }
    per_depth
}

/// Hosts per fan-out bucket: bucket 0 the leaves, bucket b ≥ 1 fan-out in [2^(b-1), 2^b).
fn per_fanout(tree: &Tree) -> Vec<usize> {
    let mut per_fanout: Vec<usize> = Vec::new();
    for v in 0..tree.len() {
        let k = tree.children(v).count();
        let b = if k == 0 { 0 } else { k.ilog2() as usize + 1 };
        if per_fanout.len() <= b {
            per_fanout.resize(b + 1, 0);
        }
        per_fanout[b] += 1;
    }
    per_fanout
}

/// The label of fan-out bucket `b` (see [`per_fanout`]).
fn fanout_label(b: usize) -> String {
    match b {
        0 => "0 (leaf)".to_string(),
        1 => "1".to_string(),
        b => format!("{}–{}", 1usize << (b - 1), (1usize << b) - 1),
    }
}

/// Hosts up in each of `bins` equal intervals of [0, `end`].
fn per_bin(times: &[f64], end: f64, bins: usize) -> Vec<usize> {
    let mut per_bin = vec![0usize; bins];
    for &t in times {
        let b = if end > 0.0 {
            ((t / end) * bins as f64) as usize
        } else {
            0
        };
        per_bin[b.min(bins - 1)] += 1;
    }
    per_bin
}

/// One bar chart from y = `*y` down (a titled bar per row), leaving `*y` below it.
fn write_bars(
    out: &mut Vec<u8>,
    y: &mut f64,
    title: &str,
    rows: Vec<(String, usize)>,
) -> io::Result<()> {
    let most = rows.iter().map(|r| r.1).max().unwrap_or(1).max(1) as f64;
    writeln!(
        out,
        r#"<text x="10" y="{:.1}">{}</text>"#,
        *y,
        escape(title)
    )?;
    *y += 8.0;
    for (label, count) in rows {
        let w = count as f64 / most * PLOT_W * 0.8;
        writeln!(
            out,
            r#"<text x="10" y="{:.1}">{}</text><rect class="bar" x="{LABEL_W}" y="{:.1}" width="{w:.1}" height="11"/><text x="{:.1}" y="{:.1}">{count}</text>"#,
            *y + 10.0,
            escape(&label),
            *y,
            LABEL_W + w + 4.0,
            *y + 10.0
        )?;
        *y += ROW_DY;
    }
    *y += 30.0;
    Ok(())
}
