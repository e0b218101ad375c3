//! What several end-to-end tests of this crate share.

use greedy_pmix::charm;
use tokio::{io::AsyncWriteExt, net::TcpStream};

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
