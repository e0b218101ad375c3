//! greedy(7) and mpi_greedy(8) document every `Greedy*` key with the code's default, the
//! variables srun reads and tasks receive; greedyrun(1) every `GREEDY_*` variable and exit
//! code of the launcher. A key added to the code without its line in the pages fails here.

mod common;

use common::*;
use greedy_launcher::status::code;
use mpi_greedy::config::MpiConfig;

#[test]
fn every_mpi_key_is_documented_with_its_default() {
    // The same pairs `scontrol show config` lists.
    let defaults = MpiConfig::default().printable();
    check_keys(
        MPI_CONFIG,
        &defaults,
        &[("greedy.7", GREEDY_7), ("mpi_greedy.8", MPI_GREEDY_8)],
    );
    let keys: Vec<&str> = defaults.iter().map(|(k, _)| *k).collect();
    check_guide_names_keys(SYSADMIN, "Greedy", &keys, &[]);
}

#[test]
fn variables_and_exit_codes_are_documented() {
    for page in [GREEDY_7, MPI_GREEDY_8] {
        for var in [mpi_greedy::plan::USER_PROTOCOL, "SLURM_CONF", "GREEDY_MPI_"] {
            assert!(page.contains(var), "a page lacks {var}");
        }
    }
    assert!(GREEDY_7.contains(greedy_slurm::conf::ENV_PATH));
    for var in [
        "PMI_FD",
        "PMI_RANK",
        "PMI_SIZE",
        "PMI_JOBID",
        "MPI_LOCALNRANKS",
        "PMIX_RANK",
    ] {
        assert!(MPI_GREEDY_8.contains(var), "mpi_greedy.8 lacks {var}");
    }
    // What greedyd gives every rank, and greedyrun's env-backed options.
    let mut vars = literals_after(AGENT, "(\"GREEDY_");
    vars.extend(literals_after(GREEDYRUN, "env = \"GREEDY_"));
    assert!(vars.len() >= 8, "found only {vars:?}");
    for v in vars {
        let v = format!("GREEDY_{v}");
        assert!(EXTRA.contains(&v), "greedyrun(1) lacks {v}");
    }
    for c in [
        code::USAGE,
        code::LAUNCH_TIMEOUT,
        code::LAUNCHER,
        code::BROKEN_PIPE,
    ] {
        assert!(
            EXTRA.contains(&format!(".B {c}\n")),
            "greedyrun(1) lacks exit code {c}"
        );
    }
}
