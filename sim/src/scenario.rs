//! One simulated configuration (shape, model, noise, sizes, wire-up), run R times with seeded
//! noise, summarised as median and p5–p95.

use crate::launch::{Limits, simulate_launch};
use crate::wireup::{Allgather, Net, allgather};
use crate::{Error, Noise};
use greedy_tree::{LaunchModel, Topology, Tree};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::fmt;
use std::str::FromStr;

/// A launch tree shape: a greedy-tree [`Topology`], optionally with a fan-out cap.
///
/// Names: greedy-tree's (`greedy`, `flat`, `chain`, `binomial`, `kary:K`), `greedy-cap:K`
/// (the greedy tree with at most K children a parent: route/greedy under Slurm's TreeWidth K),
/// and the aliases `treewidth:K` (Slurm's own k-ary fan-out) and `radix:K` (Open MPI's
/// tree spawn), both `kary:K`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    /// The topology.
    pub topology: Topology,
    /// Most children of a parent (only changes the greedy tree; k-ary shapes have their own).
    pub cap: Option<u32>,
}

impl Shape {
    /// The shape of a topology without cap.
    pub fn new(topology: Topology) -> Shape {
        Shape {
            topology,
            cap: None,
        }
    }

    /// The tree of `n` positions for `model` (the cap is added to the model here).
    pub fn build(&self, n: usize, model: &LaunchModel) -> Result<Tree, Error> {
        let model = match self.cap {
            Some(k) => model.with_max_fanout(k)?,
            None => *model,
        };
        Ok(self.topology.build(n, &model))
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cap {
            Some(k) => write!(f, "{}-cap:{k}", self.topology),
            None => write!(f, "{}", self.topology),
        }
    }
}

impl FromStr for Shape {
    type Err = Error;
    fn from_str(s: &str) -> Result<Shape, Error> {
        let k = |text: &str| -> Result<u32, Error> {
            match text.parse::<u32>() {
                Ok(k) if k >= 1 => Ok(k),
                _ => Err(Error::param("topology", s, "K must be a whole number ≥ 1")),
            }
        };
        if let Some(cap) = s.strip_prefix("greedy-cap:") {
            return Ok(Shape {
                topology: Topology::Greedy,
                cap: Some(k(cap)?),
            });
        }
        if let Some(w) = s
            .strip_prefix("treewidth:")
            .or_else(|| s.strip_prefix("radix:"))
        {
            return Ok(Shape::new(Topology::Kary(k(w)?)));
        }
        Ok(Shape::new(s.parse()?))
    }
}

/// Everything one simulated launch plus wire-up depends on.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Hosts (nodes), one agent each.
    pub nodes: usize,
    /// Ranks per node.
    pub ppn: u32,
    /// Endpoint bytes each rank contributes to the allgather.
    pub bytes_per_rank: f64,
    /// The launch tree shape.
    pub shape: Shape,
    /// SEQ/REM (and concurrency) of a launch.
    pub model: LaunchModel,
    /// Launch noise.
    pub noise: Noise,
    /// Shared CPU and launches in flight.
    pub limits: Limits,
    /// Seconds from a node's agent being up to its ranks entering the allgather.
    pub rank_start: f64,
    /// The allgather algorithm, or none to simulate the launch alone.
    pub allgather: Option<Allgather>,
    /// Message costs of the wire-up.
    pub net: Net,
}

/// One run's result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Run {
    /// Seconds until every node was up.
    pub launched: f64,
    /// Seconds until the allgather was complete everywhere (= `launched` without wire-up).
    pub wired: f64,
}

/// Median and 5th–95th percentiles of a quantity over the runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// 50th percentile.
    pub median: f64,
    /// 5th percentile.
    pub p5: f64,
    /// 95th percentile.
    pub p95: f64,
}

impl Spread {
    /// Percentiles by linear interpolation between order statistics.
    pub fn of(values: &[f64]) -> Spread {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let q = |p: f64| -> f64 {
            if v.is_empty() {
                return f64::NAN;
            }
            let x = p * (v.len() - 1) as f64;
            let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
            v[lo] + (v[hi] - v[lo]) * (x - lo as f64)
        };
        Spread {
            median: q(0.5),
            p5: q(0.05),
            p95: q(0.95),
        }
    }
}

