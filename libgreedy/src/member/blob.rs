//! Bytes through a PMI-1 KVS: hex in values of the agent's `vallen_max`, the first value led by
//! the number of values and the length, so a reader knows when it has everything.

use crate::error::{Error, Result};
use crate::pmi::Pmi1;

/// Room kept in a value for the `count:len:` lead.
const LEAD: usize = 24;

/// The key of value `index` of `rank`'s contribution to collective `seq` (`slot` tells apart
/// several contributions of one rank, as a scatter's parts).
pub(crate) fn key(seq: u64, rank: u32, slot: u32, index: usize) -> String {
    format!("libi.{seq}.{rank}.{slot}.{index}")
}

/// The bytes each value holds.
fn per_value(vallen: usize) -> usize {
    (vallen.saturating_sub(LEAD) / 2).max(1)
}

/// Puts `data` under the keys of (`seq`, `rank`, `slot`).
pub(crate) fn put(pmi: &mut Pmi1, seq: u64, rank: u32, slot: u32, data: &[u8]) -> Result<()> {
    let chunk = per_value(pmi.maxes.vallen);
    let count = data.len().div_ceil(chunk).max(1);
    for index in 0..count {
        let part = &data[(index * chunk).min(data.len())..((index + 1) * chunk).min(data.len())];
        let mut value = if index == 0 {
            format!("{count}:{}:", data.len())
        } else {
            String::new()
        };
        value.push_str(&hex(part));
        pmi.put(&key(seq, rank, slot, index), &value)?;
    }
    Ok(())
}

/// Reads back what `rank` put under (`seq`, `slot`), after a barrier.
pub(crate) fn get(
    pmi: &mut Pmi1,
    operation: &'static str,
    seq: u64,
    rank: u32,
    slot: u32,
) -> Result<Vec<u8>> {
    let damaged = |why: String| Error::Contribution {
        operation,
        seq,
        rank,
        why,
    };
    let first = pmi
        .get(&key(seq, rank, slot, 0))?
        .ok_or_else(|| damaged("no value".into()))?;
    let (count, len, rest) = lead(&first).ok_or_else(|| damaged("no length".into()))?;
    let mut data = unhex(rest).ok_or_else(|| damaged("not hex".into()))?;
    for index in 1..count {
        let value = pmi
            .get(&key(seq, rank, slot, index))?
            .ok_or_else(|| damaged(format!("value {index} of {count} missing")))?;
        data.extend(unhex(&value).ok_or_else(|| damaged("not hex".into()))?);
    }
    if data.len() != len {
        return Err(damaged(format!("{} bytes, not {len}", data.len())));
    }
    Ok(data)
}

/// `count:len:rest`.
fn lead(value: &str) -> Option<(usize, usize, &str)> {
    let (count, rest) = value.split_once(':')?;
    let (len, rest) = rest.split_once(':')?;
    Some((count.parse().ok()?, len.parse().ok()?, rest))
}

fn hex(data: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(data.len() * 2);
    for b in data {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Hex for the front-end channel, which shares this encoding.
pub(crate) fn encode(data: &[u8]) -> String {
    hex(data)
}

/// The inverse of [`encode`].
pub(crate) fn decode(s: &str) -> Option<Vec<u8>> {
    unhex(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_every_byte() {
        let data: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&hex(&data)).unwrap(), data);
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn the_lead_says_count_and_length() {
        assert_eq!(lead("3:1000:ab"), Some((3, 1000, "ab")));
        assert_eq!(lead("3:ab"), None);
        assert!(per_value(1024) * 2 + LEAD <= 1024);
    }
}
