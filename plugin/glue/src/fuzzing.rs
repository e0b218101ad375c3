//! The body of the cargo-fuzz target in `fuzz/`, so that the fuzz binary and the stable corpus
//! replay (`tests/fuzz_corpus.rs`) run the same checks. It takes arbitrary bytes and panics
//! only when an invariant of the code under test breaks.

use std::path::Path;

use crate::conf;

/// A fuzz target: the name of its binary and corpus directory, and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target of this crate.
pub const TARGETS: &[Target] = &[("greedy_conf", greedy_conf)];

/// greedy.conf / mpi.conf text: every non-blank line is an entry or malformed, in file order;
/// entries are trimmed single-word keys; writing the entries back parses to the same entries.
pub fn greedy_conf(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = conf::parse(text);
    let lines = text.lines().count();
    let mut numbers: Vec<usize> = parsed.entries.iter().map(|e| e.line).collect();
    numbers.extend(parsed.malformed.iter().map(|(n, _)| *n));
    numbers.sort_unstable();
    assert!(
        numbers.windows(2).all(|w| w[0] < w[1]),
        "a line counted twice"
    );
    assert!(numbers.iter().all(|n| (1..=lines).contains(n)));
    for e in &parsed.entries {
        assert!(!e.key.is_empty() && !e.key.contains(|c: char| c.is_whitespace() || c == '='));
        assert!(!e.value.contains('#') && e.value.trim() == e.value);
    }
    assert_eq!(
        parsed.check_well_formed(Path::new("f")).is_ok(),
        parsed.malformed.is_empty()
    );
    let written: String = parsed
        .entries
        .iter()
        .map(|e| format!("{}={}\n", e.key, e.value))
        .collect();
    let again = conf::parse(&written);
    let pairs = |c: &conf::Conf| -> Vec<(String, String)> {
        c.entries
            .iter()
            .map(|e| (e.key.clone(), e.value.clone()))
            .collect()
    };
    assert_eq!(pairs(&again), pairs(&parsed));
    assert!(again.malformed.is_empty());
}
