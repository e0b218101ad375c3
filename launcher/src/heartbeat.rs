//! Heartbeats on every edge of the launch tree: how a host that is gone, or cut off by its
//! link, is told apart from one that is only quiet or slow.
//!
//! A connection whose peer's host dies or whose link is cut stays open for many minutes: when
//! nothing is sent, nothing fails (and an rsh edge or an srun agent's connection has no ssh
//! keepalive under it). So each side of an edge sends a ping ([`Down::Ping`], [`Up::Ping`])
//! when it has sent nothing for a sixth of `--lost-after`, and takes the other side as gone
//! when it has heard nothing for all of it: a parent reports the child lost (and heals its
//! subtree in a stream), an agent ends its ranks and its subtree as when its parent's pipe
//! closes, so a host cut off from the tree leaves nothing running. A host that is loaded or an
//! agent stopped for less than that is slow, not lost. `--lost-after 0` turns heartbeats off.

use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::time::Instant;

use crate::{Error, proto::Down};

/// Default `--lost-after`, seconds: long enough for a node under heavy load, or a front end
/// stopped a while, to answer; short against a day-long job.
pub const DEFAULT_LOST_AFTER_S: f64 = 60.0;

/// When an edge pings and when it gives up on its peer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Heartbeat {
    /// Silence after which the peer is gone; `None`: never (heartbeats off).
    lost_after: Option<Duration>,
}

impl Heartbeat {
    /// From `Start::lost_after_s` (checked to be a duration); 0 turns heartbeats off.
    pub fn new(lost_after_s: f64) -> Heartbeat {
        let lost_after = Duration::try_from_secs_f64(lost_after_s)
            .ok()
            .filter(|d| !d.is_zero());
        Heartbeat { lost_after }
    }

    /// No heartbeats.
    pub fn off() -> Heartbeat {
        Heartbeat { lost_after: None }
    }

    /// How long a side may send nothing before it pings.
    pub fn ping_every(&self) -> Option<Duration> {
        self.lost_after.map(|d| d / 6)
    }

    /// When the peer is gone if nothing comes from it after `heard`.
    pub fn deadline(&self, heard: Instant) -> Option<Instant> {
        self.lost_after.map(|d| heard + d)
    }

    /// What the silence was, for the message that names the host.
    pub fn silence(&self) -> String {
        let secs = self.lost_after.map_or(0.0, |d| d.as_secs_f64());
        format!("no word from it for {secs} s (--lost-after): its host, or the link to it, is down")
    }
}

/// Sleeps until `at`; forever when there is none.
pub async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The frames from an agent's parent, without its pings; an error once the parent has been
/// silent for `--lost-after` (the agent then ends as when the pipe closes).
pub fn watched<S>(down: S, beat: Heartbeat) -> impl Stream<Item = Result<Down, Error>> + Unpin
where
    S: Stream<Item = Result<Down, Error>> + Unpin,
{
    Box::pin(futures_util::stream::unfold(
        down,
        move |mut down| async move {
            loop {
                let next = tokio::select! {
                    f = down.next() => f,
                    () = until(beat.deadline(Instant::now())) => {
                        let silent = format!("the parent: {}", beat.silence());
                        return Some((Err(Error::Frame(silent)), down));
                    }
                };
                match next {
                    Some(Ok(Down::Ping)) => continue,
                    Some(f) => return Some((f, down)),
                    None => return None,
                }
            }
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;

    #[test]
    fn pings_come_six_times_within_the_silence_that_loses_a_peer() {
        let beat = Heartbeat::new(60.0);
        assert_eq!(beat.ping_every(), Some(Duration::from_secs(10)));
        let now = Instant::now();
        assert_eq!(beat.deadline(now), Some(now + Duration::from_secs(60)));
        assert!(beat.silence().contains("60 s"));
        for off in [Heartbeat::new(0.0), Heartbeat::off()] {
            assert_eq!(off.ping_every(), None);
            assert_eq!(off.deadline(now), None);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn pings_are_swallowed_and_silence_ends_the_stream_with_an_error() {
        let frames = stream::iter([Ok(Down::Ping), Ok(Down::Ping)]).chain(stream::pending());
        let mut down = watched(frames, Heartbeat::new(6.0));
        let t0 = Instant::now();
        match down.next().await {
            Some(Err(Error::Frame(what))) => assert!(what.contains("no word"), "{what}"),
            other => panic!("expected silence, got {other:?}"),
        }
        assert_eq!(t0.elapsed(), Duration::from_secs(6));
    }

    #[tokio::test(start_paused = true)]
    async fn without_heartbeats_a_quiet_parent_is_waited_for() {
        let mut down = watched(stream::pending(), Heartbeat::off());
        let waited = tokio::time::timeout(Duration::from_secs(3600), down.next()).await;
        assert!(waited.is_err(), "a quiet parent was given up on");
    }
}
