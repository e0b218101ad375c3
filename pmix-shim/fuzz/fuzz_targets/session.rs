//! Fuzzes a whole rank session (PMI-1, the switch to PMI-2, PMI-2) fed in chunks.
//! The body is `greedy_pmix::fuzzing::session`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_pmix::fuzzing::session(data));
