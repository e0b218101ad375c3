//! The C entry points Slurm's MPI plugin loader looks up (`syms[]` in
//! src/common/slurm_mpi.c:75-85@slurm-22-05-8-1): thin trampolines from the C ABI into
//! [`crate::srun`] and [`crate::agent`], through greedy-sys. Each catches panics
//! ([`greedy_slurm::guard::catch`]) and returns Slurm's error value with a logged reason:
//! slurmstepd, slurmd, slurmctld and srun all load this library.
//!
//! Who calls what (research/slurm-plugin-api.md §1.3): srun `client_prelaunch` and
//! `client_fini`; slurmstepd (root) `slurmstepd_prefork` once per node before forking tasks;
//! each forked task (job uid, just before exec) `slurmstepd_task`; everyone `init`/`fini`.

// The exports are found by name (dlsym), not by Rust paths; `pub` keeps that obvious.
#![allow(unreachable_pub)]

use crate::agent::{self, Agent, Hooks, RankSlot, TaskRecord, TaskTable};
use crate::attach::Attached;
use crate::config::MpiConfig;
use crate::plan::{self, StepPlan};
use crate::srun::Client;
use greedy_slurm::guard;
use greedy_sys::raw::slurm::{
    SLURM_ERROR, SLURM_SUCCESS, VERSION_NUMBER, mpi_step_info_t, mpi_task_info_t, stepd_step_rec_t,
};
use greedy_sys::slurm::{self, Env, log};
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock};

/// `plugin_name`: free text shown in logs.
#[unsafe(no_mangle)]
pub static plugin_name: [u8; 31] = *b"mpi greedy (tree PMI wire-up)\0\0";

/// `plugin_type`: `mpi/NAME`, selected by `--mpi=greedy` or `MpiDefault=greedy`.
#[unsafe(no_mangle)]
pub static plugin_type: [u8; 11] = *b"mpi/greedy\0";

/// `plugin_version`: must equal the loader's SLURM_VERSION_NUMBER exactly (plugin.c).
#[unsafe(no_mangle)]
pub static plugin_version: u32 = VERSION_NUMBER;
greedy_sys::refuse_other_release!("mpi/greedy", plugin_version);

/// `plugin_id`: travels in the launch RPC; unique among MPI plugins ([`crate::PLUGIN_ID`]).
#[unsafe(no_mangle)]
pub static plugin_id: u32 = crate::PLUGIN_ID;

/// This stepd's agent, from `prefork` to `fini`.
static AGENT: Mutex<Option<Agent>> = Mutex::new(None);
/// A spawned step's stepd: its tasks' hold on the parent step's service, until `fini`.
static ATTACHED: Mutex<Option<Attached>> = Mutex::new(None);
/// What the task hook reads after fork: set once in `prefork`, never locked.
static TASKS: OnceLock<TaskTable> = OnceLock::new();

/// The token `client_prelaunch` returns (NULL would mean failure).
struct State(Client);

fn sink(level: tracing::Level, text: &str) {
    match level {
        tracing::Level::ERROR | tracing::Level::WARN => log::error(text),
        tracing::Level::INFO => log::verbose(text),
        _ => log::debug(text),
    }
}

/// Cheap: slurmd and slurmctld load every MPI plugin at start, so nothing happens here.
#[unsafe(no_mangle)]
pub extern "C" fn init() -> c_int {
    SLURM_SUCCESS
}

/// slurmstepd's teardown (after every task was reaped): stops this node's service.
#[unsafe(no_mangle)]
pub extern "C" fn fini() -> c_int {
    guard::catch("mpi/greedy fini", SLURM_SUCCESS, log::error, || {
        let agent = AGENT.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(agent) = agent {
            agent.shutdown();
        }
        let attached = ATTACHED.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(attached) = attached {
            attached.shutdown();
        }
        SLURM_SUCCESS
    })
}

