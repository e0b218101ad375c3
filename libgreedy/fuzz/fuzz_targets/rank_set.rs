//! Fuzzes rank ranges (`0-62,64-127`) as the wire and the command line give them.
//! The body is `greedy_libi::fuzzing::rank_set`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_libi::fuzzing::rank_set(data));
