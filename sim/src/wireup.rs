//! Wire-up: the allgather of every node's endpoints, started by each node when it is ready.
//!
//! Costs are LogGP-like: a message of `s` bytes holds its sender's send port `s·β`, arrives
//! `α + s·β` after it started (later if the receiver's port is still busy with another
//! message: `s·β` after that one), and costs its receiver `γ` of CPU, one message at a time.
//! Participants are nodes (agents), each contributing the blobs of its ranks, as greedy-pmix
//! does: `bytes` below is per node (ranks per node × bytes per rank).
//!
//! - **tree**: gather up the overlay tree (each node sends its subtree's blobs to its parent
//!   once it is ready and has its children's), then the root sends the whole set down, to one
//!   child after another. Discrete events on a heap: a parent's receive port serves its
//!   children's messages in arrival order.
//! - **ring**: each blob travels `P − 1` hops, each node forwarding as soon as it received. The
//!   longest dependency path of that forwarding is exact in closed form: it ends
//!   `(P − 1)(α + sβ + γ)` after the last node is ready (see [`ring`]); a per-message
//!   simulation in the tests agrees, and 10^10 messages at 10^5 nodes are never simulated.
//! - **Bruck**: `⌈log2 P⌉` rounds; in round `k` node `i` sends its first `min(2^k, P − 2^k)`
//!   blobs to node `i − 2^k`. Round by round (the events of a round are independent), O(P log P).

use crate::Error;
use crate::queue::EventQueue;
use greedy_tree::Tree;
use std::fmt;
use std::str::FromStr;

/// Latency/bandwidth costs of one message.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Net {
    /// Seconds from a message's start to its first byte's arrival (α).
    pub alpha: f64,
    /// Seconds per byte on a port (β = 1 / bandwidth).
    pub beta: f64,
    /// CPU seconds a receiver spends on one message (γ).
    pub gamma: f64,
}

impl Net {
    /// Checks that every cost is finite and non-negative.
    pub fn new(alpha: f64, beta: f64, gamma: f64) -> Result<Net, Error> {
        for (name, v) in [("alpha", alpha), ("beta", beta), ("gamma", gamma)] {
            if !(0.0..=1e6).contains(&v) {
                return Err(Error::param(name, v, "must be in [0, 1e6] seconds"));
            }
        }
        Ok(Net { alpha, beta, gamma })
    }

    pub(crate) fn message(&self, bytes: f64) -> f64 {
        self.alpha + bytes * self.beta
    }
}

/// An allgather algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Allgather {
    /// Gather up the overlay tree, broadcast down (greedy-pmix below its ring threshold).
    Tree,
    /// Ring over direct links (greedy-pmix above the threshold).
    Ring,
    /// Bruck's dissemination: ⌈log2 P⌉ rounds.
    Bruck,
}

impl fmt::Display for Allgather {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Allgather::Tree => "tree",
            Allgather::Ring => "ring",
            Allgather::Bruck => "bruck",
        })
    }
}

impl FromStr for Allgather {
    type Err = Error;
    fn from_str(s: &str) -> Result<Allgather, Error> {
        match s {
            "tree" => Ok(Allgather::Tree),
            "ring" => Ok(Allgather::Ring),
            "bruck" => Ok(Allgather::Bruck),
            _ => Err(Error::param("allgather", s, "expected tree, ring or bruck")),
        }
    }
}

/// When the allgather is complete at every node, given when each node is ready to start it
/// (`ready[i]`), `bytes` per node, and for [`Allgather::Tree`] the overlay tree.
pub fn allgather(
    algorithm: Allgather,
    overlay: &Tree,
    ready: &[f64],
    bytes: f64,
    net: &Net,
) -> f64 {
    match algorithm {
        Allgather::Tree => tree(overlay, ready, bytes, net),
        Allgather::Ring => ring(ready, bytes, net),
        Allgather::Bruck => bruck(ready, bytes, net),
    }
}

const UP_MSG: u8 = 0;
const DOWN_MSG: u8 = 1;

