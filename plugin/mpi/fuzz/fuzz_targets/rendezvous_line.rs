//! Fuzzes a line of srun's rendezvous listener (publish, lookup, answer, exit report).
//! The body is `mpi_greedy::fuzzing::rendezvous_line`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mpi_greedy::fuzzing::rendezvous_line(data));
