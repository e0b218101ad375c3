//! Which processes on this node are a job's ranks: found in /proc by their environment.
//!
//! A rank carries its job and rank in its environment (greedyrun sets `GREEDY_JOB` and
//! `GREEDY_RANK`, launcher/src/agent/children.rs; slurmstepd sets `SLURM_JOB_ID`,
//! `SLURM_STEP_ID` and `SLURM_PROCID`, research/slurm-plugin-api.md §2.2). Two kinds of process
//! carry the same variables without being the rank: launcher processes (slurmstepd forks a watcher
//! per task that keeps the task's environment; greedyd, greedy-guard and an `srun` started from a
//! rank), skipped by name; and the rank's own descendants, which inherit its environment, so of the
//! processes claiming a rank the topmost is taken.
//!
//! Only processes of the caller's uid (or all, for root) let us read their `environ`; the others
//! are skipped without a word, as are processes that end while we look.

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::path::Path;

use super::Error;

/// A job whose ranks are looked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Job {
    /// A Slurm job's step; with no step, the one step of the job running on this node.
    Slurm {
        /// `SLURM_JOB_ID`.
        job: u32,
        /// `SLURM_STEP_ID`.
        step: Option<u32>,
    },
    /// A greedyrun job.
    Greedy {
        /// `GREEDY_JOB`, or `greedy<PID>` for the job of the greedyrun whose process id is
        /// PID (its jobs are `greedy<PID>.<n>`).
        job: String,
    },
}

impl Job {
    /// A Slurm job `J` or step `J.S`, as `--job` takes it.
    pub fn slurm(spec: &str) -> Result<Job, Error> {
        let number = |t: &str| t.parse::<u32>().ok();
        let parsed = match spec.split_once('.') {
            Some((j, s)) => number(j).zip(number(s)).map(|(j, s)| (j, Some(s))),
            None => number(spec).map(|j| (j, None)),
        };
        let (job, step) = parsed.ok_or_else(|| Error::JobName {
            text: spec.into(),
            expected: "a Slurm job id J or step J.S (numbers, as squeue shows them)",
        })?;
        Ok(Job::Slurm { job, step })
    }

    /// The job as one word for a daemon's command line: `slurm:J[.S]` or `greedy:ID`.
    pub fn to_arg(&self) -> String {
        match self {
            Job::Slurm { job, step: None } => format!("slurm:{job}"),
            Job::Slurm {
                job,
                step: Some(step),
            } => format!("slurm:{job}.{step}"),
            Job::Greedy { job } => format!("greedy:{job}"),
        }
    }

    /// The job from [`Job::to_arg`]'s word.
    pub fn from_arg(arg: &str) -> Result<Job, Error> {
        if let Some(spec) = arg.strip_prefix("slurm:") {
            return Job::slurm(spec);
        }
        match arg.strip_prefix("greedy:") {
            Some(id) if !id.is_empty() => Ok(Job::Greedy { job: id.into() }),
            _ => Err(Error::JobName {
                text: arg.into(),
                expected: "slurm:J[.S] or greedy:ID",
            }),
        }
    }
}

impl fmt::Display for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Job::Slurm {
                job,
                step: Some(step),
            } => write!(f, "slurm job {job}.{step}"),
            Job::Slurm { job, step: None } => write!(f, "slurm job {job}"),
            Job::Greedy { job } => write!(f, "greedy job {job}"),
        }
    }
}

/// One rank of the job on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RankProcess {
    /// The rank in the job.
    pub rank: u32,
    /// Its process id.
    pub pid: u32,
}

/// Process names that carry a rank's environment without being the rank.
const LAUNCHER_COMMS: [&str; 4] = ["slurmstepd", "greedyd", "greedy-guard", "srun"];

/// Step ids from here up are Slurm's special steps (batch script, extern, interactive, pending:
/// `SLURM_MAX_NORMAL_STEP_ID` in slurm.h); they run no ranks, so a job with no step named
/// ignores them.
const SLURM_MAX_NORMAL_STEP_ID: u32 = 0xffff_fff0;

