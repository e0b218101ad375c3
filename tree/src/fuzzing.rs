//! The bodies of the cargo-fuzz targets in `fuzz/`, one function per target, so that the fuzz
//! binaries and the stable corpus replay (`tests/fuzz_corpus.rs`) run the same checks. Each
//! takes arbitrary bytes and panics only when an invariant of the code under test breaks.

use crate::{Error, hostfile, hostlist};

/// A fuzz target: the name of its binary and corpus directory, and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target of this crate.
pub const TARGETS: &[Target] = &[("hostlist", hostlist), ("hostfile", hostfile)];

/// Replays every committed input of `targets` (`FUZZ_DIR/corpus/TARGET/` and the crashes kept
/// in `FUZZ_DIR/regressions/TARGET/`) through its body: each crate's `tests/fuzz_corpus.rs`,
/// so stable `cargo test` keeps every finding fixed. Panics (naming the file) on a failing
/// input, and when a target has no committed input at all.
pub fn replay(fuzz_dir: &std::path::Path, targets: &[Target]) {
    for &(target, body) in targets {
        let mut inputs = 0;
        for dir in ["corpus", "regressions"] {
            let Ok(entries) = std::fs::read_dir(fuzz_dir.join(dir).join(target)) else {
                continue;
            };
            for entry in entries {
                let path = entry.expect("corpus entry").path();
                let data = std::fs::read(&path).expect("corpus file");
                // A panic names the file: replay it with `cargo fuzz run {target} FILE`.
                eprintln!("{}", path.display());
                body(&data);
                inputs += 1;
            }
        }
        assert!(inputs > 0, "no committed corpus for fuzz target {target}");
    }
}

/// Most hosts an input may expand to: the code is the same for any cap (`expand` is
/// `expand_at_most(MAX_HOSTS)`), and legal lists of 2^24 hosts took a second each, leaving the
/// fuzzer a few hundred executions a minute.
pub const FUZZ_MAX_HOSTS: usize = 1 << 12;

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

/// Most hosts a hostfile input may hold: the line and slot parsing is the target's subject and
/// the same for any cap, expansion of large lists is the `hostlist` target's; at 4096 the
/// hostfile corpus grew to files of thousands of hosts and the target to under 1 200
/// executions a second.
pub const FUZZ_MAX_HOSTFILE_HOSTS: usize = 256;

/// Hostfiles: every input gives hosts or an error naming a line, never a panic.
pub fn hostfile(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match hostfile::parse_at_most(text, FUZZ_MAX_HOSTFILE_HOSTS) {
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
