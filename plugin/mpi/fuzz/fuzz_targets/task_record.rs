//! Fuzzes the task hooks' fork/exit records read by the agent.
//! The body is `mpi_greedy::fuzzing::task_record`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mpi_greedy::fuzzing::task_record(data));
