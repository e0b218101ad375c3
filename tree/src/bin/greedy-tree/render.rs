//! How `greedy-tree` prints plans and rankings: text, JSON, Graphviz.

use greedy_tree::treewidth::SlurmRelease;
use greedy_tree::{LaunchModel, Position, Shape, Topology, Tree};
use serde_json::json;
use std::fmt;
use std::io::{self, Write};

/// The hosts of a plan: named (`--hosts`, `--hostfile`), or numbered (`--nodes`, whose names
/// are made when printed, so 10^7 hosts cost no memory).
pub(crate) enum Hosts {
    /// Names in host-list order.
    Named(Vec<String>),
    /// `0`, `1`, … `n-1`.
    Numbered(usize),
}

impl Hosts {
    pub(crate) fn len(&self) -> usize {
        match self {
            Hosts::Named(h) => h.len(),
            Hosts::Numbered(n) => *n,
        }
    }

    /// Host `i`'s name, made when printed: a numbered host costs no allocation.
    pub(crate) fn name(&self, i: usize) -> HostName<'_> {
        match self {
            Hosts::Named(h) => HostName::Named(h[i].as_str()),
            Hosts::Numbered(_) => HostName::Numbered(i),
        }
    }

    /// Every name, for the drawing (which details at most a few dozen hosts).
    pub(crate) fn names(&self) -> Vec<String> {
        (0..self.len()).map(|i| self.name(i).to_string()).collect()
    }
}

/// One host's name as [`Hosts::name`] gives it.
#[derive(Clone, Copy)]
pub(crate) enum HostName<'a> {
    Named(&'a str),
    Numbered(usize),
}

impl fmt::Display for HostName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostName::Named(name) => f.write_str(name),
            HostName::Numbered(i) => write!(f, "{i}"),
        }
    }
}

/// What the summary formats print: [`Plan::summary`], or the shape alone
/// ([`Topology::shape`]) when no tree is needed.
pub(crate) struct Summary<'a> {
    /// The shape's name, as in [`Plan::topology`].
    pub(crate) topology: &'a str,
    pub(crate) model: &'a LaunchModel,
    pub(crate) nodes: usize,
    pub(crate) shape: Shape,
}

impl Summary<'_> {
    pub(crate) fn text(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(
            out,
            "topology {} nodes {} depth {} max_fanout {} launch_time {:.6} s",
            self.topology,
            self.nodes,
            self.shape.depth,
            self.shape.max_fanout,
            self.shape.launch_time
        )
    }

    pub(crate) fn json(&self, out: &mut impl Write) -> io::Result<()> {
        let summary = json!({
            "topology": self.topology,
            "model": self.model,
            "nodes": self.nodes,
            "depth": self.shape.depth,
            "max_fanout": self.shape.max_fanout,
            "launch_time": self.shape.launch_time,
        });
        writeln!(out, "{summary}")
    }
}

/// A tree laid over a host list, ready to print. Every per-host format streams from one
/// preorder walk ([`Tree::positions`]): memory stays in the tree's 4 bytes per host.
pub(crate) struct Plan<'a> {
    pub(crate) hosts: &'a Hosts,
    pub(crate) tree: &'a Tree,
    pub(crate) model: &'a LaunchModel,
    /// The shape's name: a [`Topology`], or `slurm-YY.MM:greedy|treewidth`.
    pub(crate) topology: &'a str,
    /// The release whose forwarding the tree follows (`--slurm-release`).
    pub(crate) slurm: Option<SlurmRelease>,
}

impl Plan<'_> {
    fn parent_host(&self, p: &Position) -> HostName<'_> {
        p.parent
            .map_or(HostName::Named("-"), |q| self.hosts.name(q))
    }

    pub(crate) fn text(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(
            out,
            "# node_idx host parent child_index depth launch_time_s"
        )?;
        for p in self.tree.positions(self.model) {
            writeln!(
                out,
                "{} {} {} {} {} {:.6}",
                p.node_idx,
                self.hosts.name(p.node_idx),
                self.parent_host(&p),
                p.child_index,
                p.depth,
                p.launch_time
            )?;
        }
        Ok(())
    }

    /// One JSON document, one host per line: the plan's fields, then `"nodes"`.
    pub(crate) fn json(&self, out: &mut impl Write) -> io::Result<()> {
        let shape = self.tree.shape(self.model);
        write!(
            out,
            "{{\"topology\": {}, \"model\": {}, \"launch_time\": {}, ",
            json!(self.topology),
            json!(self.model),
            json!(shape.launch_time)
        )?;
        if let Some(r) = self.slurm {
            // Whether position 0's split is the plugin's (a checker expects it logged) or
            // Slurm's own.
            write!(
                out,
                "\"slurm_release\": {}, \"srun_splits_with_plugin\": {}, ",
                json!(r.to_string()),
                r.plugin_splits_srun()
            )?;
        }
        write!(out, "\"nodes\": [")?;
        for p in self.tree.positions(self.model) {
            let sep: &[u8] = if p.node_idx == 0 { b"\n  " } else { b",\n  " };
            out.write_all(sep)?;
            json_node(out, &p, self.hosts.name(p.node_idx))?;
        }
        writeln!(out, "\n]}}")
    }

    pub(crate) fn dot(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(out, "digraph launch {{")?;
        writeln!(
            out,
            "  // {} tree, SEQ {} s, REM {} s",
            self.topology,
            self.model.seq(),
            self.model.rem()
        )?;
        writeln!(out, "  node [shape=box, fontname=monospace];")?;
        for p in self.tree.positions(self.model) {
            let host = self.hosts.name(p.node_idx).to_string().replace('"', "\\\"");
            writeln!(
                out,
                "  n{} [label=\"{host}\\n{:.3} s\"];",
                p.node_idx, p.launch_time
            )?;
            if let Some(parent) = p.parent {
                writeln!(
                    out,
                    "  n{parent} -> n{} [label=\"{}\"];",
                    p.node_idx, p.child_index
                )?;
            }
        }
        writeln!(out, "}}")
    }

    pub(crate) fn svg(&self, out: &mut impl Write) -> io::Result<()> {
        let names = self.hosts.names();
        super::svg::write(out, &names, self.tree, self.model, self.topology)
    }

    /// The summary of the built tree, walked once.
    pub(crate) fn summary(&self) -> Summary<'_> {
        Summary {
            topology: self.topology,
            model: self.model,
            nodes: self.tree.len(),
            shape: self.tree.shape(self.model),
        }
    }
}