/// Gather up `overlay`, then broadcast the whole set down it.
pub fn tree(overlay: &Tree, ready: &[f64], bytes: f64, net: &Net) -> f64 {
    let n = overlay.len();
    assert_eq!(ready.len(), n, "one ready time per node");
    if n <= 1 {
        return ready.first().copied().unwrap_or(0.0);
    }
    let sizes = overlay.subtree_sizes();
    let mut pending: Vec<u32> = (0..n).map(|v| overlay.children(v).count() as u32).collect();
    // When the node's CPU, receive port and send port are next free.
    let mut cpu = ready.to_vec();
    let mut recv = vec![0.0f64; n];
    let mut send = vec![0.0f64; n];
    // The up message of node v is in flight to its parent: remember v's parent by preorder
    // walk (the parent array is built once by the tree).
    let full = n as f64 * bytes;
    let mut done = 0.0f64;
    let mut queue = EventQueue::with_capacity(1024);
    // A node with all its subtree gathered (and itself ready) sends up; `start` ≥ its ready.
    let send_up = |v: usize, start: f64, queue: &mut EventQueue, send: &mut [f64]| {
        let s = sizes[v] as f64 * bytes;
        send[v] = start + s * net.beta;
        queue.push(start + net.message(s), v, UP_MSG);
    };
    for v in 0..n {
        if pending[v] == 0 {
            send_up(v, ready[v], &mut queue, &mut send);
        }
    }
    // Broadcast from a node whose set is complete at `start`.
    let send_down = |v: usize, start: f64, queue: &mut EventQueue, send: &mut [f64]| {
        let mut at = start.max(send[v]);
        for c in overlay.children(v) {
            at += full * net.beta;
            queue.push(at + net.alpha, c, DOWN_MSG);
        }
        send[v] = at;
    };
    while let Some((t, v, kind)) = queue.pop() {
        let (to, s) = match kind {
            UP_MSG => (
                overlay.parent(v).expect("the root sends nothing up"),
                sizes[v] as f64 * bytes,
            ),
            _ => (v, full),
        };
        // The receiver takes messages one at a time on its port, and only once it is up.
        let arrived = t.max(recv[to] + s * net.beta).max(ready[to]);
        recv[to] = arrived;
        let handled = arrived.max(cpu[to]) + net.gamma;
        cpu[to] = handled;
        if kind == UP_MSG {
            pending[to] -= 1;
            if pending[to] == 0 {
                if to == 0 {
                    send_down(0, handled, &mut queue, &mut send);
                    done = done.max(handled);
                } else {
                    send_up(to, handled, &mut queue, &mut send);
                }
            }
        } else {
            done = done.max(handled);
            send_down(to, handled, &mut queue, &mut send);
        }
    }
    done
}

/// Ring allgather, exact longest path of its forwarding.
///
/// Node `i`'s `k`-th send (blob of node `i − k`) starts after it received that blob
/// (`α + sβ + γ` after node `i − 1`'s (k−1)-th send started) and after its own previous send
/// (`sβ`, or `γ` if its CPU is slower). A path from node `m`'s first send to the end takes `j`
/// hops and `P − 1 − j` port waits; hops cost at least as much as waits, so the longest path
/// is a blob going all the way round from the latest-ready node: `max ready + (P − 1)·hop`.
pub fn ring(ready: &[f64], bytes: f64, net: &Net) -> f64 {
    let p = ready.len();
    let last = ready.iter().copied().fold(0.0, f64::max);
    last + p.saturating_sub(1) as f64 * (net.message(bytes) + net.gamma)
}

