//! `greedy-route calibrate --launches FILE`: SEQ and REM for greedy.conf from timed `srun`
//! launches under route/default (see `route_greedy::calibrate`). Exit 0 on success, 1 when the
//! file cannot be read, 2 for bad input.

use route_greedy::calibrate;
use std::process::ExitCode;

const USAGE: &str = "usage: greedy-route calibrate --launches FILE
  FILE: one timed launch per line, `TREEWIDTH HOSTS SECONDS` (route/default at TREEWIDTH,
  srun -N HOSTS, wall seconds); prints the fitted RouteSeq/RouteRem for greedy.conf.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = match args.as_slice() {
        [cmd, flag, path] if cmd == "calibrate" && flag == "--launches" => path,
        [h] if h == "-h" || h == "--help" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
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
                f.seq, f.rem, f.overhead, f.rms_error
            );
            println!("# greedy.conf: RouteSeq={:.6} RouteRem={:.6}", f.seq, f.rem);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("greedy-route: {path}: {e}");
            ExitCode::from(2)
        }
    }
}
