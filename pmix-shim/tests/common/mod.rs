//! What several end-to-end tests of this crate share.
// Each test binary uses some of it.
#![allow(dead_code)]

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use greedy_pmix::{AbortInfo, charm, rendezvous::Rendezvous};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    process::Child,
    sync::watch,
    task::JoinHandle,
};

/// Agents (each a process of its own) publish their overlay address as a file `node<i>` in a
/// directory they share.
pub(crate) struct DirRendezvous(pub(crate) PathBuf);

impl Rendezvous for DirRendezvous {
    async fn publish(&self, node_idx: usize, addr: SocketAddr) -> Result<(), String> {
        let tmp = self.0.join(format!(".node{node_idx}.tmp"));
        std::fs::write(&tmp, addr.to_string()).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, self.0.join(format!("node{node_idx}"))).map_err(|e| e.to_string())
    }

    async fn lookup(&self, node_idx: usize) -> Result<SocketAddr, String> {
        let path = self.0.join(format!("node{node_idx}"));
        loop {
            if let Ok(s) = std::fs::read_to_string(&path) {
                return s.trim().parse().map_err(|e| format!("{path:?}: {e}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Waits for a rank started with piped stdout and stderr to end, reading both meanwhile (a
/// chatty rank never blocks on a full pipe), and kills it once the job is `aborted` or after
/// `deadline`: its exit code (128 + signal) and its stdout then stderr.
pub(crate) async fn rank_end(
    mut child: Child,
    mut aborted: watch::Receiver<Option<AbortInfo>>,
    deadline: Duration,
) -> (i32, String) {
    use std::os::unix::process::ExitStatusExt;
    let (out, err) = (read_all(child.stdout.take()), read_all(child.stderr.take()));
    let status = tokio::select! {
        s = child.wait() => s.expect("wait"),
        _ = async { aborted.wait_for(Option::is_some).await.is_ok() } => {
            let _ = child.start_kill();
            child.wait().await.expect("wait")
        }
        _ = tokio::time::sleep(deadline) => {
            let _ = child.start_kill();
            child.wait().await.expect("wait")
        }
    };
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    (code, out.await.unwrap() + &err.await.unwrap())
}

/// Connects as netlrts `rank` the way libcharm does: the address in the rank's `NETSTART`
/// (from `env`), then `initnode`.
pub(crate) async fn charm_connect(env: &[(String, String)], rank: u32) -> TcpStream {
    let netstart = &env
        .iter()
        .find(|(k, _)| k == "NETSTART")
        .expect("NETSTART")
        .1;
    let f: Vec<&str> = netstart.split(' ').collect();
    assert_eq!(f[0], rank.to_string());
    let mut s = TcpStream::connect(format!("{}:{}", f[1], f[2]))
        .await
        .unwrap();
    let init = charm::initnode_payload(rank as i32, 40000 + rank, [127, 0, 0, 1]);
    s.write_all(&charm::encode("initnode", &init))
        .await
        .unwrap();
    s
}

/// Reads `pipe` to its end in a task of its own.
fn read_all<R: AsyncRead + Unpin + Send + 'static>(pipe: Option<R>) -> JoinHandle<String> {
    tokio::spawn(async move {
        let mut s = String::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_string(&mut s).await;
        }
        s
    })
}
