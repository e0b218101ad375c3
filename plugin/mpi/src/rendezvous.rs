//! srun's listener for the stepds of one step ([`SrunBoard`]): rendezvous for steps without
//! reserved ports (each stepd publishes its overlay address and looks up its overlay parent's,
//! [`SrunRendezvous`], a greedy-pmix [`Rendezvous`]), and the job's end for every step: the node
//! where an abort started reports the exit code ([`report_exit`]), which srun returns from
//! `client_fini` so that it exits with the failing rank's code (srun.c:215-227@22.05.8), not
//! with the SIGKILL that ended the other ranks.
//!
//! Wire format, one line each way, ASCII:
//! - `P <node> <addr> <mac>`: publish (stepd → srun; no reply);
//! - `L <node> <mac>`: look up (stepd → srun; `mac` under a label of its own, so that no other
//!   line's signature passes for it), answered `A <node> <addr> <mac>` once published;
//! - `X <node> <code> <at> <mac> <reason>`: the job ended with `code` by an abort that started
//!   at `at` (µs since the epoch, the node's clock) (stepd → srun), answered `K` once
//!   recorded; `reason` (the rest of the line) is for the user. Two nodes can each start an
//!   abort before hearing of the other's; srun keeps the earliest, the cause.
//! - `W <node> <mac>`: tell me when the job ends (stepd → srun; `mac` over `watch`),
//!   answered with the kept `X` line, its reporter's `mac` unchanged, once there is one. A
//!   node that has not joined the overlay yet hears of an abort no other way
//!   ([`await_job_end`]); a stranger, who cannot sign the question, hears nothing.
//! - `S <node> <hex> <mac>`: start what a local rank asked for with `MPI_Comm_spawn`
//!   (stepd → srun; `hex`: greedy-pmix's `SpawnRequest`, postcard; `mac` over `spawn <hex>`),
//!   answered `N <node> <mac> <nspace>` once srun started it as a nested step
//!   ([`crate::nested`]) or `E <node> <mac> <reason>` (`mac` over `spawned <nspace>` or
//!   `refused <reason>`) ([`ask_spawn`]).
//!   A PMIx spawn ([`crate::attach`]) is answered first with `D <node> <seq> <mac> <hex>`
//!   (`hex`: greedy-pmix's `ChildJob`; `mac` over `add <seq> <hex>`): the stepd adds the child
//!   on every node of its step, then says `G <node> <seq> <mac>` (`mac` over `added <seq>`) or
//!   `F <node> <seq> <mac> <reason>` (`mac` over `failed <seq> <reason>`) on the same
//!   connection, which srun answers with the `N` or `E` above.
//! - `C <seq> <ticket>`: spawn `seq`'s nested srun says Slurm created its step (nested srun →
//!   srun, from its `client_prelaunch`), answered `K` (for a PMIx spawn once the child was
//!   added everywhere) or `R` (it was not); `ticket` is a random secret of that spawn alone,
//!   given to that srun only ([`crate::nested::tell_spawner`]).
//!
//! `mac` is the hex of greedy-pmix's signed statement (`auth::sign`: HMAC-SHA256 under the
//! step secret, labelled, over the job, the node and `<addr>` or `exit <code> <at> <reason>`):
//! srun accepts only lines from holders of the secret (a `C` line: of that spawn's ticket),
//! and a stepd accepts only answers srun signed, so no stranger can insert an address, an
//! exit code or a spawn.
//! (The overlay authenticates every link again; this only keeps strangers from making the join
//! time out.) The secret never travels here.
//!
//! Strangers can still connect. Until its first signed line a connection holds an unproven
//! slot ([`Limits`]): it must send that line within `first_line` (2 s), and one over the caps
//! (in all, and per source address) is closed at once, never queued. A connection that proved
//! itself counts against nothing, so stepds never wait behind strangers; a stepd whose
//! connection was dropped connects again ([`SrunRendezvous`]).

use std::collections::HashMap;
use std::fmt::Display;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, Notify};
use tokio::time::Instant;
use tracing::debug;

use greedy_pmix::auth::{Admission, Gate, Unproven};
use greedy_pmix::child::{ChildJob, SpawnRequest};
use greedy_pmix::{JobSecret, WallTime, auth, rendezvous::Rendezvous};
use tokio::sync::oneshot;

/// Longest line accepted: a command, a node index, an IPv6 socket address and a 64-digit MAC.
pub const MAX_LINE: usize = 256;
/// Longest `reason` of an exit report or a refused spawn; longer ones are cut (the slurmd
/// log has the whole).
pub const MAX_REASON: usize = 150;
/// Longest spawn request line: a program, its arguments and the preput keys, in hex.
pub const MAX_SPAWN_LINE: usize = 32 * 1024;

/// How srun's listener holds connections that have not sent a signed line yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A connection's first line, which must be signed, must arrive within this. A stepd sends
    /// it as soon as it connects.
    pub first_line: Duration,
    /// Unproven connections at once, in all and per source address; one over is closed at
    /// once. A stepd has one at a time and proves it in one line, so the caps are far above
    /// what a step needs; a stepd dropped anyway connects again.
    pub admission: Admission,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            first_line: Duration::from_secs(2),
            admission: Admission {
                max_unproven: 1024,
                max_unproven_per_source: 64,
            },
        }
    }
}

