//! Fuzzes the frames a job's client sends a session (its job, commands for its hosts).
//! The body is `greedy_launcher::fuzzing::session_job`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_launcher::fuzzing::session_job(data));
