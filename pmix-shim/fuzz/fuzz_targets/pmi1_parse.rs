//! Fuzzes the PMI-1 line parser and the reply encoder.
//! The body is `greedy_pmix::fuzzing::pmi1_parse`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_pmix::fuzzing::pmi1_parse(data));
