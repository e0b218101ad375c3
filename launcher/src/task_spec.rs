//! What one line of a task stream asks for: a plain command (today's lines), or a JSON object
//! describing the task (its command or argv, ranks and cores, MPI, environment, working
//! directory, stdio files, data, retries, name), checked once here into a [`TaskSpec`] that
//! travels down the tree as itself. The format's JSON Schema is `docs/task.schema.json`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How a task's process starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Run {
    /// A command line: its words run directly when they are plain words, else `sh -c`
    /// ([`argv_of`]).
    Shell(String),
    /// A program and its arguments, run as given (no shell).
    Argv(Vec<String>),
}

impl Run {
    /// The command as a user would read it (results, messages).
    pub fn display(&self) -> String {
        match self {
            Run::Shell(c) => c.clone(),
            Run::Argv(a) => a.join(" "),
        }
    }

    /// The program and arguments that run ([`argv_of`] for a command line).
    pub fn argv(&self) -> Vec<String> {
        match self {
            Run::Shell(c) => argv_of(c),
            Run::Argv(a) => a.clone(),
        }
    }
}

/// Shell builtins and keywords: a line starting with one needs the shell, whose own it is.
const SHELL_WORDS: &[&str] = &[
    ".", ":", "!", "{", "}", "alias", "bg", "break", "case", "cd", "command", "continue", "do",
    "done", "elif", "else", "esac", "eval", "exec", "exit", "export", "fg", "fi", "for", "getopts",
    "hash", "if", "in", "jobs", "local", "read", "readonly", "return", "set", "shift", "source",
    "then", "times", "trap", "type", "ulimit", "umask", "unalias", "unset", "until", "wait",
    "while",
];

/// How a host's agent runs a task line: the line's words themselves when it is plain words
/// that `sh -c` would pass on unchanged (letters, digits and `_-./=:,+@%^` between blanks; no
/// quote, `$`, glob, redirection, `~` or `#`; not starting with a variable assignment or a
/// shell builtin or keyword), else `sh -c LINE`. The program, its arguments and environment
/// are the same either way; a plain line saves the exec of a shell per task, which is most of
/// a short task's cost beside the program's own. A plain line whose program cannot be run is
/// run through the shell after all, for the shell's own message and exit code (127, 126).
pub fn argv_of(command: &str) -> Vec<String> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./=:,+@%^ \t".contains(c);
    let words: Vec<&str> = command
        .split([' ', '\t'])
        .filter(|w| !w.is_empty())
        .collect();
    match words.first() {
        Some(first)
            if command.chars().all(plain)
                && !first.contains('=')
                && !SHELL_WORDS.contains(first) =>
        {
            words.iter().map(|w| w.to_string()).collect()
        }
        _ => vec!["/bin/sh".into(), "-c".into(), command.into()],
    }
}

/// A task as its line describes it, checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// The user's name for it (results and messages), if given.
    pub name: Option<String>,
    /// What runs.
    pub run: Run,
    /// Processes (ranks) of the task.
    pub ranks: u32,
    /// Cores (slots) each rank gets.
    pub cores_per_rank: u32,
    /// Whether the ranks are one MPI job (wired up by the node service).
    pub mpi: bool,
    /// Variables set for the task over the job's environment.
    pub env: BTreeMap<String, String>,
    /// Working directory, relative to the job's.
    pub cwd: Option<String>,
    /// File the task reads as stdin (else /dev/null), relative to its working directory.
    pub stdin: Option<String>,
    /// File the task's stdout goes to (else it comes back to the stream's client).
    pub stdout: Option<String>,
    /// File the task's stderr goes to (else it comes back to the stream's client).
    pub stderr: Option<String>,
    /// Files the task reads, to stage to its host.
    pub inputs: Vec<String>,
    /// Files the task writes, to collect or to leave where they are.
    pub outputs: Outputs,
    /// Runs again of the task if it fails (else the stream's `--task-retries`).
    pub retries: Option<u32>,
}

impl TaskSpec {
    /// Whether it runs as a job (several ranks, or wired up as MPI), not as one process.
    pub fn is_job(&self) -> bool {
        self.ranks > 1 || self.mpi
    }

