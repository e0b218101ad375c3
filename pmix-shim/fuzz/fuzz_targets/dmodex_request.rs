//! Fuzzes a remote node's PMIx direct-modex request.
//! The body is `greedy_pmix::fuzzing::dmodex_request`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_pmix::fuzzing::dmodex_request(data));
