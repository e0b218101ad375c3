//! Slurm hostlist expressions: `n[1-4,7],gpu[01-02]` ⇄ the host names, in order.
//!
//! Semantics follow Slurm's `hostlist_create`/`hostlist_ranged_string` (src/common/hostlist.c):
//! commas (or white space) separate expressions; inside brackets, commas separate numbers and
//! `lo-hi` ranges; a range keeps the zero padding of its lower bound (`[08-10]` gives `08 09
//! 10`); several bracket groups in one expression form their product, the leftmost varying
//! slowest. Order and duplicates are kept: the launch tree is laid over the list as given.
//! Unlike the `hostlist-parser` crate (which drops duplicates and accepts `[7-5]`) and the
//! `hostlist` crate (no compression, no error position), this follows Slurm exactly.

use crate::Error;
use std::fmt::Write as _;

/// Most hosts one expression may expand to; past it a typo like `n[1-9999999999]` would
/// exhaust memory instead of failing.
pub const MAX_HOSTS: usize = 1 << 24;

/// Most bytes of host names one expression may expand to: [`MAX_HOSTS`] alone does not bound
/// memory, since every name repeats the expression's text (a 144-byte hostfile line made 11
/// million names of 140 bytes). 2^24 names of 16 bytes fit.
pub const MAX_NAME_BYTES: usize = 1 << 28;

/// The host names of a hostlist expression, in order.
///
/// ```
/// let hosts = greedy_tree::hostlist::expand("n[1-3,7],gpu[01-02]").unwrap();
/// assert_eq!(hosts, ["n1", "n2", "n3", "n7", "gpu01", "gpu02"]);
/// ```
pub fn expand(expr: &str) -> Result<Vec<String>, Error> {
    expand_at_most(expr, MAX_HOSTS)
}

/// [`expand`] with at most `max_hosts` (≤ [`MAX_HOSTS`]) hosts: the fuzz targets use a small
/// cap, so that legal lists of millions of hosts do not take their time.
pub fn expand_at_most(expr: &str, max_hosts: usize) -> Result<Vec<String>, Error> {
    let max_hosts = max_hosts.min(MAX_HOSTS);
    let chars: Vec<char> = expr.chars().collect();
    let mut hosts = Vec::new();
    let mut bytes = 0;
    let mut pos = 0;
    loop {
        while pos < chars.len() && is_separator(chars[pos]) {
            pos += 1;
        }
        if pos == chars.len() {
            break;
        }
        let (parts, next) = parse_one(expr, &chars, pos)?;
        expand_parts(&parts, &mut hosts, &mut bytes, max_hosts, expr, pos)?;
        pos = next;
    }
    if hosts.is_empty() {
        return Err(Error::NoHosts {
            source_name: "hostlist",
        });
    }
    Ok(hosts)
}

/// The hostlist expression of `hosts`, as Slurm prints it, that [`expand`] turns back into
/// the same list: consecutive names that share a prefix and a number width are bracketed.
///
/// ```
/// let hosts = ["n1", "n2", "n3", "n4", "n7", "gpu01", "gpu02"];
/// assert_eq!(greedy_tree::hostlist::compress(&hosts), "n[1-4,7],gpu[01-02]");
/// ```
pub fn compress<S: AsRef<str>>(hosts: &[S]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < hosts.len() {
        let host = hosts[i].as_ref();
        if !out.is_empty() {
            out.push(',');
        }
        let Some(first) = Numbered::split(host) else {
            out.push_str(host);
            i += 1;
            continue;
        };
        // Take every following host of the same prefix and width into one bracket group.
        let mut numbers = vec![first.value];
        let mut j = i + 1;
        while let Some(next) = hosts.get(j).and_then(|h| Numbered::split(h.as_ref())) {
            if next.prefix != first.prefix || !first.same_width(&next) {
                break;
            }
            numbers.push(next.value);
            j += 1;
        }
        if numbers.len() == 1 {
            out.push_str(host);
        } else {
            out.push_str(first.prefix);
            out.push('[');
            write_ranges(&mut out, &numbers, first.width);
            out.push(']');
        }
        i = j;
    }
    out
}

fn is_separator(c: char) -> bool {
    c == ',' || c.is_whitespace()
}

/// One piece of an expression: literal text, or a bracketed list of numbers.
enum Part {
    Text(String),
    /// `(lo, hi, width)`: `width` > 0 pads with zeros to that many digits.
    Ranges(Vec<(u64, u64, usize)>),
}

