//! `greedy-sim` as a user runs it: validation output, bad input, the report and its splice.

use std::path::PathBuf;
use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_greedy-sim"))
        .args(args)
        .output()
        .expect("greedy-sim runs")
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Launch times of a model with SEQ 10 ms, REM 100 ms, 20 ms overhead (eq. 2, no contention).
fn measurements(dir: &std::path::Path) -> PathBuf {
    let model = greedy_tree::LaunchModel::new(0.013, 0.28).unwrap();
    let truth = greedy_tree::LaunchModel::new(0.01, 0.1).unwrap();
    let mut csv = String::from("shell,topology,hosts,delay_ms,rep,seconds\n");
    for hosts in [4, 8, 16] {
        for t in ["flat", "binomial", "kary:4", "kary:8", "greedy"] {
            let tree = t
                .parse::<greedy_tree::Topology>()
                .unwrap()
                .build(hosts, &model);
            let s = 0.02 + tree.launch_time(&truth);
            csv += &format!("rsh,{t},{hosts},10,1,{s:.6}\n");
        }
    }
    let path = dir.join("launch.csv");
    std::fs::write(&path, csv).unwrap();
    path
}

#[test]
fn validate_reports_every_launch_and_a_small_error_for_model_data() {
    let dir = scratch("validate");
    let csv = measurements(&dir);
    // No contention in these measurements: no batch cap, cores as many as hosts.
    let out = run(&[
        "validate",
        "--measured",
        csv.to_str().unwrap(),
        "--batch",
        "0",
        "--cores",
        "64",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let rows = text.lines().filter(|l| l.starts_with("rsh ")).count();
    assert_eq!(rows, 15);
    let all = text.lines().find(|l| l.starts_with("# all:")).unwrap();
    // "# all: eq2 error mean X% max Y%; sim error mean Z% max W%"
    let max: Vec<f64> = all
        .split("max ")
        .skip(1)
        .map(|w| w.split('%').next().unwrap().parse().unwrap())
        .collect();
    // The fits are least squares over a max-plus model (kinks), so not exact: a few percent.
    assert!(max.iter().all(|&m| m < 5.0), "{all}");
    let mean: Vec<f64> = all
        .split("mean ")
        .skip(1)
        .map(|w| w.split('%').next().unwrap().parse().unwrap())
        .collect();
    assert!(mean.iter().all(|&m| m < 1.5), "{all}");
}

#[test]
fn bad_measurements_name_the_line_and_exit_2() {
    let dir = scratch("bad");
    let path = dir.join("launch.csv");
    std::fs::write(
        &path,
        "shell,topology,hosts,delay_ms,rep,seconds\nrsh,flat,8,10,1,0.1\nrsh,star,8,10,1,0.2\n",
    )
    .unwrap();
    let out = run(&["validate", "--measured", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("line 3") && err.contains("star"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    // A calibration file beside the measurements is read, and its faults named too.
    let csv = measurements(&dir);
    std::fs::write(
        dir.join("launch-calibration.csv"),
        "shell,delay_ms,seq,rem\nrsh,10,0.01,-1\n",
    )
    .unwrap();
    let out = run(&["validate", "--measured", csv.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("launch-calibration.csv: line 2"), "{err}");
}

#[test]
fn report_splices_its_section_and_writes_readable_svgs() {
    let dir = scratch("report");
    let csv = measurements(&dir);
    let doc = dir.join("benchmarks.md");
    std::fs::write(
        &doc,
        "# B\n\nbefore\n<!-- sim:begin -->\nold\n<!-- sim:end -->\nafter\n",
    )
    .unwrap();
    let out = run(&[
        "report",
        "--measured",
        csv.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
        "--max-nodes",
        "1000",
        "--runs",
        "2",
        "--allgather-ranks",
        "10000",
        "--project-from",
        "rsh",
        "--splice",
        doc.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&doc).unwrap();
    assert!(text.starts_with("# B\n\nbefore\n<!-- sim:begin -->\n### Validation"));
    assert!(text.ends_with("<!-- sim:end -->\nafter\n") && !text.contains("old"));
    for shape in ["greedy-cap:16", "kary:50", "kary:64", "kary:32"] {
        assert!(text.contains(&format!("| {shape} |")), "{shape} row");
    }
    assert!(text.contains("at 10k ranks") && text.contains("| 10000 × 1 |"));
    for plot in ["sim-validation", "sim-scale", "sim-allgather"] {
        let svg = std::fs::read_to_string(dir.join(format!("plots/{plot}.svg"))).unwrap();
        let xml = roxmltree::Document::parse(&svg).expect("well-formed SVG");
        let texts: Vec<_> = xml
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text())
            .collect();
        assert!(
            texts
                .iter()
                .any(|t| t.contains("seconds") || t.contains("measured")),
            "{plot}: {texts:?}"
        );
    }
    // Without markers the file is left alone and the error names it.
    std::fs::write(&doc, "no markers\n").unwrap();
    let out = run(&[
        "report",
        "--measured",
        csv.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
        "--max-nodes",
        "1000",
        "--runs",
        "1",
        "--splice",
        doc.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("benchmarks.md"));
    assert_eq!(std::fs::read_to_string(&doc).unwrap(), "no markers\n");
}
