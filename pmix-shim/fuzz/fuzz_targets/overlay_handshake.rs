//! Fuzzes the overlay auth handshake: a stranger's hello or welcome.
//! The body is `greedy_pmix::fuzzing::overlay_handshake`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_pmix::fuzzing::overlay_handshake(data));
