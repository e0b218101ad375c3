//! The hold loop: one NFQUEUE socket per namespace, one queue of deadlines, poll until the next.
//!
//! Every packet gets the deadline `arrival + delay (+ jitter)`, or is dropped at once (loss).
//! One heap across all namespaces keeps the deadlines sorted (without jitter they come in
//! arrival order, with it packets overtake each other): the loop sleeps until the earliest
//! deadline or new packets, whichever comes first. A packet's hold therefore never adds to the
//! next packet's (no serialisation), unlike a "sleep, then accept" loop.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::ErrorKind;
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::process::{PidfdFlags, PidfdGetfdFlags, getpid, pidfd_getfd, pidfd_open};
use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

/// Kernel queue length per namespace. The kernel default (1024) overflows, and then drops
/// packets, once a host receives more than 1024 packets per delay period, e.g. a bulk MPI
/// transfer at 20 ms; 65536 packets is about 1.5 s of a saturated veth at 20 ms.
const QUEUE_MAX_LEN: u32 = 65_536;

/// At most this many packets are read from one socket per loop turn, so a flood on one host
/// cannot postpone the release of packets already due on another.
const DRAIN_BATCH: usize = 256;

/// One bound NFQUEUE in one network namespace.
pub(crate) struct Port {
    /// The namespace file it serves, for messages.
    name: PathBuf,
    /// The queue number, the same in every namespace.
    queue_num: u16,
    /// The nfq connection: receives packets and sends verdicts.
    queue: nfq::Queue,
    /// A duplicate of the queue's netlink socket, used only to poll it: `nfq::Queue` does not
    /// expose its descriptor.
    poll_fd: OwnedFd,
}

impl Port {
    /// Binds `queue_num` inside the network namespace `netns` (None: the current one).
    ///
    /// The socket is created while this thread is inside `netns`: a netlink socket belongs to the
    /// namespace it was created in for its whole life, so the thread returns home afterwards.
    pub(crate) fn open(netns: Option<&Path>, queue_num: u16) -> Result<Port> {
        let name = netns.map_or_else(|| PathBuf::from("(current netns)"), Path::to_path_buf);
        let home = File::open("/proc/thread-self/ns/net").context("opening the home netns")?;
        if let Some(ns) = netns {
            let target = File::open(ns).with_context(|| format!("{}: open", ns.display()))?;
            move_into_link_name_space(target.as_fd(), Some(LinkNameSpaceType::Network))
                .with_context(|| format!("{}: setns", ns.display()))?;
        }
        let opened = open_queue(queue_num);
        move_into_link_name_space(home.as_fd(), Some(LinkNameSpaceType::Network))
            .context("returning to the home netns")?;
        let (queue, poll_fd) = opened.with_context(|| format!("{}", name.display()))?;
        Ok(Port {
            name,
            queue_num,
            queue,
            poll_fd,
        })
    }
}

/// Opens and configures an NFQUEUE socket in the current namespace.
fn open_queue(queue_num: u16) -> Result<(nfq::Queue, OwnedFd)> {
    // Find the descriptor number `Queue::open` will get: the lowest free one, which a probe
    // open reveals (the process is single-threaded here, so nothing else takes it between).
    // Then duplicate it through a pidfd, which needs no `unsafe` (BorrowedFd::borrow_raw would).
    let probe = File::open("/dev/null").context("probe open of /dev/null")?;
    let raw = probe.as_raw_fd();
    drop(probe);
    let mut queue = nfq::Queue::open().context("opening an nfnetlink socket")?;
    let link = std::fs::read_link(format!("/proc/self/fd/{raw}")).unwrap_or_default();
    if !link.to_string_lossy().starts_with("socket:") {
        bail!("nfq socket is not at fd {raw} ({})", link.display());
    }
    let pidfd = pidfd_open(getpid(), PidfdFlags::empty()).context("pidfd_open(self)")?;
    let poll_fd =
        pidfd_getfd(&pidfd, raw, PidfdGetfdFlags::empty()).context("pidfd_getfd(self, nfq fd)")?;

    queue.bind(queue_num).with_context(|| {
        format!("binding NFQUEUE {queue_num} (another delayer already bound to it?)")
    })?;
    // Metadata only: the verdict never changes the packet, so copying payloads is waste.
    queue
        .set_copy_range(queue_num, 0)
        .context("setting copy range")?;
    queue
        .set_queue_max_len(queue_num, QUEUE_MAX_LEN)
        .context("setting the queue length")?;
    // Take GSO super-packets whole instead of making the kernel segment them for us; we accept
    // them unchanged, so partial checksums do not matter.
    queue
        .set_recv_gso(queue_num, true)
        .context("enabling GSO packets")?;
    queue.set_nonblocking(true);
    Ok((queue, poll_fd))
}

