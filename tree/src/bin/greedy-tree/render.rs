//! How `greedy-tree` prints plans and rankings: text, JSON, Graphviz.

use greedy_tree::{LaunchModel, Topology, Tree};
use serde_json::json;
use std::io::{self, Write};

/// A tree laid over a host list, ready to print.
pub(crate) struct Plan<'a> {
    pub(crate) hosts: &'a [String],
    pub(crate) tree: &'a Tree,
    pub(crate) model: &'a LaunchModel,
    pub(crate) topology: Topology,
}

impl Plan<'_> {
    fn parent_host(&self, v: usize) -> &str {
        self.tree.parent(v).map_or("-", |p| self.hosts[p].as_str())
    }

    pub(crate) fn text(&self, out: &mut impl Write) -> io::Result<()> {
        let times = self.tree.launch_times(self.model);
        let index = self.tree.child_indices();
        let depth = self.tree.depths();
        writeln!(
            out,
            "# node_idx host parent child_index depth launch_time_s"
        )?;
        for v in 0..self.tree.len() {
            writeln!(
                out,
                "{v} {} {} {} {} {:.6}",
                self.hosts[v],
                self.parent_host(v),
                index[v],
                depth[v],
                times[v]
            )?;
        }
        Ok(())
    }

    pub(crate) fn json(&self, out: &mut impl Write) -> io::Result<()> {
        let times = self.tree.launch_times(self.model);
        let index = self.tree.child_indices();
        let depth = self.tree.depths();
        let nodes: Vec<_> = (0..self.tree.len())
            .map(|v| {
                json!({
                    "node_idx": v,
                    "host": self.hosts[v],
                    "parent": self.tree.parent(v),
                    "child_index": index[v],
                    "depth": depth[v],
                    "launch_time": times[v],
                    "subtree": [v, self.tree.subtree_range(v).end],
                })
            })
            .collect();
        let plan = json!({
            "topology": self.topology.to_string(),
            "model": self.model,
            "launch_time": times.iter().copied().fold(0.0, f64::max),
            "nodes": nodes,
        });
        serde_json::to_writer_pretty(&mut *out, &plan)?;
        writeln!(out)
    }

    pub(crate) fn dot(&self, out: &mut impl Write) -> io::Result<()> {
        let times = self.tree.launch_times(self.model);
        writeln!(out, "digraph launch {{")?;
        writeln!(
            out,
            "  // {} tree, SEQ {} s, REM {} s",
            self.topology,
            self.model.seq(),
            self.model.rem()
        )?;
        writeln!(out, "  node [shape=box, fontname=monospace];")?;
        for (v, (host, time)) in self.hosts.iter().zip(&times).enumerate() {
            let host = host.replace('"', "\\\"");
            writeln!(out, "  n{v} [label=\"{host}\\n{time:.3} s\"];")?;
        }
        for v in 0..self.tree.len() {
            for (i, c) in self.tree.children(v).enumerate() {
                writeln!(out, "  n{v} -> n{c} [label=\"{}\"];", i + 1)?;
            }
        }
        writeln!(out, "}}")
    }

    pub(crate) fn svg(&self, out: &mut impl Write) -> io::Result<()> {
        super::svg::write(out, self.hosts, self.tree, self.model, self.topology)
    }

    pub(crate) fn summary(&self, out: &mut impl Write) -> io::Result<()> {
        let depth = self.tree.depths().into_iter().max().unwrap_or(0);
        writeln!(
            out,
            "topology {} nodes {} depth {} max_fanout {} launch_time {:.6} s",
            self.topology,
            self.tree.len(),
            depth,
            self.tree.max_fanout(),
            self.tree.launch_time(self.model)
        )
    }
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
