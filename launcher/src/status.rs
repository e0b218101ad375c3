//! The exit-status rules of a job, sans I/O: which event ends the job and with which code.
//!
//! Rules (the `--help` exit table says the same):
//! * every rank exits 0 → 0;
//! * the first rank to fail (non-zero exit, signal, could not start) sets the code: its exit
//!   code, 128+signal, or 127; unless `keep_going`, it also ends the job;
//! * a launcher failure (lost host, timeout, wire-up abort) ends the job with its own code
//!   unless a rank failed first; of wire-up aborts started on several hosts before each heard
//!   of the others, the earliest sets the code, whichever greedyrun hears of first, and a rank
//!   that failed before the abort started is its cause and sets the code, even if heard of
//!   later (a child that crashes, and its parent whose connection to it then breaks);
//! * SIGINT/SIGTERM to greedyrun end the job with 130/143 unless something failed first;
//! * ranks killed by our own teardown are not failures of their own;
//! * spawned children count as ranks: the job ends when they ended too, their first failure
//!   is the job's, and while a spawn waits for its answer the job does not finish;
//! * a child's own failure heard within [`CAUSE_WINDOW`] after an abort that ends the job
//!   is named (its parent may have aborted because the child died: an agent reaps a child
//!   later than its sockets close, so the order of the two stamps cannot settle which came
//!   first), though the abort's code stays.

use crate::proto::RankEnd;

/// Exit codes of greedyrun that are not a rank's.
pub mod code {
    /// Command line or hostfile refused.
    pub const USAGE: i32 = 2;
    /// Some agent did not say hello within `--timeout`.
    pub const LAUNCH_TIMEOUT: i32 = 124;
    /// A host could not be reached, an agent died, the wire-up failed (the wire-up's own
    /// code for a lost node is this one).
    pub const LAUNCHER: i32 = greedy_pmix::LOST_NODE_CODE;
    /// greedyrun's stdout was closed (broken pipe).
    pub const BROKEN_PIPE: i32 = 141;
}

/// How long after an abort a spawned child's own failure may still be its cause, as far as
/// greedyrun can tell: the child's end is stamped when its agent reaps it, which on a busy
/// host comes after its parent saw its connection refused and aborted.
pub const CAUSE_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);

/// What the caller must do after an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing: keep running.
    Continue,
    /// Every rank has ended: shut the job down normally.
    Finished,
    /// Keep running, and print this line.
    Note {
        /// The line to print on stderr.
        message: String,
    },
    /// End the job now: tear every host down. `message` is the one line to print (or empty).
    Teardown {
        /// The line to print on stderr, or empty for a quiet end.
        message: String,
    },
}

/// The running account of a job's ends.
#[derive(Debug, Clone)]
pub struct JobStatus {
    n_ranks: u32,
    ended: u32,
    keep_going: bool,
    /// The code the job will exit with, once something failed.
    failure: Option<i32>,
    /// When the failure that set `failure` happened, if it says (a rank's end, an abort): an
    /// earlier one heard of later is its cause and takes its place.
    failure_at: Option<greedy_pmix::WallTime>,
    tearing_down: bool,
    /// Every rank ended well and the agents were told to shut down.
    finishing: bool,
    /// A spawn waits for its answer: more ranks may come.
    spawning: bool,
    /// When the abort that tore the job down started.
    aborted_at: Option<greedy_pmix::WallTime>,
}

impl JobStatus {
    /// A job of `n_ranks` ranks.
    pub fn new(n_ranks: u32, keep_going: bool) -> Self {
        JobStatus {
            n_ranks,
            ended: 0,
            keep_going,
            failure: None,
            failure_at: None,
            tearing_down: false,
            finishing: false,
            spawning: false,
            aborted_at: None,
        }
    }

    /// `n` more ranks (spawned children) will each end once.
    pub fn add_ranks(&mut self, n: u32) {
        self.n_ranks += n;
    }

    /// Whether a spawn waits for its answer; when the last one was answered and every rank
    /// has ended, the job finishes.
    pub fn spawning(&mut self, busy: bool) -> Verdict {
        let was = std::mem::replace(&mut self.spawning, busy);
        if was && !busy {
            return self.finished_if_done();
        }
        Verdict::Continue
    }

