//! Charm++ netlrts launcher protocol (what `charmrun` speaks): frames, the per-process session, the node table.
//!
//! A netlrts client (the charm4py wheel's `libcharm.so`) finds its launcher through
//! `NETSTART="<node> <host> <port> <pid> 0"` and opens one TCP connection to it
//! (research/charm-protocol.md §1.1). Every message both ways is a 16-byte header — a 4-byte
//! big-endian payload length, then a NUL-padded 12-byte type — and a payload (§1.2). Startup:
//! the client sends `initnode` (40 bytes: its NETSTART node number, hwloc counts, its UDP data
//! port, its own idea of its IP); the launcher answers `initnodetab` (`N`, `your_node`,
//! `N × 24` bytes of `{nodeno, procs_on_host, nPE, dataport, mach_id, IP}`) once every process
//! has reported (§1.3). Afterwards the client sends `print`/`printerr`/`printsyn`/`scanf`,
//! `barrier`/`barrier0`, `ping`, `ending "code"` and `abort` (§2).
//!
//! This module is sans-I/O, like [`crate::session`]: [`decode`]/[`encode`] frame bytes,
//! [`Session`] turns a client's frames into [`Action`]s, [`node_table`] builds the table from
//! every node's reports (gathered by the server over one overlay allgather). The tokio side is
//! [`server::CharmServer`]. [`launcher_args`] handles charmrun-style arguments (`+pN`,
//! `++n N`): a non-SMP client given `+p2` exits before connecting, silently (§1.1).
//!
//! Numbering: greedy keeps its own rank numbers as Charm++ node numbers (NETSTART carries the
//! rank and the table is ordered by rank), so `[rank]` output tags, exit reports and Charm++'s
//! `CkMyPe()` agree. charmrun instead sorts by host; the two agree whenever each host's ranks
//! are contiguous, which greedy's block placement guarantees.

pub mod server;
#[cfg(test)]
mod tests;

use bytes::{Buf, Bytes, BytesMut};

/// Header bytes before every payload: 4-byte BE length, 12-byte NUL-padded type.
pub const HEADER_LEN: usize = 16;
/// Longest type name (the header leaves 12 bytes; charmrun writes them with `strncpy`).
pub const TYPE_LEN: usize = 12;
/// Largest payload accepted from a client. Prints are flushed every 10 ms from a pipe buffer
/// (64 KiB) and CCS is not served, so a bigger length means a corrupt stream, and it bounds what
/// a bad header can make us buffer.
pub const MAX_PAYLOAD: usize = 1 << 20;
/// `initnode` payload length: a `ChSingleNodeinfo`, ten BE int32s (§1.3 step 2).
pub const INITNODE_LEN: usize = 40;
/// Bytes of one `ChNodeinfo` entry in `initnodetab`.
pub const ENTRY_LEN: usize = 24;

/// A malformed client stream; the server aborts the job naming the rank and quoting this.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The length field is beyond [`MAX_PAYLOAD`].
    #[error("frame of {0} bytes exceeds the {MAX_PAYLOAD}-byte limit")]
    TooLong(usize),
    /// The type field holds no usable name.
    #[error("unreadable message type {0:?}")]
    BadType(Vec<u8>),
    /// `initnode` with the wrong size.
    #[error("initnode of {0} bytes (expected {INITNODE_LEN})")]
    InitnodeLength(usize),
    /// `initnode` with data port 0 (charmrun: "could not initialize network").
    #[error("initnode from node {0} has data port 0: the client could not open its UDP port")]
    NoDataPort(i32),
    /// A NETSTART node number that is not a local rank, or one already connected.
    #[error("initnode claims node {0}, which is not an unclaimed rank of this host")]
    UnknownNode(i32),
    /// A request that is not valid in the session's state (e.g. `print` before `initnode`).
    #[error("{kind:?} is not expected {state}")]
    Unexpected {
        /// The message type.
        kind: String,
        /// Where the session was.
        state: &'static str,
    },
    /// A message type the protocol does not have.
    #[error("unknown message type {0:?}")]
    UnknownType(String),
    /// `ending` whose payload is not an integer.
    #[error("ending with unreadable code {0:?}")]
    BadCode(String),
}

/// One framed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The type name, without padding.
    pub kind: String,
    /// The payload.
    pub payload: Bytes,
}

/// Encodes one message. `kind` longer than [`TYPE_LEN`] is cut, as `strncpy` would.
pub fn encode(kind: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    let mut ty = [0u8; TYPE_LEN];
    let k = kind.as_bytes();
    let n = k.len().min(TYPE_LEN);
    ty[..n].copy_from_slice(&k[..n]);
    out.extend_from_slice(&ty);
    out.extend_from_slice(payload);
    out
}

