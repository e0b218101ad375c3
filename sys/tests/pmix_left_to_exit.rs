//! libpmix opened on first use, and a server left to the process's exit.
//!
//! Its own process: PMIx allows one server per process, and the first check needs a process
//! that has not opened libpmix yet.
#![cfg(feature = "pmix")]

use std::sync::{Arc, mpsc};
use std::time::Duration;

use greedy_sys::pmix::{
    Proc, Status,
    server::{Handler, ModexDone, OpDone, Server, ServerConfig},
};

/// A handler no client ever reaches in this test.
struct Idle;

impl Handler for Idle {
    fn client_finalized(&self, _: Proc, done: OpDone) {
        done.complete(Status::SUCCESS);
    }
    fn abort(&self, _: Proc, _: i32, _: String, _: Option<Vec<Proc>>, done: OpDone) {
        done.complete(Status::SUCCESS);
    }
    fn fence(&self, _: Vec<Proc>, _: bool, _: Vec<u8>, done: ModexDone) {
        done.complete(Status::NOT_SUPPORTED, Vec::new());
    }
    fn direct_modex(&self, _: Proc, _: Option<String>, done: ModexDone) {
        done.complete(Status::NOT_FOUND, Vec::new());
    }
    fn callback_panicked(&self, callback: &'static str, message: String) {
        panic!("{callback} panicked: {message}");
    }
}

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
    // Preparing the environment opens nothing; the server's start opens both.
    greedy_sys::pmix::server::prepare_environment();
    assert!(!mapped("libpmix.so") && !mapped("libhwloc.so"));
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        tmpdir: dir.path().to_path_buf(),
        hostname: "n0".into(),
        nodeid: 0,
        server_nspace: "greedy-test".into(),
        server_rank: 0,
        admit: Arc::new(|_, _| false),
        groups: Default::default(),
    };
    let server = Server::init(Arc::new(Idle), &config).expect("PMIx_server_init");
    assert!(mapped("libpmix.so") && mapped("libhwloc.so"));

    // Left to the exit: a finalize asked for afterwards never runs, and its callback is
    // dropped at once instead of being called.
    server.leave_to_exit();
    let (tx, rx) = mpsc::channel::<Status>();
    server.finalize(move |s| {
        let _ = tx.send(s);
    });
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(5)),
        Err(mpsc::RecvTimeoutError::Disconnected)
    );
}