/// srun, after the step is created and before the launch RPC: plans the step and puts the
/// private variables into the launch env.
#[unsafe(no_mangle)]
pub extern "C" fn mpi_p_client_prelaunch(
    info: *const mpi_step_info_t,
    env: *mut *mut *mut c_char,
) -> *mut c_void {
    guard::catch(
        "mpi/greedy client_prelaunch",
        std::ptr::null_mut(),
        log::error,
        || {
            logging_on();
            // SAFETY: `info` is the hook's argument, live for the call (slurm_mpi.c).
            let Some(layout) = (unsafe { slurm::client_step_layout(info) }) else {
                log::error("mpi/greedy: srun passed no step layout");
                return std::ptr::null_mut();
            };
            let cfg = match MpiConfig::load_from_env() {
                Ok(cfg) => cfg,
                Err(e) => {
                    log::error(&format!("mpi/greedy: {e}"));
                    return std::ptr::null_mut();
                }
            };
            let user = std::env::var(plan::USER_PROTOCOL).ok();
            let resv = std::env::var_os("SLURM_STEP_RESV_PORTS").is_some();
            let argv: Vec<String> = std::env::args().skip(1).collect();
            let kill_step = Arc::new(|job, step| slurm::kill_job_step(job, step, 9));
            let prelaunch = Client::prelaunch(&layout, &cfg, user.as_deref(), resv, kill_step);
            let (client, vars) = match prelaunch {
                Ok(x) => x,
                Err(e) => {
                    log::error(&format!("mpi/greedy: {e}"));
                    return std::ptr::null_mut();
                }
            };
            // A nested step (a rank's spawn): Slurm has created it; its spawner answers the
            // rank now.
            if let Err(e) = crate::nested::tell_spawner() {
                log::error(&format!("mpi/greedy: {e}"));
                return std::ptr::null_mut();
            }
            let charm = vars
                .iter()
                .any(|(k, v)| *k == plan::VAR_PROTOCOL && v == "charm");
            let n_ranks = layout.ranks.iter().map(Vec::len).sum::<usize>() as u32;
            if charm && let Err(e) = plan::check_charm_args(&argv, n_ranks) {
                log::error(&format!("mpi/greedy: {e}"));
                return std::ptr::null_mut();
            }
            // SAFETY: `env` is the hook's `char ***env` (a fresh xmalloc'd array, step_launch.c),
            // used only by this thread during the call.
            let Some(mut env) = (unsafe { Env::from_raw(env) }) else {
                log::error("mpi/greedy: srun passed no env");
                return std::ptr::null_mut();
            };
            for (k, v) in &vars {
                if !env.set(k, v) {
                    log::error(&format!("mpi/greedy: could not set {k} in the launch env"));
                    return std::ptr::null_mut();
                }
            }
            Box::into_raw(Box::new(State(client))).cast::<c_void>()
        },
    )
}

/// srun, after every task ended: stops the listener and returns the job's exit code when a
/// node reported one (srun exits with it, srun.c:215-227@22.05.8), else 0.
#[unsafe(no_mangle)]
pub extern "C" fn mpi_p_client_fini(state: *mut c_void) -> c_int {
    guard::catch("mpi/greedy client_fini", SLURM_ERROR, log::error, || {
        if state.is_null() {
            return SLURM_SUCCESS;
        }
        // SAFETY: a non-NULL state is the Box `client_prelaunch` leaked, handed back once.
        let state = unsafe { Box::from_raw(state.cast::<State>()) };
        match state.0.fini() {
            Some(report) => {
                log::error(&format!(
                    "mpi/greedy: job ended with exit code {}: {}",
                    report.code, report.reason
                ));
                report.code
            }
            None => SLURM_SUCCESS,
        }
    })
}

