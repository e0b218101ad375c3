//! Tests of the renderings on a small tree.

use super::*;

/// Ranks 0-3 and 5 in a barrier, rank 4 computing, rank 6's second thread in `main`.
fn small() -> CallTree {
    let mut t = CallTree::new();
    for rank in [0, 1, 2, 3, 5] {
        t.insert(rank, &["main", "MPI_Barrier", "poll"]);
    }
    t.insert(4, &["main", "compute<int&>"]);
    t.insert(6, &["main", "MPI_Barrier", "poll"]);
    t.insert(6, &["main"]);
    t
}

#[test]
fn text_is_a_line_per_path() {
    assert_eq!(
        text(&small()),
        "[0-3,5-6] main > MPI_Barrier > poll\n[4] main > compute<int&>\n[6] main\n"
    );
    let mut t = CallTree::new();
    t.insert::<&str>(2, &[]);
    assert_eq!(text(&t), "[2] (no frames)\n");
    assert_eq!(text(&CallTree::new()), "");
}

#[test]
fn json_nests_names_ranks_counts() {
    let expect = json!({
        "name": "/", "ranks": "0-6", "count": 7, "children": [{
            "name": "main", "ranks": "0-6", "count": 7, "children": [
                {"name": "MPI_Barrier", "ranks": "0-3,5-6", "count": 6, "children": [
                    {"name": "poll", "ranks": "0-3,5-6", "count": 6, "children": []},
                ]},
                {"name": "compute<int&>", "ranks": "4", "count": 1, "children": []},
            ],
        }],
    });
    assert_eq!(json(&small()), expect);
}

/// Checks that `svg` is well-formed as far as this renderer can get it wrong: every tag closed in
/// order, every `&` an entity, no `<` or `>` outside tags. Returns the element names opened.
fn check_well_formed(svg: &str) -> Vec<String> {
    let body = svg
        .strip_prefix("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n")
        .expect("xml declaration");
    let (mut open, mut seen) = (Vec::<String>::new(), Vec::new());
    let mut rest = body;
    while let Some(lt) = rest.find('<') {
        check_text(&rest[..lt]);
        let gt = rest[lt..].find('>').expect("unclosed tag") + lt;
        let tag = &rest[lt + 1..gt];
        assert!(!tag.contains('<'), "< inside tag {tag}");
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(open.pop().as_deref(), Some(name), "close without open");
        } else {
            let name = tag
                .split_whitespace()
                .next()
                .unwrap()
                .trim_end_matches('/')
                .to_string();
            check_attributes(tag);
            seen.push(name.clone());
            if !tag.ends_with('/') {
                open.push(name);
            }
        }
        rest = &rest[gt + 1..];
    }
    check_text(rest);
    assert!(open.is_empty(), "never closed: {open:?}");
    seen
}

/// Text between tags: no `>`, and every `&` starts an entity.
fn check_text(text: &str) {
    assert!(!text.contains('>'), "> in text {text:?}");
    for (i, _) in text.match_indices('&') {
        let entity = &text[i..text[i..].find(';').map_or(text.len(), |e| i + e + 1)];
        let known = ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;", "&#10;"];
        assert!(known.contains(&entity), "bad entity {entity:?}");
    }
}

/// Attribute values quoted with `"` and holding none.
fn check_attributes(tag: &str) {
    assert_eq!(tag.matches('"').count() % 2, 0, "odd quotes in {tag}");
    check_text(tag);
}

#[test]
fn svg_is_well_formed_and_names_every_frame() {
    let mut t = small();
    let odd = [
        "a&b",
        "operator<<",
        "say \"hi\"",
        "it's",
        "std::vector<std::pair<int, int> >::push_back(std::pair<int, int> const&)",
    ];
    for (i, name) in odd.iter().enumerate() {
        t.insert(10 + i as u32, &["main", *name]);
    }
    let svg = svg(&t);
    let tags = check_well_formed(&svg);
    assert_eq!(tags[0], "svg");
    // A box per node: root, main, MPI_Barrier, poll, compute, and the odd ones.
    assert_eq!(tags.iter().filter(|t| *t == "rect").count(), 5 + odd.len());
    for name in ["main", "MPI_Barrier", "poll", "compute<int&>"]
        .iter()
        .chain(&odd)
    {
        assert!(
            svg.contains(&format!("<title>{}&#10;", escape(name))),
            "{name}"
        );
    }
    assert!(svg.contains(">[0-6,10-14] (12)</text>"), "{svg}");
    // The long name is cut on its box, whole in its title.
    assert!(
        svg.contains(">std::vector&lt;std::pair&lt;int,…</text>"),
        "{svg}"
    );
}

#[test]
fn svg_lays_leaves_out_in_columns() {
    let out = svg(&small());
    // Two leaves (poll, compute): two columns; root, main, MPI_Barrier, poll: four layers.
    assert!(out.contains("width=\"460\" height=\"288\""), "{out}");
    // The root is centred over both columns; poll sits in the first, compute in the second.
    assert!(out.contains("<rect x=\"130\" y=\"10\""), "{out}");
    assert!(out.contains("<rect x=\"20\" y=\"238\""), "{out}");
    assert!(out.contains("<rect x=\"240\" y=\"162\""), "{out}");
    let empty = svg(&CallTree::new());
    assert_eq!(
        check_well_formed(&empty),
        ["svg", "g", "g", "g", "title", "rect", "text", "text"]
    );
}

#[test]
fn escape_and_cut() {
    assert_eq!(
        escape(r#"<a href="x">&'"#),
        "&lt;a href=&quot;x&quot;&gt;&amp;&apos;"
    );
    assert_eq!(cut("short"), "short");
    let long = "x".repeat(40);
    assert_eq!(cut(&long).chars().count(), LABEL_CHARS);
    assert!(cut(&long).ends_with('…'));
}
