//! mpi/greedy's keys in Slurm's `mpi.conf`, beside slurm.conf ([`greedy_slurm::conf`]), where
//! `scontrol show config` shows them ([`MpiConfig::printable`]) with other MPI plugins' keys.
//!
//! srun reads the file itself when a step starts (Slurm hands mpi.conf only to the daemons)
//! and passes the values to every node in the step's environment ([`crate::plan`]), so all
//! nodes of a step use the same model and timeouts even if their copies of the file differ.
//!
//! | key | value | default |
//! |---|---|---|
//! | `GreedyProtocol` | `auto`, `pmi` (PMI-1/PMI-2: MPICH, Intel MPI), `pmix` (Open MPI) or `charm` (Charm++ netlrts); `auto` serves all three at once, each rank by the one it speaks | `auto` |
//! | `GreedyRendezvous` | `auto` (reserved ports when the step has them, else via srun), `ports`, `srun` | `auto` |
//! | `GreedySeq` | seconds a node spends accepting one overlay child (the tree's SEQ) | [`DEFAULT_SEQ`] |
//! | `GreedyRem` | seconds until an accepted child can accept its own (REM) | [`DEFAULT_REM`] |
//! | `GreedyJoinTimeout` | seconds every node has to join the overlay (slow stepd starts included) | 60 |
//! | `GreedyFenceTimeout` | seconds the ranks of a node have to all enter a PMI fence | 300 |
//! | `GreedyShutdownTimeout` | seconds slurmstepd's `fini` waits for the service to stop (and first for a join still in flight) | 0.5 |
//!
//! The override of `GreedyProtocol` for one step is `SLURM_GREEDY_PROTOCOL` in srun's
//! environment. A malformed line or bad value makes srun refuse the step with one error line
//! naming it (a silently half-applied configuration would give nodes different trees).

use crate::choice::{Protocol, RendezvousChoice};
use greedy_slurm::ConfError;
use greedy_slurm::conf::{self, Conf};
use greedy_tree::LaunchModel;
use std::path::Path;
use std::time::Duration;

/// SEQ of the overlay tree: accepting and authenticating one child (a TCP accept plus two
/// HMAC round trips) costs well under a millisecond of the parent's time.
pub const DEFAULT_SEQ: f64 = 0.001;
/// REM of the overlay tree: a child can accept its own children after its handshake round
/// trips, a few milliseconds on a LAN; REM/SEQ ≈ 4 gives fan-outs of about 4 near the root.
pub const DEFAULT_REM: f64 = 0.004;

/// What mpi/greedy reads from mpi.conf.
#[derive(Debug, Clone, PartialEq)]
pub struct MpiConfig {
    /// Which client protocol family to serve.
    pub protocol: Protocol,
    /// How nodes find their overlay parent.
    pub rendezvous: RendezvousChoice,
    /// The overlay tree's model: `GreedySeq` and `GreedyRem`, validated as one model when the
    /// file is read.
    pub model: LaunchModel,
    /// `GreedyJoinTimeout`.
    pub join_timeout: Duration,
    /// `GreedyFenceTimeout`.
    pub fence_timeout: Duration,
    /// `GreedyShutdownTimeout`.
    pub shutdown_timeout: Duration,
}

impl Default for MpiConfig {
    fn default() -> Self {
        MpiConfig {
            protocol: Protocol::Auto,
            rendezvous: RendezvousChoice::Auto,
            model: LaunchModel::new(DEFAULT_SEQ, DEFAULT_REM).expect("the defaults are valid"),
            join_timeout: Duration::from_secs(60),
            fence_timeout: Duration::from_secs(300),
            shutdown_timeout: Duration::from_millis(500),
        }
    }
}

impl MpiConfig {
    /// Name of the file, in slurm.conf's directory.
    pub const FILE_NAME: &'static str = "mpi.conf";

    /// Loads mpi.conf from beside the slurm.conf of this process (`SLURM_CONF`).
    pub fn load_from_env() -> Result<MpiConfig, ConfError> {
        let slurm = std::env::var("SLURM_CONF").ok();
        MpiConfig::load(&conf::beside_slurm_conf(Self::FILE_NAME, slurm.as_deref()))
    }

    /// Loads `path`; a missing file means the defaults.
    pub fn load(path: &Path) -> Result<MpiConfig, ConfError> {
        match conf::read(path)? {
            None => Ok(MpiConfig::default()),
            Some(text) => MpiConfig::from_conf(&conf::parse(&text), path),
        }
    }