/// Parses the expression starting at `start`; returns its parts and where the next one starts.
fn parse_one(expr: &str, chars: &[char], start: usize) -> Result<(Vec<Part>, usize), Error> {
    let err = |column: usize, reason: &str| Error::Hostlist {
        expr: expr.to_string(),
        column: column + 1,
        reason: reason.to_string(),
    };
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut pos = start;
    while pos < chars.len() && !is_separator(chars[pos]) {
        match chars[pos] {
            '[' => {
                if !text.is_empty() {
                    parts.push(Part::Text(std::mem::take(&mut text)));
                }
                let mut ranges = Vec::new();
                pos += 1;
                loop {
                    let (lo, lo_digits, next) =
                        number(chars, pos).ok_or_else(|| err(pos, "expected a number"))?;
                    pos = next;
                    let mut hi = lo;
                    if chars.get(pos) == Some(&'-') {
                        let (h, _, next) = number(chars, pos + 1)
                            .ok_or_else(|| err(pos + 1, "expected a number after '-'"))?;
                        if h < lo {
                            return Err(err(pos + 1, "range ends below its start"));
                        }
                        hi = h;
                        pos = next;
                    }
                    // Slurm pads every number of a range to its lower bound's digits.
                    ranges.push((lo, hi, lo_digits));
                    match chars.get(pos) {
                        Some(',') => pos += 1,
                        Some(']') => {
                            pos += 1;
                            break;
                        }
                        Some(_) => return Err(err(pos, "expected ',', '-' or ']'")),
                        None => return Err(err(pos, "missing ']'")),
                    }
                }
                parts.push(Part::Ranges(ranges));
            }
            ']' => return Err(err(pos, "']' without '['")),
            c => {
                text.push(c);
                pos += 1;
            }
        }
    }
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    Ok((parts, pos))
}

/// A decimal number at `pos`: (value, digit count, position after it).
fn number(chars: &[char], pos: usize) -> Option<(u64, usize, usize)> {
    let end = pos
        + chars[pos.min(chars.len())..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
    if end == pos || end - pos > 18 {
        return None;
    }
    let value = chars[pos..end].iter().collect::<String>().parse().ok()?;
    Some((value, end - pos, end))
}

/// Appends the names of `parts` to `hosts`; `bytes` counts (a bound on) the name bytes so far.
fn expand_parts(
    parts: &[Part],
    hosts: &mut Vec<String>,
    bytes: &mut usize,
    max_hosts: usize,
    expr: &str,
    start: usize,
) -> Result<(), Error> {
    let count = parts.iter().try_fold(1usize, |acc, p| match p {
        Part::Text(_) => Some(acc),
        Part::Ranges(rs) => {
            let n = rs.iter().try_fold(0usize, |a, &(lo, hi, _)| {
                a.checked_add(usize::try_from(hi - lo).ok()?.checked_add(1)?)
            })?;
            acc.checked_mul(n)
        }
    });
    let too_many = |reason: String| Error::Hostlist {
        expr: expr.to_string(),
        column: start + 1,
        reason,
    };
    let count = match count {
        Some(c) if c.saturating_add(hosts.len()) <= max_hosts => c,
        _ => return Err(too_many(format!("expands to more than {max_hosts} hosts"))),
    };
    // The longest name: each range's number has the digits of its end or its padding width.
    let longest: usize = parts
        .iter()
        .map(|p| match p {
            Part::Text(t) => t.len(),
            Part::Ranges(rs) => rs
                .iter()
                .map(|&(_, hi, w)| w.max(hi.checked_ilog10().map_or(1, |d| d as usize + 1)))
                .max()
                .unwrap_or(0),
        })
        .sum();
    match count
        .checked_mul(longest)
        .and_then(|b| b.checked_add(*bytes))
    {
        Some(b) if b <= MAX_NAME_BYTES => *bytes = b,
        _ => {
            return Err(too_many(format!(
                "expands to more than {MAX_NAME_BYTES} bytes of host names"
            )));
        }
    }
    let mut names = vec![String::new()];
    for part in parts {
        names = match part {
            Part::Text(t) => names.into_iter().map(|n| n + t).collect(),
            Part::Ranges(rs) => names
                .iter()
                .flat_map(|n| {
                    rs.iter().flat_map(move |&(lo, hi, width)| {
                        (lo..=hi).map(move |v| format!("{n}{v:0width$}"))
                    })
                })
                .collect(),
        };
    }
    hosts.extend(names);
    Ok(())
}

/// A host name split into its prefix and trailing number.
struct Numbered<'a> {
    prefix: &'a str,
    value: u64,
    /// Digits of the number when zero-padded (`n007` → 3), 0 when written naturally.
    width: usize,
    digits: usize,
}