/// What happens to each packet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hold {
    /// Every packet's hold.
    pub(crate) delay: Duration,
    /// Up to this much more, uniformly.
    pub(crate) jitter: Duration,
    /// The fraction dropped (0..=1).
    pub(crate) loss: f64,
}

/// Holds packets until a byte arrives on `stop` (the signal pipe), then releases all and returns.
pub(crate) fn run(ports: &mut [Port], hold: Hold, stop: &UnixStream) -> Result<()> {
    let mut held = Holds::new(hold, fastrand::Rng::new());
    let mut ready = vec![false; ports.len()];
    let mut warnings = 0_u32;
    loop {
        let timeout = held.next_due().map(|due| {
            let left = due.saturating_duration_since(Instant::now());
            Timespec {
                tv_sec: left.as_secs() as _,
                tv_nsec: left.subsec_nanos() as _,
            }
        });
        let stopping = {
            let mut fds: Vec<PollFd<'_>> = ports
                .iter()
                .map(|p| PollFd::new(&p.poll_fd, PollFlags::IN))
                .collect();
            fds.push(PollFd::new(stop, PollFlags::IN));
            match rustix::event::poll(&mut fds, timeout.as_ref()) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e).context("poll"),
            }
            for (r, fd) in ready.iter_mut().zip(&fds) {
                *r = !fd.revents().is_empty();
            }
            fds.last().is_some_and(|fd| !fd.revents().is_empty())
        };
        if stopping {
            break;
        }
        for (idx, port) in ports.iter_mut().enumerate() {
            if !ready[idx] {
                continue;
            }
            for _ in 0..DRAIN_BATCH {
                match port.queue.recv() {
                    Ok(mut msg) => {
                        if held.dropped() {
                            msg.set_verdict(nfq::Verdict::Drop);
                            if let Err(e) = port.queue.verdict(msg) {
                                warn(&mut warnings, &port.name, "verdict", &e);
                            }
                        } else {
                            held.hold(Instant::now(), (idx, msg));
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => {
                        // ENOBUFS and friends: the kernel dropped what it could not deliver;
                        // TCP retransmits, so carry on rather than stall every host.
                        warn(&mut warnings, &port.name, "recv", &e);
                        break;
                    }
                }
            }
        }
        let now = Instant::now();
        while let Some((idx, msg)) = held.pop_due(now) {
            let port = &mut ports[idx];
            if let Err(e) = port.queue.verdict(msg) {
                warn(&mut warnings, &port.name, "verdict", &e);
            }
        }
    }
    // Unbinding makes the kernel drop what the queue still holds (packets we hold and packets
    // not yet read), so accept everything first, then pass new packets through at once until
    // the queues have been quiet for QUIET_BEFORE_UNBIND, and only then unbind. A packet that
    // arrives in the last instant before the unbind can still be lost; TCP resends it.
    for (idx, msg) in held.drain() {
        let port = &mut ports[idx];
        if let Err(e) = port.queue.verdict(msg) {
            warn(&mut warnings, &port.name, "verdict at stop", &e);
        }
    }
    let give_up = Instant::now() + Duration::from_secs(1);
    while Instant::now() < give_up && pass_through(ports, &mut warnings)? {}
    for port in ports.iter_mut() {
        if let Err(e) = port.queue.unbind(port.queue_num) {
            warn(&mut warnings, &port.name, "unbind", &e);
        }
    }
    Ok(())
}

