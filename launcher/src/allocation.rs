//! The hosts of the batch allocation greedyrun runs in, when no host option is given: what
//! mpirun and Hydra read from the resource manager's environment.
//!
//! | manager | variables | slots per host |
//! |---|---|---|
//! | Slurm | `SLURM_JOB_NODELIST` (a hostlist) | `SLURM_TASKS_PER_NODE`, else `SLURM_JOB_CPUS_PER_NODE` (`2(x3),1`), else 1 |
//! | PBS, Torque, OpenPBS | `PBS_NODEFILE` (one line per slot) | lines naming the host |
//! | LSF | `LSB_DJOB_HOSTFILE` (one line per slot), else `LSB_MCPU_HOSTS` (`host n host n …`) | as given |
//! | Grid Engine | `PE_HOSTFILE` (`host slots queue processors` lines) | the second column |
//!
//! The first manager found in that order wins; explicit hosts (`--hostfile`, `--hosts`, `-H`)
//! win over all of them. The result is hostfile text (`host:slots` lines), so it goes through
//! the same parser and host-name checks as a file the user wrote. Sans-I/O: the environment
//! and the file reader are passed in.

use std::io;

use greedy_tree::hostlist;

use crate::Error;

/// Hosts found in the environment of a batch job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// Where they came from, for messages and `-v` (e.g. `SLURM_JOB_NODELIST=n[1-4]`).
    pub what: String,
    /// The hosts and slots as hostfile text, one `host:slots` (or `host`) line each.
    pub hostfile: String,
}

/// The allocation greedyrun runs in, if any: `env` looks up a variable, `read` reads a file.
pub fn detect(
    env: &dyn Fn(&str) -> Option<String>,
    read: &dyn Fn(&str) -> io::Result<String>,
) -> Result<Option<Allocation>, Error> {
    let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    if let Some(nodes) = var("SLURM_JOB_NODELIST") {
        return slurm(&nodes, &var).map(Some);
    }
    // A node file lists each host once per slot, as a hostfile counts repeated hosts.
    for name in ["PBS_NODEFILE", "LSB_DJOB_HOSTFILE"] {
        if let Some(path) = var(name) {
            let text = read(&path).map_err(|e| Error::Plan(format!("{name}={path}: {e}")))?;
            return Ok(Some(Allocation {
                what: format!("{name}={path}"),
                hostfile: text,
            }));
        }
    }
    if let Some(pairs) = var("LSB_MCPU_HOSTS") {
        return lsf_pairs(&pairs).map(Some);
    }
    if let Some(path) = var("PE_HOSTFILE") {
        let text = read(&path).map_err(|e| Error::Plan(format!("PE_HOSTFILE={path}: {e}")))?;
        return grid_engine(&path, &text).map(Some);
    }
    Ok(None)
}

/// `SLURM_JOB_NODELIST` with its per-node counts.
fn slurm(nodes: &str, var: &dyn Fn(&str) -> Option<String>) -> Result<Allocation, Error> {
    let what = format!("SLURM_JOB_NODELIST={nodes}");
    let hosts = hostlist::expand(nodes).map_err(|error| Error::Hosts {
        what: what.clone(),
        error,
    })?;
    let counts = ["SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE"]
        .into_iter()
        .find_map(|name| var(name).map(|v| (name, v)));
    let (what, slots) = match counts {
        None => (what, vec![1; hosts.len()]),
        Some((name, value)) => {
            let slots = per_node_counts(&value)
                .filter(|s| s.len() == hosts.len())
                .ok_or_else(|| {
                    Error::Plan(format!(
                        "{name}={value}: expected one count per host of {what} ({} hosts), as `2(x3),1`",
                        hosts.len()
                    ))
                })?;
            (format!("{what} ({name}={value})"), slots)
        }
    };
    let hostfile = hosts
        .iter()
        .zip(slots)
        .map(|(h, n)| format!("{h}:{n}\n"))
        .collect();
    Ok(Allocation { what, hostfile })
}

/// Slurm's compressed per-node counts: `2(x3),1` is 2, 2, 2, 1. `None` if malformed or a
/// count is 0.
fn per_node_counts(text: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for item in text.split(',') {
        let (count, times) = match item.trim().split_once("(x") {
            None => (item.trim(), 1usize),
            Some((c, rest)) => (c, rest.strip_suffix(')')?.parse().ok()?),
        };
        let count: u32 = count.parse().ok().filter(|&c| c > 0)?;
        if times == 0 || out.len() + times > hostlist::MAX_HOSTS {
            return None;
        }
        out.extend(std::iter::repeat_n(count, times));
    }
    Some(out)
}

/// `LSB_MCPU_HOSTS`: `host n host n …`.
fn lsf_pairs(pairs: &str) -> Result<Allocation, Error> {
    let what = format!("LSB_MCPU_HOSTS={pairs}");
    let words: Vec<&str> = pairs.split_whitespace().collect();
    if !words.len().is_multiple_of(2) {
        return Err(Error::Plan(format!("{what}: expected `host count` pairs")));
    }
    let hostfile = words
        .chunks(2)
        .map(|p| format!("{}:{}\n", p[0], p[1]))
        .collect();
    Ok(Allocation { what, hostfile })
}

