//! Fuzzes a merged call tree as greedy-stack's daemons send it to each other.
//! The body is `greedy_libi::fuzzing::call_tree`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_libi::fuzzing::call_tree(data));
