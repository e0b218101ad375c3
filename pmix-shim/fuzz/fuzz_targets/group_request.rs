//! Fuzzes another node's subset-collective contribution, as node 0 decodes and gathers it.
//! The body is `greedy_pmix::fuzzing::group_request`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_pmix::fuzzing::group_request(data));
