//! Rendezvous through srun, for steps without reserved ports: srun listens
//! ([`SrunBoard`]), each stepd publishes its overlay address and looks up its overlay
//! parent's ([`SrunRendezvous`], a greedy-pmix [`Rendezvous`]).
//!
//! Wire format, one line each way, ASCII:
//! - `P <node> <addr> <mac>`: publish (stepd → srun; no reply);
//! - `L <node>`: look up (stepd → srun), answered `A <node> <addr> <mac>` once published.
//!
//! `mac` is hex HMAC-SHA256 of `greedy-mpi <job> <node> <addr>` under the step secret: srun
//! accepts only publishes from holders of the secret, and a stepd accepts only answers srun
//! signed, so no stranger can insert an address. (The overlay authenticates every link again;
//! this only keeps strangers from making the join time out.) The secret never travels here.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, Notify, Semaphore};

use greedy_pmix::rendezvous::Rendezvous;

/// Longest line accepted: a command, a node index, an IPv6 socket address and a 64-digit MAC.
pub const MAX_LINE: usize = 256;
/// Connections srun serves at once; one per stepd is open for the whole join, so this bounds
/// the step size this listener serves concurrently, well above any test and most sites.
pub const MAX_CONNECTIONS: usize = 8192;

/// `mac` of the wire format.
pub fn mac(secret: &[u8], job: &str, node: usize, addr: &SocketAddr) -> String {
    let mut m = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    m.update(format!("greedy-mpi {job} {node} {addr}").as_bytes());
    m.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Checks a `mac` in constant time.
pub fn verify(secret: &[u8], job: &str, node: usize, addr: &SocketAddr, hex: &str) -> bool {
    let Some(bytes) = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()
    else {
        return false;
    };
    let mut m = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    m.update(format!("greedy-mpi {job} {node} {addr}").as_bytes());
    m.verify_slice(&bytes).is_ok()
}

/// One parsed line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// `P node addr mac`.
    Publish(usize, SocketAddr, String),
    /// `L node`.
    Lookup(usize),
    /// `A node addr mac`.
    Answer(usize, SocketAddr, String),
}

/// Parses one line (without its newline).
pub fn parse(line: &str) -> Result<Line, String> {
    let mut it = line.split(' ');
    let (cmd, node) = (it.next(), it.next().and_then(|n| n.parse::<usize>().ok()));
    let bad = || format!("malformed rendezvous line {line:?}");
    let node = node.ok_or_else(bad)?;
    let mut addr_mac = || -> Result<(SocketAddr, String), String> {
        let addr = it.next().and_then(|a| a.parse().ok()).ok_or_else(bad)?;
        let mac = it.next().ok_or_else(bad)?.to_string();
        Ok((addr, mac))
    };
    let parsed = match cmd {
        Some("P") => {
            let (a, m) = addr_mac()?;
            Line::Publish(node, a, m)
        }
        Some("A") => {
            let (a, m) = addr_mac()?;
            Line::Answer(node, a, m)
        }
        Some("L") => Line::Lookup(node),
        _ => return Err(bad()),
    };
    if it.next().is_some() {
        return Err(bad());
    }
    Ok(parsed)
}

/// The board srun serves: node → overlay address.
#[derive(Debug)]
struct Board {
    job: String,
    secret: Vec<u8>,
    n_nodes: usize,
    addrs: std::sync::Mutex<HashMap<usize, SocketAddr>>,
    published: Notify,
}

/// srun's rendezvous listener; runs until the future [`SrunBoard::serve`] returns is dropped.
#[derive(Debug)]
pub struct SrunBoard {
    listener: TcpListener,
    board: Arc<Board>,
    idle_timeout: Duration,
}