/// slurmstepd (root), once per node before the tasks are forked: reads slurmstepd's record
/// of the step and the plan from the job env, removes the private variables from it, and
/// starts this node's service. Root acts on the record only: an env that contradicts it (a
/// user's srun can send any) is refused.
#[unsafe(no_mangle)]
pub extern "C" fn mpi_p_slurmstepd_prefork(
    step: *const stepd_step_rec_t,
    env: *mut *mut *mut c_char,
) -> c_int {
    guard::catch(
        "mpi/greedy slurmstepd_prefork",
        SLURM_ERROR,
        log::error,
        || {
            logging_on();
            // SAFETY: the hook's arguments, live for the call: `step` is slurmstepd's record and
            // `env` is `&step->env` (mgr.c); only read here.
            let stepd = match unsafe { slurm::step_record(step, env) } {
                Ok(r) => r,
                Err(e) => {
                    log::error(&format!("mpi/greedy: {e}"));
                    return SLURM_ERROR;
                }
            };
            // SAFETY: `env` is `&job->env`, the stepd's job env, used by this thread only while
            // the hook runs (mgr.c).
            let Some(mut env) = (unsafe { Env::from_raw(env) }) else {
                log::error("mpi/greedy: prefork got no env");
                return SLURM_ERROR;
            };
            let plan = StepPlan::new(&stepd, |k| env.get(k));
            if let Err(e) = &plan {
                log::error(&format!("mpi/greedy: {e}"));
                agent::report_refusal(&stepd, |k| env.get(k), e.to_string());
            }
            for var in plan::PRIVATE_VARS {
                env.unset(var);
            }
            let Ok(plan) = plan else {
                return SLURM_ERROR;
            };
            // One line per node and step at info level: which rendezvous and protocol a step used
            // is the first question when one fails.
            log::info(&format!("mpi/greedy: {}", plan.describe()));
            let hooks = Hooks {
                node_addr: Box::new(slurm::conf_get_address),
                kill_step: Arc::new(|job, step| slurm::kill_job_step(job, step, 9)),
            };
            let mut slot = AGENT.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_some() || TASKS.get().is_some() {
                log::error("mpi/greedy: prefork called twice in one slurmstepd");
                return SLURM_ERROR;
            }
            // A spawned PMIx step's tasks are served by the parent step's stepd.
            let started = match &plan.attach {
                Some(attach) => Attached::start(&plan, attach).map(|(attached, tasks)| {
                    *ATTACHED.lock().unwrap_or_else(|p| p.into_inner()) = Some(attached);
                    tasks
                }),
                None => Agent::start(&plan, &hooks).map(|(agent, tasks)| {
                    *slot = Some(agent);
                    tasks
                }),
            };
            match started {
                Ok(tasks) => {
                    let _ = TASKS.set(tasks);
                    SLURM_SUCCESS
                }
                Err(e) => {
                    log::error(&format!("mpi/greedy: {e}"));
                    SLURM_ERROR
                }
            }
        },
    )
}

/// Each forked task (job uid, just before exec): its own PMI variables and socket.
#[unsafe(no_mangle)]
pub extern "C" fn mpi_p_slurmstepd_task(
    info: *const mpi_task_info_t,
    env: *mut *mut *mut c_char,
) -> c_int {
    guard::catch(
        "mpi/greedy slurmstepd_task",
        SLURM_ERROR,
        log::error,
        || {
            // SAFETY: the hook's argument, live for the call (task.c).
            let Some(task) = (unsafe { slurm::task_info(info) }) else {
                log::error("mpi/greedy: task hook got no task info");
                return SLURM_ERROR;
            };
            let rank = task.gtaskid;
            let Some((tasks, slot)) = task_slot(rank) else {
                return SLURM_ERROR;
            };
            // SAFETY: `env` is `&job->env` in this freshly forked, single-threaded task.
            let Some(mut env) = (unsafe { Env::from_raw(env) }) else {
                return SLURM_ERROR;
            };
            if !prepare_task(rank, slot, &mut env) {
                return SLURM_ERROR;
            }
            // SAFETY: slurmstepd put the task's stdio on fds 0-2 before this hook
            // (mgr.c `prepare_stdio` precedes `exec_task`); they stay open during the call.
            let fds = [0, 1, 2].map(|fd| unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) });
            // Without it a Charm++ rank's prints would vanish: fail the task instead.
            if let Err(e) = tasks.send_stdio(rank, fds) {
                log::error(&format!(
                    "mpi/greedy: rank {rank}: handing its stdio to the agent: {e}"
                ));
                return SLURM_ERROR;
            }
            run_watched(tasks, rank);
            SLURM_SUCCESS
        },
    )
}

