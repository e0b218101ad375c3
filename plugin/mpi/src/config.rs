//! mpi/greedy's keys in `greedy.conf` (the file and its place: [`greedy_slurm::conf`]).
//!
//! srun reads the file when a step starts and hands the values to every node in the step's
//! environment ([`crate::plan`]), so all nodes of a step use the same model and timeouts even
//! if compute nodes carry no greedy.conf.
//!
//! | key | value | default |
//! |---|---|---|
//! | `MpiProtocol` | `auto`, `pmi` (PMI-1/PMI-2: MPICH, Intel MPI) or `pmix` (Open MPI) | `auto` |
//! | `MpiRendezvous` | `auto` (reserved ports when the step has them, else via srun), `ports`, `srun` | `auto` |
//! | `MpiSeq` | seconds a node spends accepting one overlay child (the tree's SEQ) | [`DEFAULT_SEQ`] |
//! | `MpiRem` | seconds until an accepted child can accept its own (REM) | [`DEFAULT_REM`] |
//! | `MpiJoinTimeout` | seconds every node has to join the overlay (slow stepd starts included) | 60 |
//! | `MpiFenceTimeout` | seconds the ranks of a node have to all enter a PMI fence | 300 |
//! | `MpiShutdownTimeout` | seconds slurmstepd's `fini` waits for the service to stop | 0.5 |
//!
//! The override of `MpiProtocol` for one step is `SLURM_GREEDY_PROTOCOL` in srun's environment.
//! A malformed line or bad value makes srun refuse the step with one error line naming it
//! (a silently half-applied configuration would give nodes different trees).

use crate::plan::{Protocol, RendezvousChoice};
use greedy_slurm::ConfError;
use greedy_slurm::conf::{self, Conf};
use std::path::Path;
use std::time::Duration;

/// SEQ of the overlay tree: accepting and authenticating one child (a TCP accept plus two
/// HMAC round trips) costs well under a millisecond of the parent's time.
pub const DEFAULT_SEQ: f64 = 0.001;
/// REM of the overlay tree: a child can accept its own children after its handshake round
/// trips, a few milliseconds on a LAN; REM/SEQ ≈ 4 gives fan-outs of about 4 near the root.
pub const DEFAULT_REM: f64 = 0.004;

/// What mpi/greedy reads from greedy.conf.
#[derive(Debug, Clone, PartialEq)]
pub struct MpiConfig {
    /// Which client protocol family to serve.
    pub protocol: Protocol,
    /// How nodes find their overlay parent.
    pub rendezvous: RendezvousChoice,
    /// Overlay tree SEQ, seconds.
    pub seq: f64,
    /// Overlay tree REM, seconds.
    pub rem: f64,
    /// `MpiJoinTimeout`.
    pub join_timeout: Duration,
    /// `MpiFenceTimeout`.
    pub fence_timeout: Duration,
    /// `MpiShutdownTimeout`.
    pub shutdown_timeout: Duration,
}

impl Default for MpiConfig {
    fn default() -> Self {
        MpiConfig {
            protocol: Protocol::Auto,
            rendezvous: RendezvousChoice::Auto,
            seq: DEFAULT_SEQ,
            rem: DEFAULT_REM,
            join_timeout: Duration::from_secs(60),
            fence_timeout: Duration::from_secs(300),
            shutdown_timeout: Duration::from_millis(500),
        }
    }
}

impl MpiConfig {
    /// Loads `path`; a missing file means the defaults.
    pub fn load(path: &Path) -> Result<MpiConfig, ConfError> {
        match conf::read(path)? {
            None => Ok(MpiConfig::default()),
            Some(text) => MpiConfig::from_conf(&conf::parse(&text), path),
        }
    }

    /// The configuration from a parsed greedy.conf, or its first fault. Keys without the
    /// `Mpi` prefix belong to other plugins and are skipped.
    pub fn from_conf(conf: &Conf, path: &Path) -> Result<MpiConfig, ConfError> {
        conf.check_well_formed(path)?;
        let mut cfg = MpiConfig::default();
        for e in &conf.entries {
            let bad = |reason: &str| e.error(path, reason);
            let seconds = || -> Result<f64, ConfError> {
                e.value
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v > 0.0)
                    .ok_or_else(|| bad("expected a positive number of seconds"))
            };
            let duration = || seconds().map(Duration::from_secs_f64);
            if e.is("MpiProtocol") {
                cfg.protocol = e.value.parse().map_err(|r: String| bad(&r))?;
            } else if e.is("MpiRendezvous") {
                cfg.rendezvous = e.value.parse().map_err(|r: String| bad(&r))?;
            } else if e.is("MpiSeq") {
                cfg.seq = seconds()?;
            } else if e.is("MpiRem") {
                cfg.rem = seconds()?;
            } else if e.is("MpiJoinTimeout") {
                cfg.join_timeout = duration()?;
            } else if e.is("MpiFenceTimeout") {
                cfg.fence_timeout = duration()?;
            } else if e.is("MpiShutdownTimeout") {
                cfg.shutdown_timeout = duration()?;
            } else if e.key.len() >= 3 && e.key[..3].eq_ignore_ascii_case("Mpi") {
                return Err(bad("unknown Mpi* key"));
            }
        }
        greedy_tree::LaunchModel::new(cfg.seq, cfg.rem).map_err(|err| ConfError::Line {
            path: path.to_owned(),
            line: 0,
            text: format!("MpiSeq={} MpiRem={}", cfg.seq, cfg.rem),
            reason: err.to_string(),
        })?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<MpiConfig, String> {
        MpiConfig::from_conf(&conf::parse(text), Path::new("/x/greedy.conf"))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_keys_and_faults() {
        assert_eq!(check("").unwrap(), MpiConfig::default());
        let cfg =
            check("RouteSeq=9\nMpiProtocol=pmi\nMpiFenceTimeout=20\nMpiRendezvous=srun\n").unwrap();
        assert_eq!(cfg.protocol, Protocol::Pmi);
        assert_eq!(cfg.rendezvous, RendezvousChoice::Srun);
        assert_eq!(cfg.fence_timeout, Duration::from_secs(20));
        assert!(
            check("MpiProtocol=mpich")
                .unwrap_err()
                .contains("expected auto, pmi or pmix")
        );
        assert!(
            check("MpiJoinTimeout=-1")
                .unwrap_err()
                .contains("positive number")
        );
        assert!(
            check("MpiBogus=1")
                .unwrap_err()
                .contains("unknown Mpi* key")
        );
        assert!(
            check("nonsense")
                .unwrap_err()
                .contains("expected Key=Value")
        );
    }
}
