//! Fuzzes mpi.conf as srun reads it, and its trip to the stepds.
//! The body is `mpi_greedy::fuzzing::mpi_conf`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mpi_greedy::fuzzing::mpi_conf(data));
