//! One srun step for every agent (`--rsh srun`, inside a Slurm allocation where ssh is not
//! allowed), as Hydra's slurm bootstrap does: Slurm's own fan-out starts `greedyd --connect
//! ADDR` on every host at once, and each agent connects back to greedyrun over TCP, where its
//! edge takes the place of a remote shell's pipes.
//!
//! One step rather than one per host: a site that caps a job's concurrent steps (about 100 on
//! Frontier) would refuse the rest, and each `srun` costs slurmctld a step creation. Slurm
//! starts the agents, so the launch tree is flat: every agent is greedyrun's child, and none
//! starts others.
//!
//! The connection is authenticated both ways before a byte of the job goes over it: greedyrun
//! sends a fresh nonce; the agent answers with its host name, its own fresh nonce and
//! `HMAC(job secret, host ‖ greedyrun's nonce ‖ agent's nonce)`; greedyrun answers with an HMAC
//! under another label over the host and both nonces ([`greedy_pmix::auth::sign`]). The agent
//! reads no frame from a listener that does not prove it holds the secret, so a stranger who
//! takes the port (greedyrun gone, srun still starting agents) gets nothing run. The secret
//! reaches the agents in srun's environment ([`KEY_VAR`]), which only the job's user can read.
//!
//! The listener keeps proven agents ahead of strangers: at most `hosts + 64` connections (and
//! [`PER_SOURCE`] from one address) may be unproven at once, each for [`HELLO_TIMEOUT`]; the
//! excess is closed at once, and the agents retry their dial until the launch timeout.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use greedy_pmix::{JobSecret, auth};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        TcpListener, TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    process::Command,
    sync::{OwnedSemaphorePermit, Semaphore, oneshot, watch},
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::Error;

/// greedyd's flag: connect to greedyrun at this address instead of reading stdin.
pub const CONNECT_FLAG: &str = "--connect";

/// The variable that carries the job secret to the agents (srun passes its environment on).
pub const KEY_VAR: &str = "GREEDY_CONNECT_KEY";

/// The variable that tells the agents how long to keep trying to reach greedyrun (seconds):
/// the launch timeout.
pub const PATIENCE_VAR: &str = "GREEDY_CONNECT_TIMEOUT";

/// How long an agent keeps trying when [`PATIENCE_VAR`] is not set.
const DEFAULT_PATIENCE: Duration = Duration::from_secs(60);

/// How long each step of the agent's handshake may take: connecting, greedyrun's nonce,
/// greedyrun's answer.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long greedyrun waits for a connection's first bytes (the agent's host and proof); the
/// agent sends them as soon as it has the nonce, so only a silent stranger needs more.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(2);

/// How many unproven connections one source address may hold: a host runs one agent, so a
/// stranger cannot crowd out the others.
pub const PER_SOURCE: usize = 16;

/// Unproven connections allowed beyond one per host.
const SPARE_HANDSHAKES: usize = 64;

/// Longest wait between two of the agent's connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The agent's proof; greedyrun's answer has its own label, so neither passes for the other.
const LABEL: &[u8] = b"greedyrun connect";
const ANSWER_LABEL: &[u8] = b"greedyrun connect answer";

/// Longest host name an agent may announce.
const HOST_MAX: usize = 255;

/// Options of the one srun step: `--overlap` (the job's own steps hold its CPUs),
/// `--mpi=none` (the agents are no MPI tasks, whatever `MpiDefault` says), one task per node,
/// `--export=ALL` (the key travels in the environment, whatever `SLURM_EXPORT_ENV` says),
/// `--input=none` (no task reads srun's stdin), `--quiet`.
const SRUN_OPTIONS: &[&str] = &[
    "--overlap",
    "--mpi=none",
    "--ntasks-per-node=1",
    "--export=ALL",
    "--input=none",
    "--quiet",
];

/// What is signed: the host, then two nonces (greedyrun's first in the agent's proof, the
/// agent's first in greedyrun's answer).
fn statement(host: &str, first: &[u8; 32], second: &[u8; 32]) -> Vec<u8> {
    let mut s = host.as_bytes().to_vec();
    s.push(0);
    s.extend_from_slice(first);
    s.extend_from_slice(second);
    s
}

