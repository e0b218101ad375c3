//! `RankSet`: a set of ranks kept as sorted, disjoint, non-adjacent inclusive ranges.
//!
//! A call-tree node of a 100 000-rank job holds a few ranges, not 100 000 numbers: ranks that
//! wait in the same place are mostly contiguous. Because the ranges are kept normalised, two sets
//! with the same members are equal (`==`) however they were built, which is what lets
//! `CallTree::merge` be checked against a single-tree insert.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Error;

/// A set of ranks, printed and serialised as ranges: `0-62,64-127`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct RankSet {
    /// Inclusive `(first, last)` ranges, ascending, with a gap of at least one between two.
    ranges: Vec<(u32, u32)>,
}

impl RankSet {
    /// The empty set.
    pub fn new() -> RankSet {
        RankSet::default()
    }

    /// Adds `rank`, joining the ranges it touches.
    pub fn insert(&mut self, rank: u32) {
        // Ranks mostly arrive in ascending order: check the end before searching.
        if let Some(last) = self.ranges.last_mut()
            && rank > last.1
        {
            if rank == last.1 + 1 {
                last.1 = rank;
            } else {
                self.ranges.push((rank, rank));
            }
            return;
        }
        self.insert_range(rank, rank);
    }

    /// Adds every rank of `first..=last`.
    fn insert_range(&mut self, first: u32, last: u32) {
        let other = RankSet {
            ranges: vec![(first, last)],
        };
        self.union(&other);
    }

    /// Adds every rank of `other`, in one pass over both.
    pub fn union(&mut self, other: &RankSet) {
        if other.ranges.is_empty() {
            return;
        }
        let mut all = Vec::with_capacity(self.ranges.len() + other.ranges.len());
        let (mut a, mut b) = (
            self.ranges.iter().peekable(),
            other.ranges.iter().peekable(),
        );
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(x), Some(y)) if x.0 <= y.0 => a.next(),
                (Some(_), Some(_)) => b.next(),
                (Some(_), None) => a.next(),
                (None, _) => b.next(),
            };
            let Some(&(first, last)) = next else { break };
            push_joined(&mut all, first, last);
        }
        self.ranges = all;
    }

    /// The ranks of `self` that are not in `other`.
    pub fn difference(&self, other: &RankSet) -> RankSet {
        let mut left = Vec::new();
        let mut cut = other.ranges.iter().peekable();
        for &(mut first, last) in &self.ranges {
            // Skip the cuts wholly before this range; they cannot touch later ranges either.
            while cut.next_if(|c| c.1 < first).is_some() {}
            let mut rest = Some(first);
            for &(c0, c1) in cut.clone().take_while(|c| c.0 <= last) {
                if c0 > first {
                    left.push((first, c0 - 1));
                }
                rest = c1.checked_add(1).filter(|&f| f <= last);
                let Some(f) = rest else { break };
                first = f;
            }
            if let Some(f) = rest {
                left.push((f, last));
            }
        }
        RankSet { ranges: left }
    }

    /// Whether `rank` is in the set.
    pub fn contains(&self, rank: u32) -> bool {
        let i = self.ranges.partition_point(|r| r.1 < rank);
        self.ranges.get(i).is_some_and(|r| r.0 <= rank)
    }

    /// The number of ranks (u64: the full u32 range has 2^32 members).
    pub fn len(&self) -> u64 {
        self.ranges.iter().map(|&(f, l)| u64::from(l - f) + 1).sum()
    }

    /// Whether the set has no rank.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The lowest rank, if any.
    pub fn first(&self) -> Option<u32> {
        self.ranges.first().map(|r| r.0)
    }

    /// The inclusive ranges, ascending.
    pub fn ranges(&self) -> &[(u32, u32)] {
        &self.ranges
    }
}

/// Appends `first..=last` (not below the last range's start) to sorted `ranges`, joining it
/// with the last range when they overlap or touch.
fn push_joined(ranges: &mut Vec<(u32, u32)>, first: u32, last: u32) {
    match ranges.last_mut() {
        Some(prev) if u64::from(first) <= u64::from(prev.1) + 1 => prev.1 = prev.1.max(last),
        _ => ranges.push((first, last)),
    }
}

impl FromIterator<u32> for RankSet {
    fn from_iter<I: IntoIterator<Item = u32>>(ranks: I) -> RankSet {
        let mut set = RankSet::new();
        for rank in ranks {
            set.insert(rank);
        }
        set
    }
}

