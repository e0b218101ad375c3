//! How long the simulator takes at 10^5 and 10^6 nodes (docs/benchmarks.md, "Simulator").

// criterion_group! generates an undocumented pub fn.
#![allow(missing_docs)]

use criterion::{Criterion, criterion_group, criterion_main};
use greedy_sim::{Allgather, Jitter, Limits, Net, Noise, Scenario, Shape, simulate_launch};
use greedy_tree::LaunchModel;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::hint::black_box;

fn scale(c: &mut Criterion) {
    let model = LaunchModel::new(0.0044, 0.445).unwrap();
    let noise = Noise::new(Jitter::LogNormal(0.2), 0.001, 5.0).unwrap();
    let mut group = c.benchmark_group("sim");
    group.sample_size(10);
    for n in [100_000usize, 1_000_000] {
        let tree = "greedy".parse::<Shape>().unwrap().build(n, &model).unwrap();
        group.bench_function(format!("launch_noisy/{n}"), |b| {
            b.iter(|| {
                let mut rng = StdRng::seed_from_u64(1);
                black_box(simulate_launch(
                    &tree,
                    &model,
                    &noise,
                    &Limits::default(),
                    &mut rng,
                ))
            })
        });
        for alg in [Allgather::Tree, Allgather::Bruck] {
            let scenario = Scenario {
                allgather: Some(alg),
                noise,
                net: Net::new(50e-6, 3.6e-9, 5e-6).unwrap(),
                bytes_per_rank: 1024.0,
                ..Scenario::launch(n, "greedy".parse().unwrap(), model)
            };
            group.bench_function(format!("launch+{alg}/{n}"), |b| {
                b.iter(|| black_box(scenario.run(1, 1).unwrap()))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, scale);
criterion_main!(benches);