/// Items held for a delay (and a jitter), released by deadline: the sans-I/O core of the loop.
///
/// Each item's deadline depends only on its own arrival, never on the items before it (the
/// property netem's delay has and a sleep-per-packet loop lacks).
#[derive(Debug)]
struct Holds<T> {
    /// What each item gets.
    hold: Hold,
    /// Drawn for jitter and loss.
    rng: fastrand::Rng,
    /// Items by deadline, then arrival.
    items: BinaryHeap<Reverse<Held<T>>>,
    /// Arrivals so far: equal deadlines leave in arrival order.
    arrived: u64,
}

/// One item and its deadline; ordered by deadline, then arrival.
#[derive(Debug)]
struct Held<T> {
    due: Instant,
    seq: u64,
    item: T,
}

impl<T> PartialEq for Held<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}
impl<T> Eq for Held<T> {}
impl<T> PartialOrd for Held<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Held<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.due, self.seq).cmp(&(other.due, other.seq))
    }
}

impl<T> Holds<T> {
    fn new(hold: Hold, rng: fastrand::Rng) -> Self {
        Holds {
            hold,
            rng,
            items: BinaryHeap::new(),
            arrived: 0,
        }
    }

    /// Whether the next packet is lost.
    fn dropped(&mut self) -> bool {
        self.hold.loss > 0.0 && self.rng.f64() < self.hold.loss
    }

    /// Holds `item`, which arrived at `now`.
    fn hold(&mut self, now: Instant, item: T) {
        let jitter = self.hold.jitter.mul_f64(self.rng.f64());
        self.arrived += 1;
        self.items.push(Reverse(Held {
            due: now + self.hold.delay + jitter,
            seq: self.arrived,
            item,
        }));
    }

    /// When the earliest item is due, if any is held.
    fn next_due(&self) -> Option<Instant> {
        self.items.peek().map(|Reverse(h)| h.due)
    }

    /// The earliest item if it is due at `now`.
    fn pop_due(&mut self, now: Instant) -> Option<T> {
        if self.next_due()? <= now {
            self.items.pop().map(|Reverse(h)| h.item)
        } else {
            None
        }
    }

    /// Every held item, due or not, earliest first.
    fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        std::iter::from_fn(|| self.items.pop().map(|Reverse(h)| h.item))
    }
}

/// How long the queues must be idle at stop before they are unbound: longer than the gap
/// between two packets of one transfer, shorter than anything a user would notice.
const QUIET_BEFORE_UNBIND: Duration = Duration::from_millis(20);

