//! Replays every committed fuzz input (`fuzz/corpus/TARGET/`, and crashes kept in
//! `fuzz/regressions/TARGET/`) through the fuzz target's body, so stable `cargo test` keeps
//! each finding fixed. The campaign that grows the corpora is `scripts/fuzz`.

#[test]
fn every_committed_fuzz_input_passes() {
    let fuzz = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    greedy_tree::fuzzing::replay(&fuzz, greedy_libi::fuzzing::TARGETS);
}
