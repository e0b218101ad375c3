//! libpmix opened on first use, and a server left to the process's exit.
//!
//! Its own process: PMIx allows one server per process, and the first check needs a process
//! that has not opened libpmix yet.
#![cfg(feature = "pmix")]

mod common;

use std::sync::mpsc;
use std::time::Duration;

use greedy_sys::pmix::Status;

/// Whether a library whose file name starts with `name` is mapped in this process.
fn mapped(name: &str) -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter_map(|l| l.rsplit('/').next())
        .any(|file| file.starts_with(name))
}

#[test]
fn opened_on_first_use_and_left_to_exit() {
    // Preparing the environment opens nothing; starting a server (a job registered) opens both.
    greedy_sys::pmix::server::prepare_environment();
    assert!(!mapped("libpmix.so") && !mapped("libhwloc.so"));
    let job = common::start();
    assert!(mapped("libpmix.so") && mapped("libhwloc.so"));

    // Left to the exit: a finalize asked for afterwards never runs, and its callback is
    // dropped at once instead of being called.
    job.server.leave_to_exit();
    let (tx, rx) = mpsc::channel::<Status>();
    job.server.finalize(move |s| {
        let _ = tx.send(s);
    });
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(5)),
        Err(mpsc::RecvTimeoutError::Disconnected)
    );
}
