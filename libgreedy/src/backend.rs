//! How a front end starts its members: greedyrun (over a remote shell, or on a running
//! session's agents) or srun (a step of this allocation, or beside a running job). Every back
//! end serves the members PMI-1 over greedy's overlay, sends the front end's lines to rank 0's
//! stdin and relays the members' stdout in whole lines, tagged with their rank.

use std::path::PathBuf;
use std::process::Command;

use crate::distribution::Distribution;
use crate::error::{Error, Result};

/// Where and how members start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// `greedyrun` over `rsh` (`ssh`, an rsh-like command, or `srun`: one step of the
    /// allocation starts the agents); without hosts in the distribution, the allocation's.
    Greedyrun {
        /// The remote shell.
        rsh: String,
    },
    /// A job on the running greedy session whose socket this is (its agents, no new shell).
    Session {
        /// The session's socket (`GREEDY_SESSION`).
        socket: PathBuf,
    },
    /// One `srun --mpi=greedy` step of the allocation the front end runs in.
    Srun,
    /// Beside a running Slurm job (or one of its steps): `srun --overlap --jobid`, by default
    /// on every node of the job or step.
    SlurmJob {
        /// The job id.
        job: u32,
        /// The step, whose nodes the members take when the distribution names none.
        step: Option<u32>,
    },
}

/// The launcher's command, and how it marks rank 0's output lines.
#[derive(Debug)]
pub(crate) struct Launch {
    pub(crate) command: Command,
    pub(crate) master_prefix: MasterPrefix,
}

/// The tag a launcher puts before each of rank 0's lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MasterPrefix {
    /// greedyrun's `--tag-output`: `[0] `.
    Bracketed,
    /// srun's `--label`: `0: `, padded on the left with spaces.
    Label,
}

impl MasterPrefix {
    /// The rest of `line` if rank 0 wrote it.
    pub(crate) fn strip(self, line: &str) -> Option<&str> {
        match self {
            MasterPrefix::Bracketed => line.strip_prefix("[0] "),
            MasterPrefix::Label => line.trim_start_matches(' ').strip_prefix("0: "),
        }
    }
}

impl Backend {
    /// The command that starts `distribution`'s members; `launcher` is greedyrun's path.
    /// `hostfile` is where an srun of several hosts writes its task placement.
    pub(crate) fn launch(
        &self,
        distribution: &Distribution,
        greedyrun: &str,
        hostfile: Option<&std::path::Path>,
    ) -> Result<Launch> {
        let distribution = match self {
            Backend::SlurmJob { job, step } if distribution.hosts_from_back_end() => {
                distribution.on_hosts(&slurm_nodes(*job, *step)?)
            }
            _ => distribution.clone(),
        };
        Ok(match self {
            Backend::Greedyrun { rsh } => Launch {
                command: greedyrun_command(greedyrun, &distribution, Some(rsh), None),
                master_prefix: MasterPrefix::Bracketed,
            },
            Backend::Session { socket } => Launch {
                command: greedyrun_command(greedyrun, &distribution, None, Some(socket)),
                master_prefix: MasterPrefix::Bracketed,
            },
            Backend::Srun => Launch {
                command: srun_command(&distribution, None, hostfile)?,
                master_prefix: MasterPrefix::Label,
            },
            Backend::SlurmJob { job, .. } => Launch {
                command: srun_command(&distribution, Some(*job), hostfile)?,
                master_prefix: MasterPrefix::Label,
            },
        })
    }
}

/// `greedyrun --pmi pmi1 --tag-output [--hosts h:n,…] [-n N] [--rsh R] -- COMMAND`.
fn greedyrun_command(
    greedyrun: &str,
    distribution: &Distribution,
    rsh: Option<&String>,
    session: Option<&PathBuf>,
) -> Command {
    let mut command = Command::new(greedyrun);
    command.args([
        "--pmi",
        "pmi1",
        "--tag-output",
        "--stdin",
        "0",
        "--progress",
        "0",
    ]);
    if !distribution.bcast().is_empty() {
        command.arg(format!("--bcast={}", distribution.bcast().join(",")));
    }
    if !distribution.hosts_from_back_end() {
        let hosts = distribution.hosts();
        let list: Vec<String> = hosts.iter().map(|(h, n)| format!("{h}:{n}")).collect();
        let total: u32 = hosts.iter().map(|(_, n)| n).sum();
        command.args(["--hosts", &list.join(","), "-n", &total.to_string()]);
    }
    match (rsh, session) {
        (_, Some(socket)) => {
            command.env("GREEDY_SESSION", socket);
        }
        (Some(rsh), None) => {
            command.env_remove("GREEDY_SESSION").args(["--rsh", rsh]);
        }
        (None, None) => {}
    }
    command.arg("--").args(distribution.command());
    command
}