    /// The configuration from a parsed mpi.conf, or its first fault. Keys without the
    /// `Greedy` prefix belong to other MPI plugins and are skipped.
    pub fn from_conf(conf: &Conf, path: &Path) -> Result<MpiConfig, ConfError> {
        conf.check_well_formed(path)?;
        let mut cfg = MpiConfig::default();
        let (mut seq, mut rem) = (cfg.model.seq(), cfg.model.rem());
        for e in &conf.entries {
            let bad = |reason: &str| e.error(path, reason);
            let seconds = || -> Result<f64, ConfError> {
                e.value
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v > 0.0)
                    .ok_or_else(|| bad("expected a positive number of seconds"))
            };
            // At least 1 ns and representable: what srun accepts, every stepd must accept
            // when it reads the value back from the step's environment.
            let duration = || {
                seconds().and_then(|v| {
                    Duration::try_from_secs_f64(v)
                        .ok()
                        .filter(|d| !d.is_zero())
                        .ok_or_else(|| bad("expected seconds between 1 ns and 10^19"))
                })
            };
            if e.is("GreedyProtocol") {
                cfg.protocol = e.value.parse().map_err(|r: String| bad(&r))?;
            } else if e.is("GreedyRendezvous") {
                cfg.rendezvous = e.value.parse().map_err(|r: String| bad(&r))?;
            } else if e.is("GreedySeq") {
                seq = seconds()?;
            } else if e.is("GreedyRem") {
                rem = seconds()?;
            } else if e.is("GreedyJoinTimeout") {
                cfg.join_timeout = duration()?;
            } else if e.is("GreedyFenceTimeout") {
                cfg.fence_timeout = duration()?;
            } else if e.is("GreedyShutdownTimeout") {
                cfg.shutdown_timeout = duration()?;
            } else if e
                .key
                .get(..6)
                .is_some_and(|p| p.eq_ignore_ascii_case("Greedy"))
            {
                return Err(bad("unknown Greedy* key"));
            }
        }
        cfg.model = LaunchModel::new(seq, rem).map_err(|err| ConfError::Line {
            path: path.to_owned(),
            line: 0,
            text: format!("GreedySeq={seq} GreedyRem={rem}"),
            reason: err.to_string(),
        })?;
        Ok(cfg)
    }

    /// Every key with its value in effect, as `scontrol show config` lists them.
    pub fn printable(&self) -> Vec<(&'static str, String)> {
        let secs = |d: Duration| d.as_secs_f64().to_string();
        vec![
            ("GreedyProtocol", self.protocol.to_string()),
            ("GreedyRendezvous", self.rendezvous.to_string()),
            ("GreedySeq", self.model.seq().to_string()),
            ("GreedyRem", self.model.rem().to_string()),
            ("GreedyJoinTimeout", secs(self.join_timeout)),
            ("GreedyFenceTimeout", secs(self.fence_timeout)),
            ("GreedyShutdownTimeout", secs(self.shutdown_timeout)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<MpiConfig, String> {
        MpiConfig::from_conf(&conf::parse(text), Path::new("/x/mpi.conf"))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_keys_and_faults() {
        assert_eq!(check("").unwrap(), MpiConfig::default());
        let cfg = check(
            "PMIxTimeout=9\nGreedyProtocol=pmi\nGreedyFenceTimeout=20\ngreedyrendezvous=srun\n",
        )
        .unwrap();
        assert_eq!(cfg.protocol, Protocol::Pmi);
        assert_eq!(cfg.rendezvous, RendezvousChoice::Srun);
        assert_eq!(cfg.fence_timeout, Duration::from_secs(20));
        let fault = |text: &str, want: &str| {
            let e = check(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        };
        fault("GreedyProtocol=mpich", "expected auto, pmi, pmix or charm");
        fault("GreedyJoinTimeout=-1", "positive number");
        fault("GreedyBogus=1", "unknown Greedy* key");
        fault("nonsense", "expected Key=Value");
        fault("GreedySeq=0.5\nGreedyRem=0.1\nx", "line 3");
        // Durations a stepd could not read back (or Duration could not hold) are refused, and
        // a key whose 6th byte is inside a character is just another plugin's key.
        fault("GreedyJoinTimeout=1e300", "between 1 ns");
        fault("GreedyFenceTimeout=1e-10", "between 1 ns");
        assert_eq!(check("Greedé=1").unwrap(), MpiConfig::default());
    }

    #[test]
    fn printable_lists_every_key_and_reads_back() {
        let cfg = check("GreedyProtocol=pmix\nGreedySeq=0.002\nGreedyShutdownTimeout=1.5").unwrap();
        let pairs = cfg.printable();
        assert_eq!(pairs.len(), 7);
        let text: String = pairs.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
        assert_eq!(check(&text).unwrap(), cfg);
    }
}