/// The agent's side, as greedyd runs it: connects to greedyrun at `addr` (trying again until
/// [`PATIENCE_VAR`]'s seconds have passed), proves it holds the job secret (from [`KEY_VAR`])
/// for its host (`SLURMD_NODENAME`, which slurmd sets for every task, else the host name) and
/// checks greedyrun's proof. Returns the proven edge and the key: greedyd runs the job
/// greedyrun sends on it only if it carries that secret (`agent::run_on`).
pub async fn dial_from_env(
    addr: &str,
) -> Result<(OwnedReadHalf, OwnedWriteHalf, JobSecret), Error> {
    let key = std::env::var(KEY_VAR)
        .ok()
        .and_then(|k| JobSecret::from_hex(&k))
        .ok_or_else(|| Error::Plan(format!("{CONNECT_FLAG} needs the job key in {KEY_VAR}")))?;
    let host = match std::env::var("SLURMD_NODENAME") {
        Ok(h) => h,
        Err(_) => nix::unistd::gethostname()
            .map_err(|e| Error::Io {
                what: "read this host's name".into(),
                source: e.into(),
            })?
            .to_string_lossy()
            .into_owned(),
    };
    let patience = std::env::var(PATIENCE_VAR)
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s.parse().ok()?).ok())
        .unwrap_or(DEFAULT_PATIENCE);
    let (down, up) = dial(addr, &key, &host, patience).await?.into_split();
    Ok((down, up, key))
}

/// Connects to greedyrun at `addr` as `host`'s agent, trying again with backoff for
/// `patience` while greedyrun cannot be reached or closes unproven connections; then proves it
/// holds `key` and checks that greedyrun does too.
pub async fn dial(
    addr: &str,
    key: &JobSecret,
    host: &str,
    patience: Duration,
) -> Result<TcpStream, Error> {
    if host.is_empty() || host.len() > HOST_MAX {
        return Err(Error::Plan(format!(
            "host name {host:?} cannot be announced"
        )));
    }
    let deadline = tokio::time::Instant::now() + patience;
    let mut backoff = Duration::from_millis(20);
    loop {
        match attempt(addr, key, host).await {
            Ok(stream) => return Ok(stream),
            Err(Proof::NotRead(e)) if tokio::time::Instant::now() + backoff < deadline => {
                debug!("greedyrun at {addr}: {e}; trying again in {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            Err(Proof::NotRead(e)) => {
                return Err(Error::Io {
                    what: format!(
                        "gave up reaching greedyrun at {addr} after {} s",
                        patience.as_secs_f64()
                    ),
                    source: e,
                });
            }
            Err(Proof::Unproven(why)) => {
                return Err(Error::Untrusted(format!(
                    "the listener at {addr} {why}: not proven to be this job's greedyrun, so nothing it sends is run"
                )));
            }
        }
    }
}

/// One connection to greedyrun, proven both ways.
async fn attempt(addr: &str, key: &JobSecret, host: &str) -> Result<TcpStream, Proof> {
    let (mut stream, nonce) = reach(addr).await.map_err(Proof::NotRead)?;
    prove(&mut stream, key, host, &nonce).await?;
    Ok(stream)
}

/// One attempt to reach greedyrun: the connection and greedyrun's nonce, each within
/// [`HANDSHAKE_TIMEOUT`].
async fn reach(addr: &str) -> std::io::Result<(TcpStream, [u8; 32])> {
    let timed_out = |what: &str| std::io::Error::new(std::io::ErrorKind::TimedOut, what);
    let mut stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| timed_out("connecting timed out"))??;
    let _ = stream.set_nodelay(true);
    let mut nonce = [0u8; 32];
    tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.read_exact(&mut nonce))
        .await
        .map_err(|_| timed_out("no nonce"))??;
    Ok((stream, nonce))
}