/// `srun --mpi=greedy --input=0 --label …`: placement by `SLURM_HOSTFILE` when hosts are given.
fn srun_command(
    distribution: &Distribution,
    job: Option<u32>,
    hostfile: Option<&std::path::Path>,
) -> Result<Command> {
    if !distribution.bcast().is_empty() {
        return Err(Error::Distribution(
            "file broadcast needs a greedyrun back end (under Slurm alone: sbcast)".into(),
        ));
    }
    let mut command = Command::new("srun");
    command
        .args([
            "--mpi=greedy",
            "--input=0",
            "--label",
            "--kill-on-bad-exit=1",
        ])
        .env("SLURM_GREEDY_PROTOCOL", "pmi");
    if let Some(job) = job {
        command.args(["--overlap", "--jobid", &job.to_string()]);
    }
    if !distribution.hosts_from_back_end() {
        let hosts = distribution.hosts();
        let mut lines = String::new();
        for (host, count) in &hosts {
            for _ in 0..*count {
                lines.push_str(host);
                lines.push('\n');
            }
        }
        let hostfile =
            hostfile.ok_or_else(|| Error::Distribution("no place for srun's host file".into()))?;
        std::fs::write(hostfile, lines).map_err(|source| Error::Launch {
            program: format!("srun's host file {}", hostfile.display()),
            source,
        })?;
        let total: u32 = hosts.iter().map(|(_, n)| n).sum();
        let mut names: Vec<&str> = hosts.iter().map(|(h, _)| h.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        command
            .env("SLURM_HOSTFILE", hostfile)
            .args(["--distribution=arbitrary", "-n", &total.to_string()])
            .args(["-N", &names.len().to_string()]);
    }
    command.arg("--").args(distribution.command());
    Ok(command)
}

/// The nodes of a Slurm job, or of one of its steps, by Slurm's own record (`squeue`).
fn slurm_nodes(job: u32, step: Option<u32>) -> Result<Vec<String>> {
    let list = match step {
        Some(step) => run(Command::new("squeue")
            .args(["-h", "-o", "%N", "-s", "-j"])
            .arg(format!("{job}.{step}")))?,
        None => run(Command::new("squeue")
            .args(["-h", "-o", "%N", "-j"])
            .arg(job.to_string()))?,
    };
    let list = list.lines().next().unwrap_or("").trim().to_string();
    if list.is_empty() {
        return Err(Error::Slurm {
            command: format!("squeue -j {job}"),
            why: "the job (or step) is not running".into(),
        });
    }
    let hosts = greedy_tree::hostlist::expand(&list).map_err(|e| Error::Slurm {
        command: format!("squeue -j {job}"),
        why: format!("node list {list:?}: {e}"),
    })?;
    Ok(hosts)
}

/// A command's stdout, or its stderr as the error.
fn run(command: &mut Command) -> Result<String> {
    let shown = format!("{command:?}");
    let out = command.output().map_err(|source| Error::Launch {
        program: shown.clone(),
        source,
    })?;
    if !out.status.success() {
        return Err(Error::Slurm {
            command: shown,
            why: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::distribution::HostGroup;

    fn args(command: &Command) -> Vec<String> {
        command
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    fn on(hosts: &[(&str, u32)]) -> Distribution {
        let mut g = HostGroup::new("tool");
        g.hosts = hosts.iter().map(|(h, n)| (h.to_string(), *n)).collect();
        Distribution::new(vec![g]).unwrap()
    }

    #[test]
    fn greedyrun_gets_hosts_counts_and_pmi1() {
        let backend = Backend::Greedyrun { rsh: "rsh".into() };
        let launch = backend
            .launch(&on(&[("n1", 2), ("n2", 1)]), "greedyrun", None)
            .unwrap();
        let a = args(&launch.command).join(" ");
        assert!(a.starts_with("--pmi pmi1 --tag-output"), "{a}");
        assert!(
            a.contains("--hosts n1:2,n2:1 -n 3 --rsh rsh -- tool"),
            "{a}"
        );
        assert_eq!(launch.master_prefix.strip("[0] x"), Some("x"));
        let with_file = on(&[("n1", 1)]).with_bcast(vec!["a.dat".into(), "b".into()]);
        let launch = (backend.launch(&with_file.unwrap(), "greedyrun", None)).unwrap();
        assert!(args(&launch.command).contains(&"--bcast=a.dat,b".to_string()));
        assert_eq!(launch.master_prefix.strip("[10] x"), None);
    }

    #[test]
    fn srun_places_each_task_by_hostfile() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("h");
        let backend = Backend::SlurmJob { job: 7, step: None };
        let launch = backend
            .launch(&on(&[("n2", 2), ("n1", 1)]), "greedyrun", Some(&file))
            .unwrap();
        let a = args(&launch.command).join(" ");
        assert!(a.contains("--overlap --jobid 7"), "{a}");
        assert!(
            a.contains("--distribution=arbitrary -n 3 -N 2 -- tool"),
            "{a}"
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "n2\nn2\nn1\n");
        assert_eq!(launch.master_prefix.strip("  0: x"), Some("x"));
        assert_eq!(launch.master_prefix.strip(" 10: x"), None);
    }
}
