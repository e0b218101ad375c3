//! Fuzzes Open MPI / MPICH / plain hostfiles.
//! The body is `greedy_tree::fuzzing::hostfile`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_tree::fuzzing::hostfile(data));