/// Takes one whole frame off the front of `buf`; `Ok(None)` asks for more bytes.
pub fn decode(buf: &mut BytesMut) -> Result<Option<Frame>, WireError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > MAX_PAYLOAD {
        return Err(WireError::TooLong(len));
    }
    let ty = &buf[4..HEADER_LEN];
    let end = ty.iter().position(|&b| b == 0).unwrap_or(TYPE_LEN);
    let name = &ty[..end];
    if name.is_empty() || !name.iter().all(|b| b.is_ascii_graphic()) {
        return Err(WireError::BadType(ty.to_vec()));
    }
    if buf.len() < HEADER_LEN + len {
        return Ok(None);
    }
    let kind = String::from_utf8_lossy(name).into_owned();
    buf.advance(HEADER_LEN);
    let payload = buf.split_to(len).freeze();
    Ok(Some(Frame { kind, payload }))
}

/// What a client reports in `initnode` that the table needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitNode {
    /// The node number from its NETSTART (greedy puts the rank there).
    pub node_no: i32,
    /// Its UDP data port.
    pub dataport: u32,
    /// `mach_id`, passed through.
    pub mach_id: u32,
    /// The IPv4 address it believes is its own (used only when the connection's is unusable).
    pub ip: [u8; 4],
}

fn be_i32(b: &[u8], off: usize) -> i32 {
    i32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Parses an `initnode` payload (§1.3 step 2).
pub fn parse_initnode(payload: &[u8]) -> Result<InitNode, WireError> {
    if payload.len() != INITNODE_LEN {
        return Err(WireError::InitnodeLength(payload.len()));
    }
    let node_no = be_i32(payload, 0);
    let dataport = be_i32(payload, 28) as u32;
    if dataport == 0 {
        return Err(WireError::NoDataPort(node_no));
    }
    Ok(InitNode {
        node_no,
        dataport,
        mach_id: be_i32(payload, 32) as u32,
        ip: [payload[36], payload[37], payload[38], payload[39]],
    })
}

/// The fields of an `initnode` a test or fuzzer needs to build one.
pub fn initnode_payload(node_no: i32, dataport: u32, ip: [u8; 4]) -> Vec<u8> {
    let mut p = Vec::with_capacity(INITNODE_LEN);
    for v in [node_no, 1, 1, 1, 0, 0, 0, dataport as i32, 0] {
        p.extend_from_slice(&v.to_be_bytes());
    }
    p.extend_from_slice(&ip);
    p
}

/// One process as its node agent reports it to the others: the rank and where its UDP data
/// port is, with the IP as the agent saw it on the control connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// The greedy rank (= Charm++ node number).
    pub rank: u32,
    /// UDP data port.
    pub dataport: u32,
    /// `mach_id` from `initnode`.
    pub mach_id: u32,
    /// IPv4 address the other processes must send to.
    pub ip: [u8; 4],
}

/// Builds the job's table from every node's reports (index = node): one entry per rank, in
/// rank order, with `procs_on_host` = that node's report count and `nPE` = 1 (the wheel's
/// libcharm is non-SMP). Errors name a rank reported twice or missing.
pub fn node_table(per_node: &[Vec<Report>]) -> Result<Vec<[u8; ENTRY_LEN]>, String> {
    let n: usize = per_node.iter().map(Vec::len).sum();
    let mut table: Vec<Option<[u8; ENTRY_LEN]>> = vec![None; n];
    for (node, reports) in per_node.iter().enumerate() {
        for r in reports {
            let slot = table
                .get_mut(r.rank as usize)
                .ok_or_else(|| format!("node {node} reports rank {}, beyond {n} ranks", r.rank))?;
            if slot.is_some() {
                return Err(format!("rank {} is reported twice (node {node})", r.rank));
            }
            let mut e = [0u8; ENTRY_LEN];
            let fields = [r.rank, reports.len() as u32, 1, r.dataport, r.mach_id];
            for (i, v) in fields.iter().enumerate() {
                e[i * 4..i * 4 + 4].copy_from_slice(&v.to_be_bytes());
            }
            e[20..24].copy_from_slice(&r.ip);
            *slot = Some(e);
        }
    }
    table
        .into_iter()
        .enumerate()
        .map(|(i, e)| e.ok_or_else(|| format!("rank {i} is missing from the table")))
        .collect()
}