/// What every signature of these lines is labelled with (greedy-pmix `auth::sign`).
const LABEL: &[u8] = b"greedy-mpi rendezvous";
/// The label of a lookup's signature: a lookup signed under [`LABEL`] (over any statement) does
/// not verify, nor does any other line's signature pass for a lookup.
const LOOKUP_LABEL: &[u8] = b"greedy-mpi rendezvous lookup";

/// `mac` of the wire format: `what` is the address, or an [`ExitReport`]'s text; hex of
/// greedy-pmix's signed statement.
pub fn mac(secret: &JobSecret, job: &str, node: usize, what: &dyn Display) -> String {
    let statement = what.to_string();
    auth::to_hex(&auth::sign(
        secret,
        LABEL,
        job,
        node as u32,
        statement.as_bytes(),
    ))
}

/// Checks a `mac` in constant time.
pub fn verify(secret: &JobSecret, job: &str, node: usize, what: &dyn Display, hex: &str) -> bool {
    let (Some(bytes), Ok(node)) = (auth::from_hex(hex), u32::try_from(node)) else {
        return false;
    };
    let statement = what.to_string();
    auth::verify_signed(secret, LABEL, job, node, statement.as_bytes(), &bytes)
}

/// `mac` of a lookup of node `node`'s address.
pub fn lookup_mac(secret: &JobSecret, job: &str, node: usize) -> String {
    auth::to_hex(&auth::sign(secret, LOOKUP_LABEL, job, node as u32, b""))
}

/// Checks a lookup's `mac` in constant time.
pub fn verify_lookup(secret: &JobSecret, job: &str, node: usize, hex: &str) -> bool {
    let (Some(bytes), Ok(node)) = (auth::from_hex(hex), u32::try_from(node)) else {
        return false;
    };
    auth::verify_signed(secret, LOOKUP_LABEL, job, node, b"", &bytes)
}

/// One parsed line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// `P node addr mac`.
    Publish(usize, SocketAddr, String),
    /// `L node mac`.
    Lookup(usize, String),
    /// `A node addr mac`.
    Answer(usize, SocketAddr, String),
    /// `X node code at mac reason`.
    Exit(ExitReport, String),
    /// `W node mac`.
    Watch(usize, String),
    /// `S node hex mac`.
    Spawn(usize, String, String),
    /// `N node mac nspace` (started) or `E node mac reason` (refused).
    Spawned(usize, Result<String, String>, String),
    /// `C seq ticket`: spawn `seq`'s nested srun created its step.
    Created(u32, String),
    /// `D node seq mac hex`: add child job `hex` of spawn `seq` on every node first.
    Add(usize, u32, String, String),
    /// `G node seq mac` (added) or `F node seq mac reason` (not).
    Added(usize, u32, Result<(), String>, String),
}