/// Waits up to QUIET_BEFORE_UNBIND for packets and accepts them at once; true if any came.
fn pass_through(ports: &mut [Port], warnings: &mut u32) -> Result<bool> {
    let timeout = Timespec {
        tv_sec: 0,
        tv_nsec: QUIET_BEFORE_UNBIND.as_nanos() as _,
    };
    let ready: Vec<bool> = {
        let mut fds: Vec<PollFd<'_>> = ports
            .iter()
            .map(|p| PollFd::new(&p.poll_fd, PollFlags::IN))
            .collect();
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e).context("poll at stop"),
        }
        fds.iter().map(|fd| !fd.revents().is_empty()).collect()
    };
    let mut any = false;
    for (port, _) in ports.iter_mut().zip(ready).filter(|(_, r)| *r) {
        loop {
            match port.queue.recv() {
                Ok(msg) => {
                    any = true;
                    if let Err(e) = port.queue.verdict(msg) {
                        warn(warnings, &port.name, "verdict at stop", &e);
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => {
                    warn(warnings, &port.name, "recv at stop", &e);
                    break;
                }
            }
        }
    }
    Ok(any)
}

/// Prints a non-fatal error; after 100 of them only every 1000th, so a storm cannot fill a log.
fn warn(count: &mut u32, name: &Path, what: &str, err: &std::io::Error) {
    *count = count.saturating_add(1);
    if *count <= 100 || (*count).is_multiple_of(1000) {
        eprintln!(
            "greedy-netdelay: {}: {what}: {err} (warning {count})",
            name.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// The same hold for every item, none lost.
    fn fixed(delay: Duration) -> Hold {
        Hold {
            delay,
            jitter: Duration::ZERO,
            loss: 0.0,
        }
    }

    /// Releases everything held, stepping the clock by 1 ms; returns (item, release ms).
    fn release_all(holds: &mut Holds<&'static str>, t0: Instant) -> Vec<(&'static str, u64)> {
        let mut out = Vec::new();
        for ms in 0..1000 {
            let now = t0 + MS * ms;
            while let Some(item) = holds.pop_due(now) {
                out.push((item, u64::from(ms)));
            }
        }
        out
    }

    #[test]
    fn each_item_waits_exactly_the_delay() {
        let t0 = Instant::now();
        let mut holds = Holds::new(fixed(20 * MS), fastrand::Rng::with_seed(1));
        holds.hold(t0, "a");
        holds.hold(t0 + MS, "b");
        holds.hold(t0 + 5 * MS, "c");
        assert_eq!(
            release_all(&mut holds, t0),
            [("a", 20), ("b", 21), ("c", 25)]
        );
    }

    #[test]
    fn a_burst_is_not_serialised() {
        let t0 = Instant::now();
        let mut holds = Holds::new(fixed(10 * MS), fastrand::Rng::with_seed(1));
        for item in ["a", "b", "c", "d"] {
            holds.hold(t0, item);
        }
        // All four leave together at 10 ms, not at 10/20/30/40 ms.
        assert_eq!(
            release_all(&mut holds, t0),
            [("a", 10), ("b", 10), ("c", 10), ("d", 10)]
        );
    }

    #[test]
    fn nothing_is_due_early_and_zero_delay_is_immediate() {
        let t0 = Instant::now();
        let mut holds = Holds::new(fixed(20 * MS), fastrand::Rng::with_seed(1));
        holds.hold(t0, "a");
        assert_eq!(holds.next_due(), Some(t0 + 20 * MS));
        assert_eq!(holds.pop_due(t0 + 19 * MS), None);
        assert_eq!(holds.pop_due(t0 + 20 * MS), Some("a"));
        assert_eq!(holds.next_due(), None);

        let mut now_only = Holds::new(fixed(Duration::ZERO), fastrand::Rng::with_seed(1));
        now_only.hold(t0, "b");
        assert_eq!(now_only.pop_due(t0), Some("b"));
    }

    #[test]
    fn jitter_spreads_holds_over_its_range_and_releases_by_deadline() {
        let t0 = Instant::now();
        let hold = Hold {
            delay: 10 * MS,
            jitter: 200 * MS,
            loss: 0.0,
        };
        let mut holds = Holds::new(hold, fastrand::Rng::with_seed(7));
        let names = ["a", "b", "c", "d", "e", "f", "g", "h"];
        for item in names {
            holds.hold(t0, item);
        }
        let out = release_all(&mut holds, t0);
        assert_eq!(out.len(), names.len());
        assert!(out.windows(2).all(|w| w[0].1 <= w[1].1), "{out:?}");
        assert!(out.iter().all(|(_, ms)| (10..=210).contains(ms)), "{out:?}");
        // Spread, not all at once: packets overtake each other.
        assert!(out.last().unwrap().1 - out[0].1 > 50, "{out:?}");
    }

    #[test]
    fn loss_drops_about_its_share() {
        let hold = Hold {
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            loss: 0.05,
        };
        let mut holds: Holds<()> = Holds::new(hold, fastrand::Rng::with_seed(3));
        let lost = (0..100_000).filter(|_| holds.dropped()).count();
        assert!((4_500..5_500).contains(&lost), "{lost}");
        let mut none: Holds<()> = Holds::new(fixed(MS), fastrand::Rng::with_seed(3));
        assert!(!(0..1000).any(|_| none.dropped()));
    }

    #[test]
    fn drain_returns_undue_items_in_order() {
        let t0 = Instant::now();
        let mut holds = Holds::new(fixed(20 * MS), fastrand::Rng::with_seed(1));
        holds.hold(t0, "a");
        holds.hold(t0 + MS, "b");
        assert_eq!(holds.drain().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(holds.next_due(), None);
    }
}