/// The runs of a scenario and their spreads.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Every run, in seed order.
    pub runs: Vec<Run>,
    /// Launch time over the runs.
    pub launched: Spread,
    /// Launch plus wire-up over the runs.
    pub wired: Spread,
    /// Depth of the launch tree.
    pub depth: u32,
    /// Largest fan-out of the launch tree.
    pub max_fanout: usize,
}

impl Scenario {
    /// A launch-only scenario without noise, one rank per node.
    pub fn launch(nodes: usize, shape: Shape, model: LaunchModel) -> Scenario {
        Scenario {
            nodes,
            ppn: 1,
            bytes_per_rank: 0.0,
            shape,
            model,
            noise: Noise::NONE,
            limits: Limits::default(),
            rank_start: 0.0,
            allgather: None,
            net: Net {
                alpha: 0.0,
                beta: 0.0,
                gamma: 0.0,
            },
        }
    }

    /// Runs the scenario `runs` times with seeds `seed`, `seed + 1`, …
    ///
    /// The wire-up's overlay is the greedy tree of the nodes under the same model (as greedy-pmix
    /// builds it), whatever tree the launch used.
    pub fn run(&self, runs: usize, seed: u64) -> Result<Summary, Error> {
        if self.nodes == 0 || self.nodes > (u32::MAX - 1) as usize {
            return Err(Error::param(
                "nodes",
                self.nodes,
                "must be in [1, 2^32 - 2]",
            ));
        }
        if runs == 0 {
            return Err(Error::param("runs", runs, "must be at least 1"));
        }
        let tree = self.shape.build(self.nodes, &self.model)?;
        let overlay = match self.allgather {
            Some(Allgather::Tree) if self.shape == Shape::new(Topology::Greedy) => None,
            Some(Allgather::Tree) => Some(Topology::Greedy.build(self.nodes, &self.model)),
            _ => None,
        };
        let overlay = overlay.as_ref().unwrap_or(&tree);
        let bytes = f64::from(self.ppn) * self.bytes_per_rank;
        let mut out = Vec::with_capacity(runs);
        for r in 0..runs {
            let mut rng = StdRng::seed_from_u64(seed.wrapping_add(r as u64));
            let mut up = simulate_launch(&tree, &self.model, &self.noise, &self.limits, &mut rng);
            let launched = up.iter().copied().fold(0.0, f64::max);
            let wired = match self.allgather {
                None => launched,
                Some(alg) => {
                    up.iter_mut().for_each(|t| *t += self.rank_start);
                    allgather(alg, overlay, &up, bytes, &self.net)
                }
            };
            out.push(Run { launched, wired });
            // A noise-free run is the same every time.
            if self.noise.is_none() {
                out.resize(runs, Run { launched, wired });
                break;
            }
        }
        let launched = Spread::of(&out.iter().map(|r| r.launched).collect::<Vec<_>>());
        let wired = Spread::of(&out.iter().map(|r| r.wired).collect::<Vec<_>>());
        Ok(Summary {
            runs: out,
            launched,
            wired,
            depth: tree.depths().into_iter().max().unwrap_or(0),
            max_fanout: tree.max_fanout(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_names() {
        for (name, shown) in [
            ("greedy", "greedy"),
            ("greedy-cap:16", "greedy-cap:16"),
            ("treewidth:50", "kary:50"),
            ("radix:64", "kary:64"),
            ("kary:32", "kary:32"),
            ("binomial", "binomial"),
        ] {
            assert_eq!(name.parse::<Shape>().unwrap().to_string(), shown);
        }
        for bad in ["greedy-cap:0", "radix:x", "tree"] {
            assert!(bad.parse::<Shape>().unwrap_err().to_string().contains(bad));
        }
    }

    #[test]
    fn spread_interpolates() {
        let s = Spread::of(&[4.0, 1.0, 3.0, 2.0, 5.0]);
        assert_eq!((s.median, s.p5, s.p95), (3.0, 1.2, 4.8));
    }

    #[test]
    fn capped_greedy_respects_the_cap_and_costs_time() {
        let m = LaunchModel::new(0.001, 0.1).unwrap();
        let free = Scenario::launch(10_000, "greedy".parse().unwrap(), m)
            .run(1, 0)
            .unwrap();
        let capped = Scenario::launch(10_000, "greedy-cap:4".parse().unwrap(), m)
            .run(1, 0)
            .unwrap();
        assert!(capped.max_fanout <= 4 && free.max_fanout > 4);
        assert!(capped.launched.median > free.launched.median);
    }
}