    /// A rank ended that greedyrun killed itself (a refused spawn's child): counted, never
    /// a failure.
    pub fn killed_rank_ended(&mut self) -> Verdict {
        self.ended += 1;
        self.finished_if_done()
    }

    fn finished_if_done(&self) -> Verdict {
        if self.ended >= self.n_ranks && !self.tearing_down && !self.finishing && !self.spawning {
            return Verdict::Finished;
        }
        Verdict::Continue
    }

    /// A rank ended at `at` (its agent's clock); `what` names it for the message (`rank 3 on
    /// n2`).
    pub fn rank_ended(&mut self, end: RankEnd, at: greedy_pmix::WallTime, what: &str) -> Verdict {
        self.ended += 1;
        if end.failed() && self.earlier(at) {
            self.failure = Some(end.code());
            self.failure_at = Some(at);
            return self.finished_if_done();
        }
        if end.failed() && !self.tearing_down && self.failure.is_none() {
            self.failure = Some(end.code());
            self.failure_at = Some(at);
            if !self.keep_going {
                self.tearing_down = true;
                let how = match end {
                    RankEnd::Exited(c) => format!("exited with code {c}"),
                    RankEnd::Signaled(s) => format!("was killed by signal {s}"),
                    RankEnd::NotStarted => "could not be started".to_string(),
                };
                return Verdict::Teardown {
                    message: format!("{what} {how}; ending the job"),
                };
            }
        }
        self.finished_if_done()
    }

    /// A rank of a spawned job ended: as [`JobStatus::rank_ended`], and a failure of its own
    /// that comes too late to set the code, within [`CAUSE_WINDOW`] of the abort that did,
    /// is named rather than lost among the ends of the teardown.
    pub fn child_ended(&mut self, end: RankEnd, at: greedy_pmix::WallTime, what: &str) -> Verdict {
        let aborted_at = self.aborted_at;
        let verdict = self.rank_ended(end, at, what);
        let RankEnd::Exited(code @ 1..) = end else {
            return verdict;
        };
        let window = CAUSE_WINDOW.as_micros() as u64;
        match aborted_at {
            Some(a) if verdict == Verdict::Continue && at.0 <= a.0.saturating_add(window) => {
                Verdict::Note {
                    message: format!(
                        "{what} exited with code {code} as the job was aborting, perhaps the \
                         abort's cause"
                    ),
                }
            }
            _ => verdict,
        }
    }

    /// The agents were told to shut down after [`Verdict::Finished`]: the job has succeeded,
    /// and what fails while it shuts down (an overlay join that nothing needed, meeting a node
    /// that already left) does not change that.
    pub fn finishing(&mut self) {
        self.finishing = true;
    }

    /// The launcher failed (`code` 124/125, or an agent's own failure); `message` says why.
    pub fn launcher_failed(&mut self, code: i32, message: String) -> Verdict {
        if self.tearing_down || self.finishing {
            return Verdict::Continue;
        }
        self.tearing_down = true;
        self.failure.get_or_insert(code);
        Verdict::Teardown { message }
    }

    /// The wire-up was aborted by `abort`; `message` says where it was heard of.
    ///
    /// Two hosts can start aborts before either hears of the other (a rank calls `MPI_Abort`,
    /// and a peer whose connection to it then fails aborts with its own code), or a rank can
    /// fail and a peer abort because of it; whichever reaches greedyrun first, the job's code
    /// is the earliest's, the cause's.
    pub fn aborted(&mut self, abort: &greedy_pmix::AbortInfo, message: String) -> Verdict {
        if self.earlier(abort.at) {
            self.failure = Some(abort.code);
            self.failure_at = Some(abort.at);
            return Verdict::Continue;
        }
        let verdict = self.launcher_failed(abort.code, message);
        if verdict != Verdict::Continue {
            self.failure_at = Some(abort.at);
            self.aborted_at = Some(abort.at);
        }
        verdict
    }

