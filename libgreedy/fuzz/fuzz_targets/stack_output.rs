//! Fuzzes the parsers of eu-stack's, gdb's and the kernel's stack output.
//! The body is `greedy_libi::fuzzing::stack_output`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_libi::fuzzing::stack_output(data));
