//! The SEQ/REM launch model of Goehner et al. (seeds/greedy-optimal-launch-tree.txt, eq. 1–2),
//! extended with a parent's launch concurrency.

use crate::Error;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Largest accepted SEQ or REM, in seconds. Past it, nanosecond launch times of very large
/// trees could overflow `u64`; no real launch step takes 11 days.
const MAX_SECONDS: f64 = 1e6;

/// Cost model of a hierarchical launch.
///
/// A parent spends `seq` between starting two consecutive children; a child is up and can launch
/// its own children `rem` after its parent started launching it. A parent keeps up to
/// `concurrency` launches in flight, so its children are started `concurrency` at a time:
/// child `i` (1-based, launch order) is up at
/// `launch(parent) + seq * floor((i - 1) / concurrency) + rem`. With `concurrency = 1` this is
/// the paper's equation 1. A parent may also be limited to `max_fanout` children (Slurm's
/// TreeWidth); the greedy tree is then the fastest among trees that respect the cap.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawModel", into = "RawModel")]
pub struct LaunchModel {
    seq: f64,
    rem: f64,
    concurrency: u32,
    max_fanout: Option<u32>,
    // Builders compare times in whole nanoseconds: exact, and translation invariant, so a
    // subtree recomputed on its own compares its positions exactly as the whole tree did.
    seq_ns: u64,
    rem_ns: u64,
}

impl LaunchModel {
    /// A model with concurrency 1; `seq` ≥ 0 and `rem` ≥ 1 ns, both finite, in seconds.
    pub fn new(seq: f64, rem: f64) -> Result<Self, Error> {
        check_seconds("seq", seq, 0.0)?;
        check_seconds("rem", rem, 1e-9)?;
        Ok(LaunchModel {
            seq,
            rem,
            concurrency: 1,
            max_fanout: None,
            seq_ns: to_ns(seq),
            rem_ns: to_ns(rem),
        })
    }

    /// The same model with a parent keeping up to `concurrency` (≥ 1) launches in flight.
    pub fn with_concurrency(self, concurrency: u32) -> Result<Self, Error> {
        at_least_one("concurrency", concurrency)?;
        Ok(LaunchModel {
            concurrency,
            ..self
        })
    }

    /// The same model for a parent that keeps at most `cap` (≥ 1) launches in flight until
    /// each child is up (greedyrun's `--batch`).
    ///
    /// When `cap` launches take less than REM to start (`cap · SEQ < REM`, SEQ per child), the
    /// cap binds: the parent starts `cap` children, waits until the first is up, and so on, so
    /// its children come up in waves of `cap`, one wave per REM: concurrency `cap` with SEQ =
    /// REM per wave, less 1 ns. The nanosecond breaks the tie between a parent's next wave and
    /// its first child's own first wave in the parent's favour: the parent starts on the hello
    /// itself, the child only once it has its orders (measured: 16 hosts flat, two waves from
    /// the root, beat one wave from the root and one from its children by 17–40 %). Within a
    /// wave the children really start SEQ apart; the model counts them as one, an error below
    /// `cap · SEQ < REM` per wave. Otherwise the cap never fills and the model is unchanged.
    /// Measured: 64 hosts launched flat over ssh with `--batch 8` take 8 × REM, not
    /// 64 × SEQ + REM (docs/benchmarks.md, model validation).
    pub fn with_launch_cap(self, cap: u32) -> Result<Self, Error> {
        at_least_one("launch cap", cap)?;
        let per_child = self.seq / f64::from(self.concurrency);
        if per_child * f64::from(cap) >= self.rem {
            return Ok(self);
        }
        Ok(LaunchModel {
            max_fanout: self.max_fanout,
            ..LaunchModel::new(self.rem - 1e-9, self.rem)?.with_concurrency(cap)?
        })
    }

    /// The same model where no parent launches more than `max_fanout` (≥ 1) children.
    pub fn with_max_fanout(self, max_fanout: u32) -> Result<Self, Error> {
        at_least_one("max_fanout", max_fanout)?;
        Ok(LaunchModel {
            max_fanout: Some(max_fanout),
            ..self
        })
    }

    /// Most children a parent may launch, if capped.
    pub fn max_fanout(&self) -> Option<u32> {
        self.max_fanout
    }

    /// Seconds a parent spends between two consecutive launches (SEQ).
    pub fn seq(&self) -> f64 {
        self.seq
    }

    /// Seconds from a launch's start until the child can launch (REM).
    pub fn rem(&self) -> f64 {
        self.rem
    }

    /// Launches a parent keeps in flight at once.
    pub fn concurrency(&self) -> u32 {
        self.concurrency
    }

    /// Seconds from the parent's launch to its `child_index`-th child's (1-based).
    pub fn child_offset(&self, child_index: usize) -> f64 {
        self.seq * self.wave(child_index) as f64 + self.rem
    }

