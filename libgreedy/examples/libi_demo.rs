//! libgreedy from Rust: run without `PMI_RANK` it is the front end and launches itself as the
//! members on the hosts named (`libi_demo RSH HOST:COUNT…`); as a member it answers every
//! collective with data whose right answer it knows, so a test can check them all
//! (`LIBI_DEMO_DIE=R`: rank R exits 5 before the allgather, as a crashed tool daemon).

use std::time::Duration;

use greedy_libi::{Backend, Distribution, FrontEnd, HostGroup, Member};

fn main() {
    if let Err(e) = run() {
        eprintln!("libi_demo: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PMI_RANK").is_some() {
        return member();
    }
    let mut args = std::env::args().skip(1);
    let rsh = args.next().ok_or("usage: libi_demo RSH HOST:COUNT…")?;
    let mut group = HostGroup::new(std::env::current_exe()?.display().to_string());
    for spec in args {
        let (host, count) = spec.split_once(':').ok_or("HOST:COUNT")?;
        group.hosts.push((host.to_string(), count.parse()?));
    }
    let distribution = Distribution::new(vec![group])?;
    let mut session = FrontEnd::new().launch(&distribution, &Backend::Greedyrun { rsh })?;
    session.send(b"hello from the front end")?;
    let gathered = session.recv(Some(Duration::from_secs(60)))?;
    println!("front end got: {}", String::from_utf8_lossy(&gathered));
    let outcome = session.wait()?;
    println!("session ended: {}", outcome.code);
    // Exit only once the session is dropped: process::exit runs no destructor.
    drop(session);
    std::process::exit(outcome.code);
}

fn member() -> Result<(), Box<dyn std::error::Error>> {
    let mut me = Member::init()?;
    let (rank, size) = (me.rank(), me.size());
    let word = if rank == 0 {
        me.recv_from_front()?
    } else {
        Vec::new()
    };
    let word = me.broadcast(0, &word)?;
    let parts: Vec<Vec<u8>> = (0..size).map(|r| format!("part{r}").into_bytes()).collect();
    let mine = me.scatter(0, if rank == 0 { &parts } else { &[] })?;
    assert_eq!(
        mine,
        format!("part{rank}").into_bytes(),
        "scatter on rank {rank}"
    );
    if std::env::var("LIBI_DEMO_DIE").is_ok_and(|r| r == rank.to_string()) {
        std::process::exit(5);
    }
    // Values longer than one KVS value, so they travel in several.
    let big = vec![rank as u8; 3000 + rank as usize];
    let all = me.allgather(&big)?;
    for (r, got) in all.iter().enumerate() {
        assert_eq!(
            got,
            &vec![r as u8; 3000 + r],
            "allgather on rank {rank} from {r}"
        );
    }
    me.barrier()?;
    let sum = me.reduce(rank.to_le_bytes().to_vec(), |a, b| {
        let n = |v: Vec<u8>| u32::from_le_bytes(v.try_into().unwrap());
        (n(a) + n(b)).to_le_bytes().to_vec()
    })?;
    let gathered = me.gather(0, format!("{rank}").as_bytes())?;
    if let (Some(gathered), Some(sum)) = (gathered, sum) {
        let ranks: Vec<String> = gathered
            .iter()
            .map(|g| String::from_utf8_lossy(g).into())
            .collect();
        let sum = u32::from_le_bytes(sum.try_into().unwrap());
        let report = format!(
            "{} | {} | sum {sum}",
            String::from_utf8_lossy(&word),
            ranks.join(",")
        );
        me.send_to_front(report.as_bytes())?;
    }
    me.finalize()?;
    Ok(())
}