impl<'a> Numbered<'a> {
    fn split(host: &'a str) -> Option<Numbered<'a>> {
        let digits = host.bytes().rev().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 18 {
            return None;
        }
        let (prefix, num) = host.split_at(host.len() - digits);
        // A prefix that itself contains brackets or separators could not be re-parsed.
        if prefix.contains(['[', ']', ',']) || prefix.contains(char::is_whitespace) {
            return None;
        }
        let padded = digits > 1 && num.starts_with('0');
        Some(Numbered {
            prefix,
            value: num.parse().ok()?,
            width: if padded { digits } else { 0 },
            digits,
        })
    }

    /// Whether `other` prints the same inside a bracket group of `self`'s width.
    fn same_width(&self, other: &Numbered<'_>) -> bool {
        match (self.width, other.width) {
            (0, 0) => true,
            (w, _) if w > 0 => other.digits == w,
            _ => false,
        }
    }
}

/// `1-4,7` from [1, 2, 3, 4, 7]; runs are taken only when ascending by one.
fn write_ranges(out: &mut String, numbers: &[u64], width: usize) {
    let mut i = 0;
    while i < numbers.len() {
        let mut j = i;
        while j + 1 < numbers.len() && numbers[j + 1] == numbers[j].wrapping_add(1) {
            j += 1;
        }
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{:0width$}", numbers[i]);
        if j > i {
            let _ = write!(out, "-{:0width$}", numbers[j]);
        }
        i = j + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(expr: &str, hosts: &[&str], canonical: &str) {
        let got = expand(expr).unwrap();
        assert_eq!(got, hosts, "expand {expr:?}");
        assert_eq!(compress(&got), canonical, "compress {expr:?}");
        assert_eq!(expand(canonical).unwrap(), hosts, "re-expand {canonical:?}");
    }

    #[test]
    fn expressions() {
        check("n1", &["n1"], "n1");
        check("n[1-4,7]", &["n1", "n2", "n3", "n4", "n7"], "n[1-4,7]");
        check("gpu[01-02]", &["gpu01", "gpu02"], "gpu[01-02]");
        check("n[8-10]", &["n8", "n9", "n10"], "n[8-10]");
        check("n[08-10]", &["n08", "n09", "n10"], "n[08-10]");
        check("n[1-2],login", &["n1", "n2", "login"], "n[1-2],login");
        check("n3, n1 n1", &["n3", "n1", "n1"], "n[3,1,1]");
        check(
            "r[1-2]n[1-2]",
            &["r1n1", "r1n2", "r2n1", "r2n2"],
            "r1n[1-2],r2n[1-2]",
        );
        check("n[1-2].ib", &["n1.ib", "n2.ib"], "n1.ib,n2.ib");
        check("a[1-2],b[1],a3", &["a1", "a2", "b1", "a3"], "a[1-2],b1,a3");
        check("n[0-1]", &["n0", "n1"], "n[0-1]");
        check("x[9,010]", &["x9", "x010"], "x9,x010");
    }

    #[test]
    fn errors_name_the_column() {
        for (expr, column, reason) in [
            ("n[1-", 5, "expected a number"),
            ("n[7-5]", 5, "below its start"),
            ("n[1,]", 5, "expected a number"),
            ("n[1", 4, "missing ']'"),
            ("n[1x]", 4, "expected ','"),
            ("n1]", 3, "without '['"),
            ("n[a]", 3, "expected a number"),
            ("n[0-99999999]x[0-99999999]", 1, "more than"),
            // Found by the hostfile fuzz target (out of memory): long names times many hosts.
            (
                &format!("{}[0-999][0-9999]", "y".repeat(100)),
                1,
                "bytes of host names",
            ),
            (
                &format!("a1,{}[0-9999][0-999]", "b".repeat(30)),
                4,
                "bytes of host names",
            ),
        ] {
            match expand(expr) {
                Err(Error::Hostlist {
                    column: c,
                    reason: r,
                    ..
                }) => {
                    assert_eq!(c, column, "{expr}: {r}");
                    assert!(r.contains(reason), "{expr}: {r}");
                }
                other => panic!("{expr}: {other:?}"),
            }
        }
        assert!(matches!(expand(" , "), Err(Error::NoHosts { .. })));
    }

    #[test]
    fn the_largest_lists_still_expand() {
        assert_eq!(expand("n[0-16777215]").unwrap().len(), MAX_HOSTS);
    }
}
