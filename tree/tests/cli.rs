//! `greedy-tree` as a user runs it: outputs, rankings and exit codes.

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_greedy-tree"))
        .args(args)
        .output()
        .expect("greedy-tree runs")
}

fn stdout(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn compare_ranks_greedy_first_for_the_papers_hpc_model() {
    let text = stdout(&[
        "compare", "--nodes", "1000", "--seq", "0.007", "--rem", "0.172", "--json",
    ]);
    let rows: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rows = rows.as_array().unwrap();
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["topology"].as_str().unwrap())
        .collect();
    // Table II of the paper (S1), which reports every time 0.020 s higher than eq. 2 gives.
    assert_eq!(
        names,
        [
            "greedy", "kary:16", "kary:32", "kary:8", "kary:64", "kary:4", "kary:128", "binomial",
            "kary:2", "kary:256", "kary:512", "flat", "chain"
        ]
    );
    let time = |i: usize| rows[i]["launch_time"].as_f64().unwrap();
    assert!((time(0) - 0.589).abs() < 1e-9 && (time(1) - 0.733).abs() < 1e-9);
    assert!((0..rows.len() - 1).all(|i| time(i) <= time(i + 1)));
}

#[test]
fn compare_takes_a_topology_list() {
    let text = stdout(&[
        "compare",
        "--nodes",
        "1000",
        "--seq",
        "0.007",
        "--rem",
        "10",
        "--topologies",
        "kary:32,flat,greedy",
        "--json",
    ]);
    let rows: serde_json::Value = serde_json::from_str(&text).unwrap();
    // S3: with a large REM the flat tree is optimal too, so greedy ties it.
    assert_eq!(rows[0]["launch_time"], rows[1]["launch_time"]);
    assert_eq!(rows[2]["topology"], "kary:32");
    assert_eq!(rows.as_array().unwrap().len(), 3);
}

#[test]
fn plan_text_has_one_line_per_host_with_parent_and_time() {
    let text = stdout(&["plan", "--hosts", "n[1-4]", "--seq", "1", "--rem", "2"]);
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        lines,
        [
            "0 n1 - 0 0 0.000000",
            "1 n2 n1 1 1 2.000000",
            "2 n3 n2 1 2 4.000000",
            "3 n4 n1 2 1 3.000000",
        ]
    );
}

