//! Unit tests of the sans-I/O plan: slurmstepd's record and env in, plan out.

use super::*;
use greedy_pmix::family::Family;
use std::collections::HashMap;

fn stepd_env(extra: &[(&str, &str)]) -> HashMap<String, String> {
    let cfg = MpiConfig::default();
    let ranks = vec![vec![0, 1], vec![2, 3], vec![4]];
    let layout = StepLayout {
        job_id: 7,
        step_id: 2,
        node_list: "n[1-3]".into(),
        ranks,
        het: None,
    };
    let mut env: HashMap<String, String> = prelaunch_env(
        &layout,
        &greedy_pmix::JobSecret::from_bytes(&[0xab; 32]).unwrap(),
        &cfg,
        Protocol::Pmi,
        4567,
        true,
    )
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    env.insert("SLURM_SRUN_COMM_HOST".into(), "10.0.0.1".into());
    for (k, v) in extra {
        env.insert(k.to_string(), v.to_string());
    }
    env
}

/// slurmstepd's record of step 7.2 (3 nodes, 5 tasks: 2, 2, 1) on node `nodeid`.
fn record(nodeid: u32) -> StepRecord {
    StepRecord {
        job_id: 7,
        step_id: 2,
        nnodes: 3,
        ntasks: 5,
        nodeid,
        node_tasks: [2, 2, 1][nodeid as usize],
        uid: 1000,
        gid: 100,
        node_name: format!("n{}", nodeid + 1),
        het: None,
    }
}

fn plan_on(stepd: &StepRecord, env: &HashMap<String, String>) -> Result<StepPlan, String> {
    StepPlan::new(stepd, |k| env.get(k).cloned()).map_err(|e| e.to_string())
}

/// The plan of n2.
fn plan(env: &HashMap<String, String>) -> Result<StepPlan, String> {
    plan_on(&record(1), env)
}

#[test]
fn a_jobs_cpus_are_read_from_slurms_text() {
    assert_eq!(job_cpus("4(x5),2"), Some(22));
    assert_eq!(job_cpus("1"), Some(1));
    for bad in ["", "4(x)", "x", "4(x5", "4294967295(x2)"] {
        assert_eq!(job_cpus(bad), None, "{bad:?}");
    }
}

#[test]
fn ranks_round_trip_compactly() {
    let check = |ranks: Vec<Vec<u32>>, text: &str| {
        assert_eq!(encode_ranks(&ranks), text);
        assert_eq!(decode_ranks(text, MAX).unwrap(), ranks);
    };
    check(vec![vec![0, 1], vec![2, 3]], "0-1;2-3");
    check(vec![vec![0, 2, 4], vec![1, 3, 5]], "0,2,4;1,3,5");
    check(vec![vec![0], vec![1, 2, 3, 7]], "0;1-3,7");
    assert!(decode_ranks("3-1", MAX).is_err());
    assert!(decode_ranks("x", MAX).is_err());
    // The largest rank ends a range: encoding it must not overflow (it panicked in debug).
    check(
        vec![vec![u32::MAX, 0], vec![u32::MAX - 1, u32::MAX]],
        "4294967295,0;4294967294-4294967295",
    );
}

/// A cap above any test's rank count.
const MAX: usize = 1 << 24;

#[test]
fn a_few_bytes_of_ranges_cannot_allocate_gigabytes() {
    let huge = "0-16777215,".repeat(2);
    assert_eq!(decode_ranks(&huge[..11], MAX).unwrap()[0].len(), MAX);
    assert!(decode_ranks(&huge, MAX).unwrap_err().contains("more than"));
    assert!(decode_ranks("0-4294967295", MAX).is_err());
    assert!(decode_ranks("0-5", 5).unwrap_err().contains("more than 5"));
}

#[test]
fn timeouts_too_large_or_too_small_are_refused_not_a_panic() {
    for t in ["1e300,1,1", "1,1e-10,1", "1,1,nan", "1,1,-1", "1,1"] {
        let e = plan(&stepd_env(&[(VAR_TIMEOUTS, t)])).unwrap_err();
        assert!(e.contains("GREEDY_MPI_TIMEOUTS"), "{t}: {e}");
    }
}

#[test]
fn reserved_port_is_the_last() {
    assert_eq!(reserved_port("20001-20003"), Some(20003));
    assert_eq!(reserved_port("20001,20005"), Some(20005));
    assert_eq!(reserved_port("12000"), Some(12000));
    assert_eq!(reserved_port(""), None);
}

