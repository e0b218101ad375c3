//! `greedyrun`: start a parallel job on many hosts over rsh/ssh along the greedy launch tree.

use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use greedy_launcher::{
    allocation::{self, Allocation},
    calibrate,
    exports::{self, Exports},
    head::{self, JobConfig},
    plan::{HostSource, MapBy, Part, Plan, Request},
    proto::{BindTo, PmiMode},
    ssh,
    status::code,
    task_spec::Defaults,
    tasks::{self, MinHosts, ResultsFile, Source, TaskOptions},
};
use greedy_tree::{LaunchModel, Topology};

const EXIT_STATUS: &str = "\
EXIT STATUS:
    0     every rank exited 0
    N     the first rank (or spawned child) to fail exited with N (128+S: it was killed by
          signal S; 127: it could not be started). A failing rank ends the job unless
          --keep-going.
    2     the command line or hostfile was refused (nothing was started)
    124   some agent did not start within --timeout (the message names the hosts)
    125   a host could not be reached, an agent or its remote shell died, or the wire-up failed
    130   greedyrun got SIGINT (Ctrl-C); 129: SIGHUP; 143: SIGTERM. Ranks got SIGTERM, SIGKILL
          after --grace
    141   greedyrun's stdout was closed (broken pipe); the job was ended quietly
With --tasks: 0 every task ended 0; 1 some task failed after its retries (each is named; with
    --resume, also one of the run before);
    2 the stream or --results could not be opened; 125 no host was left to run the rest
    (or fewer than --min-hosts; each task not run is named); 129/130/143 interrupted; 141 stdout
    closed.";

/// Which wire-up the ranks get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Pmi {
    /// Every family at once (PMI-1/PMI-2, PMIx, Charm++ netlrts): each rank is served by the
    /// one it speaks; plain programs that speak none also run.
    Auto,
    /// PMI-1/PMI-2 only (MPICH, Intel MPI).
    Pmi1,
    /// The same as pmi1 (the server tells the versions apart per connection).
    Pmi2,
    /// PMIx only (Open MPI 4.1/5).
    Pmix,
    /// No wire-up service at all (cheapest for non-MPI programs).
    None,
    /// Charm++ netlrts (the charm4py wheel): each host's agent does charmrun's job. Give the
    /// process count with -n/--ppn; `+pN`/`++n N` matching it are dropped, others refused.
    Charm,
}

/// What each rank is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Bind {
    /// No binding: the ranks run on every CPU of their host.
    None,
    /// The n-th rank of a host to its n-th core (all its hardware threads), round-robin.
    Core,
    /// The n-th rank of a host to its n-th package, round-robin.
    Socket,
}

/// How consecutive ranks are laid over the hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Map {
    /// Fill each host's slots before the next: ranks 0..k on the first host.
    Slot,
    /// One rank per host in turn (round-robin), skipping hosts whose slots are full.
    Node,
}

/// Start NP ranks of PROG on many hosts: one remote shell per host along the greedy launch
/// tree, local ranks forked by each host's agent (greedyd), stdio/signals/exit codes
/// forwarded, and nothing left behind on failure.
#[derive(Debug, Parser)]
#[command(version, after_help = "Exit status: 0 ok; N first failing rank's code; 2 usage; 124 launch timeout; 125 host/agent lost; 129/130/143 interrupted; 141 broken pipe (--help: details)", after_long_help = EXIT_STATUS, args_override_self = true)]
pub(crate) struct Args {
    /// Number of ranks (default: every slot of the hosts). `-np` also works.
    #[arg(short = 'n', long = "np", value_name = "NP")]
    n_ranks: Option<u32>,

    /// Hostfile: `host slots=N` (Open MPI), `host:N` (MPICH), or one host per line. Without
    /// any host option, the allocation's hosts: Slurm (`SLURM_JOB_NODELIST` and its tasks per
    /// node), PBS (`PBS_NODEFILE`), LSF (`LSB_DJOB_HOSTFILE`, `LSB_MCPU_HOSTS`) or Grid Engine
    /// (`PE_HOSTFILE`); `-v` names the source.
    #[arg(long, visible_alias = "machinefile", short = 'f', value_name = "FILE")]
    hostfile: Option<PathBuf>,

    /// Hosts as Slurm hostlist expressions, comma-separated, each optionally `:N` slots
    /// (`n[1-64]`, `n[1-8]:2,m3`).
    #[arg(long, value_name = "EXPR", conflicts_with = "hostfile")]
    hosts: Option<String>,

    /// Hosts as a comma list (`h1,h2:2`); same syntax as --hosts.
    #[arg(short = 'H', long = "host", value_name = "LIST", conflicts_with_all = ["hostfile", "hosts"])]
    host_list: Option<String>,

    /// Ranks per host (overrides slots). `-ppn` also works.
    #[arg(long, value_name = "K")]
    ppn: Option<u32>,

    /// Remote shell command; host and agent are appended. For `ssh`, cheap-hop options are
    /// added after yours (curve25519 key exchange first, BatchMode, ConnectTimeout=--timeout,
    /// ServerAlive 10 s × 3). `srun` (inside a Slurm allocation where ssh is not allowed)
    /// starts every agent in one step (--overlap --mpi=none, one task per host), as Hydra's
    /// slurm bootstrap does; each connects back to greedyrun over TCP.
    #[arg(long, env = "GREEDY_RSH", default_value = "ssh", value_name = "CMD")]
    rsh: String,

    /// SEQ of the launch model, seconds: the extra delay each further child of one parent
    /// costs. Measure it with --calibrate (the default was measured over ssh on the emulated
    /// cluster with 10 ms delay, docs/benchmarks.md).
    #[arg(long, env = "GREEDY_SEQ", default_value_t = 0.013, value_name = "S")]
    seq: f64,