    /// Whether a failure at `at` came before the one that set the code (and so caused it).
    fn earlier(&self, at: greedy_pmix::WallTime) -> bool {
        self.failure_at.is_some_and(|first| at < first)
    }

    /// greedyrun received `signal` (2 or 15).
    pub fn interrupted(&mut self, signal: i32) -> Verdict {
        if self.tearing_down {
            return Verdict::Continue;
        }
        self.tearing_down = true;
        self.failure.get_or_insert(128 + signal);
        Verdict::Teardown {
            message: String::new(),
        }
    }

    /// Whether the job is being torn down.
    pub fn tearing_down(&self) -> bool {
        self.tearing_down
    }

    /// Ranks the job waits for: its own and the children started so far.
    pub fn n_ranks(&self) -> u32 {
        self.n_ranks
    }

    /// Ranks that have ended so far.
    pub fn ended(&self) -> u32 {
        self.ended
    }

    /// The exit code of greedyrun.
    pub fn exit_code(&self) -> i32 {
        self.failure.unwrap_or(0)
    }
}

/// Ranks that ran as singletons: a job in which some ranks spoke a wire-up protocol while
/// others ended (exit 0) without a word. The speakers' fences wait for ranks that will never
/// come (an MPI rank that starts as a singleton "succeeds" on its own), so the job is ended
/// with the ranks named rather than left to the fence timeout. A job in which no rank speaks
/// (`hostname`, scripts) is not a case.
#[derive(Debug, Default, Clone)]
pub struct Singletons {
    /// The first host whose ranks spoke, and what.
    spoke: Option<(String, greedy_pmix::family::Family)>,
    /// Ranks that ended 0 without speaking, each with its host.
    silent: Vec<(u32, String)>,
    reported: bool,
}

impl Singletons {
    /// The ranks of `host` speak `family`; the message that ends the job, if it must.
    pub fn spoke(&mut self, host: &str, family: greedy_pmix::family::Family) -> Option<String> {
        self.spoke.get_or_insert_with(|| (host.to_string(), family));
        self.verdict()
    }

    /// `rank` on `host` ended with `end`, having spoken (`silent` false) or not.
    pub fn ended(&mut self, rank: u32, host: &str, end: RankEnd, silent: bool) -> Option<String> {
        if silent && end == RankEnd::Exited(0) {
            self.silent.push((rank, host.to_string()));
        }
        self.verdict()
    }

