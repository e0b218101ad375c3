//! srun's listener for the stepds of one step ([`SrunBoard`]): rendezvous for steps without
//! reserved ports (each stepd publishes its overlay address and looks up its overlay parent's,
//! [`SrunRendezvous`], a greedy-pmix [`Rendezvous`]), and the job's end for every step: the node
//! where an abort started reports the exit code ([`report_exit`]), which srun returns from
//! `client_fini` so that it exits with the failing rank's code (srun.c:215-227@22.05.8), not
//! with the SIGKILL that ended the other ranks.
//!
//! Wire format, one line each way, ASCII:
//! - `P <node> <addr> <mac>`: publish (stepd → srun; no reply);
//! - `L <node>`: look up (stepd → srun), answered `A <node> <addr> <mac>` once published;
//! - `X <node> <code> <at> <mac> <reason>`: the job ended with `code` by an abort that started
//!   at `at` (µs since the epoch, the node's clock) (stepd → srun), answered `K` once
//!   recorded; `reason` (the rest of the line) is for the user. Two nodes can each start an
//!   abort before hearing of the other's; srun keeps the earliest, the cause.
//! - `W <node> <mac>`: tell me when the job ends (stepd → srun; `mac` over `watch`),
//!   answered with the kept `X` line, its reporter's `mac` unchanged, once there is one. A
//!   node that has not joined the overlay yet hears of an abort no other way
//!   ([`await_job_end`]); a stranger, who cannot sign the question, hears nothing.
//!
//! `mac` is the hex of greedy-pmix's signed statement (`auth::sign`: HMAC-SHA256 under the
//! step secret, labelled, over the job, the node and `<addr>` or `exit <code> <at> <reason>`):
//! srun accepts only lines from holders of the secret, and a stepd
//! accepts only answers srun signed, so no stranger can insert an address or an exit code.
//! (The overlay authenticates every link again; this only keeps strangers from making the join
//! time out.) The secret never travels here.

use std::collections::HashMap;
use std::fmt::Display;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, Notify, Semaphore};

use greedy_pmix::{JobSecret, WallTime, auth, rendezvous::Rendezvous};

/// Longest line accepted: a command, a node index, an IPv6 socket address and a 64-digit MAC.
pub const MAX_LINE: usize = 256;
/// Longest `reason` of an exit report; longer ones are cut (the slurmd log has the whole).
pub const MAX_REASON: usize = 150;
/// Connections srun serves at once; one per stepd is open for the whole join, so this bounds
/// the step size this listener serves concurrently, well above any test and most sites.
pub const MAX_CONNECTIONS: usize = 8192;

/// What every signature of these lines is labelled with (greedy-pmix `auth::sign`).
const LABEL: &[u8] = b"greedy-mpi rendezvous";

/// `mac` of the wire format: `what` is the address, or an [`ExitReport`]'s text; hex of
/// greedy-pmix's signed statement.
pub fn mac(secret: &JobSecret, job: &str, node: usize, what: &dyn Display) -> String {
    let statement = what.to_string();
    auth::sign(secret, LABEL, job, node as u32, statement.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Checks a `mac` in constant time.
pub fn verify(secret: &JobSecret, job: &str, node: usize, what: &dyn Display, hex: &str) -> bool {
    // Hex digits only: from_str_radix alone would take "+f" for "0f".
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return false;
    }
    let Some(bytes) = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()
    else {
        return false;
    };
    let Ok(node) = u32::try_from(node) else {
        return false;
    };
    let statement = what.to_string();
    auth::verify_signed(secret, LABEL, job, node, statement.as_bytes(), &bytes)
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
    /// `X node code at mac reason`.
    Exit(ExitReport, String),
    /// `W node mac`.
    Watch(usize, String),
}

impl Display for Line {
    /// The wire form, without the newline.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Line::Publish(node, addr, mac) => write!(f, "P {node} {addr} {mac}"),
            Line::Lookup(node) => write!(f, "L {node}"),
            Line::Answer(node, addr, mac) => write!(f, "A {node} {addr} {mac}"),
            Line::Exit(r, mac) => write!(f, "X {} {} {} {mac} {}", r.node, r.code, r.at, r.reason),
            Line::Watch(node, mac) => write!(f, "W {node} {mac}"),
        }
    }
}

