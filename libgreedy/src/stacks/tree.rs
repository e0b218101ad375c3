//! `CallTree`: the call-prefix tree of many ranks' stacks, as STAT builds it.
//!
//! Each node is a frame reached by the same sequence of calls from the outermost one; it holds the
//! ranks whose stack passes through it and the ranks whose stack ends in it. Every field is a set
//! union of what was inserted, so `merge` is associative and commutative and a daemon can merge
//! its children's trees in whatever order they arrive. A merge walks both trees once (children
//! are sorted by name), so its cost is the size of the smaller changes, not of the job.
//!
//! The wire form (serde) is a flat pre-order list `[[depth, name, ranks(, ends)], ...]` rather than
//! nested objects: it is smaller, and deep stacks (hundreds of frames) do not hit a JSON
//! reader's recursion limit (serde_json's is 128 levels).

use std::cmp::Ordering;
use std::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::RankSet;

/// A call-prefix tree of the stacks of many ranks under a virtual root named `""`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallTree {
    /// The virtual root: its ranks are every rank inserted, its children the outermost frames.
    root: Node,
}

/// One frame of the tree, reached by the calls of its ancestors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Node {
    /// The frame's function name as the collector printed it.
    name: String,
    /// The ranks with a thread whose stack passes through (or ends in) this frame.
    ranks: RankSet,
    /// The ranks with a thread whose stack ends in this frame (its innermost frame).
    ends: RankSet,
    /// The callees, sorted by name, names unique.
    children: Vec<Node>,
}

impl Node {
    /// A node with no rank yet.
    fn named(name: &str) -> Node {
        Node {
            name: name.to_string(),
            ..Node::default()
        }
    }

    /// The frame's function name (`""` for the root).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The ranks whose stack passes through this frame.
    pub fn ranks(&self) -> &RankSet {
        &self.ranks
    }

    /// The ranks with a thread whose innermost frame is this one.
    pub fn ends(&self) -> &RankSet {
        &self.ends
    }

    /// The callees, sorted by name.
    pub fn children(&self) -> &[Node] {
        &self.children
    }

    /// The child called `name`, added if missing at its sorted place.
    fn child_mut(&mut self, name: &str) -> &mut Node {
        let i = match self
            .children
            .binary_search_by(|c| c.name.as_str().cmp(name))
        {
            Ok(i) => i,
            Err(i) => {
                self.children.insert(i, Node::named(name));
                i
            }
        };
        &mut self.children[i]
    }

    /// Adds `other`'s ranks and callees to this node (same name), walking both sorted child lists
    /// once.
    fn merge(&mut self, other: Node) {
        self.ranks.union(&other.ranks);
        self.ends.union(&other.ends);
        let mine = std::mem::take(&mut self.children);
        let mut merged = Vec::with_capacity(mine.len().max(other.children.len()));
        let (mut a, mut b) = (
            mine.into_iter().peekable(),
            other.children.into_iter().peekable(),
        );
        loop {
            let order = match (a.peek(), b.peek()) {
                (Some(x), Some(y)) => x.name.cmp(&y.name),
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => break,
            };
            match order {
                Ordering::Less => merged.extend(a.next()),
                Ordering::Greater => merged.extend(b.next()),
                Ordering::Equal => {
                    if let (Some(mut x), Some(y)) = (a.next(), b.next()) {
                        x.merge(y);
                        merged.push(x);
                    }
                }
            }
        }
        self.children = merged;
    }

    /// This node and its descendants in pre-order (children by name), each with its depth
    /// (this node's is 0).
    pub fn preorder(&self) -> impl Iterator<Item = (usize, &Node)> {
        let mut todo = vec![(0, self)];
        std::iter::from_fn(move || {
            let (depth, node) = todo.pop()?;
            todo.extend(node.children.iter().rev().map(|c| (depth + 1, c)));
            Some((depth, node))
        })
    }
}

impl CallTree {
    /// The empty tree.
    pub fn new() -> CallTree {
        CallTree::default()
    }

    /// The virtual root (name `""`): its ranks are all ranks inserted, its children the outermost
    /// frames.
    pub fn root(&self) -> &Node {
        &self.root
    }

    /// Every rank inserted.
    pub fn ranks(&self) -> &RankSet {
        &self.root.ranks
    }

    /// Adds one thread's stack of `rank`, frames outermost first (`main`, ..., innermost). A rank
    /// with several threads inserts each; an empty stack only counts the rank at the root.
    pub fn insert<S: AsRef<str>>(&mut self, rank: u32, frames: &[S]) {
        let mut node = &mut self.root;
        node.ranks.insert(rank);
        for frame in frames {
            node = node.child_mut(frame.as_ref());
            node.ranks.insert(rank);
        }
        node.ends.insert(rank);
    }

    /// Adds every stack of `other`: the same tree as inserting `other`'s stacks into `self`.
    pub fn merge(&mut self, other: CallTree) {
        self.root.merge(other.root);
    }

    /// Every distinct path where some stack ends, with the ranks whose stack ends there, ordered by
    /// first rank (then by path). A rank with several threads can appear on several paths; an
    /// empty stack gives an empty path.
    pub fn paths(&self) -> Vec<(RankSet, Vec<String>)> {
        let mut out = Vec::new();
        let mut path = Vec::new();
        collect_paths(&self.root, &mut path, &mut out);
        // Stable: paths with the same first rank keep their pre-order (name) order.
        out.sort_by_key(|(ranks, _)| ranks.first());
        out
    }
}

