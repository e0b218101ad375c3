//! The machine's load average while a section runs: every number in the doc is read against
//! it, since the emulated hosts share the machine's 2 cores with other engineers' builds.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// How often the 1-minute load average is read during a section.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// One section's load record, a row of docs/data/load.csv.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct LoadRecord {
    /// Section name (`launchers`, `charm`, …).
    pub(crate) section: String,
    /// UTC start, `YYYY-MM-DDTHH:MMZ`.
    pub(crate) started: String,
    /// Wall minutes the section took.
    pub(crate) minutes: f64,
    /// 1-minute load average when the section started.
    pub(crate) load_start: f64,
    /// Mean of the samples taken during the section.
    pub(crate) load_mean: f64,
    /// Highest sample.
    pub(crate) load_max: f64,
}

impl LoadRecord {
    /// "load average (1 min) 3.1 at start, mean 4.2, max 6.0 on 2 cores".
    pub(crate) fn sentence(&self) -> String {
        format!(
            "Measured {} ({:.0} min); machine load average (1 min) {:.1} at start, mean {:.1}, \
             max {:.1} on {} cores.",
            self.started,
            self.minutes,
            self.load_start,
            self.load_mean,
            self.load_max,
            cores()
        )
    }
}

/// Samples the load average on a thread until [`Recorder::finish`].
pub(crate) struct Recorder {
    section: String,
    started: String,
    t0: Instant,
    stop: Arc<AtomicBool>,
    samples: thread::JoinHandle<Vec<f64>>,
}

impl Recorder {
    /// Starts sampling for `section`.
    pub(crate) fn start(section: &str) -> Result<Recorder> {
        let first = load1()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let samples = thread::spawn(move || {
            let mut v = vec![first];
            let mut next = Instant::now() + SAMPLE_EVERY;
            while !flag.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(200));
                if Instant::now() >= next {
                    v.extend(load1().ok());
                    next += SAMPLE_EVERY;
                }
            }
            v
        });
        Ok(Recorder {
            section: section.to_owned(),
            started: utc_now()?,
            t0: Instant::now(),
            stop,
            samples,
        })
    }

    /// Stops sampling and summarises.
    pub(crate) fn finish(self) -> LoadRecord {
        self.stop.store(true, Ordering::Relaxed);
        let mut v = self.samples.join().unwrap_or_default();
        v.extend(load1().ok());
        let start = v.first().copied().unwrap_or(f64::NAN);
        // Rounded as shown: the CSV is read by people too.
        let round = |x: f64, digits: i32| (x * 10f64.powi(digits)).round() / 10f64.powi(digits);
        LoadRecord {
            section: self.section,
            started: self.started,
            minutes: round(self.t0.elapsed().as_secs_f64() / 60.0, 1),
            load_start: start,
            load_mean: round(v.iter().sum::<f64>() / v.len().max(1) as f64, 2),
            load_max: v.iter().copied().fold(f64::NAN, f64::max),
        }
    }
}

/// The 1-minute load average from /proc/loadavg.
fn load1() -> Result<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").context("reading /proc/loadavg")?;
    parse_loadavg(&text).with_context(|| format!("/proc/loadavg: unexpected {text:?}"))
}

fn parse_loadavg(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok()
}

fn cores() -> usize {
    thread::available_parallelism().map_or(0, |n| n.get())
}

/// The current UTC time as `YYYY-MM-DDTHH:MMZ`.
pub(crate) fn utc_now() -> Result<String> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("clock before 1970")?
        .as_secs();
    Ok(utc_minutes(secs))
}

/// Seconds since the epoch as `YYYY-MM-DDTHH:MMZ` (civil-from-days, proleptic Gregorian).
fn utc_minutes(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let (h, m) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_one_minute_figure() {
        assert_eq!(parse_loadavg("3.56 2.10 1.00 2/345 6789\n"), Some(3.56));
        assert_eq!(parse_loadavg(""), None);
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc_minutes(0), "1970-01-01T00:00Z");
        // 2026-11-21T20:15:00Z
        assert_eq!(utc_minutes(1_795_292_100), "2026-11-21T20:15Z");
        assert_eq!(utc_minutes(951_782_400), "2000-02-29T00:00Z");
    }

    #[test]
    fn a_recorder_summarises_its_samples() {
        let r = Recorder::start("x").unwrap().finish();
        assert_eq!(r.section, "x");
        assert!(r.load_max >= r.load_start && r.load_mean >= 0.0, "{r:?}");
        assert!(r.sentence().contains("load average (1 min)"));
    }
}
