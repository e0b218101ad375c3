//! Fuzzes the Charm++ netlrts frame decoder and session.
//! The body is `greedy_pmix::fuzzing::charm_frame`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_pmix::fuzzing::charm_frame(data));
