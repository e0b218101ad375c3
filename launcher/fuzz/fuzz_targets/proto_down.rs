//! Fuzzes the frames a parent sends down a launch-tree edge (Start, routed commands).
//! The body is `greedy_launcher::fuzzing::proto_down`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_launcher::fuzzing::proto_down(data));