    /// REM of the launch model, seconds: from starting a remote shell until the child agent
    /// can launch. Measure it with --calibrate.
    #[arg(long, env = "GREEDY_REM", default_value_t = 0.28, value_name = "R")]
    rem: f64,

    /// Launch tree shape: greedy, flat, chain, binomial or kary:K.
    #[arg(long, default_value = "greedy", value_name = "SHAPE")]
    topology: Topology,

    /// Remote shells a parent keeps in flight before their agents said hello.
    ///
    /// The launch tree is planned for it: when B shells start faster than one REM, a parent
    /// brings up B children per REM, and the greedy tree lets the first ones launch the rest.
    ///
    /// Each host gets one connection per launch, so sshd's MaxStartups (10 by default) only
    /// matters where connections share one sshd (a bastion, ProxyJump); the cap bounds the
    /// parent's own CPU and processes. On the emulated cluster the greedy tree at 8 launched
    /// 64 hosts in 1.6 s, as fast as 64 in flight flat (docs/benchmarks.md).
    #[arg(long, default_value_t = 8, value_name = "B")]
    batch: u32,

    /// Retries of a remote shell that sshd refused at start-up (MaxStartups).
    #[arg(long, default_value_t = 3, value_name = "K")]
    retries: u32,

    /// Wire-up service for the ranks.
    #[arg(long, value_enum, default_value_t = Pmi::Auto)]
    pmi: Pmi,

    /// How consecutive ranks are laid over the hosts: `slot` fills each host first, `node`
    /// goes round the hosts (Open MPI's `--map-by`, Hydra's `-rr`).
    #[arg(long = "map-by", value_enum, default_value_t = Map::Slot)]
    map_by: Map,

    /// Let spawned jobs (`MPI_Comm_spawn`) run more processes than the hosts' free slots
    /// (without it, a spawn that does not fit is refused at once).
    #[arg(long)]
    oversubscribe: bool,

    /// Copy files to node-local storage on every host before the ranks start.
    ///
    /// Bare, the program; `--bcast=FILE,…`, the files named. They go down the launch tree
    /// once, forwarded as they arrive and checked by SHA-256 on every host (a damaged copy is
    /// sent again); the ranks run the program's copy and find the files in $GREEDY_BCAST. The
    /// copies are removed when the job ends; on a session, its agents keep them for later jobs
    /// until the session ends (a changed file is sent again).
    #[arg(long, num_args = 0..=1, require_equals = true, value_name = "FILES")]
    bcast: Option<Option<String>>,

    /// Bind each rank to a core or a package of its host (hwloc's, round-robin by local rank;
    /// the rank sees its CPUs in GREEDY_CPUS); with --tasks, each task to as many of its
    /// host's cores or packages as it takes slots, held by no other running task.
    #[arg(long = "bind-to", value_enum, default_value_t = Bind::None)]
    bind_to: Bind,

    /// Launch timeout, seconds: every agent must say hello (and the wire-up join complete)
    /// within it, or the job ends naming the hosts that did not.
    #[arg(long, default_value_t = 60.0, value_name = "SECS")]
    timeout: f64,

    /// Seconds of silence after which a host (or the link to it) is taken as lost: greedyrun
    /// and the agents ping each other when they have nothing else to say, and an agent cut off
    /// this long ends its ranks. 0: never (a host is lost only when its connection closes).
    #[arg(long, default_value_t = greedy_launcher::heartbeat::DEFAULT_LOST_AFTER_S, value_name = "SECS")]
    lost_after: f64,

    /// Seconds between SIGTERM and SIGKILL when the job is ended.
    #[arg(long, default_value_t = 3.0, value_name = "SECS")]
    grace: f64,

    /// Prefix every output line with `[rank] `.
    #[arg(long)]
    tag_output: bool,

    /// Forward each rank's output as it is read, not in whole lines.
    ///
    /// By default each rank's (and task's) output goes out in whole lines, as srun does, so
    /// lines of different ranks never splice; a partial line (a prompt, a progress bar) is
    /// still shown after 200 ms without its newline, or once 64 KiB of it are held. With
    /// --unbuffered every chunk a rank writes is passed on at once.
    #[arg(long, short = 'u')]
    unbuffered: bool,

    /// A failing rank does not end the job; the exit status is still the first failure's.
    #[arg(long)]
    keep_going: bool,

    /// Rank that reads greedyrun's stdin (`none`: every rank reads /dev/null).
    #[arg(long, default_value = "0", value_name = "RANK|none")]
    stdin: String,

    /// Agent command on the hosts (default: `greedyd` beside this greedyrun; it must exist at
    /// that path on every host, e.g. on a shared filesystem).
    #[arg(long, env = "GREEDY_AGENT", value_name = "PATH")]
    agent: Option<String>,

    /// Seconds between progress lines while hosts are still starting, and with --tasks while
    /// tasks run (done, failed, running, tasks/s) (0: none).
    #[arg(long, default_value_t = 2.0, value_name = "SECS")]
    progress: f64,

    /// Measure SEQ and REM on the given hosts and print them for the config; runs no job.
    #[arg(long)]
    calibrate: bool,

    /// Run a stream of tasks instead of a program: one task per line of FILE (`-`: stdin),
    /// each in free slots of the hosts (`GREEDY_TASK` its line number); a line of plain words
    /// runs as those words, one with shell syntax as `sh -c LINE`, a JSON object as it
    /// describes (docs/many-task.md, docs/task.schema.json).
    /// With GREEDY_SESSION set, on that session's hosts (no host option needed).
    #[arg(long, value_name = "FILE|-", conflicts_with = "calibrate")]
    tasks: Option<String>,

    /// With --tasks: one JSON line per task (task, host, exit, wall_s, end_s, runs, command;
    /// `cancelled` for a task a cancelled stream did not finish, `error` for a line not run).
    #[arg(long, value_name = "FILE", requires = "tasks")]
    results: Option<PathBuf>,

