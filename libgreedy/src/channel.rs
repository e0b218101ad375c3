//! The master ↔ front end channel: lines on the master's stdio, which every launcher already
//! carries (greedyrun and srun send their stdin to rank 0 and relay its stdout line by line).
//! A message is lines of `RS "greedy-libi" ("+" | " ") hex`, `+` on every line but its last,
//! each short enough that no launcher splits it (srun cuts long lines); every other line is
//! the members' own output and passes through.

use std::io::{self, Write};

use crate::member::{decode, encode};

/// What starts a message line (ASCII record separator, so no ordinary output starts so).
const MARK: &str = "\u{1e}greedy-libi";

/// Hex digits per line.
const LINE: usize = 400;

/// Writes `data` as a message.
pub(crate) fn write(out: &mut impl Write, data: &[u8]) -> io::Result<()> {
    let hex = encode(data);
    let mut pieces = hex.as_bytes().chunks(LINE).peekable();
    if pieces.peek().is_none() {
        return writeln!(out, "{MARK} ");
    }
    while let Some(piece) = pieces.next() {
        let more = if pieces.peek().is_some() { '+' } else { ' ' };
        out.write_all(format!("{MARK}{more}").as_bytes())?;
        out.write_all(piece)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// Reassembles messages from lines.
#[derive(Debug, Default)]
pub(crate) struct Reader {
    partial: String,
}

impl Reader {
    /// `None` for a line that is no part of a message (it is output); `Some(None)` for a part
    /// of one still incomplete; `Some(Some(data))` once a message is whole (`Some(None)` too
    /// for one damaged, which is dropped).
    pub(crate) fn line(&mut self, line: &str) -> Option<Option<Vec<u8>>> {
        let rest = line.strip_prefix(MARK)?.trim_end_matches(['\n', '\r']);
        let (more, hex) = match rest.split_at_checked(1)? {
            ("+", hex) => (true, hex),
            (" ", hex) => (false, hex),
            _ => return None,
        };
        self.partial.push_str(hex);
        if more {
            return Some(None);
        }
        Some(decode(&std::mem::take(&mut self.partial)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(data: &[u8]) -> (usize, Vec<u8>) {
        let mut out = Vec::new();
        write(&mut out, data).unwrap();
        let text = String::from_utf8(out).unwrap();
        let mut reader = Reader::default();
        let mut got = None;
        for line in text.lines() {
            assert!(line.len() <= LINE + MARK.len() + 1);
            if let Some(Some(data)) = reader.line(line) {
                got = Some(data);
            }
        }
        (text.lines().count(), got.expect("a whole message"))
    }

    #[test]
    fn a_message_comes_back_whole_in_short_lines() {
        assert_eq!(round_trip(b"a\nb \x00"), (1, b"a\nb \x00".to_vec()));
        assert_eq!(round_trip(b""), (1, Vec::new()));
        let big: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        assert_eq!(round_trip(&big), (5, big));
    }

    #[test]
    fn other_lines_are_output() {
        let mut reader = Reader::default();
        assert_eq!(reader.line("greedy-libi 00"), None);
        assert_eq!(reader.line("hello"), None);
        assert_eq!(reader.line("\u{1e}greedy-libix00"), None);
    }
}
