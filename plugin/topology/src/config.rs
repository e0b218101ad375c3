//! topology/greedy's key in `greedy.conf` (the file of [`greedy_slurm::conf`]); the split's
//! model comes from the same file's `Route*` keys ([`route_greedy::config`]).
//!
//! | key | value | default |
//! |---|---|---|
//! | `TopologyDelegate` | the site's topology plugin that serves scheduling and topoinfo (`topology/NAME`: `default`, `flat`, `tree`, `block`, …) | [`default_delegate`] |
//!
//! A file that cannot be read, a malformed line, an unknown `Topology*` key or a name that is
//! not a plugin name makes the plugin use the default delegate and log one error line.

use greedy_slurm::ConfError;
use greedy_slurm::conf::{self, Conf};
use std::path::Path;

/// What topology/greedy reads from greedy.conf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyConfig {
    /// `NAME` of `topology/NAME`, the plugin everything but the split is forwarded to.
    pub delegate: String,
}

/// The topology a cluster without `TopologyPlugin` runs: `topology/default` until 24.11, renamed
/// `topology/flat` in 25.05.
pub fn default_delegate(slurm_major_minor: (u32, u32)) -> &'static str {
    if slurm_major_minor >= (25, 5) {
        "flat"
    } else {
        "default"
    }
}

impl TopologyConfig {
    /// The configuration from a parsed greedy.conf, or the first fault in it.
    pub fn from_conf(conf: &Conf, path: &Path, default: &str) -> Result<TopologyConfig, ConfError> {
        conf.check_well_formed(path)?;
        let mut cfg = TopologyConfig {
            delegate: default.to_owned(),
        };
        for e in &conf.entries {
            if e.is("TopologyDelegate") {
                let name = e.value.trim();
                let plugin_name = !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
                if !plugin_name {
                    return Err(
                        e.error(path, "expected a topology plugin name such as flat or tree")
                    );
                }
                if name == "greedy" {
                    return Err(e.error(path, "topology/greedy cannot delegate to itself"));
                }
                cfg.delegate = name.to_owned();
            } else if e
                .key
                .get(..8)
                .is_some_and(|p| p.eq_ignore_ascii_case("topology"))
            {
                return Err(e.error(path, "unknown key (TopologyDelegate)"));
            }
        }
        Ok(cfg)
    }

    /// Reads `path`: the configuration, and the one line to log when the file was ignored.
    pub fn load(path: &Path, default: &str) -> (TopologyConfig, Option<String>) {
        let fallback = || TopologyConfig {
            delegate: default.to_owned(),
        };
        let parsed = conf::read(path).and_then(|text| match text {
            None => Ok(None),
            Some(text) => TopologyConfig::from_conf(&conf::parse(&text), path, default).map(Some),
        });
        match parsed {
            Ok(Some(cfg)) => (cfg, None),
            Ok(None) => (fallback(), None),
            Err(e) => (
                fallback(),
                Some(format!(
                    "topology/greedy: {e}; ignoring TopologyDelegate, delegating to topology/{default}"
                )),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<TopologyConfig, ConfError> {
        TopologyConfig::from_conf(&conf::parse(text), Path::new("/e/greedy.conf"), "flat")
    }

    #[test]
    fn the_delegate_is_named_or_the_release_default() {
        assert_eq!(parse("").unwrap().delegate, "flat");
        assert_eq!(
            parse("TopologyDelegate=tree\nRouteSeq=0.01\n")
                .unwrap()
                .delegate,
            "tree"
        );
        assert_eq!(default_delegate((24, 11)), "default");
        assert_eq!(default_delegate((26, 5)), "flat");
    }

    #[test]
    fn bad_names_and_unknown_keys_name_the_line() {
        for bad in [
            "TopologyDelegate=../x",
            "TopologyDelegate=greedy",
            "TopologyDelegat=tree",
            "TopologyDelegate=",
        ] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.contains("greedy.conf"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_bad_file_falls_back_with_one_line() {
        let dir = std::env::temp_dir().join(format!("topo-conf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("greedy.conf");
        std::fs::write(&path, "TopologyDelegate=Tree!\n").unwrap();
        let (cfg, line) = TopologyConfig::load(&path, "default");
        assert_eq!(cfg.delegate, "default");
        assert!(line.unwrap().contains("delegating to topology/default"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
