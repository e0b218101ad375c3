//! Which host runs what of the task streams: tasks in flight and tasks to run again, in the
//! slots of the session's board. Bookkeeping without I/O.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::Arc;

use super::board::JobBoard;
use crate::proto::{RankEnd, TaskId};
use crate::task_spec::{Outputs, TaskSpec};

/// Most tasks read and waiting for room at once (retries and lost hosts' tasks may add to
/// them): no line is read past it.
const WAITING_MAX: usize = 8;

/// A line of a stream: its stream and line number, and what it asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// Its stream and line (from 1: the task's name in results and messages).
    pub id: TaskId,
    /// What the line asks for.
    pub spec: TaskSpec,
    /// Runs so far that ended in failure (a retry has `attempt` ≥ 1).
    pub failures: u32,
}

/// Where a task runs: each host and the task's ranks there, one host unless a job task spans
/// several; the first host names the task in results, and its end is reported for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement(pub Vec<(u32, u32)>);

impl Placement {
    /// The host that reports the task's end.
    pub fn host(&self) -> u32 {
        self.0.first().map_or(0, |&(h, _)| h)
    }

    /// Each host and the slots `spec`'s ranks take there.
    pub fn slots<'a>(&'a self, spec: &'a TaskSpec) -> impl Iterator<Item = (u32, u32)> + 'a {
        (self.0.iter()).map(|&(h, r)| (h, r.saturating_mul(spec.cores_per_rank)))
    }

    /// The host of each rank, in rank order.
    pub fn rank_hosts(&self) -> impl Iterator<Item = u32> + '_ {
        (self.0.iter()).flat_map(|&(h, r)| std::iter::repeat_n(h, r as usize))
    }
}

/// What the first waiting task holds while it waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// The host it waits for: no other task starts there.
    Host(u32),
    /// Every host: a task that must span hosts waits for free slots anywhere, so nothing
    /// passes it.
    All,
}

/// A task's final end, reported once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    /// The task.
    pub task: Task,
    /// Where it last ran.
    pub at: Placement,
    /// How its last run ended.
    pub end: RankEnd,
    /// Its last run's wall time, in microseconds.
    pub wall_us: u64,
    /// How many of its runs ended (a run on a host that was lost did not).
    pub runs: u32,
    /// It failed because its stream was cancelled (never run again).
    pub cancelled: bool,
}

#[derive(Debug)]
struct InFlight {
    at: Placement,
    task: Task,
    runs: u32,
    /// Its job ended and its first host is sending its outputs ([`Ended::Collect`]).
    collecting: bool,
}

/// Which host runs what: tasks in flight and tasks to run again, in slots taken from the
/// session's [`JobBoard`] (which jobs share).
pub struct Dispatcher {
    board: Arc<JobBoard>,
    in_flight: HashMap<TaskId, InFlight>,
    /// Tasks waiting to run (retries, the tasks of lost hosts, tasks whose slots were not
    /// free when read), in order; the first holds the host it waits for.
    again: VecDeque<(Task, u32)>,
    /// The first waiting task and the host it waits for ([`Dispatcher::pin_held`]).
    held: Option<(TaskId, u32)>,
    /// Each open stream's runs again of a failed task.
    retries: HashMap<u32, u32>,
    /// Streams cancelled (their client left, Ctrl-C, a closed stdout): nothing of them runs
    /// again, and what they were running ends as cancelled.
    cancelled: std::collections::HashSet<u32>,
}

/// What [`Dispatcher::ended`] made of a task's end.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// Its final end.
    Done(Box<Done>),
    /// It failed and runs again.
    Retry,
    /// Not the run in flight (a lost host's late report after the task moved on): ignored.
    Stale,
    /// A job's task whose job succeeded: its first host is to send `outputs` (written in
    /// `cwd`), then report its end again.
    Collect {
        /// The task's working directory, relative to the stream's.
        cwd: Option<String>,
        /// Its outputs.
        outputs: Outputs,
    },
}

impl Dispatcher {
    /// Tasks in `board`'s slots.
    pub fn new(board: Arc<JobBoard>) -> Dispatcher {
        Dispatcher {
            board,
            in_flight: HashMap::new(),
            again: VecDeque::new(),
            held: None,
            retries: HashMap::new(),
            cancelled: Default::default(),
        }
    }

