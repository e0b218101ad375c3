//! A real libpmix client run by a process the policy does not admit, with a registered rank's PMIX_* variables, is closed before libpmix sees it: `client_connected` is never called for it, and the real rank still connects.
//!
//! Without the gate, libpmix 4.2 would accept the impostor (psec `native` trusts the uid it
//! sends, and it is ours here), report rank 1 connected, and the real rank 1 would find its
//! slot taken (research/endpoint-security.md §2.2–2.3). One test function: one PMIx server
//! per process, and this file is its own process.
#![cfg(feature = "pmix")]

mod common;

use std::time::Duration;

use greedy_sys::pmix::{Status, gate};

#[test]
fn an_impostor_never_reaches_libpmix() {
    let job = common::start();
    // Rank 1's variables, but a process the policy does not know.
    let impostor = job.spawn(1, false);
    if let Some((status, output)) = common::wait_child(impostor, Duration::from_secs(30)) {
        assert!(!status.success(), "the impostor got in: {output}");
    }
    assert!(gate::refused() >= 1, "refused {}", gate::refused());
    assert_eq!(gate::admitted(), 0);
    assert!(
        job.recorder.connected.lock().unwrap().is_empty(),
        "libpmix saw a refused connection: {:?}",
        job.recorder.connected.lock().unwrap()
    );

    // The server is intact: the real ranks connect and finalize.
    for rank in [1, 0] {
        let child = job.spawn(rank, true);
        let (status, output) = common::wait_child(child, Duration::from_secs(60))
            .unwrap_or_else(|| panic!("rank {rank} did not finish within 60 s"));
        assert!(status.success(), "rank {rank}: {status}: {output}");
        assert!(output.contains(&format!("gate.1:{rank}")), "{output}");
    }
    assert_eq!(*job.recorder.connected.lock().unwrap(), vec![1, 0]);
    assert_eq!(
        job.server.finalize_within(Duration::from_secs(5)),
        Some(Status::SUCCESS)
    );
}
