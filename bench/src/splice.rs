//! Replacing the generated part of a document between two markers, so that the hand-written
//! text around it survives every regeneration.

use anyhow::{Result, bail};

/// The markers of a generated block named `name`: `<!-- bench:NAME:begin -->` and `…:end -->`.
pub(crate) fn bench_markers(name: &str) -> (String, String) {
    (
        format!("<!-- bench:{name}:begin -->"),
        format!("<!-- bench:{name}:end -->"),
    )
}

/// `doc` with the text between `begin` and `end` (each on a line of its own) replaced by
/// `content`. Both markers must occur exactly once, `begin` first: a missing or doubled
/// marker is an error naming it and its line, never a silent append.
pub(crate) fn splice(doc: &str, begin: &str, end: &str, content: &str) -> Result<String> {
    let find = |marker: &str| -> Result<usize> {
        let hits: Vec<usize> = doc.match_indices(marker).map(|(i, _)| i).collect();
        match hits.as_slice() {
            [i] => Ok(*i),
            [] => bail!("marker {marker} not found"),
            [_, second, ..] => bail!(
                "marker {marker} occurs twice (again at line {})",
                line_of(doc, *second)
            ),
        }
    };
    let (b, e) = (find(begin)?, find(end)?);
    if e < b {
        bail!(
            "marker {end} (line {}) comes before {begin} (line {})",
            line_of(doc, e),
            line_of(doc, b)
        );
    }
    let head = &doc[..b + begin.len()];
    let tail = &doc[e..];
    let body = content.trim_matches('\n');
    Ok(if body.is_empty() {
        format!("{head}\n{tail}")
    } else {
        format!("{head}\n{body}\n{tail}")
    })
}

fn line_of(doc: &str, offset: usize) -> usize {
    doc[..offset].matches('\n').count() + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(doc: &str, content: &str, expect: &str) {
        let (b, e) = bench_markers("x");
        assert_eq!(splice(doc, &b, &e, content).unwrap(), expect);
    }

    #[test]
    fn replaces_only_between_the_markers() {
        check(
            "intro\n<!-- bench:x:begin -->\nold\nrows\n<!-- bench:x:end -->\nreading\n",
            "| new |\n",
            "intro\n<!-- bench:x:begin -->\n| new |\n<!-- bench:x:end -->\nreading\n",
        );
    }

    #[test]
    fn empty_block_and_empty_content_round_trip() {
        let doc = "a\n<!-- bench:x:begin -->\n<!-- bench:x:end -->\nb";
        check(doc, "", doc);
        let filled = "a\n<!-- bench:x:begin -->\nt\n<!-- bench:x:end -->\nb";
        check(doc, "t", filled);
        check(filled, "t", filled);
    }

    #[test]
    fn missing_doubled_or_reversed_markers_are_errors_naming_them() {
        let (b, e) = bench_markers("x");
        let err = splice("no markers", &b, &e, "t").unwrap_err().to_string();
        assert!(
            err.contains("bench:x:begin") && err.contains("not found"),
            "{err}"
        );
        let doubled = format!("{b}\n{e}\n{b}\n");
        let err = splice(&doubled, &b, &e, "t").unwrap_err().to_string();
        assert!(err.contains("twice") && err.contains("line 3"), "{err}");
        let reversed = format!("{e}\n{b}\n");
        let err = splice(&reversed, &b, &e, "t").unwrap_err().to_string();
        assert!(err.contains("comes before"), "{err}");
    }
}