    /// A plain line: `command` with the stream's defaults.
    pub fn plain(command: String, defaults: &Defaults) -> TaskSpec {
        TaskSpec {
            name: None,
            run: Run::Shell(command),
            ranks: defaults.ranks,
            cores_per_rank: defaults.cores_per_rank,
            mpi: false,
            env: BTreeMap::new(),
            cwd: None,
            stdin: None,
            stdout: None,
            stderr: None,
            inputs: Vec::new(),
            outputs: Outputs::default(),
            retries: None,
        }
    }

    /// Slots the task takes: ranks × cores per rank.
    pub fn slots(&self) -> u64 {
        u64::from(self.ranks) * u64::from(self.cores_per_rank)
    }

    /// [`TaskSpec::slots`] as the hosts count slots (no host has more than `u32::MAX`).
    pub fn slot_count(&self) -> u32 {
        u32::try_from(self.slots()).unwrap_or(u32::MAX)
    }

    /// What the task is called in messages: its name, else its command.
    pub fn label(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.run.display())
    }
}

/// What a plain line gets (`--task-ranks`, `--task-cores`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Defaults {
    /// Ranks of a plain line's task.
    pub ranks: u32,
    /// Cores of each of its ranks.
    pub cores_per_rank: u32,
}

impl Default for Defaults {
    fn default() -> Defaults {
        Defaults {
            ranks: 1,
            cores_per_rank: 1,
        }
    }
}

/// Why a line is not a task.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// Not JSON, or not of the task's shape.
    #[error("not a task description: {0}")]
    Json(String),
    /// Both or neither of `command` and `argv`.
    #[error("give exactly one of \"command\" and \"argv\"")]
    Command,
    /// A field's value is out of its range.
    #[error("\"{field}\": {why}")]
    Field {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        why: String,
    },
}

/// The files a task writes: sent back to the stream's directory once it ended, or left on
/// the host that wrote them and named in its result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outputs {
    /// The files, relative to the task's working directory.
    pub files: Vec<String>,
    /// They stay on the host (the results say `host:/absolute/path`).
    pub leave: bool,
}

/// The JSON object as written; [`parse`] checks it into a [`TaskSpec`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Written {
    name: Option<String>,
    command: Option<String>,
    argv: Option<Vec<String>>,
    ranks: Option<u32>,
    cores_per_rank: Option<u32>,
    #[serde(default)]
    mpi: bool,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    stdin: Option<String>,
    stdout: Option<String>,
    stderr: Option<String>,
    #[serde(default)]
    inputs: Vec<String>,
    #[serde(default)]
    outputs: Vec<String>,
    #[serde(default)]
    leave_outputs: bool,
    retries: Option<u32>,
}

/// Longest name a task may have (it is repeated in results and messages).
const NAME_MAX: usize = 256;

/// The task of a stream's line: a JSON object if the line starts with `{`, else a plain
/// command with `defaults`.
pub fn parse(line: &str, defaults: &Defaults) -> Result<TaskSpec, SpecError> {
    let trimmed = line.trim_start();
    if !trimmed.starts_with('{') {
        return Ok(TaskSpec::plain(line.to_string(), defaults));
    }
    let w: Written = serde_json::from_str(trimmed).map_err(json_error)?;
    let run = match (w.command, w.argv) {
        (Some(c), None) => {
            nonblank("command", &c)?;
            Run::Shell(c)
        }
        (None, Some(a)) => {
            match a.first() {
                Some(p) if !p.is_empty() => {}
                _ => {
                    return Err(field(
                        "argv",
                        "the program (first word) is empty or missing",
                    ));
                }
            }
            for arg in &a {
                no_nul("argv", arg)?;
            }
            Run::Argv(a)
        }
        _ => return Err(SpecError::Command),
    };
    if let Some(n) = &w.name {
        nonblank("name", n)?;
        if n.len() > NAME_MAX || n.chars().any(char::is_control) {
            return Err(field(
                "name",
                format!("at most {NAME_MAX} bytes, no control characters"),
            ));
        }
    }
    let ranks = at_least_one("ranks", w.ranks.unwrap_or(defaults.ranks))?;
    let cores_per_rank = at_least_one(
        "cores_per_rank",
        w.cores_per_rank.unwrap_or(defaults.cores_per_rank),
    )?;
    for (k, v) in &w.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(field(
                "env",
                format!("{k:?} is not a variable name (empty, or has '=' or NUL)"),
            ));
        }
        no_nul("env", v)?;
    }
    for (name, path) in [
        ("cwd", &w.cwd),
        ("stdin", &w.stdin),
        ("stdout", &w.stdout),
        ("stderr", &w.stderr),
    ] {
        if let Some(p) = path {
            nonblank(name, p)?;
        }
    }
    for p in w.inputs.iter().chain(&w.outputs) {
        nonblank("inputs/outputs", p)?;
    }
    Ok(TaskSpec {
        name: w.name,
        run,
        ranks,
        cores_per_rank,
        mpi: w.mpi,
        env: w.env,
        cwd: w.cwd,
        stdin: w.stdin,
        stdout: w.stdout,
        stderr: w.stderr,
        inputs: w.inputs,
        outputs: Outputs {
            files: w.outputs,
            leave: w.leave_outputs,
        },
        retries: w.retries,
    })
}

