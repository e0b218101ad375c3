//! Hostfiles as Open MPI (`host slots=N`), MPICH (`host:N`) and plain one-host-per-line tools
//! write them; the host field may also be a Slurm hostlist expression.

use crate::{Error, hostlist, hostname};

/// One host of a hostfile and the ranks it may run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSlots {
    /// The host name as written.
    pub host: String,
    /// Ranks it may run; `None` when the file does not say (callers pick a default).
    pub slots: Option<u32>,
}

/// Parses a hostfile. Blank lines and `#` comments are skipped; a host named on several lines
/// appears once, at its first line, with the slots of all its lines added up (Open MPI's rule,
/// a line without a count giving one). Every name must pass [`hostname::check`].
///
/// ```
/// let text = "# rack 1\nn1 slots=4\nn2:2\nn[3-4]\nn1 slots=4\nn3\n";
/// let hosts = greedy_tree::hostfile::parse(text).unwrap();
/// let slots: Vec<_> = hosts.iter().map(|h| (h.host.as_str(), h.slots)).collect();
/// assert_eq!(slots, [("n1", Some(8)), ("n2", Some(2)), ("n3", Some(2)), ("n4", None)]);
/// ```
pub fn parse(text: &str) -> Result<Vec<HostSlots>, Error> {
    parse_at_most(text, hostlist::MAX_HOSTS)
}

/// [`parse`] with at most `max_hosts` (≤ [`hostlist::MAX_HOSTS`]) distinct hosts in the file
/// and in each line: the fuzz target uses a small cap, so that legal files of millions of hosts
/// do not take its time.
pub fn parse_at_most(text: &str, max_hosts: usize) -> Result<Vec<HostSlots>, Error> {
    let mut hosts: Vec<HostSlots> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for (line_no, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("");
        for entry in parse_line(line, max_hosts).map_err(|(column, reason)| Error::Hostfile {
            line: line_no + 1,
            column,
            text: raw.to_string(),
            reason,
        })? {
            // Each line's expression is capped; the file as a whole must be too, or a few
            // lines of ranges would exhaust memory.
            if hosts.len() >= max_hosts && !index.contains_key(&entry.host) {
                return Err(Error::Hostfile {
                    line: line_no + 1,
                    column: 1,
                    text: raw.to_string(),
                    reason: format!("more than {max_hosts} hosts in the file"),
                });
            }
            match index.get(&entry.host) {
                Some(&i) => {
                    let known: &mut HostSlots = &mut hosts[i];
                    // Each mention without a count is one slot (`-H n1,n1` is two, as
                    // mpirun counts it).
                    known.slots = Some(
                        known
                            .slots
                            .unwrap_or(1)
                            .saturating_add(entry.slots.unwrap_or(1)),
                    );
                }
                None => {
                    index.insert(entry.host.clone(), hosts.len());
                    hosts.push(entry);
                }
            }
        }
    }
    if hosts.is_empty() {
        return Err(Error::NoHosts {
            source_name: "hostfile",
        });
    }
    Ok(hosts)
}

/// The hosts of one line (comment removed), or (1-based column, reason).
fn parse_line(line: &str, max_hosts: usize) -> Result<Vec<HostSlots>, (usize, String)> {
    let mut words = words_with_columns(line);
    let Some((col, first)) = words.next() else {
        return Ok(Vec::new());
    };
    // MPICH: `host:N` (an IPv6 literal has colons of its own and no count).
    let (name, mut slots) = match first.split_once(':') {
        Some(_) if first.parse::<std::net::Ipv6Addr>().is_ok() => (first, None),
        Some((name, n)) => (name, Some(count(n, col + name.chars().count() + 1)?)),
        None => (first, None),
    };
    // Open MPI: `slots=N`, `max_slots=N`/`max-slots=N` (an upper bound we do not need).
    for (col, word) in words {
        match word.split_once('=') {
            Some(("slots", n)) => slots = Some(count(n, col + 6)?),
            Some(("max_slots" | "max-slots", n)) => {
                count(n, col + 10)?;
            }
            _ => {
                return Err((col, format!("unexpected {word:?}; expected slots=N")));
            }
        }
    }
    let names = hostlist::expand_at_most(name, max_hosts).map_err(|e| match e {
        Error::Hostlist { column, reason, .. } => (col + column - 1, reason),
        other => (col, other.to_string()),
    })?;
    if let Some(reason) = names.iter().find_map(|n| hostname::check(n).err()) {
        return Err((col, reason));
    }
    Ok(names
        .into_iter()
        .map(|host| HostSlots { host, slots })
        .collect())
}

