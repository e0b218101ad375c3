//! Fuzzes a task hook's stdio record (Charm++ steps) as received.
//! The body is `mpi_greedy::fuzzing::stdio_record`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mpi_greedy::fuzzing::stdio_record(data));
