//! The bodies of the cargo-fuzz targets in `fuzz/`, one function per target, so that the fuzz
//! binaries and the stable corpus replay (`tests/fuzz_corpus.rs`) run the same checks. Each
//! takes arbitrary bytes and panics only when an invariant of the code under test breaks.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::BytesMut;
use tokio_util::codec::{Decoder, Encoder};

use crate::{
    JobSecret, JobSpec, auth, charm,
    collectives::{AllgatherRule, Engine, Op},
    frame::{FrameCodec, HANDSHAKE_MAX_BODY, Link, Message},
    names, pmi1, pmi2,
    session::{Action, Node, Session},
    spawn,
};

/// A fuzz target: the name of its binary and corpus directory, and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target of this crate.
pub const TARGETS: &[Target] = &[
    ("pmi1_parse", pmi1_parse),
    ("pmi2_decode", pmi2_decode),
    ("session", session),
    ("overlay_frame", overlay_frame),
    ("charm_frame", charm_frame),
    ("overlay_handshake", overlay_handshake),
    ("dmodex_request", dmodex_request),
    ("names_request", names_request),
    ("group_request", group_request),
    ("spawn_block", spawn_block),
];

/// A PMI-1 spawn request's lines after `mcmd=spawn`, and a PMI-2 `spawn` frame body: no
/// panic, the reader stops within its limits, and what it yields is as big as the input says.
pub fn spawn_block(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut block = spawn::Block::start();
    for (n, line) in text.split_inclusive('\n').enumerate() {
        match block.line(line) {
            Ok(None) => assert!(n < spawn::MAX_LINES, "read past the line limit"),
            Ok(Some(request)) => {
                assert!(
                    !request.commands.is_empty() && request.commands.len() <= spawn::MAX_COMMANDS
                );
                break;
            }
            Err(_) => break,
        }
    }
    if let Ok(command) = pmi2::parse_body(data)
        && let Ok(request) = spawn::from_pmi2(&command)
    {
        assert!(request.commands.len() <= spawn::MAX_COMMANDS);
        let codes = spawn::codes(request.total_procs(), -1);
        assert!(codes.is_none_or(|c| c.len() < 3 * spawn::ERRCODES_MAX as usize));
    }
}

/// The PMI-1 line parser and the reply encoder: no panic, and what parses re-encodes.
pub fn pmi1_parse(data: &[u8]) {
    let one_line = |line: String| {
        assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
    };
    match pmi1::parse(data) {
        Ok(pmi1::Request::Unsupported { cmd }) => one_line(pmi1::Reply::Unsupported(cmd).encode()),
        // Whatever a rank publishes, telling it to a PMI-1 client (or refusing) is one line.
        Ok(pmi1::Request::PublishName { service, port }) => {
            one_line(pmi1::Reply::LookupResult(Ok(port)).encode());
            one_line(pmi1::Reply::PublishResult(Some(service)).encode());
        }
        _ => {}
    }
}

/// The PMI-2 frame decoder: no panic, a frame never claims more bytes than given, and a reply
/// echoing its fields decodes again.
pub fn pmi2_decode(data: &[u8]) {
    if let Ok(Some((command, used))) = pmi2::decode(data) {
        assert!(used <= data.len());
        let mut reply = pmi2::Reply::new("x-response", 0, Some(&command));
        for (k, v) in &command.fields {
            reply = reply.field(k, v);
        }
        let bytes = reply.encode();
        let (again, n) = pmi2::decode(&bytes)
            .expect("own reply decodes")
            .expect("whole");
        assert_eq!(n, bytes.len());
        assert_eq!(again.cmd, "x-response");
    }
}

/// A node of 4 ranks for [`session`].
#[derive(Default)]
struct FakeNode {
    kvs: HashMap<String, String>,
    attrs: HashMap<String, String>,
    claimed: Vec<u32>,
}

impl Node for FakeNode {
    fn job_id(&self) -> &str {
        "fuzz"
    }
    fn n_ranks(&self) -> u32 {
        4
    }
    fn get(&self, key: &str) -> Option<String> {
        self.kvs.get(key).cloned()
    }
    fn job_attr(&self, key: &str) -> Option<String> {
        (key == "PMI_process_mapping").then(|| "(vector,(0,1,4))".into())
    }
    fn node_attr(&self, key: &str) -> Option<String> {
        self.attrs.get(key).cloned()
    }
    fn put(&mut self, _rank: u32, key: String, value: String) {
        self.kvs.insert(key, value);
    }
    fn put_node_attr(&mut self, key: String, value: String) {
        self.attrs.insert(key, value);
    }
    fn claim(&mut self, rank: u32) -> bool {
        rank < 4 && !self.claimed.contains(&rank) && {
            self.claimed.push(rank);
            true
        }
    }
}