    /// With --tasks or --start-session: go on while at least N hosts (or P% of them) are up
    /// or still starting; below that, end, naming the tasks not run (default 1)
    #[arg(long, value_name = "N|P%")]
    min_hosts: Option<MinHosts>,

    /// With --tasks: the --results FILE of a run of this stream that did not finish (its
    /// client died, was stopped): tasks with a result there do not run again, and this run's
    /// results are added to it, so each task has one line over both runs
    #[arg(
        long,
        value_name = "FILE",
        requires = "tasks",
        conflicts_with = "results"
    )]
    resume: Option<PathBuf>,

    /// With --tasks: run a task that fails up to K more times.
    #[arg(long, default_value_t = 0, value_name = "K", requires = "tasks")]
    task_retries: u32,

    /// With --tasks: ranks of a plain line's task (a JSON line says its own).
    #[arg(long, default_value_t = 1, value_name = "R", requires = "tasks",
          value_parser = clap::value_parser!(u32).range(1..))]
    task_ranks: u32,

    /// A session's stream's task runs this job in the slots it took (set by the session).
    #[arg(long, hide = true, value_name = "CLAIM")]
    task_claim: Option<u64>,

    /// With --tasks: cores (slots, on one host) of each rank of a plain line's task.
    #[arg(long, default_value_t = 1, value_name = "C", requires = "tasks",
          value_parser = clap::value_parser!(u32).range(1..))]
    task_cores: u32,

    /// Start the agents on the hosts and keep them: prints `export GREEDY_SESSION=…` for
    /// `eval`. While GREEDY_SESSION is set, `greedyrun PROG` and `greedyrun --tasks` run on
    /// that session's agents (its free slots; no new remote shell).
    #[arg(long, conflicts_with_all = ["tasks", "calibrate", "status", "end_session"])]
    start_session: bool,

    /// With --start-session: end the session after this long without a stream or a job.
    #[arg(long, default_value_t = 1800.0, value_name = "SECS")]
    idle_timeout: f64,

    /// Say how the session of GREEDY_SESSION is: hosts, slots, tasks and jobs running.
    #[arg(long, conflicts_with_all = ["tasks", "calibrate", "end_session"])]
    status: bool,

    /// End the session of GREEDY_SESSION: its agents leave every host.
    #[arg(long, conflicts_with_all = ["tasks", "calibrate"])]
    end_session: bool,

    /// Print launch timings.
    #[arg(short, long)]
    verbose: bool,

    /// Pass VAR on to the ranks, or set it: `-x VAR`, `-x VAR=VAL` (Open MPI). Every variable
    /// of this environment is passed on unless --export, -genvlist or -genvnone say otherwise.
    #[arg(short = 'x', value_name = "VAR[=VAL]")]
    x: Vec<String>,

    /// Set VAR to VAL in every rank (Hydra). `-genv` also works.
    #[arg(long, num_args = 2, value_names = ["VAR", "VAL"])]
    genv: Vec<String>,

    /// Pass on only these variables (and -x/-genv ones) (Hydra). `-genvlist` also works.
    #[arg(long, value_name = "A,B")]
    genvlist: Option<String>,

    /// Pass on none of this environment's variables but -x/-genv ones (Hydra).
    #[arg(long)]
    genvnone: bool,

    /// Pass on every variable, the default (Hydra).
    #[arg(long)]
    genvall: bool,

    /// As srun: ALL, NONE, or a list `[ALL,]VAR[=VAL],…` (without ALL, only what it names).
    /// Decides over -genvlist and -genvnone.
    #[arg(long, value_name = "SPEC")]
    export: Option<String>,

    /// Working directory of the ranks, on every host (default: greedyrun's). `-wdir` also
    /// works.
    #[arg(long, visible_alias = "wdir", value_name = "DIR")]
    chdir: Option<PathBuf>,

    /// The program and its arguments.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROG"
    )]
    argv: Vec<String>,
}

/// Variables that describe greedyrun's own login session, not the job.
const ENV_SKIP: &[&str] = &[
    "HOSTNAME",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "_",
    "SSH_CLIENT",
    "SSH_CONNECTION",
    "SSH_TTY",
    "SSH_AUTH_SOCK",
    "DISPLAY",
    "XAUTHORITY",
];

fn secs(name: &str, v: f64) -> anyhow::Result<Duration> {
    if !v.is_finite() || v < 0.0 {
        bail!("{name} must be a non-negative number of seconds, not {v}");
    }
    Ok(Duration::from_secs_f64(v))
}

/// What greedyrun does with the hosts.
#[derive(Debug)]
enum Mode {
    /// Run the program.
    Job,
    /// Measure SEQ and REM.
    Calibrate,
    /// Run a stream of tasks.
    Tasks(TaskOptions),
}