#[test]
fn stepd_finds_itself_and_srun() {
    let p = plan(&stepd_env(&[])).unwrap();
    assert_eq!((p.job_id, p.step_id, p.kvsname.as_str()), (7, 2, "7.2"));
    assert_eq!(p.node_idx, 1);
    assert_eq!(p.ranks[1], [2, 3]);
    assert_eq!(
        p.rendezvous,
        Rendezvous::Srun {
            addr: "10.0.0.1:4567".parse().unwrap()
        }
    );
    assert_eq!(p.srun, "10.0.0.1:4567".parse().unwrap());
    assert_eq!(p.join_timeout, Duration::from_secs(60));
    assert!(
        !p.describe().contains(&"ab".repeat(8)),
        "secret in the log line"
    );
    assert_eq!(
        p.describe(),
        "step 7.2 node n2 (1 of 3 nodes, 2 local ranks of 5), pmi, rendezvous srun 10.0.0.1:4567"
    );
}

#[test]
fn reserved_ports_win_and_the_node_is_slurmstepds() {
    let env = stepd_env(&[
        ("SLURM_STEP_RESV_PORTS", "20001-20003"),
        ("SLURM_TOPOLOGY_ADDR", "sw0.sw1.n1"),
    ]);
    let p = plan_on(&record(2), &env).unwrap();
    assert_eq!(p.rendezvous, Rendezvous::Ports { port: 20003 });
    assert_eq!((p.node_idx, p.node()), (2, "n3"));
}

/// The launch env comes from the user's srun; a root stepd acts on slurmstepd's record, and
/// an env that names another step, node count or task count is refused, not believed (a
/// user could otherwise have root kill another user's step on an abort).
#[test]
fn the_launch_env_cannot_name_another_step_user_or_size() {
    let e = plan(&stepd_env(&[(VAR_JOB, "4242.7")])).unwrap_err();
    assert_eq!(
        e,
        "n2: GREEDY_MPI_JOB=\"4242.7\" contradicts slurmstepd's record (step 7.2): refusing \
         the step"
    );
    let p = plan(&stepd_env(&[
        ("SLURM_JOB_UID", "0"),
        ("SLURM_JOB_GID", "0"),
    ]))
    .unwrap();
    assert_eq!(
        (p.job_uid, p.job_gid),
        (1000, 100),
        "uid and gid are the record's"
    );
    let e = plan(&stepd_env(&[("SLURM_STEP_RESV_PORTS", "510-513")])).unwrap_err();
    assert!(e.contains("port 513 is below 1024"), "{e}");
    // Sizes past the step's own are refused before they are expanded.
    let e = plan(&stepd_env(&[(VAR_HOSTS, "n[1-16777215]")])).unwrap_err();
    assert!(e.contains("GREEDY_MPI_HOSTS"), "{e}");
    let e = plan(&stepd_env(&[(VAR_RANKS, "0-16777215;2-3;4")])).unwrap_err();
    assert!(e.contains("more than 5 ranks"), "{e}");
    for (var, value) in [
        (VAR_HOSTS, "n[1-2]"),
        (VAR_HOSTS, "n[1,3,2]"),
        (VAR_RANKS, "0-1;2;3-4"),
        (VAR_RANKS, "0;1;2"),
    ] {
        let e = plan(&stepd_env(&[(var, value)])).unwrap_err();
        assert!(
            e.contains("contradicts slurmstepd's record"),
            "{var}={value}: {e}"
        );
    }
}

#[test]
fn faults_name_node_and_variable() {
    let mut stepd = record(1);
    stepd.node_name = "n9".into();
    assert_eq!(
        plan_on(&stepd, &stepd_env(&[])).unwrap_err(),
        "n9: GREEDY_MPI_HOSTS=\"n[1-3]\" contradicts slurmstepd's record (3 nodes, this one n9 \
         at index 1): refusing the step"
    );
    let mut env = stepd_env(&[]);
    env.remove(VAR_SECRET);
    assert_eq!(
        plan(&env).unwrap_err(),
        "n2: GREEDY_MPI_SECRET is not set (was the step started with --mpi=greedy?)"
    );
    env = stepd_env(&[(VAR_SECRET, "abcd")]);
    let e = plan(&env).unwrap_err();
    assert!(e.contains("<redacted>") && !e.contains("abcd"), "{e}");
    env = stepd_env(&[(VAR_RANKS, "0-1;2-3")]);
    assert!(
        plan(&env)
            .unwrap_err()
            .contains("5 tasks on 3 nodes, 2 on this one")
    );
    env = stepd_env(&[(VAR_RENDEZVOUS, "ports")]);
    assert!(plan(&env).unwrap_err().contains("no SLURM_STEP_RESV_PORTS"));
    env = stepd_env(&[
        (VAR_RENDEZVOUS, "ports"),
        ("SLURM_STEP_RESV_PORTS", "20005"),
    ]);
    let p = plan(&env).unwrap();
    assert_eq!(p.rendezvous, Rendezvous::Ports { port: 20005 });
    assert_eq!(
        p.srun,
        "10.0.0.1:4567".parse().unwrap(),
        "exit reports still go to srun"
    );
    env = stepd_env(&[(VAR_SRUN, "x")]);
    assert!(plan(&env).unwrap_err().contains("GREEDY_MPI_SRUN"));
    for (model, want) in [
        ("0.001;0.004", "expected SEQ,REM"),
        ("0.001,0", "at least 1 ns"),
    ] {
        let e = plan(&stepd_env(&[(VAR_MODEL, model)])).unwrap_err();
        assert!(
            e.starts_with("n2: GREEDY_MPI_MODEL=") && e.contains(want),
            "{e}"
        );
    }
}

