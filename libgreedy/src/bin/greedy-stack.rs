//! greedy-stack: the merged call stacks of every rank of a running job, as LLNL's STAT prints
//! them. One daemon per node of the job (this program again, started through libgreedy)
//! collects its local ranks' stacks; the call-prefix trees are merged up the daemons' tree;
//! the front end prints one line per distinct stack with its rank ranges, JSON or SVG.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use greedy_libi::stacks::{CallTree, Collector, Job, local_ranks, render};
use greedy_libi::{Backend, Distribution, FrontEnd, HostGroup, Member};
use serde::{Deserialize, Serialize};

/// Print the merged call stacks of every rank of a running job.
#[derive(Debug, Parser)]
#[command(version, after_help = AFTER_HELP)]
struct Args {
    /// The Slurm job (`J`) or step (`J.S`): one daemon on each of its nodes, through
    /// `srun --overlap --jobid J`
    #[arg(long, value_name = "J[.S]", conflicts_with = "greedy_job", value_parser = Job::slurm)]
    job: Option<Job>,

    /// A greedyrun job: its `GREEDY_JOB` id, or `greedy<PID>` for every job of the greedyrun
    /// whose process id is PID; with --hosts, the job's hosts
    #[arg(long, value_name = "ID", requires = "hosts")]
    greedy_job: Option<String>,

    /// The greedyrun job's hosts (Slurm hostlist expressions, comma-separated)
    #[arg(long, value_name = "EXPR")]
    hosts: Option<String>,

    /// Remote shell to the hosts of a greedyrun job
    #[arg(long, value_name = "CMD", env = "GREEDY_RSH", default_value = "ssh")]
    rsh: String,

    /// Output: one line per distinct stack with its ranks, the merged tree as JSON, or SVG
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,

    /// Write the output to FILE instead of stdout
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,

    /// Seconds to wait for the daemons' merged stacks
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    timeout: u64,

    /// Run as a daemon of a session (started by greedy-stack itself)
    #[arg(long, hide = true, value_name = "TARGET", value_parser = Job::from_arg)]
    daemon: Option<Job>,
}

const AFTER_HELP: &str = "Stacks come from eu-stack (elfutils), else gdb -batch, else the kernel's \
/proc/PID/task/*/stack (root only). Exit: 0 stacks printed; 1 some host found no rank or failed \
(named); 2 bad arguments; 3 no daemon could be started or none answered.";

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
    Svg,
}

/// What the daemons reduce: the merged stacks and what each host found.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Report {
    tree: CallTree,
    hosts: Vec<HostNote>,
}

/// One daemon's account: its host, the ranks it took, or why it took none.
#[derive(Debug, Serialize, Deserialize)]
struct HostNote {
    host: String,
    ranks: usize,
    problem: Option<String>,
}

fn main() {
    let args = Args::parse();
    let outcome = match &args.daemon {
        Some(target) => daemon(target).map(|()| 0),
        None => front_end(&args),
    };
    match outcome {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("greedy-stack: {e:#}");
            std::process::exit(3);
        }
    }
}

/// Where the daemons run and what they look for.
struct Plan {
    /// The job whose ranks the daemons look for.
    target: Job,
    backend: Backend,
    /// The hosts, one daemon each; empty: the Slurm job's nodes.
    hosts: Vec<(String, u32)>,
}

fn plan(args: &Args) -> anyhow::Result<Plan> {
    if let Some(target @ Job::Slurm { job, step }) = &args.job {
        return Ok(Plan {
            backend: Backend::SlurmJob {
                job: *job,
                step: *step,
            },
            target: target.clone(),
            hosts: Vec::new(),
        });
    }
    let (Some(id), Some(hosts)) = (&args.greedy_job, &args.hosts) else {
        bail!("name the job: --job J[.S] (Slurm) or --greedy-job ID --hosts EXPR (greedyrun)");
    };
    let mut list = Vec::new();
    for expr in hosts.split(',') {
        list.extend(
            greedy_tree::hostlist::expand(expr).with_context(|| format!("--hosts {expr}"))?,
        );
    }
    let backend = Backend::Greedyrun {
        rsh: args.rsh.clone(),
    };
    Ok(Plan {
        target: Job::Greedy { job: id.clone() },
        backend,
        hosts: list.into_iter().map(|h| (h, 1)).collect(),
    })
}

