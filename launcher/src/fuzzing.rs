//! The bodies of the cargo-fuzz targets in `fuzz/`, one function per target, so that the fuzz
//! binaries and the stable corpus replay (`tests/fuzz_corpus.rs`) run the same checks. Each
//! takes arbitrary bytes and panics only when an invariant of the code under test breaks.

use std::time::Duration;

use bytes::BytesMut;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::codec::{Decoder, Encoder};

use crate::proto::{Down, FrameCodec, ToSession, Up};
use crate::wireup;

/// A fuzz target: the name of its binary and corpus directory, and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target of this crate.
pub const TARGETS: &[Target] = &[
    ("proto_down", proto_down),
    ("proto_up", proto_up),
    ("session_request", session_request),
    ("session_job", session_job),
    ("task_line", task_line),
];

/// A session's control connection's first line, as the session reads it: no panic, and what
/// parses as a stream's or a job's request is the request greedyrun's client would have sent.
pub fn session_request(data: &[u8]) {
    let line = String::from_utf8_lossy(data);
    match crate::tasks::parse_request(&line) {
        Some(
            request @ crate::tasks::Request::Tasks {
                retries,
                tag,
                progress_ms,
                defaults,
            },
        ) => {
            let progress = Duration::from_millis(progress_ms);
            let sent = format!(
                "greedy-session 1 {}",
                crate::tasks::stream_request(retries, defaults, tag, progress)
            );
            assert_eq!(crate::tasks::parse_request(&sent), Some(request));
        }
        Some(request @ crate::tasks::Request::Job { claim }) => {
            let sent = crate::session::job_request(claim);
            assert_eq!(crate::tasks::parse_request(sent.trim_end()), Some(request));
        }
        _ => {}
    }
}

/// A line of a task stream, as greedyrun reads it: no panic; what parses has at least one
/// rank and core, a program, and travels down the tree as itself.
pub fn task_line(data: &[u8]) {
    let line = String::from_utf8_lossy(data);
    let defaults = crate::task_spec::Defaults::default();
    if let Ok(spec) = crate::task_spec::parse(&line, &defaults) {
        assert!(spec.ranks >= 1 && spec.cores_per_rank >= 1 && spec.slots() >= 1);
        if let crate::task_spec::Run::Argv(argv) = &spec.run {
            assert!(!argv[0].is_empty());
        }
        let wire = postcard::to_allocvec(&spec).expect("encodes");
        let back: crate::task_spec::TaskSpec = postcard::from_bytes(&wire).expect("decodes");
        assert_eq!(back, spec);
    }
}

/// Decodes every frame of `data` as `T`, checking each re-encodes to one canonical form: the
/// encoding of what decodes is a fixed point (floats may be NaN, so values are compared as
/// bytes), and it decodes whole.
fn frames<T: DeserializeOwned + Serialize + Clone>(data: &[u8], mut each: impl FnMut(T)) {
    let mut dec = FrameCodec::<T, T>::default();
    let mut buf = BytesMut::from(data);
    while let Ok(Some(msg)) = dec.decode(&mut buf) {
        let mut once = BytesMut::new();
        dec.encode(msg.clone(), &mut once).expect("re-encode");
        let again = dec
            .decode(&mut once.clone())
            .expect("own frame decodes")
            .expect("whole");
        let mut twice = BytesMut::new();
        dec.encode(again, &mut twice).expect("re-encode");
        assert_eq!(once, twice);
        each(msg);
    }
}