/// Arguments → a validated job, before any side effect; `session`: the free slots of the
/// session the job runs on, its hosts when no host option is given.
fn job_config(mut args: Args, session: Option<Allocation>) -> anyhow::Result<(JobConfig, Mode)> {
    let hosts = host_source(&args, session)?;
    let timeout = secs("--timeout", args.timeout)?;
    let rsh = ssh::remote_shell(&args.rsh, timeout);
    // A stream's ranks are its slots: no program of theirs, no wire-up, no stdin.
    let stream = args.tasks.is_some() || args.start_session;
    let (argv, more) = programs(std::mem::take(&mut args.argv), args.calibrate, stream)?;
    let pmi = if stream {
        PmiMode::None
    } else {
        args.pmi.into()
    };
    let model = launch_model(args.seq, args.rem)?;
    let plan = Plan::new(Request {
        n_ranks: args.n_ranks,
        hosts,
        ppn: args.ppn,
        map_by: args.map_by.into(),
        model,
        // One srun step starts every agent (greedy_launcher::connect): Slurm's fan-out is the
        // launch tree, and each agent is greedyrun's child.
        topology: if ssh::is_srun(&rsh) {
            Topology::Flat
        } else {
            args.topology
        },
        batch: args.batch,
        timeout,
        grace: secs("--grace", args.grace)?,
        pmi,
        argv,
        more,
    })?;
    let plan = charm_arguments(plan)?;
    let stdin_rank = if stream {
        None
    } else {
        stdin_rank(&args.stdin, plan.n_ranks)?
    };
    let agent = agent_words(args.agent.as_deref())?;
    let env = rank_env(&args)?;
    let here = std::env::current_dir().unwrap_or_else(|_| "/".into());
    // A relative --chdir is taken from here, as the user sees it.
    let cwd = args
        .chdir
        .as_ref()
        .map_or(here.clone(), |d| here.join(d))
        .display()
        .to_string();
    let mode = mode(&args)?;
    let mut plan = plan;
    let bcast = match &args.bcast {
        Some(named) if !stream => {
            let path = env
                .iter()
                .find(|(k, _)| k == "PATH")
                .map(|(_, v)| v.as_ref());
            let cwd = std::path::Path::new(&cwd);
            greedy_launcher::bcast::files(named.as_deref(), &mut plan.apps, cwd, path)
                .map_err(anyhow::Error::msg)?
        }
        Some(_) => anyhow::bail!("--bcast is for jobs; a task names its files in \"inputs\""),
        None => Vec::new(),
    };
    let cfg = JobConfig {
        plan,
        rsh,
        agent,
        retries: args.retries,
        tag_output: args.tag_output,
        unbuffered: args.unbuffered,
        keep_going: args.keep_going,
        stdin_rank,
        bind: args.bind_to.into(),
        progress: secs("--progress", args.progress)?,
        env,
        cwd,
        verbose: args.verbose,
        quiet: false,
        oversubscribe: args.oversubscribe,
        bcast,
        lost_after: secs("--lost-after", args.lost_after)?,
    };
    Ok((cfg, mode))
}

/// Where the hosts come from: a host option, the session's free slots, or the batch
/// allocation greedyrun runs in.
fn host_source(args: &Args, session: Option<Allocation>) -> anyhow::Result<HostSource> {
    if let Some(p) = &args.hostfile {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("read hostfile {}", p.display()))?;
        let path = p.display().to_string();
        return Ok(HostSource::Hostfile { path, text });
    }
    if let Some(e) = args.hosts.as_ref().or(args.host_list.as_ref()) {
        return Ok(HostSource::List(e.clone()));
    }
    if let Some(a) = session {
        if a.hostfile.is_empty() {
            bail!("{}: every slot is taken by the jobs running there", a.what);
        }
        return Ok(HostSource::Allocation(a));
    }
    let found = allocation::detect(&|k| std::env::var(k).ok(), &|p| std::fs::read_to_string(p))?;
    let Some(a) = found else {
        bail!(
            "no hosts: give --hostfile FILE, --hosts EXPR or -H h1,h2, or run inside a \
             Slurm, PBS, LSF or Grid Engine allocation"
        )
    };
    if args.verbose {
        eprintln!("greedyrun: hosts from {}", a.what);
    }
    Ok(HostSource::Allocation(a))
}

/// The program(s) of the command line: the first part's words and the further MPMD parts.
/// `--calibrate` runs `true` unless given a program; a stream (`--tasks`,
/// `--start-session`) takes none.
fn programs(
    argv: Vec<String>,
    calibrate: bool,
    stream: bool,
) -> anyhow::Result<(Vec<String>, Vec<Part>)> {
    if calibrate && argv.is_empty() {
        Ok((vec!["true".to_string()], Vec::new()))
    } else if stream {
        if !argv.is_empty() {
            bail!("--tasks and --start-session run the commands of a stream: give no program");
        }
        // The plan's ranks are the stream's slots; nothing runs this program.
        Ok((vec!["/bin/sh".to_string()], Vec::new()))
    } else {
        mpmd_parts(argv)
    }
}

/// The launch model of `--seq` and `--rem`, checked once here; every consumer gets it typed.
fn launch_model(seq: f64, rem: f64) -> anyhow::Result<LaunchModel> {
    LaunchModel::new(seq, rem)
        .map_err(|e| greedy_launcher::Error::Plan(format!("launch model: {e}")).into())
}

/// With `--pmi charm`, the program's Charm++ launcher arguments checked against the job size.
fn charm_arguments(mut plan: Plan) -> anyhow::Result<Plan> {
    if plan.pmi != PmiMode::Charm {
        return Ok(plan);
    }
    if plan.apps.len() > 1 {
        bail!("--pmi charm: one program per job (Charm++ has no MPMD start)");
    }
    // A non-SMP Charm++ client given +p2 exits before connecting, silently (its stdio is
    // already /dev/null): refuse here, with the reason, rather than time out later.
    plan.apps[0].argv = greedy_pmix::charm::launcher_args(&plan.apps[0].argv, plan.n_ranks)
        .map_err(|e| anyhow::anyhow!("--pmi charm: {e}"))?;
    Ok(plan)
}

/// `--stdin`: the rank that reads greedyrun's stdin, if any, of a job of `n_ranks`.
fn stdin_rank(stdin: &str, n_ranks: u32) -> anyhow::Result<Option<u32>> {
    if stdin == "none" {
        return Ok(None);
    }
    let r: u32 = stdin
        .parse()
        .context("--stdin takes a rank number or `none`")?;
    if r >= n_ranks {
        bail!("--stdin {r}: the job has only {n_ranks} ranks");
    }
    Ok(Some(r))
}