/// Why the agent's half of the handshake failed.
enum Proof {
    /// greedyrun was not reached, or closed before our proof was read (a listener closing
    /// the excess of a crowd); worth another try.
    NotRead(std::io::Error),
    /// The listener did not prove it holds the key; says how.
    Unproven(String),
}

/// Sends `host`, our nonce and our proof over greedyrun's `nonce`; checks greedyrun's answer.
async fn prove(
    stream: &mut TcpStream,
    key: &JobSecret,
    host: &str,
    nonce: &[u8; 32],
) -> Result<(), Proof> {
    let ours = auth::nonce();
    let proof = auth::sign(key, LABEL, "", 0, &statement(host, nonce, &ours));
    let mut hello = vec![host.len() as u8];
    hello.extend_from_slice(host.as_bytes());
    hello.extend_from_slice(&ours);
    hello.extend_from_slice(&proof);
    stream.write_all(&hello).await.map_err(Proof::NotRead)?;
    let mut answer = [0u8; 32];
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.read_exact(&mut answer)).await {
        Err(_) => Err(Proof::Unproven(format!(
            "did not answer this agent's proof within {} s",
            HANDSHAKE_TIMEOUT.as_secs()
        ))),
        Ok(Err(e)) => Err(Proof::Unproven(format!(
            "did not answer this agent's proof ({e})"
        ))),
        Ok(Ok(_))
            if auth::verify_signed(
                key,
                ANSWER_LABEL,
                "",
                0,
                &statement(host, &ours, nonce),
                &answer,
            ) =>
        {
            Ok(())
        }
        Ok(Ok(_)) => Err(Proof::Unproven("answered with a wrong proof".into())),
    }
}

/// Whether `a` and `b` are the same secret, in time that does not depend on where they differ.
pub fn same_secret(a: &JobSecret, b: &JobSecret) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// greedyrun's side: the srun step and the connections its agents open.
#[derive(Debug, Clone)]
pub struct Star {
    /// The connection of each host's agent, once it proved itself; taken by that host's edge.
    waiting: Arc<Mutex<HashMap<String, oneshot::Sender<TcpStream>>>>,
    /// How srun ended, once it has: an agent not yet connected never will.
    srun_ended: watch::Receiver<Option<String>>,
    /// Stops srun (and with it every agent Slurm started) and the listener.
    stop: CancellationToken,
}

/// One host's wait for its agent's connection.
pub type Pending = oneshot::Receiver<TcpStream>;

impl Star {
    /// Listens where `hosts` can reach this process, starts `srun … AGENT --connect ADDR` on
    /// every host (`srun` being the words of `--rsh`), and returns each host's wait for its
    /// connection, in `hosts` order. The agents keep trying to connect for `patience` (the
    /// launch timeout). srun's own messages go to greedyrun's stderr.
    pub async fn start(
        srun: &[String],
        agent: &[String],
        hosts: &[String],
        key: &JobSecret,
        patience: Duration,
    ) -> Result<(Star, Vec<Pending>), Error> {
        let ip = reachable_ip(hosts).await?;
        let listener = TcpListener::bind((ip, 0))
            .await
            .map_err(|source| Error::Io {
                what: format!("listen on {ip} for the agents srun starts"),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Io {
            what: "read the agents' listener address".into(),
            source,
        })?;
        let mut waiting = HashMap::new();
        let mut pending = Vec::new();
        for h in hosts {
            let (tx, rx) = oneshot::channel();
            waiting.insert(h.clone(), tx);
            pending.push(rx);
        }
        let argv = srun_argv(srun, agent, hosts, addr);
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .env(KEY_VAR, key.to_hex())
            .env(PATIENCE_VAR, patience.as_secs_f64().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            // Its own group, as a remote shell's: a terminal's Ctrl-C reaches greedyrun only,
            // which ends the job in order.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| Error::Io {
                what: format!("run {}", argv[0]),
                source,
            })?;
        debug!(%addr, hosts = hosts.len(), "one srun step starts every agent");
        let (ended_tx, srun_ended) = watch::channel(None);
        let star = Star {
            waiting: Arc::new(Mutex::new(waiting)),
            srun_ended,
            stop: CancellationToken::new(),
        };
        tokio::spawn(watch_srun(child, argv, ended_tx, star.stop.clone()));
        let gate = Gate::new(hosts.len() + SPARE_HANDSHAKES);
        tokio::spawn(accept(listener, star.clone(), key.clone(), gate));
        Ok((star, pending))
    }