    /// [`Self::child_offset`] in whole nanoseconds, as the builders compare it.
    pub(crate) fn child_offset_ns(&self, child_index: usize) -> u64 {
        self.seq_ns * self.wave(child_index) + self.rem_ns
    }

    pub(crate) fn seq_ns(&self) -> u64 {
        self.seq_ns
    }

    pub(crate) fn rem_ns(&self) -> u64 {
        self.rem_ns
    }

    /// How many SEQ intervals precede the start of the `child_index`-th launch.
    fn wave(&self, child_index: usize) -> u64 {
        debug_assert!(child_index >= 1, "child indices are 1-based");
        (child_index.saturating_sub(1) / self.concurrency as usize) as u64
    }
}

impl Default for LaunchModel {
    /// The paper's local-file-cache pair {SEQ 0.015 s, REM 0.227 s}.
    fn default() -> Self {
        LaunchModel::new(0.015, 0.227).expect("the paper's constants are valid")
    }
}

/// The model as text, `SEQ,REM[,CONCURRENCY[,MAX_FANOUT]]` (seconds, then counts), the later
/// fields only when they are not the defaults: `0.001,0.004` for [`LaunchModel::new`]`(0.001,
/// 0.004)`. Reads back to the same model ([`FromStr`]); mpi/greedy sends a step's model to
/// every node this way.
impl fmt::Display for LaunchModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{}", self.seq, self.rem)?;
        match self.max_fanout {
            Some(k) => write!(f, ",{},{k}", self.concurrency),
            None if self.concurrency != 1 => write!(f, ",{}", self.concurrency),
            None => Ok(()),
        }
    }
}

/// Parses [`Display`](fmt::Display)'s form, validating every value as the builders do.
impl FromStr for LaunchModel {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self, Error> {
        let malformed = || Error::ModelText {
            text: text.to_string(),
        };
        let fields: Vec<&str> = text.split(',').collect();
        let (seq, rem, concurrency, max_fanout) = match fields[..] {
            [seq, rem] => (seq, rem, None, None),
            [seq, rem, c] => (seq, rem, Some(c), None),
            [seq, rem, c, k] => (seq, rem, Some(c), Some(k)),
            _ => return Err(malformed()),
        };
        let seconds = |v: &str| v.parse::<f64>().map_err(|_| malformed());
        let count = |v: &str| v.parse::<u32>().map_err(|_| malformed());
        let mut model = LaunchModel::new(seconds(seq)?, seconds(rem)?)?;
        if let Some(c) = concurrency {
            model = model.with_concurrency(count(c)?)?;
        }
        if let Some(k) = max_fanout {
            model = model.with_max_fanout(count(k)?)?;
        }
        Ok(model)
    }
}

/// Refuses a count of 0 for `name`.
fn at_least_one(name: &'static str, value: u32) -> Result<(), Error> {
    if value == 0 {
        return Err(Error::Model {
            name,
            value: value.to_string(),
            reason: "must be at least 1",
        });
    }
    Ok(())
}

fn check_seconds(name: &'static str, value: f64, min: f64) -> Result<(), Error> {
    let reason = if !value.is_finite() {
        "must be a finite number of seconds"
    } else if value < min {
        if min > 0.0 {
            "must be at least 1 ns"
        } else {
            "must not be negative"
        }
    } else if value > MAX_SECONDS {
        "must be at most 1e6 seconds"
    } else {
        return Ok(());
    };
    Err(Error::Model {
        name,
        value: value.to_string(),
        reason,
    })
}

fn to_ns(seconds: f64) -> u64 {
    (seconds * 1e9).round() as u64
}

/// The serialised form: validated on the way in. Every field is always written (no
/// `skip_serializing_if`), so formats that are not self-describing (postcard, greedyrun's
/// protocol) read back what they wrote; JSON input may leave out the defaults.
#[derive(Serialize, Deserialize)]
struct RawModel {
    seq: f64,
    rem: f64,
    #[serde(default = "one")]
    concurrency: u32,
    #[serde(default)]
    max_fanout: Option<u32>,
}

fn one() -> u32 {
    1
}

impl TryFrom<RawModel> for LaunchModel {
    type Error = Error;
    fn try_from(raw: RawModel) -> Result<Self, Error> {
        let model = LaunchModel::new(raw.seq, raw.rem)?.with_concurrency(raw.concurrency)?;
        match raw.max_fanout {
            Some(k) => model.with_max_fanout(k),
            None => Ok(model),
        }
    }
}

