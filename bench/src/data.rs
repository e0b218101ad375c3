//! The machine-readable results under docs/data/: one CSV per section, one row per run, as the
//! scripts write them (launch.csv's header is a contract with the simulator, greedy-sim).

use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// tests/launcher/bench.sh's results.csv: one greedyrun/Hydra/mpirun run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct LauncherRun {
    /// Part of the script (A: MPI hello, C: `hostname`, M: model validation).
    pub(crate) part: String,
    /// Hosts launched.
    pub(crate) hosts: u32,
    /// Launcher configuration (`hydra`, `gr-greedy`, `rsh-kary:4`, …).
    pub(crate) config: String,
    /// Repetition, from 1.
    pub(crate) run: u32,
    /// Launcher start to exit, ms.
    pub(crate) wall_ms: f64,
    /// Exit status.
    pub(crate) rc: i32,
    /// Output lines that matched the expected answer.
    pub(crate) ok: u32,
    /// Busy CPU seconds of the whole machine during the run.
    pub(crate) cpu_s: f64,
    /// greedyrun -v: when the last agent said hello, ms.
    pub(crate) launch_ms: Option<f64>,
    /// greedyrun -v: what the SEQ/REM model predicts for that tree, ms.
    pub(crate) model_ms: Option<f64>,
}

impl LauncherRun {
    /// Whether the run succeeded: exit 0 and, where output is checked, one good line per host.
    pub(crate) fn succeeded(&self) -> bool {
        self.rc == 0 && (matches!(self.part.as_str(), "B" | "M") || self.ok == self.hosts)
    }
}

/// tests/charm/bench.sh: one charm4py run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct CharmRun {
    /// Emulated packet delay, ms.
    pub(crate) delay_ms: u32,
    /// Hosts (one PE each).
    pub(crate) nodes: u32,
    /// `greedy`, `charmrun` or `charmrun_batch`.
    pub(crate) launcher: String,
    /// Repetition, from 1.
    pub(crate) run: u32,
    /// Start to exit, ms.
    pub(crate) ms: f64,
}

/// tests/slurm/mpi-bench.sh: one srun step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct MpiStep {
    /// Emulated packet delay, ms.
    pub(crate) delay_ms: u32,
    /// Nodes of the step.
    pub(crate) nodes: u32,
    /// Ranks of the step.
    pub(crate) ranks: u32,
    /// `mpich` or `ompi`.
    pub(crate) mpi: String,
    /// `greedy`, `pmi2` or `pmix`.
    pub(crate) plugin: String,
    /// Repetition, from 0.
    pub(crate) rep: u32,
    /// srun start until the last rank was past MPI_Init, ms (empty if the step failed).
    pub(crate) init_ms: Option<f64>,
    /// srun start until srun exited, ms (empty if the step failed).
    pub(crate) exit_ms: Option<f64>,
    /// 1 if the step succeeded.
    pub(crate) ok: u8,
}

/// tests/slurm/route-bench.sh: one `srun -N16 true`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RouteRun {
    /// Emulated packet delay, ms.
    pub(crate) delay_ms: u32,
    /// Slurm's TreeWidth.
    pub(crate) treewidth: u32,
    /// `default` or `greedy`.
    pub(crate) route: String,
    /// Round (a fresh cluster per route and TreeWidth each round).
    pub(crate) round: u32,
    /// Repetition within the round.
    pub(crate) rep: u32,
    /// Wall time, ms.
    pub(crate) ms: f64,
}

/// docs/data/launch.csv: one launch of the model validation (the simulator reads this exact
/// header: `shell,topology,hosts,delay_ms,rep,seconds`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct LaunchRow {
    /// `rsh` or `ssh`.
    pub(crate) shell: String,
    /// `greedy`, `flat`, `binomial`, `kary:4`, `kary:8`.
    pub(crate) topology: String,
    /// Hosts launched (greedyrun itself is the tree's root, one more position).
    pub(crate) hosts: u32,
    /// Emulated packet delay, ms.
    pub(crate) delay_ms: u32,
    /// Repetition, from 1.
    pub(crate) rep: u32,
    /// greedyrun start until the last agent's hello arrived.
    pub(crate) seconds: f64,
}

/// docs/data/launch-calibration.csv: `greedyrun --calibrate` per shell and delay; the greedy
/// trees of the validation were built with these.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct CalibrationRow {
    /// `rsh` or `ssh`.
    pub(crate) shell: String,
    /// Emulated packet delay, ms.
    pub(crate) delay_ms: u32,
    /// Calibrated SEQ, s.
    pub(crate) seq: f64,
    /// Calibrated REM, s.
    pub(crate) rem: f64,
}

/// Reads every row of a CSV file with a header.
pub(crate) fn read<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    let mut r = csv::Reader::from_path(path).with_context(|| format!("{}", path.display()))?;
    r.deserialize()
        .enumerate()
        .map(|(i, row)| row.with_context(|| format!("{}: row {}", path.display(), i + 2)))
        .collect()
}

/// Reads a CSV file if it exists; an absent file is no rows (a section never run).
pub(crate) fn read_if_any<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    if path.exists() {
        read(path)
    } else {
        Ok(vec![])
    }
}

/// Writes rows with a header, replacing the file.
pub(crate) fn write<T: Serialize>(path: &Path, rows: &[T]) -> Result<()> {
    create_parent(path)?;
    let mut w = csv::Writer::from_path(path).with_context(|| format!("{}", path.display()))?;
    for row in rows {
        w.serialize(row)
            .with_context(|| format!("{}", path.display()))?;
    }
    w.flush().with_context(|| format!("{}", path.display()))?;
    Ok(())
}

/// Creates the directory a file is to be written in.
pub(crate) fn create_parent(path: &Path) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_csv_keeps_the_simulators_header_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("launch.csv");
        let rows = vec![
            LaunchRow {
                shell: "rsh".into(),
                topology: "kary:4".into(),
                hosts: 64,
                delay_ms: 10,
                rep: 2,
                seconds: 0.466,
            },
            LaunchRow {
                shell: "ssh".into(),
                topology: "greedy".into(),
                hosts: 8,
                delay_ms: 0,
                rep: 1,
                seconds: 1.25,
            },
        ];
        write(&path, &rows).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text.lines().next(),
            Some("shell,topology,hosts,delay_ms,rep,seconds")
        );
        assert_eq!(text.lines().nth(1), Some("rsh,kary:4,64,10,2,0.466"));
        assert_eq!(read::<LaunchRow>(&path).unwrap(), rows);
    }

    #[test]
    fn script_rows_with_empty_fields_parse_and_bad_rows_name_their_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.csv");
        std::fs::write(
            &path,
            "part,hosts,config,run,wall_ms,rc,ok,cpu_s,launch_ms,model_ms\n\
             A,16,hydra,1,2247,0,16,4.47,,\n\
             M,8,rsh-flat,1,300,0,0,0.20,120,80\n",
        )
        .unwrap();
        let rows: Vec<LauncherRun> = read(&path).unwrap();
        assert_eq!(rows[0].launch_ms, None);
        assert!(rows[0].succeeded() && rows[1].succeeded());
        assert_eq!(rows[1].model_ms, Some(80.0));
        std::fs::write(&path, "delay_ms,nodes,launcher,run,ms\n10,16,greedy,x,5\n").unwrap();
        let err = format!("{:#}", read::<CharmRun>(&path).unwrap_err());
        assert!(err.contains("row 2"), "{err}");
        assert!(
            read_if_any::<CharmRun>(&dir.path().join("absent.csv"))
                .unwrap()
                .is_empty()
        );
    }
}