#[test]
fn the_model_travels_as_seq_comma_rem() {
    // The text every stepd of a release reads: unchanged when the model became a type.
    let env = stepd_env(&[]);
    assert_eq!(env[VAR_MODEL], "0.001,0.004");
    assert_eq!(plan(&env).unwrap().model, MpiConfig::default().model);
}

#[test]
fn protocol_rule() {
    let r = Protocol::resolve;
    assert_eq!(r(None, Protocol::Auto), Ok(Protocol::Auto));
    assert_eq!(r(None, Protocol::Pmix), Ok(Protocol::Pmix));
    assert_eq!(r(Some("pmi2"), Protocol::Pmix), Ok(Protocol::Pmi));
    assert_eq!(r(Some(""), Protocol::Pmi), Ok(Protocol::Pmi));
    assert_eq!(r(Some("auto"), Protocol::Pmi), Ok(Protocol::Auto));
    assert!(
        r(Some("x"), Protocol::Pmi)
            .unwrap_err()
            .starts_with("SLURM_GREEDY_PROTOCOL=")
    );
    assert_eq!(Protocol::Auto.families(), Family::ALL);
    assert_eq!(Protocol::Pmix.families(), [Family::Pmix]);
}

#[test]
fn listener_rule() {
    let mut cfg = MpiConfig::default();
    assert!(rendezvous_through_srun(&cfg, false));
    assert!(!rendezvous_through_srun(&cfg, true));
    cfg.rendezvous = RendezvousChoice::Srun;
    assert!(rendezvous_through_srun(&cfg, true));
    cfg.rendezvous = RendezvousChoice::Ports;
    assert!(!rendezvous_through_srun(&cfg, false));
}

#[test]
fn every_protocol_reaches_the_stepd() {
    let r = Protocol::resolve;
    assert_eq!(r(Some("charm"), Protocol::Auto), Ok(Protocol::Charm));
    assert_eq!(r(Some("CHARM"), Protocol::Pmix), Ok(Protocol::Charm));
    assert_eq!(r(None, Protocol::Charm), Ok(Protocol::Charm));
    assert_eq!(r(Some("pmi"), Protocol::Charm), Ok(Protocol::Pmi));
    let env = stepd_env(&[(VAR_PROTOCOL, "charm")]);
    assert_eq!(plan(&env).unwrap().protocol, Protocol::Charm);
    let env = stepd_env(&[(VAR_PROTOCOL, "auto")]);
    assert_eq!(plan(&env).unwrap().protocol, Protocol::Auto);
    let env = stepd_env(&[(VAR_PROTOCOL, "pmi3")]);
    assert!(
        plan(&env)
            .unwrap_err()
            .contains("expected auto, pmi, pmix or charm")
    );
}

#[test]
fn charm_steps_refuse_charmrun_process_options() {
    let check = |argv: &str| {
        let argv: Vec<String> = argv.split_whitespace().map(String::from).collect();
        check_charm_args(&argv, 8)
    };
    assert_eq!(check("-n8 --mpi=greedy python3 prog.py +ppn 1 x"), Ok(()));
    // srun cannot remove a word from the command line, so even the matching count is refused.
    let e = check("-n8 python3 prog.py +p8").unwrap_err();
    assert!(
        e.starts_with("+p8: srun passes it") && e.contains("srun -n 8"),
        "{e}"
    );
    let e = check("-n8 python3 prog.py +p2").unwrap_err();
    assert!(
        e.contains("greedy starts 8 processes") && e.contains("with srun, drop it"),
        "{e}"
    );
    assert!(
        check("-n8 python3 prog.py ++local")
            .unwrap_err()
            .contains("++local")
    );
}

