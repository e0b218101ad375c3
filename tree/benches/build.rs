//! Time to build the greedy tree, linear builder vs the paper's heap (Figure 3), 10^3…10^7.
//! Target (issue 2): 10^6 positions in ≤ 10 ms on the 2-core CI machine, growing linearly.

// criterion_group! generates an undocumented pub fn.
#![allow(missing_docs)]

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use greedy_tree::{LaunchModel, Topology, greedy, greedy_with_heap};
use std::hint::black_box;

fn build(c: &mut Criterion) {
    let model = LaunchModel::new(0.007, 0.172).expect("valid model");
    let mut group = c.benchmark_group("build");
    group.sample_size(10);
    for exp in 3..=7u32 {
        let n = 10usize.pow(exp);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::new("greedy", n), &n, |b, &n| {
            b.iter(|| greedy(black_box(n), &model))
        });
        // The heap reference and k-ary for scale; 10^7 heap runs take seconds each.
        if exp <= 6 {
            group.bench_with_input(BenchmarkId::new("greedy_heap", n), &n, |b, &n| {
                b.iter(|| greedy_with_heap(black_box(n), &model))
            });
            group.bench_with_input(BenchmarkId::new("kary16", n), &n, |b, &n| {
                b.iter(|| Topology::Kary(16).build(black_box(n), &model))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, build);
criterion_main!(benches);