impl Display for Line {
    /// The wire form, without the newline.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Line::Publish(node, addr, mac) => write!(f, "P {node} {addr} {mac}"),
            Line::Lookup(node, mac) => write!(f, "L {node} {mac}"),
            Line::Answer(node, addr, mac) => write!(f, "A {node} {addr} {mac}"),
            Line::Exit(r, mac) => write!(f, "X {} {} {} {mac} {}", r.node, r.code, r.at, r.reason),
            Line::Watch(node, mac) => write!(f, "W {node} {mac}"),
            Line::Spawn(node, hex, mac) => write!(f, "S {node} {hex} {mac}"),
            Line::Spawned(node, Ok(nspace), mac) => write!(f, "N {node} {mac} {nspace}"),
            Line::Spawned(node, Err(reason), mac) => write!(f, "E {node} {mac} {reason}"),
            Line::Created(seq, ticket) => write!(f, "C {seq} {ticket}"),
            Line::Add(node, seq, mac, hex) => write!(f, "D {node} {seq} {mac} {hex}"),
            Line::Added(node, seq, Ok(()), mac) => write!(f, "G {node} {seq} {mac}"),
            Line::Added(node, seq, Err(why), mac) => write!(f, "F {node} {seq} {mac} {why}"),
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
    for (prefix, started) in [("N ", true), ("E ", false)] {
        if let Some(rest) = line.strip_prefix(prefix) {
            let mut it = rest.splitn(3, ' ');
            let node = it.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
            let mac = it.next().filter(|m| !m.is_empty()).ok_or_else(bad)?;
            let text = it.next().unwrap_or_default().to_string();
            let result = if started { Ok(text) } else { Err(text) };
            return Ok(Line::Spawned(node, result, mac.to_string()));
        }
    }
    for prefix in ["D ", "G ", "F "] {
        if let Some(rest) = line.strip_prefix(prefix) {
            let mut it = rest.splitn(4, ' ');
            let node = it.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
            let seq = it.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
            let mac = it
                .next()
                .filter(|m| !m.is_empty())
                .ok_or_else(bad)?
                .to_string();
            let text = it.next().unwrap_or_default().to_string();
            return Ok(match prefix {
                "D " if !text.is_empty() => Line::Add(node, seq, mac, text),
                "G " if text.is_empty() => Line::Added(node, seq, Ok(()), mac),
                "F " => Line::Added(node, seq, Err(text), mac),
                _ => return Err(bad()),
            });
        }
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
        Some("L") => Line::Lookup(node, it.next().ok_or_else(bad)?.to_string()),
        Some("W") => Line::Watch(node, it.next().ok_or_else(bad)?.to_string()),
        Some("C") => {
            let seq = u32::try_from(node).map_err(|_| bad())?;
            Line::Created(seq, it.next().ok_or_else(bad)?.to_string())
        }
        Some("S") => {
            let hex = it.next().filter(|h| !h.is_empty()).ok_or_else(bad)?;
            let mac = it.next().ok_or_else(bad)?;
            Line::Spawn(node, hex.to_string(), mac.to_string())
        }
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
    /// Who starts spawned jobs; none: spawns are refused.
    spawner: std::sync::OnceLock<Arc<dyn Spawner>>,
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

    /// The exit report of the earliest abort, once a node has reported one.
    pub async fn first(&self) -> ExitReport {
        loop {
            // Registered before the check: a report kept in between still wakes it.
            let notified = self.0.ended.notified();
            if let Some(report) = self.earliest() {
                return report;
            }
            notified.await;
        }
    }

    /// srun's own report of how the job ends (a spawned job failed), signed as node
    /// `report.node`'s would be, so the stepds watching for the end believe it.
    pub fn keep(&self, mut report: ExitReport) {
        report.reason = one_line(&report.reason);
        let board = &self.0;
        let mac = mac(
            &board.secret,
            &board.job,
            report.node,
            &report.signed_text(),
        );
        board.keep_exit(report, mac);
    }
}

/// srun's rendezvous listener; runs until the future [`SrunBoard::serve`] returns is dropped.
#[derive(Debug)]
pub struct SrunBoard {
    listener: TcpListener,
    board: Arc<Board>,
    idle_timeout: Duration,
    limits: Limits,
}

impl SrunBoard {
    /// Binds `bind` (port 0: any free port), with the default [`Limits`].
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
                spawner: Default::default(),
            }),
            idle_timeout,
            limits: Limits::default(),
        })
    }

    /// The same board with other limits on unproven connections.
    pub fn with_limits(self, limits: Limits) -> SrunBoard {
        SrunBoard { limits, ..self }
    }

    /// Spawn requests go to `spawner` (until then they are refused).
    pub fn serve_spawns(&self, spawner: Arc<dyn Spawner>) {
        let _ = self.board.spawner.set(spawner);
    }

    /// Where the exit reports will be.
    pub fn reports(&self) -> Reports {
        Reports(self.board.clone())
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves connections until dropped. Accept never waits for a slot: a connection over the
    /// [`Limits`] is closed at once. A connection is closed `idle_timeout` after its accept (a
    /// stepd keeps its connection only for the join, which has its own timeout).
    pub async fn serve(self) {
        let gate = Gate::new(self.limits.admission);
        loop {
            let (stream, peer) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                Err(_) => {
                    // EMFILE and friends: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Some(slot) = gate.admit(peer.ip()) else {
                debug!(%peer, "rendezvous: too many unproven connections, dropped");
                drop_now(stream);
                continue;
            };
            let board = self.board.clone();
            let (idle, first_line) = (self.idle_timeout, self.limits.first_line);
            tokio::spawn(async move {
                let served = serve_conn(board, stream, slot, first_line);
                if let Ok(Err(reason)) = tokio::time::timeout(idle, served).await {
                    debug!(%peer, "rendezvous connection closed: {reason}");
                }
            });
        }
    }
}

/// Closes `stream` with a reset: a connection refused for load costs srun no TIME_WAIT.
fn drop_now(stream: TcpStream) {
    let _ = rustix::net::sockopt::set_socket_linger(&stream, Some(Duration::ZERO));
}

/// One connection: lines until it closes. The first must come within `first_line` of the
/// accept; each must be signed, else the connection is closed; the first signed one gives up
/// `slot`.
async fn serve_conn(
    board: Arc<Board>,
    stream: TcpStream,
    slot: Unproven,
    first_line: Duration,
) -> Result<(), String> {
    let (r, mut w) = stream.into_split();
    let budget = 64 * MAX_LINE + 4 * MAX_SPAWN_LINE;
    let mut lines = BufReader::new(r.take(budget as u64)).lines();
    let (mut slot, until) = (Some(slot), Instant::now() + first_line);
    loop {
        let next = if slot.is_some() {
            tokio::time::timeout_at(until, lines.next_line())
                .await
                .map_err(|_| format!("no line within {first_line:?}"))?
        } else {
            lines.next_line().await
        };
        let Some(line) = next.map_err(|e| e.to_string())? else {
            return Ok(());
        };
        let limit = if line.starts_with("S ") {
            MAX_SPAWN_LINE
        } else {
            MAX_LINE
        };
        if line.len() > limit {
            return Err("line too long".into());
        }
        let line = parse(&line)?;
        if !board.signed(&line) {
            return Err(format!("unsigned or wrongly signed line {line}"));
        }
        if let Some(slot) = slot.take() {
            slot.proven();
        }
        if !board.answer(line, &mut w).await? {
            return Ok(());
        }
    }
}