/// Host `p` of the `json` format: one object, keys sorted as `json!` printed them (its map
/// sorts keys), written directly. A `serde_json::Value` per host cost 2 µs (21 s for 10^7);
/// serialising a struct escaped the constant keys on every line, and `write!` spent more on
/// the integers than the rest of the line, so values go through serde_json's own formatting
/// (itoa, the shortest round-trip float, string escaping) and the keys are bytes.
fn json_node(out: &mut impl Write, p: &Position, host: HostName<'_>) -> io::Result<()> {
    // A macro, not a function bounded by serde's trait: greedy-docs compiles this file
    // without depending on serde itself.
    macro_rules! json_value {
        ($out:expr, $value:expr) => {
            serde_json::to_writer(&mut *$out, $value).map_err(io::Error::from)
        };
    }
    out.write_all(b"{\"child_index\":")?;
    json_value!(out, &p.child_index)?;
    out.write_all(b",\"depth\":")?;
    json_value!(out, &p.depth)?;
    out.write_all(b",\"host\":")?;
    match host {
        HostName::Named(name) => json_value!(out, name)?,
        HostName::Numbered(i) => {
            out.write_all(b"\"")?;
            json_value!(out, &i)?;
            out.write_all(b"\"")?;
        }
    }
    out.write_all(b",\"launch_time\":")?;
    json_value!(out, &p.launch_time)?;
    out.write_all(b",\"node_idx\":")?;
    json_value!(out, &p.node_idx)?;
    out.write_all(b",\"parent\":")?;
    json_value!(out, &p.parent)?;
    out.write_all(b",\"subtree\":[")?;
    json_value!(out, &p.node_idx)?;
    out.write_all(b",")?;
    json_value!(out, &p.subtree_end)?;
    out.write_all(b"]}")
}

/// One topology's result in a comparison.
pub(crate) struct Ranked {
    topology: Topology,
    launch_time: f64,
    depth: u32,
    max_fanout: usize,
}

/// Topologies by modeled launch time for `n` hosts, fastest first (ties keep the given order).
pub(crate) fn rank(topologies: &[Topology], n: usize, model: &LaunchModel) -> Vec<Ranked> {
    let mut ranked: Vec<Ranked> = topologies
        .iter()
        .map(|&topology| {
            let tree = topology.build(n, model);
            Ranked {
                topology,
                launch_time: tree.launch_time(model),
                depth: tree.depths().into_iter().max().unwrap_or(0),
                max_fanout: tree.max_fanout(),
            }
        })
        .collect();
    ranked.sort_by(|a, b| a.launch_time.total_cmp(&b.launch_time));
    ranked
}

pub(crate) fn ranking_text(
    out: &mut impl Write,
    ranking: &[Ranked],
    n: usize,
    model: &LaunchModel,
) -> io::Result<()> {
    writeln!(
        out,
        "# {n} nodes, SEQ {} s, REM {} s, concurrency {}",
        model.seq(),
        model.rem(),
        model.concurrency()
    )?;
    writeln!(
        out,
        "{:>4}  {:<10} {:>14} {:>9} {:>6} {:>10}",
        "rank", "topology", "launch_time_s", "vs_best", "depth", "max_fanout"
    )?;
    let best = ranking.first().map_or(0.0, |r| r.launch_time);
    for (i, r) in ranking.iter().enumerate() {
        writeln!(
            out,
            "{:>4}  {:<10} {:>14.6} {:>8.2}x {:>6} {:>10}",
            i + 1,
            r.topology.to_string(),
            r.launch_time,
            r.launch_time / best,
            r.depth,
            r.max_fanout
        )?;
    }
    Ok(())
}

pub(crate) fn ranking_json(out: &mut impl Write, ranking: &[Ranked]) -> io::Result<()> {
    let rows: Vec<_> = ranking
        .iter()
        .map(|r| {
            json!({
                "topology": r.topology.to_string(),
                "launch_time": r.launch_time,
                "depth": r.depth,
                "max_fanout": r.max_fanout,
            })
        })
        .collect();
    serde_json::to_writer_pretty(&mut *out, &rows)?;
    writeln!(out)
}
