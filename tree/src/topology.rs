//! The launch topologies a plan can use: the greedy tree and the fixed shapes other launchers
//! use (flat, chain, binomial, k-ary), behind one name each.

use crate::{Error, LaunchModel, Shape, Tree, greedy};
use std::fmt;
use std::str::FromStr;

/// A way to shape a launch tree. Names: `greedy`, `flat`, `chain`, `binomial`, `kary:K`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Topology {
    /// The optimal tree under the model ([`greedy()`]).
    Greedy,
    /// The root launches every other position (rsh loops, pdsh, charmrun).
    Flat,
    /// Each position launches the next one.
    Chain,
    /// Each position hands half of its remaining range to its next child.
    Binomial,
    /// Complete k-ary tree filled breadth-first (Slurm's TreeWidth, PRRTE's radix).
    Kary(u32),
}

impl Topology {
    /// The tree of `n` positions of this shape; only [`Topology::Greedy`] reads `model`.
    pub fn build(self, n: usize, model: &LaunchModel) -> Tree {
        match self {
            Topology::Greedy => greedy(n, model),
            Topology::Flat => kary(n, u32::MAX),
            Topology::Chain => kary(n, 1),
            Topology::Binomial => binomial(n),
            Topology::Kary(k) => kary(n, k),
        }
    }

    /// `self.build(n, model).shape(model)`, equal to the last bit. The greedy tree's (fan-out
    /// unbounded) comes from its layout without storing a position: a summary of 10^7 hosts
    /// takes tens of milliseconds and no per-host memory. Other shapes are built and walked.
    pub fn shape(self, n: usize, model: &LaunchModel) -> Shape {
        match self {
            Topology::Greedy => greedy::shape(n, model),
            _ => self.build(n, model).shape(model),
        }
    }

    /// The default set `greedy-tree compare` ranks.
    pub fn default_set() -> Vec<Topology> {
        let mut set = vec![
            Topology::Greedy,
            Topology::Flat,
            Topology::Chain,
            Topology::Binomial,
        ];
        set.extend((1..=9).map(|e| Topology::Kary(1 << e)));
        set
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Topology::Greedy => f.write_str("greedy"),
            Topology::Flat => f.write_str("flat"),
            Topology::Chain => f.write_str("chain"),
            Topology::Binomial => f.write_str("binomial"),
            Topology::Kary(k) => write!(f, "kary:{k}"),
        }
    }
}

impl FromStr for Topology {
    type Err = Error;
    fn from_str(s: &str) -> Result<Topology, Error> {
        let refuse = |reason: &str| Error::Topology {
            name: s.to_string(),
            reason: reason.to_string(),
        };
        match s {
            "greedy" => Ok(Topology::Greedy),
            "flat" => Ok(Topology::Flat),
            "chain" => Ok(Topology::Chain),
            "binomial" => Ok(Topology::Binomial),
            _ => {
                let k = s
                    .strip_prefix("kary:")
                    .ok_or_else(|| refuse("expected greedy, flat, chain, binomial or kary:K"))?;
                match k.parse::<u32>() {
                    Ok(k) if k >= 1 => Ok(Topology::Kary(k)),
                    _ => Err(refuse("K must be a whole number of at least 1")),
                }
            }
        }
    }
}

/// Complete `k`-ary tree in breadth-first (heap) order: position `h`'s children are
/// `k·h + 1 ..= k·h + k`, launched in that order.
fn kary(n: usize, k: u32) -> Tree {
    let k = k as usize;
    let parents: Vec<u32> = (0..n)
        .map(|h| {
            if h == 0 {
                u32::MAX
            } else {
                ((h - 1) / k) as u32
            }
        })
        .collect();
    Tree::from_launch_order_parents(&parents)
}

/// Binomial tree: a position owning `s` positions gives its next child `⌊s/2⌋` of them and
/// keeps the rest, until it keeps only itself (MPI's binomial broadcast in launch order).
fn binomial(n: usize) -> Tree {
    let mut sizes = vec![0u32; n];
    // (first position, size) of subtrees still to lay out.
    let mut todo = if n > 0 { vec![(0usize, n)] } else { vec![] };
    while let Some((v, s)) = todo.pop() {
        sizes[v] = s as u32;
        let (mut next, mut left) = (v + 1, s);
        while left > 1 {
            let child = left / 2;
            todo.push((next, child));
            next += child;
            left -= child;
        }
    }
    Tree::from_valid_sizes(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(t: Topology, n: usize) -> Vec<u32> {
        t.build(n, &LaunchModel::default()).subtree_sizes().to_vec()
    }

    #[test]
    fn fixed_shapes() {
        assert_eq!(shape(Topology::Flat, 4), [4, 1, 1, 1]);
        assert_eq!(shape(Topology::Chain, 4), [4, 3, 2, 1]);
        assert_eq!(shape(Topology::Binomial, 8), [8, 4, 2, 1, 1, 2, 1, 1]);
        assert_eq!(shape(Topology::Binomial, 5), [5, 2, 1, 1, 1]);
        // Binary heap of 6: 0→(1,2), 1→(3,4), 2→(5), renumbered in preorder.
        assert_eq!(shape(Topology::Kary(2), 6), [6, 3, 1, 1, 2, 1]);
        assert_eq!(shape(Topology::Kary(3), 0), Vec::<u32>::new());
    }

    #[test]
    fn names_round_trip_and_bad_names_are_refused() {
        for t in Topology::default_set() {
            assert_eq!(t.to_string().parse::<Topology>().unwrap(), t);
        }
        for bad in ["kary:0", "kary:", "kary:x", "tree", "Greedy", ""] {
            let err = bad.parse::<Topology>().unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
    }
}
