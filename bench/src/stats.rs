//! Medians, min–max and ratios of repeated runs: what every generated table shows.

use std::fmt;

/// Median and range of one competitor's runs in one configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Summary {
    /// Median (mean of the two middle values for an even count).
    pub(crate) median: f64,
    /// Fastest run.
    pub(crate) min: f64,
    /// Slowest run.
    pub(crate) max: f64,
    /// Runs summarised.
    pub(crate) n: usize,
}

impl Summary {
    /// Summarises finite values; `None` when there is none (every run failed).
    pub(crate) fn of(values: impl IntoIterator<Item = f64>) -> Option<Summary> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Summary {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        })
    }

    /// "median (min–max)" with `decimals` digits after the point.
    pub(crate) fn cell(&self, decimals: usize) -> String {
        format!(
            "{:.d$} ({:.d$}–{:.d$})",
            self.median,
            self.min,
            self.max,
            d = decimals
        )
    }
}

/// Ratio of two medians (`a / b`), `None` if either is missing or `b` is 0.
pub(crate) fn ratio(a: Option<Summary>, b: Option<Summary>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b.median != 0.0 => Some(a.median / b.median),
        _ => None,
    }
}

/// A ratio as "1.07×", or "—".
pub(crate) struct Times(pub(crate) Option<f64>);

impl fmt::Display for Times {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(r) => write!(f, "{r:.2}×"),
            None => f.write_str("—"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts_and_range() {
        let s = Summary::of([3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        let s = Summary::of([4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.5, 1.0, 4.0, 4));
        assert_eq!(s.cell(1), "2.5 (1.0–4.0)");
    }

    #[test]
    fn failed_runs_are_left_out_and_nothing_gives_none() {
        let s = Summary::of([f64::NAN, 5.0, f64::INFINITY]).unwrap();
        assert_eq!((s.median, s.n), (5.0, 1));
        assert_eq!(Summary::of([]), None);
        assert_eq!(Summary::of([f64::NAN]), None);
    }

    #[test]
    fn ratio_of_medians() {
        let a = Summary::of([2.0, 4.0, 3.0]);
        let b = Summary::of([1.0, 2.0, 1.5]);
        assert_eq!(ratio(a, b), Some(2.0));
        assert_eq!(ratio(a, None), None);
        assert_eq!(ratio(a, Summary::of([0.0])), None);
        assert_eq!(Times(ratio(a, b)).to_string(), "2.00×");
        assert_eq!(Times(None).to_string(), "—");
    }
}
