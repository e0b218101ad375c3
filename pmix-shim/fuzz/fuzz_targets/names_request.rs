//! Fuzzes another node's name-service request, as node 0 decodes and serves it.
//! The body is `greedy_pmix::fuzzing::names_request`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_pmix::fuzzing::names_request(data));