/// Parses one line (without its newline).
pub fn parse(line: &str) -> Result<Line, String> {
    let bad = || format!("malformed rendezvous line {line:?}");
    if let Some(rest) = line.strip_prefix("X ") {
        let mut it = rest.splitn(5, ' ');
        let node = it.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
        let code = it.next().and_then(|c| c.parse().ok()).ok_or_else(bad)?;
        let at = it.next().and_then(|t| t.parse().ok()).ok_or_else(bad)?;
        let mac = it.next().filter(|m| !m.is_empty()).ok_or_else(bad)?;
        let reason = it.next().unwrap_or_default().to_string();
        let report = ExitReport {
            node,
            code,
            at,
            reason,
        };
        return Ok(Line::Exit(report, mac.to_string()));
    }
    let mut it = line.split(' ');
    let (cmd, node) = (it.next(), it.next().and_then(|n| n.parse::<usize>().ok()));
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
        Some("W") => Line::Watch(node, it.next().ok_or_else(bad)?.to_string()),
        _ => return Err(bad()),
    };
    if it.next().is_some() {
        return Err(bad());
    }
    Ok(parsed)
}

/// How a step ended, as the node where its abort started reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitReport {
    /// The reporting node's index.
    pub node: usize,
    /// The exit code the job ends with (the failing rank's, or 128+signal).
    pub code: i32,
    /// When the abort started, on the reporting node's clock.
    pub at: WallTime,
    /// What happened, for the user.
    pub reason: String,
}

impl ExitReport {
    /// What the report's MAC covers besides the job and node.
    pub fn signed_text(&self) -> String {
        format!("exit {} {} {}", self.code, self.at, self.reason)
    }
}

/// The board srun serves: node → overlay address.
#[derive(Debug)]
struct Board {
    job: String,
    secret: JobSecret,
    n_nodes: usize,
    addrs: std::sync::Mutex<HashMap<usize, SocketAddr>>,
    published: Notify,
    /// The earliest exit report, with its reporter's `mac`: the abort that ended the job
    /// (later ones follow from it).
    exit: std::sync::Mutex<Option<(ExitReport, String)>>,
    /// Woken when the first exit report is kept.
    ended: Notify,
}

/// srun's view of the exit reports of a [`SrunBoard`], kept after the board is dropped.
#[derive(Debug, Clone)]
pub struct Reports(Arc<Board>);

impl Reports {
    /// The exit report of the earliest abort, if any node reported one.
    pub fn earliest(&self) -> Option<ExitReport> {
        self.0
            .exit
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(report, _)| report.clone())
    }
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
        secret: &JobSecret,
        n_nodes: usize,
        idle_timeout: Duration,
    ) -> std::io::Result<SrunBoard> {
        Ok(SrunBoard {
            listener: TcpListener::bind(bind).await?,
            board: Arc::new(Board {
                job: job.to_string(),
                secret: secret.clone(),
                n_nodes,
                addrs: Default::default(),
                published: Notify::new(),
                exit: Default::default(),
                ended: Notify::new(),
            }),
            idle_timeout,
        })
    }

    /// Where the exit reports will be.
    pub fn reports(&self) -> Reports {
        Reports(self.board.clone())
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
                let addr = wait_for(&board.published, || {
                    let addrs = board.addrs.lock().unwrap_or_else(|p| p.into_inner());
                    addrs.get(&node).copied()
                })
                .await;
                let mac = mac(&board.secret, &board.job, node, &addr);
                w.write_all(format!("{}\n", Line::Answer(node, addr, mac)).as_bytes())
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Line::Exit(report, mac) => {
                let (node, text) = (report.node, report.signed_text());
                if node >= board.n_nodes || !verify(&board.secret, &board.job, node, &text, &mac) {
                    return Err(format!("refused exit report for node {node}"));
                }
                {
                    let mut kept = board.exit.lock().unwrap_or_else(|p| p.into_inner());
                    if kept.as_ref().is_none_or(|(k, _)| report.at < k.at) {
                        *kept = Some((report, mac));
                    }
                }
                board.ended.notify_waiters();
                w.write_all(b"K\n").await.map_err(|e| e.to_string())?;
            }
            Line::Watch(node, mac) => {
                if node >= board.n_nodes || !verify(&board.secret, &board.job, node, &WATCH, &mac) {
                    return Err(format!("refused watch for node {node}"));
                }
                let line = wait_for(&board.ended, || {
                    let kept = board.exit.lock().unwrap_or_else(|p| p.into_inner());
                    kept.as_ref().map(|(r, m)| Line::Exit(r.clone(), m.clone()))
                })
                .await;
                w.write_all(format!("{line}\n").as_bytes())
                    .await
                    .map_err(|e| e.to_string())?;
                return Ok(());
            }
            Line::Answer(..) => return Err("unexpected answer line".into()),
        }
    }
    Ok(())
}