/// serde's words, placed by column only: the stream's line number is the caller's to say.
fn json_error(e: serde_json::Error) -> SpecError {
    let text = e.to_string();
    let words = text.rsplit_once(" at line ").map_or(&*text, |(w, _)| w);
    SpecError::Json(format!("{words} (column {})", e.column()))
}

fn field(field: &'static str, why: impl Into<String>) -> SpecError {
    SpecError::Field {
        field,
        why: why.into(),
    }
}

fn at_least_one(name: &'static str, n: u32) -> Result<u32, SpecError> {
    if n == 0 {
        return Err(field(name, "must be at least 1"));
    }
    Ok(n)
}

fn no_nul(name: &'static str, s: &str) -> Result<(), SpecError> {
    if s.contains('\0') {
        return Err(field(name, "contains a NUL byte"));
    }
    Ok(())
}

fn nonblank(name: &'static str, s: &str) -> Result<(), SpecError> {
    no_nul(name, s)?;
    if s.trim().is_empty() {
        return Err(field(name, "is empty"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_run_without_a_shell_and_the_rest_through_one() {
        assert_eq!(argv_of("/bin/true"), ["/bin/true"]);
        assert_eq!(argv_of("  sleep\t0.01 "), ["sleep", "0.01"]);
        assert_eq!(
            argv_of("./sim --n=4 -o out_1.dat a,b:c+d@e%f^g"),
            ["./sim", "--n=4", "-o", "out_1.dat", "a,b:c+d@e%f^g"]
        );
        for line in [
            "echo $HOME",
            "echo 'a b'",
            "echo \"a\"",
            "ls *.dat",
            "a > out",
            "a | b",
            "a; b",
            "a && b",
            "cd /tmp",
            "exit 3",
            "FOO=1 env",
            "ls ~",
            "a # comment",
            "echo a\\ b",
            "(a)",
            "",
            "   ",
        ] {
            assert_eq!(argv_of(line), ["/bin/sh", "-c", line], "{line:?}");
        }
    }

    fn one(line: &str) -> Result<TaskSpec, SpecError> {
        parse(line, &Defaults::default())
    }

    #[test]
    fn a_plain_line_is_a_command_with_the_defaults() {
        let d = Defaults {
            ranks: 2,
            cores_per_rank: 3,
        };
        let t = parse("echo {a}", &d).expect("plain");
        assert_eq!(t.run, Run::Shell("echo {a}".into()));
        assert_eq!((t.ranks, t.cores_per_rank, t.slots()), (2, 3, 6));
        assert!(!t.mpi && t.name.is_none() && t.env.is_empty());
    }

    #[test]
    fn a_json_line_gives_every_field() {
        let t = one(
            r#" {"name":"sim-7","argv":["./sim","--seed","7"],"ranks":4,"cores_per_rank":2,
               "mpi":true,"env":{"OMP_NUM_THREADS":"2"},"cwd":"runs/7","stdin":"in.txt",
               "stdout":"out.txt","stderr":"err.txt","inputs":["mesh.dat"],
               "outputs":["result.h5"],"leave_outputs":true,"retries":2}"#,
        )
        .expect("valid");
        assert_eq!(t.label(), "sim-7");
        assert_eq!(
            t.run,
            Run::Argv(vec!["./sim".into(), "--seed".into(), "7".into()])
        );
        assert_eq!((t.ranks, t.cores_per_rank, t.mpi), (4, 2, true));
        assert_eq!(t.env["OMP_NUM_THREADS"], "2");
        assert_eq!(t.cwd.as_deref(), Some("runs/7"));
        assert_eq!(
            (t.stdin.as_deref(), t.stdout.as_deref(), t.stderr.as_deref()),
            (Some("in.txt"), Some("out.txt"), Some("err.txt"))
        );
        assert_eq!(
            (t.inputs.len(), t.outputs.files.len(), t.retries),
            (1, 1, Some(2))
        );
        assert!(t.outputs.leave);
    }

    #[test]
    fn json_fields_left_out_take_the_defaults() {
        let d = Defaults {
            ranks: 3,
            cores_per_rank: 1,
        };
        let t = parse(r#"{"command":"hostname"}"#, &d).expect("valid");
        assert_eq!((t.ranks, t.cores_per_rank, t.retries), (3, 1, None));
        assert_eq!(t.label(), "hostname");
    }

    /// docs/task.schema.json names exactly the fields the parser takes, so the two never
    /// drift apart.
    #[test]
    fn the_schema_names_the_fields_the_parser_takes() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/task.schema.json");
        let schema: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).expect("the schema")).unwrap();
        let fields = schema["properties"].as_object().expect("properties");
        assert_eq!(schema["additionalProperties"], false);
        let example = |field: &str| match field {
            "command" | "name" | "cwd" | "stdin" | "stdout" | "stderr" => "\"x\"",
            "argv" | "inputs" | "outputs" => "[\"x\"]",
            "ranks" | "cores_per_rank" | "retries" => "1",
            "mpi" | "leave_outputs" => "true",
            "env" => "{\"A\":\"1\"}",
            other => panic!("the schema names {other:?}, which the parser does not know"),
        };
        for field in fields.keys() {
            let run = match field.as_str() {
                "argv" | "command" => "",
                _ => r#""command":"x","#,
            };
            let line = format!("{{{run}\"{field}\":{}}}", example(field));
            one(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
        }
        for field in ["argv", "cores_per_rank", "env", "inputs", "retries"] {
            assert!(fields.contains_key(field), "the schema lacks {field}");
        }
        assert_eq!(
            fields.len(),
            15,
            "a field of the parser is missing from the schema"
        );
    }

    #[test]
    fn bad_descriptions_say_what_is_wrong() {
        let err = |l: &str| one(l).expect_err(l).to_string();
        assert!(err(r#"{"command":"x","argv":["x"]}"#).contains("exactly one"));
        assert!(err(r#"{"name":"x"}"#).contains("exactly one"));
        assert!(err(r#"{"argv":[]}"#).contains("\"argv\""));
        assert!(err(r#"{"command":"x","ranks":0}"#).contains("\"ranks\": must be at least 1"));
        assert!(err(r#"{"command":"x","cores_per_rank":0}"#).contains("cores_per_rank"));
        assert!(err(r#"{"command":"x","rank":2}"#).contains("unknown field `rank`"));
        assert!(err(r#"{"command":"x","ranks":-1}"#).contains("not a task description"));
        assert!(err(r#"{"command":"x","env":{"A=B":"1"}}"#).contains("\"env\""));
        assert!(err(r#"{"command":"   "}"#).contains("\"command\": is empty"));
        assert!(err(r#"{"command":"x","stdout":""}"#).contains("\"stdout\""));
        assert!(err(r#"{"command":"x","name":"a\nb"}"#).contains("control"));
        assert!(err(r#"{"command":"x""#).contains("not a task description"));
        let e = err(r#"{"command": 5}"#);
        assert!(e.ends_with("(column 13)") && !e.contains("line 1"), "{e}");
    }
}
