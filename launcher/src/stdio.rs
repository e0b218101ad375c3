//! Rank output: read as it comes on the agent, in whole lines, optionally tagged with the rank
//! on greedyrun.
//!
//! Agents read each rank's stdout and stderr in chunks of up to [`CHUNK`] bytes. By default a
//! frame carries whole lines only ([`Lines`]), as srun does: greedyrun writes each frame at
//! once, so lines of ranks that write the text and its newline separately (Python with
//! `PYTHONUNBUFFERED=1`) never splice. A partial line is still sent after [`PARTIAL_DELAY`]
//! without its newline, or once [`LINE_MAX`] of it is held, so prompts and progress bars show.
//! `--unbuffered` sends every chunk as soon as `read` returns. `--tag-output` prefixes
//! `[rank] ` at the start of each line (`[child:rank] ` for a spawned job's, numbered from 1 in
//! the order spawned); a partial line's continuation is not tagged again.

use std::{collections::HashMap, time::Duration};

use bytes::{Bytes, BytesMut};
use tokio::{
    io::{AsyncRead, AsyncReadExt},
    sync::mpsc,
    time::Instant,
};

use crate::proto::{Stream, Up};

/// Largest chunk read from a rank at once: one pipe buffer's worth.
pub const CHUNK: usize = 64 * 1024;

/// How long a partial line waits for its newline before it is sent as it is. Long enough
/// for a process descheduled between writing a line's text and its newline on a loaded node
/// (tens of ms), short enough that a prompt shows without a noticeable delay.
pub const PARTIAL_DELAY: Duration = Duration::from_millis(200);

/// A partial line this long is sent without waiting for its newline: memory per rank stays
/// bounded whatever a rank writes (a binary stream has no newlines).
pub const LINE_MAX: usize = 64 * 1024;

/// Forwards everything `reader` yields as [`Up::Output`] of `rank`, until EOF; in whole
/// lines unless `unbuffered`.
///
/// Returns when the stream ends or the up channel closes.
pub async fn forward(
    rank: u32,
    stream: Stream,
    reader: impl AsyncRead + Unpin,
    up: mpsc::Sender<Up>,
    unbuffered: bool,
) {
    forward_as(reader, up, unbuffered, |data| Up::Output {
        rank,
        stream,
        data,
    })
    .await
}

/// Forwards everything `reader` yields as `frame(bytes)` (a rank's or a task's output), in
/// whole lines unless `unbuffered`, until EOF or until the up channel closes.
pub async fn forward_as(
    mut reader: impl AsyncRead + Unpin,
    up: mpsc::Sender<Up>,
    unbuffered: bool,
    frame: impl Fn(Bytes) -> Up,
) {
    let mut lines = Lines::new(unbuffered);
    loop {
        lines.buf.reserve(CHUNK);
        let ready = match lines.deadline() {
            None => Some(reader.read_buf(&mut lines.buf).await),
            // read_buf is cancel safe: when the deadline wins, nothing was read.
            Some(at) => tokio::select! {
                r = reader.read_buf(&mut lines.buf) => Some(r),
                _ = tokio::time::sleep_until(at) => None,
            },
        };
        let (out, done) = match ready {
            None => (lines.flush(), false),
            Some(Ok(0) | Err(_)) => (lines.flush(), true),
            Some(Ok(n)) => (lines.read(n), false),
        };
        if let Some(data) = out
            && up.send(frame(data)).await.is_err()
        {
            return;
        }
        if done {
            return;
        }
    }
}

/// One output stream cut into frames of whole lines: what was read and not yet sent, and
/// since when a partial line waits.
#[derive(Debug)]
pub struct Lines {
    buf: BytesMut,
    unbuffered: bool,
    /// When the partial line held in `buf` began to wait.
    waiting_since: Option<Instant>,
}

impl Lines {
    /// Nothing held yet; `unbuffered`: every read is sent whole.
    pub fn new(unbuffered: bool) -> Lines {
        Lines {
            buf: BytesMut::new(),
            unbuffered,
            waiting_since: None,
        }
    }

    /// `n` more bytes were read into the buffer: what to send now (whole lines, or all of it
    /// when unbuffered or when the partial line reached [`LINE_MAX`]).
    pub fn read(&mut self, n: usize) -> Option<Bytes> {
        let fresh = self.buf.len() - n;
        let cut = if self.unbuffered || self.buf.len() >= LINE_MAX {
            self.buf.len()
        } else {
            // Only the new bytes are searched: each byte once, whatever the line length.
            self.buf[fresh..]
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |i| fresh + i + 1)
        };
        if cut == 0 {
            self.waiting_since.get_or_insert_with(Instant::now);
            return None;
        }
        let out = self.buf.split_to(cut).freeze();
        self.waiting_since = (!self.buf.is_empty()).then(Instant::now);
        Some(out)
    }

    /// When the partial line held must be sent, if one is held.
    pub fn deadline(&self) -> Option<Instant> {
        self.waiting_since.map(|t| t + PARTIAL_DELAY)
    }

    /// Everything held (the deadline passed, or the stream ended).
    pub fn flush(&mut self) -> Option<Bytes> {
        self.waiting_since = None;
        (!self.buf.is_empty()).then(|| self.buf.split().freeze())
    }
}

