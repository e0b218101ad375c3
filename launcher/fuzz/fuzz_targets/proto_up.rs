//! Fuzzes the frames an agent sends up a launch-tree edge (hello, output, exits, …).
//! The body is `greedy_launcher::fuzzing::proto_up`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_launcher::fuzzing::proto_up(data));
