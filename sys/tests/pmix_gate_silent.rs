//! A stranger that connects to libpmix's port and stays silent (or sends half a header) never reaches libpmix: a real client still connects and finalizes, and finalize returns in time.
//!
//! Without the gate, libpmix 4.2's connection handler would read the stranger's connect-ack
//! with a blocking `recv` on its progress thread: the whole server freezes, the client hangs
//! in `PMIx_Init` and `PMIx_server_finalize` never returns (research/endpoint-security.md
//! §2.3). One test function: one PMIx server per process, and this file is its own process.
#![cfg(feature = "pmix")]

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use greedy_sys::pmix::{Status, gate};

/// Whether the server closed `s`: a read ends (EOF or reset) rather than timing out.
fn closed_by_server(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => matches!(
            e.kind(),
            ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
        ),
    }
}

#[test]
fn silent_strangers_do_not_freeze_the_server() {
    let job = common::start();
    // Both connect before any rank starts, and hold their connections while it runs.
    let mut silent = TcpStream::connect(("127.0.0.1", job.port)).unwrap();
    let mut half = TcpStream::connect(("127.0.0.1", job.port)).unwrap();
    // Half of a connect-ack header: libpmix would wait for the rest for ever.
    half.write_all(&[0, 0, 0, 64, 0, 0]).unwrap();

    let rank0 = job.spawn(0, true);
    let (status, output) = common::wait_child(rank0, Duration::from_secs(60))
        .expect("the admitted client finishes within 60 s despite the strangers");
    assert!(status.success(), "client: {status}: {output}");
    assert!(output.contains("gate.1:0"), "{output}");
    assert_eq!(*job.recorder.connected.lock().unwrap(), vec![0]);
    assert_eq!(*job.recorder.finalized.lock().unwrap(), vec![0]);

    // The gate closed both strangers itself.
    assert!(closed_by_server(&mut silent), "silent stranger still open");
    assert!(
        closed_by_server(&mut half),
        "half-header stranger still open"
    );
    assert!(gate::refused() >= 2, "refused {}", gate::refused());
    assert_eq!(gate::admitted(), 1);

    // Finalize is bounded even with the strangers' sockets still open on our side.
    let finalized = job.server.finalize_within(Duration::from_secs(5));
    assert_eq!(finalized, Some(Status::SUCCESS));
    drop((silent, half));
}