/// The agent command's words: `--agent`'s, or `greedyd` beside this greedyrun.
fn agent_words(agent: Option<&str>) -> anyhow::Result<Vec<String>> {
    match agent {
        Some(a) => Ok(a.split_whitespace().map(str::to_owned).collect()),
        None => {
            let exe = std::env::current_exe().context("locate greedyrun")?;
            Ok(vec![exe.with_file_name("greedyd").display().to_string()])
        }
    }
}

/// The variables of this environment the ranks get, after -x, -genv, -genvlist, -genvnone
/// and --export.
fn rank_env(args: &Args) -> anyhow::Result<Vec<(String, String)>> {
    let mut exports = Exports::default();
    if args.genvnone {
        exports.base = exports::Base::None;
    }
    if let Some(list) = &args.genvlist {
        exports.list(list)?;
    }
    if let Some(spec) = &args.export {
        exports.export(spec)?;
    }
    for x in &args.x {
        exports.x(x)?;
    }
    for pair in args.genv.chunks(2) {
        exports.set(&pair[0], &pair[1])?;
    }
    Ok(exports.apply(std::env::vars().filter(|(k, _)| !ENV_SKIP.contains(&k.as_str()))))
}

/// The mode of the command line: a job, a calibration, or a stream of tasks (given, or the
/// session's own).
fn mode(args: &Args) -> anyhow::Result<Mode> {
    if args.min_hosts.is_some() && args.tasks.is_none() && !args.start_session {
        bail!("--min-hosts is for a stream or session: give --tasks or --start-session");
    }
    let min_hosts = args.min_hosts.unwrap_or_default();
    Ok(
        match (&args.tasks, args.calibrate, std::env::var_os(SERVE_VAR)) {
            // The session's own process (--start-session started it).
            (_, _, Some(socket)) => Mode::Tasks(TaskOptions {
                source: Source::Session {
                    socket: socket.into(),
                    idle: secs("--idle-timeout", args.idle_timeout)?,
                },
                results: ResultsFile::None,
                retries: 0,
                defaults: Defaults::default(),
                min_hosts,
            }),
            (Some(source), _, None) => Mode::Tasks(TaskOptions {
                source: if source == "-" {
                    Source::Stdin
                } else {
                    Source::File(source.into())
                },
                results: results_file(args),
                retries: args.task_retries,
                defaults: task_defaults(args),
                min_hosts,
            }),
            (None, true, None) => Mode::Calibrate,
            (None, false, None) => Mode::Job,
        },
    )
}

/// Where a stream's results go: `--resume FILE`, `--results FILE` or nowhere.
fn results_file(args: &Args) -> ResultsFile {
    match (&args.resume, &args.results) {
        (Some(path), _) => ResultsFile::Resume(path.clone()),
        (None, Some(path)) => ResultsFile::New(path.clone()),
        (None, None) => ResultsFile::None,
    }
}

/// What a plain line of a stream gets.
fn task_defaults(args: &Args) -> Defaults {
    Defaults {
        ranks: args.task_ranks,
        cores_per_rank: args.task_cores,
    }
}

impl From<Pmi> for PmiMode {
    fn from(pmi: Pmi) -> PmiMode {
        match pmi {
            Pmi::Auto => PmiMode::Auto,
            Pmi::Pmi1 | Pmi::Pmi2 => PmiMode::Strict,
            Pmi::None => PmiMode::None,
            Pmi::Pmix => PmiMode::Pmix,
            Pmi::Charm => PmiMode::Charm,
        }
    }
}

impl From<Map> for MapBy {
    fn from(map: Map) -> MapBy {
        match map {
            Map::Slot => MapBy::Slot,
            Map::Node => MapBy::Node,
        }
    }
}

impl From<Bind> for BindTo {
    fn from(bind: Bind) -> BindTo {
        match bind {
            Bind::None => BindTo::None,
            Bind::Core => BindTo::Core,
            Bind::Socket => BindTo::Socket,
        }
    }
}

/// Splits `PROG ARGS… : -n K PROG ARGS… : …` (mpiexec's MPMD form) at the `:` words: the
/// first part's program, and the further parts with their counts (`-n K`, `-np K`).
fn mpmd_parts(argv: Vec<String>) -> anyhow::Result<(Vec<String>, Vec<Part>)> {
    let mut parts = argv.split(|w| w == ":");
    let first = parts.next().unwrap_or_default().to_vec();
    let mut more = Vec::new();
    for (i, words) in parts.enumerate() {
        let (count, argv) = match words {
            [flag, k, argv @ ..] if ["-n", "-np", "--np"].contains(&flag.as_str()) => (k, argv),
            _ => bail!(
                "MPMD part {}: expected `: -n K PROG ARGS…`, got {words:?}",
                i + 2
            ),
        };
        let n_ranks = count
            .parse()
            .with_context(|| format!("MPMD part {}: -n {count:?}", i + 2))?;
        more.push(Part {
            n_ranks,
            argv: argv.to_vec(),
        });
    }
    Ok((first, more))
}

/// mpirun's and mpiexec's single-dash long options that greedyrun takes with two dashes.
const SINGLE_DASH_LONG: &[&str] = &[
    "-np",
    "-ppn",
    "-hosts",
    "-host",
    "-hostfile",
    "-machinefile",
    "-genv",
    "-genvlist",
    "-genvnone",
    "-genvall",
    "-wdir",
];