    fn verdict(&mut self) -> Option<String> {
        let (speaker, family) = self.spoke.as_ref()?;
        let (_, host) = self.silent.first()?;
        if std::mem::replace(&mut self.reported, true) {
            return None;
        }
        let ranks: Vec<String> = self
            .silent
            .iter()
            .filter(|(_, h)| h == host)
            .map(|(r, _)| r.to_string())
            .collect();
        let s = if ranks.len() == 1 { "" } else { "s" };
        Some(format!(
            "rank{s} {} on {host} ended without speaking to the wire-up service while the ranks \
             on {speaker} speak {family}: they probably ran as singletons (a wrapper that did \
             not pass the launcher's environment on, or an MPI built without PMI and PMIx \
             support); ending the job",
            ranks.join(",")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use greedy_pmix::WallTime;

    /// A rank's end after every abort of a test.
    const LATER: WallTime = WallTime(u64::MAX);

    #[test]
    fn all_zero_finishes_with_zero() {
        let mut s = JobStatus::new(2, false);
        assert_eq!(
            s.rank_ended(RankEnd::Exited(0), LATER, "rank 0"),
            Verdict::Continue
        );
        assert_eq!(
            s.rank_ended(RankEnd::Exited(0), LATER, "rank 1"),
            Verdict::Finished
        );
        assert_eq!(s.exit_code(), 0);
        // A node's wire-up failing while the finished job shuts down (its overlay peer left
        // first) does not fail it; before the shutdown, the same failure would.
        s.finishing();
        assert_eq!(s.launcher_failed(1, "overlay".into()), Verdict::Continue);
        assert_eq!(s.exit_code(), 0);
    }

    #[test]
    fn first_failure_wins_and_ends_the_job() {
        let mut s = JobStatus::new(3, false);
        assert_eq!(
            s.rank_ended(RankEnd::Exited(3), LATER, "rank 1 on n2"),
            Verdict::Teardown {
                message: "rank 1 on n2 exited with code 3; ending the job".into()
            }
        );
        // Ranks killed by the teardown do not change the code.
        assert_eq!(
            s.rank_ended(RankEnd::Signaled(15), LATER, "rank 0"),
            Verdict::Continue
        );
        assert_eq!(s.launcher_failed(125, "lost".into()), Verdict::Continue);
        assert_eq!(s.exit_code(), 3);
    }

    #[test]
    fn the_earliest_abort_sets_the_code_whichever_arrives_first() {
        use greedy_pmix::{AbortInfo, WallTime};
        let abort = |code, at| AbortInfo {
            at: WallTime(at),
            ..AbortInfo::new(0, Some(1), code, "r".into())
        };
        let mut s = JobStatus::new(8, false);
        // A peer's abort, caused by the rank's, arrives first and ends the job.
        assert!(matches!(
            s.aborted(&abort(14, 1_012), "n4: wire-up aborted".into()),
            Verdict::Teardown { .. }
        ));
        assert_eq!(s.exit_code(), 14);
        // The cause, 12 ms earlier, arrives next and sets the code; later ones do not.
        assert_eq!(s.aborted(&abort(3, 1_000), "n3".into()), Verdict::Continue);
        assert_eq!(s.aborted(&abort(9, 1_005), "n5".into()), Verdict::Continue);
        assert_eq!(
            s.rank_ended(RankEnd::Signaled(9), LATER, "r"),
            Verdict::Continue
        );
        assert_eq!(s.exit_code(), 3);
        // A rank's failure before an abort is the cause: the abort changes nothing.
        let mut s = JobStatus::new(2, false);
        assert!(matches!(
            s.rank_ended(RankEnd::Exited(5), WallTime(2_000), "r"),
            Verdict::Teardown { .. }
        ));
        assert_eq!(s.aborted(&abort(14, 2_001), "n1".into()), Verdict::Continue);
        assert_eq!(s.exit_code(), 5);
        // A child that exits 7, and its parent's abort caused by it (its connection to the
        // child broke) heard of first: the child's code, whatever the order.
        let mut s = JobStatus::new(2, false);
        s.add_ranks(1);
        assert!(matches!(
            s.aborted(&abort(14, 3_010), "n1".into()),
            Verdict::Teardown { .. }
        ));
        let child = "rank 0 of spawned job j@1 on n1";
        assert_eq!(
            s.rank_ended(RankEnd::Exited(7), WallTime(3_000), child),
            Verdict::Continue
        );
        assert_eq!(s.exit_code(), 7);
        // Ranks killed by the teardown afterwards are not failures of their own.
        assert_eq!(
            s.rank_ended(RankEnd::Signaled(9), LATER, "r"),
            Verdict::Continue
        );
        assert_eq!(s.exit_code(), 7);
        // A child's failure reaped after its parent's abort: the abort's code, the child named.
        let mut s = JobStatus::new(2, false);
        s.add_ranks(1);
        assert!(matches!(
            s.aborted(&abort(14, 4_000), "n1".into()),
            Verdict::Teardown { .. }
        ));
        assert_eq!(
            s.child_ended(RankEnd::Exited(7), WallTime(4_900), child),
            Verdict::Note {
                message: format!(
                    "{child} exited with code 7 as the job was aborting, perhaps the abort's cause"
                )
            }
        );
        assert_eq!(s.exit_code(), 14);
        // Killed by the teardown, or long after the abort: nothing to say.
        assert_eq!(
            s.child_ended(RankEnd::Signaled(15), WallTime(4_950), child),
            Verdict::Continue
        );
        assert_eq!(
            s.child_ended(RankEnd::Exited(1), WallTime(2_000_000), child),
            Verdict::Continue
        );
    }

    #[test]
    fn signals_map_to_128_plus() {
        let mut s = JobStatus::new(2, false);
        assert!(matches!(
            s.rank_ended(RankEnd::Signaled(9), LATER, "r"),
            Verdict::Teardown { .. }
        ));
        assert_eq!(s.exit_code(), 137);
        let mut s = JobStatus::new(2, false);
        assert_eq!(
            s.interrupted(2),
            Verdict::Teardown {
                message: String::new()
            }
        );
        assert_eq!(
            s.rank_ended(RankEnd::Exited(1), LATER, "r"),
            Verdict::Continue
        );
        assert_eq!(s.exit_code(), 130);
    }

    #[test]
    fn keep_going_runs_to_the_end_with_the_first_code() {
        let mut s = JobStatus::new(3, true);
        assert_eq!(
            s.rank_ended(RankEnd::Exited(4), LATER, "r"),
            Verdict::Continue
        );
        assert_eq!(
            s.rank_ended(RankEnd::NotStarted, LATER, "r"),
            Verdict::Continue
        );
        assert_eq!(
            s.rank_ended(RankEnd::Exited(0), LATER, "r"),
            Verdict::Finished
        );
        assert_eq!(s.exit_code(), 4);
    }

    #[test]
    fn a_job_waits_for_its_spawns_and_their_children() {
        let mut s = JobStatus::new(1, false);
        assert_eq!(s.spawning(true), Verdict::Continue);
        // The parent ends while its spawn is being answered: the job goes on.
        assert_eq!(
            s.rank_ended(RankEnd::Exited(0), LATER, "r"),
            Verdict::Continue
        );
        s.add_ranks(2);
        assert_eq!(s.spawning(false), Verdict::Continue);
        assert_eq!(s.killed_rank_ended(), Verdict::Continue);
        assert_eq!(
            s.rank_ended(RankEnd::Exited(0), LATER, "c"),
            Verdict::Finished
        );
        assert_eq!(s.exit_code(), 0);
        // A spawn answered after every rank ended finishes the job then.
        let mut s = JobStatus::new(1, false);
        s.spawning(true);
        assert_eq!(
            s.rank_ended(RankEnd::Exited(0), LATER, "r"),
            Verdict::Continue
        );
        assert_eq!(s.spawning(false), Verdict::Finished);
        // A child's failure is the job's.
        let mut s = JobStatus::new(1, false);
        s.add_ranks(1);
        assert!(matches!(
            s.rank_ended(RankEnd::Exited(7), LATER, "rank 0 of spawned job j.1 on n1"),
            Verdict::Teardown { message } if message == "rank 0 of spawned job j.1 on n1 exited with code 7; ending the job"
        ));
        assert_eq!(s.exit_code(), 7);
    }

    #[test]
    fn launcher_failure_code() {
        let mut s = JobStatus::new(1, false);
        assert!(matches!(
            s.launcher_failed(code::LAUNCH_TIMEOUT, "x".into()),
            Verdict::Teardown { .. }
        ));
        assert_eq!(s.exit_code(), 124);
    }

    #[test]
    fn ranks_ending_silently_beside_speaking_ones_are_named_as_singletons() {
        use greedy_pmix::family::Family;
        let mut s = Singletons::default();
        assert_eq!(
            s.ended(0, "n1", RankEnd::Exited(0), true),
            None,
            "hostname so far"
        );
        assert_eq!(s.ended(1, "n1", RankEnd::Exited(0), true), None);
        assert_eq!(
            s.ended(5, "n3", RankEnd::Exited(3), true),
            None,
            "a failure, not a singleton"
        );
        let msg = s
            .spoke("n2", Family::Pmix)
            .expect("ranks 0 and 1 never spoke");
        assert!(
            msg.starts_with("ranks 0,1 on n1 ended without speaking to the wire-up service while the ranks on n2 speak PMIx"),
            "{msg}"
        );
        assert_eq!(
            s.ended(2, "n1", RankEnd::Exited(0), true),
            None,
            "said once"
        );

        let mut s = Singletons::default();
        assert_eq!(s.spoke("n1", Family::Pmi), None);
        assert_eq!(
            s.ended(4, "n2", RankEnd::Exited(0), false),
            None,
            "it spoke"
        );
        assert!(
            s.ended(6, "n3", RankEnd::Exited(0), true)
                .is_some_and(|m| m.starts_with("rank 6 on n3"))
        );
    }
}
