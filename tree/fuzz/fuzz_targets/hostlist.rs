//! Fuzzes hostlist expressions: errors, never panics; what expands compresses back losslessly.
#![no_main]

use greedy_tree::hostlist::{MAX_HOSTS, compress, expand};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(expr) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(hosts) = expand(expr) {
        assert!(!hosts.is_empty() && hosts.len() <= MAX_HOSTS);
        assert_eq!(expand(&compress(&hosts)).expect("compressed form parses"), hosts);
    }
});
