//! Fuzzes Slurm hostlist expressions (expand, then compress back).
//! The body is `greedy_tree::fuzzing::hostlist`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_tree::fuzzing::hostlist(data));
