//! SVG plots of the report, drawn with plotters' SVG backend (text as `<text>` elements, no
//! font files needed).

use crate::Error;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use std::path::Path;

/// One named line of points.
pub(crate) struct Line {
    pub(crate) name: String,
    pub(crate) points: Vec<(f64, f64)>,
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

fn plot_err(path: &Path) -> impl Fn(String) -> Error + '_ {
    move |reason| Error::Plot {
        path: path.to_path_buf(),
        reason,
    }
}

/// Lines over a logarithmic x axis (node counts), y logarithmic (`y_log`, for quantities
/// spanning decades) or linear from 0; `marks` are extra points drawn in the colour of the
/// line of the same index.
pub(crate) fn by_nodes(
    path: &Path,
    title: &str,
    y_desc: &str,
    y_log: bool,
    lines: &[Line],
    marks: &[Line],
) -> Result<(), Error> {
    let all = || lines.iter().chain(marks).flat_map(|l| l.points.iter());
    let (x0, x1) = all().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (y0, y1) = all().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
    if !(x0 > 0.0 && y0 > 0.0 && x1.is_finite() && y1.is_finite()) {
        return Err(plot_err(path)("no positive points to plot".into()));
    }
    // Log axes over less than a decade make plotters search long for key points: widen.
    let x = (x0.min(x1 / 10.0) * 0.8..x1 * 1.25).log_scale();
    if y_log {
        let y = (y0.min(y1 / 10.0) * 0.7..y1 * 1.4).log_scale();
        chart(path, title, y_desc, lines, marks, x, y)
    } else {
        chart(path, title, y_desc, lines, marks, x, 0.0..y1 * 1.1)
    }
}

/// The series legend, upper left, on a translucent white box.
fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())
}

fn nodes_label(x: &f64) -> String {
    match *x {
        x if x >= 1e6 => format!("{}M", x / 1e6),
        x if x >= 1e3 => format!("{}k", x / 1e3),
        x => format!("{x}"),
    }
}

fn chart<X, Y>(
    path: &Path,
    title: &str,
    y_desc: &str,
    lines: &[Line],
    marks: &[Line],
    x: X,
    y: Y,
) -> Result<(), Error>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let err = plot_err(path);
    let root = SVGBackend::new(path, (760, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y)
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("nodes")
        .y_desc(y_desc)
        .x_label_formatter(&nodes_label)
        .draw()
        .map_err(|e| err(e.to_string()))?;
    for (i, line) in lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                line.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| err(e.to_string()))?
            .label(line.name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    for (i, mark) in marks.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(
                mark.points
                    .iter()
                    .map(|&p| Circle::new(p, 4, color.filled())),
            )
            .map_err(|e| err(e.to_string()))?;
    }
    legend(&mut chart).map_err(&err)?;
    root.present().map_err(|e| err(e.to_string()))
}

/// Predicted against measured seconds, one series per predictor, and the diagonal.
pub(crate) fn scatter(path: &Path, title: &str, series: &[Line]) -> Result<(), Error> {
    let err = plot_err(path);
    let max = series
        .iter()
        .flat_map(|l| l.points.iter())
        .fold(0.0f64, |m, p| m.max(p.0).max(p.1))
        * 1.1;
    let root = SVGBackend::new(path, (560, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..max, 0.0..max)
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("measured launch, s")
        .y_desc("predicted launch, s")
        .draw()
        .map_err(|e| err(e.to_string()))?;
    chart
        .draw_series(LineSeries::new([(0.0, 0.0), (max, max)], BLACK.mix(0.4)))
        .map_err(|e| err(e.to_string()))?
        .label("predicted = measured")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.mix(0.4)));
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(s.points.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(|e| err(e.to_string()))?
            .label(s.name.as_str())
            .legend(move |(x, y)| Circle::new((x + 9, y), 4, color.filled()));
    }
    legend(&mut chart).map_err(&err)?;
    root.present().map_err(|e| err(e.to_string()))
}