/// What `found` finds, once it finds something: checked again each time `notify` wakes its
/// waiters (interest is registered before each check, so a wake in between is not missed).
async fn wait_for<T>(notify: &Notify, mut found: impl FnMut() -> Option<T>) -> T {
    loop {
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Some(t) = found() {
            return t;
        }
        notified.await;
    }
}

/// A stepd's one-line question to srun at `srun` on a connection of its own, and srun's
/// one-line answer (empty if srun closed without one).
async fn ask_srun(srun: SocketAddr, question: &Line) -> Result<String, String> {
    let stream = TcpStream::connect(srun)
        .await
        .map_err(|e| format!("connect to srun {srun}: {e}"))?;
    let (r, mut w) = stream.into_split();
    w.write_all(format!("{question}\n").as_bytes())
        .await
        .map_err(|e| format!("write to srun {srun}: {e}"))?;
    let mut answer = String::new();
    BufReader::new(r.take(MAX_LINE as u64 + 1))
        .read_line(&mut answer)
        .await
        .map_err(|e| format!("read from srun {srun}: {e}"))?;
    Ok(answer)
}

/// A stepd's report of how the job ended, to srun at `srun`; returns once srun recorded it.
pub async fn report_exit(
    srun: SocketAddr,
    job: &str,
    secret: &JobSecret,
    mut report: ExitReport,
) -> Result<(), String> {
    // One line: no newlines, and short enough for srun's line limit.
    report.reason = report.reason.replace(['\n', '\r'], " ");
    if report.reason.len() > MAX_REASON {
        let mut cut = MAX_REASON;
        while !report.reason.is_char_boundary(cut) {
            cut -= 1;
        }
        report.reason.truncate(cut);
    }
    let mac = mac(secret, job, report.node, &report.signed_text());
    let ack = ask_srun(srun, &Line::Exit(report, mac)).await?;
    match ack.trim_end() {
        "K" => Ok(()),
        _ => Err(format!("srun {srun} refused the exit report")),
    }
}

/// What a `W` line's `mac` covers besides the job and node.
const WATCH: &str = "watch";

/// Node `node`'s wait for the job's end: returns the exit report srun kept once a node made
/// one (checked against the step secret: srun relays it, a stranger cannot forge it).
pub async fn await_job_end(
    srun: SocketAddr,
    job: &str,
    secret: &JobSecret,
    node: usize,
) -> Result<ExitReport, String> {
    let line = ask_srun(srun, &Line::Watch(node, mac(secret, job, node, &WATCH))).await?;
    match parse(line.trim_end()) {
        Ok(Line::Exit(report, mac))
            if verify(secret, job, report.node, &report.signed_text(), &mac) =>
        {
            Ok(report)
        }
        _ if line.is_empty() => Err(format!("srun {srun} closed the watch")),
        _ => Err(format!("srun {srun} sent an unsigned or wrong end")),
    }
}