/// A whole rank session (PMI-1, the switch to PMI-2, PMI-2 frames) fed in arbitrary chunks.
/// First byte: rank known (fd mode) or not (port mode); second: chunk size.
pub fn session(data: &[u8]) {
    let (Some(&mode), Some(&chunk)) = (data.first(), data.get(1)) else {
        return;
    };
    let data = &data[2..];
    let mut node = FakeNode::default();
    let mut session = Session::new((mode & 1 == 0).then_some(0));
    let mut names = crate::names::Table::default();
    let mut buf = BytesMut::new();
    for piece in data.chunks(usize::from(chunk.max(1))) {
        buf.extend_from_slice(piece);
        loop {
            match session.poll(&mut buf, &mut node) {
                Ok(None) => break,
                Ok(Some(actions)) => {
                    for a in actions {
                        match a {
                            Action::Fence => {
                                session.fence_done();
                            }
                            Action::WaitNodeAttr(k) => {
                                session.node_attr_ready(&k, "v");
                            }
                            Action::Names(request) => {
                                session.names_done(&names.serve(request));
                            }
                            Action::Spawn(request) => {
                                // Alternately started and refused.
                                let answer = match request.total_procs() % 2 {
                                    0 => Ok("j7.1".to_string()),
                                    _ => Err("refused".to_string()),
                                };
                                session.spawn_done(&answer);
                            }
                            _ => {}
                        }
                    }
                }
                Err(_) => return,
            }
        }
        // The buffer stays bounded: a session never hoards more than one message's worth.
        assert!(buf.len() <= 70 * 1024, "buffer grew to {}", buf.len());
    }
}

/// The overlay frame decoder: garbage and hostile lengths are refused, and whatever decodes
/// re-encodes to something that decodes to the same message. Each message then reaches the
/// collectives engine of node 1 of [`overlay_job`] (in a Bruck allgather), as if from node k
/// mod 8 for the k-th frame: whatever a peer sends, the engine does not panic.
pub fn overlay_frame(data: &[u8]) {
    let mut codec = FrameCodec { max_body: 1 << 16 };
    let mut buf = BytesMut::from(data);
    let job = overlay_job();
    let n = job.n_nodes();
    let topo = Arc::new(greedy_tree::greedy(n, &job.model));
    let mut engine = Engine::new(
        job,
        topo,
        AllgatherRule::bruck_above(0),
        Duration::from_secs(1),
    );
    let mut out = Vec::new();
    let blob = bytes::Bytes::from_static(b"x");
    engine.start(Op::Allgather, blob, Instant::now(), None, false, &mut out);
    let mut from = 0;
    while let Ok(Some(msg)) = codec.decode(&mut buf) {
        let mut again = BytesMut::new();
        codec.encode(msg.clone(), &mut again).expect("re-encode");
        assert_eq!(
            codec.decode(&mut again).expect("decode").expect("whole"),
            msg
        );
        engine.on_message(from % n, msg, &mut out);
        from += 1;
    }
}

