//! Builds one greedy tree of N positions (first argument), for `perf stat` and profilers.

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let model = greedy_tree::LaunchModel::new(0.007, 0.172).expect("valid model");
    let start = std::time::Instant::now();
    let tree = greedy_tree::greedy(n, &model);
    println!("{} positions in {:?}", tree.len(), start.elapsed());
}
