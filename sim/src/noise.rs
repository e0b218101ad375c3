//! Launch noise: a multiplicative jitter on every launch step, and stragglers.

use crate::Error;
use rand::{Rng, RngExt};
use rand_distr::{Distribution, LogNormal};
use std::fmt;
use std::str::FromStr;

/// Distribution of the factor every SEQ and REM of one launch is multiplied by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Jitter {
    /// Always 1: the model's own times.
    None,
    /// Uniform on `[1 − f, 1 + f]`, `0 ≤ f < 1`.
    Uniform(f64),
    /// Log-normal with median 1 and shape `σ` (a long right tail, as measured start-ups have).
    LogNormal(f64),
}

impl Jitter {
    fn sample(&self, rng: &mut impl Rng) -> f64 {
        match *self {
            Jitter::None => 1.0,
            Jitter::Uniform(f) => 1.0 + f * (2.0 * rng.random::<f64>() - 1.0),
            Jitter::LogNormal(sigma) => LogNormal::new(0.0, sigma)
                .expect("sigma checked when parsed")
                .sample(rng),
        }
    }
}

impl fmt::Display for Jitter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Jitter::None => f.write_str("none"),
            Jitter::Uniform(x) => write!(f, "uniform:{x}"),
            Jitter::LogNormal(s) => write!(f, "lognormal:{s}"),
        }
    }
}

impl FromStr for Jitter {
    type Err = Error;
    /// `none`, `uniform:F` (0 ≤ F < 1) or `lognormal:SIGMA` (0 ≤ σ ≤ 3).
    fn from_str(s: &str) -> Result<Jitter, Error> {
        let bad = |reason| Error::param("jitter", s, reason);
        if s == "none" {
            return Ok(Jitter::None);
        }
        let (kind, value) = s
            .split_once(':')
            .ok_or_else(|| bad("expected none, uniform:F or lognormal:SIGMA"))?;
        let x: f64 = value
            .parse()
            .map_err(|_| bad("the parameter must be a number"))?;
        match kind {
            "uniform" if (0.0..1.0).contains(&x) => Ok(Jitter::Uniform(x)),
            "uniform" => Err(bad("F must be in [0, 1)")),
            "lognormal" if (0.0..=3.0).contains(&x) => Ok(Jitter::LogNormal(x)),
            "lognormal" => Err(bad("SIGMA must be in [0, 3]")),
            _ => Err(bad("expected none, uniform:F or lognormal:SIGMA")),
        }
    }
}

/// Noise of one simulated launch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Noise {
    /// Per-launch factor on SEQ and REM (drawn independently for each).
    pub jitter: Jitter,
    /// Probability that a launch straggles.
    pub straggler_p: f64,
    /// Factor a straggling launch's REM is multiplied by (≥ 1).
    pub straggler_factor: f64,
}

impl Noise {
    /// No noise: the simulation reproduces equation 1 exactly.
    pub const NONE: Noise = Noise {
        jitter: Jitter::None,
        straggler_p: 0.0,
        straggler_factor: 1.0,
    };

    /// Checks the straggler parameters.
    pub fn new(jitter: Jitter, straggler_p: f64, straggler_factor: f64) -> Result<Noise, Error> {
        if !(0.0..=1.0).contains(&straggler_p) {
            return Err(Error::param(
                "straggler-p",
                straggler_p,
                "must be in [0, 1]",
            ));
        }
        if !(1.0..=1e6).contains(&straggler_factor) {
            return Err(Error::param(
                "straggler-factor",
                straggler_factor,
                "must be in [1, 1e6]",
            ));
        }
        Ok(Noise {
            jitter,
            straggler_p,
            straggler_factor,
        })
    }

    /// Whether every draw is 1 (no random numbers are used then).
    pub fn is_none(&self) -> bool {
        self.jitter == Jitter::None && (self.straggler_p == 0.0 || self.straggler_factor == 1.0)
    }

    /// Factor of one SEQ interval.
    pub(crate) fn seq_factor(&self, rng: &mut impl Rng) -> f64 {
        self.jitter.sample(rng)
    }

    /// Factor of one launch's REM: jitter, times the straggler slowdown with probability p.
    pub(crate) fn rem_factor(&self, rng: &mut impl Rng) -> f64 {
        let f = self.jitter.sample(rng);
        if self.straggler_p > 0.0 && rng.random_bool(self.straggler_p) {
            f * self.straggler_factor
        } else {
            f
        }
    }
}

impl Default for Noise {
    fn default() -> Self {
        Noise::NONE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn parses_and_refuses_jitter() {
        assert_eq!("none".parse::<Jitter>().unwrap(), Jitter::None);
        assert_eq!(
            "uniform:0.1".parse::<Jitter>().unwrap(),
            Jitter::Uniform(0.1)
        );
        assert_eq!(
            "lognormal:0.25".parse::<Jitter>().unwrap(),
            Jitter::LogNormal(0.25)
        );
        for (bad, why) in [
            ("uniform:1.5", "[0, 1)"),
            ("gauss:1", "expected"),
            ("lognormal:x", "number"),
            ("uniform", "expected"),
        ] {
            let err = bad.parse::<Jitter>().unwrap_err().to_string();
            assert!(err.contains(bad) && err.contains(why), "{bad}: {err}");
        }
        assert!(Noise::new(Jitter::None, 1.5, 2.0).is_err());
        assert!(Noise::new(Jitter::None, 0.1, 0.5).is_err());
    }

    #[test]
    fn lognormal_has_median_one_and_stragglers_their_rate() {
        let noise = Noise::new(Jitter::LogNormal(0.3), 0.1, 10.0).unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        let mut f: Vec<f64> = (0..20_000).map(|_| noise.rem_factor(&mut rng)).collect();
        let slow = f.iter().filter(|&&x| x > 4.0).count() as f64 / f.len() as f64;
        assert!((slow - 0.1).abs() < 0.01, "straggler share {slow}");
        f.sort_by(f64::total_cmp);
        let median = f[f.len() / 2];
        // 10 % stragglers shift the median up a little: the 0.5/0.9 quantile of the rest.
        assert!((1.0..1.1).contains(&median), "median {median}");
    }
}
