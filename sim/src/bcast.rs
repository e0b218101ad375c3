//! File broadcast: one file from the root to every node, pipelined down a tree in chunks (as
//! `greedyrun --bcast` sends it), against every node fetching the whole file from the root.
//!
//! Costs are [`Net`]'s: a chunk of `c` bytes holds its sender's send port `c·β` and arrives
//! `α + c·β` after its send started; its receiver spends `γ` of CPU on it, one chunk at a
//! time and in order. A node forwards each chunk to its children in order as soon as it has
//! it, one send at a time on its port. Nodes are in depth-first preorder (a parent before its
//! children), so one pass over the nodes, chunk by chunk, is exact: O(nodes × chunks).

use crate::Error;
use crate::wireup::Net;
use greedy_tree::Tree;

/// When every node has all of a `bytes`-byte file sent down `tree` in chunks of `chunk` bytes,
/// the root starting at 0.
pub fn pipelined(tree: &Tree, bytes: f64, chunk: f64, net: &Net) -> Result<f64, Error> {
    if !(chunk > 0.0 && chunk.is_finite()) {
        return Err(Error::param(
            "chunk",
            chunk,
            "must be a positive number of bytes",
        ));
    }
    if !(bytes >= 0.0 && bytes.is_finite()) {
        return Err(Error::param(
            "bytes",
            bytes,
            "must be a non-negative number of bytes",
        ));
    }
    let n = tree.len();
    let chunks = ((bytes / chunk).ceil() as usize).max(1);
    let last = bytes - chunk * (chunks - 1) as f64;
    // have[i][j]: when node i has chunk j (the root has them all at 0).
    let mut have = vec![vec![0.0_f64; chunks]; n];
    for parent in 0..n {
        let children: Vec<usize> = tree.children(parent).collect();
        let mut port = 0.0_f64;
        for j in 0..chunks {
            let size = if j + 1 == chunks { last } else { chunk };
            for &c in &children {
                let start = port.max(have[parent][j]);
                port = start + size * net.beta;
                let arrived = start + net.message(size);
                let previous = if j == 0 { 0.0 } else { have[c][j - 1] };
                have[c][j] = arrived.max(previous) + net.gamma;
            }
        }
    }
    Ok(have.iter().map(|h| h[chunks - 1]).fold(0.0, f64::max))
}

/// When every one of `nodes - 1` nodes has fetched the whole file from the root, whose one
/// send port serves them one after another (as `scp` from a login node, or every node reading
/// one file server).
pub fn fetch_all(nodes: usize, bytes: f64, net: &Net) -> f64 {
    let fetchers = nodes.saturating_sub(1) as f64;
    if fetchers == 0.0 {
        return 0.0;
    }
    fetchers * bytes * net.beta + net.alpha + net.gamma
}

#[cfg(test)]
mod tests {
    use super::*;
    use greedy_tree::{LaunchModel, Topology};

    fn net(beta: f64) -> Net {
        Net::new(1e-4, beta, 0.0).unwrap()
    }

    #[test]
    fn a_chain_pipelines_and_a_flat_tree_pays_every_copy_at_the_root() {
        let model = LaunchModel::new(1.0, 1.0).unwrap();
        let (bytes, chunk, beta) = (100e6, 1e6, 1e-9);
        // A chain of 5: the file's time once, plus one chunk per further hop and α per hop.
        let chain = Topology::Chain.build(5, &model);
        let t = pipelined(&chain, bytes, chunk, &net(beta)).unwrap();
        let expect = bytes * beta + 3.0 * chunk * beta + 4.0 * 1e-4;
        assert!((t - expect).abs() < 1e-9, "{t} vs {expect}");
        // Flat: the root's port sends the whole file to each of the 4 others.
        let flat = Topology::Flat.build(5, &model);
        let t = pipelined(&flat, bytes, chunk, &net(beta)).unwrap();
        assert!((t - (4.0 * bytes * beta + 1e-4)).abs() < 1e-6, "{t}");
        assert!((fetch_all(5, bytes, &net(beta)) - (4.0 * bytes * beta + 1e-4)).abs() < 1e-9);
    }

    #[test]
    fn the_launch_tree_beats_fetching_and_a_narrow_tree_beats_it_for_big_files() {
        let model = LaunchModel::new(0.013, 0.28).unwrap();
        let tree = greedy_tree::greedy(257, &model);
        let n = net(8e-10);
        let tree_t = pipelined(&tree, 500e6, 1048576.0, &n).unwrap();
        let fetch_t = fetch_all(257, 500e6, &n);
        assert!(tree_t * 5.0 < fetch_t, "tree {tree_t} s, fetch {fetch_t} s");
        // The launch-optimal tree is wide at the top (SEQ ≪ REM): each of the root's
        // children costs it a whole copy; a chain pays one copy plus a chunk per hop.
        let chain = Topology::Chain.build(257, &model);
        assert!(pipelined(&chain, 500e6, 1048576.0, &n).unwrap() < tree_t);
        assert!(pipelined(&tree, 1.0, 0.0, &n).is_err());
        assert_eq!(
            pipelined(&greedy_tree::greedy(1, &model), 500e6, 1e6, &n).unwrap(),
            0.0
        );
    }
}
