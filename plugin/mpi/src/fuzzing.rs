//! The bodies of the cargo-fuzz targets in `fuzz/`, one function per target, so that the fuzz
//! binaries and the stable corpus replay (`tests/fuzz_corpus.rs`) run the same checks. Each
//! takes arbitrary bytes and panics only when an invariant of the code under test breaks.

use std::path::Path;
use std::time::Duration;

use greedy_slurm::conf;

use crate::agent::TaskRecord;
use crate::charm::decode_stdio_record;
use crate::config::MpiConfig;
use crate::plan::{self, StepLayout, StepPlan, StepRecord};
use crate::rendezvous::{self, Line};

/// A fuzz target: the name of its binary and corpus directory, and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target of this crate.
pub const TARGETS: &[Target] = &[
    ("rendezvous_line", rendezvous_line),
    ("step_plan", step_plan),
    ("task_record", task_record),
    ("stdio_record", stdio_record),
    ("mpi_conf", mpi_conf),
];

/// A line srun's listener (or a stepd) reads: no panic; what parses prints back to a line that
/// parses the same; a MAC check of any text is false, never a panic.
pub fn rendezvous_line(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(line) = rendezvous::parse(text) else {
        return;
    };
    assert_eq!(rendezvous::parse(&line.to_string()).as_ref(), Ok(&line));
    let secret = &greedy_pmix::JobSecret::from_bytes(b"0123456789abcdef").expect("16 bytes");
    let checked = match &line {
        Line::Publish(node, addr, mac) | Line::Answer(node, addr, mac) => {
            rendezvous::verify(secret, "1.0", *node, addr, mac)
        }
        Line::Exit(report, mac) => {
            rendezvous::verify(secret, "1.0", report.node, &report.signed_text(), mac)
        }
        Line::Watch(node, mac) => rendezvous::verify(secret, "1.0", *node, &"watch", mac),
        Line::Lookup(node, mac) => rendezvous::verify_lookup(secret, "1.0", *node, mac),
        Line::Spawn(node, hex, mac) => {
            let statement = rendezvous::spawn_statement(hex);
            rendezvous::verify(secret, "1.0", *node, &statement, mac)
        }
        Line::Created(..) => false,
        Line::Add(node, seq, mac, hex) => {
            let statement = rendezvous::add_statement(*seq, hex);
            rendezvous::verify(secret, "1.0", *node, &statement, mac)
        }
        Line::Added(node, seq, result, mac) => {
            let statement = rendezvous::added_statement(*seq, result);
            rendezvous::verify(secret, "1.0", *node, &statement, mac)
        }
        Line::Spawned(node, result, mac) => {
            let statement = rendezvous::spawned_statement(result);
            rendezvous::verify(secret, "1.0", *node, &statement, mac)
        }
    };
    assert!(!checked, "a MAC without the secret verified: {line:?}");
}

/// The variables [`step_plan`] fills, one input line each, in this order (fewer lines: the
/// rest are unset). The first line is the node's name in slurmstepd's record; [`RECORD_LINE`]
/// the rest of that record.
const PLAN_VARS: [&str; 12] = [
    "node name",
    plan::VAR_JOB,
    plan::VAR_HOSTS,
    plan::VAR_RANKS,
    plan::VAR_SECRET,
    plan::VAR_MODEL,
    plan::VAR_PROTOCOL,
    plan::VAR_RENDEZVOUS,
    plan::VAR_SRUN,
    "SLURM_SRUN_COMM_HOST",
    plan::VAR_TIMEOUTS,
    "SLURM_STEP_RESV_PORTS",
];

/// The line after [`PLAN_VARS`]: `JOB STEP NNODES NTASKS NODEID NODE_TASKS` of slurmstepd's
/// record. Without it the record agrees with the env where the env can be read, so inputs
/// reach the plan's later checks.
const RECORD_LINE: usize = PLAN_VARS.len();

/// slurmstepd's record for [`step_plan`]: from [`RECORD_LINE`], else what the env says.
fn fuzz_record(values: &[&str]) -> StepRecord {
    let line = |i: usize| values.get(i).copied().unwrap_or("");
    let nums: Vec<u32> = line(RECORD_LINE)
        .split(' ')
        .filter_map(|n| n.parse().ok())
        .collect();
    let (job, step) = line(1)
        .split_once('.')
        .and_then(|(j, s)| Some((j.parse().ok()?, s.parse().ok()?)))
        .unwrap_or((0, 0));
    let hosts =
        greedy_tree::hostlist::expand_at_most(line(2), greedy_tree::fuzzing::FUZZ_MAX_HOSTS)
            .unwrap_or_default();
    let ranks = plan::decode_ranks(line(3), 1 << 16).unwrap_or_default();
    let node_name = line(0).to_string();
    let nodeid = hosts.iter().position(|h| *h == node_name).unwrap_or(0);
    let derived = [
        job,
        step,
        hosts.len() as u32,
        ranks.iter().map(Vec::len).sum::<usize>() as u32,
        nodeid as u32,
        ranks.get(nodeid).map_or(0, Vec::len) as u32,
    ];
    let n = |i: usize| nums.get(i).copied().unwrap_or(derived[i]);
    StepRecord {
        job_id: n(0),
        step_id: n(1),
        nnodes: n(2),
        ntasks: n(3),
        nodeid: n(4),
        node_tasks: n(5),
        uid: 1000,
        gid: 1000,
        node_name,
        het: None,
    }
}