/// The task table and `rank`'s slot in it, if this node serves `rank` and the task runs as
/// the uid slurmstepd's record gave prefork; else logs why not.
fn task_slot(rank: u32) -> Option<(&'static TaskTable, &'static RankSlot)> {
    let Some((tasks, slot)) = TASKS.get().and_then(|t| Some((t, t.ranks.get(&rank)?))) else {
        log::error(&format!(
            "mpi/greedy: rank {rank} has no PMI socket on this node"
        ));
        return None;
    };
    let uid = slurm::effective_uid();
    if tasks.job_uid != uid {
        log::error(&format!(
            "mpi/greedy: rank {rank} runs as uid {uid}, not the uid slurmstepd's record \
             gave prefork: this mpi_greedy.so misreads Slurm {}'s step record",
            greedy_sys::raw::slurm::VERSION
        ));
        return None;
    }
    Some((tasks, slot))
}

/// Puts `slot`'s variables into the task's `env` (its defaults only where the user set
/// none) and keeps its PMI socket across exec; false if the task must fail.
fn prepare_task(rank: u32, slot: &RankSlot, env: &mut Env) -> bool {
    for (k, v) in &slot.env {
        if !env.set(k, v) {
            return false;
        }
    }
    for (k, v) in &slot.defaults {
        if env.get(k).is_none() && !env.set(k, v) {
            return false;
        }
    }
    // A step that does not serve PMI has no socket of ours.
    if let Some(fd) = slot.fd
        && let Err(e) = slurm::keep_across_exec(fd)
    {
        log::error(&format!("mpi/greedy: rank {rank}: PMI socket {fd}: {e}"));
        return false;
    }
    true
}

/// Tells the agent the task was forked, waits for PMIx's registration where the step serves
/// PMIx, and forks the program under an exit watcher; returns only if that fork failed.
fn run_watched(tasks: &TaskTable, rank: u32) {
    // Losing either only delays noticing a dead rank until the fence timeout.
    let _ = tasks.forked(rank);
    // A PMIx client reads its job's data as soon as it connects: not before PMIx
    // has it (past the limit the task goes, and its PMIx_Init fails visibly).
    if !tasks.wait_registered() {
        log::error(&format!(
            "mpi/greedy: rank {rank}: started before PMIx registered the job"
        ));
    }
    // The child execs the program; this process watches it and never returns.
    let record = |code| TaskRecord::Exited(rank, code).encode();
    if let Err(e) = slurm::watch_exec(tasks.notify_fd(), record) {
        log::error(&format!("mpi/greedy: rank {rank}: no exit watcher: {e}"));
    }
}

/// No options for Slurm's parser: srun reads mpi/greedy's `Greedy*` keys from mpi.conf itself
/// (Slurm hands mpi.conf only to the daemons), and other plugins' parsers skip unknown keys.
#[unsafe(no_mangle)]
pub extern "C" fn mpi_p_conf_options(opts: *mut *mut c_void, cnt: *mut c_int) {
    if !opts.is_null() && !cnt.is_null() {
        // SAFETY: both checked non-NULL; they are the caller's out-variables.
        unsafe {
            *opts = std::ptr::null_mut();
            *cnt = 0;
        }
    }
}

/// Nothing to take from Slurm's parse (`tbl` is NULL without options).
#[unsafe(no_mangle)]
pub extern "C" fn mpi_p_conf_set(_tbl: *mut c_void) {}

/// No table to send to slurmstepd: the step's settings travel in its environment.
#[unsafe(no_mangle)]
pub extern "C" fn mpi_p_conf_get() -> *mut c_void {
    std::ptr::null_mut()
}

/// slurmctld, for `scontrol show config`: mpi/greedy's keys in mpi.conf with the values in
/// effect (defaults included). A faulty file is logged and shown as `GreedyConfigError`.
#[unsafe(no_mangle)]
pub extern "C" fn mpi_p_conf_get_printable() -> *mut c_void {
    guard::catch(
        "mpi/greedy conf_get_printable",
        std::ptr::null_mut(),
        log::error,
        || {
            let pairs = match MpiConfig::load_from_env() {
                Ok(cfg) => cfg.printable(),
                Err(e) => {
                    log::error(&format!("mpi/greedy: {e}"));
                    vec![("GreedyConfigError", e.to_string())]
                }
            };
            slurm::config_key_pairs(&pairs)
        },
    )
}

fn logging_on() {
    crate::logging::install(sink);
}
