//! What the project's planning commands (greedy-tree, greedy-sim) share on the command line.

use std::process::ExitCode;

/// Parses the command line of `prog`. `--help` and `--version` print and give
/// `Err(ExitCode::SUCCESS)`; a bad argument prints one line, `prog: <what is wrong>`, on
/// stderr and gives `Err(2)`: the caller returns the code.
pub fn parse<C: clap::Parser>(prog: &str) -> Result<C, ExitCode> {
    match C::try_parse() {
        Ok(cli) => Ok(cli),
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            Err(ExitCode::SUCCESS)
        }
        Err(e) => {
            let text = e.render().to_string();
            let line = text.lines().next().unwrap_or("bad arguments");
            eprintln!("{prog}: {}", line.strip_prefix("error: ").unwrap_or(line));
            Err(ExitCode::from(2))
        }
    }
}