impl Board {
    /// Starts what node `node`'s rank asked for (`hex`: its `SpawnRequest`): the child's
    /// namespace, why not, or (PMIx) the child the node must first add everywhere.
    async fn spawn(&self, node: usize, hex: &str) -> Answer {
        let request =
            auth::from_hex(hex).and_then(|bytes| postcard::from_bytes::<SpawnRequest>(&bytes).ok());
        let Some(request) = request else {
            return Answer::Done(Err(format!(
                "node {node} sent an undecodable spawn request"
            )));
        };
        match self.spawner.get() {
            Some(spawner) => (spawner.spawn(node, request).await)
                .unwrap_or_else(|_| Answer::Done(Err("srun dropped the spawn".into()))),
            None => Answer::Done(Err(greedy_pmix::child::NOT_SERVED.to_string())),
        }
    }

    /// The signed final answer to node `node`'s spawn.
    fn spawned(&self, node: usize, result: Result<String, String>) -> (String, bool) {
        let result = result.map_err(|why| one_line(&why));
        let mac = mac(&self.secret, &self.job, node, &spawned_statement(&result));
        (Line::Spawned(node, result, mac).to_string(), true)
    }

    /// Keeps `report` (signed `mac`) if it is the earliest so far, and wakes the watchers.
    fn keep_exit(&self, report: ExitReport, mac: String) {
        {
            let mut kept = self.exit.lock().unwrap_or_else(|p| p.into_inner());
            if kept.as_ref().is_none_or(|(k, _)| report.at < k.at) {
                *kept = Some((report, mac));
            }
        }
        self.ended.notify_waiters();
    }

    /// Whether `line` is one a stepd of this step signed for one of its nodes.
    fn signed(&self, line: &Line) -> bool {
        let (secret, job) = (&self.secret, self.job.as_str());
        let ok = |node: usize| node < self.n_nodes;
        match line {
            Line::Publish(node, addr, mac) => ok(*node) && verify(secret, job, *node, addr, mac),
            Line::Lookup(node, mac) => ok(*node) && verify_lookup(secret, job, *node, mac),
            Line::Exit(r, mac) => ok(r.node) && verify(secret, job, r.node, &r.signed_text(), mac),
            Line::Watch(node, mac) => ok(*node) && verify(secret, job, *node, &WATCH, mac),
            Line::Spawn(node, hex, mac) => {
                ok(*node) && verify(secret, job, *node, &spawn_statement(hex), mac)
            }
            Line::Created(seq, ticket) => self.spawner.get().is_some_and(|s| s.holds(*seq, ticket)),
            Line::Added(node, seq, result, mac) => {
                ok(*node) && verify(secret, job, *node, &added_statement(*seq, result), mac)
            }
            Line::Answer(..) | Line::Spawned(..) | Line::Add(..) => false,
        }
    }

