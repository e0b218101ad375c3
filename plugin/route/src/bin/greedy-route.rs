//! `greedy-route`: calibrate route/greedy's model from timed `srun` launches, and model
//! route/greedy against route/default for large clusters. Exit 0 on success, 1 when a file
//! cannot be read, 2 for bad input.

use greedy_tree::LaunchModel;
use route_greedy::calibrate;
use std::process::ExitCode;

const USAGE: &str = "usage: greedy-route calibrate --launches FILE
       greedy-route model --seq S --rem R --tree-width W HOSTS...
       greedy-route kary MAX_HOSTS MAX_TREE_WIDTH
  calibrate: FILE has one timed launch per line, `TREEWIDTH HOSTS SECONDS` (route/default at
    TREEWIDTH, srun -N HOSTS, wall seconds); prints the fitted RouteSeq/RouteRem for greedy.conf.
  model: for each HOSTS, the modeled launch time (seconds, sender included) of route/default's
    TreeWidth tree and of route/greedy's tree, and their ratio.
  kary: the fallback's sub-list sizes, `N W s1 s2 ...` for every N and W up to the maxima
    (tests/slurm/route.sh compares them with Slurm's own split, tests/slurm/kary_check.c).";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("calibrate") => calibrate_cmd(&args[1..]),
        Some("model") => model_cmd(&args[1..]),
        Some("kary") => kary_cmd(&args[1..]),
        Some("-h" | "--help") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => usage(),
    }
}

fn usage() -> ExitCode {
    eprintln!("{USAGE}");
    ExitCode::from(2)
}

fn calibrate_cmd(args: &[String]) -> ExitCode {
    let [flag, path] = args else {
        return usage();
    };
    if flag != "--launches" {
        return usage();
    }
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("greedy-route: {path}: {e}");
            return ExitCode::from(1);
        }
    };
    match calibrate::parse(&text).and_then(|t| calibrate::fit(&t).map(|f| (t.len(), f))) {
        Ok((n, f)) => {
            println!(
                "seq {:.6} rem {:.6} overhead {:.6} rms_error {:.6} launches {n}",
                f.model.seq(),
                f.model.rem(),
                f.overhead,
                f.rms_error
            );
            println!(
                "# greedy.conf: RouteSeq={:.6} RouteRem={:.6}",
                f.model.seq(),
                f.model.rem()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("greedy-route: {path}: {e}");
            ExitCode::from(2)
        }
    }
}

fn model_cmd(args: &[String]) -> ExitCode {
    let (mut seq, mut rem, mut width, mut hosts) = (None, None, None, Vec::new());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let value =
            |it: &mut std::slice::Iter<'_, String>| it.next().and_then(|v| v.parse::<f64>().ok());
        match a.as_str() {
            "--seq" => seq = value(&mut it),
            "--rem" => rem = value(&mut it),
            "--tree-width" => width = it.next().and_then(|v| v.parse::<u16>().ok()),
            n => match n.parse::<usize>() {
                Ok(n) if n >= 1 => hosts.push(n),
                _ => return usage(),
            },
        }
    }
    let (Some(seq), Some(rem), Some(width)) = (seq, rem, width) else {
        return usage();
    };
    let model = match LaunchModel::new(seq, rem) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("greedy-route: {e}");
            return ExitCode::from(2);
        }
    };
    let capped = if width > 0 {
        model.with_max_fanout(u32::from(width)).unwrap_or(model)
    } else {
        model
    };
    println!("# hosts tree_width route_default_s route_greedy_s greedy/default");
    for n in hosts {
        let default = calibrate::slurm_tree(n, width).launch_time(&model);
        let greedy = greedy_tree::greedy(n + 1, &capped).launch_time(&model);
        println!(
            "{n} {width} {default:.3} {greedy:.3} {:.2}",
            greedy / default
        );
    }
    ExitCode::SUCCESS
}

fn kary_cmd(args: &[String]) -> ExitCode {
    let [max_n, max_w] = args else {
        return usage();
    };
    let (Ok(max_n), Ok(max_w)) = (max_n.parse::<usize>(), max_w.parse::<u16>()) else {
        return usage();
    };
    let mut out = String::new();
    for n in 1..=max_n {
        for w in 1..=max_w {
            out.push_str(&format!("{n} {w}"));
            for r in route_greedy::split::kary_ranges(n, w) {
                out.push_str(&format!(" {}", r.len()));
            }
            out.push('\n');
        }
    }
    print!("{out}");
    ExitCode::SUCCESS
}
