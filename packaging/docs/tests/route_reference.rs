//! greedy(7) documents every `Route*` key with the code's default.

mod common;

use common::*;
use route_greedy::config::RouteConfig;

#[test]
fn every_route_key_is_documented_with_its_default() {
    let r = RouteConfig::default();
    let defaults = [
        ("RouteSeq", r.model.seq().to_string()),
        ("RouteRem", r.model.rem().to_string()),
        ("RouteConcurrency", r.model.concurrency().to_string()),
        (
            "RouteLogSplits",
            if r.log_splits { "yes" } else { "no" }.into(),
        ),
    ];
    check_keys(ROUTE_CONFIG, &defaults, &[("greedy.7", GREEDY_7)]);
    let keys: Vec<&str> = defaults.iter().map(|(k, _)| *k).collect();
    check_guide_names_keys(SYSADMIN, "Route", &keys, &["RoutePlugin"]);
}
