//! route/greedy's keys in `greedy.conf` (see [`greedy_slurm::conf`] for the file and its
//! place): the launch model the split plans with, and whether to log each split.
//!
//! | key | value | default |
//! |---|---|---|
//! | `RouteSeq` | seconds a forwarder spends between contacting two children (SEQ) | [`DEFAULT_SEQ`] |
//! | `RouteRem` | seconds until a contacted host forwards in turn (REM) | [`DEFAULT_REM`] |
//! | `RouteConcurrency` | contacts a forwarder keeps in flight at once | 1 |
//! | `RouteLogSplits` | `yes`: log every split at info level (tests, debugging) | `no` |
//!
//! A missing file means the defaults. A file that cannot be read, a malformed line, an unknown
//! `Route*` key or a value the model refuses makes the plugin ignore the whole file (defaults,
//! never a half-applied file) and log one error line naming the first fault. Keys of other
//! plugins (any other prefix) are ignored. Every node must see the same values: a forwarder
//! re-plans its sub-list with its own copy, and different models would give different trees.

use greedy_slurm::ConfError;
use greedy_slurm::conf::{self, Conf};
use greedy_tree::LaunchModel;
use std::path::Path;

/// SEQ measured on the emulated cluster by `tests/slurm/route-calibrate.sh` (16 hosts,
/// `--delay 10`, 2 cores; docs/benchmarks.md). Most of it is CPU: the emulated hosts share two
/// cores, so each extra host a sender reaches costs a slurmstepd start on the same CPUs. A real
/// site should calibrate its own.
pub const DEFAULT_SEQ: f64 = 0.011;

/// REM measured with [`DEFAULT_SEQ`]: a forwarding hop (connect, forward, reply) at a 20 ms
/// host-to-host round trip.
pub const DEFAULT_REM: f64 = 0.056;

/// What route/greedy reads from greedy.conf.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteConfig {
    /// The model the split plans with (TreeWidth is applied per call): `RouteSeq`, `RouteRem`
    /// and `RouteConcurrency`, validated as one model when the file is read.
    pub model: LaunchModel,
    /// Log each split at info level.
    pub log_splits: bool,
}

impl Default for RouteConfig {
    fn default() -> Self {
        RouteConfig {
            model: LaunchModel::new(DEFAULT_SEQ, DEFAULT_REM).expect("the defaults are valid"),
            log_splits: false,
        }
    }
}

impl RouteConfig {
    /// The configuration from a parsed greedy.conf, or the first fault in it.
    pub fn from_conf(conf: &Conf, path: &Path) -> Result<RouteConfig, ConfError> {
        conf.check_well_formed(path)?;
        let mut cfg = RouteConfig::default();
        let m = cfg.model;
        let (mut seq, mut rem, mut concurrency) = (m.seq(), m.rem(), m.concurrency());
        for e in &conf.entries {
            let bad = |reason: &str| e.error(path, reason);
            let seconds = || {
                e.value
                    .parse::<f64>()
                    .map_err(|_| bad("expected a number of seconds"))
            };
            if e.is("RouteSeq") {
                seq = seconds()?;
            } else if e.is("RouteRem") {
                rem = seconds()?;
            } else if e.is("RouteConcurrency") {
                concurrency = e
                    .value
                    .parse()
                    .map_err(|_| bad("expected a whole number"))?;
            } else if e.is("RouteLogSplits") {
                cfg.log_splits = match e.value.to_ascii_lowercase().as_str() {
                    "yes" | "true" | "1" => true,
                    "no" | "false" | "0" => false,
                    _ => return Err(bad("expected yes or no")),
                };
            } else if e
                .key
                .get(..5)
                .is_some_and(|p| p.eq_ignore_ascii_case("route"))
            {
                return Err(bad(
                    "unknown key (RouteSeq, RouteRem, RouteConcurrency, RouteLogSplits)",
                ));
            }
        }
        cfg.model = LaunchModel::new(seq, rem)
            .and_then(|m| m.with_concurrency(concurrency))
            .map_err(|err| ConfError::Line {
                path: path.to_owned(),
                line: 0,
                text: String::new(),
                reason: err.to_string(),
            })?;
        Ok(cfg)
    }

    /// Reads `path`: the configuration, and the one line to log when the file was ignored.
    pub fn load(path: &Path) -> (RouteConfig, Option<String>) {
        let parsed = conf::read(path).and_then(|text| match text {
            None => Ok(None),
            Some(text) => RouteConfig::from_conf(&conf::parse(&text), path).map(Some),
        });
        match parsed {
            Ok(Some(cfg)) => (cfg, None),
            Ok(None) => (RouteConfig::default(), None),
            Err(e) => {
                let d = RouteConfig::default();
                let line = format!(
                    "{e}; ignoring the file, using RouteSeq={} RouteRem={}",
                    d.model.seq(),
                    d.model.rem()
                );
                (d, Some(line))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, want: Result<RouteConfig, &str>) {
        let got = RouteConfig::from_conf(&conf::parse(text), Path::new("/e/greedy.conf"));
        match (got, want) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{text:?}"),
            (Err(got), Err(want)) => assert!(got.to_string().contains(want), "{text:?}: {got}"),
            (got, want) => panic!("{text:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn keys_values_and_faults() {
        let d = RouteConfig::default();
        check("", Ok(d.clone()));
        check(
            "RouteSeq=0.01\nrouterem = 0.3\nRouteLogSplits=yes\nMpiFoo=bar\n",
            Ok(RouteConfig {
                model: LaunchModel::new(0.01, 0.3).unwrap(),
                log_splits: true,
            }),
        );
        check(
            "RouteConcurrency=4",
            Ok(RouteConfig {
                model: d.model.with_concurrency(4).unwrap(),
                ..d.clone()
            }),
        );
        check("RouteSeq=fast", Err("line 1: expected a number of seconds"));
        check("RouteRem=0", Err("rem = 0: must be at least 1 ns"));
        check("RouteConcurrency=0", Err("concurrency"));
        check("RouteWidth=4", Err("unknown key"));
        check("RouteLogSplits=maybe", Err("yes or no"));
        check("RouteSeq 0.01", Err("line 1: expected Key=Value"));
        // A key whose 5th byte is inside a character is another plugin's key, not a panic
        // (found by the route_conf fuzz target).
        check("\0\0\0R\u{91}NSplits=1", Ok(d.clone()));
    }

    #[test]
    fn load_ignores_a_bad_file_with_one_line_and_a_missing_one_silently() {
        let dir = std::env::temp_dir().join(format!("route-greedy-conf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = RouteConfig::load(&dir.join("missing.conf"));
        assert_eq!(missing, (RouteConfig::default(), None));
        let bad = dir.join("bad.conf");
        std::fs::write(&bad, "RouteSeq=0.5\nRouteRem=oops\n").unwrap();
        let (cfg, line) = RouteConfig::load(&bad);
        assert_eq!(cfg, RouteConfig::default());
        let line = line.unwrap();
        assert!(
            line.contains("bad.conf: line 2") && line.contains("ignoring the file"),
            "{line}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
