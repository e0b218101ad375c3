//! The overlay wire format: versioned, length-prefixed postcard frames carrying [`Message`]s.
//!
//! A frame is `GRDY` (4 bytes), the format version (u16, big-endian), the body length
//! (u32, big-endian), then the postcard-encoded [`Message`]. The magic and version are checked on
//! every frame, so a peer from another release or a stray client sending garbage is refused
//! with a log line naming what it sent, before any body is decoded.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use tokio_util::codec::{Decoder, Encoder};

use crate::AbortInfo;

/// First four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"GRDY";
/// The overlay format version; bump on any change to [`Message`].
pub const VERSION: u16 = 7;
/// Bytes before the body: magic, version, length.
pub const HEADER_LEN: usize = 10;
/// Largest body accepted before a peer has proved the job secret: the handshake frames are
/// under 200 bytes, so an unauthenticated stranger can make us buffer at most this much.
pub const HANDSHAKE_MAX_BODY: usize = 1024;

/// Which node-side server a point-to-point [`Message::Request`] is for: each serves its own
/// queue ([`crate::overlay::Overlay::incoming`]), so one node can serve both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Service {
    /// A PMIx direct modex: a rank's data, from the node it runs on.
    Modex,
    /// The job's name table (PMI publish, lookup, unpublish), kept on node 0.
    Names,
    /// Node 0's coordinator of collectives over a subset of the nodes (PMIx fences over
    /// some of the ranks, connect, disconnect: [`crate::group`]).
    Group,
    /// Every node's service of the family's spawned jobs: a child job to serve beside the job
    /// ([`crate::node::NodeService::add_child_everywhere`]).
    Children,
}

/// Which link a connecting agent asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Link {
    /// A child joining its parent in the tree.
    Child,
    /// A direct agent-to-agent link for the collectives off the tree (ring, Bruck).
    Direct,
}

/// What one node contributes to (or has gathered for) the upward phase of a tree collective.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum UpContent {
    /// The blobs of every node of the sender's subtree, by node index.
    Blobs(Vec<(u32, Bytes)>),
    /// The subtree's blobs add up to more than the tree carries (`AllgatherRule::tree_max`);
    /// the ring or Bruck's algorithm will carry them.
    Oversize(u64),
}

/// What the root sends down the tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DownContent {
    /// The result: every node's blob (allgather) or the root's one blob (broadcast), by node index.
    Blobs(Vec<(u32, Bytes)>),
    /// The payload is large: run the ring over direct links instead.
    Ring,
    /// The payload is large: run Bruck's allgather over direct links instead.
    Bruck,
}

/// Everything agents say to each other.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// Server → client, first frame: prove you know the job secret over this nonce.
    Challenge {
        /// Fresh random nonce.
        nonce: [u8; 32],
    },
    /// Client → server: who I am, and the proof.
    Hello {
        /// The job the client belongs to.
        job_id: String,
        /// The client's node index.
        node_idx: u32,
        /// Which link it wants.
        link: Link,
        /// The client's own nonce, which the server's proof covers.
        nonce: [u8; 32],
        /// HMAC-SHA256 over both nonces and the fields above ([`crate::auth`]).
        mac: [u8; 32],
    },
    /// Server → client: accepted, and the server's proof.
    Welcome {
        /// The server's node index.
        node_idx: u32,
        /// HMAC-SHA256 proving the server knows the secret too.
        mac: [u8; 32],
    },
    /// Upward phase of collective `seq`.
    Up {
        /// Collective sequence number.
        seq: u64,
        /// The subtree's contribution.
        content: UpContent,
    },
    /// Downward phase of collective `seq`.
    Down {
        /// Collective sequence number.
        seq: u64,
        /// The result or the switch to the ring.
        content: DownContent,
    },
    /// One blob travelling the ring of collective `seq`.
    Ring {
        /// Collective sequence number.
        seq: u64,
        /// The node whose blob this is.
        origin: u32,
        /// The blob.
        blob: Bytes,
    },
    /// Round `round` of Bruck's allgather `seq`: the blobs the sender holds, to the node
    /// 2^round before it.
    Bruck {
        /// Collective sequence number.
        seq: u64,
        /// The round (0-based); the sender is 2^round nodes after the receiver.
        round: u32,
        /// The blobs, by origin node.
        blobs: Vec<(u32, Bytes)>,
    },
    /// Job-wide abort, flooded along the tree.
    Abort(AbortInfo),
    /// A point-to-point request to the receiving node (e.g. a PMIx direct modex), sent over
    /// the tree link or a direct link; answered by exactly one [`Message::Response`].
    Request {
        /// Chosen by the requester, unique among its outstanding requests.
        id: u64,
        /// The server the request is for.
        service: Service,
        /// The request, opaque to the overlay.
        body: Bytes,
    },
    /// The answer to the sender's [`Message::Request`] `id`.
    Response {
        /// The request's id.
        id: u64,
        /// The answer, or why the receiving node could not give one.
        body: Result<Bytes, String>,
    },
    /// The sender is shutting down cleanly; its connection closing is not a failure.
    Bye,
}