/// Grid Engine's `PE_HOSTFILE`: `host slots queue processors` per line.
fn grid_engine(path: &str, text: &str) -> Result<Allocation, Error> {
    let what = format!("PE_HOSTFILE={path}");
    let mut hostfile = String::new();
    for (i, line) in text.lines().enumerate() {
        let mut words = line.split_whitespace();
        let Some(host) = words.next() else { continue };
        let slots = words.next().ok_or_else(|| {
            Error::Plan(format!(
                "{what} line {}: expected `host slots …`: {line:?}",
                i + 1
            ))
        })?;
        hostfile.push_str(&format!("{host}:{slots}\n"));
    }
    Ok(Allocation { what, hostfile })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn detect_in(
        vars: &[(&str, &str)],
        files: &[(&str, &str)],
    ) -> Result<Option<Allocation>, Error> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let files: HashMap<String, String> = files
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        detect(&|k| vars.get(k).cloned(), &|p| {
            files
                .get(p)
                .cloned()
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such file"))
        })
    }

    #[test]
    fn slurm_nodes_take_their_task_counts() {
        let a = detect_in(
            &[
                ("SLURM_JOB_NODELIST", "n[1-3],gpu7"),
                ("SLURM_TASKS_PER_NODE", "2(x3),1"),
                ("SLURM_JOB_CPUS_PER_NODE", "4(x4)"),
                ("PBS_NODEFILE", "/ignored"),
            ],
            &[],
        )
        .unwrap()
        .unwrap();
        assert_eq!(a.hostfile, "n1:2\nn2:2\nn3:2\ngpu7:1\n");
        assert!(
            a.what
                .starts_with("SLURM_JOB_NODELIST=n[1-3],gpu7 (SLURM_TASKS_PER_NODE=")
        );
        // Without task counts (salloc -N), the CPUs per node; without either, one slot each.
        let a = detect_in(
            &[
                ("SLURM_JOB_NODELIST", "n[1-2]"),
                ("SLURM_JOB_CPUS_PER_NODE", "4(x2)"),
            ],
            &[],
        )
        .unwrap()
        .unwrap();
        assert_eq!(a.hostfile, "n1:4\nn2:4\n");
        let a = detect_in(&[("SLURM_JOB_NODELIST", "n[1-2]")], &[])
            .unwrap()
            .unwrap();
        assert_eq!(a.hostfile, "n1:1\nn2:1\n");
    }

    #[test]
    fn slurm_counts_that_do_not_fit_are_named() {
        for counts in ["2(x2)", "2(x3", "x", "0(x3)", "2(x0),1,1,1"] {
            let e = detect_in(
                &[
                    ("SLURM_JOB_NODELIST", "n[1-3]"),
                    ("SLURM_TASKS_PER_NODE", counts),
                ],
                &[],
            )
            .unwrap_err()
            .to_string();
            assert!(
                e.contains("SLURM_TASKS_PER_NODE=") && e.contains("3 hosts"),
                "{counts}: {e}"
            );
        }
        let e = detect_in(&[("SLURM_JOB_NODELIST", "n[3-1]")], &[]).unwrap_err();
        assert!(e.to_string().contains("SLURM_JOB_NODELIST=n[3-1]"), "{e}");
    }

    #[test]
    fn node_files_pairs_and_grid_engine() {
        let a = detect_in(
            &[("PBS_NODEFILE", "/pbs/nodes")],
            &[("/pbs/nodes", "a\na\nb\n")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (a.what.as_str(), a.hostfile.as_str()),
            ("PBS_NODEFILE=/pbs/nodes", "a\na\nb\n")
        );
        let a = detect_in(&[("LSB_MCPU_HOSTS", "h1 4 h2 2")], &[])
            .unwrap()
            .unwrap();
        assert_eq!(a.hostfile, "h1:4\nh2:2\n");
        assert!(detect_in(&[("LSB_MCPU_HOSTS", "h1 4 h2")], &[]).is_err());
        let a = detect_in(
            &[("PE_HOSTFILE", "/sge/pe")],
            &[(
                "/sge/pe",
                "c1 8 all.q@c1 UNDEFINED\nc2 4 all.q@c2 UNDEFINED\n",
            )],
        )
        .unwrap()
        .unwrap();
        assert_eq!(a.hostfile, "c1:8\nc2:4\n");
        let e = detect_in(&[("PBS_NODEFILE", "/gone")], &[]).unwrap_err();
        assert!(e.to_string().contains("PBS_NODEFILE=/gone"), "{e}");
        assert_eq!(
            detect_in(&[("SLURM_JOB_NODELIST", " ")], &[]).unwrap(),
            None
        );
    }
}
