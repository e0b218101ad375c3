//! Fuzzes greedy.conf / mpi.conf text (slurm.conf syntax).
//! The body is `greedy_slurm::fuzzing::greedy_conf`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_slurm::fuzzing::greedy_conf(data));
