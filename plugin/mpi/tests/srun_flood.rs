//! srun's rendezvous listener under a stranger's flood of silent connections, on loopback: the
//! stepds' publish and lookup still complete (security review 2, finding 4: 8192 slots, each
//! held for the whole join timeout, made every join time out), and an unsigned lookup gets
//! nothing back.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use greedy_pmix::JobSecret;
use greedy_pmix::auth::Admission;
use greedy_pmix::flood::flood;
use greedy_pmix::rendezvous::Rendezvous;
use mpi_greedy::rendezvous::{Limits, SrunBoard, SrunRendezvous, lookup_mac, mac};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const JOB: &str = "9.0";

/// How long a flood may take to open its connections (a loaded 2-core host here accepts about 1000 a second).
const FLOOD_LIMIT: Duration = Duration::from_secs(10);

/// One flood at a time: two would share this process's CPU and descriptors.
static FLOODS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn secret() -> JobSecret {
    JobSecret::from_bytes(b"0123456789abcdef0123").expect("16 bytes or more")
}

/// srun's board for a 2-node step on loopback, serving on a thread of its own as in srun
/// (`srun.rs`), so that the flood's tasks do not starve its accept loop; its address.
async fn board(limits: Limits) -> SocketAddr {
    let (bound, addr) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let board = SrunBoard::bind(
                "127.0.0.1:0".parse().unwrap(),
                JOB,
                &secret(),
                2,
                Duration::from_secs(15),
            )
            .await
            .unwrap()
            .with_limits(limits);
            let _ = bound.send(board.local_addr().unwrap());
            board.serve().await
        })
    });
    addr.await.unwrap()
}

/// Two stepds' rendezvous through srun at `srun`: node 0 publishes, node 1 publishes and looks
/// node 0 up. How long it took.
async fn rendezvous(srun: SocketAddr) -> Duration {
    let started = Instant::now();
    let (n0, n1): (SocketAddr, SocketAddr) = (
        "10.0.0.1:1000".parse().unwrap(),
        "10.0.0.2:1000".parse().unwrap(),
    );
    let parent = SrunRendezvous::new(srun, JOB, &secret());
    let child = SrunRendezvous::new(srun, JOB, &secret());
    let both = async {
        let (published, found) = tokio::join!(parent.publish(0, n0), async {
            child.publish(1, n1).await?;
            child.lookup(0).await
        });
        (published, found)
    };
    let (published, found) = tokio::time::timeout(Duration::from_secs(15), both)
        .await
        .expect("the rendezvous completes within the join timeout");
    assert_eq!(published, Ok(()));
    assert_eq!(found, Ok(n0));
    started.elapsed()
}

/// One stranger's host opens thousands of silent connections (more than the 8192 slots srun
/// had): it holds at most its per-source share, and the stepds join in normal time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_one_stranger_does_not_delay_the_rendezvous() {
    let _one_at_a_time = FLOODS.lock().await;
    let srun = board(Limits::default()).await;
    let (held, reached) = flood(srun, &[[127, 0, 0, 2]], 9000, FLOOD_LIMIT).await;
    assert!(reached > 8192, "only {reached} connections reached srun");
    let took = rendezvous(srun).await;
    assert!(took < Duration::from_secs(1), "joined in {took:?}");
    drop(held);
}

/// Strangers on many hosts (more connections than the 8192 slots srun had) fill every
/// unproven slot: new connections are closed at once, a silent one's slot frees after
/// `first_line`, and the stepds (connecting again) join soon after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_many_strangers_delays_the_rendezvous_by_one_first_line_at_most() {
    let _one_at_a_time = FLOODS.lock().await;
    // A global cap below what 20 strangers may hold each (64): the global cap is what bites.
    let limits = Limits {
        first_line: Duration::from_secs(1),
        admission: Admission {
            max_unproven: 256,
            max_unproven_per_source: 64,
        },
    };
    let srun = board(limits).await;
    let sources: Vec<[u8; 4]> = (2..22).map(|i| [127, 0, 0, i]).collect();
    let (held, reached) = flood(srun, &sources, 450, FLOOD_LIMIT).await;
    assert!(reached > 8192, "only {reached} connections reached srun");
    let took = rendezvous(srun).await;
    assert!(took < Duration::from_millis(2500), "joined in {took:?}");
    drop(held);
}

/// srun's answer to `line` on a connection of its own ("" if it closed without one).
async fn answer(srun: SocketAddr, line: &str) -> String {
    let mut s = TcpStream::connect(srun).await.unwrap();
    s.write_all(format!("{line}\n").as_bytes()).await.unwrap();
    let mut answer = String::new();
    let mut s = BufReader::new(s);
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_line(&mut answer))
        .await
        .expect("srun answers or closes");
    answer
}

/// A lookup needs the step secret, under the lookup's own label: a stranger's unsigned or
/// wrongly signed lookup, or a publish's signature replayed as one, is closed unanswered.
#[tokio::test]
async fn an_unsigned_or_wrongly_signed_lookup_gets_nothing() {
    let srun = board(Limits::default()).await;
    let n0: SocketAddr = "10.0.0.1:1000".parse().unwrap();
    SrunRendezvous::new(srun, JOB, &secret())
        .publish(0, n0)
        .await
        .unwrap();
    let other = JobSecret::from_bytes(b"wrong-secret-0000000").unwrap();
    for forged in [
        "L 0".to_string(),
        format!("L 0 {}", "0".repeat(64)),
        format!("L 0 {}", lookup_mac(&other, JOB, 0)),
        format!("L 0 {}", lookup_mac(&secret(), "9.1", 0)),
        format!("L 0 {}", mac(&secret(), JOB, 0, &n0)),
        format!("L 0 {}", mac(&secret(), JOB, 0, &"")),
    ] {
        assert_eq!(answer(srun, &forged).await, "", "{forged:?} was answered");
    }
    let signed = answer(srun, &format!("L 0 {}", lookup_mac(&secret(), JOB, 0))).await;
    assert_eq!(
        signed,
        format!("A 0 {n0} {}\n", mac(&secret(), JOB, 0, &n0))
    );
}