    /// Resolves when srun has ended; says how.
    pub async fn srun_ended(&self) -> String {
        let mut rx = self.srun_ended.clone();
        match rx.wait_for(Option::is_some).await {
            Ok(status) => status.clone().unwrap_or_default(),
            Err(_) => "srun is gone".into(),
        }
    }

    /// Stops srun (Slurm then ends every agent it started) and the listener.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

/// `srun OPTIONS --nodes=N --ntasks=N --nodelist=HOSTS AGENT --connect ADDR`: the user's srun
/// words first, so that their options (a partition, `--mem=0`) come along.
fn srun_argv(srun: &[String], agent: &[String], hosts: &[String], addr: SocketAddr) -> Vec<String> {
    let mut argv = srun.to_vec();
    argv.extend(SRUN_OPTIONS.iter().map(|s| s.to_string()));
    argv.push(format!("--nodes={}", hosts.len()));
    argv.push(format!("--ntasks={}", hosts.len()));
    argv.push(format!("--nodelist={}", hosts.join(",")));
    argv.extend(agent.iter().cloned());
    argv.extend([CONNECT_FLAG.to_string(), addr.to_string()]);
    argv
}

/// The address of this machine that the hosts would reach it at: the kernel's choice of
/// source address towards the first host that does not resolve to loopback (greedyrun may run
/// on one of them, whose own name Debian maps to 127.0.1.1).
async fn reachable_ip(hosts: &[String]) -> Result<std::net::IpAddr, Error> {
    let (mut target, mut fallback) = (None, None);
    for host in hosts {
        let Ok(addrs) = tokio::net::lookup_host((host.as_str(), 9)).await else {
            continue;
        };
        for a in addrs {
            if a.ip().is_loopback() {
                fallback.get_or_insert(a);
            } else {
                target = Some(a);
                break;
            }
        }
        if target.is_some() {
            break;
        }
    }
    // Every host on loopback: a job on this machine alone (tests).
    let target = target
        .or(fallback)
        .ok_or_else(|| Error::Plan(format!("none of the hosts resolves ({})", hosts[0])))?;
    let any: SocketAddr = if target.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    let route = |source| Error::Io {
        what: format!("find a route to {target}"),
        source,
    };
    // Connecting a UDP socket sends nothing; it only picks the route and the source address.
    let probe = tokio::net::UdpSocket::bind(any).await.map_err(route)?;
    probe.connect(target).await.map_err(route)?;
    let local = probe.local_addr().map_err(route)?;
    Ok(local.ip())
}

/// Ends srun when told, and says how it ended.
async fn watch_srun(
    mut child: tokio::process::Child,
    argv: Vec<String>,
    ended: watch::Sender<Option<String>>,
    stop: CancellationToken,
) {
    let status = tokio::select! {
        s = child.wait() => s,
        _ = stop.cancelled() => {
            // SIGTERM: srun asks Slurm to end the step's tasks, which a SIGKILLed srun would
            // leave to their lost connections.
            if let Some(pid) = child.id() {
                crate::signals::signal_group(pid, nix::sys::signal::Signal::SIGTERM);
            }
            match tokio::time::timeout(Duration::from_secs(5), child.wait()).await {
                Ok(s) => s,
                Err(_) => {
                    let _ = child.start_kill();
                    child.wait().await
                }
            }
        }
    };
    let text = match status {
        Ok(s) => format!("`{}` ended ({s})", argv[..argv.len() - 2].join(" ")),
        Err(e) => format!("waiting for srun failed: {e}"),
    };
    debug!("{text}");
    ended.send_replace(Some(text));
}

/// The limits on unproven connections: a count in all, and one per source address.
#[derive(Clone)]
struct Gate {
    permits: Arc<Semaphore>,
    per_source: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// A connection's place among the unproven ones, given back when dropped.
struct Unproven {
    _permit: OwnedSemaphorePermit,
    per_source: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl Gate {
    fn new(total: usize) -> Gate {
        Gate {
            permits: Arc::new(Semaphore::new(total)),
            per_source: Arc::default(),
        }
    }

    /// A place for a connection from `ip`, if neither limit is reached.
    fn admit(&self, ip: IpAddr) -> Option<Unproven> {
        let mut counts = self.per_source.lock().unwrap_or_else(|p| p.into_inner());
        if counts.get(&ip).is_some_and(|&n| n >= PER_SOURCE) {
            return None;
        }
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        *counts.entry(ip).or_default() += 1;
        Some(Unproven {
            _permit: permit,
            per_source: self.per_source.clone(),
            ip,
        })
    }
}

impl Drop for Unproven {
    fn drop(&mut self) {
        let mut counts = self.per_source.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

/// Takes connections until stopped; each proves itself on its own task. A connection beyond
/// the [`Gate`]'s limits is closed at once: holding it would hold an fd and keep the agents,
/// which try again, behind strangers.
async fn accept(listener: TcpListener, star: Star, key: JobSecret, gate: Gate) {
    let mut dropped = 0usize;
    loop {
        let (stream, peer) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    warn!("agents' listener: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = star.stop.cancelled() => return,
        };
        let Some(place) = gate.admit(peer.ip()) else {
            dropped += 1;
            if dropped == 1 {
                warn!(%peer, "too many unproven connections to the agents' listener: closing the excess at once");
            }
            continue;
        };
        tokio::spawn(admit(stream, peer, place, star.clone(), key.clone()));
    }
}

/// Lets one connection prove itself within [`HELLO_TIMEOUT`], then hands it to its host's edge.
async fn admit(stream: TcpStream, peer: SocketAddr, place: Unproven, star: Star, key: JobSecret) {
    let proven = tokio::time::timeout(HELLO_TIMEOUT, handshake(stream, &key)).await;
    drop(place);
    let (host, stream) = match proven {
        Ok(Ok(proven)) => proven,
        Ok(Err(why)) => return warn!(%peer, "refused a connection to the agents' listener: {why}"),
        Err(_) => {
            return debug!(%peer, "refused a connection to the agents' listener: it did not prove itself within {} s", HELLO_TIMEOUT.as_secs());
        }
    };
    let tx = star
        .waiting
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&host);
    match tx {
        Some(tx) => {
            let _ = tx.send(stream);
        }
        None => warn!(%peer, host, "a second agent for the host, or an unknown host: refused"),
    }
}

/// Sends a nonce, checks the answer (the agent's host and nonce, signed with the job secret
/// over both nonces), and proves in turn that this end holds the secret.
async fn handshake(mut stream: TcpStream, key: &JobSecret) -> Result<(String, TcpStream), String> {
    let nonce = auth::nonce();
    stream.write_all(&nonce).await.map_err(|e| e.to_string())?;
    let len = stream.read_u8().await.map_err(|e| e.to_string())? as usize;
    if len == 0 {
        return Err("an empty host name".into());
    }
    let mut hello = vec![0u8; len + 64];
    stream
        .read_exact(&mut hello)
        .await
        .map_err(|e| e.to_string())?;
    let (host, rest) = hello.split_at(len);
    let (theirs, proof) = rest.split_at(32);
    let theirs: [u8; 32] = theirs.try_into().expect("32 bytes");
    let host = String::from_utf8(host.to_vec())
        .map_err(|_| "a host name that is not UTF-8".to_string())?;
    if !auth::verify_signed(key, LABEL, "", 0, &statement(&host, &nonce, &theirs), proof) {
        return Err(format!("a wrong proof for host {host:?}"));
    }
    let answer = auth::sign(key, ANSWER_LABEL, "", 0, &statement(&host, &theirs, &nonce));
    stream.write_all(&answer).await.map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    Ok((host, stream))
}

/// Raises the soft limit on open files to the hard one: every `--rsh srun` agent's connection
/// and every remote shell's pipes take fds, and the listener must not run out under a crowd.
pub fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
    {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_srun_starts_an_agent_on_every_host() {
        let words = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let argv = srun_argv(
            &words("srun --mem=0"),
            &words("/w/greedyd"),
            &words("n1 n2 n3"),
            "10.123.0.1:4000".parse().unwrap(),
        );
        assert_eq!(
            argv.join(" "),
            "srun --mem=0 --overlap --mpi=none --ntasks-per-node=1 --export=ALL --input=none \
             --quiet --nodes=3 --ntasks=3 --nodelist=n1,n2,n3 /w/greedyd --connect 10.123.0.1:4000"
        );
    }

    #[tokio::test]
    async fn only_the_key_holder_is_let_in_and_a_silent_stranger_is_let_go() {
        let key = JobSecret::generate();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = {
            let key = key.clone();
            tokio::spawn(async move {
                let mut results = Vec::new();
                for _ in 0..3 {
                    let (s, _) = listener.accept().await.unwrap();
                    let r = tokio::time::timeout(Duration::from_secs(1), handshake(s, &key)).await;
                    results.push(match r {
                        Ok(Ok((host, _))) => Ok(host),
                        Ok(Err(why)) => Err(why),
                        Err(_) => Err("silent".to_string()),
                    });
                }
                results
            })
        };
        let _agent = dial(&addr.to_string(), &key, "n7", Duration::from_secs(5))
            .await
            .unwrap();
        // A stranger who guesses the protocol but not the key.
        let mut wrong = TcpStream::connect(addr).await.unwrap();
        let mut nonce = [0u8; 32];
        wrong.read_exact(&mut nonce).await.unwrap();
        let mut hello = vec![2u8, b'n', b'1'];
        hello.extend_from_slice(&[0u8; 64]);
        wrong.write_all(&hello).await.unwrap();
        // A stranger who connects and says nothing.
        let _silent = TcpStream::connect(addr).await.unwrap();
        let results = server.await.unwrap();
        assert_eq!(results[0], Ok("n7".to_string()));
        assert!(
            results[1]
                .as_ref()
                .is_err_and(|w| w.contains("wrong proof")),
            "{results:?}"
        );
        assert_eq!(results[2], Err("silent".to_string()));
    }

    #[tokio::test]
    async fn an_agent_obeys_no_listener_that_cannot_prove_the_key() {
        let key = JobSecret::generate();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            // A stranger: its own "nonce", the agent's hello read and ignored, a made-up answer.
            let (mut s, _) = listener.accept().await.unwrap();
            s.write_all(&[7u8; 32]).await.unwrap();
            let mut hello = [0u8; 1 + 2 + 64];
            s.read_exact(&mut hello).await.unwrap();
            s.write_all(&[9u8; 32]).await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        let e = dial(&addr, &key, "n7", Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, Error::Untrusted(w) if w.contains("wrong proof")),
            "{e}"
        );
    }

    #[tokio::test]
    async fn an_agent_tries_again_until_greedyrun_listens() {
        let key = JobSecret::generate();
        // A port nobody listens on yet.
        let addr = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let server = {
            let key = key.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let listener = TcpListener::bind(addr).await.unwrap();
                let (s, _) = listener.accept().await.unwrap();
                handshake(s, &key).await.map(|(host, _)| host)
            })
        };
        dial(&addr.to_string(), &key, "n7", Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(server.await.unwrap(), Ok("n7".to_string()));
    }

    #[test]
    fn a_gate_holds_a_place_per_source_and_gives_it_back() {
        let gate = Gate::new(PER_SOURCE + 1);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let held: Vec<_> = (0..PER_SOURCE).map(|_| gate.admit(a).unwrap()).collect();
        assert!(gate.admit(a).is_none(), "one source's limit");
        let other = gate.admit(b).unwrap();
        assert!(gate.admit(b).is_none(), "the total");
        drop(held);
        drop(other);
        let again = gate.admit(a);
        assert!(again.is_some());
        assert_eq!(
            gate.per_source.lock().unwrap().len(),
            1,
            "b's count is gone"
        );
    }
}
