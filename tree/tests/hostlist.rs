//! Hostlist round trips: compressing any host list and expanding it gives the list back.

use greedy_tree::hostlist::{compress, expand};
use proptest::prelude::*;

fn host() -> impl Strategy<Value = String> {
    // Few prefixes and small numbers, so runs, padding clashes and duplicates are common.
    (
        prop::sample::select(vec!["n", "gpu", "r1n", "login", "a-b", "x.y"]),
        prop::option::of(0u32..40),
        prop::sample::select(vec![0usize, 0, 2, 3]),
    )
        .prop_map(|(prefix, number, width)| match number {
            Some(v) => format!("{prefix}{v:0width$}"),
            None => prefix.to_string(),
        })
}

proptest! {
    #[test]
    fn expand_inverts_compress(hosts in prop::collection::vec(host(), 1..60)) {
        let expr = compress(&hosts);
        prop_assert_eq!(expand(&expr).unwrap(), hosts, "via {}", expr);
    }

    #[test]
    fn compress_is_canonical(hosts in prop::collection::vec(host(), 1..60)) {
        let expr = compress(&hosts);
        prop_assert_eq!(compress(&expand(&expr).unwrap()), expr);
    }

    #[test]
    fn expand_never_panics(expr in "[a-c0-9\\[\\],\\- ]{0,24}") {
        let _ = expand(&expr);
    }
}