impl From<LaunchModel> for RawModel {
    fn from(m: LaunchModel) -> Self {
        RawModel {
            seq: m.seq,
            rem: m.rem,
            concurrency: m.concurrency,
            max_fanout: m.max_fanout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_reads_back_and_names_its_fault() {
        let plain = LaunchModel::new(0.001, 0.004).unwrap();
        assert_eq!(plain.to_string(), "0.001,0.004");
        let wide = plain.with_concurrency(4).unwrap();
        assert_eq!(wide.to_string(), "0.001,0.004,4");
        let capped = plain.with_max_fanout(3).unwrap();
        assert_eq!(capped.to_string(), "0.001,0.004,1,3");
        let waves = LaunchModel::new(0.006, 0.388)
            .unwrap()
            .with_launch_cap(8)
            .unwrap();
        for m in [plain, wide, capped, waves, LaunchModel::default()] {
            assert_eq!(m.to_string().parse::<LaunchModel>(), Ok(m), "{m}");
        }
        assert_eq!("1e-3,4e-3".parse::<LaunchModel>(), Ok(plain));
        for bad in [
            "",
            "0.001",
            "0.001;0.004",
            "0.001,x",
            "0.001,0.004,",
            "1,2,3,4,5",
        ] {
            let err = bad.parse::<LaunchModel>().unwrap_err().to_string();
            assert!(err.contains("expected SEQ,REM"), "{bad:?}: {err}");
        }
        let err = "0.001,0".parse::<LaunchModel>().unwrap_err().to_string();
        assert_eq!(err, "model: rem = 0: must be at least 1 ns");
        assert!("0.001,0.004,0".parse::<LaunchModel>().is_err());
        assert!("0.001,0.004,1,0".parse::<LaunchModel>().is_err());
    }

    #[test]
    fn rejects_out_of_range_parameters() {
        let bad = [
            (f64::NAN, 0.2, "seq", "finite"),
            (-0.1, 0.2, "seq", "negative"),
            (0.01, 0.0, "rem", "at least 1 ns"),
            (0.01, f64::INFINITY, "rem", "finite"),
            (2e6, 0.2, "seq", "at most"),
        ];
        for (seq, rem, name, reason) in bad {
            let err = LaunchModel::new(seq, rem).unwrap_err().to_string();
            assert!(
                err.contains(name) && err.contains(reason),
                "{seq} {rem}: {err}"
            );
        }
        assert!(LaunchModel::default().with_concurrency(0).is_err());
        assert!(LaunchModel::default().with_max_fanout(0).is_err());
        assert!(LaunchModel::default().with_launch_cap(0).is_err());
    }

    #[test]
    fn a_binding_launch_cap_makes_waves_of_one_rem() {
        let m = LaunchModel::new(0.006, 0.388)
            .unwrap()
            .with_max_fanout(50)
            .unwrap();
        let capped = m.with_launch_cap(8).unwrap();
        assert_eq!((capped.rem(), capped.concurrency()), (0.388, 8));
        assert_eq!(capped.max_fanout(), Some(50));
        // Children 1–8 up after one REM, 9–16 after two (less 1 ns): what flat launches
        // measured.
        let ns: Vec<u64> = [1, 8, 9, 16, 17]
            .map(|i| capped.child_offset_ns(i))
            .to_vec();
        assert_eq!(
            ns,
            [
                388_000_000,
                388_000_000,
                775_999_999,
                775_999_999,
                1_163_999_998
            ]
        );
        // One in flight: each child waits for the previous one to be up.
        let one = m.with_launch_cap(1).unwrap();
        assert_eq!((one.seq_ns(), one.concurrency()), (387_999_999, 1));
        // A cap that 8 launches of SEQ cannot fill within REM changes nothing.
        let slow = LaunchModel::new(0.05, 0.2).unwrap();
        assert_eq!(slow.with_launch_cap(8).unwrap(), slow);
    }

    #[test]
    fn offsets_follow_equation_1_and_concurrency() {
        let m = LaunchModel::new(0.01, 0.2).unwrap();
        assert_eq!(m.child_offset(1), 0.2);
        assert!((m.child_offset(3) - 0.22).abs() < 1e-12);
        let c = m.with_concurrency(2).unwrap();
        let ns: Vec<u64> = (1..=5).map(|i| c.child_offset_ns(i)).collect();
        assert_eq!(
            ns,
            [
                200_000_000,
                200_000_000,
                210_000_000,
                210_000_000,
                220_000_000
            ]
        );
    }

    #[test]
    fn serde_validates() {
        let m: LaunchModel = serde_json::from_str(r#"{"seq":0.007,"rem":0.172}"#).unwrap();
        assert_eq!((m.seq(), m.rem(), m.concurrency()), (0.007, 0.172, 1));
        assert!(serde_json::from_str::<LaunchModel>(r#"{"seq":-1,"rem":0.1}"#).is_err());
        let capped: LaunchModel =
            serde_json::from_str(r#"{"seq":0.01,"rem":0.1,"max_fanout":4}"#).unwrap();
        assert_eq!(capped.max_fanout(), Some(4));
        assert!(
            serde_json::from_str::<LaunchModel>(r#"{"seq":0,"rem":1,"max_fanout":0}"#).is_err()
        );
    }
}
