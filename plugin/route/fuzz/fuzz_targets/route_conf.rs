//! Fuzzes greedy.conf as route/greedy reads it, and the split it plans.
//! The body is `route_greedy::fuzzing::route_conf`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| route_greedy::fuzzing::route_conf(data));