/// Pushes `(ends, path)` for `node` and its descendants; `path` is `node`'s frames, root excluded.
fn collect_paths(node: &Node, path: &mut Vec<String>, out: &mut Vec<(RankSet, Vec<String>)>) {
    if !node.ends.is_empty() {
        out.push((node.ends.clone(), path.clone()));
    }
    for child in &node.children {
        path.push(child.name.clone());
        collect_paths(child, path, out);
        path.pop();
    }
}

/// `[depth, name, ranks]`, plus `ends` when it is not the default for the node's place: all its
/// ranks for a leaf, none for an inner node. Most nodes are one of those, so most entries carry
/// three fields.
impl Serialize for CallTree {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(
            self.root
                .preorder()
                .map(|(depth, node)| Entry::of(depth, node)),
        )
    }
}

/// One node on the wire.
struct Entry<'a> {
    /// Distance from the root (0).
    depth: usize,
    /// The node.
    node: &'a Node,
}

impl<'a> Entry<'a> {
    /// The entry of `node` at `depth`.
    fn of(depth: usize, node: &'a Node) -> Entry<'a> {
        Entry { depth, node }
    }
}

/// The `ends` a node has unless its entry says otherwise.
fn default_ends(ranks: &RankSet, is_leaf: bool) -> RankSet {
    if is_leaf {
        ranks.clone()
    } else {
        RankSet::new()
    }
}

impl Serialize for Entry<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let n = self.node;
        let is_leaf = n.children.is_empty();
        if n.ends == default_ends(&n.ranks, is_leaf) {
            (self.depth, &n.name, &n.ranks).serialize(s)
        } else {
            (self.depth, &n.name, &n.ranks, &n.ends).serialize(s)
        }
    }
}

/// A wire entry read back: the `ends` are resolved once the node's children are known.
struct OwnedEntry {
    /// Distance from the root.
    depth: usize,
    /// The node, children not yet attached, `ends` empty unless given.
    node: Node,
    /// Whether the entry gave `ends`.
    has_ends: bool,
}

impl<'de> Deserialize<'de> for OwnedEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<OwnedEntry, D::Error> {
        d.deserialize_seq(EntryVisitor)
    }
}

/// Reads `[depth, name, ranks]` or `[depth, name, ranks, ends]`.
struct EntryVisitor;

impl<'de> Visitor<'de> for EntryVisitor {
    type Value = OwnedEntry;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[depth, name, ranks] or [depth, name, ranks, ends]")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<OwnedEntry, A::Error> {
        let missing = |i| de::Error::invalid_length(i, &self);
        let depth = seq.next_element()?.ok_or_else(|| missing(0))?;
        let name = seq.next_element()?.ok_or_else(|| missing(1))?;
        let ranks = seq.next_element()?.ok_or_else(|| missing(2))?;
        let ends: Option<RankSet> = seq.next_element()?;
        let has_ends = ends.is_some();
        let node = Node {
            name,
            ranks,
            ends: ends.unwrap_or_default(),
            children: Vec::new(),
        };
        Ok(OwnedEntry {
            depth,
            node,
            has_ends,
        })
    }
}

impl<'de> Deserialize<'de> for CallTree {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<CallTree, D::Error> {
        let entries = Vec::<OwnedEntry>::deserialize(d)?;
        build(entries).map_err(de::Error::custom)
    }
}

/// Rebuilds the tree from its pre-order entries, refusing a list that is not one: a first entry
/// not at depth 0, a depth that skips a level, a second root, children out of name order.
fn build(entries: Vec<OwnedEntry>) -> Result<CallTree, String> {
    // open[i]: the node at depth i on the path to the last entry, and whether it gave `ends`.
    let mut open: Vec<(Node, bool)> = Vec::new();
    for (i, e) in entries.into_iter().enumerate() {
        let fits = if i == 0 {
            e.depth == 0
        } else {
            (1..=open.len()).contains(&e.depth)
        };
        if !fits {
            return Err(format!(
                "call tree entry {i}: depth {} out of place",
                e.depth
            ));
        }
        close_to(&mut open, e.depth)?;
        open.push((e.node, e.has_ends));
    }
    close_to(&mut open, 1)?;
    let root = open
        .pop()
        .map(|(node, given)| finish(node, given))
        .unwrap_or_default();
    Ok(CallTree { root })
}

/// Closes open nodes until `depth` remain, attaching each to its parent in arrival order.
fn close_to(open: &mut Vec<(Node, bool)>, depth: usize) -> Result<(), String> {
    while open.len() > depth {
        let Some((node, given)) = open.pop() else {
            break;
        };
        let node = finish(node, given);
        let Some((parent, _)) = open.last_mut() else {
            break;
        };
        if parent.children.last().is_some_and(|c| c.name >= node.name) {
            return Err(format!(
                "call tree: children of {:?} out of order",
                parent.name
            ));
        }
        parent.children.push(node);
    }
    Ok(())
}

/// Fills a node's `ends` with the default for its place when its entry gave none.
fn finish(mut node: Node, given: bool) -> Node {
    if !given {
        node.ends = default_ends(&node.ranks, node.children.is_empty());
    }
    node
}

#[cfg(test)]
mod tests;
