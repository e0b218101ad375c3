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
//! The connection is authenticated before a byte of the job goes over it: greedyrun sends a
//! fresh nonce, the agent answers with its host name and `HMAC(job secret, host ‖ nonce)`
//! ([`greedy_pmix::auth::sign`]); the secret reaches the agents in srun's environment
//! ([`KEY_VAR`]), which only the job's user can read. A stranger's connection, or one that says
//! nothing, is closed after [`HANDSHAKE_TIMEOUT`] without holding up anyone else.

use std::{
    collections::HashMap,
    net::SocketAddr,
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use greedy_pmix::{JobSecret, auth};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    process::Command,
    sync::{oneshot, watch},
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::Error;

/// greedyd's flag: connect to greedyrun at this address instead of reading stdin.
pub const CONNECT_FLAG: &str = "--connect";

/// The variable that carries the job secret to the agents (srun passes its environment on).
pub const KEY_VAR: &str = "GREEDY_CONNECT_KEY";

/// How long a connection may take to prove itself.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

const LABEL: &[u8] = b"greedyrun connect";

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

/// What the agent announces: its host, signed over greedyrun's nonce.
fn statement(host: &str, nonce: &[u8; 32]) -> Vec<u8> {
    let mut s = host.as_bytes().to_vec();
    s.push(0);
    s.extend_from_slice(nonce);
    s
}

/// The agent's side, as greedyd runs it: connects to greedyrun at `addr` and proves it holds
/// the job secret (from [`KEY_VAR`]) for its host (`SLURMD_NODENAME`, which slurmd sets for
/// every task, else the host name).
pub async fn dial_from_env(addr: &str) -> Result<TcpStream, Error> {
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
    dial(addr, &key, &host).await
}

/// Connects to greedyrun at `addr` as `host`'s agent, proving it holds `key`.
pub async fn dial(addr: &str, key: &JobSecret, host: &str) -> Result<TcpStream, Error> {
    let io = |what: &str, source| Error::Io {
        what: format!("{what} greedyrun at {addr}"),
        source,
    };
    if host.is_empty() || host.len() > HOST_MAX {
        return Err(Error::Plan(format!(
            "host name {host:?} cannot be announced"
        )));
    }
    let mut stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| {
            io(
                "timed out connecting to",
                std::io::ErrorKind::TimedOut.into(),
            )
        })?
        .map_err(|e| io("connecting to", e))?;
    let _ = stream.set_nodelay(true);
    let mut nonce = [0u8; 32];
    tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.read_exact(&mut nonce))
        .await
        .map_err(|_| io("no nonce from", std::io::ErrorKind::TimedOut.into()))?
        .map_err(|e| io("reading the nonce of", e))?;
    let proof = auth::sign(key, LABEL, "", 0, &statement(host, &nonce));
    let mut hello = vec![host.len() as u8];
    hello.extend_from_slice(host.as_bytes());
    hello.extend_from_slice(&proof);
    stream
        .write_all(&hello)
        .await
        .map_err(|e| io("announcing this host to", e))?;
    Ok(stream)
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
    /// connection, in `hosts` order. srun's own messages go to greedyrun's stderr.
    pub async fn start(
        srun: &[String],
        agent: &[String],
        hosts: &[String],
        key: &JobSecret,
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
        tokio::spawn(accept(listener, star.clone(), key.clone()));
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

/// Takes connections until stopped; each proves itself on its own task.
async fn accept(listener: TcpListener, star: Star, key: JobSecret) {
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
        let (star, key) = (star.clone(), key.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(stream, &key)).await {
                Ok(Ok((host, stream))) => {
                    let tx = star
                        .waiting
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&host);
                    match tx {
                        Some(tx) => {
                            let _ = tx.send(stream);
                        }
                        None => {
                            warn!(%peer, host, "a second agent for the host, or an unknown host: refused")
                        }
                    }
                }
                Ok(Err(why)) => warn!(%peer, "refused a connection to the agents' listener: {why}"),
                Err(_) => {
                    warn!(%peer, "refused a connection to the agents' listener: it did not prove itself within {} s", HANDSHAKE_TIMEOUT.as_secs())
                }
            }
        });
    }
}

/// Sends a nonce and checks the answer: the agent's host, signed with the job secret.
async fn handshake(mut stream: TcpStream, key: &JobSecret) -> Result<(String, TcpStream), String> {
    let nonce = auth::nonce();
    stream.write_all(&nonce).await.map_err(|e| e.to_string())?;
    let len = stream.read_u8().await.map_err(|e| e.to_string())? as usize;
    if len == 0 {
        return Err("an empty host name".into());
    }
    let mut host = vec![0u8; len];
    stream
        .read_exact(&mut host)
        .await
        .map_err(|e| e.to_string())?;
    let mut proof = [0u8; 32];
    stream
        .read_exact(&mut proof)
        .await
        .map_err(|e| e.to_string())?;
    let host = String::from_utf8(host).map_err(|_| "a host name that is not UTF-8".to_string())?;
    if !auth::verify_signed(key, LABEL, "", 0, &statement(&host, &nonce), &proof) {
        return Err(format!("a wrong proof for host {host:?}"));
    }
    let _ = stream.set_nodelay(true);
    Ok((host, stream))
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
        let _agent = dial(&addr.to_string(), &key, "n7").await.unwrap();
        // A stranger who guesses the protocol but not the key.
        let mut wrong = TcpStream::connect(addr).await.unwrap();
        let mut nonce = [0u8; 32];
        wrong.read_exact(&mut nonce).await.unwrap();
        let mut hello = vec![2u8, b'n', b'1'];
        hello.extend_from_slice(&[0u8; 32]);
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
}
