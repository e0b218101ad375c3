//! The launch as discrete events: each parent starts its children wave by wave (SEQ apart,
//! `concurrency` per wave), each child is up REM after its launch started, then launches its
//! own. Without noise and shared CPU this is equation 1 of the seed, event by event.

use crate::queue::EventQueue;
use crate::{Error, Noise};
use greedy_tree::{LaunchModel, Tree};
use rand::Rng;

/// CPU shared by every host (the emulated cluster: all namespaces on a few cores).
///
/// `work` seconds of each launch's REM are CPU work that must run on one of `cores` cores;
/// the rest of REM is latency (network, waiting). Launches whose work overlaps queue for a
/// core, first come first served. With enough cores the launch is the model's again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SharedCpu {
    /// Cores every host shares.
    pub cores: u32,
    /// CPU seconds of one launch (part of REM, so at most REM).
    pub work: f64,
}

impl SharedCpu {
    /// Checks `cores ≥ 1` and `0 ≤ work`.
    pub fn new(cores: u32, work: f64) -> Result<SharedCpu, Error> {
        if cores == 0 {
            return Err(Error::param("cores", cores, "must be at least 1"));
        }
        if !(0.0..=1e6).contains(&work) {
            return Err(Error::param(
                "cpu-work",
                work,
                "must be in [0, 1e6] seconds",
            ));
        }
        Ok(SharedCpu { cores, work })
    }
}

/// What a launch competes for beyond the model: shared CPU, and a cap on launches in flight.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Limits {
    /// CPU shared by every host, if any.
    pub cpu: Option<SharedCpu>,
    /// Most launches a parent keeps in flight until their children are up (greedyrun's
    /// `--batch`); none by default, as in the model.
    pub batch: Option<u32>,
}

const WAVE: u8 = 0;
const UP: u8 = 1;
const CPU: u8 = 2;

/// Simulates one launch over `tree`; returns the time each position is up (the root at 0).
///
/// Memory: the tree, one `f64` and one `u32` per position, and at most one pending event per
/// position, so 10^6 positions take a few tens of MB.
pub fn simulate_launch(
    tree: &Tree,
    model: &LaunchModel,
    noise: &Noise,
    limits: &Limits,
    rng: &mut impl Rng,
) -> Vec<f64> {
    if tree.is_empty() {
        return Vec::new();
    }
    let mut launch = Launch::new(tree, model, noise, limits, rng);
    launch.queue.push(0.0, 0, WAVE);
    while let Some((t, v, kind)) = launch.queue.pop() {
        match kind {
            WAVE => launch.wave(t, v),
            CPU => launch.cpu(t, v),
            _ => launch.come_up(t, v),
        }
    }
    launch.up
}

/// The state of one simulated launch, one method per kind of event.
struct Launch<'a, R> {
    tree: &'a Tree,
    model: &'a LaunchModel,
    noise: &'a Noise,
    limits: &'a Limits,
    rng: &'a mut R,
    /// Without noise no random number is drawn.
    quiet: bool,
    /// When each position is up.
    up: Vec<f64>,
    sizes: &'a [u32],
    /// The next child each parent will launch (positions are preorder, so children of v are
    /// v + 1, then each next one past its elder sibling's subtree).
    next: Vec<u32>,
    /// With shared CPU: the work each launched child still has to run…
    work: Vec<f64>,
    /// …and when each core frees.
    cores: Vec<f64>,
    /// The batch cap, `u32::MAX` without one.
    batch: u32,
    /// With a batch cap: launches in flight per parent…
    in_flight: Vec<u32>,
    /// …and parents waiting for a free slot.
    blocked: Vec<bool>,
    queue: EventQueue,
}

impl<'a, R: Rng> Launch<'a, R> {
    fn new(
        tree: &'a Tree,
        model: &'a LaunchModel,
        noise: &'a Noise,
        limits: &'a Limits,
        rng: &'a mut R,
    ) -> Self {
        let n = tree.len();
        let cpu = limits.cpu.as_ref();
        let (in_flight, blocked) = match limits.batch {
            Some(_) => (vec![0u32; n], vec![false; n]),
            None => (Vec::new(), Vec::new()),
        };
        Launch {
            tree,
            model,
            noise,
            limits,
            rng,
            quiet: noise.is_none(),
            up: vec![0.0; n],
            sizes: tree.subtree_sizes(),
            next: (0..n as u32).map(|v| v + 1).collect(),
            work: if cpu.is_some() {
                vec![0.0; n]
            } else {
                Vec::new()
            },
            cores: vec![0.0; cpu.map_or(0, |c| c.cores as usize)],
            batch: limits.batch.unwrap_or(u32::MAX),
            in_flight,
            blocked,
            queue: EventQueue::with_capacity(1024),
        }
    }