fn count(text: &str, column: usize) -> Result<u32, (usize, String)> {
    match text.parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err((
            column,
            format!("expected a slot count of at least 1, found {text:?}"),
        )),
    }
}

/// White-space separated words with their 1-based starting columns.
fn words_with_columns(line: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut rest = line;
    let mut column = 1;
    std::iter::from_fn(move || {
        let skipped = rest.len() - rest.trim_start().len();
        column += rest[..skipped].chars().count();
        rest = &rest[skipped..];
        if rest.is_empty() {
            return None;
        }
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let (word, tail) = rest.split_at(end);
        let at = column;
        column += word.chars().count();
        rest = tail;
        Some((at, word))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expect: &[(&str, Option<u32>)]) {
        let got: Vec<_> = parse(text)
            .unwrap()
            .into_iter()
            .map(|h| (h.host, h.slots))
            .collect();
        let expect: Vec<_> = expect.iter().map(|&(h, s)| (h.to_string(), s)).collect();
        assert_eq!(got, expect, "{text:?}");
    }

    #[test]
    fn formats() {
        check("n1\nn2\n", &[("n1", None), ("n2", None)]);
        check("n1 slots=2 max_slots=4\n", &[("n1", Some(2))]);
        check("  n1:3  # fast one\n\n#n9\n", &[("n1", Some(3))]);
        check(
            "gpu[01-02] slots=4",
            &[("gpu01", Some(4)), ("gpu02", Some(4))],
        );
        check("n1\nn1 slots=2", &[("n1", Some(3))]);
        check("n1\nn1", &[("n1", Some(2))]);
        check(
            "10.1.2.3:2\nfe80::1",
            &[("10.1.2.3", Some(2)), ("fe80::1", None)],
        );
    }

    #[test]
    fn the_whole_file_is_capped_not_only_each_line() {
        // The hostfile fuzz target timed out on 140 bytes expanding to 4.7 million hosts (one
        // line, under the per-expression cap); the total over lines had no cap at all.
        assert_eq!(parse_at_most("n[1-3]\nm[1-2]\nn1", 5).unwrap().len(), 5);
        match parse_at_most("n[1-3]\nm[1-3]\n", 5) {
            Err(Error::Hostfile {
                line: 2, reason, ..
            }) => {
                assert!(reason.contains("more than 5 hosts"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn errors_name_line_and_column() {
        for (text, line, column, reason) in [
            ("n1\nn2 slot=4\n", 2, 4, "unexpected \"slot=4\""),
            ("n1 slots=0", 1, 10, "at least 1"),
            ("n1:x", 1, 4, "found \"x\""),
            ("ok\n\n  n[3-1] slots=1", 3, 7, "below its start"),
            (
                "n1\n  -oProxyCommand=sh slots=1",
                2,
                3,
                "begin or end with '-'",
            ),
            ("a;b", 1, 1, "';' is not allowed"),
        ] {
            match parse(text) {
                Err(Error::Hostfile {
                    line: l,
                    column: c,
                    reason: r,
                    ..
                }) => {
                    assert_eq!((l, c), (line, column), "{text:?}: {r}");
                    assert!(r.contains(reason), "{text:?}: {r}");
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
        assert!(matches!(parse("# only\n\n"), Err(Error::NoHosts { .. })));
    }
}
