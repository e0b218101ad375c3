//! Fuzzes the first line a client sends a session's control socket (`greedyrun --tasks`,
//! `--status`, `--end-session` while GREEDY_SESSION is set).
//! The body is `greedy_launcher::fuzzing::session_request`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_launcher::fuzzing::session_request(data));