    /// Stream `stream` begins: a failed task of it runs at most `retries` more times.
    pub fn open_stream(&mut self, stream: u32, retries: u32) {
        self.retries.insert(stream, retries);
    }

    /// Stream `stream` has ended (nothing of it runs or waits).
    pub fn close_stream(&mut self, stream: u32) {
        self.retries.remove(&stream);
        self.cancelled.remove(&stream);
    }

    /// Pins the host the first waiting task waits for (kept while it waits there and the
    /// host is usable, so a tie never moves it and undoes the room gathered).
    fn pin_held(&mut self) {
        let host = match self.hold() {
            Some(Hold::Host(h)) => Some(h),
            _ => None,
        };
        self.held = self.again.front().map(|(t, _)| t.id).zip(host);
    }

    /// Stream `stream` is cancelled: what was to run again is dropped and returned; what runs
    /// ends without a retry, as cancelled.
    pub fn cancel(&mut self, stream: u32) -> Vec<Task> {
        self.cancelled.insert(stream);
        let (dropped, kept) = std::mem::take(&mut self.again)
            .into_iter()
            .partition(|(t, _)| t.id.stream == stream);
        self.again = kept;
        dropped.into_iter().map(|(t, _)| t).collect()
    }

    /// Whether a new line may be read: a slot is free beside the host the first waiting task
    /// waits for, and few enough wait that memory stays bounded by the slots.
    pub fn has_free_slot(&self) -> bool {
        self.again.len() < WAITING_MAX
            && match self.hold() {
                None => self.board.has_free_task_slot_beside(None),
                Some(Hold::Host(h)) => self.board.has_free_task_slot_beside(Some(h)),
                Some(Hold::All) => false,
            }
    }

    /// What the first waiting task holds, if one waits: the host it waits for (no other task
    /// starts there until it has, so its free slots only grow and it starts once enough tasks
    /// there end), or every host for a task that must span hosts.
    fn hold(&self) -> Option<Hold> {
        let front = &self.again.front()?.0;
        let k = front.spec.slot_count();
        if front.spec.is_job() && k > self.board.largest_host() {
            return Some(Hold::All);
        }
        match self.held {
            Some((id, h)) if id == front.id && self.board.usable(h) => Some(Hold::Host(h)),
            _ => self.board.most_free_host(k).map(Hold::Host),
        }
    }

    /// Slots for `spec` now, beside `avoid`: of one host, or for a job task that finds no
    /// host with room, spanning the fewest hosts with room.
    fn take(&self, spec: &TaskSpec, avoid: Option<u32>) -> Option<Placement> {
        if let Some(h) = self.board.take_task_slots(spec.slot_count(), avoid) {
            return Some(Placement(vec![(h, spec.ranks)]));
        }
        if !spec.is_job() || avoid.is_some() {
            return None;
        }
        let span = self.board.take_task_span(spec.ranks, spec.cores_per_rank)?;
        Some(Placement(span))
    }

    /// A waiting task placed: the first if its slots are free on one host now, else the first
    /// behind it that fits beside the host the first waits for. It and where it runs.
    pub fn place_again(&mut self) -> Option<(Task, Placement)> {
        let (i, at) = match self.take(&self.again.front()?.0.spec, None) {
            Some(at) => (0, at),
            None => {
                let Some(Hold::Host(held)) = self.hold() else {
                    return None;
                };
                (1..self.again.len())
                    .find_map(|i| Some((i, self.take(&self.again[i].0.spec, Some(held))?)))?
            }
        };
        let (task, runs) = self.again.remove(i).expect("listed");
        self.pin_held();
        let placed = (task.clone(), at.clone());
        self.fly(task, at, runs);
        Some(placed)
    }

    /// `task` runs at `at` from now on.
    fn fly(&mut self, task: Task, at: Placement, runs: u32) {
        let f = InFlight {
            at,
            task,
            runs,
            collecting: false,
        };
        self.in_flight.insert(f.task.id, f);
    }