impl fmt::Display for RankSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, &(first, last)) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if first == last {
                write!(f, "{first}")?;
            } else {
                write!(f, "{first}-{last}")?;
            }
        }
        Ok(())
    }
}

impl FromStr for RankSet {
    type Err = Error;

    /// Reads `0-62,64` (the `Display` form); ranges may come in any order and overlap. The empty
    /// text is the empty set.
    fn from_str(text: &str) -> Result<RankSet, Error> {
        let bad = || Error::RankSet {
            text: text.to_string(),
        };
        let mut set = RankSet::new();
        for part in text.split(',').filter(|p| !p.is_empty()) {
            let (first, last) = part.split_once('-').unwrap_or((part, part));
            let first: u32 = first.parse().map_err(|_| bad())?;
            let last: u32 = last.parse().map_err(|_| bad())?;
            if first > last {
                return Err(bad());
            }
            set.insert_range(first, last);
        }
        Ok(set)
    }
}

/// Serialised as its `Display` text: the shortest form for the ranges daemons exchange, and
/// readable in a dump.
impl Serialize for RankSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RankSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RankSet, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(text: &str) -> RankSet {
        text.parse().unwrap()
    }

    #[test]
    fn insert_joins_neighbours() {
        let check = |ranks: &[u32], expect: &str| {
            let s: RankSet = ranks.iter().copied().collect();
            assert_eq!(s.to_string(), expect, "{ranks:?}");
        };
        check(&[], "");
        check(&[5], "5");
        check(&[0, 1, 2, 4], "0-2,4");
        check(&[4, 2, 0, 1], "0-2,4");
        check(&[3, 1, 2], "1-3");
        check(&[7, 7, 7], "7");
        check(&[u32::MAX, 0, u32::MAX - 1], "0,4294967294-4294967295");
    }

    #[test]
    fn union_and_difference() {
        let check = |a: &str, b: &str, union: &str, diff: &str| {
            let mut u = set(a);
            u.union(&set(b));
            assert_eq!(u.to_string(), union, "{a} | {b}");
            assert_eq!(set(a).difference(&set(b)).to_string(), diff, "{a} - {b}");
        };
        check("", "", "", "");
        check("0-3", "", "0-3", "0-3");
        check("", "0-3", "0-3", "");
        check("0-3", "4-6", "0-6", "0-3");
        check("0-3,10-12", "2-11", "0-12", "0-1,12");
        check("0-10", "2,4,6-7", "0-10", "0-1,3,5,8-10");
        check("5-9", "0-20", "0-20", "");
        check("0-4294967295", "4294967295", "0-4294967295", "0-4294967294");
    }

    #[test]
    fn len_contains_first() {
        let s = set("0-62,64-127");
        assert_eq!((s.len(), s.first()), (127, Some(0)));
        assert!(s.contains(62) && !s.contains(63) && s.contains(127) && !s.contains(128));
        assert_eq!(set("0-4294967295").len(), 1 << 32);
        assert!(RankSet::new().is_empty() && RankSet::new().first().is_none());
    }

    #[test]
    fn parse_normalises_and_refuses_junk() {
        assert_eq!(set("4,0-2,3").to_string(), "0-4");
        for bad in ["x", "1-", "-1", "3-1", "1 ,2", "4294967296"] {
            assert!(bad.parse::<RankSet>().is_err(), "{bad}");
        }
    }

    #[test]
    fn union_and_difference_agree_with_btreeset() {
        use std::collections::BTreeSet;
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut random_set = || {
            let mut ranks = BTreeSet::new();
            for _ in 0..20 {
                // xorshift64, small ranks so sets touch and overlap.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ranks.insert((x % 40) as u32);
            }
            ranks
        };
        for _ in 0..500 {
            let (a, b) = (random_set(), random_set());
            let (sa, sb): (RankSet, RankSet) =
                (a.iter().copied().collect(), b.iter().copied().collect());
            let mut union = sa.clone();
            union.union(&sb);
            assert_eq!(
                union,
                a.union(&b).copied().collect::<RankSet>(),
                "{sa} | {sb}"
            );
            let diff = sa.difference(&sb);
            assert_eq!(
                diff,
                a.difference(&b).copied().collect::<RankSet>(),
                "{sa} - {sb}"
            );
            assert_eq!(diff.len(), a.difference(&b).count() as u64);
        }
    }

    #[test]
    fn serde_is_the_text() {
        let s = set("0-62,64-127");
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, r#""0-62,64-127""#);
        assert_eq!(serde_json::from_str::<RankSet>(&json).unwrap(), s);
    }
}
