//! The CLIs' own source files, compiled in as modules so their clap definitions are the ones
//! documented. Their `main`s and helpers are unused here; their unit tests run twice (cheap).
//! So the files must name their sibling modules with `super::`, never `crate::` (here the
//! crate root is greedy-docs).
#![allow(dead_code)]

/// `greedyrun` (launcher/src/bin/greedyrun.rs): `Args`.
#[path = "../../../launcher/src/bin/greedyrun.rs"]
pub(crate) mod greedyrun;

/// `greedyd` (launcher/src/bin/greedyd.rs): `Args`.
#[path = "../../../launcher/src/bin/greedyd.rs"]
pub(crate) mod greedyd;

/// `greedy-tree` (tree/src/bin/greedy-tree/main.rs, with its `render` module): `Cli`.
#[path = "../../../tree/src/bin/greedy-tree/main.rs"]
pub(crate) mod greedy_tree;