/// A stepd's side: one connection to srun for the whole join.
#[derive(Debug)]
pub struct SrunRendezvous {
    srun: SocketAddr,
    job: String,
    secret: JobSecret,
    conn: Mutex<
        Option<(
            BufReader<tokio::net::tcp::OwnedReadHalf>,
            tokio::net::tcp::OwnedWriteHalf,
        )>,
    >,
}

impl SrunRendezvous {
    /// Talks to srun at `srun` for step `job`.
    pub fn new(srun: SocketAddr, job: &str, secret: &JobSecret) -> Self {
        SrunRendezvous {
            srun,
            job: job.to_string(),
            secret: secret.clone(),
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
        self.send(format!("{}\n", Line::Publish(node_idx, addr, mac)), false)
            .await
            .map(drop)
    }

    /// # Cancel safety
    /// Not cancel-safe (a dropped lookup may leave its answer unread on the connection); the
    /// overlay drops it only when `join_timeout` has passed and the join fails anyway.
    async fn lookup(&self, node_idx: usize) -> Result<SocketAddr, String> {
        let answer = self
            .send(format!("{}\n", Line::Lookup(node_idx)), true)
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

    fn key(bytes: &[u8]) -> JobSecret {
        JobSecret::from_bytes(bytes).expect("16 bytes or more")
    }

    #[test]
    fn lines_parse_and_macs_verify() {
        let a: SocketAddr = "10.1.2.3:4000".parse().unwrap();
        let m = mac(&key(b"0123456789abcdef"), "7.0", 3, &a);
        assert_eq!(
            parse(&format!("P 3 {a} {m}")).unwrap(),
            Line::Publish(3, a, m.clone())
        );
        assert_eq!(parse("L 12").unwrap(), Line::Lookup(12));
        assert!(verify(&key(b"0123456789abcdef"), "7.0", 3, &a, &m));
        assert!(!verify(&key(b"0123456789abcdeX"), "7.0", 3, &a, &m));
        assert!(!verify(&key(b"0123456789abcdef"), "7.1", 3, &a, &m));
        assert!(!verify(&key(b"0123456789abcdef"), "7.0", 3, &a, "zz"));
        for bad in [
            "",
            "X 1",
            "L",
            "L x",
            "P 1 nope m",
            "L 1 extra",
            "W 1",
            "W 1 m x",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        // Each line prints back to itself.
        for line in [
            format!("P 3 {a} {m}"),
            "L 12".into(),
            format!("W 3 {m}"),
            format!("X 2 7 1764172800000000 {m} a b"),
        ] {
            assert_eq!(parse(&line).unwrap().to_string(), line);
        }
        // Only hex digits: from_str_radix alone reads "+f" as 0x0f.
        let (node, m) = (0..)
            .map(|n| (n, mac(&key(b"0123456789abcdef"), "7.0", n, &a)))
            .find(|(_, m)| m.starts_with('0'))
            .unwrap();
        assert!(verify(&key(b"0123456789abcdef"), "7.0", node, &a, &m));
        assert!(!verify(
            &key(b"0123456789abcdef"),
            "7.0",
            node,
            &a,
            &format!("+{}", &m[1..])
        ));
    }

    const SECRET_BYTES: &[u8] = b"0123456789abcdef0123";

    /// srun's board for step 5.1 of 3 nodes, serving on loopback.
    async fn board() -> (SocketAddr, Reports, tokio::task::JoinHandle<()>) {
        let board = SrunBoard::bind(
            "127.0.0.1:0".parse().unwrap(),
            "5.1",
            &key(SECRET_BYTES),
            3,
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        let (addr, reports) = (board.local_addr().unwrap(), board.reports());
        (addr, reports, tokio::spawn(board.serve()))
    }

    #[tokio::test]
    async fn stepds_find_their_parents_through_srun() {
        let secret = &key(SECRET_BYTES);
        let (srun, _, server) = board().await;
        let child = SrunRendezvous::new(srun, "5.1", secret);
        let parent = SrunRendezvous::new(srun, "5.1", secret);
        let a0: SocketAddr = "10.0.0.1:1000".parse().unwrap();
        // The child asks before the parent publishes: the answer waits.
        let lookup = tokio::spawn(async move { child.lookup(0).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        parent.publish(0, a0).await.unwrap();
        assert_eq!(lookup.await.unwrap(), Ok(a0));
        // A stranger without the secret cannot publish.
        let stranger = SrunRendezvous::new(srun, "5.1", &key(b"wrong-secret-0000000"));
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

    #[tokio::test]
    async fn the_earliest_signed_exit_report_is_what_srun_returns() {
        let secret = &key(SECRET_BYTES);
        let (srun, reports, server) = board().await;
        let report = |node, code, at, reason: &str| ExitReport {
            node,
            code,
            at: WallTime(at),
            reason: reason.to_string(),
        };
        assert_eq!(reports.earliest(), None);
        // A node still joining waits for the end.
        let watcher = secret.clone();
        let watch = tokio::spawn(async move { await_job_end(srun, "5.1", &watcher, 1).await });
        // A stranger's report is refused and changes nothing.
        let forged = report_exit(
            srun,
            "5.1",
            &key(b"wrong-secret-0000000"),
            report(1, 0, 1, "all fine"),
        )
        .await;
        assert!(forged.is_err(), "{forged:?}");
        assert_eq!(reports.earliest(), None);
        // A peer's abort that followed from the cause reaches srun first; the cause still wins,
        // and a report of a later abort after it changes nothing.
        let peer = report(0, 14, 2_000_012, "rank 7 aborted: connection refused");
        report_exit(srun, "5.1", secret, peer).await.unwrap();
        assert_eq!(reports.earliest().unwrap().code, 14);
        let heard = tokio::time::timeout(Duration::from_secs(5), watch)
            .await
            .expect("the watch is answered once a report is in")
            .unwrap()
            .unwrap();
        assert_eq!((heard.node, heard.code), (0, 14));
        // A stranger's watch (it cannot sign it) is closed unanswered.
        let other = await_job_end(srun, "5.1", &key(b"wrong-secret-0000000"), 1).await;
        assert_eq!(other, Err(format!("srun {srun} closed the watch")));
        let long = format!(
            "rank 9 exited with code 7 before PMI finalize\n{}",
            "x".repeat(400)
        );
        report_exit(srun, "5.1", secret, report(2, 7, 2_000_000, &long))
            .await
            .unwrap();
        report_exit(srun, "5.1", secret, report(1, 137, 2_000_005, "later"))
            .await
            .unwrap();
        let kept = reports.earliest().unwrap();
        assert_eq!((kept.node, kept.code, kept.at), (2, 7, WallTime(2_000_000)));
        assert!(
            kept.reason
                .starts_with("rank 9 exited with code 7 before PMI finalize x")
        );
        assert_eq!(kept.reason.len(), MAX_REASON);
        // A signature covers the time: a report moved earlier does not verify.
        let signed = mac(secret, "5.1", 1, &report(1, 3, 9, "r").signed_text());
        let moved = Line::Exit(report(1, 3, 8, "r"), signed);
        let mut conn = TcpStream::connect(srun).await.unwrap();
        conn.write_all(format!("{moved}\n").as_bytes())
            .await
            .unwrap();
        let mut answer = String::new();
        let _ = BufReader::new(conn).read_line(&mut answer).await;
        assert_eq!(answer, "", "a report with a forged time was taken");
        assert_eq!(reports.earliest().unwrap().code, 7);
        assert_eq!(
            parse(&format!("X 2 7 15 {} a b", "ab")).unwrap(),
            Line::Exit(report(2, 7, 15, "a b"), "ab".into())
        );
        for bad in [
            "X",
            "X 1",
            "X 1 x 3 m r",
            "X 1 7",
            "X 1 7 3",
            "X 1 7 3 ",
            "X 1 7 x m r",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        server.abort();
    }
}