/// `-np`/`-ppn` are single-dash long options in mpirun/mpiexec; clap wants two dashes. Only
/// greedyrun's own words are rewritten: the first that is neither an option nor an option's
/// value (or a `--`) starts the program, whose arguments are its own.
fn mpirun_habits(mut argv: impl Iterator<Item = String>) -> Vec<String> {
    let command = <Args as clap::CommandFactory>::command();
    let mut out: Vec<String> = argv.next().into_iter().collect();
    let mut values = 0;
    for a in argv.by_ref() {
        if values > 0 {
            values -= 1;
        } else if a == "--" || !a.starts_with('-') || a == "-" {
            out.push(a);
            break;
        } else {
            let a = match SINGLE_DASH_LONG.contains(&a.as_str()) {
                true => format!("-{a}"),
                false => a,
            };
            values = values_after(&command, &a);
            out.push(a);
            continue;
        }
        out.push(a);
    }
    out.extend(argv);
    out
}

/// How many words after option word `word` are its values (0 for `--opt=VAL`, `-nVAL`, a flag
/// or an unknown option: clap names the unknown).
fn values_after(command: &clap::Command, word: &str) -> usize {
    let arg = match word.strip_prefix("--") {
        Some(long) if !long.contains('=') => command.get_arguments().find(|a| {
            a.get_long() == Some(long) || a.get_all_aliases().is_some_and(|v| v.contains(&long))
        }),
        Some(_) => None,
        None => {
            let mut chars = word.chars().skip(1);
            match (chars.next(), chars.next()) {
                (Some(c), None) => command.get_arguments().find(|a| a.get_short() == Some(c)),
                _ => None,
            }
        }
    };
    match arg {
        Some(a) if a.get_action().takes_values() => a.get_num_args().map_or(1, |r| r.min_values()),
        _ => 0,
    }
}

use greedy_launcher::session::SERVE_VAR;
/// Where a session's control socket is, for the commands that use it.
const SESSION_VAR: &str = "GREEDY_SESSION";

/// The session's control socket from GREEDY_SESSION; an empty value is no session, as an
/// empty variable means unset to users (`GREEDY_SESSION= greedyrun …`).
fn session_var() -> Option<std::ffi::OsString> {
    std::env::var_os(SESSION_VAR).filter(|v| !v.is_empty())
}

/// The commands that talk to a running session: `--status`, `--end-session`, and `--tasks`
/// while GREEDY_SESSION is set. `None` if this command is not one of them.
fn session_client(args: &Args, rt: &tokio::runtime::Runtime) -> Option<i32> {
    if std::env::var_os(SERVE_VAR).is_some() {
        return None;
    }
    let socket = session_var().map(PathBuf::from);
    let request = if args.status {
        "status".to_string()
    } else if args.end_session {
        "end".to_string()
    } else if args.tasks.is_some() && socket.is_some() {
        let progress = match secs("--progress", args.progress) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("greedyrun: {e}");
                return Some(code::USAGE);
            }
        };
        tasks::stream_request(
            args.task_retries,
            task_defaults(args),
            args.tag_output,
            progress,
        )
    } else {
        return None;
    };
    let Some(socket) = socket else {
        eprintln!(
            "greedyrun: --status and --end-session need GREEDY_SESSION (from `eval $(greedyrun --start-session …)`)"
        );
        return Some(code::USAGE);
    };
    let lines: Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>> = match args.tasks.as_deref() {
        None => None,
        Some("-") => Some(Box::new(tokio::io::stdin())),
        Some(path) => match rt.block_on(tokio::fs::File::open(path)) {
            Ok(f) => Some(Box::new(f)),
            Err(e) => {
                eprintln!("greedyrun: --tasks {path}: {e}");
                return Some(code::USAGE);
            }
        },
    };
    Some(rt.block_on(tasks::submit(&socket, &request, lines, results_file(args))))
}

/// A job while GREEDY_SESSION is set: connects to that session and asks for its free slots.
/// `Ok(None)` if this command is not such a job; `Err(code)` if the session cannot be used.
fn session_job(
    args: &Args,
    rt: &tokio::runtime::Runtime,
) -> Result<Option<greedy_launcher::session::Attached>, i32> {
    let Some(socket) = session_var() else {
        return Ok(None);
    };
    if std::env::var_os(SERVE_VAR).is_some()
        || args.start_session
        || args.calibrate
        || args.tasks.is_some()
    {
        return Ok(None);
    }
    let attach = greedy_launcher::session::attach(Path::new(&socket), args.task_claim);
    match rt.block_on(attach) {
        Ok(a) => Ok(Some(a)),
        Err(why) => {
            eprintln!("greedyrun: {why}");
            Err(code::LAUNCHER)
        }
    }
}