/// The `initnodetab` frame for `your_node` (only that field differs between clients).
pub fn nodetab_frame(table: &[[u8; ENTRY_LEN]], your_node: u32) -> Vec<u8> {
    let mut p = Vec::with_capacity(8 + ENTRY_LEN * table.len());
    p.extend_from_slice(&(table.len() as u32).to_be_bytes());
    p.extend_from_slice(&your_node.to_be_bytes());
    for e in table {
        p.extend_from_slice(e);
    }
    encode("initnodetab", &p)
}

/// What the server must do after feeding a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The client identified itself: it is `rank` (the server checks it is a free local rank).
    Init(InitNode),
    /// Forward text to the rank's stdout (`stderr` false) or stderr.
    Output {
        /// Standard error rather than output.
        stderr: bool,
        /// The text, without its terminating NUL.
        text: Bytes,
    },
    /// Send these bytes to the client.
    Send(Vec<u8>),
    /// The client wants a line of standard input (`scanf`), with this format.
    Scanf(String),
    /// The client entered `barrier` (all processes).
    Barrier,
    /// The client entered `barrier0` (reply goes to node 0 only).
    Barrier0,
    /// The client is done, with this exit code; it waits for the launcher to close the socket.
    Ending(i32),
    /// The client called `CmiAbort`; its message (`Fatal error on PE n> …`).
    Abort(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    AwaitInit,
    Running,
    Ended,
}

/// One client connection's protocol state.
#[derive(Debug)]
pub struct Session {
    state: State,
    rank: Option<u32>,
}

impl Default for Session {
    fn default() -> Self {
        Session::new()
    }
}

/// A payload as text: up to its first NUL (clients add one; a second string may follow it).
fn text_of(payload: &Bytes) -> Bytes {
    let end = payload
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(payload.len());
    payload.slice(..end)
}

impl Session {
    /// A fresh connection, before `initnode`.
    pub fn new() -> Session {
        Session {
            state: State::AwaitInit,
            rank: None,
        }
    }

    /// The rank, once the server accepted its `initnode` ([`Session::accept`]).
    pub fn rank(&self) -> Option<u32> {
        self.rank
    }

    /// Whether the client sent `ending`.
    pub fn ended(&self) -> bool {
        self.state == State::Ended
    }

    /// The server checked the `initnode`'s node number: it is this connection's rank.
    pub fn accept(&mut self, rank: u32) {
        self.rank = Some(rank);
        self.state = State::Running;
    }

    /// Handles one frame from the client.
    pub fn handle(&mut self, frame: &Frame) -> Result<Vec<Action>, WireError> {
        let unexpected = |state| WireError::Unexpected {
            kind: frame.kind.clone(),
            state,
        };
        match (self.state, frame.kind.as_str()) {
            (_, "ping") => Ok(vec![]),
            (State::AwaitInit, "initnode") => {
                Ok(vec![Action::Init(parse_initnode(&frame.payload)?)])
            }
            (_, "initnode") => Err(unexpected("after initnode")),
            (State::AwaitInit, k) if is_known(k) => Err(unexpected("before initnode")),
            (_, "print") | (_, "printerr") => Ok(vec![Action::Output {
                stderr: frame.kind == "printerr",
                text: text_of(&frame.payload),
            }]),
            (_, "printsyn") | (_, "printerrsyn") => Ok(vec![
                Action::Output {
                    stderr: frame.kind == "printerrsyn",
                    text: text_of(&frame.payload),
                },
                Action::Send(encode("printdone", b"\0")),
            ]),
            (_, "abort") => Ok(vec![Action::Abort(
                String::from_utf8_lossy(&text_of(&frame.payload)).into_owned(),
            )]),
            (State::Ended, "ending") => Ok(vec![]),
            (State::Ended, _) => Err(unexpected("after ending")),
            (_, "scanf") => Ok(vec![Action::Scanf(
                String::from_utf8_lossy(&text_of(&frame.payload)).into_owned(),
            )]),
            (_, "barrier") => Ok(vec![Action::Barrier]),
            (_, "barrier0") => Ok(vec![Action::Barrier0]),
            (_, "ending") => {
                let text = String::from_utf8_lossy(&text_of(&frame.payload)).into_owned();
                let code = text
                    .trim()
                    .parse::<i32>()
                    .map_err(|_| WireError::BadCode(text.clone()))?;
                self.state = State::Ended;
                Ok(vec![Action::Ending(code)])
            }
            // CCS replies (`++server`) are not served: greedy starts no CCS server, so a
            // client has no reason to send one; ignoring beats killing the job.
            (_, "reply_fw") => Ok(vec![]),
            (_, k) => Err(WireError::UnknownType(k.to_owned())),
        }
    }
}

fn is_known(kind: &str) -> bool {
    matches!(
        kind,
        "print"
            | "printerr"
            | "printsyn"
            | "printerrsyn"
            | "scanf"
            | "barrier"
            | "barrier0"
            | "ending"
            | "abort"
            | "reply_fw"
    )
}