/// The frames a parent sends down an edge, as an agent reads them (the codec is [`crate::proto::ChildCodec`]'s): no panic,
/// canonical re-encoding, and a Start that passes [`crate::proto::Start::check`] (a spawned
/// job that passes [`crate::children::check_child`]) is safe to use the way the agent does.
pub fn proto_down(data: &[u8]) {
    frames::<Down>(data, |msg| {
        if let Down::Route {
            cmd: crate::proto::Cmd::AddChild { job, .. },
            ..
        } = &msg
        {
            let n_hosts = job.ranks.len();
            if crate::children::check_child(job, n_hosts).is_ok() {
                for &rank in job.ranks.iter().flatten() {
                    let (_, app) = job.app_of(rank).expect("checked: every rank has a program");
                    let _ = &app.argv[0];
                }
            }
        }
        let Down::Start(start) = msg else { return };
        if start.check().is_err() {
            return;
        }
        let node = start.node_idx as usize;
        let _ = (&start.hosts[node], &start.ranks[node]);
        let _ = &start.hosts[start.subtree_hosts()];
        let _ = Duration::from_secs_f64(start.grace_s);
        let _ = crate::heartbeat::Heartbeat::new(start.lost_after_s);
        let _ = Duration::from_secs_f64(start.hello_timeout_s.max(0.001));
        let _ = wireup::job_spec(&start);
    });
}

/// The frames an agent sends up an edge, as its parent reads them (the codec is [`crate::proto::ParentCodec`]'s): no panic,
/// canonical re-encoding.
pub fn proto_up(data: &[u8]) {
    frames::<Up>(data, |msg| {
        if let Up::Exit { end, .. } = msg {
            let _ = end.failed();
        }
    });
}

/// A spawn's placement on three hosts with 2, 0 and 4 free slots: every process placed once,
/// within the free slots unless oversubscribed; or refused.
fn spawn_placement(apps: &[greedy_pmix::child::SpawnApp], oversubscribe: bool) {
    let hosts = ["n1".to_string(), "n2".into(), "n3".into()];
    let free = [2, 0, 4];
    let Ok(ranks) = crate::children::place(apps, &hosts, &free, oversubscribe) else {
        return;
    };
    let total: u64 = apps.iter().map(|a| u64::from(a.maxprocs)).sum();
    let mut all: Vec<u32> = ranks.iter().flatten().copied().collect();
    all.sort_unstable();
    assert!(all.iter().copied().eq(0..total as u32), "each process once");
    if !oversubscribe {
        assert!(ranks.iter().zip(free).all(|(r, f)| r.len() as u32 <= f));
    }
}

/// The frames a job's client sends a session, as the session reads them (the codec is
/// [`crate::proto::SessionCodec`]'s): no panic, canonical re-encoding, and a job that passes
/// [`crate::proto::Start::check`] is reserved on a session's board (or refused), in a task's
/// claimed slots too, and released without a panic, whatever its hosts and ranks.
pub fn session_job(data: &[u8]) {
    frames::<ToSession>(data, |msg| {
        if let ToSession::Place {
            apps,
            oversubscribe,
            ..
        } = &msg
        {
            spawn_placement(apps, *oversubscribe);
        }
        let ToSession::Start(start) = msg else { return };
        if start.check().is_err() {
            return;
        }
        let board = crate::session::JobBoard::new(
            vec!["n1".into(), "n2".into(), "n1".into()],
            vec![2, 0, 4],
        );
        (0..3).for_each(|i| board.host_up(i));
        if let Ok(ticket) = board.reserve(&start) {
            let ups = futures_util::FutureExt::now_or_never(board.admitted(&ticket, &start));
            assert!(
                matches!(ups, Some(Ok(_))),
                "no task holds a slot: let in at once"
            );
            board.release(&ticket);
            assert_eq!(board.running(), (0, 0, 0));
        }
        // The same job in slots a task claimed: in its claim's slots at once, or refused.
        let task = crate::proto::TaskJob {
            staged: Vec::new(),
            cores_per_rank: 1,
        };
        let claim = board.claim(vec![(0, 2), (2, 4)], task);
        if let Ok(ticket) = board.reserve_claimed(&start, claim) {
            let ups = futures_util::FutureExt::now_or_never(board.admitted(&ticket, &start));
            assert!(
                matches!(ups, Some(Ok(_))),
                "a claimed job is let in at once"
            );
            board.release(&ticket);
            assert_eq!(board.running(), (0, 0, 0));
        }
        assert!(
            board.reserve_claimed(&start, claim).is_err(),
            "a claim serves once"
        );
    });
}
