//! The uid that created the client end of a TCP connection to this host, read from `/proc/net/tcp`.
//!
//! The kernel records the creator of every socket (research/endpoint-security.md §5); for a
//! connection `peer` → `local` on this host, the client's end is the row whose local address
//! is `peer` and remote address is `local`. `/proc/net/tcp` shows this network namespace's
//! sockets, which include every client of a loopback listener. A row that is not established,
//! or has inode 0 (closed, `TIME_WAIT`), is no owner. IPv4 only: libpmix listens on IPv4
//! loopback (IPv6 is off by default), and an IPv6 peer is treated as unknown.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// `TCP_ESTABLISHED` in `/proc/net/tcp`'s `st` column.
const ESTABLISHED: &str = "01";

/// The uid that owns the client socket of the established connection `peer` → `local`, if
/// this namespace has one.
pub(crate) fn owner_uid(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    if !(peer.is_ipv4() && local.is_ipv4()) {
        return None;
    }
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    find(&table, peer, local)
}

/// The owner uid in a `/proc/net/tcp` table (header line first).
fn find(table: &str, peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    table.lines().skip(1).find_map(|line| {
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode …
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 || parse(f[1])? != peer || parse(f[2])? != local {
            return None;
        }
        if f[3] != ESTABLISHED || f[9] == "0" {
            return None;
        }
        f[7].parse().ok()
    })
}

/// `0100007F:1F90`: the IPv4 word as the kernel prints it (`%08X` of the address in network
/// order read as a host-order word, so little-endian bytes on every host Linux prints it on
/// in that order), and the port.
fn parse(s: &str) -> Option<SocketAddr> {
    let (a, p) = s.split_once(':')?;
    if a.len() != 8 {
        return None;
    }
    let word = u32::from_str_radix(a, 16).ok()?;
    let port = u16::from_str_radix(p, 16).ok()?;
    let ip = Ipv4Addr::from(if cfg!(target_endian = "little") {
        word.to_le_bytes()
    } else {
        word.to_be_bytes()
    });
    Some(SocketAddr::new(IpAddr::V4(ip), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:A3F1 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0 20 4 30 10 -1
   1: 0100007F:1F90 0100007F:A3F1 01 00000000:00000000 00:00000000 00000000     0        0 4243 1 0 20 4 30 10 -1
   2: 0100007F:A3F2 0100007F:1F90 06 00000000:00000000 03:00000000 00000000     0        0 0 3 0
";

    fn check(peer: &str, local: &str, expect: Option<u32>) {
        let (p, l) = (peer.parse().unwrap(), local.parse().unwrap());
        assert_eq!(find(TABLE, p, l), expect, "{peer} -> {local}");
    }

    #[test]
    fn finds_the_client_end_only() {
        // The client end of 127.0.0.1:41969 -> :8080 belongs to uid 1000.
        check("127.0.0.1:41969", "127.0.0.1:8080", Some(1000));
        // The server's end of the same connection is not the client's.
        check("127.0.0.1:8080", "127.0.0.1:41969", Some(0));
        // TIME_WAIT (inode 0): no owner, never "root".
        check("127.0.0.1:41970", "127.0.0.1:8080", None);
        check("127.0.0.1:1", "127.0.0.1:8080", None);
        assert_eq!(
            parse("0100007F:1F90"),
            Some("127.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(parse("0100007F"), None);
    }

    #[test]
    fn a_live_loopback_connection_is_ours() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_server, peer) = listener.accept().unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        let me = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap());
        assert_eq!(owner_uid(peer, listener.local_addr().unwrap()), Some(me));
    }
}
