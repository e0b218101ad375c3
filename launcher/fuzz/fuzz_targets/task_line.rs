//! Fuzzes a line of a task stream (`greedyrun --tasks`): a plain command or a JSON task
//! description. The body is `greedy_launcher::fuzzing::task_line`, which `tests/fuzz_corpus.rs`
//! replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| greedy_launcher::fuzzing::task_line(data));
