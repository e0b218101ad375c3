//! Builds one greedy tree of N positions (first argument; SEQ and REM in seconds may follow),
//! for `perf stat` and profilers.

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let arg = |i: usize, default: f64| {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(default)
    };
    let model = greedy_tree::LaunchModel::new(arg(2, 0.007), arg(3, 0.172)).expect("valid model");
    let start = std::time::Instant::now();
    let tree = greedy_tree::greedy(n, &model);
    println!("{} positions in {:?}", tree.len(), start.elapsed());
}
