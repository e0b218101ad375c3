//! `greedyrun --bcast`: the files a job copies to node-local storage on every host before its
//! ranks start, greedyrun's side. Which files (the programs, or those named), read once and
//! sent down the launch tree as stagings `0..n` ([`crate::chunks::send`]): each agent forwards
//! a chunk to its children as it arrives and writes it beside, so the copy is pipelined along
//! the tree. Each host checks the SHA-256 of what it got and asks again for a file that
//! differs ([`crate::proto::Up::StageAgain`]); it keeps them with its staged files
//! (`agent::staged`), which go when the job ends.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::proto::{App, BcastFile, Cmd};

/// Times a host may ask for the same file again before the job fails.
pub const RESENDS: u32 = 3;

/// The files `--bcast` names (`named`: comma-separated paths; `None`: the programs), each
/// checked to be a readable regular file with a name of its own; a program among them is set
/// to its full path in `apps`, which the hosts replace with their copy's. Relative paths are
/// taken from `cwd`, bare program names from `path` (the ranks' `PATH`).
pub fn files(
    named: Option<&str>,
    apps: &mut [App],
    cwd: &Path,
    path: Option<&OsStr>,
) -> Result<Vec<BcastFile>, String> {
    let wanted: Vec<PathBuf> = match named {
        Some(list) => (list.split(',').filter(|p| !p.is_empty()))
            .map(|p| cwd.join(p))
            .collect(),
        None => (apps.iter())
            .map(|a| program_path(&a.argv[0], cwd, path))
            .collect::<Result<_, _>>()?,
    };
    if wanted.is_empty() {
        return Err("--bcast= names no file".into());
    }
    let mut files: Vec<BcastFile> = Vec::new();
    for p in wanted {
        let shown = p.display().to_string();
        if files.iter().any(|f| f.path == shown) {
            continue;
        }
        let meta = std::fs::metadata(&p).map_err(|e| format!("--bcast {shown}: {e}"))?;
        if !meta.is_file() {
            return Err(format!("--bcast {shown}: not a regular file"));
        }
        std::fs::File::open(&p).map_err(|e| format!("--bcast {shown}: {e}"))?;
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| format!("--bcast {shown}: names no file"))?;
        if files.iter().any(|f| f.name == name) {
            return Err(format!("--bcast: two files are named {name:?}"));
        }
        let executable = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 != 0;
        files.push(BcastFile {
            path: shown,
            name,
            executable,
            cached: None,
        });
    }
    for app in apps.iter_mut() {
        if let Ok(full) = program_path(&app.argv[0], cwd, path)
            && let Some(f) = files.iter().find(|f| Path::new(&f.path) == full)
        {
            app.argv[0] = f.path.clone();
        }
    }
    Ok(files)
}

/// Where program `word` is: a path with a slash from `cwd`, else the first executable file of
/// that name in `path`, as execvp would find it.
fn program_path(word: &str, cwd: &Path, path: Option<&OsStr>) -> Result<PathBuf, String> {
    if word.contains('/') {
        return Ok(cwd.join(word));
    }
    let dirs = path.map(std::env::split_paths).into_iter().flatten();
    dirs.map(|d| cwd.join(d).join(word))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| {
                m.is_file()
                    && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
            })
        })
        .ok_or_else(|| format!("--bcast: program {word:?} is not in PATH"))
}

/// Sends `files` (all, or only staging `only`) down the tree with `route`; the error names
/// the file that could not be read.
pub async fn send<F, Fut>(files: &[BcastFile], only: Option<u64>, route: F) -> Result<(), String>
where
    F: Fn(Cmd) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for (id, f) in (0u64..).zip(files) {
        if only.is_some_and(|o| o != id) {
            continue;
        }
        crate::chunks::send(Path::new(&f.path), id, &route)
            .await
            .map_err(|e| format!("--bcast {}: {e}", f.path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(word: &str) -> App {
        App {
            first_rank: 0,
            argv: vec![word.into(), "arg".into()],
        }
    }

    #[test]
    fn the_programs_or_the_named_files_are_broadcast_and_a_program_among_them_by_full_path() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::fs::write(bin.join("prog"), "#!/bin/sh\n").unwrap();
        let exec = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(bin.join("prog"), exec).unwrap();
        std::fs::write(tmp.path().join("data"), "x").unwrap();
        let path = Some(bin.as_os_str());

        let mut apps = [app("prog")];
        let files = files(None, &mut apps, tmp.path(), path).unwrap();
        let full = bin.join("prog").display().to_string();
        assert_eq!(files.len(), 1);
        assert_eq!(
            (files[0].path.as_str(), files[0].name.as_str()),
            (full.as_str(), "prog")
        );
        assert!(files[0].executable);
        assert_eq!(apps[0].argv, [full.as_str(), "arg"]);

        // Named files, relative to the working directory; the program runs from its own
        // path unless it is among them.
        let mut apps = [app("prog")];
        let named = super::files(Some("data"), &mut apps, tmp.path(), path).unwrap();
        assert_eq!(named[0].name, "data");
        assert!(!named[0].executable);
        assert_eq!(apps[0].argv[0], "prog");

        let mut apps = [app("prog")];
        let err =
            |named, apps: &mut [App]| super::files(named, apps, tmp.path(), path).unwrap_err();
        assert!(err(Some("missing"), &mut apps).contains("missing"));
        assert!(err(Some("bin"), &mut apps).contains("not a regular file"));
        assert!(err(Some("data,bin/../data2"), &mut apps).contains("data2"));
        assert!(err(None, &mut [app("nowhere")]).contains("not in PATH"));
        std::fs::write(bin.join("data"), "y").unwrap();
        assert!(err(Some("data,bin/data"), &mut apps).contains("two files are named"));
    }
}