/// The ranks of `job` running on this node, sorted by rank. With `host`, a process whose
/// environment names another host (`SLURMD_NODENAME`, greedyrun's `GREEDY_HOST`) is not taken:
/// where hosts share a process table (containers, the emulated cluster) each daemon then
/// takes only its own host's ranks.
pub fn local_ranks(job: &Job, host: Option<&str>) -> Result<Vec<RankProcess>, Error> {
    local_ranks_in(Path::new("/proc"), job, host)
}

impl Job {
    /// The variable in which this job's launcher names each rank's host.
    pub fn host_variable(&self) -> &'static str {
        match self {
            Job::Slurm { .. } => "SLURMD_NODENAME",
            Job::Greedy { .. } => "GREEDY_HOST",
        }
    }
}

/// What /proc/PID/stat tells about a process.
#[derive(Debug, Clone, PartialEq)]
struct Stat {
    /// The command name (at most 15 bytes).
    comm: String,
    /// The parent's pid.
    ppid: u32,
    /// The start time in clock ticks since boot: the older of two processes has the lower.
    start: u64,
}

/// A process claiming a rank of the job.
#[derive(Debug, Clone)]
struct Claim {
    /// The process id.
    pid: u32,
    /// The rank it claims.
    rank: u32,
    /// Its Slurm step, for a Slurm job.
    step: Option<u32>,
    /// Its start time, to break a tie between two topmost claims.
    start: u64,
}

/// [`local_ranks`] over a /proc tree at `proc_root` (a fake one in tests).
fn local_ranks_in(
    proc_root: &Path,
    job: &Job,
    host: Option<&str>,
) -> Result<Vec<RankProcess>, Error> {
    let entries = fs::read_dir(proc_root).map_err(|source| Error::Read {
        path: proc_root.to_path_buf(),
        source,
    })?;
    let mut stats = HashMap::new();
    let mut claims = Vec::new();
    for pid in entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
    {
        let Some(stat) = read_stat(proc_root, pid) else {
            continue;
        };
        if let Some(claim) = claim_of(proc_root, pid, &stat, job, host) {
            claims.push(claim);
        }
        stats.insert(pid, stat);
    }
    check_one_step(job, &claims)?;
    Ok(topmost(proc_root, claims, &mut stats))
}

/// The rank `pid` claims in `job`, if it is not a launcher and its environment is readable.
fn claim_of(
    proc_root: &Path,
    pid: u32,
    stat: &Stat,
    job: &Job,
    host: Option<&str>,
) -> Option<Claim> {
    if LAUNCHER_COMMS.contains(&stat.comm.as_str()) {
        return None;
    }
    let environ = fs::read(proc_root.join(pid.to_string()).join("environ")).ok()?;
    if let (Some(want), Some(found)) = (host, env_var(&environ, job.host_variable())) {
        (found == want).then_some(())?;
    }
    let (rank, step) = rank_in(job, &environ)?;
    Some(Claim {
        pid,
        rank,
        step,
        start: stat.start,
    })
}

/// The rank (and Slurm step) that an `environ` (NUL-separated `K=V`) gives in `job`.
fn rank_in(job: &Job, environ: &[u8]) -> Option<(u32, Option<u32>)> {
    let num = |name| env_var(environ, name)?.parse::<u32>().ok();
    match job {
        Job::Greedy { job } => {
            let found = env_var(environ, "GREEDY_JOB")?;
            let of_launcher = !job.contains('.')
                && found
                    .strip_prefix(job.as_str())
                    .is_some_and(|n| n.starts_with('.'));
            (found == job || of_launcher).then_some(())?;
            Some((num("GREEDY_RANK")?, None))
        }
        Job::Slurm { job, step } => {
            (num("SLURM_JOB_ID")? == *job).then_some(())?;
            let found = num("SLURM_STEP_ID")?;
            let wanted = match step {
                Some(step) => found == *step,
                None => found < SLURM_MAX_NORMAL_STEP_ID,
            };
            wanted.then_some(())?;
            Some((num("SLURM_PROCID")?, Some(found)))
        }
    }
}

