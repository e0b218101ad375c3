//! The guides in docs/ name only options greedyrun and greedy-tree have, and only exit codes
//! greedyrun(1) documents. The reference is the pages greedy-docs generates from the CLIs' own
//! parsers, which are what `--help` prints; a renamed or dropped option fails here.

mod common;

use std::{collections::BTreeSet, fs, path::Path, process::Command};

use common::EXTRA;

const USER_GUIDE: &str = include_str!("../../../docs/user-guide.md");
const MANY_TASK: &str = include_str!("../../../docs/many-task.md");
const PLANNER: &str = include_str!("../../../docs/planner.md");
/// greedyrun's own source: the Hydra-style single-dash options it rewrites before clap.
const GREEDYRUN: &str = common::GREEDYRUN;

/// The text of every generated page of `prefix` (`greedy-tree` takes its subcommands' too).
fn pages(out: &Path, prefix: &str) -> String {
    let dir = out.join("man/man1");
    let mut text = String::new();
    for entry in fs::read_dir(&dir).expect("greedy-docs wrote man1") {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name == format!("{prefix}.1") || name.starts_with(&format!("{prefix}-")) {
            text += &fs::read_to_string(&path).unwrap();
        }
    }
    assert!(!text.is_empty(), "no page of {prefix} in {}", dir.display());
    text
}

fn generated() -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_greedy-docs"))
        .arg(out.path())
        .status()
        .unwrap();
    assert!(status.success());
    out
}

/// The code spans of `guide` that show `command`'s options: spans starting with the command's
/// name or with an option; in a table comparing other launchers with it ("| you know |"),
/// only the command's own column.
fn spans<'a>(guide: &'a str, command: &str) -> Vec<&'a str> {
    let mut found = Vec::new();
    let mut comparing = false;
    for line in guide.lines() {
        if !line.starts_with('|') {
            comparing = false;
        } else if line.contains("| you know |") {
            comparing = true;
        }
        let text = match (comparing, line.splitn(3, '|').nth(2)) {
            (true, Some(own)) => own,
            _ => line,
        };
        for (i, span) in text.split('`').enumerate() {
            if i % 2 == 1 && (span.starts_with(command) || span.starts_with('-')) {
                found.push(span);
            }
        }
    }
    found
}

/// The options in `spans`, up to the program a command line runs (`--`, `./prog`, `:`).
fn options(spans: &[&str]) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for span in spans {
        for token in span.split([' ', ',', '/', '|', '(', ')', '=', '\\']) {
            if token == "--" || token == ":" || token.starts_with("./") {
                break;
            }
            let name = token.trim_end_matches(['.', ':', ';']);
            let is_option = name.starts_with('-')
                && name
                    .trim_start_matches('-')
                    .starts_with(|c: char| c.is_ascii_alphabetic());
            if is_option {
                found.insert(name.to_string());
            }
        }
    }
    found
}

/// Fails naming every option of `guide` that `command`'s pages do not have.
fn check_options(guide: (&str, &str), command: &str, pages: &str) {
    let (name, text) = guide;
    let options = options(&spans(text, command));
    assert!(options.len() >= 3, "{name}: found only {options:?}");
    let missing: Vec<_> = options
        .iter()
        .filter(|o| {
            let in_pages = pages.contains(&o.replace('-', "\\-"));
            // `-np`, `-genv`: Hydra's spelling, rewritten to clap's before parsing.
            let hydra = !o.starts_with("--") && GREEDYRUN.contains(&format!("\"{o}\""));
            !in_pages && !hydra
        })
        .collect();
    assert!(
        missing.is_empty(),
        "{name} names options {command} does not have: {missing:?}"
    );
}

#[test]
fn the_guides_name_only_options_the_commands_have() {
    let out = generated();
    let greedyrun = pages(out.path(), "greedyrun");
    check_options(("user-guide.md", USER_GUIDE), "greedyrun", &greedyrun);
    check_options(("many-task.md", MANY_TASK), "greedyrun", &greedyrun);
    let tree = pages(out.path(), "greedy-tree");
    check_options(("planner.md", PLANNER), "greedy-tree", &tree);
}

#[test]
fn the_user_guide_names_only_documented_exit_codes() {
    let table = USER_GUIDE
        .split("| status | meaning |")
        .nth(1)
        .expect("the user's guide has an exit status table");
    let mut codes = Vec::new();
    for row in table.lines().skip(2).take_while(|l| l.starts_with('|')) {
        let first = row.split('|').nth(1).unwrap_or("");
        codes.extend(
            first
                .split(',')
                .filter_map(|c| c.trim().parse::<u32>().ok()),
        );
    }
    assert!(codes.len() >= 6, "found only {codes:?}");
    for c in codes.into_iter().filter(|&c| c != 0) {
        // `.B 125` or one of `.BR 130 ", " 129 ", " 143`.
        let documented = EXTRA.lines().any(|l| {
            l.starts_with(".B")
                && l.split(|ch: char| !ch.is_ascii_digit())
                    .any(|t| t == c.to_string())
        });
        assert!(
            documented,
            "user-guide.md documents exit code {c}, greedyrun(1) does not"
        );
    }
}
