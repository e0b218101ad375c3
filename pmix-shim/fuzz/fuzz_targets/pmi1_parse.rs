//! Fuzzes the PMI-1 line parser and the reply encoder: no panic, and what parses re-encodes.
#![no_main]

use greedy_pmix::pmi1;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(pmi1::Request::Unsupported { cmd }) = pmi1::parse(data) {
        let line = pmi1::Reply::Unsupported(cmd).encode();
        assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
    }
});