/// Bruck's allgather, round by round.
pub fn bruck(ready: &[f64], bytes: f64, net: &Net) -> f64 {
    let p = ready.len();
    let mut at = ready.to_vec();
    let mut next = vec![0.0f64; p];
    let mut dist = 1usize;
    while dist < p {
        let s = dist.min(p - dist) as f64 * bytes;
        for j in 0..p {
            // Node j receives from j + dist, which sent when its previous round was done.
            let from = (j + dist) % p;
            let arrived = (at[from] + net.message(s)).max(at[j] + s * net.beta);
            next[j] = arrived + net.gamma;
        }
        std::mem::swap(&mut at, &mut next);
        dist *= 2;
    }
    at.into_iter().fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use greedy_tree::{LaunchModel, Topology};

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    fn build(t: Topology, n: usize) -> Tree {
        t.build(n, &LaunchModel::new(0.01, 0.2).unwrap())
    }

    #[test]
    fn tree_latency_only_is_two_alpha_per_level() {
        let net = Net::new(1e-3, 0.0, 0.0).unwrap();
        for (t, n) in [
            (Topology::Greedy, 1000),
            (Topology::Kary(4), 300),
            (Topology::Binomial, 64),
        ] {
            let tree = build(t, n);
            let depth = tree.depths().into_iter().max().unwrap() as f64;
            let got = self::tree(&tree, &vec![0.0; n], 1024.0, &net);
            assert!(close(got, 2.0 * depth * 1e-3), "{t} {n}: {got}");
        }
    }

    #[test]
    fn tree_closed_forms_for_flat_and_chain() {
        let (a, b, g, s) = (1e-4, 1e-8, 1e-6, 1000.0);
        let net = Net::new(a, b, g).unwrap();
        for p in [2usize, 3, 10, 57] {
            let pf = p as f64;
            // Flat: P−1 blobs queue on the root's port (γ ≤ sβ hides the CPU), then the root
            // sends the full set P·s to each child in turn.
            let flat = self::tree(&build(Topology::Flat, p), &vec![0.0; p], s, &net);
            let want = a + (pf - 1.0) * s * b + g + (pf - 1.0) * pf * s * b + a + g;
            assert!(close(flat, want), "flat {p}: {flat} vs {want}");
            // Chain: message k up carries k blobs; every hop down carries all P.
            let chain = self::tree(&build(Topology::Chain, p), &vec![0.0; p], s, &net);
            let want = (pf - 1.0) * (a + g)
                + s * b * (pf - 1.0) * pf / 2.0
                + (pf - 1.0) * (a + pf * s * b + g);
            assert!(close(chain, want), "chain {p}: {chain} vs {want}");
        }
    }

    #[test]
    fn bruck_closed_form() {
        let (a, b, g, s) = (1e-5, 1e-9, 2e-6, 1024.0);
        let net = Net::new(a, b, g).unwrap();
        for p in [1usize, 2, 3, 5, 8, 100, 1000, 4097] {
            let rounds = (p as f64).log2().ceil();
            let want = rounds * (a + g) + (p as f64 - 1.0) * s * b;
            let got = bruck(&vec![0.0; p], s, &net);
            assert!(close(got, want), "{p}: {got} vs {want}");
        }
    }

    /// Ring by simulating every message: node i forwards in order blobs i, i−1, …, i−P+2.
    fn ring_by_messages(ready: &[f64], s: f64, net: &Net) -> f64 {
        let p = ready.len();
        // start[i]: when node i's k-th send starts; got[i]: when its k-th receive is handled.
        let mut start: Vec<f64> = ready.to_vec();
        let mut done = ready.iter().copied().fold(0.0, f64::max);
        for _ in 1..p {
            let got: Vec<f64> = (0..p)
                .map(|i| start[(i + p - 1) % p] + net.alpha + s * net.beta + net.gamma)
                .collect();
            done = got.iter().copied().fold(done, f64::max);
            for i in 0..p {
                let port = start[i] + (s * net.beta).max(net.gamma);
                start[i] = got[i].max(port).max(ready[i]);
            }
        }
        done
    }

    #[test]
    fn ring_closed_form_matches_messages_for_any_ready_times() {
        let net = Net::new(3e-5, 2e-9, 4e-6).unwrap();
        for p in [2usize, 3, 16, 200] {
            let ready: Vec<f64> = (0..p).map(|i| ((i * 7919) % 13) as f64 * 1e-3).collect();
            let exact = ring_by_messages(&ready, 4096.0, &net);
            let got = ring(&ready, 4096.0, &net);
            assert!(close(got, exact), "{p}: {got} vs {exact}");
            let zero = ring(&vec![0.0; p], 4096.0, &net);
            assert!(close(
                zero,
                (p as f64 - 1.0) * (3e-5 + 4096.0 * 2e-9 + 4e-6)
            ));
        }
    }

    #[test]
    fn late_nodes_delay_every_algorithm() {
        let net = Net::new(1e-5, 1e-9, 0.0).unwrap();
        let tree = build(Topology::Greedy, 64);
        let mut ready = vec![0.0; 64];
        ready[40] = 1.0;
        for alg in [Allgather::Tree, Allgather::Ring, Allgather::Bruck] {
            let t = allgather(alg, &tree, &ready, 100.0, &net);
            assert!(t > 1.0 && t < 1.01, "{alg}: {t}");
        }
    }
}
