//! Challenge–response proof of the per-job secret: HMAC-SHA256 over both sides' nonces.
//!
//! The server sends a fresh nonce; the client answers with its own nonce and
//! `HMAC(secret, "greedy-overlay client" ‖ job ‖ node ‖ link ‖ server nonce ‖ client nonce)`;
//! the server answers with `HMAC(secret, "greedy-overlay server" ‖ job ‖ node ‖ server nonce ‖
//! client nonce)`. The secret never travels; fresh nonces on both sides defeat replay, and the
//! labels stop a server proof from passing as a client proof. Verification is constant-time.
//!
//! Until a connection has proved the secret it holds a slot of a [`Gate`]: a listener admits
//! only so many unproven connections in all and per source address, and drops the rest at once,
//! so strangers cannot crowd out the job's own peers (which prove themselves in one round trip).

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::{
    JobSecret, JobSpec,
    frame::{Link, Message},
};

type HmacSha256 = Hmac<Sha256>;

/// A fresh 32-byte nonce from the OS.
pub fn nonce() -> [u8; 32] {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n).expect("the OS random source is available");
    n
}

/// What one handshake's proofs are made over: the job's secret and id, the node the client
/// claims to be (for the server's proof, the server's own node), and both sides' nonces.
#[derive(Clone, Copy)]
pub struct Transcript<'a> {
    /// The job's secret, the HMAC key.
    pub secret: &'a JobSecret,
    /// The job both sides serve.
    pub job_id: &'a str,
    /// The node the proof speaks for.
    pub node_idx: u32,
    /// The server's nonce (its challenge).
    pub server: &'a [u8; 32],
    /// The client's nonce (in its hello).
    pub client: &'a [u8; 32],
}

impl Transcript<'_> {
    fn mac(&self, label: &[u8], link: Option<Link>) -> HmacSha256 {
        let mut m =
            HmacSha256::new_from_slice(self.secret.as_bytes()).expect("HMAC takes any key length");
        m.update(label);
        m.update(&(self.job_id.len() as u64).to_be_bytes());
        m.update(self.job_id.as_bytes());
        m.update(&self.node_idx.to_be_bytes());
        m.update(match link {
            None => b"-",
            Some(Link::Child) => b"c",
            Some(Link::Direct) => b"d",
        });
        m.update(self.server);
        m.update(self.client);
        m
    }

    /// The client's proof, for a link of kind `link`.
    pub fn client_proof(&self, link: Link) -> [u8; 32] {
        self.mac(CLIENT, Some(link)).finalize().into_bytes().into()
    }

    /// Checks a client's proof in constant time.
    pub fn verify_client(&self, link: Link, proof: &[u8; 32]) -> bool {
        self.mac(CLIENT, Some(link)).verify_slice(proof).is_ok()
    }

    /// The server's proof (`node_idx` is the server's own).
    pub fn server_proof(&self) -> [u8; 32] {
        self.mac(SERVER, None).finalize().into_bytes().into()
    }

    /// Checks a server's proof in constant time.
    pub fn verify_server(&self, proof: &[u8; 32]) -> bool {
        self.mac(SERVER, None).verify_slice(proof).is_ok()
    }
}

/// The labels that keep a server's proof from passing as a client's.
const CLIENT: &[u8] = b"greedy-overlay client";
const SERVER: &[u8] = b"greedy-overlay server";

/// A statement that stands alone, without a handshake (the Slurm plugin's rendezvous lines
/// through srun): `HMAC(secret, label ‖ job ‖ node ‖ statement)`, lengths prefixed. Whoever
/// checks it knows the secret's holder said it; with no nonce, a replay can only repeat what
/// the holder said, so keep statements idempotent.
pub fn sign(
    secret: &JobSecret,
    label: &[u8],
    job_id: &str,
    node_idx: u32,
    statement: &[u8],
) -> [u8; 32] {
    statement_mac(secret, label, job_id, node_idx, statement)
        .finalize()
        .into_bytes()
        .into()
}

/// Checks a [`sign`]ature in constant time.
pub fn verify_signed(
    secret: &JobSecret,
    label: &[u8],
    job_id: &str,
    node_idx: u32,
    statement: &[u8],
    signature: &[u8],
) -> bool {
    statement_mac(secret, label, job_id, node_idx, statement)
        .verify_slice(signature)
        .is_ok()
}

/// Lowercase hex of `bytes`: how a secret or a [`sign`]ature travels as text.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of `hex` (either case), or `None` unless it is an even number of hex digits and
/// nothing else (`u8::from_str_radix` alone would take `"+f"` for `0f`).
pub fn from_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

fn statement_mac(
    secret: &JobSecret,
    label: &[u8],
    job_id: &str,
    node_idx: u32,
    statement: &[u8],
) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    for part in [label, job_id.as_bytes()] {
        m.update(&(part.len() as u64).to_be_bytes());
        m.update(part);
    }
    m.update(&node_idx.to_be_bytes());
    m.update(&(statement.len() as u64).to_be_bytes());
    m.update(statement);
    m
}

