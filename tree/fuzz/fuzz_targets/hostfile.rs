//! Fuzzes hostfile parsing: every input gives hosts or an error naming a line, never a panic.
#![no_main]

use greedy_tree::{Error, hostfile};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match hostfile::parse(text) {
        Ok(hosts) => assert!(hosts.iter().all(|h| !h.host.is_empty() && h.slots != Some(0))),
        Err(Error::Hostfile { line, column, .. }) => {
            assert!(line >= 1 && line <= text.lines().count() && column >= 1)
        }
        Err(Error::NoHosts { .. }) => {}
        Err(other) => panic!("unexpected error kind: {other}"),
    }
});
