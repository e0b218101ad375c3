//! Fuzzes the lines a front end reads from its launcher (messages from the master among any
//! member's output). The body is `greedy_libi::fuzzing::master_lines`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_libi::fuzzing::master_lines(data));
