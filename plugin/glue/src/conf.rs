//! The configuration files of greedy's plugins, next to `slurm.conf` and in its syntax
//! (`Key=Value`, one per line, `#` to the end of a line is a comment, keys are
//! case-insensitive): `greedy.conf` holds route/greedy's `Route*` keys, and Slurm's own
//! `mpi.conf` mpi/greedy's `Greedy*` keys beside other MPI plugins' (`PMIx*`). Each plugin
//! reads the keys with its prefix and ignores the others.
//!
//! Where: `$GREEDY_CONF` if set (greedy.conf only), else the file in the directory of
//! `$SLURM_CONF` (every Slurm process sets `SLURM_CONF` to the slurm.conf it read,
//! read_config.c:3504@slurm-22-05-8-1), else in `/etc/slurm`.

use crate::ConfError;
use std::path::{Path, PathBuf};

/// Environment variable naming the file explicitly.
pub const ENV_PATH: &str = "GREEDY_CONF";

/// File name looked for beside slurm.conf.
pub const FILE_NAME: &str = "greedy.conf";

/// Where `greedy.conf` is, from the two environment variables (passed in, so this stays pure).
pub fn path(greedy_conf: Option<&str>, slurm_conf: Option<&str>) -> PathBuf {
    match greedy_conf.filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => beside_slurm_conf(FILE_NAME, slurm_conf),
    }
}

/// `file` in the directory of slurm.conf (`SLURM_CONF`'s value), else in `/etc/slurm`: where
/// Slurm looks for its own extra files such as `mpi.conf` (`get_extra_conf_path`).
pub fn beside_slurm_conf(file: &str, slurm_conf: Option<&str>) -> PathBuf {
    let dir = slurm_conf
        .filter(|p| !p.is_empty())
        .and_then(|p| Path::new(p).parent())
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("/etc/slurm"));
    dir.join(file)
}

/// [`path`] from this process's environment.
pub fn path_from_env() -> PathBuf {
    let greedy = std::env::var(ENV_PATH).ok();
    let slurm = std::env::var("SLURM_CONF").ok();
    path(greedy.as_deref(), slurm.as_deref())
}

/// The file's text; `Ok(None)` when it does not exist (defaults apply, not an error).
pub fn read(path: &Path) -> Result<Option<String>, ConfError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ConfError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

/// One `Key=Value` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key as written (compare with [`Entry::is`]).
    pub key: String,
    /// The value, trimmed.
    pub value: String,
    /// 1-based line number.
    pub line: usize,
    /// The line as written, for error messages.
    pub text: String,
}

impl Entry {
    /// This line refused for `reason`.
    pub fn error(&self, path: &Path, reason: &str) -> ConfError {
        ConfError::Line {
            path: path.to_owned(),
            line: self.line,
            text: self.text.clone(),
            reason: reason.to_string(),
        }
    }

    /// True when the key is `name`, ignoring ASCII case (as slurm.conf does).
    pub fn is(&self, name: &str) -> bool {
        self.key.eq_ignore_ascii_case(name)
    }
}

/// A parsed file: its entries in order, and the lines that are not `Key=Value`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Conf {
    /// Every `Key=Value` line, in file order (a later duplicate wins for the plugins).
    pub entries: Vec<Entry>,
    /// `(line number, line)` of each non-blank line that is not `Key=Value`.
    pub malformed: Vec<(usize, String)>,
}

impl Conf {
    /// The first line that is not `Key=Value`, as the error a plugin reports for the file.
    pub fn check_well_formed(&self, path: &Path) -> Result<(), ConfError> {
        match self.malformed.first() {
            Some((line, text)) => Err(ConfError::Line {
                path: path.to_owned(),
                line: *line,
                text: text.clone(),
                reason: "expected Key=Value".into(),
            }),
            None => Ok(()),
        }
    }
}

/// Parses `greedy.conf` or `mpi.conf` text; never fails, malformed lines are collected for the
/// caller to report.
pub fn parse(text: &str) -> Conf {
    let mut conf = Conf::default();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        match line.split_once('=') {
            Some((key, value))
                if !key.trim().is_empty() && !key.trim().contains(char::is_whitespace) =>
            {
                conf.entries.push(Entry {
                    key: key.trim().to_string(),
                    value: value.trim().to_string(),
                    line: i + 1,
                    text: raw.to_string(),
                })
            }
            _ => conf.malformed.push((i + 1, raw.to_string())),
        }
    }
    conf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_prefers_greedy_conf_then_slurm_conf_dir() {
        let check = |g: Option<&str>, s: Option<&str>, want: &str| {
            assert_eq!(path(g, s), PathBuf::from(want), "{g:?} {s:?}");
        };
        check(Some("/x/g.conf"), Some("/etc/s/slurm.conf"), "/x/g.conf");
        check(Some(""), Some("/etc/s/slurm.conf"), "/etc/s/greedy.conf");
        check(
            None,
            Some("/run/tc/slurm/etc/slurm.conf"),
            "/run/tc/slurm/etc/greedy.conf",
        );
        check(None, Some("slurm.conf"), "/etc/slurm/greedy.conf");
        check(None, None, "/etc/slurm/greedy.conf");
    }

    #[test]
    fn parses_key_values_comments_and_bad_lines() {
        let conf = parse(
            "# site\n RouteSeq = 0.002 # measured\n\nRouteRem=0.03\nnonsense\na b=1\nMpiX=\n",
        );
        let got: Vec<_> = conf
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str(), e.line))
            .collect();
        assert_eq!(
            got,
            [
                ("RouteSeq", "0.002", 2),
                ("RouteRem", "0.03", 4),
                ("MpiX", "", 7)
            ]
        );
        assert_eq!(
            conf.malformed,
            [(5, "nonsense".to_string()), (6, "a b=1".to_string())]
        );
        assert!(conf.entries[0].is("routeseq"));
    }

    #[test]
    fn missing_file_is_not_an_error() {
        let dir = std::env::temp_dir().join(format!("greedy-conf-test-{}", std::process::id()));
        assert!(matches!(read(&dir.join("none.conf")), Ok(None)));
    }
}