    /// Acts on a signed line and writes its answer, if it has one; whether the connection
    /// stays open (a watch's answer is its last).
    async fn answer(&self, line: Line, w: &mut OwnedWriteHalf) -> Result<bool, String> {
        let (reply, stay) = match line {
            Line::Publish(node, addr, _) => {
                self.addrs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(node, addr);
                self.published.notify_waiters();
                return Ok(true);
            }
            Line::Lookup(node, _) => {
                let addr = wait_for(&self.published, || {
                    let addrs = self.addrs.lock().unwrap_or_else(|p| p.into_inner());
                    addrs.get(&node).copied()
                })
                .await;
                let mac = mac(&self.secret, &self.job, node, &addr);
                (Line::Answer(node, addr, mac).to_string(), true)
            }
            Line::Exit(report, mac) => {
                self.keep_exit(report, mac);
                ("K".to_string(), true)
            }
            Line::Watch(..) => {
                let end = wait_for(&self.ended, || {
                    let kept = self.exit.lock().unwrap_or_else(|p| p.into_inner());
                    kept.as_ref().map(|(r, m)| Line::Exit(r.clone(), m.clone()))
                })
                .await;
                (end.to_string(), false)
            }
            Line::Created(seq, _) => {
                let go = match self.spawner.get() {
                    Some(spawner) => spawner.created(seq).await.unwrap_or(false),
                    None => false,
                };
                (if go { "K" } else { "R" }.to_string(), true)
            }
            Line::Spawn(node, hex, _) => match self.spawn(node, &hex).await {
                Answer::Done(result) => self.spawned(node, result),
                Answer::Add(seq, child) => {
                    let hex = auth::to_hex(&postcard::to_stdvec(&child).unwrap_or_default());
                    let mac = mac(&self.secret, &self.job, node, &add_statement(seq, &hex));
                    (Line::Add(node, seq, mac, hex).to_string(), true)
                }
            },
            Line::Added(node, seq, result, _) => {
                let answer = match self.spawner.get() {
                    Some(spawner) => (spawner.added(seq, result).await)
                        .unwrap_or_else(|_| Err("srun dropped the spawn".into())),
                    None => Err(greedy_pmix::child::NOT_SERVED.to_string()),
                };
                self.spawned(node, answer)
            }
            Line::Answer(..) | Line::Spawned(..) | Line::Add(..) => {
                return Err("unexpected answer line".into());
            }
        };
        w.write_all(format!("{reply}\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        Ok(stay)
    }
}

/// srun's answer to a spawn request.
#[derive(Debug)]
pub enum Answer {
    /// The child's namespace once it runs, or why not.
    Done(Result<String, String>),
    /// (PMIx) Spawn `seq`: the requester's node adds this child on every node of the step
    /// first, then says so ([`Spawner::added`]).
    Add(u32, ChildJob),
}

/// What srun does with a rank's spawn request ([`crate::nested`]): starts it, and answers
/// with the child's namespace once it runs, or why not. Called on srun's listener thread: it
/// must not block.
pub trait Spawner: Send + Sync + std::fmt::Debug {
    /// Starts `request`, which a rank on node `node` made; the answer comes later.
    fn spawn(&self, node: usize, request: SpawnRequest) -> oneshot::Receiver<Answer>;
    /// Whether `ticket` is spawn `seq`'s (its nested srun says its step exists).
    fn holds(&self, seq: u32, ticket: &str) -> bool;
    /// Spawn `seq`'s step exists: whether it may launch its tasks (a PMIx child once it was
    /// added everywhere).
    fn created(&self, seq: u32) -> oneshot::Receiver<bool>;
    /// (PMIx) The requester's node added spawn `seq`'s child everywhere, or could not: the
    /// final answer.
    fn added(
        &self,
        seq: u32,
        result: Result<(), String>,
    ) -> oneshot::Receiver<Result<String, String>>;
}

/// What a spawn request's `mac` covers besides the job and node.
pub(crate) fn spawn_statement(hex: &str) -> String {
    format!("spawn {hex}")
}

/// What a PMIx spawn's child job's `mac` covers besides the job and node.
pub(crate) fn add_statement(seq: u32, hex: &str) -> String {
    format!("add {seq} {hex}")
}

/// What the requester's word on adding the child covers besides the job and node.
pub(crate) fn added_statement(seq: u32, result: &Result<(), String>) -> String {
    match result {
        Ok(()) => format!("added {seq}"),
        Err(why) => format!("failed {seq} {why}"),
    }
}

/// What a spawn answer's `mac` covers besides the job and node.
pub(crate) fn spawned_statement(result: &Result<String, String>) -> String {
    match result {
        Ok(nspace) => format!("spawned {nspace}"),
        Err(reason) => format!("refused {reason}"),
    }
}

/// `text` on one line, at most [`MAX_REASON`] bytes.
fn one_line(text: &str) -> String {
    let mut line = text.replace(['\n', '\r'], " ");
    if line.len() > MAX_REASON {
        let mut cut = MAX_REASON;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
    }
    line
}

/// A stepd's spawn request to srun at `srun`, for a rank of node `node`: the child's
/// namespace once srun started it, or why not. A PMIx child is first handed to `add`, which
/// serves it on every node of the step, before srun lets its step launch.
pub async fn ask_spawn<F, Fut>(
    srun: SocketAddr,
    job: &str,
    secret: &JobSecret,
    node: usize,
    request: &SpawnRequest,
    add: F,
) -> Result<String, String>
where
    F: FnOnce(ChildJob) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let bytes = postcard::to_stdvec(request).map_err(|e| format!("encode the request: {e}"))?;
    let hex = auth::to_hex(&bytes);
    if hex.len() + MAX_LINE > MAX_SPAWN_LINE {
        return Err(format!(
            "a spawn request of {} bytes is over srun's limit of {}",
            bytes.len(),
            (MAX_SPAWN_LINE - MAX_LINE) / 2
        ));
    }
    let signed = mac(secret, job, node, &spawn_statement(&hex));
    let question = Line::Spawn(node, hex, signed);
    let (answer, mut conn) = ask_srun_held(srun, &question, MAX_CHILD_LINE).await?;
    let wrong = || format!("srun {srun} sent an unsigned or wrong answer");
    let (seq, child) = match parse(answer.trim_end()) {
        Ok(Line::Add(n, seq, mac, hex))
            if n == node && verify(secret, job, n, &add_statement(seq, &hex), &mac) =>
        {
            let child = auth::from_hex(&hex).and_then(|b| postcard::from_bytes(&b).ok());
            (seq, child.ok_or_else(wrong)?)
        }
        other => return spawn_result(other, &answer, srun, secret, job, node),
    };
    let added = add(child).await.map_err(|why| one_line(&why));
    let mac = mac(secret, job, node, &added_statement(seq, &added));
    let said = Line::Added(node, seq, added.clone(), mac);
    let final_answer = conn
        .say(&said, MAX_LINE)
        .await
        .map_err(|e| format!("ask srun {srun}: {e}"))?;
    let result = spawn_result(
        parse(final_answer.trim_end()),
        &final_answer,
        srun,
        secret,
        job,
        node,
    );
    added.and(result)
}

/// The child's namespace or why not, from srun's signed answer `parsed` (of `answer`).
fn spawn_result(
    parsed: Result<Line, String>,
    answer: &str,
    srun: SocketAddr,
    secret: &JobSecret,
    job: &str,
    node: usize,
) -> Result<String, String> {
    match parsed {
        Ok(Line::Spawned(n, result, mac))
            if n == node && verify(secret, job, n, &spawned_statement(&result), &mac) =>
        {
            result
        }
        _ if answer.is_empty() => Err(format!("srun {srun} closed without an answer")),
        _ => Err(format!("srun {srun} sent an unsigned or wrong answer")),
    }
}

/// Longest line srun sends a stepd: a PMIx spawn's child job, in hex.
const MAX_CHILD_LINE: usize = 4 * MAX_SPAWN_LINE;

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

/// Attempts of a one-off question to srun ([`ask_srun`]) that srun dropped at once.
const ASK_ATTEMPTS: u32 = 5;
/// A question that failed within this of its connect was dropped, not answered: ask again.
const DROPPED_WITHIN: Duration = Duration::from_secs(1);

/// A stepd's one-line question to srun at `srun` on a connection of its own, and srun's
/// one-line answer (empty if srun closed without one). srun drops a new connection at once
/// while strangers fill its unproven slots: one dropped so is asked again, a few times.
async fn ask_srun(srun: SocketAddr, question: &Line) -> Result<String, String> {
    Ok(ask_srun_held(srun, question, MAX_LINE).await?.0)
}

/// [`ask_srun`], keeping the connection for more of the same dialogue; the answer at most
/// `limit` bytes.
async fn ask_srun_held(
    srun: SocketAddr,
    question: &Line,
    limit: usize,
) -> Result<(String, SrunConn), String> {
    let (mut backoff, mut attempt) = (Duration::from_millis(20), 1);
    loop {
        let started = Instant::now();
        let answer = ask_once(srun, question, limit).await;
        let dropped = match &answer {
            Ok((answer, _)) => answer.is_empty(),
            Err(e) => e.kind() != std::io::ErrorKind::ConnectionRefused,
        };
        if !dropped || attempt == ASK_ATTEMPTS || started.elapsed() > DROPPED_WITHIN {
            return answer.map_err(|e| format!("ask srun {srun}: {e}"));
        }
        tokio::time::sleep(backoff).await;
        (backoff, attempt) = (backoff * 2, attempt + 1);
    }
}

/// A stepd's connection to srun's listener.
struct SrunConn {
    r: BufReader<OwnedReadHalf>,
    w: OwnedWriteHalf,
}

impl SrunConn {
    /// Says `line`; srun's one-line answer, at most `limit` bytes (empty if it closed).
    async fn say(&mut self, line: &Line, limit: usize) -> std::io::Result<String> {
        self.w.write_all(format!("{line}\n").as_bytes()).await?;
        let mut answer = String::new();
        (&mut self.r)
            .take(limit as u64 + 1)
            .read_line(&mut answer)
            .await?;
        Ok(answer)
    }
}

/// One attempt of [`ask_srun_held`].
async fn ask_once(
    srun: SocketAddr,
    question: &Line,
    limit: usize,
) -> std::io::Result<(String, SrunConn)> {
    let (r, w) = TcpStream::connect(srun).await?.into_split();
    let mut conn = SrunConn {
        r: BufReader::new(r),
        w,
    };
    let answer = conn.say(question, limit).await?;
    Ok((answer, conn))
}

/// A stepd's report of how the job ended, to srun at `srun`; returns once srun recorded it.
pub async fn report_exit(
    srun: SocketAddr,
    job: &str,
    secret: &JobSecret,
    mut report: ExitReport,
) -> Result<(), String> {
    // One line: no newlines, and short enough for srun's line limit.
    report.reason = one_line(&report.reason);
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

/// A stepd's side: one connection to srun for the whole join, made again if srun drops it.
#[derive(Debug)]
pub struct SrunRendezvous {
    srun: SocketAddr,
    job: String,
    secret: JobSecret,
    conn: Mutex<Conn>,
}

/// A stepd's connection to srun, and its publish line, which every new connection repeats.
#[derive(Debug, Default)]
struct Conn {
    stream: Option<(BufReader<OwnedReadHalf>, OwnedWriteHalf)>,
    publish: Option<String>,
}

impl Conn {
    /// Sends `question` (after this node's publish, on a new connection) and reads the answer.
    async fn ask(&mut self, srun: SocketAddr, question: &str) -> std::io::Result<String> {
        let (r, w) = match &mut self.stream {
            Some((r, w)) => (r, w),
            None => {
                let s = TcpStream::connect(srun).await?;
                let _ = s.set_nodelay(true);
                let (r, mut w) = s.into_split();
                if let Some(publish) = &self.publish {
                    w.write_all(publish.as_bytes()).await?;
                }
                let (r, w) = self.stream.insert((BufReader::new(r), w));
                (r, w)
            }
        };
        w.write_all(question.as_bytes()).await?;
        let mut answer = String::new();
        if r.read_line(&mut answer).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(answer.trim_end().to_string())
    }
}

impl SrunRendezvous {
    /// Talks to srun at `srun` for step `job`.
    pub fn new(srun: SocketAddr, job: &str, secret: &JobSecret) -> Self {
        SrunRendezvous {
            srun,
            job: job.to_string(),
            secret: secret.clone(),
            conn: Mutex::new(Conn::default()),
        }
    }

    /// srun's signed answer to a lookup of node `node`. A connection srun dropped or reset
    /// (strangers filling its slots, or its idle timeout) is made again, with this node's
    /// publish first, until the answer comes; a refused connect (srun gone) fails at once.
    ///
    /// # Cancel safety
    /// Not cancel-safe (a dropped lookup may leave its answer unread on the connection); the
    /// overlay drops it only when `join_timeout` has passed and the join fails anyway.
    async fn ask_address(&self, conn: &mut Conn, node: usize) -> Result<SocketAddr, String> {
        let srun = self.srun;
        let question = format!(
            "{}\n",
            Line::Lookup(node, lookup_mac(&self.secret, &self.job, node))
        );
        let mut backoff = Duration::from_millis(10);
        let answer = loop {
            match conn.ask(srun, &question).await {
                Ok(answer) => break answer,
                Err(e)
                    if conn.stream.is_none()
                        && e.kind() == std::io::ErrorKind::ConnectionRefused =>
                {
                    return Err(format!("connect to srun {srun}: {e}"));
                }
                Err(e) => debug!(%srun, "rendezvous connection lost ({e}); again in {backoff:?}"),
            }
            conn.stream = None;
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        };
        match parse(&answer)? {
            Line::Answer(n, addr, mac)
                if n == node && verify(&self.secret, &self.job, n, &addr, &mac) =>
            {
                Ok(addr)
            }
            _ => Err(format!("srun {srun} sent an unsigned or wrong answer")),
        }
    }
}

impl Rendezvous for SrunRendezvous {
    /// Publishes, then looks this node up: srun's answer confirms it holds the address (a
    /// line on a connection srun dropped would be lost unseen).
    async fn publish(&self, node_idx: usize, addr: SocketAddr) -> Result<(), String> {
        let mac = mac(&self.secret, &self.job, node_idx, &addr);
        let publish = format!("{}\n", Line::Publish(node_idx, addr, mac));
        let mut conn = self.conn.lock().await;
        conn.publish = Some(publish.clone());
        if let Some((_, w)) = &mut conn.stream
            && w.write_all(publish.as_bytes()).await.is_err()
        {
            // Made again, with the publish, by the lookup below.
            conn.stream = None;
        }
        match self.ask_address(&mut conn, node_idx).await? {
            held if held == addr => Ok(()),
            held => Err(format!(
                "srun {} holds {held} for node {node_idx}, not {addr}",
                self.srun
            )),
        }
    }

    /// # Cancel safety
    /// Not cancel-safe (a dropped lookup may leave its answer unread on the connection); the
    /// overlay drops it only when `join_timeout` has passed and the join fails anyway.
    async fn lookup(&self, node_idx: usize) -> Result<SocketAddr, String> {
        let mut conn = self.conn.lock().await;
        self.ask_address(&mut conn, node_idx).await
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
        assert_eq!(parse("L 12 ab").unwrap(), Line::Lookup(12, "ab".into()));
        // A lookup's signature is its own: a publish's does not pass for one, nor back.
        let l = lookup_mac(&key(b"0123456789abcdef"), "7.0", 3);
        assert!(verify_lookup(&key(b"0123456789abcdef"), "7.0", 3, &l));
        assert!(!verify_lookup(&key(b"0123456789abcdef"), "7.0", 4, &l));
        assert!(!verify_lookup(&key(b"0123456789abcdef"), "7.0", 3, &m));
        assert!(!verify(&key(b"0123456789abcdef"), "7.0", 3, &"", &l));
        assert!(verify(&key(b"0123456789abcdef"), "7.0", 3, &a, &m));
        assert!(!verify(&key(b"0123456789abcdeX"), "7.0", 3, &a, &m));
        assert!(!verify(&key(b"0123456789abcdef"), "7.1", 3, &a, &m));
        assert!(!verify(&key(b"0123456789abcdef"), "7.0", 3, &a, "zz"));
        for bad in [
            "",
            "X 1",
            "L",
            "L x",
            "L 1",
            "P 1 nope m",
            "L 1 m extra",
            "W 1",
            "W 1 m x",
            "D 1 2 m",
            "G 1 2 m extra",
            "G 1 x m",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        // Each line prints back to itself.
        for line in [
            format!("P 3 {a} {m}"),
            format!("L 12 {m}"),
            format!("W 3 {m}"),
            format!("X 2 7 1764172800000000 {m} a b"),
            format!("S 1 00ff {m}"),
            format!("N 1 {m} 7.0@1"),
            format!("E 1 {m} no such program"),
            format!("D 1 2 {m} 00ff"),
            format!("G 1 2 {m}"),
            format!("F 1 2 {m} node 3 could not"),
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

    /// Starts nothing; answers each request with its program, or refuses `./missing`; a PMIx
    /// request is first handed back to be added (child namespace `seq7`), then answered
    /// with the program, or refused with the adder's reason.
    #[derive(Debug)]
    struct Echo;

    impl Spawner for Echo {
        fn spawn(&self, node: usize, request: SpawnRequest) -> oneshot::Receiver<Answer> {
            let (tx, rx) = oneshot::channel();
            let program = request.apps[0].program.clone();
            let _ = tx.send(match (request.family, program.as_str()) {
                (greedy_pmix::family::Family::Pmix, _) => {
                    let child = ChildJob::new("seq7".into(), &request, vec![vec![0]], None);
                    Answer::Add(7, child)
                }
                (_, "./missing") => Answer::Done(Err("no such\nprogram".into())),
                (_, p) => Answer::Done(Ok(format!("{p}@{node}"))),
            });
            rx
        }
        fn holds(&self, _: u32, _: &str) -> bool {
            false
        }
        fn created(&self, _: u32) -> oneshot::Receiver<bool> {
            oneshot::channel().1
        }
        fn added(
            &self,
            seq: u32,
            result: Result<(), String>,
        ) -> oneshot::Receiver<Result<String, String>> {
            let (tx, rx) = oneshot::channel();
            let _ = tx.send(result.map(|()| format!("added {seq}")));
            rx
        }
    }

    async fn no_add(_: ChildJob) -> Result<(), String> {
        panic!("a PMI spawn has no child to add")
    }

    #[tokio::test]
    async fn a_spawn_goes_to_the_spawner_and_its_signed_answer_back() {
        let secret = &key(SECRET_BYTES);
        let board = SrunBoard::bind(
            "127.0.0.1:0".parse().unwrap(),
            "5.1",
            secret,
            3,
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        let addr = board.local_addr().unwrap();
        let served = std::sync::OnceLock::new();
        let request = |program: &str| SpawnRequest {
            parent: "5.1".into(),
            requester: 0,
            family: greedy_pmix::family::Family::Pmi,
            apps: vec![greedy_pmix::child::SpawnApp {
                program: program.into(),
                args: vec![],
                maxprocs: 1,
                env: vec![],
                cwd: None,
                hosts: vec![],
                path: None,
            }],
            preput: vec![],
        };
        let _ = served.set(board.board.clone());
        let serve = tokio::spawn(board.serve());
        // Nobody serves spawns yet.
        let refused = ask_spawn(addr, "5.1", secret, 2, &request("./kid"), no_add).await;
        assert_eq!(refused, Err(greedy_pmix::child::NOT_SERVED.into()));
        let _ = served.get().unwrap().spawner.set(Arc::new(Echo));
        let started = ask_spawn(addr, "5.1", secret, 2, &request("./kid"), no_add).await;
        assert_eq!(started, Ok("./kid@2".into()));
        let missing = ask_spawn(addr, "5.1", secret, 1, &request("./missing"), no_add).await;
        assert_eq!(missing, Err("no such program".into()));
        // PMIx: the child comes back to be added first; the answer follows the adder's word.
        let mut pmix = request("./kid");
        pmix.family = greedy_pmix::family::Family::Pmix;
        let seen = std::sync::Mutex::new(None);
        let add = async |child: ChildJob| {
            *seen.lock().unwrap() = Some(child.nspace);
            Ok(())
        };
        assert_eq!(
            ask_spawn(addr, "5.1", secret, 1, &pmix, add).await,
            Ok("added 7".into())
        );
        assert_eq!(seen.lock().unwrap().take().as_deref(), Some("seq7"));
        let fail = async |_| Err("node 2 could\nnot".to_string());
        let failed = ask_spawn(addr, "5.1", secret, 1, &pmix, fail).await;
        assert_eq!(failed, Err("node 2 could not".into()));
        // A stranger's request is not answered, nor started.
        let (wrong, x) = (key(b"another secret!!"), request("./x"));
        let stranger = ask_spawn(addr, "5.1", &wrong, 1, &x, no_add).await;
        assert!(stranger.unwrap_err().contains("without an answer"));
        serve.abort();
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
        let refused = tokio::time::timeout(Duration::from_millis(300), stranger.publish(1, a0));
        assert!(
            refused.await.is_err(),
            "srun confirmed a stranger's publish"
        );
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
    async fn srun_hears_of_the_first_report_as_it_comes() {
        let (srun, reports, server) = board().await;
        let first = tokio::spawn({
            let reports = reports.clone();
            async move { reports.first().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!first.is_finished(), "no report yet");
        let report = ExitReport {
            node: 2,
            code: 125,
            at: WallTime(7),
            reason: "lost overlay link to node 4 (n5)".into(),
        };
        report_exit(srun, "5.1", &key(SECRET_BYTES), report.clone())
            .await
            .unwrap();
        let heard = tokio::time::timeout(Duration::from_secs(5), first)
            .await
            .expect("heard once the report is in")
            .unwrap();
        assert_eq!((heard.node, heard.code), (2, 125));
        // Already in: at once.
        assert_eq!(reports.first().await.node, 2);
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