fn front_end(args: &Args) -> anyhow::Result<i32> {
    let Plan {
        target,
        backend,
        hosts,
    } = match plan(args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("greedy-stack: {e:#}");
            return Ok(2);
        }
    };
    let mut group = HostGroup::new(std::env::current_exe()?.display().to_string());
    group.args = vec!["--daemon".into(), target.to_arg()];
    group.hosts = hosts;
    let distribution = Distribution::new(vec![group])?;
    let mut session = FrontEnd::new().launch(&distribution, &backend)?;
    let bytes = session.recv(Some(Duration::from_secs(args.timeout)));
    let bytes = match bytes {
        Ok(b) => b,
        Err(e) => {
            let _ = session.kill();
            bail!("no stacks from the daemons: {e}");
        }
    };
    let outcome = session.wait()?;
    let report: Report = serde_json::from_slice(&bytes).context("the daemons' report")?;
    let mut code = print(args, &report.tree)?;
    for note in &report.hosts {
        if let Some(problem) = &note.problem {
            eprintln!("greedy-stack: {}: {problem}", note.host);
            code = 1;
        }
    }
    if !outcome.success() {
        eprintln!(
            "greedy-stack: the daemons ended with {}: {}",
            outcome.code, outcome.why
        );
        code = 1;
    }
    Ok(code)
}

fn print(args: &Args, tree: &CallTree) -> anyhow::Result<i32> {
    let text = match args.format {
        Format::Text => render::text(tree),
        Format::Json => serde_json::to_string_pretty(&render::json(tree))? + "\n",
        Format::Svg => render::svg(tree),
    };
    match &args.output {
        Some(path) => std::fs::write(path, text).with_context(|| path.display().to_string())?,
        None => std::io::stdout().write_all(text.as_bytes())?,
    }
    Ok(0)
}

/// One node's part: find the job's local ranks, take their stacks, reduce, and (the master)
/// hand the merged report to the front end.
fn daemon(target: &Job) -> anyhow::Result<()> {
    let mut me = Member::init()?;
    let report = local_report(target);
    let merged = me.reduce(serde_json::to_vec(&report)?, |a, b| merge(&a, &b))?;
    if let Some(merged) = merged {
        me.send_to_front(&merged)?;
    }
    me.finalize()?;
    Ok(())
}

fn merge(a: &[u8], b: &[u8]) -> Vec<u8> {
    let (Ok(mut a), Ok(b)) = (
        serde_json::from_slice::<Report>(a),
        serde_json::from_slice::<Report>(b),
    ) else {
        return a.to_vec();
    };
    a.tree.merge(b.tree);
    a.hosts.extend(b.hosts);
    serde_json::to_vec(&a).unwrap_or_default()
}

/// This host's stacks, or the problem that kept it from taking them.
fn local_report(target: &Job) -> Report {
    let host = nix_hostname();
    let mut report = Report::default();
    let note = match local_tree(target, &mut report.tree) {
        Ok(0) => HostNote {
            host,
            ranks: 0,
            problem: Some(format!("no rank of {target} runs here")),
        },
        Ok(ranks) => HostNote {
            host,
            ranks,
            problem: None,
        },
        Err(e) => HostNote {
            host,
            ranks: 0,
            problem: Some(format!("{e:#}")),
        },
    };
    report.hosts.push(note);
    report
}

fn local_tree(job: &Job, tree: &mut CallTree) -> anyhow::Result<usize> {
    // This daemon's own host, named as the job's ranks name theirs: it was started by the
    // same kind of launcher (an srun step beside the job, or greedyrun on the job's hosts).
    let host = std::env::var(job.host_variable()).ok();
    let ranks = local_ranks(job, host.as_deref())?;
    if ranks.is_empty() {
        return Ok(0);
    }
    let collector = Collector::available().context(
        "neither eu-stack (elfutils) nor gdb is installed, and /proc/PID/task/*/stack needs root",
    )?;
    for rank in &ranks {
        for mut thread in collector.stacks(rank.pid)? {
            // Unnamed frames of one library in a row are its internals (an MPI library's
            // progress loop, of a depth that differs by rank): one frame, so ranks waiting in
            // the same call merge.
            thread.dedup_by(|a, b| a == b && a.starts_with("??@"));
            tree.insert(rank.rank, &thread);
        }
    }
    Ok(ranks.len())
}

fn nix_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}