/// The value of `name` in `environ`, if set and UTF-8.
fn env_var<'a>(environ: &'a [u8], name: &str) -> Option<&'a str> {
    environ.split(|&b| b == 0).find_map(|kv| {
        let value = kv.strip_prefix(name.as_bytes())?.strip_prefix(b"=")?;
        std::str::from_utf8(value).ok()
    })
}

/// Refuses a Slurm job with no step named when several of its steps run here: their ranks would
/// collide (each step counts from 0).
fn check_one_step(job: &Job, claims: &[Claim]) -> Result<(), Error> {
    let Job::Slurm { job, step: None } = job else {
        return Ok(());
    };
    let mut steps: Vec<u32> = claims.iter().filter_map(|c| c.step).collect();
    steps.sort_unstable();
    steps.dedup();
    match steps.len() {
        0 | 1 => Ok(()),
        _ => Err(Error::Steps { job: *job, steps }),
    }
}

/// One process per rank, sorted by rank: the claim with no ancestor claiming the same rank; of
/// several such (a rank's child reparented when the rank died), the oldest.
fn topmost(
    proc_root: &Path,
    claims: Vec<Claim>,
    stats: &mut HashMap<u32, Stat>,
) -> Vec<RankProcess> {
    let rank_of: HashMap<u32, u32> = claims.iter().map(|c| (c.pid, c.rank)).collect();
    let mut best: HashMap<u32, &Claim> = HashMap::new();
    for claim in &claims {
        if has_claiming_ancestor(proc_root, claim, &rank_of, stats) {
            continue;
        }
        let slot = best.entry(claim.rank).or_insert(claim);
        if (claim.start, claim.pid) < (slot.start, slot.pid) {
            *slot = claim;
        }
    }
    let mut ranks: Vec<RankProcess> = best
        .into_values()
        .map(|c| RankProcess {
            rank: c.rank,
            pid: c.pid,
        })
        .collect();
    ranks.sort();
    ranks
}

/// Whether an ancestor of `claim` claims the same rank. The walk goes through processes that
/// claim nothing (an unreadable setuid wrapper between a rank and its child) and stops at pid 1,
/// at a process that vanished, or after `MAX_DEPTH` steps (a pid reused while we read could
/// otherwise make a loop).
fn has_claiming_ancestor(
    proc_root: &Path,
    claim: &Claim,
    rank_of: &HashMap<u32, u32>,
    stats: &mut HashMap<u32, Stat>,
) -> bool {
    const MAX_DEPTH: usize = 1024;
    let mut pid = claim.pid;
    for _ in 0..MAX_DEPTH {
        let Some(ppid) = parent(proc_root, pid, stats) else {
            return false;
        };
        if ppid <= 1 {
            return false;
        }
        if rank_of.get(&ppid) == Some(&claim.rank) {
            return true;
        }
        pid = ppid;
    }
    false
}

/// The parent of `pid`, from the stats read so far or from /proc.
fn parent(proc_root: &Path, pid: u32, stats: &mut HashMap<u32, Stat>) -> Option<u32> {
    if let Some(stat) = stats.get(&pid) {
        return Some(stat.ppid);
    }
    let stat = read_stat(proc_root, pid)?;
    let ppid = stat.ppid;
    stats.insert(pid, stat);
    Some(ppid)
}

/// Reads and parses /proc/PID/stat (readable for every process); `None` if it vanished.
fn read_stat(proc_root: &Path, pid: u32) -> Option<Stat> {
    let text = fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    parse_stat(&text)
}

/// Parses `PID (COMM) STATE PPID ...`: the name may hold spaces and parentheses, so it runs to
/// the last `)`; start time is field 22 (proc(5)).
fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let fields: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // fields[0] is field 3 (state).
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some(Stat { comm, ppid, start })
}

#[cfg(test)]
mod tests;
