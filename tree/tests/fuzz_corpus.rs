//! Replays every committed fuzz input (`fuzz/corpus/TARGET/`, and the crashes kept in
//! `fuzz/regressions/TARGET/`) through the fuzz target's body, so stable `cargo test` keeps
//! each finding fixed. The campaign that grows the corpora is `scripts/fuzz`.

use std::path::Path;

#[test]
fn every_committed_fuzz_input_passes() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    for &(target, body) in greedy_tree::fuzzing::TARGETS {
        let mut inputs = 0;
        for dir in ["corpus", "regressions"] {
            let Ok(entries) = std::fs::read_dir(fuzz.join(dir).join(target)) else {
                continue;
            };
            for entry in entries {
                let path = entry.expect("corpus entry").path();
                let data = std::fs::read(&path).expect("corpus file");
                // A panic names the file: replay it with `cargo fuzz run {target} FILE`.
                eprintln!("{}", path.display());
                body(&data);
                inputs += 1;
            }
        }
        assert!(inputs > 0, "no committed corpus for fuzz target {target}");
    }
}