/// srun's launch env of het step 40.0 (het job 40): component 0 is `-w n3 -n2`, component 1
/// `-w n[1-2] -n3` (ranks 2-4), and srun sorted the node list, so n3 (component 0) is last.
fn het_env() -> HashMap<String, String> {
    let layout = StepLayout {
        job_id: 41,
        step_id: 0,
        node_list: "n[1-3]".into(),
        ranks: het_ranks(),
        het: Some(HetClient {
            het_job_id: 40,
            task_offset: 2,
        }),
    };
    let cfg = MpiConfig::default();
    let secret = greedy_pmix::JobSecret::from_bytes(&[0xab; 32]).unwrap();
    let mut env: HashMap<String, String> =
        prelaunch_env(&layout, &secret, &cfg, Protocol::Pmi, 4567, true)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
    env.insert("SLURM_SRUN_COMM_HOST".into(), "10.0.0.1".into());
    env
}

fn het_ranks() -> Vec<Vec<u32>> {
    vec![vec![2, 3], vec![4], vec![0, 1]]
}

/// slurmstepd's record on `node` of het step 40.0: component 0 (job 40) on n3, component 1
/// (job 41) on n1 and n2.
fn het_record(node: &str) -> StepRecord {
    let (job_id, component, nodeid, nnodes, ntasks, node_tasks) = match node {
        "n3" => (40, 0, 0, 1, 2, 2),
        "n1" => (41, 1, 0, 2, 3, 2),
        _ => (41, 1, 1, 2, 3, 1),
    };
    StepRecord {
        job_id,
        step_id: 0,
        nnodes,
        ntasks,
        nodeid,
        node_tasks,
        uid: 1000,
        gid: 100,
        node_name: node.into(),
        het: Some(HetRecord {
            het_job_id: 40,
            component,
            task_offset: [0, 2][component as usize],
            node_list: "n[1-3]".into(),
            ranks: het_ranks(),
            rank_components: Some(vec![0, 0, 1, 1, 1]),
        }),
    }
}

#[test]
fn a_het_component_joins_the_whole_het_step_at_its_node_name() {
    let env = het_env();
    assert_eq!(env[VAR_JOB], "40.0");
    for (node, idx, local) in [
        ("n3", 2, vec![0, 1]),
        ("n1", 0, vec![2, 3]),
        ("n2", 1, vec![4]),
    ] {
        let p = plan_on(&het_record(node), &env).unwrap();
        // The overlay is named by the het job; the kill takes the component's own job id.
        let own_job = if node == "n3" { 40 } else { 41 };
        assert_eq!((p.job_id, p.kvsname.as_str()), (own_job, "40.0"), "{node}");
        assert_eq!((p.node_idx, p.node()), (idx, node));
        assert_eq!(p.ranks[idx], local);
        assert_eq!(p.hosts.len(), 3);
        let het = p.het.as_ref().unwrap();
        assert_eq!(het.of(4), Some(1));
        assert_eq!(het.of_node(&p.ranks, 2), Some(0));
    }
}

#[test]
fn a_het_env_must_agree_with_the_het_record() {
    let mut env = het_env();
    env.insert(VAR_JOB.into(), "41.0".into());
    let e = plan_on(&het_record("n1"), &env).unwrap_err();
    assert!(e.contains("het step 40.0"), "{e}");
    let mut env = het_env();
    env.insert(VAR_RANKS.into(), "2-3;4;0".into());
    let e = plan_on(&het_record("n1"), &env).unwrap_err();
    assert!(e.contains("component 1"), "{e}");
    let mut env = het_env();
    env.insert(VAR_HOSTS.into(), "n[1-2],n4".into());
    let e = plan_on(&het_record("n2"), &env).unwrap_err();
    assert!(e.contains("het step nodes n[1-3]"), "{e}");
}

#[test]
fn a_node_in_two_het_components_is_refused_naming_both() {
    let mut rec = het_record("n1");
    let het = rec.het.as_mut().unwrap();
    het.node_list = "n1,n2,n1".into();
    let mut env = het_env();
    env.insert(VAR_HOSTS.into(), "n1,n2,n1".into());
    let e = plan_on(&rec, &env).unwrap_err();
    assert!(
        e.starts_with("n1: n1 is in components 1 and 0 of het step 40.0"),
        "{e}"
    );
}
