//! `greedy-docs OUT_DIR`: writes the man pages of greedyrun(1), greedyd(8) and greedy-tree(1)
//! (with one page per greedy-tree subcommand) and their bash, zsh and fish completions, all
//! from the clap definitions the binaries parse with, so the pages cannot drift from `--help`.
//!
//! ```text
//! OUT_DIR/man/man1/{greedyrun,greedy-tree,greedy-tree-plan,…}.1   OUT_DIR/man/man8/greedyd.8
//! OUT_DIR/completions/{bash/greedyrun, zsh/_greedyrun, fish/greedyrun.fish, …}
//! ```
//!
//! The binaries' source files are compiled in as modules (src/clis.rs); each exposes its
//! parser struct as `pub(crate)`, its only concession to this tool. Sections clap does not know
//! (ENVIRONMENT, EXIT STATUS, SEE ALSO) come from [`extra`]. The hand-written greedy(7) and
//! mpi_greedy(8) live in packaging/man/.

mod clis;
mod extra;

use anyhow::{Context, Result};
use clap::{Command, CommandFactory};
use clap_complete::Shell;
use clap_mangen::Man;
use std::fs;
use std::path::{Path, PathBuf};

/// The manual every page belongs to, shown in the page footer.
const MANUAL: &str = "greedy manual";

fn main() -> Result<()> {
    let out: PathBuf = std::env::args_os()
        .nth(1)
        .context("usage: greedy-docs OUT_DIR")?
        .into();
    for (cmd, section) in commands() {
        write_pages(&cmd, section, &out)?;
        write_completions(cmd, &out)?;
    }
    Ok(())
}

/// The three commands, named as installed, with their man sections.
fn commands() -> [(Command, &'static str); 3] {
    // clap names a derived command after the crate it is compiled in; the pages need the
    // installed names.
    let named = |cmd: Command, name: &'static str| cmd.name(name).bin_name(name);
    [
        (named(clis::greedyrun::Args::command(), "greedyrun"), "1"),
        (named(clis::greedyd::Args::command(), "greedyd"), "8"),
        (named(clis::greedy_tree::Cli::command(), "greedy-tree"), "1"),
    ]
}

/// The command's page and one page per subcommand (`greedy-tree-plan.1`), with the sections
/// clap renders followed by [`extra::sections`].
fn write_pages(cmd: &Command, section: &'static str, out: &Path) -> Result<()> {
    let dir = out.join(format!("man/man{section}"));
    fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let mut pages = vec![(cmd.get_name().to_string(), cmd.clone())];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        // clap takes `&'static str` names (without its `string` feature); a handful of
        // leaked names in a one-shot tool is cheaper than another clap build.
        let name: &'static str = format!("{}-{}", cmd.get_name(), sub.get_name()).leak();
        // The subcommand page's synopsis must read `greedy-tree plan …`.
        let bin: &'static str = format!("{} {}", cmd.get_name(), sub.get_name()).leak();
        pages.push((name.to_string(), sub.clone().name(name).bin_name(bin)));
    }
    for (name, page_cmd) in pages {
        let page = render(page_cmd, section, &name)?;
        let path = dir.join(format!("{name}.{section}"));
        fs::write(&path, page).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}

/// One page: clap_mangen's sections, then ours.
fn render(cmd: Command, section: &'static str, name: &str) -> Result<Vec<u8>> {
    let cmd = with_aliases(cmd);
    let version = cmd
        .get_version()
        .unwrap_or(env!("CARGO_PKG_VERSION"))
        .to_string();
    let man = Man::new(cmd.clone())
        .section(section)
        .source(format!("greedy {version}"))
        .manual(MANUAL);
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    man.render_description_section(&mut page)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut page)?;
    }
    if cmd.has_subcommands() {
        man.render_subcommands_section(&mut page)?;
    }
    page.extend(extra::sections(name).as_bytes());
    if cmd.get_version().is_some() {
        man.render_version_section(&mut page)?;
    }
    Ok(page)
}

/// `cmd` whose options name their visible aliases at the end of their help, as `--help` does
/// (`[alias: --machinefile]`): clap_mangen leaves them out.
fn with_aliases(mut cmd: Command) -> Command {
    let aliased: Vec<_> = cmd
        .get_arguments()
        .filter(|a| a.get_visible_aliases().is_some())
        .map(|a| a.get_id().clone())
        .collect();
    for id in aliased {
        cmd = cmd.mut_arg(id, |arg| {
            let names: Vec<_> = arg
                .get_visible_aliases()
                .unwrap_or_default()
                .iter()
                .map(|n| format!("--{n}"))
                .collect();
            let word = if names.len() == 1 { "alias" } else { "aliases" };
            let help = arg.get_long_help().or(arg.get_help());
            let help = help.map(ToString::to_string).unwrap_or_default();
            arg.long_help(format!("{help}\n\n[{word}: {}]", names.join(", ")))
        });
    }
    cmd
}

/// bash, zsh and fish completions, where each shell's Debian package looks for them.
fn write_completions(mut cmd: Command, out: &Path) -> Result<()> {
    let name = cmd.get_name().to_string();
    for (shell, sub) in [
        (Shell::Bash, "bash"),
        (Shell::Zsh, "zsh"),
        (Shell::Fish, "fish"),
    ] {
        let dir = out.join("completions").join(sub);
        fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        clap_complete::generate_to(shell, &mut cmd, &name, &dir)
            .with_context(|| format!("{sub} completion of {name}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_carry_options_environment_and_exit_status() {
        let [(greedyrun, s1), (greedyd, s8), (tree, _)] = commands();
        let page = String::from_utf8(render(greedyrun, s1, "greedyrun").unwrap()).unwrap();
        for needle in [
            ".TH greedyrun 1",
            "\\-\\-hostfile",
            "GREEDY_RSH",
            ".SH ENVIRONMENT",
            ".SH \"EXIT STATUS\"",
            "124",
            "GREEDY_RANK",
        ] {
            assert!(page.contains(needle), "greedyrun.1 lacks {needle:?}");
        }
        let page = String::from_utf8(render(greedyd, s8, "greedyd").unwrap()).unwrap();
        assert!(page.contains(".TH greedyd 8") && page.contains("GREEDY_LOG"));
        let out = tempfile::tempdir().unwrap();
        write_pages(&tree, "1", out.path()).unwrap();
        for sub in ["", "-plan", "-compare", "-calibrate"] {
            let p = out.path().join(format!("man/man1/greedy-tree{sub}.1"));
            assert!(p.exists(), "{} missing", p.display());
        }
    }
}
