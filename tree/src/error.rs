//! The one error type of greedy-tree: every variant names the input at fault.

use thiserror::Error;

/// Everything that can be wrong with the input of a plan: the model, a topology name, a
/// hostlist expression or a hostfile line.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum Error {
    /// A model parameter is out of range.
    #[error("model: {name} = {value}: {reason}")]
    Model {
        /// `seq`, `rem` or `concurrency`.
        name: &'static str,
        /// The rejected value, as given.
        value: String,
        /// What the value must be.
        reason: &'static str,
    },
    /// A launch model's text that is not `SEQ,REM[,CONCURRENCY[,MAX_FANOUT]]` of numbers
    /// (`LaunchModel`'s `FromStr`).
    #[error("model {text:?}: expected SEQ,REM[,CONCURRENCY[,MAX_FANOUT]]")]
    ModelText {
        /// The text as given.
        text: String,
    },
    /// A topology name that is not one of `greedy`, `flat`, `chain`, `binomial`, `kary:K`.
    #[error("topology {name:?}: {reason}")]
    Topology {
        /// The name as given.
        name: String,
        /// Why it was refused.
        reason: String,
    },
    /// A Slurm release that is not `YY.MM`.
    #[error("Slurm release {name:?}: expected YY.MM, e.g. 26.05")]
    Release {
        /// The release as given.
        name: String,
    },
    /// A hostlist expression that does not parse.
    #[error("hostlist column {column}: {reason} in {expr:?}")]
    Hostlist {
        /// The whole expression.
        expr: String,
        /// 1-based column (in characters) of the offending character.
        column: usize,
        /// What was expected there.
        reason: String,
    },
    /// A hostfile line that does not parse.
    #[error("hostfile line {line} column {column}: {reason}: {text:?}")]
    Hostfile {
        /// 1-based line number.
        line: usize,
        /// 1-based column (in characters) of the offending text.
        column: usize,
        /// The offending line, as given.
        text: String,
        /// What was expected there.
        reason: String,
    },
    /// An input that names no host at all.
    #[error("{source_name}: no hosts")]
    NoHosts {
        /// Which input was empty (`hostlist`, `hostfile`).
        source_name: &'static str,
    },
    /// Measurements from which no model can be fitted.
    #[error("calibration: {reason}")]
    Calibration {
        /// What is missing or wrong in the measurements.
        reason: &'static str,
    },
    /// A tree's subtree sizes do not describe a tree in depth-first preorder.
    #[error("subtree sizes: node {node_idx}: {reason}")]
    Layout {
        /// The first node whose size is inconsistent.
        node_idx: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
}