/// The netlrts frame decoder and session: no panic, frames re-encode to the bytes consumed.
pub fn charm_frame(data: &[u8]) {
    let mut buf = BytesMut::from(data);
    let mut session = charm::Session::new();
    loop {
        let before = buf.len();
        match charm::decode(&mut buf) {
            Ok(Some(frame)) => {
                let again = charm::encode(&frame.kind, &frame.payload);
                assert_eq!(again.len(), before - buf.len());
                match session.handle(&frame) {
                    Ok(actions) => {
                        for a in actions {
                            if let charm::Action::Init(i) = a {
                                session.accept(i.node_no.unsigned_abs());
                            }
                        }
                    }
                    Err(_) => break,
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
}

/// The job of the overlay targets (both ends of [`overlay_handshake`], and the engine of
/// [`overlay_frame`]): 8 nodes in the greedy tree, this node 1 (a child of 0, with children
/// of its own).
fn overlay_job() -> JobSpec {
    let hosts: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
    JobSpec {
        job_id: "fuzz".into(),
        ranks: (0..8).map(|i| vec![i]).collect(),
        hosts,
        node_idx: 1,
        model: greedy_tree::LaunchModel::new(0.001, 0.004).expect("model"),
        secret: JobSecret::from_bytes(&[7; 32]).expect("secret"),
    }
}

/// The overlay handshake as the bytes of a stranger's connection: frames decoded with the
/// handshake's body limit, then the server's check of a hello or the client's check of a
/// welcome. Byte 0: bit 0 picks the side, bit 1 replaces the frame's MAC with the right one, so
/// the fuzzer reaches the checks after the proof. What is accepted must be exactly what the
/// rules allow: the right job, a valid proof, a node of the job other than this one, and a
/// child link only from a child in the tree.
pub fn overlay_handshake(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut codec = FrameCodec {
        max_body: HANDSHAKE_MAX_BODY,
    };
    let mut buf = BytesMut::from(rest);
    let Ok(Some(msg)) = codec.decode(&mut buf) else {
        return;
    };
    let handshake = Handshake {
        job: overlay_job(),
        server_nonce: [1u8; 32],
        client_nonce: [2u8; 32],
        sign: mode & 2 != 0,
    };
    if mode & 1 == 0 {
        handshake.server_reads_hello(msg);
    } else {
        handshake.client_reads_welcome(msg);
    }
}

/// One fuzzed handshake step between this job's node and a peer, with fixed nonces.
struct Handshake {
    job: JobSpec,
    server_nonce: [u8; 32],
    client_nonce: [u8; 32],
    /// Replace the frame's MAC with the right one, so that the checks past it are reached.
    sign: bool,
}

impl Handshake {
    /// The server's check of a hello: accepted exactly when it is a hello with the right
    /// proof from a node that may link here, and its welcome then passes the client's check.
    fn server_reads_hello(&self, mut msg: Message) {
        let (job, server_nonce) = (&self.job, &self.server_nonce);
        let tree = greedy_tree::greedy(job.n_nodes(), &job.model);
        if let (
            true,
            Message::Hello {
                job_id,
                node_idx,
                link,
                nonce,
                mac,
            },
        ) = (self.sign, &mut msg)
        {
            *mac = auth::Transcript {
                secret: &job.secret,
                job_id,
                node_idx: *node_idx,
                server: server_nonce,
                client: nonce,
            }
            .client_proof(*link);
        }
        let verdict = auth::accept_hello(job, |n| tree.parent(n), server_nonce, &msg);
        let allowed = match &msg {
            Message::Hello {
                job_id,
                node_idx,
                link,
                nonce,
                mac,
            } => {
                let peer = *node_idx as usize;
                *job_id == job.job_id
                    && *mac
                        == auth::Transcript {
                            secret: &job.secret,
                            job_id,
                            node_idx: *node_idx,
                            server: server_nonce,
                            client: nonce,
                        }
                        .client_proof(*link)
                    && peer < job.n_nodes()
                    && peer != job.node_idx
                    && (*link == Link::Direct || tree.parent(peer) == Some(job.node_idx))
            }
            _ => false,
        };
        assert_eq!(verdict.is_ok(), allowed, "{msg:?}: {verdict:?}");
        if let (Ok(accepted), Message::Hello { nonce, .. }) = (verdict, &msg) {
            // The welcome the server sends passes the client's check.
            let welcome = Message::Welcome {
                node_idx: job.node_idx as u32,
                mac: accepted.proof,
            };
            let client = JobSpec {
                node_idx: accepted.peer,
                ..job.clone()
            };
            auth::check_welcome(&client, job.node_idx, server_nonce, nonce, &welcome)
                .expect("the server's own welcome");
        }
    }

    /// The client's check of a welcome from node 0: accepted exactly when it is node 0's
    /// welcome with the right proof.
    fn client_reads_welcome(&self, mut msg: Message) {
        let (job, server_nonce, client_nonce) = (&self.job, &self.server_nonce, &self.client_nonce);
        let peer = 0;
        let proof = |node_idx| {
            auth::Transcript {
                secret: &job.secret,
                job_id: &job.job_id,
                node_idx,
                server: server_nonce,
                client: client_nonce,
            }
            .server_proof()
        };
        if let (true, Message::Welcome { node_idx, mac }) = (self.sign, &mut msg) {
            *mac = proof(*node_idx);
        }
        let verdict = auth::check_welcome(job, peer, server_nonce, client_nonce, &msg);
        let allowed = match &msg {
            Message::Welcome { node_idx, mac } => {
                *node_idx as usize == peer && *mac == proof(*node_idx)
            }
            _ => false,
        };
        assert_eq!(verdict.is_ok(), allowed, "{msg:?}: {verdict:?}");
    }
}

/// A remote node's direct-modex request body as this node decodes it: no panic, only this
/// node's ranks of this job are accepted, and an accepted request re-encodes to one that
/// decodes the same.
pub fn dmodex_request(data: &[u8]) {
    use crate::pmix::{decode_dmodex_request, encode_dmodex_request};
    // Node 1 of 3 holds ranks 2 and 3.
    let job = JobSpec {
        job_id: "fuzz".into(),
        hosts: vec!["n0".into(), "n1".into(), "n2".into()],
        node_idx: 1,
        model: greedy_tree::LaunchModel::new(0.001, 0.004).expect("model"),
        ranks: vec![vec![0, 1], vec![2, 3], vec![4]],
        secret: JobSecret::from_bytes(&[7; 32]).expect("secret"),
    };
    if let Ok((proc_, key)) = decode_dmodex_request(&job, data) {
        assert_eq!(proc_.nspace, job.job_id);
        assert!(job.local_ranks().contains(&proc_.rank));
        let again = encode_dmodex_request(&proc_, key.clone()).expect("encode");
        let (proc2, key2) = decode_dmodex_request(&job, &again).expect("own request decodes");
        assert!(proc2 == proc_ && key2 == key);
    }
}

/// A name-service request body from another node as node 0 decodes it: no panic, accepted
/// requests are within the length limits and re-encode to the same, and the table serves them
/// (a waiting lookup is held, then answered by a publish or its deadline, never twice).
pub fn names_request(data: &[u8]) {
    use std::time::{Duration, Instant};
    if let Ok(request) = names::decode_request(data) {
        let again = names::encode_request(&request);
        assert_eq!(names::decode_request(&again).as_ref(), Ok(&request));
        let mut table = names::Table::default();
        let t0 = Instant::now();
        let mut answered = std::collections::HashSet::new();
        let mut once = |answers: Vec<(names::Ticket, names::Response)>| {
            for (ticket, _) in answers {
                assert!(answered.insert(ticket), "ticket {ticket} answered twice");
            }
        };
        once(table.serve_at(1, request.clone(), t0));
        once(table.serve_at(2, request, t0));
        once(table.expire(t0 + names::WAIT_MAX + Duration::from_secs(1)));
        assert_eq!(table.next_deadline(), None);
    }
    let _ = names::decode_response(data);
}

/// A subset-collective contribution from another node as node 0 decodes and gathers it (and
/// the same bytes as node 0's answer to a group construct): no panic, a contribution re-encodes to the same, each ticket is answered at most once, and
/// every gathering ends by its deadline.
pub fn group_request(data: &[u8]) {
    use std::time::{Duration, Instant};
    let job = std::sync::Arc::new(JobSpec {
        job_id: "fuzz".into(),
        hosts: vec!["n0".into(), "n1".into(), "n2".into()],
        node_idx: 0,
        model: greedy_tree::LaunchModel::new(0.001, 0.004).expect("model"),
        ranks: vec![vec![0, 1], vec![2, 3], vec![4]],
        secret: JobSecret::from_bytes(&[7; 32]).expect("secret"),
    });
    // The same bytes as node 0's answer to a construct: decoded or refused, never a panic.
    if let Ok(a) = crate::group::decode_constructed(data) {
        let again = crate::group::encode_constructed(&a);
        assert_eq!(crate::group::decode_constructed(&again), Ok(a));
    }
    let Ok(c) = crate::group::decode(data) else {
        return;
    };
    assert_eq!(
        crate::group::decode(&crate::group::encode(&c)).as_ref(),
        Ok(&c)
    );
    let mut coordinator = crate::group::Coordinator::new(job);
    let t0 = Instant::now();
    let mut answered = std::collections::HashSet::new();
    for (ticket, from) in [(1, 0), (2, 1), (3, 2), (4, 1)] {
        for (t, _) in coordinator.contribute(ticket, from, c.clone(), t0) {
            assert!(answered.insert(t), "ticket {t} answered twice");
        }
    }
    let late = crate::group::GROUP_TIMEOUT_MAX + Duration::from_secs(1);
    for (t, _) in coordinator.expire(t0 + late) {
        assert!(answered.insert(t), "ticket {t} answered twice");
    }
    assert_eq!(coordinator.next_deadline(), None);
}