impl Message {
    /// The message's name in log lines (`hello`, `up`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Challenge { .. } => "challenge",
            Message::Hello { .. } => "hello",
            Message::Welcome { .. } => "welcome",
            Message::Up { .. } => "up",
            Message::Down { .. } => "down",
            Message::Ring { .. } => "ring",
            Message::Bruck { .. } => "bruck",
            Message::Abort(_) => "abort",
            Message::Request { .. } => "request",
            Message::Response { .. } => "response",
            Message::Bye => "bye",
        }
    }
}

/// Why a frame was refused.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The first bytes are not [`MAGIC`]: not one of ours.
    #[error("not a greedy overlay frame (starts with {0:02x?})")]
    Garbage([u8; 4]),
    /// Another overlay version.
    #[error("peer speaks overlay version {theirs}, we speak {VERSION}")]
    Version {
        /// The peer's version.
        theirs: u16,
    },
    /// Body longer than the configured limit.
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    TooLong {
        /// Announced length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Body does not decode.
    #[error("undecodable frame body: {0}")]
    Body(#[from] postcard::Error),
    /// Socket error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Encodes and decodes frames; `max_body` bounds what a peer can make us buffer.
#[derive(Debug, Clone, Copy)]
pub struct FrameCodec {
    /// Largest accepted body.
    pub max_body: usize,
}

impl Decoder for FrameCodec {
    type Item = Message;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Message>, FrameError> {
        // Check the magic as soon as 4 bytes are in, so garbage is refused without waiting for 10.
        if src.len() >= 4 && src[..4] != MAGIC {
            let mut got = [0u8; 4];
            got.copy_from_slice(&src[..4]);
            return Err(FrameError::Garbage(got));
        }
        if src.len() < HEADER_LEN {
            return Ok(None);
        }
        let version = u16::from_be_bytes([src[4], src[5]]);
        if version != VERSION {
            return Err(FrameError::Version { theirs: version });
        }
        let len = u32::from_be_bytes([src[6], src[7], src[8], src[9]]) as usize;
        if len > self.max_body {
            return Err(FrameError::TooLong {
                len,
                max: self.max_body,
            });
        }
        if src.len() < HEADER_LEN + len {
            // Grow with the data actually received, not with the announced length, so a peer
            // cannot make us allocate max_body by sending a header alone.
            src.reserve((HEADER_LEN + len - src.len()).min(64 * 1024));
            return Ok(None);
        }
        src.advance(HEADER_LEN);
        let body = src.split_to(len);
        Ok(Some(postcard::from_bytes(&body)?))
    }
}

impl Encoder<Message> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, msg: Message, dst: &mut BytesMut) -> Result<(), FrameError> {
        let body = postcard::to_stdvec(&msg)?;
        if body.len() > self.max_body {
            return Err(FrameError::TooLong {
                len: body.len(),
                max: self.max_body,
            });
        }
        dst.reserve(HEADER_LEN + body.len());
        dst.put_slice(&MAGIC);
        dst.put_u16(VERSION);
        dst.put_u32(body.len() as u32);
        dst.put_slice(&body);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(msg: Message) -> BytesMut {
        let mut buf = BytesMut::new();
        FrameCodec { max_body: 1 << 20 }
            .encode(msg, &mut buf)
            .unwrap();
        buf
    }

    fn check(input: &[u8], expect: &str) {
        let mut buf = BytesMut::from(input);
        let got = match (FrameCodec { max_body: 1024 }).decode(&mut buf) {
            Ok(Some(m)) => format!("{m:?} rest={}", buf.len()),
            Ok(None) => "need more".into(),
            Err(e) => format!("error: {e}"),
        };
        assert_eq!(got, expect);
    }

    #[test]
    fn round_trip_and_refusals() {
        let blob = Message::Ring {
            seq: 3,
            origin: 2,
            blob: Bytes::from_static(b"ab"),
        };
        let framed = encode(blob.clone());
        check(&framed, &format!("{blob:?} rest=0"));
        check(&framed[..framed.len() - 1], "need more");
        check(b"GRD", "need more");
        check(
            b"GET / HTTP/1.1\r\n",
            "error: not a greedy overlay frame (starts with [47, 45, 54, 20])",
        );
        let header = |version: u16, len: u32| {
            let mut h = MAGIC.to_vec();
            h.extend(version.to_be_bytes());
            h.extend(len.to_be_bytes());
            h
        };
        check(
            &header(VERSION - 1, 0),
            &format!(
                "error: peer speaks overlay version {}, we speak {VERSION}",
                VERSION - 1
            ),
        );
        check(
            &header(VERSION, u32::MAX),
            "error: frame of 4294967295 bytes exceeds the limit of 1024",
        );
        check(
            &[header(VERSION, 1), vec![0xee]].concat(),
            "error: undecodable frame body: Hit the end of buffer, expected more data",
        );
        let mut two = encode(Message::Bye);
        two.extend_from_slice(&encode(Message::Bye));
        check(&two, &format!("Bye rest={}", HEADER_LEN + 1));
    }
}