    /// The first task waiting to run, taken out if it can never run: it needs more slots
    /// than any host left has, or (a job task) more ranks than all of them hold.
    pub fn take_unplaceable(&mut self) -> Option<Task> {
        let spec = &self.again.front()?.0.spec;
        let never = match spec.is_job() {
            true => u64::from(spec.ranks) > self.board.rank_room(spec.cores_per_rank),
            false => spec.slot_count() > self.board.largest_host(),
        };
        never.then(|| self.again.pop_front().expect("the front").0)
    }

    /// Puts `task` (run `runs` times before) where its slots are free, beside the host a
    /// waiting task waits for: where it runs, or `None` while there is no room (it waits, in
    /// line, [`Dispatcher::place_again`]).
    pub fn assign(&mut self, task: Task, runs: u32) -> Option<Placement> {
        let at = match self.hold() {
            Some(Hold::All) => None,
            Some(Hold::Host(h)) => self.take(&task.spec, Some(h)),
            None => self.take(&task.spec, None),
        };
        if let Some(at) = &at {
            self.fly(task, at.clone(), runs);
        } else {
            self.again.push_back((task, runs));
            self.pin_held();
        }
        at
    }

    /// The slots of `f`'s task are free again.
    fn free(&self, f: &InFlight) {
        for (h, k) in f.at.slots(&f.task.spec) {
            self.board.task_ended(h, k);
        }
    }

    /// Task `id`, just placed, is not sent after all: its slots are free again.
    pub fn forget(&mut self, id: TaskId) {
        if let Some(f) = self.in_flight.remove(&id) {
            self.free(&f);
        }
    }

    /// Task `id` ended, as `host` (its placement's first) reports; a job's task with outputs
    /// ends twice: its job (then [`Ended::Collect`]), and once its outputs are sent.
    pub fn ended(&mut self, host: u32, id: TaskId, end: RankEnd, wall_us: u64) -> Ended {
        let f = match self.in_flight.get_mut(&id) {
            Some(f) if f.at.host() == host => f,
            _ => return Ended::Stale,
        };
        let spec = &f.task.spec;
        if spec.is_job() && !spec.outputs.files.is_empty() && !end.failed() && !f.collecting {
            f.collecting = true;
            let (cwd, outputs) = (spec.cwd.clone(), spec.outputs.clone());
            return Ended::Collect { cwd, outputs };
        }
        let f = self.in_flight.remove(&id).expect("checked");
        self.free(&f);
        let InFlight {
            at, mut task, runs, ..
        } = f;
        let runs = runs + 1;
        let stream_retries = self.retries.get(&id.stream).copied().unwrap_or(0);
        let retries = task.spec.retries.unwrap_or(stream_retries);
        let cancelled = end.failed() && self.cancelled.contains(&id.stream);
        if end.failed() && !cancelled && task.failures < retries {
            task.failures += 1;
            self.again.push_back((task, runs));
            return Ended::Retry;
        }
        Ended::Done(Box::new(Done {
            task,
            at,
            end,
            wall_us,
            runs,
            cancelled,
        }))
    }

    /// Hosts `hosts` are lost (a launch subtree; the board was told): what ran there, on
    /// any of its hosts, runs again elsewhere, first; returns those tasks.
    pub fn hosts_lost(&mut self, hosts: Range<u32>) -> Vec<TaskId> {
        let moved: Vec<TaskId> = self
            .in_flight
            .iter()
            .filter(|(_, f)| f.at.0.iter().any(|(h, _)| hosts.contains(h)))
            .map(|(&id, _)| id)
            .collect();
        for id in &moved {
            let f = self.in_flight.remove(id).expect("listed");
            self.free(&f);
            self.again.push_front((f.task, f.runs));
        }
        moved
    }

    /// Tasks running now.
    pub fn running(&self) -> usize {
        self.in_flight.len()
    }

    /// Tasks of `stream` running now.
    pub fn running_of(&self, stream: u32) -> usize {
        self.in_flight
            .keys()
            .filter(|id| id.stream == stream)
            .count()
    }

    /// Nothing of `stream` in flight and nothing to run again.
    pub fn idle(&self, stream: u32) -> bool {
        self.running_of(stream) == 0 && !self.again.iter().any(|(t, _)| t.id.stream == stream)
    }

