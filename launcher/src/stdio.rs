//! Rank output: read as it comes on the agent, optionally tagged with the rank on greedyrun.
//!
//! Agents read each rank's stdout and stderr in chunks of up to [`CHUNK`] bytes and forward
//! every chunk as soon as `read` returns: no line buffering anywhere, so a prompt without a
//! newline shows at once. `--tag-output` prefixes `[rank] ` at the start of each line; a
//! partial line is still written at once and its continuation is not tagged again.

use std::collections::HashMap;

use bytes::Bytes;
use tokio::{
    io::{AsyncRead, AsyncReadExt},
    sync::mpsc,
};

use crate::proto::{Stream, Up};

/// Largest chunk read from a rank at once: one pipe buffer's worth.
pub const CHUNK: usize = 64 * 1024;

/// Forwards everything `reader` yields as [`Up::Output`] of `rank`, until EOF.
///
/// Returns when the stream ends or the up channel closes.
pub async fn forward(
    rank: u32,
    stream: Stream,
    reader: impl AsyncRead + Unpin,
    up: mpsc::Sender<Up>,
) {
    forward_as(reader, up, |data| Up::Output { rank, stream, data }).await
}

/// Forwards everything `reader` yields as `frame(chunk)` (a rank's or a task's output),
/// until EOF or until the up channel closes.
pub async fn forward_as(
    mut reader: impl AsyncRead + Unpin,
    up: mpsc::Sender<Up>,
    frame: impl Fn(Bytes) -> Up,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let data = Bytes::copy_from_slice(&buf[..n]);
                if up.send(frame(data)).await.is_err() {
                    return;
                }
            }
        }
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
    }

    #[tokio::test]
    async fn forward_sends_chunks_then_stops_at_eof() {
        let (tx, mut rx) = mpsc::channel(4);
        forward(2, Stream::Stderr, &b"hello"[..], tx).await;
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