/// Adds `[rank] ` (or `[task N] `) at each line start of each (rank or task, stream).
#[derive(Debug, Default)]
pub struct Tagger {
    mid_line: HashMap<(u64, bool), bool>,
}

impl Tagger {
    /// The bytes to write for a chunk of `rank`'s `stream`.
    pub fn tag(&mut self, rank: u32, stream: Stream, data: &[u8]) -> Vec<u8> {
        self.tag_as(u64::from(rank), &format!("[{rank}] "), stream, data)
    }

    /// The bytes to write for a chunk of rank `rank` of spawned child `child`'s `stream`:
    /// `[child:rank] `.
    pub fn tag_child(&mut self, child: u32, rank: u32, stream: Stream, data: &[u8]) -> Vec<u8> {
        let key = (u64::from(child) << 32) | u64::from(rank);
        self.tag_as(key, &format!("[{child}:{rank}] "), stream, data)
    }

    /// The bytes to write for a chunk of task `id`'s `stream`.
    pub fn tag_task(&mut self, id: u64, stream: Stream, data: &[u8]) -> Vec<u8> {
        self.tag_as(id, &format!("[task {id}] "), stream, data)
    }

    /// Task `id` has ended: its line state goes (a stream of any length holds only its
    /// running tasks').
    pub fn forget_task(&mut self, id: u64) {
        self.mid_line.remove(&(id, false));
        self.mid_line.remove(&(id, true));
    }

    fn tag_as(&mut self, key: u64, prefix: &str, stream: Stream, data: &[u8]) -> Vec<u8> {
        let key = (key, stream == Stream::Stderr);
        let mid = self.mid_line.entry(key).or_insert(false);
        let mut out = Vec::with_capacity(data.len() + prefix.len());
        for line in data.split_inclusive(|&b| b == b'\n') {
            if !*mid {
                out.extend_from_slice(prefix.as_bytes());
            }
            out.extend_from_slice(line);
            *mid = line.last() != Some(&b'\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads `chunks` in turn through [`Lines`]; what is sent after each, then at the end.
    fn cut(unbuffered: bool, chunks: &[&str]) -> Vec<String> {
        let mut lines = Lines::new(unbuffered);
        let mut sent = Vec::new();
        for c in chunks {
            lines.buf.extend_from_slice(c.as_bytes());
            sent.extend(lines.read(c.len()));
        }
        sent.extend(lines.flush());
        sent.iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect()
    }

    #[test]
    fn frames_hold_whole_lines_unless_unbuffered() {
        assert_eq!(cut(false, &["a\nb", "c", "\n"]), ["a\n", "bc\n"]);
        assert_eq!(cut(false, &["rank 6 line 0", "\n"]), ["rank 6 line 0\n"]);
        assert_eq!(cut(false, &["x\ny\nz"]), ["x\ny\n", "z"]);
        assert_eq!(cut(true, &["a\nb", "c"]), ["a\nb", "c"]);
        let long = "x".repeat(LINE_MAX);
        assert_eq!(cut(false, &[&long, "y\n"]), [long.as_str(), "y\n"]);
    }

    #[tokio::test]
    async fn a_partial_line_is_sent_after_the_delay() {
        let (tx, mut rx) = mpsc::channel(4);
        let (mut w, r) = tokio::io::duplex(64);
        let fwd = tokio::spawn(forward(1, Stream::Stdout, r, tx, false));
        tokio::io::AsyncWriteExt::write_all(&mut w, b"prompt> ")
            .await
            .unwrap();
        let t0 = Instant::now();
        let got = rx.recv().await;
        assert!(t0.elapsed() >= PARTIAL_DELAY, "{:?}", t0.elapsed());
        assert!(matches!(got, Some(Up::Output { data, .. }) if &data[..] == b"prompt> "));
        drop(w);
        fwd.await.unwrap();
        assert_eq!(rx.recv().await, None);
    }

    fn check(chunks: &[(u32, &str)], expect: &str) {
        let mut t = Tagger::default();
        let mut out = Vec::new();
        for (rank, text) in chunks {
            out.extend(t.tag(*rank, Stream::Stdout, text.as_bytes()));
        }
        assert_eq!(String::from_utf8(out).unwrap(), expect);
    }

    #[test]
    fn tags_line_starts_only() {
        check(&[(0, "a\nb\n")], "[0] a\n[0] b\n");
        check(&[(0, "par"), (0, "tial\n")], "[0] partial\n");
        check(&[(0, "x"), (1, "y\n"), (0, "\n")], "[0] x[1] y\n\n");
        check(&[(3, "")], "");
        let mut t = Tagger::default();
        let mut out = t.tag(0, Stream::Stdout, b"x");
        out.extend(t.tag_child(1, 0, Stream::Stdout, b"y\n"));
        out.extend(t.tag(0, Stream::Stdout, b"\n"));
        assert_eq!(String::from_utf8(out).unwrap(), "[0] x[1:0] y\n\n");
    }

    #[tokio::test]
    async fn forward_sends_chunks_then_stops_at_eof() {
        let (tx, mut rx) = mpsc::channel(4);
        forward(2, Stream::Stderr, &b"hello"[..], tx, false).await;
        assert_eq!(
            rx.recv().await,
            Some(Up::Output {
                rank: 2,
                stream: Stream::Stderr,
                data: Bytes::from_static(b"hello")
            })
        );
        assert_eq!(rx.recv().await, None);
    }
}