#[test]
fn plan_reads_hostfiles_and_summarises() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/mixed.hostfile");
    let text = stdout(&[
        "plan",
        "--hostfile",
        file,
        "--topology",
        "flat",
        "--format",
        "summary",
    ]);
    assert_eq!(
        text.trim(),
        "topology flat nodes 4 depth 1 max_fanout 3 launch_time 0.257000 s"
    );
    let dot = stdout(&["plan", "--hostfile", file, "--format", "dot"]);
    assert!(dot.starts_with("digraph launch {") && dot.contains("n0 -> n1 [label=\"1\"];"));
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    for (args, says) in [
        (&["compare", "--nodes", "0"][..], "must be at least 1"),
        (
            &["compare", "--nodes", "5", "--seq", "-0.1"],
            "seq = -0.1: must not be negative",
        ),
        (
            &["compare", "--nodes", "5", "--rem", "fast"],
            "invalid float",
        ),
        (
            &["compare", "--nodes", "5", "--topologies", "greedy,kary:0"],
            "\"kary:0\"",
        ),
        (&["plan", "--hosts", ""], "hostlist: no hosts"),
        (&["plan", "--hosts", "n[3-1]"], "hostlist column 5"),
        (
            &["plan", "--nodes", "3", "--topology", "star"],
            "topology \"star\"",
        ),
    ] {
        let out = run(args);
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let out = run(&["plan", "--hostfile", "/nonexistent/hosts"]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn calibrate_fits_timed_launches() {
    let dir = std::env::temp_dir().join(format!("greedy-tree-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("launches");
    // Times from the model SEQ 0.02, REM 0.1: flat n → 0.02·(n-2) + 0.1; chain n → 0.1·(n-1).
    std::fs::write(
        &file,
        "# measured\nflat 8 0.22\nflat 16 0.38\nchain 4 0.3\n",
    )
    .unwrap();
    let text = stdout(&["calibrate", "--launches", file.to_str().unwrap()]);
    assert!(
        text.starts_with("seq 0.020000 rem 0.100000 r_squared 1.0000"),
        "{text}"
    );
    std::fs::write(&file, "flat 8 0.22\nflat x 0.3\n").unwrap();
    let out = run(&["calibrate", "--launches", file.to_str().unwrap()]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("line 2: nodes expected a whole number"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn max_fanout_caps_the_greedy_tree() {
    let text = stdout(&[
        "plan",
        "--nodes",
        "1000",
        "--seq",
        "0.007",
        "--rem",
        "0.172",
        "--max-fanout",
        "16",
        "--format",
        "summary",
    ]);
    assert!(text.contains("max_fanout 16 "), "{text}");
    let out = run(&["plan", "--nodes", "10", "--max-fanout", "0"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn plan_svg_draws_every_host_and_summarises_large_trees() {
    let text = stdout(&[
        "plan",
        "--hosts",
        "n[1-12],a&b",
        "--seq",
        "0.01",
        "--rem",
        "0.1",
        "--format",
        "svg",
    ]);
    let doc = roxmltree::Document::parse(&text).expect("the SVG is well-formed XML");
    let nodes: Vec<_> = doc
        .descendants()
        .filter(|e| e.attribute("class") == Some("node"))
        .collect();
    assert_eq!(nodes.len(), 13);
    assert!(text.contains("a&amp;b"), "host names are escaped");
    // One timeline bar per launched host (REM) and one SEQ block per launch.
    let count = |class: &str| {
        doc.descendants()
            .filter(|e| e.attribute("class") == Some(class))
            .count()
    };
    assert_eq!((count("rem"), count("seq")), (12, 12));
    let big = stdout(&["plan", "--nodes", "5000", "--format", "svg"]);
    let doc = roxmltree::Document::parse(&big).unwrap();
    assert_eq!(
        doc.descendants()
            .filter(|e| e.attribute("class") == Some("node"))
            .count(),
        0
    );
    assert!(big.contains("Hosts per depth") && big.contains("Hosts by fan-out"));
}

#[test]
fn slurm_release_plans_follow_each_releases_forwarding() {
    let plan = |release: &str, topology: &str| {
        stdout(&[
            "plan",
            "--hosts",
            "srun,n[1-16]",
            "--seq",
            "0.01",
            "--rem",
            "0.015",
            "--max-fanout",
            "4",
            "--slurm-release",
            release,
            "--topology",
            topology,
        ])
    };
    // "node_idx host parent …" lines: the hosts srun itself contacts.
    let srun_children = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.split_whitespace().nth(2) == Some("srun"))
            .map(|l| l.split_whitespace().nth(1).unwrap().to_string())
            .collect()
    };
    // 26.05: srun's own split is Slurm's (four lists of four at TreeWidth 4); below it, the
    // greedy plan (n1 hands n3 to n2 rather than contacting three hosts).
    let greedy = plan("26.05", "greedy");
    assert_eq!(srun_children(&greedy), ["n1", "n5", "n9", "n13"]);
    assert!(greedy.contains("\n3 n3 n2 1 3 "), "{greedy}");
    let slurm = plan("26.05", "treewidth");
    assert_eq!(srun_children(&slurm), ["n1", "n5", "n9", "n13"]);
    assert!(slurm.contains("\n3 n3 n1 2 2 "), "{slurm}");
    // 24.11: srun's split is the plugin's too, so srun's fan-out is the greedy one.
    assert_ne!(
        srun_children(&plan("24.11", "greedy")),
        srun_children(&slurm)
    );
    let json = stdout(&[
        "plan",
        "--nodes",
        "5",
        "--slurm-release",
        "26.05",
        "--format",
        "json",
    ]);
    assert!(
        json.contains("\"srun_splits_with_plugin\": false"),
        "{json}"
    );
    for bad in [
        &["plan", "--nodes", "5", "--slurm-release", "26.5"][..],
        &[
            "plan",
            "--nodes",
            "5",
            "--slurm-release",
            "26.05",
            "--topology",
            "flat",
        ],
        &[
            "plan",
            "--nodes",
            "5",
            "--slurm-release",
            "26.05",
            "--max-fanout",
            "70000",
        ],
    ] {
        let out = run(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
}

#[test]
fn summary_without_the_tree_agrees_with_the_per_host_plan() {
    // The summary formats take the shape from the library without building the tree; the
    // json format walks the tree. Off-grid parameters, so the launch times round.
    let model = [
        "--seq",
        "0.0123456789",
        "--rem",
        "0.3",
        "--concurrency",
        "2",
    ];
    let args = |format: &'static str| {
        let mut a = vec!["plan", "--hosts", "n[1-2000]"];
        a.extend(model);
        a.extend(["--format", format]);
        a
    };
    let plan: serde_json::Value = serde_json::from_str(&stdout(&args("json"))).unwrap();
    let nodes = plan["nodes"].as_array().unwrap();
    let max = |key: &str| nodes.iter().map(|n| n[key].as_u64().unwrap()).max();
    let summary: serde_json::Value = serde_json::from_str(&stdout(&args("summary-json"))).unwrap();
    assert_eq!(summary["nodes"], 2000);
    assert_eq!(summary["depth"].as_u64(), max("depth"));
    assert_eq!(summary["max_fanout"].as_u64(), max("child_index"));
    assert_eq!(summary["launch_time"], plan["launch_time"]);
    let latest = nodes
        .iter()
        .map(|n| n["launch_time"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert_eq!(summary["launch_time"].as_f64(), Some(latest));
    assert_eq!(
        nodes[5]["host"], "n6",
        "hosts are named in the per-host lines"
    );
    let text = stdout(&args("summary"));
    assert!(
        text.starts_with("topology greedy nodes 2000 depth "),
        "{text}"
    );
}