/// A client the server let in: who it is, which link it opens, and the [`Message::Welcome`] proof.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The client's node index (checked to be a node of the job other than the server).
    pub peer: usize,
    /// The link it opens.
    pub link: Link,
    /// The server's proof for the welcome.
    pub proof: [u8; 32],
}

/// The server's side of the handshake after its challenge: checks the client's first frame
/// (`hello`) over `server_nonce` — the job, the proof, then whether that node may open that link
/// to this node (a child link only from a child in the tree, `parent` giving a node's parent).
/// The error is the log line's reason.
pub fn accept_hello(
    job: &JobSpec,
    parent: impl Fn(usize) -> Option<usize>,
    server_nonce: &[u8; 32],
    hello: &Message,
) -> Result<Accepted, String> {
    let me = job.node_idx;
    let &Message::Hello {
        ref job_id,
        node_idx,
        link,
        ref nonce,
        ref mac,
    } = hello
    else {
        return Err(format!("expected hello, got {}", hello.kind()));
    };
    let peer = node_idx as usize;
    if *job_id != job.job_id {
        return Err(format!("claims job {job_id:?}, we serve {:?}", job.job_id));
    }
    let transcript = Transcript {
        secret: &job.secret,
        job_id: &job.job_id,
        node_idx,
        server: server_nonce,
        client: nonce,
    };
    if !transcript.verify_client(link, mac) {
        return Err(format!(
            "claims node {node_idx} but fails the job-secret proof"
        ));
    }
    if peer >= job.n_nodes() || peer == me || (link == Link::Child && parent(peer) != Some(me)) {
        return Err(format!(
            "node {node_idx} may not open a {link:?} link to node {me}"
        ));
    }
    let proof = Transcript {
        node_idx: me as u32,
        ..transcript
    }
    .server_proof();
    Ok(Accepted { peer, link, proof })
}

/// The client's side after its hello: checks the server's answer (`welcome`) proves the secret
/// for node `peer` over both nonces. The error is the reason the link is refused.
pub fn check_welcome(
    job: &JobSpec,
    peer: usize,
    server_nonce: &[u8; 32],
    client_nonce: &[u8; 32],
    welcome: &Message,
) -> Result<(), String> {
    let &Message::Welcome { node_idx, ref mac } = welcome else {
        return Err(format!("expected welcome, got {}", welcome.kind()));
    };
    let transcript = Transcript {
        secret: &job.secret,
        job_id: &job.job_id,
        node_idx,
        server: server_nonce,
        client: client_nonce,
    };
    if node_idx as usize != peer || !transcript.verify_server(mac) {
        return Err(format!(
            "server claiming node {node_idx} fails the job-secret proof"
        ));
    }
    Ok(())
}

/// How many connections a listener holds before they prove the job secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// Unproven connections at once, from everywhere.
    pub max_unproven: usize,
    /// Unproven connections at once from one source address.
    pub max_unproven_per_source: usize,
}

/// Counts a listener's unproven connections against its [`Admission`] limits.
#[derive(Debug)]
pub struct Gate {
    limits: Admission,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    per_source: HashMap<IpAddr, usize>,
}

impl Gate {
    /// A gate with these limits.
    pub fn new(limits: Admission) -> Arc<Gate> {
        Arc::new(Gate {
            limits,
            held: Mutex::default(),
        })
    }

    /// A slot for a new connection from `source`, or `None` when it would exceed a limit: the
    /// caller drops the connection at once rather than queue it (a queue is what a flood fills).
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Option<Unproven> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let from_source = held.per_source.get(&source).copied().unwrap_or(0);
        if held.total >= self.limits.max_unproven
            || from_source >= self.limits.max_unproven_per_source
        {
            return None;
        }
        held.total += 1;
        held.per_source.insert(source, from_source + 1);
        Some(Unproven {
            gate: self.clone(),
            source,
        })
    }

    /// Unproven connections held now.
    pub fn unproven(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).total
    }
}

/// A connection's slot while it has not proved the secret; freed when proven or dropped.
#[derive(Debug)]
pub struct Unproven {
    gate: Arc<Gate>,
    source: IpAddr,
}

impl Unproven {
    /// The connection proved the secret: it no longer counts against the gate's limits.
    pub fn proven(self) {}
}

