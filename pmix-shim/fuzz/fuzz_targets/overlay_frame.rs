//! Fuzzes the overlay frame decoder.
//! The body is `greedy_pmix::fuzzing::overlay_frame`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_pmix::fuzzing::overlay_frame(data));
