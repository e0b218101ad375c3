//! The bodies of the cargo-fuzz targets in `fuzz/`, one function per target, shared with the
//! corpus replay (`tests/fuzz_corpus.rs`). Each takes arbitrary bytes and panics only when an
//! invariant of the code under test breaks.

use crate::channel::{self, Reader};
use crate::stacks::{CallTree, RankSet, collect};

/// A fuzz target: the name of its binary and corpus directory, and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target of this crate.
pub const TARGETS: &[Target] = &[
    ("master_lines", master_lines),
    ("call_tree", call_tree),
    ("stack_output", stack_output),
    ("rank_set", rank_set),
];

/// Lines a front end reads from its launcher (any member may print anything): no panic, and
/// every message taken whole is one a master could have written.
pub fn master_lines(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut reader = Reader::default();
    for line in text.lines() {
        if let Some(Some(message)) = reader.line(line) {
            let mut again = Vec::new();
            channel::write(&mut again, &message).expect("writing to memory");
            let again = String::from_utf8(again).expect("hex lines are text");
            let mut check = Reader::default();
            let back = again.lines().filter_map(|l| check.line(l)).last();
            assert_eq!(
                back,
                Some(Some(message)),
                "a message does not survive its own encoding"
            );
        }
    }
}

/// A daemon's merged tree as another daemon sends it: refused or taken; what is taken
/// survives its own encoding, and merging it into itself changes no path's frames.
pub fn call_tree(data: &[u8]) {
    let Ok(tree) = serde_json::from_slice::<CallTree>(data) else {
        return;
    };
    let encoded = serde_json::to_vec(&tree).expect("a tree encodes");
    let back: CallTree = serde_json::from_slice(&encoded).expect("its own encoding decodes");
    assert_eq!(back, tree);
    let mut doubled = tree.clone();
    doubled.merge(tree.clone());
    assert_eq!(doubled, tree, "merging a tree into itself changed it");
}

/// What eu-stack, gdb or the kernel print: parsed without panicking.
pub fn stack_output(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (out, err) = text.split_once('\u{0}').unwrap_or((&text, ""));
    let _ = collect::parse_eu_stack(out, err);
    let _ = collect::parse_gdb(out);
    let _ = collect::parse_kernel_stack(out);
}

/// Rank ranges as the wire and the command line give them: refused or taken; what is taken
/// prints as it parses back.
pub fn rank_set(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(set) = text.parse::<RankSet>() else {
        return;
    };
    let again: RankSet = set.to_string().parse().expect("a printed set parses");
    assert_eq!(again, set);
}