impl SrunBoard {
    /// Binds `bind` (port 0: any free port).
    pub async fn bind(
        bind: SocketAddr,
        job: &str,
        secret: &[u8],
        n_nodes: usize,
        idle_timeout: Duration,
    ) -> std::io::Result<SrunBoard> {
        Ok(SrunBoard {
            listener: TcpListener::bind(bind).await?,
            board: Arc::new(Board {
                job: job.to_string(),
                secret: secret.to_vec(),
                n_nodes,
                addrs: Default::default(),
                published: Notify::new(),
            }),
            idle_timeout,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves connections until dropped. A connection silent for `idle_timeout` is closed
    /// (a stepd keeps its connection only for the join, which has its own timeout).
    pub async fn serve(self) {
        let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        loop {
            let Ok(permit) = limit.clone().acquire_owned().await else {
                return;
            };
            let stream = match self.listener.accept().await {
                Ok((s, _)) => s,
                Err(_) => {
                    // EMFILE and friends: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let board = self.board.clone();
            let idle = self.idle_timeout;
            tokio::spawn(async move {
                let _ = tokio::time::timeout(idle, serve_conn(board, stream)).await;
                drop(permit);
            });
        }
    }
}

async fn serve_conn(board: Arc<Board>, stream: TcpStream) -> Result<(), String> {
    let (r, mut w) = stream.into_split();
    let mut lines = BufReader::new(r.take(64 * MAX_LINE as u64)).lines();
    while let Some(line) = lines.next_line().await.map_err(|e| e.to_string())? {
        if line.len() > MAX_LINE {
            return Err("line too long".into());
        }
        match parse(&line)? {
            Line::Publish(node, addr, mac) => {
                if node >= board.n_nodes || !verify(&board.secret, &board.job, node, &addr, &mac) {
                    return Err(format!("refused publish for node {node}"));
                }
                board
                    .addrs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(node, addr);
                board.published.notify_waiters();
            }
            Line::Lookup(node) => {
                let addr = loop {
                    let notified = board.published.notified();
                    tokio::pin!(notified);
                    notified.as_mut().enable();
                    if let Some(a) = board
                        .addrs
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(&node)
                    {
                        break *a;
                    }
                    notified.await;
                };
                let mac = mac(&board.secret, &board.job, node, &addr);
                w.write_all(format!("A {node} {addr} {mac}\n").as_bytes())
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Line::Answer(..) => return Err("unexpected answer line".into()),
        }
    }
    Ok(())
}

/// A stepd's side: one connection to srun for the whole join.
#[derive(Debug)]
pub struct SrunRendezvous {
    srun: SocketAddr,
    job: String,
    secret: Vec<u8>,
    conn: Mutex<
        Option<(
            BufReader<tokio::net::tcp::OwnedReadHalf>,
            tokio::net::tcp::OwnedWriteHalf,
        )>,
    >,
}

impl SrunRendezvous {
    /// Talks to srun at `srun` for step `job`.
    pub fn new(srun: SocketAddr, job: &str, secret: &[u8]) -> Self {
        SrunRendezvous {
            srun,
            job: job.to_string(),
            secret: secret.to_vec(),
            conn: Mutex::new(None),
        }
    }

    async fn send(&self, line: String, want_answer: bool) -> Result<Option<String>, String> {
        let mut conn = self.conn.lock().await;
        if conn.is_none() {
            // srun listens before the launch RPC leaves, so one attempt suffices; the
            // overlay's join_timeout bounds it.
            let s = TcpStream::connect(self.srun)
                .await
                .map_err(|e| format!("connect to srun {}: {e}", self.srun))?;
            let _ = s.set_nodelay(true);
            let (r, w) = s.into_split();
            *conn = Some((BufReader::new(r), w));
        }
        let (r, w) = conn.as_mut().expect("just set");
        w.write_all(line.as_bytes())
            .await
            .map_err(|e| format!("write to srun {}: {e}", self.srun))?;
        if !want_answer {
            return Ok(None);
        }
        let mut answer = String::new();
        let n = r
            .read_line(&mut answer)
            .await
            .map_err(|e| format!("read from srun {}: {e}", self.srun))?;
        if n == 0 {
            return Err(format!(
                "srun {} closed the rendezvous connection",
                self.srun
            ));
        }
        Ok(Some(answer.trim_end().to_string()))
    }
}

impl Rendezvous for SrunRendezvous {
    async fn publish(&self, node_idx: usize, addr: SocketAddr) -> Result<(), String> {
        let mac = mac(&self.secret, &self.job, node_idx, &addr);
        self.send(format!("P {node_idx} {addr} {mac}\n"), false)
            .await
            .map(drop)
    }

    /// # Cancel safety
    /// Not cancel-safe (a dropped lookup may leave its answer unread on the connection); the
    /// overlay drops it only when `join_timeout` has passed and the join fails anyway.
    async fn lookup(&self, node_idx: usize) -> Result<SocketAddr, String> {
        let answer = self
            .send(format!("L {node_idx}\n"), true)
            .await?
            .unwrap_or_default();
        match parse(&answer)? {
            Line::Answer(n, addr, mac)
                if n == node_idx && verify(&self.secret, &self.job, n, &addr, &mac) =>
            {
                Ok(addr)
            }
            _ => Err(format!(
                "srun {} sent an unsigned or wrong answer",
                self.srun
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_and_macs_verify() {
        let a: SocketAddr = "10.1.2.3:4000".parse().unwrap();
        let m = mac(b"0123456789abcdef", "7.0", 3, &a);
        assert_eq!(
            parse(&format!("P 3 {a} {m}")).unwrap(),
            Line::Publish(3, a, m.clone())
        );
        assert_eq!(parse("L 12").unwrap(), Line::Lookup(12));
        assert!(verify(b"0123456789abcdef", "7.0", 3, &a, &m));
        assert!(!verify(b"0123456789abcdeX", "7.0", 3, &a, &m));
        assert!(!verify(b"0123456789abcdef", "7.1", 3, &a, &m));
        assert!(!verify(b"0123456789abcdef", "7.0", 3, &a, "zz"));
        for bad in ["", "X 1", "L", "L x", "P 1 nope m", "L 1 extra"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn stepds_find_their_parents_through_srun() {
        let secret = b"0123456789abcdef0123";
        let board = SrunBoard::bind(
            "127.0.0.1:0".parse().unwrap(),
            "5.1",
            secret,
            3,
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        let srun = board.local_addr().unwrap();
        let server = tokio::spawn(board.serve());
        let child = SrunRendezvous::new(srun, "5.1", secret);
        let parent = SrunRendezvous::new(srun, "5.1", secret);
        let a0: SocketAddr = "10.0.0.1:1000".parse().unwrap();
        // The child asks before the parent publishes: the answer waits.
        let lookup = tokio::spawn(async move { child.lookup(0).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        parent.publish(0, a0).await.unwrap();
        assert_eq!(lookup.await.unwrap(), Ok(a0));
        // A stranger without the secret cannot publish.
        let stranger = SrunRendezvous::new(srun, "5.1", b"wrong-secret-0000000");
        stranger.publish(1, a0).await.unwrap();
        let asker = SrunRendezvous::new(srun, "5.1", secret);
        assert!(
            tokio::time::timeout(Duration::from_millis(100), asker.lookup(1))
                .await
                .is_err(),
            "a forged address was served"
        );
        server.abort();
    }
}
