//! The bodies of the cargo-fuzz targets in `fuzz/`, one function per target, so that the fuzz
//! binaries and the stable corpus replay (`tests/fuzz_corpus.rs`) run the same checks. Each
//! takes arbitrary bytes and panics only when an invariant of the code under test breaks.

use crate::{Error, hostfile, hostlist};

/// A fuzz target: the name of its binary and corpus directory, and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target of this crate.
pub const TARGETS: &[Target] = &[("hostlist", hostlist), ("hostfile", hostfile)];

/// Most hosts an input may expand to: the code is the same for any cap (`expand` is
/// `expand_at_most(MAX_HOSTS)`), and legal lists of 2^24 hosts took a second each, leaving the
/// fuzzer a few hundred executions a minute.
const FUZZ_MAX_HOSTS: usize = 1 << 12;

/// Hostlist expressions: errors, never panics; what expands compresses back losslessly.
pub fn hostlist(data: &[u8]) {
    let Ok(expr) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(hosts) = hostlist::expand_at_most(expr, FUZZ_MAX_HOSTS) {
        assert!(!hosts.is_empty() && hosts.len() <= FUZZ_MAX_HOSTS);
        let again = hostlist::expand_at_most(&hostlist::compress(&hosts), FUZZ_MAX_HOSTS)
            .expect("compressed form parses");
        assert_eq!(again, hosts);
    }
}

/// Hostfiles: every input gives hosts or an error naming a line, never a panic.
pub fn hostfile(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match hostfile::parse_at_most(text, FUZZ_MAX_HOSTS) {
        Ok(hosts) => assert!(
            hosts
                .iter()
                .all(|h| !h.host.is_empty() && h.slots != Some(0))
        ),
        Err(Error::Hostfile { line, column, .. }) => {
            assert!(line >= 1 && line <= text.lines().count() && column >= 1)
        }
        Err(Error::NoHosts { .. }) => {}
        Err(other) => panic!("unexpected error kind: {other}"),
    }
}