    /// What can never run now (the host list is exhausted): in flight and to run again.
    pub fn drain(&mut self) -> Vec<Task> {
        let mut left: Vec<Task> = self.again.drain(..).map(|(t, _)| t).collect();
        left.extend(self.in_flight.drain().map(|(_, f)| f.task));
        left.sort_by_key(|t| t.id);
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task_spec::Defaults;

    /// The host a task was placed on.
    fn host_of(at: Option<Placement>) -> Option<u32> {
        at.map(|at| at.host())
    }

    /// Line `line` of stream 0.
    fn id(line: u64) -> TaskId {
        TaskId { stream: 0, line }
    }

    fn task(line: u64) -> Task {
        Task {
            id: id(line),
            spec: TaskSpec::plain(format!("cmd {line}"), &Defaults::default()),
            failures: 0,
        }
    }

    /// A dispatcher on hosts with these slots, none up yet, running stream 0 with these
    /// retries, and its board.
    fn dispatcher(slots: Vec<u32>, retries: u32) -> (Dispatcher, Arc<JobBoard>) {
        let hosts = (0..slots.len()).map(|i| format!("h{i}")).collect();
        let board = JobBoard::new(hosts, slots);
        let mut d = Dispatcher::new(board.clone());
        d.open_stream(0, retries);
        (d, board)
    }

    /// Hosts `hosts` are lost, as the session's loop tells the board and the dispatcher.
    fn lose(board: &JobBoard, d: &mut Dispatcher, hosts: Range<u32>) -> usize {
        futures_util::FutureExt::now_or_never(board.hosts_lost(hosts.clone(), "gone"))
            .expect("no job to tell");
        d.hosts_lost(hosts).len()
    }

    #[test]
    fn slots_rotate_over_hosts_and_free_on_end() {
        let (mut d, board) = dispatcher(vec![1, 2], 0);
        assert!(!d.has_free_slot());
        board.host_up(1);
        board.host_up(0);
        board.host_up(0); // a second hello adds nothing
        let hosts: Vec<u32> = (1..=3)
            .map(|i| d.assign(task(i), 0).unwrap().host())
            .collect();
        assert_eq!(hosts, [1, 1, 0]);
        assert!(!d.has_free_slot());
        let Ended::Done(done) = d.ended(1, id(2), RankEnd::Exited(0), 7) else {
            panic!()
        };
        assert_eq!(
            (done.task.id, done.at.host(), done.runs, done.wall_us),
            (id(2), 1, 1, 7)
        );
        assert_eq!(host_of(d.assign(task(4), 0)), Some(1));
    }

    #[test]
    fn a_failed_task_runs_again_up_to_the_retries_then_is_done_once() {
        let (mut d, board) = dispatcher(vec![1], 2);
        board.host_up(0);
        d.assign(task(1), 0);
        assert_eq!(d.ended(0, id(1), RankEnd::Exited(3), 1), Ended::Retry);
        assert!(!d.has_free_slot(), "the retry goes first");
        let (t, host) = d.place_again().unwrap();
        assert_eq!((t.failures, host.host()), (1, 0));
        assert_eq!(d.ended(0, id(1), RankEnd::Signaled(9), 1), Ended::Retry);
        d.place_again().unwrap();
        let Ended::Done(done) = d.ended(0, id(1), RankEnd::Exited(3), 1) else {
            panic!()
        };
        assert_eq!((done.runs, done.end.code()), (3, 3));
        assert!(d.idle(0));
        // A second report of it is not a second end.
        assert_eq!(d.ended(0, id(1), RankEnd::Exited(0), 1), Ended::Stale);
    }

    #[test]
    fn a_lost_hosts_tasks_run_elsewhere_and_its_late_reports_are_ignored() {
        let (mut d, board) = dispatcher(vec![2, 2, 1], 0);
        for h in 0..3 {
            board.host_up(h);
        }
        let on: Vec<u32> = (1..=5)
            .map(|i| d.assign(task(i), 0).unwrap().host())
            .collect();
        assert_eq!(on, [0, 0, 1, 1, 2]);
        // Hosts 1 and 2 (a launch subtree) are lost with tasks 3, 4 and 5.
        assert_eq!(lose(&board, &mut d, 1..3), 3);
        assert!(!d.has_free_slot());
        assert!(d.ended(0, id(1), RankEnd::Exited(0), 1).is_done());
        let (moved, host) = d.place_again().unwrap();
        assert!([3, 4, 5].contains(&moved.id.line));
        assert_eq!(host.host(), 0);
        // The lost host's report of it comes late: not its end.
        assert_eq!(d.ended(1, moved.id, RankEnd::Exited(0), 1), Ended::Stale);
        assert!(d.ended(0, moved.id, RankEnd::Exited(0), 1).is_done());
        assert_eq!(board.hosts_left(true, 9), 1);
        // Task 2 still runs on host 0: lost with it, it is left with the other two.
        assert_eq!(lose(&board, &mut d, 0..1), 1);
        assert_eq!(board.hosts_left(true, 9), 0);
        let left: Vec<u64> = d.drain().iter().map(|t| t.id.line).collect();
        assert_eq!(left.len(), 3);
        assert!(left.contains(&2));
        assert!(d.idle(0));
    }

    /// Two streams at once: each has its own retries; cancelling one forgets only its
    /// retries; each is idle on its own.
    #[test]
    fn streams_share_the_slots_and_keep_their_own_account() {
        let (mut d, board) = dispatcher(vec![2, 1], 1);
        d.open_stream(1, 0);
        for h in 0..2 {
            board.host_up(h);
        }
        let b = |line| Task {
            id: TaskId { stream: 1, line },
            spec: TaskSpec::plain("b".into(), &Defaults::default()),
            failures: 0,
        };
        d.assign(task(1), 0);
        d.assign(b(1), 0);
        d.assign(b(2), 0);
        assert!(!d.has_free_slot());
        assert_eq!((d.running_of(0), d.running_of(1)), (1, 2));
        // Stream 0 retries; stream 1, with none, is done with its failure.
        assert_eq!(d.ended(0, id(1), RankEnd::Exited(3), 1), Ended::Retry);
        let failed = d.ended(0, TaskId { stream: 1, line: 1 }, RankEnd::Exited(3), 1);
        assert!(failed.is_done());
        assert!(!d.idle(0), "stream 0's retry waits");
        // Stream 0 is cancelled: its retry goes; stream 1's task runs on.
        let dropped = d.cancel(0);
        assert_eq!(dropped.iter().map(|t| t.id).collect::<Vec<_>>(), [id(1)]);
        assert!(d.idle(0));
        assert!(!d.idle(1));
        assert!(d.place_again().is_none());
        assert!(
            d.ended(1, TaskId { stream: 1, line: 2 }, RankEnd::Exited(0), 1)
                .is_done()
        );
        assert!(d.idle(1));
        d.close_stream(0);
        d.close_stream(1);
    }

    /// A cancelled stream's task that fails (it was ended for the cancel) is not run again:
    /// it is done, as cancelled; one that ends 0 is done as usual.
    #[test]
    fn a_cancelled_streams_tasks_end_cancelled_and_never_run_again() {
        let (mut d, board) = dispatcher(vec![2], 3);
        board.host_up(0);
        d.assign(task(1), 0);
        d.assign(task(2), 0);
        assert!(d.cancel(0).is_empty());
        match d.ended(0, id(1), RankEnd::Signaled(15), 1) {
            Ended::Done(done) => assert!(done.cancelled),
            other => panic!("{other:?}"),
        }
        match d.ended(0, id(2), RankEnd::Exited(0), 1) {
            Ended::Done(done) => assert!(!done.cancelled),
            other => panic!("{other:?}"),
        }
        assert!(d.place_again().is_none());
        assert!(d.idle(0));
    }

    /// A task of several cores waits first in line for a host with that many free; nothing
    /// passes it; one that needs more than any host has is taken out.
    #[test]
    fn a_multi_core_task_waits_first_in_line_for_one_host_with_room() {
        let (mut d, board) = dispatcher(vec![2, 3], 0);
        board.host_up(0);
        board.host_up(1);
        let wide = |line, cores| Task {
            spec: TaskSpec::plain(
                "w".into(),
                &Defaults {
                    ranks: 1,
                    cores_per_rank: cores,
                },
            ),
            ..task(line)
        };
        assert_eq!(host_of(d.assign(wide(1, 3), 0)), Some(1));
        assert_eq!(host_of(d.assign(task(2), 0)), Some(0));
        // Host 0 has one slot left, host 1 none: the next 2-core task waits.
        assert_eq!(host_of(d.assign(wide(3, 2), 0)), None);
        assert!(!d.has_free_slot(), "no line passes the waiting task");
        assert!(d.place_again().is_none());
        assert!(d.ended(0, id(2), RankEnd::Exited(0), 1).is_done());
        assert_eq!(
            d.place_again().map(|(t, h)| (t.id, h.host())),
            Some((id(3), 0))
        );
        assert!(d.take_unplaceable().is_none());
        assert_eq!(host_of(d.assign(wide(4, 4), 0)), None);
        assert_eq!(d.take_unplaceable().map(|t| t.id), Some(id(4)));
        assert!(d.ended(1, id(1), RankEnd::Exited(0), 1).is_done());
        assert!(d.has_free_slot());
    }

    /// While a 2-core task waits for the host with the most room, 1-core tasks behind it
    /// start on the other hosts, never on that one; it starts once that host's task ends.
    #[test]
    fn small_tasks_backfill_beside_the_host_a_wide_task_waits_for() {
        let (mut d, board) = dispatcher(vec![2, 2], 0);
        board.host_up(0);
        board.host_up(1);
        let on: Vec<u32> = (1..=3)
            .map(|i| d.assign(task(i), 0).unwrap().host())
            .collect();
        assert_eq!(on, [0, 0, 1]);
        let wide = Task {
            spec: TaskSpec::plain(
                "w".into(),
                &Defaults {
                    ranks: 1,
                    cores_per_rank: 2,
                },
            ),
            ..task(4)
        };
        assert_eq!(host_of(d.assign(wide, 0)), None, "host 1 has one slot free");
        assert!(!d.has_free_slot(), "host 1 is held for it, host 0 is full");
        assert!(d.ended(0, id(1), RankEnd::Exited(0), 1).is_done());
        assert!(d.has_free_slot(), "host 0 has room beside the held host");
        assert_eq!(
            host_of(d.assign(task(5), 0)),
            Some(0),
            "backfilled beside host 1"
        );
        assert!(d.place_again().is_none());
        assert!(d.ended(1, id(3), RankEnd::Exited(0), 1).is_done());
        assert_eq!(
            d.place_again().map(|(t, h)| (t.id, h.host())),
            Some((id(4), 1))
        );
    }

    /// A job task of more ranks than a host has spans the hosts with the most room; waiting,
    /// it holds every host (nothing passes it); one of more ranks than all hosts hold is taken
    /// out; a lost host under any of its ranks moves it.
    #[test]
    fn a_job_task_spans_hosts_and_waits_holding_them_all() {
        let (mut d, board) = dispatcher(vec![2, 2], 0);
        board.host_up(0);
        board.host_up(1);
        let job = |line, ranks| Task {
            spec: TaskSpec {
                mpi: true,
                ..TaskSpec::plain(
                    "j".into(),
                    &Defaults {
                        ranks,
                        cores_per_rank: 1,
                    },
                )
            },
            ..task(line)
        };
        let at = d.assign(job(1, 3), 0).unwrap();
        assert_eq!(at, Placement(vec![(0, 2), (1, 1)]));
        assert_eq!(at.rank_hosts().collect::<Vec<_>>(), [0, 0, 1]);
        assert_eq!(host_of(d.assign(job(2, 3), 0)), None, "one slot is left");
        assert!(
            !d.has_free_slot(),
            "the waiting 3-rank task holds every host"
        );
        assert!(d.place_again().is_none(), "no 1-slot task passes it");
        assert!(d.ended(0, id(1), RankEnd::Exited(0), 1).is_done());
        let (t, at) = d.place_again().unwrap();
        assert_eq!((t.id, at.0.len()), (id(2), 2));
        assert_eq!(host_of(d.assign(job(3, 5), 0)), None);
        assert_eq!(
            d.take_unplaceable().map(|t| t.id),
            Some(id(3)),
            "4 slots in all"
        );
        assert_eq!(lose(&board, &mut d, 1..2), 1, "task 2 had a rank on host 1");
        assert_eq!(
            d.take_unplaceable().map(|t| t.id),
            Some(id(2)),
            "2 slots are left"
        );
    }

    impl Ended {
        fn is_done(&self) -> bool {
            matches!(self, Ended::Done(_))
        }
    }
}
