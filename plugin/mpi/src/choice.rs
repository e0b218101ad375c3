//! What a site (mpi.conf) or a step (srun's environment) chooses: the client protocol served
//! and how nodes find their overlay parents. Both the configuration and the plan use them.

use std::fmt;
use std::str::FromStr;

use greedy_pmix::family::Family;

/// The per-step override of `GreedyProtocol`, read from srun's environment.
pub const USER_PROTOCOL: &str = "SLURM_GREEDY_PROTOCOL";

/// The client protocol family of a step. Never both in one task's env: MPICH ≥ 4.1 refuses a
/// task that has `PMI_*` and `PMIX_*` (research/pmix-pmi.md §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Every family at once; each rank is served by the one it speaks.
    Auto,
    /// PMI-1 and PMI-2 on one socket (MPICH, Intel MPI, MVAPICH).
    Pmi,
    /// PMIx (Open MPI).
    Pmix,
    /// Charm++'s netlrts launcher protocol (what charmrun serves; the charm4py wheel).
    Charm,
}

impl FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Protocol::Auto),
            "pmi" | "pmi1" | "pmi2" => Ok(Protocol::Pmi),
            "pmix" => Ok(Protocol::Pmix),
            "charm" => Ok(Protocol::Charm),
            _ => Err(format!("{s:?}: expected auto, pmi, pmix or charm")),
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Auto => "auto",
            Protocol::Pmi => "pmi",
            Protocol::Pmix => "pmix",
            Protocol::Charm => "charm",
        })
    }
}

impl Protocol {
    /// The documented rule: the step's `SLURM_GREEDY_PROTOCOL` wins, then `GreedyProtocol`;
    /// `auto` serves every family at once, and each rank is served by the one it speaks.
    pub fn resolve(user: Option<&str>, configured: Protocol) -> Result<Protocol, String> {
        match user.filter(|s| !s.is_empty()) {
            Some(s) => s
                .parse::<Protocol>()
                .map_err(|e| format!("{USER_PROTOCOL}={e}")),
            None => Ok(configured),
        }
    }

    /// The wire-up families a step of this protocol serves.
    pub fn families(self) -> Vec<Family> {
        match self {
            Protocol::Auto => Family::ALL.to_vec(),
            Protocol::Pmi => vec![Family::Pmi],
            Protocol::Pmix => vec![Family::Pmix],
            Protocol::Charm => vec![Family::Charm],
        }
    }
}

/// How a node finds its overlay parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RendezvousChoice {
    /// Reserved ports when the step has them, else through srun.
    Auto,
    /// Reserved ports only (a step without them fails).
    Ports,
    /// Through srun's listener always.
    Srun,
}

impl fmt::Display for RendezvousChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RendezvousChoice::Auto => "auto",
            RendezvousChoice::Ports => "ports",
            RendezvousChoice::Srun => "srun",
        })
    }
}

impl FromStr for RendezvousChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(RendezvousChoice::Auto),
            "ports" => Ok(RendezvousChoice::Ports),
            "srun" => Ok(RendezvousChoice::Srun),
            _ => Err(format!("{s:?}: expected auto, ports or srun")),
        }
    }
}