impl Drop for Unproven {
    fn drop(&mut self) {
        let mut held = self.gate.held.lock().unwrap_or_else(|p| p.into_inner());
        held.total = held.total.saturating_sub(1);
        if let Some(n) = held.per_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                held.per_source.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_takes_only_hex_digits() {
        let bytes = [0x00, 0x0f, 0xa5, 0xff];
        assert_eq!(to_hex(&bytes), "000fa5ff");
        assert_eq!(from_hex("000fa5ff").as_deref(), Some(&bytes[..]));
        assert_eq!(from_hex("000FA5FF").as_deref(), Some(&bytes[..]));
        assert_eq!(from_hex("").as_deref(), Some(&[][..]));
        for bad in ["abc", "+f", "0g", " 0", "é0"] {
            assert_eq!(from_hex(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_gate_caps_unproven_connections_per_source_and_in_all() {
        let gate = Gate::new(Admission {
            max_unproven: 3,
            max_unproven_per_source: 2,
        });
        let (a, b, c): (IpAddr, IpAddr, IpAddr) = (
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            "10.0.0.3".parse().unwrap(),
        );
        let a1 = gate.admit(a).expect("first from a");
        let _a2 = gate.admit(a).expect("second from a");
        assert!(gate.admit(a).is_none(), "a third from one source");
        let b1 = gate.admit(b).expect("first from b");
        assert!(gate.admit(c).is_none(), "a fourth in all");
        // A proven connection frees its slot, and so does a dropped one.
        a1.proven();
        let _a3 = gate.admit(a).expect("a's slot is free again");
        drop(b1);
        let _c1 = gate.admit(c).expect("b's slot went to c");
        assert_eq!(gate.unproven(), 3);
    }

    #[test]
    fn proofs_bind_every_field() {
        let secret = JobSecret::from_bytes(&[7; 32]).unwrap();
        let other = JobSecret::from_bytes(&[8; 32]).unwrap();
        let (s, c) = ([1; 32], [2; 32]);
        let t = Transcript {
            secret: &secret,
            job_id: "j",
            node_idx: 3,
            server: &s,
            client: &c,
        };
        let p = t.client_proof(Link::Child);
        assert!(t.verify_client(Link::Child, &p));
        let refused = [
            Transcript {
                secret: &other,
                ..t
            }
            .verify_client(Link::Child, &p),
            Transcript { job_id: "k", ..t }.verify_client(Link::Child, &p),
            Transcript { node_idx: 4, ..t }.verify_client(Link::Child, &p),
            t.verify_client(Link::Direct, &p),
            Transcript {
                server: &[9; 32],
                ..t
            }
            .verify_client(Link::Child, &p),
            Transcript {
                client: &[9; 32],
                ..t
            }
            .verify_client(Link::Child, &p),
            // A server proof is not a client proof.
            t.verify_client(Link::Child, &t.server_proof()),
        ];
        assert_eq!(refused, [false; 7]);
        let server = Transcript { node_idx: 0, ..t };
        let sp = server.server_proof();
        assert!(server.verify_server(&sp));
        assert!(
            !Transcript {
                secret: &other,
                ..server
            }
            .verify_server(&sp)
        );
        assert_ne!(nonce(), nonce());
    }

    #[test]
    fn a_hello_is_accepted_only_from_a_node_allowed_that_link() {
        let job = JobSpec {
            job_id: "j".into(),
            hosts: (0..4).map(|i| format!("n{i}")).collect(),
            node_idx: 1,
            model: Default::default(),
            ranks: (0..4).map(|r| vec![r]).collect(),
            secret: JobSecret::from_bytes(&[7; 32]).unwrap(),
        };
        let (s, c) = ([1; 32], [2; 32]);
        // Node 3's parent is node 1; node 2's is not.
        let parent = |n: usize| Some(if n == 3 { 1 } else { 0 });
        let hello = |node: u32, link: Link| Message::Hello {
            job_id: "j".into(),
            node_idx: node,
            link,
            nonce: c,
            mac: Transcript {
                secret: &job.secret,
                job_id: "j",
                node_idx: node,
                server: &s,
                client: &c,
            }
            .client_proof(link),
        };
        let ok = accept_hello(&job, parent, &s, &hello(3, Link::Child)).unwrap();
        assert_eq!((ok.peer, ok.link), (3, Link::Child));
        let welcome = Message::Welcome {
            node_idx: 1,
            mac: ok.proof,
        };
        let client = JobSpec {
            node_idx: 3,
            ..job.clone()
        };
        assert_eq!(check_welcome(&client, 1, &s, &c, &welcome), Ok(()));
        assert!(check_welcome(&client, 2, &s, &c, &welcome).is_err());
        assert!(accept_hello(&job, parent, &s, &hello(2, Link::Direct)).is_ok());
        for (node, link, why) in [
            (2, Link::Child, "may not open"),
            (1, Link::Direct, "may not open"),
            (4, Link::Direct, "may not open"),
        ] {
            let e = accept_hello(&job, parent, &s, &hello(node, link)).unwrap_err();
            assert!(e.contains(why), "{node} {link:?}: {e}");
        }
        let e = accept_hello(&job, parent, &s, &Message::Bye).unwrap_err();
        assert_eq!(e, "expected hello, got bye");
    }
}
