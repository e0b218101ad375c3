//! A stranger's flood of silent TCP connections, for the listener tests of greedy-pmix (the
//! overlay) and mpi_greedy (srun's rendezvous); not an API.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::net::{TcpSocket, TcpStream};

/// Opens up to `per_source` silent connections to `target` from each of `sources` (loopback
/// addresses other than 127.0.0.1, which the job's nodes use), 200 at a time, for at most
/// `limit`. Returns the ones still open (the caller holds them) and how many reached the
/// listener; those the listener reset are closed as it goes.
pub async fn flood(
    target: SocketAddr,
    sources: &[[u8; 4]],
    per_source: usize,
    limit: Duration,
) -> (Vec<TcpStream>, usize) {
    let (mut held, mut reached, started) = (Vec::new(), 0, Instant::now());
    for &ip in sources {
        let mut from_ip = 0;
        while from_ip < per_source && started.elapsed() < limit {
            let mut attempts = tokio::task::JoinSet::new();
            for _ in from_ip..per_source.min(from_ip + 200) {
                attempts.spawn(connect_from(ip, target));
            }
            while let Some(attempt) = attempts.join_next().await {
                match attempt {
                    Ok(Ok(s)) => held.push(s),
                    Ok(Err(e)) if e.kind() == ErrorKind::ConnectionReset => {}
                    _ => continue,
                }
                from_ip += 1;
            }
            // A stranger's descriptors are not the point: close what the listener reset.
            held.retain(|s| match s.try_read(&mut [0u8; 64]) {
                Ok(n) => n > 0,
                Err(e) => e.kind() == ErrorKind::WouldBlock,
            });
        }
        reached += from_ip;
    }
    (held, reached)
}

/// One silent connection from `ip`. It closes with a reset, not FIN: thousands of TIME_WAIT
/// sockets on a loopback address would keep later tests' listeners there from binding for a
/// minute (a port in TIME_WAIT from a socket without SO_REUSEADDR cannot be bound).
async fn connect_from(ip: [u8; 4], target: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.set_zero_linger()?;
    socket.bind((ip, 0).into())?;
    // A full accept queue drops the SYN, and the kernel retries it only after a second: count
    // it as not reached and try again in the next batch.
    tokio::time::timeout(Duration::from_millis(200), socket.connect(target))
        .await
        .unwrap_or_else(|_| Err(ErrorKind::TimedOut.into()))
}
