//! What the front end prints: a call tree as text lines, JSON, or an SVG drawing.
//!
//! Text is one line per path where stacks end (`[0-62,64-127] main > MPI_Barrier > ...`), which
//! is what a person reads first: the odd rank out stands on its own line. JSON keeps the whole
//! tree for other tools. SVG draws the prefix tree as STAT does: one box per frame with its
//! ranks, the root on top, each leaf in its own column and each parent centred over its leaves.

use serde_json::{Value, json};

use super::CallTree;
use super::tree::Node;

/// The name shown for the tree's virtual root, as in STAT.
pub const ROOT_NAME: &str = "/";

/// One line per path where stacks end, ordered by first rank: `[ranks] frame > frame > ...`.
pub fn text(tree: &CallTree) -> String {
    let mut out = String::new();
    for (ranks, frames) in tree.paths() {
        let frames = if frames.is_empty() {
            "(no frames)".to_string()
        } else {
            frames.join(" > ")
        };
        out.push_str(&format!("[{ranks}] {frames}\n"));
    }
    out
}

/// The tree as nested objects: `{"name", "ranks": "0-3,5", "count": 5, "children": [...]}`, the
/// root named [`ROOT_NAME`].
pub fn json(tree: &CallTree) -> Value {
    node_json(tree.root(), ROOT_NAME)
}

/// `node` and its subtree as JSON, under `name`.
fn node_json(node: &Node, name: &str) -> Value {
    let children: Vec<Value> = node
        .children()
        .iter()
        .map(|c| node_json(c, c.name()))
        .collect();
    json!({
        "name": name,
        "ranks": node.ranks().to_string(),
        "count": node.ranks().len(),
        "children": children,
    })
}

/// Box size and spacing, in SVG pixels. Labels are 12 px monospace, about 7 px a character, so
/// a box holds `LABEL_CHARS`; longer names are cut with `…` and shown whole in the box's tooltip.
const BOX_W: u64 = 200;
const BOX_H: u64 = 40;
const COLUMN_W: u64 = BOX_W + 20;
const LAYER_H: u64 = BOX_H + 36;
const MARGIN: u64 = 10;
const LABEL_CHARS: usize = 27;

/// A standalone SVG drawing of the prefix tree: a box per frame labelled with its name and its
/// ranks (and their count), edges from caller to callee, depth downwards.
pub fn svg(tree: &CallTree) -> String {
    let root = tree.root();
    let (columns, depth) = (leaves(root).max(1), height(root));
    let (w, h) = (
        2 * MARGIN + columns * COLUMN_W,
        2 * MARGIN + depth * LAYER_H - (LAYER_H - BOX_H),
    );
    let mut edges = String::new();
    let mut boxes = String::new();
    draw(
        root,
        ROOT_NAME,
        Place {
            column: 0,
            depth: 0,
        },
        &mut edges,
        &mut boxes,
    );
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         viewBox=\"0 0 {w} {h}\" font-family=\"monospace\" font-size=\"12\">\n\
         <g stroke=\"#777\" fill=\"none\">\n{edges}</g>\n<g>\n{boxes}</g>\n</svg>\n"
    )
}

/// Where a subtree is drawn: its first leaf column and its depth.
#[derive(Debug, Clone, Copy)]
struct Place {
    /// The column of the subtree's leftmost leaf.
    column: u64,
    /// The node's depth (root 0).
    depth: u64,
}

/// The number of leaf columns under `node` (itself, if a leaf).
fn leaves(node: &Node) -> u64 {
    node.children().iter().map(leaves).sum::<u64>().max(1)
}

/// The number of layers from `node` down (1 for a leaf).
fn height(node: &Node) -> u64 {
    1 + node.children().iter().map(height).max().unwrap_or(0)
}

/// The centre x and top y of the box of a node placed at `at` spanning `span` columns.
fn anchor(at: Place, span: u64) -> (u64, u64) {
    (
        MARGIN + at.column * COLUMN_W + span * COLUMN_W / 2,
        MARGIN + at.depth * LAYER_H,
    )
}

/// Appends `node`'s box and those of its subtree, and the edges to its children.
fn draw(node: &Node, name: &str, at: Place, edges: &mut String, boxes: &mut String) {
    let (x, y) = anchor(at, leaves(node));
    boxes.push_str(&node_box(node, name, x, y));
    let mut column = at.column;
    for child in node.children() {
        let place = Place {
            column,
            depth: at.depth + 1,
        };
        let (cx, cy) = anchor(place, leaves(child));
        edges.push_str(&format!(
            "<line x1=\"{x}\" y1=\"{}\" x2=\"{cx}\" y2=\"{cy}\"/>\n",
            y + BOX_H
        ));
        draw(child, child.name(), place, edges, boxes);
        column += leaves(child);
    }
}

/// One frame's box centred on `x`, top at `y`: name, then `ranks (count)`, whole in its title.
fn node_box(node: &Node, name: &str, x: u64, y: u64) -> String {
    let ranks = format!("[{}] ({})", node.ranks(), node.ranks().len());
    // Leaves, where stacks end, stand out: that is where ranks wait.
    let fill = if node.children().is_empty() {
        "#fde7c4"
    } else {
        "#e4eefb"
    };
    let left = x - BOX_W / 2;
    format!(
        "<g><title>{}&#10;{}</title>\
         <rect x=\"{left}\" y=\"{y}\" width=\"{BOX_W}\" height=\"{BOX_H}\" rx=\"4\" \
         fill=\"{fill}\" stroke=\"#555\"/>\
         <text x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{}</text>\
         <text x=\"{x}\" y=\"{}\" text-anchor=\"middle\" fill=\"#444\">{}</text></g>\n",
        escape(name),
        escape(&ranks),
        y + 16,
        escape(&cut(name)),
        y + 32,
        escape(&cut(&ranks)),
    )
}

/// `text` cut to [`LABEL_CHARS`] characters, the last one `…` when cut.
fn cut(text: &str) -> String {
    if text.chars().count() <= LABEL_CHARS {
        return text.to_string();
    }
    let mut short: String = text.chars().take(LABEL_CHARS - 1).collect();
    short.push('…');
    short
}

/// `text` with XML's special characters escaped, for element text and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests;
