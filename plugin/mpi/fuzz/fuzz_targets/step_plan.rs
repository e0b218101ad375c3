//! Fuzzes a stepd's GREEDY_MPI_* environment (StepPlan::from_env).
//! The body is `mpi_greedy::fuzzing::step_plan`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mpi_greedy::fuzzing::step_plan(data));