/// `--start-session`: starts this same command line in the background as the session (its
/// output in a log beside the control socket, in a 0700 directory of its own), waits until
/// every host is up or lost, and prints `export GREEDY_SESSION=SOCKET`.
fn start_session(cfg: &JobConfig, rt: &tokio::runtime::Runtime) -> i32 {
    let parent = greedy_launcher::session::socket_parent();
    let dir = match greedy_pmix::pmix::private_dir(&parent, "greedy-session.") {
        Ok(d) => d,
        Err(e) => {
            eprintln!(
                "greedyrun: a directory for the session in {}: {e}",
                parent.display()
            );
            return code::LAUNCHER;
        }
    };
    let (socket, log) = (dir.join("control"), dir.join("session.log"));
    let spawned = std::fs::File::create(&log).and_then(|out| {
        let err = out.try_clone()?;
        std::process::Command::new(std::env::current_exe()?)
            .args(std::env::args_os().skip(1))
            .env(SERVE_VAR, &socket)
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
    });
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            eprintln!("greedyrun: starting the session: {e}");
            return code::LAUNCHER;
        }
    };
    let hosts = cfg.plan.hosts.len();
    let deadline = std::time::Instant::now() + cfg.plan.timeout + Duration::from_secs(5);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            // The log holds what the session's agents and remote shells said.
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            for line in text.lines() {
                eprintln!("{}", greedy_launcher::terminal::escape(line));
            }
            eprintln!("greedyrun: the session ended as it started ({status})");
            return code::LAUNCHER;
        }
        if let Some((up, lost)) = rt.block_on(tasks::session_hosts(&socket))
            && up + lost >= hosts
        {
            if lost > 0 {
                eprintln!(
                    "greedyrun: {lost} of {hosts} hosts lost as the session started (see {})",
                    log.display()
                );
            }
            println!("export GREEDY_SESSION={}", socket.display());
            return 0;
        }
        if std::time::Instant::now() >= deadline {
            eprintln!(
                "greedyrun: the session's hosts were not up after {} s (see {})",
                cfg.plan.timeout.as_secs_f64(),
                log.display()
            );
            let _ = child.kill();
            return code::LAUNCH_TIMEOUT;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn main() {
    let args = Args::parse_from(mpirun_habits(std::env::args()));
    greedy_launcher::connect::raise_fd_limit();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("greedyrun: cannot start the runtime: {e}");
            std::process::exit(code::LAUNCHER);
        }
    };
    if let Some(exit) = session_client(&args, &rt) {
        rt.shutdown_timeout(Duration::from_millis(100));
        std::process::exit(exit);
    }
    let starting = args.start_session && std::env::var_os(SERVE_VAR).is_none();
    let attached = match session_job(&args, &rt) {
        Ok(a) => a,
        Err(exit) => std::process::exit(exit),
    };
    let (cfg, mode) = match job_config(args, attached.as_ref().map(|a| a.allocation())) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("greedyrun: {e:#}");
            std::process::exit(code::USAGE);
        }
    };
    if starting {
        let exit = start_session(&cfg, &rt);
        rt.shutdown_timeout(Duration::from_millis(100));
        std::process::exit(exit);
    }
    let exit = match mode {
        Mode::Calibrate => match rt.block_on(calibrate::calibrate(&cfg)) {
            Ok(c) => {
                println!(
                    "# greedyrun --calibrate on {} hosts ({} in the SEQ burst), rsh: {}",
                    cfg.plan.hosts.len(),
                    c.burst,
                    cfg.rsh[0]
                );
                println!("GREEDY_SEQ={:.4}", c.model.seq());
                println!("GREEDY_REM={:.4}", c.model.rem());
                0
            }
            Err(e) => {
                eprintln!("greedyrun: calibration: {e}");
                code::LAUNCHER
            }
        },
        Mode::Tasks(opts) => {
            let session = match &opts.source {
                Source::Session { socket, .. } => socket.parent().map(PathBuf::from),
                _ => None,
            };
            let exit = rt.block_on(tasks::run(cfg, opts)).exit_code;
            // A session that ended cleanly leaves nothing; otherwise its log stays.
            if exit == 0
                && let Some(dir) = session
                && dir
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("greedy-session."))
            {
                let _ = std::fs::remove_dir_all(dir);
            }
            exit
        }
        Mode::Job => match attached {
            Some(a) => rt.block_on(head::run_attached(cfg, a)).exit_code,
            None => rt.block_on(head::run(cfg)).exit_code,
        },
    };
    // Do not wait for the blocking stdin reader: it may sit in read() on a terminal.
    rt.shutdown_timeout(Duration::from_millis(100));
    std::process::exit(exit);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command line as the shell gives it to greedyrun, through to its job.
    fn parse(argv: &[&str]) -> anyhow::Result<(JobConfig, Mode)> {
        let argv = mpirun_habits(argv.iter().map(|s| s.to_string()));
        job_config(Args::try_parse_from(argv).unwrap(), None)
    }

    #[test]
    fn mpirun_single_dash_options() {
        let argv = ["greedyrun", "-np", "4", "-ppn", "2", "--", "prog", "-np"].map(String::from);
        assert_eq!(
            mpirun_habits(argv.into_iter()),
            ["greedyrun", "--np", "4", "--ppn", "2", "--", "prog", "-np"]
        );
        // The program's own arguments stay as they are, with or without `--`; option values
        // (two for -genv) are not taken for the program.
        let argv = [
            "greedyrun",
            "-ppn",
            "1",
            "-genv",
            "A",
            "B",
            "prog",
            "-np",
            "3",
        ];
        assert_eq!(
            mpirun_habits(argv.iter().map(|s| s.to_string())),
            [
                "greedyrun",
                "--ppn",
                "1",
                "--genv",
                "A",
                "B",
                "prog",
                "-np",
                "3"
            ]
        );
        let argv = ["greedyrun", "--tasks", "-", "-np", "2", "-n4", "x", "-ppn"];
        assert_eq!(
            mpirun_habits(argv.iter().map(|s| s.to_string())),
            ["greedyrun", "--tasks", "-", "--np", "2", "-n4", "x", "-ppn"]
        );
        // Parsl's MPI prefix (`mpiexec -n N -ppn P -hosts h1,h2`) and Open MPI's `-host`.
        let (cfg, _) = parse(&[
            "greedyrun",
            "-n",
            "4",
            "-ppn",
            "2",
            "-hosts",
            "a,b",
            "--",
            "x",
        ])
        .expect("Parsl's prefix");
        assert_eq!(cfg.plan.hosts, ["a", "b"]);
        let (cfg, _) = parse(&["greedyrun", "-np", "3", "-host", "a,a,b", "--", "x"])
            .expect("Open MPI's -host");
        assert_eq!(
            cfg.plan.ranks.iter().map(Vec::len).collect::<Vec<_>>(),
            [2, 1]
        );
    }

    #[test]
    fn args_become_a_plan_or_exit_2() {
        let (cfg, cal) = parse(&[
            "greedyrun",
            "-np",
            "4",
            "-H",
            "a,b",
            "--ppn",
            "2",
            "--",
            "hostname",
        ])
        .unwrap();
        assert!(matches!(cal, Mode::Job));
        assert_eq!(cfg.plan.hosts, ["a", "b"]);
        assert_eq!(cfg.stdin_rank, Some(0));
        assert!(
            cfg.rsh
                .contains(&"-oKexAlgorithms=^curve25519-sha256".to_string())
        );
        let e = parse(&["greedyrun", "-n", "2", "--", "x"]).unwrap_err();
        assert!(e.to_string().contains("no hosts"));
        let (cfg, _) = parse(&["greedyrun", "-H", "a", "--pmi", "pmix", "--", "x"]).unwrap();
        assert_eq!(cfg.plan.pmi, PmiMode::Pmix);
        let e = parse(&["greedyrun", "-H", "a", "--stdin", "3", "--", "x"]).unwrap_err();
        assert!(e.to_string().contains("only 1 ranks"));
        let e = parse(&["greedyrun", "-H", "a", "--rem", "0", "--", "x"]).unwrap_err();
        assert!(e.to_string().contains("launch model"), "{e}");
    }

    #[test]
    fn mpmd_parts_number_ranks_across_programs() {
        let (cfg, _) = parse(&[
            "greedyrun",
            "-H",
            "a:4,b:4",
            "-n",
            "2",
            "./a",
            "x",
            ":",
            "-np",
            "6",
            "./b",
        ])
        .unwrap();
        assert_eq!(cfg.plan.n_ranks, 8);
        let apps: Vec<_> = cfg
            .plan
            .apps
            .iter()
            .map(|a| (a.first_rank, a.argv.join(" ")))
            .collect();
        assert_eq!(apps, [(0, "./a x".to_string()), (2, "./b".to_string())]);
        for bad in [
            &["greedyrun", "-H", "a:4", "./a", ":", "-n", "2", "./b"][..],
            &["greedyrun", "-H", "a:4", "-n", "1", "./a", ":", "./b"],
            &[
                "greedyrun",
                "-H",
                "a:4",
                "-n",
                "1",
                "./a",
                ":",
                "-n",
                "0",
                "./b",
            ],
            &[
                "greedyrun",
                "-H",
                "a:4",
                "-n",
                "1",
                "./a",
                ":",
                "-n",
                "x",
                "./b",
            ],
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains("MPMD"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn environment_and_working_directory_options_as_mpirun_hydra_and_srun() {
        let (cfg, _) = parse(&[
            "greedyrun",
            "-H",
            "a",
            "-genvnone",
            "-x",
            "FOO=1",
            "-genv",
            "BAR",
            "two words",
            "-wdir",
            "/w",
            "--",
            "prog",
        ])
        .unwrap();
        assert_eq!(
            cfg.env,
            [
                ("FOO".into(), "1".into()),
                ("BAR".into(), "two words".into())
            ]
        );
        assert_eq!(cfg.cwd, "/w");
        let (cfg, _) = parse(&["greedyrun", "-H", "a", "--export", "NONE", "--", "prog"]).unwrap();
        assert!(cfg.env.is_empty());
        // By default everything is passed on (PATH is set wherever cargo runs tests).
        let (cfg, _) = parse(&["greedyrun", "-H", "a", "--chdir", "sub", "--", "prog"]).unwrap();
        assert!(cfg.env.iter().any(|(k, _)| k == "PATH"));
        assert!(
            cfg.cwd.ends_with("/sub") && cfg.cwd.starts_with('/'),
            "{}",
            cfg.cwd
        );
        let e = parse(&["greedyrun", "-H", "a", "-x", "9X", "--", "prog"]).unwrap_err();
        assert!(e.to_string().contains("-x \"9X\""), "{e}");
    }

    #[test]
    fn charm_drops_matching_plus_p_and_refuses_others() {
        let charm = |p: &str| {
            let v = [
                "greedyrun",
                "-H",
                "a:2",
                "--pmi",
                "charm",
                "--",
                "py",
                "t.py",
                p,
            ];
            job_config(
                Args::try_parse_from(mpirun_habits(v.iter().map(|s| s.to_string()))).unwrap(),
                None,
            )
        };
        let (cfg, _) = charm("+p2").unwrap();
        assert_eq!(cfg.plan.pmi, PmiMode::Charm);
        assert_eq!(cfg.plan.apps[0].argv, ["py", "t.py"]);
        let e = charm("+p4").unwrap_err();
        assert!(e.to_string().contains("greedy starts 2 processes"), "{e}");
    }

    #[test]
    fn tasks_take_no_program_and_serve_no_wireup() {
        let (cfg, mode) = parse(&[
            "greedyrun",
            "-H",
            "a:3,b",
            "--tasks",
            "-",
            "--results",
            "r.json",
            "--task-retries",
            "2",
            "--task-cores",
            "2",
        ])
        .unwrap();
        let Mode::Tasks(opts) = mode else {
            panic!("{mode:?}")
        };
        assert!(matches!(opts.source, Source::Stdin), "{:?}", opts.source);
        assert_eq!(opts.retries, 2);
        assert_eq!((opts.defaults.ranks, opts.defaults.cores_per_rank), (1, 2));
        assert_eq!(opts.results, ResultsFile::New(PathBuf::from("r.json")));
        assert_eq!(cfg.plan.pmi, PmiMode::None);
        assert_eq!(cfg.stdin_rank, None);
        // The plan's ranks are the slots.
        assert_eq!(
            cfg.plan.ranks.iter().map(Vec::len).collect::<Vec<_>>(),
            [3, 1]
        );
        let e = parse(&["greedyrun", "-H", "a", "--tasks", "f", "--", "prog"]).unwrap_err();
        assert!(e.to_string().contains("give no program"), "{e}");
        let (_, mode) = parse(&["greedyrun", "-H", "a,b", "--start-session"]).unwrap();
        assert!(
            matches!(mode, Mode::Job),
            "started by main, not job_config: {mode:?}"
        );
    }
}
