//! SVG plots for docs/plots/: grouped bars with min–max whiskers (one bar per competitor,
//! one group per configuration) and measured-vs-modeled launch curves (the paper's Figure 4).

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::coord::combinators::{BindKeyPoints, WithKeyPoints};
use plotters::coord::types::{RangedCoordf64, RangedCoordi32};
use plotters::prelude::*;

use crate::{data::create_parent, stats::Summary};

/// Colour-blind-safe colours (Okabe–Ito); a series keeps its colour in every group.
const COLOURS: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(213, 94, 0),
    RGBColor(120, 120, 120),
];

fn colour(i: usize) -> RGBColor {
    COLOURS[i % COLOURS.len()]
}

/// One configuration on the x axis and its competitors' runs.
pub(crate) struct BarGroup {
    /// Label under the group.
    pub(crate) label: String,
    /// (series name, runs) per competitor; a series absent here leaves a gap.
    pub(crate) bars: Vec<(String, Summary)>,
}

/// Draws grouped bars: height = median, whisker = min–max, the median written above.
pub(crate) fn bars(path: &Path, title: &str, y_label: &str, groups: &[BarGroup]) -> Result<()> {
    let series = series_names(groups);
    let top = groups
        .iter()
        .flat_map(|g| g.bars.iter().map(|(_, s)| s.max))
        .fold(0.0, f64::max);
    // x in thousandths of a group: integer coordinates take custom tick positions (key points
    // under the group centres) and a formatter that names the group.
    let n = groups.len().max(1) as i32 * 1000;
    // One bar per group: the group label names it, a legend would repeat it.
    let legend = groups.iter().any(|g| g.bars.len() > 1);
    // Headroom for the medians written above the whiskers, and for the legend box.
    let top = top * if legend { 1.4 } else { 1.15 };
    let width = (220 + 110 * groups.len() * series.len().max(1)).clamp(640, 1400) as u32;
    create_parent(path)?;
    let root = SVGBackend::new(path, (width, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let labels: Vec<String> = groups.iter().map(|g| g.label.clone()).collect();
    let centres: Vec<i32> = (0..groups.len() as i32).map(|i| i * 1000 + 500).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((0i32..n).with_key_points(centres), 0f64..top.max(1e-9))
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .y_label_formatter(&|y| {
            if top > 20.0 {
                format!("{y:.0}")
            } else {
                short(*y)
            }
        })
        .x_label_formatter(&|x| {
            labels
                .get((x / 1000).max(0) as usize)
                .cloned()
                .unwrap_or_default()
        })
        .x_label_style(("sans-serif", 14))
        .y_desc(y_label)
        .draw()
        .map_err(plot_err)?;
    // Within a group only its own bars share the width; a series keeps its colour everywhere.
    for (si, name) in series.iter().enumerate() {
        draw_bar_series(&mut chart, groups, si, name, legend, top)?;
    }
    if !legend {
        root.present().map_err(plot_err)?;
        return Ok(());
    }
    legend_box(&mut chart, 14)?;
    root.present().map_err(plot_err)?;
    Ok(())
}

/// The bar chart's coordinates: x in thousandths of a group, y the value.
type BarChart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<WithKeyPoints<RangedCoordi32>, RangedCoordf64>>;

/// Series names in order of first appearance.
fn series_names(groups: &[BarGroup]) -> Vec<&str> {
    let mut series: Vec<&str> = vec![];
    for g in groups {
        for (s, _) in &g.bars {
            if !series.contains(&s.as_str()) {
                series.push(s);
            }
        }
    }
    series
}

/// Series `si`'s bars, whiskers and median labels in every group that has it, and its legend
/// entry if there is a legend.
fn draw_bar_series(
    chart: &mut BarChart<'_, '_>,
    groups: &[BarGroup],
    si: usize,
    name: &str,
    legend: bool,
    top: f64,
) -> Result<()> {
    let c = colour(si);
    let placed = bar_places(groups, name);
    let drawn = chart
        .draw_series(placed.iter().map(|&(x, slot, s)| {
            Rectangle::new(
                [(x + slot / 12, 0.0), (x + slot * 11 / 12, s.median)],
                c.filled(),
            )
        }))
        .map_err(plot_err)?;
    if legend {
        drawn
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
    }
    chart
        .draw_series(placed.iter().map(|&(x, slot, s)| {
            ErrorBar::new_vertical(
                x + slot / 2,
                s.min,
                s.median,
                s.max,
                BLACK.stroke_width(1),
                8,
            )
        }))
        .map_err(plot_err)?;
    chart
        .draw_series(placed.iter().map(|&(x, slot, s)| {
            Text::new(
                short(s.median),
                (x + slot / 3, s.max + top * 0.03),
                ("sans-serif", 13),
            )
        }))
        .map_err(plot_err)?;
    Ok(())
}

/// (left x, slot width, runs) of series `name` in each group that has it: within a group only
/// its own bars share the width.
fn bar_places(groups: &[BarGroup], name: &str) -> Vec<(i32, i32, Summary)> {
    groups
        .iter()
        .enumerate()
        .filter_map(|(gi, g)| {
            let slot = 800 / g.bars.len().max(1) as i32;
            g.bars
                .iter()
                .position(|(s, _)| s == name)
                .map(|k| (gi as i32 * 1000 + 100 + slot * k as i32, slot, g.bars[k].1))
        })
        .collect()
}

/// One line of a [`Panel`]: a topology's measured runs per host count and the model's curve.
pub(crate) struct Curve {
    /// Legend name.
    pub(crate) name: String,
    /// (hosts, runs), drawn solid with min–max whiskers.
    pub(crate) measured: Vec<(f64, Summary)>,
    /// (hosts, seconds), drawn dashed.
    pub(crate) modeled: Vec<(f64, f64)>,
}

/// One (shell, delay) of the model validation.
pub(crate) struct Panel {
    /// Panel caption.
    pub(crate) title: String,
    /// One per topology.
    pub(crate) curves: Vec<Curve>,
}

/// Draws panels side by side (`cols` per row): hosts on a log₂ axis, seconds, solid measured
/// with whiskers, dashed modeled.
pub(crate) fn model_panels(path: &Path, title: &str, panels: &[Panel], cols: usize) -> Result<()> {
    let cols = cols.max(1);
    let rows = panels.len().div_ceil(cols).max(1);
    create_parent(path)?;
    let root = SVGBackend::new(path, ((520 * cols as u32).max(760), 40 + 380 * rows as u32))
        .into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let (head, body) = root.split_vertically(40);
    head.titled(title, ("sans-serif", 20)).map_err(plot_err)?;
    for (area, panel) in body.split_evenly((rows, cols)).iter().zip(panels) {
        draw_panel(area, panel)?;
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

/// One panel of [`model_panels`] in its own area, legend included.
fn draw_panel(area: &DrawingArea<SVGBackend<'_>, Shift>, panel: &Panel) -> Result<()> {
    let xs = panel
        .curves
        .iter()
        .flat_map(|c| c.measured.iter().map(|m| m.0));
    let (lo, hi) = xs.fold((f64::MAX, 0.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
    // x is log2(hosts) on a linear axis, so ticks fall on the measured powers of two.
    let (lo, hi) = if lo <= hi {
        (lo.log2(), hi.log2())
    } else {
        (0.0, 1.0)
    };
    let top = panel
        .curves
        .iter()
        .flat_map(|c| {
            c.measured
                .iter()
                .map(|m| m.1.max)
                .chain(c.modeled.iter().map(|m| m.1))
        })
        .fold(0.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(lo - 0.25..hi + 0.25, 0f64..top.max(1e-9))
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("hosts")
        .light_line_style(WHITE)
        .y_desc("launch s")
        .x_labels((hi - lo) as usize + 2)
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 {
                format!("{}", 2f64.powf(x.round()))
            } else {
                String::new()
            }
        })
        .draw()
        .map_err(plot_err)?;
    for (i, c) in panel.curves.iter().enumerate() {
        let col = colour(i);
        chart
            .draw_series(LineSeries::new(
                c.measured.iter().map(|&(x, s)| (x.log2(), s.median)),
                col.stroke_width(2),
            ))
            .map_err(plot_err)?
            .label(c.name.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], col.stroke_width(2)));
        chart
            .draw_series(c.measured.iter().map(|&(x, s)| {
                ErrorBar::new_vertical(x.log2(), s.min, s.median, s.max, col.stroke_width(1), 6)
            }))
            .map_err(plot_err)?;
        chart
            .draw_series(DashedLineSeries::new(
                c.modeled.iter().map(|&(x, y)| (x.log2(), y)),
                6,
                4,
                col.stroke_width(1),
            ))
            .map_err(plot_err)?;
    }
    legend_box(&mut chart, 12)?;
    Ok(())
}

/// The series legend, upper left, on a translucent white box.
fn legend_box<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    font_size: u32,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", font_size))
        .draw()
        .map_err(plot_err)
}

/// A median as bar text: 3 significant digits.
fn short(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn plot_err<E: std::error::Error + Send + Sync + 'static>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[f64]) -> Summary {
        Summary::of(v.iter().copied()).unwrap()
    }

    #[test]
    fn bars_write_an_svg_with_every_label_and_a_bar_per_competitor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.svg");
        let groups = vec![
            BarGroup {
                label: "16 hosts".into(),
                bars: vec![
                    ("greedyrun".into(), s(&[2.0, 2.1])),
                    ("hydra".into(), s(&[2.2, 2.4])),
                ],
            },
            BarGroup {
                label: "64 hosts".into(),
                bars: vec![("greedyrun".into(), s(&[2.2]))],
            },
        ];
        bars(&path, "hydra 1.07× greedyrun", "ms", &groups).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        for text in [
            "hydra 1.07× greedyrun",
            "16 hosts",
            "64 hosts",
            "greedyrun",
            "hydra",
        ] {
            assert!(svg.contains(text), "{text} missing");
        }
        assert!(svg.matches("<rect").count() >= 3, "{svg}");
    }

    #[test]
    fn model_panels_write_one_caption_per_panel() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.svg");
        let curve = |name: &str| Curve {
            name: name.into(),
            measured: vec![(8.0, s(&[0.3, 0.35])), (64.0, s(&[0.6, 0.7]))],
            modeled: vec![(8.0, 0.2), (64.0, 0.5)],
        };
        let panels = vec![
            Panel {
                title: "rsh, 0 ms".into(),
                curves: vec![curve("flat"), curve("greedy")],
            },
            Panel {
                title: "ssh, 0 ms".into(),
                curves: vec![curve("flat")],
            },
        ];
        model_panels(&path, "measured vs modeled", &panels, 2).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("rsh, 0 ms") && svg.contains("ssh, 0 ms") && svg.contains("greedy"));
    }

    #[test]
    fn medians_are_written_with_three_significant_digits() {
        assert_eq!(short(2247.4), "2247");
        assert_eq!(short(12.34), "12.3");
        assert_eq!(short(0.466), "0.47");
        assert_eq!(short(0.0), "0");
    }
}
