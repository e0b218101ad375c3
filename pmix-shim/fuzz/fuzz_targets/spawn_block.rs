//! Fuzzes the PMI-1 multi-line spawn request reader and the PMI-2 spawn command's reading.
//! The body is `greedy_pmix::fuzzing::spawn_block`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_pmix::fuzzing::spawn_block(data));
