//! Without noise the simulated launch is the seed's equation 1 for every position and every
//! topology, and the whole launch equation 2 (greedy-tree's evaluation), for any n and model.

use greedy_sim::{Limits, Noise, Scenario, Shape, simulate_launch};
use greedy_tree::{LaunchModel, Topology};
use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;

fn topologies() -> impl Strategy<Value = Shape> {
    prop_oneof![
        Just(Shape::new(Topology::Greedy)),
        Just(Shape::new(Topology::Flat)),
        Just(Shape::new(Topology::Chain)),
        Just(Shape::new(Topology::Binomial)),
        (1u32..70).prop_map(|k| Shape::new(Topology::Kary(k))),
        (1u32..60).prop_map(|k| Shape {
            topology: Topology::Greedy,
            cap: Some(k)
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn noise_free_launch_is_equation_1(
        n in 1usize..3000,
        shape in topologies(),
        seq in 0.0f64..0.05,
        rem in 0.001f64..1.0,
        concurrency in 1u32..5,
    ) {
        let model = LaunchModel::new(seq, rem).unwrap().with_concurrency(concurrency).unwrap();
        let tree = shape.build(n, &model).unwrap();
        let capped = match shape.cap { Some(k) => model.with_max_fanout(k).unwrap(), None => model };
        let eq1 = tree.launch_times(&capped);
        let sim = simulate_launch(&tree, &model, &Noise::NONE, &Limits::default(), &mut StdRng::seed_from_u64(0));
        for (v, (s, e)) in sim.iter().zip(&eq1).enumerate() {
            prop_assert!((s - e).abs() <= 1e-9 * e.max(1.0), "position {v}: {s} vs {e}");
        }
        let whole = Scenario::launch(n, shape, model).run(3, 1).unwrap();
        let eq2 = tree.launch_time(&capped);
        prop_assert!((whole.launched.median - eq2).abs() <= 1e-9 * eq2.max(1.0));
        prop_assert_eq!(whole.launched.p5, whole.launched.p95);
    }
}