    /// Starts the next wave of v's children, and schedules the wave after it.
    fn wave(&mut self, t: f64, v: usize) {
        let model = self.model;
        let end = v + self.sizes[v] as usize;
        let slots = match self.limits.batch {
            Some(_) => model.concurrency().min(self.batch - self.in_flight[v]),
            None => model.concurrency(),
        };
        if slots == 0 {
            self.blocked[v] = true;
            return;
        }
        for _ in 0..slots {
            let c = self.next[v] as usize;
            if c >= end {
                break;
            }
            self.next[v] = (c + self.sizes[c] as usize) as u32;
            if self.limits.batch.is_some() {
                self.in_flight[v] += 1;
            }
            self.start(t, c);
        }
        if (self.next[v] as usize) < end {
            let seq = if self.quiet {
                model.seq()
            } else {
                model.seq() * self.noise.seq_factor(self.rng)
            };
            self.queue.push(t + seq, v, WAVE);
        }
    }

    /// Starts launching child `c` at `t`: it is up after REM, or first queues for a core.
    fn start(&mut self, t: f64, c: usize) {
        let model = self.model;
        let rem = if self.quiet {
            model.rem()
        } else {
            model.rem() * self.noise.rem_factor(self.rng)
        };
        match self.limits.cpu.as_ref() {
            None => self.queue.push(t + rem, c, UP),
            Some(cpu) => {
                let share = (cpu.work / model.rem()).min(1.0);
                self.work[c] = rem * share;
                self.queue.push(t + rem * (1.0 - share), c, CPU);
            }
        }
    }

    /// v's launch latency is over; its CPU work runs on the first free core.
    fn cpu(&mut self, t: f64, v: usize) {
        let (core, free) = self
            .cores
            .iter()
            .copied()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .expect("at least one core");
        let done = t.max(free) + self.work[v];
        self.cores[core] = done;
        self.queue.push(done, v, UP);
    }

    /// v is up: it frees its parent's slot and starts launching its own children.
    fn come_up(&mut self, t: f64, v: usize) {
        self.up[v] = t;
        if self.limits.batch.is_some() {
            let p = self.tree.parent(v).expect("only children come up");
            self.in_flight[p] -= 1;
            if std::mem::take(&mut self.blocked[p]) {
                self.queue.push(t, p, WAVE);
            }
        }
        if self.sizes[v] > 1 {
            self.queue.push(t, v, WAVE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use greedy_tree::Topology;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn run(tree: &Tree, model: &LaunchModel, cpu: Option<&SharedCpu>) -> Vec<f64> {
        let limits = Limits {
            cpu: cpu.copied(),
            batch: None,
        };
        simulate_launch(
            tree,
            model,
            &Noise::NONE,
            &limits,
            &mut StdRng::seed_from_u64(1),
        )
    }

    #[test]
    fn batch_caps_launches_in_flight() {
        // Flat tree of 6, SEQ 1, REM 10, at most 2 in flight: 1 and 2 start at 0 and 1, the
        // third waits for the first to be up (10), the fourth for the second (11), …
        let m = LaunchModel::new(1.0, 10.0).unwrap();
        let t = Topology::Flat.build(6, &m);
        let limits = Limits {
            cpu: None,
            batch: Some(2),
        };
        let up = simulate_launch(&t, &m, &Noise::NONE, &limits, &mut StdRng::seed_from_u64(1));
        assert_eq!(up, [0.0, 10.0, 11.0, 20.0, 21.0, 30.0]);
    }

    #[test]
    fn by_hand_with_concurrency() {
        // Flat tree of 5, SEQ 1, REM 10, two launches in flight: waves at 0 and 1.
        let m = LaunchModel::new(1.0, 10.0)
            .unwrap()
            .with_concurrency(2)
            .unwrap();
        let t = Topology::Flat.build(5, &m);
        assert_eq!(run(&t, &m, None), [0.0, 10.0, 10.0, 11.0, 11.0]);
    }

    #[test]
    fn shared_cpu_serialises_the_work() {
        // Flat tree of 5, SEQ 0, REM 1 of which 0.5 s CPU on one core: the four children's
        // latencies overlap, their CPU halves queue: up at 1, 1.5, 2, 2.5.
        let m = LaunchModel::new(0.0, 1.0).unwrap();
        let t = Topology::Flat.build(5, &m);
        let one = SharedCpu::new(1, 0.5).unwrap();
        assert_eq!(run(&t, &m, Some(&one)), [0.0, 1.0, 1.5, 2.0, 2.5]);
        // As many cores as launches: the model's times again.
        let four = SharedCpu::new(4, 0.5).unwrap();
        assert_eq!(run(&t, &m, Some(&four)), [0.0, 1.0, 1.0, 1.0, 1.0]);
    }

    #[test]
    fn noise_is_reproducible_and_only_slows() {
        let m = LaunchModel::new(0.01, 0.2).unwrap();
        let t = Topology::Greedy.build(500, &m);
        let noise = Noise::new(crate::Jitter::Uniform(0.0), 0.05, 5.0).unwrap();
        let none = Limits::default();
        let a = simulate_launch(&t, &m, &noise, &none, &mut StdRng::seed_from_u64(3));
        let b = simulate_launch(&t, &m, &noise, &none, &mut StdRng::seed_from_u64(3));
        assert_eq!(a, b);
        let quiet = t.launch_times(&m);
        assert!(a.iter().zip(&quiet).all(|(x, q)| x + 1e-9 >= *q));
        assert!(a.iter().fold(0.0, |m: f64, &x| m.max(x)) > t.launch_time(&m) + 0.5);
    }
}