/// slurmstepd's record and a stepd's `GREEDY_MPI_*` environment (one value per line,
/// [`PLAN_VARS`] order, then [`RECORD_LINE`]): a plan or an error, never a panic; a plan
/// agrees with the record, its indices are in range, everything prefork derives from it can
/// be computed, and its rank lists survive the trip through the launch env's text form.
pub fn step_plan(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let values: Vec<&str> = text.split('\n').collect();
    let get = |var: &str| {
        let i = PLAN_VARS[1..].iter().position(|v| *v == var)? + 1;
        values.get(i).map(|v| v.to_string())
    };
    // A legal list of 2^24 hosts takes seconds to expand; the hostlist target fuzzes expansion,
    // here lists past the tree targets' cap are skipped so the plan logic gets the executions.
    if let Some(hosts) = get(plan::VAR_HOSTS)
        && greedy_tree::hostlist::expand_at_most(&hosts, greedy_tree::fuzzing::FUZZ_MAX_HOSTS)
            .is_err()
    {
        return;
    }
    let record = fuzz_record(&values);
    if record.nnodes as usize > greedy_tree::fuzzing::FUZZ_MAX_HOSTS {
        return;
    }
    let Ok(step) = StepPlan::new(&record, get) else {
        return;
    };
    assert_eq!((step.job_id, step.step_id), (record.job_id, record.step_id));
    assert_eq!(step.node_idx, record.nodeid as usize);
    assert!(step.node_idx < step.hosts.len() && step.ranks.len() == step.hosts.len());
    assert_eq!(step.hosts.len(), record.nnodes as usize);
    let _ = (step.describe(), step.parent(), &step.secret);
    let _ = step.job_spec().validate();
    let ranks = plan::decode_ranks(&plan::encode_ranks(&step.ranks), record.ntasks as usize)
        .expect("own ranks decode");
    assert_eq!(ranks, step.ranks);
}

/// The task hooks' records as the agent's watcher reads them: every record read encodes back
/// to the bytes it was read from (a fork record's all-zero CPUs read as unknown, and unknown
/// encodes as all zero).
pub fn task_record(data: &[u8]) {
    let mut rest = data;
    loop {
        let before = rest;
        let Ok(record) = TaskRecord::read_from(&mut rest) else {
            return;
        };
        let read = &before[..before.len() - rest.len()];
        assert_eq!(record.encode().as_ref(), read);
    }
}

/// A task hook's stdio record as received (byte 0: descriptors received in bits 0–2, cut in bit
/// 3; the rest: the datagram's bytes): a rank exactly when 4 whole bytes came with 3
/// descriptors, the rank [`crate::charm::send_stdio`] sent.
pub fn stdio_record(data: &[u8]) {
    let Some((&meta, bytes)) = data.split_first() else {
        return;
    };
    let (fds, cut) = (usize::from(meta & 7), meta & 8 != 0);
    let rank = decode_stdio_record(bytes, cut, fds);
    assert_eq!(rank.is_ok(), bytes.len() == 4 && !cut && fds == 3);
    if let Ok(rank) = rank {
        assert_eq!(rank.to_le_bytes(), bytes);
    }
}

/// mpi.conf as srun reads it: a configuration or one error naming the line, never a panic; an
/// accepted configuration prints (`scontrol show config`) to text that reads back to the same
/// printout, and its values, sent to every stepd in the launch env, are accepted there.
pub fn mpi_conf(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("mpi.conf");
    let Ok(cfg) = MpiConfig::from_conf(&conf::parse(text), path) else {
        return;
    };
    let printed: String = cfg
        .printable()
        .iter()
        .map(|(k, v)| format!("{k}={v}\n"))
        .collect();
    let again = MpiConfig::from_conf(&conf::parse(&printed), path).expect("printout reads back");
    assert_eq!(again.printable(), cfg.printable());

    let layout = StepLayout {
        job_id: 7,
        step_id: 0,
        node_list: "n[1-2]".into(),
        ranks: vec![vec![0, 1], vec![2, 3]],
        het: None,
    };
    let protocol = cfg.protocol;
    let env = plan::prelaunch_env(
        &layout,
        &greedy_pmix::JobSecret::from_bytes(&[0xab; 16]).expect("16 bytes"),
        &cfg,
        protocol,
        4000,
        true,
    );
    let get = |k: &str| match k {
        "SLURM_SRUN_COMM_HOST" => Some("10.0.0.1".to_string()),
        _ => env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()),
    };
    let stepd = StepRecord {
        job_id: 7,
        step_id: 0,
        nnodes: 2,
        ntasks: 4,
        nodeid: 1,
        node_tasks: 2,
        uid: 1000,
        gid: 1000,
        node_name: "n2".into(),
        het: None,
    };
    let step = StepPlan::new(&stepd, get).expect("what srun accepts, a stepd accepts");
    let close =
        |a: Duration, b: Duration| a.abs_diff(b) <= Duration::from_micros(1).max(a / 1_000_000);
    assert!(close(step.join_timeout, cfg.join_timeout));
    assert!(close(step.fence_timeout, cfg.fence_timeout));
    assert!(close(step.shutdown_timeout, cfg.shutdown_timeout));
}
