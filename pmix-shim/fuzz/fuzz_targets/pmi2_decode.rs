//! Fuzzes the PMI-2 frame decoder.
//! The body is `greedy_pmix::fuzzing::pmi2_decode`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_pmix::fuzzing::pmi2_decode(data));
