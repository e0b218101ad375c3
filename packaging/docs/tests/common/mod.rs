//! What the reference tests share: the pages, the code they describe, and two scanners.
//! (Each plugin is checked by its own test binary: both define Slurm's `init`, `fini` and
//! `plugin_*` symbols, so one binary cannot link both.)
#![allow(dead_code)]

pub(crate) const GREEDY_7: &str = include_str!("../../../man/greedy.7");
pub(crate) const MPI_GREEDY_8: &str = include_str!("../../../man/mpi_greedy.8");
/// The generated pages' extra sections (greedyrun's ENVIRONMENT and EXIT STATUS).
pub(crate) const EXTRA: &str = include_str!("../../src/extra.rs");
pub(crate) const MPI_CONFIG: &str = include_str!("../../../../plugin/mpi/src/config.rs");
pub(crate) const ROUTE_CONFIG: &str = include_str!("../../../../plugin/route/src/config.rs");
pub(crate) const AGENT: &str = include_str!("../../../../launcher/src/agent.rs");
pub(crate) const GREEDYRUN: &str = include_str!("../../../../launcher/src/bin/greedyrun.rs");
pub(crate) const SYSADMIN: &str = include_str!("../../../../docs/sysadmin.md");

/// Checks that every key `guide` names with `prefix` (`GreedyJoinTimeout`) is one of `keys`,
/// but for `except` (Slurm's own keys of that prefix, such as `RoutePlugin`).
pub(crate) fn check_guide_names_keys(guide: &str, prefix: &str, keys: &[&str], except: &[&str]) {
    let named = guide
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| w.len() > prefix.len() && w.starts_with(prefix))
        .filter(|w| w[prefix.len()..].starts_with(|c: char| c.is_ascii_uppercase()));
    let mut count = 0;
    for word in named {
        count += 1;
        assert!(
            keys.contains(&word) || except.contains(&word),
            "the sysadmin guide names {word}, which the plugin does not read"
        );
    }
    assert!(count > 0, "the sysadmin guide names no {prefix}* key");
}

/// Every `"…"` literal following `marker` in `src` (e.g. the keys of `e.is("GreedySeq")`).
pub(crate) fn literals_after(src: &str, marker: &str) -> Vec<String> {
    src.match_indices(marker)
        .filter_map(|(i, _)| {
            let rest = &src[i + marker.len()..];
            rest.find('"').map(|end| rest[..end].to_string())
        })
        .collect()
}

/// The `(default X)` of the `.BR Key=` line in `page`.
pub(crate) fn documented_default(page: &str, key: &str) -> Option<String> {
    let line = page
        .lines()
        .find(|l| l.starts_with(&format!(".BR {key}=")))?;
    let rest = &line[line.find("(default ")? + "(default ".len()..];
    let value = rest.split(')').next()?;
    Some(value.trim().trim_matches('"').trim().to_string())
}

/// Checks that `src` reads exactly the keys of `defaults`, and that each page documents each
/// key with that default.
pub(crate) fn check_keys(src: &str, defaults: &[(&str, String)], pages: &[(&str, &str)]) {
    let mut in_code = literals_after(src, "e.is(\"");
    in_code.sort();
    let mut listed: Vec<String> = defaults.iter().map(|(k, _)| k.to_string()).collect();
    listed.sort();
    assert_eq!(
        in_code, listed,
        "the plugin reads keys this test (and so maybe the pages) does not know"
    );
    for (key, want) in defaults {
        for (name, page) in pages {
            assert_eq!(
                documented_default(page, key).as_deref(),
                Some(want.as_str()),
                "{name}: {key}"
            );
        }
    }
}