/// The `barrier`/`barrier0` release frame (payload one NUL, as charmrun sends).
pub fn barrier_frame(zero: bool) -> Vec<u8> {
    encode(if zero { "barrier0" } else { "barrier" }, b"\0")
}

/// The `die` frame: the client prints "aborting: <msg>" and exits.
pub fn die_frame(msg: &str) -> Vec<u8> {
    let mut p = msg.as_bytes().to_vec();
    p.push(0);
    encode("die", &p)
}

/// Checks a program's arguments for charmrun options, given the job's rank count.
///
/// charmrun consumes `+pN`, `++p N`, `++n N`, `++np N` (and every `++opt`) itself; a non-SMP
/// client that sees `+p2` exits before connecting, with its output already on /dev/null
/// (research/charm-protocol.md §1.1). So a process count that matches the job is removed, a
/// different one or any other `++option` is an error that says what to do. `+ppn` and other
/// single-`+` options with a letter third are the program's and stay.
pub fn launcher_args(argv: &[String], n_ranks: u32) -> Result<Vec<String>, String> {
    let mut out = Vec::with_capacity(argv.len());
    let mut i = 0;
    let check = |opt: &str, v: &str| -> Result<(), String> {
        match v.parse::<u32>() {
            Ok(n) if n == n_ranks => Ok(()),
            _ => Err(format!(
                "{opt} {v}: greedy starts {n_ranks} processes of one PE each (set the count with -n/--ppn, not charmrun options)"
            )),
        }
    };
    while i < argv.len() {
        let a = &argv[i];
        if i > 0
            && let Some(v) = a
                .strip_prefix("+p")
                .filter(|v| v.bytes().next().is_some_and(|b| b.is_ascii_digit()))
        {
            check("+p", v)?;
        } else if i > 0
            && let Some(opt) = a.strip_prefix("++")
        {
            let (name, inline) = match opt.find(|c: char| c.is_ascii_digit()) {
                Some(pos) if pos > 0 => (&opt[..pos], Some(&opt[pos..])),
                _ => (opt, None),
            };
            if !matches!(name, "p" | "n" | "np") {
                return Err(format!(
                    "{a}: a charmrun option; greedy is the launcher here (see greedyrun --help)"
                ));
            }
            let v = match inline {
                Some(v) => v.to_owned(),
                None => {
                    i += 1;
                    argv.get(i)
                        .cloned()
                        .ok_or_else(|| format!("{a} needs a value"))?
                }
            };
            check(a, &v)?;
        } else {
            out.push(a.clone());
        }
        i += 1;
    }
    Ok(out)
}

/// How many values a `scanf` format assigns: its `%` conversions other than `%%` and the
/// suppressed `%*…`.
pub fn scanf_conversions(fmt: &str) -> usize {
    let mut n = 0;
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            continue;
        }
        match chars.peek() {
            Some('%') => {
                chars.next();
            }
            Some('*') | None => {}
            Some(_) => n += 1,
        }
    }
    n
}

/// What a client's `scanf` of `conversions` values gets from the stdin read so far (`input`):
/// whole lines, from the front, until they hold that many whitespace-separated words (at
/// least one line), with each newline turned into a space as charmrun does (§2); the client
/// then runs its own `sscanf` over the text. `None` until enough complete lines are there.
/// charmrun runs `fscanf` itself to find the end; whole words cover `%d`/`%s`/`%f` formats,
/// and a `%c` or `%[` format gets whole lines too.
pub fn scanf_take(input: &mut String, conversions: usize) -> Option<String> {
    let mut end = 0;
    let mut words = 0;
    loop {
        let nl = input[end..].find('\n')? + end;
        words += input[end..nl].split_whitespace().count();
        end = nl + 1;
        if words >= conversions {
            break;
        }
    }
    let taken: String = input.drain(..end).collect();
    Some(taken.replace('\n', " "))
}

/// The `scanf-data` reply to a client's `scanf`: the text and its NUL.
pub fn scanf_frame(text: &str) -> Vec<u8> {
    let mut p = text.as_bytes().to_vec();
    p.push(0);
    encode("scanf-data", &p)
}

/// `NETMAGIC`: the low bits of a hash of the job id, so every host computes the same value
/// without talking (datagrams with another magic are dropped, §1.1).
pub fn netmagic(job_id: &str) -> u32 {
    // FNV-1a: stable across builds and hosts, unlike std's randomised hasher.
    let mut h: u32 = 0x811c_9dc5;
    for b in job_id.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h & 0x7fff
}
