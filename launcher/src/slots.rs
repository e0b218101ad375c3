//! The slots of a session's (or a stream's) hosts, with one owner: who holds each — a job's
//! ranks, a task of the stream, or a job waiting for it — and which a task may take next.
//! Sans I/O; [`crate::session::JobBoard`] keeps it behind its lock.
//!
//! A job takes whole slots on named hosts and may wait for slots the stream's tasks hold, or
//! those of a job that is ending (its ranks all ended, its agents shutting down): while it
//! waits, a task that ends gives its slot to the job, not to the next task. Tasks take what
//! neither holds, rotating over the hosts (a slot freed goes to the back of the queue).

use std::collections::VecDeque;
use std::ops::Range;

/// Slot counts per host and the queue tasks take slots from.
#[derive(Debug)]
pub struct Slots {
    slots: Vec<u32>,
    /// Held by running jobs.
    jobs: Vec<u32>,
    /// Of `jobs`, held by jobs that are ending: free for the next job's plan, not yet to use.
    ending: Vec<u32>,
    /// Held by the stream's tasks in flight.
    tasks: Vec<u32>,
    /// Needed by jobs waiting for slots that tasks hold.
    waiting: Vec<u32>,
    up: Vec<bool>,
    lost: Vec<bool>,
    /// Hosts with a slot free for a task, one entry per slot, checked when taken (a job may
    /// have taken the slot since); `queued[h]` entries of host `h`, never fewer than its free
    /// slots and never more than its slots.
    queue: VecDeque<u32>,
    queued: Vec<u32>,
}

impl Slots {
    /// `slots[h]` slots on host `h`, no host up yet.
    pub fn new(slots: Vec<u32>) -> Slots {
        let n = slots.len();
        Slots {
            slots,
            jobs: vec![0; n],
            ending: vec![0; n],
            tasks: vec![0; n],
            waiting: vec![0; n],
            up: vec![false; n],
            lost: vec![false; n],
            queue: VecDeque::new(),
            queued: vec![0; n],
        }
    }

    /// Hosts.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// No hosts.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn usable(&self, h: usize) -> bool {
        self.up[h] && !self.lost[h]
    }

    /// Slots of `h` that a task may take now.
    fn free_for_tasks(&self, h: usize) -> u32 {
        if !self.usable(h) {
            return 0;
        }
        self.slots[h].saturating_sub(self.jobs[h] + self.tasks[h] + self.waiting[h])
    }

    /// Queues `h` once per slot free for tasks that is not queued yet.
    fn top_up(&mut self, h: usize) {
        while self.queued[h] < self.free_for_tasks(h) {
            self.queue.push_back(h as u32);
            self.queued[h] += 1;
        }
    }

    /// Host `h`'s agent is up: its slots are free.
    pub fn host_up(&mut self, h: u32) {
        let h = h as usize;
        if h < self.len() && !self.up[h] && !self.lost[h] {
            self.up[h] = true;
            self.top_up(h);
        }
    }

    /// Hosts `hosts` are lost: none of their slots is taken again.
    pub fn hosts_lost(&mut self, hosts: Range<u32>) {
        for h in hosts {
            if let Some(l) = self.lost.get_mut(h as usize) {
                *l = true;
            }
        }
    }

    /// Whether `h` is up and not lost.
    pub fn is_usable(&self, h: u32) -> bool {
        (h as usize) < self.len() && self.usable(h as usize)
    }

    /// Whether host `h` was lost.
    pub fn is_lost(&self, h: u32) -> bool {
        self.lost.get(h as usize).copied().unwrap_or(false)
    }

    /// Whether a task could take a slot now.
    pub fn has_free_for_task(&mut self) -> bool {
        while let Some(&h) = self.queue.front() {
            if self.free_for_tasks(h as usize) > 0 {
                return true;
            }
            self.queue.pop_front();
            self.queued[h as usize] -= 1;
        }
        false
    }

    /// Whether a task could take a slot now on a host other than `avoid`.
    pub fn has_free_for_task_beside(&mut self, avoid: Option<u32>) -> bool {
        self.has_free_for_task()
            && (self.queue.iter()).any(|&h| Some(h) != avoid && self.free_for_tasks(h as usize) > 0)
    }

    /// `k` slots of one host other than `avoid` for a task: the first host in the queue with
    /// `k` free, or `None`. The host's other queue entries stay: each is checked when taken.
    pub fn take_for_task(&mut self, k: u32, avoid: Option<u32>) -> Option<u32> {
        if !self.has_free_for_task() {
            return None;
        }
        let fits = |h: u32| Some(h) != avoid && self.free_for_tasks(h as usize) >= k;
        let i = self.queue.iter().position(|&h| fits(h))?;
        let h = self.queue.remove(i).expect("found");
        self.queued[h as usize] -= 1;
        self.tasks[h as usize] += k;
        Some(h)
    }

    /// `ranks` ranks of `per_rank` slots each for a task that may span hosts, on as few hosts
    /// as have room for them now (those with room for the most ranks first): each host and
    /// its ranks, or `None` (nothing taken).
    pub fn take_span(&mut self, ranks: u32, per_rank: u32) -> Option<Vec<(u32, u32)>> {
        let per_rank = per_rank.max(1);
        let mut room: Vec<(u32, u32)> = (0..self.len())
            .map(|h| (h as u32, self.free_for_tasks(h) / per_rank))
            .filter(|&(_, r)| r > 0)
            .collect();
        room.sort_by_key(|&(h, r)| (std::cmp::Reverse(r), h));
        let mut left = ranks;
        let mut span = Vec::new();
        for (h, r) in room {
            if left == 0 {
                break;
            }
            let here = r.min(left);
            span.push((h, here));
            left -= here;
        }
        if left > 0 {
            return None;
        }
        for &(h, r) in &span {
            self.tasks[h as usize] += r * per_rank;
        }
        Some(span)
    }

    /// Ranks of `per_rank` slots the hosts not lost hold at most: a task of more can never
    /// run, even spanning hosts.
    pub fn rank_room(&self, per_rank: u32) -> u64 {
        (0..self.len())
            .filter(|&h| !self.lost[h])
            .map(|h| u64::from(self.slots[h] / per_rank.max(1)))
            .sum()
    }

    /// A task of `k` slots on `h` ended: they are free again (for a waiting job first).
    pub fn task_ended(&mut self, h: u32, k: u32) {
        let h = h as usize;
        if let Some(t) = self.tasks.get_mut(h) {
            *t = t.saturating_sub(k);
            self.top_up(h);
        }
    }

    /// The host a task of `k` slots waits for: of the usable hosts with `k` slots, the one
    /// with the most free for tasks (the lowest of equals).
    pub fn most_free(&self, k: u32) -> Option<u32> {
        (0..self.len())
            .filter(|&h| self.usable(h) && self.slots[h] >= k)
            .max_by_key(|&h| (self.free_for_tasks(h), std::cmp::Reverse(h)))
            .map(|h| h as u32)
    }

    /// The most slots a host not lost has: a task needing more can never run.
    pub fn largest(&self) -> u32 {
        (0..self.len())
            .filter(|&h| !self.lost[h])
            .map(|h| self.slots[h])
            .max()
            .unwrap_or(0)
    }

    /// Slots of `h` no running job holds: what a job may ask for there (waiting for tasks or
    /// ending jobs to free them).
    pub fn for_jobs(&self, h: u32) -> u32 {
        let h = h as usize;
        if h >= self.len() || !self.usable(h) {
            return 0;
        }
        (self.slots[h] + self.ending[h]).saturating_sub(self.jobs[h] + self.waiting[h])
    }

    /// Slots of `h` free now: no job, task or waiting job holds them.
    pub fn free_now(&self, h: u32) -> u32 {
        if (h as usize) < self.len() {
            self.free_for_tasks(h as usize)
        } else {
            0
        }
    }

    /// Whether tasks hold any of `need`'s hosts' slots.
    pub fn tasks_on(&self, need: &[(u32, u32)]) -> bool {
        need.iter().any(|&(h, _)| self.tasks[h as usize] > 0)
    }

    /// Whether `need` (host, slots) is free of jobs and tasks now.
    pub fn fits_now(&self, need: &[(u32, u32)]) -> bool {
        need.iter().all(|&(h, n)| {
            let h = h as usize;
            self.usable(h) && self.slots[h].saturating_sub(self.jobs[h] + self.tasks[h]) >= n
        })
    }

    /// A job holds `need` from now on.
    pub fn hold(&mut self, need: &[(u32, u32)]) {
        for &(h, n) in need {
            self.jobs[h as usize] += n;
        }
    }

    /// The job holding `need` is ending: the next job may plan on those slots, and waits
    /// until [`Slots::release`] frees them.
    pub fn ending(&mut self, need: &[(u32, u32)]) {
        for &(h, n) in need {
            self.ending[h as usize] += n;
        }
    }

    /// A job that held `need` ended; `was_ending` if it had been marked [`Slots::ending`].
    pub fn release(&mut self, need: &[(u32, u32)], was_ending: bool) {
        for &(h, n) in need {
            let h = h as usize;
            self.jobs[h] = self.jobs[h].saturating_sub(n);
            if was_ending {
                self.ending[h] = self.ending[h].saturating_sub(n);
            }
            self.top_up(h);
        }
    }

    /// A job waits for `need`: no task takes those slots as they free.
    pub fn wait(&mut self, need: &[(u32, u32)]) {
        for &(h, n) in need {
            self.waiting[h as usize] += n;
        }
    }

    /// A job stopped waiting for `need` (it got the slots, or gave up).
    pub fn stop_waiting(&mut self, need: &[(u32, u32)]) {
        for &(h, n) in need {
            let h = h as usize;
            self.waiting[h] = self.waiting[h].saturating_sub(n);
            self.top_up(h);
        }
    }

    /// Slots held by jobs, and by tasks.
    pub fn held(&self) -> (u32, u32) {
        (self.jobs.iter().sum(), self.tasks.iter().sum())
    }

    /// Slots of the hosts not lost.
    pub fn total(&self) -> u32 {
        (0..self.len())
            .filter(|&h| !self.lost[h])
            .map(|h| self.slots[h])
            .sum()
    }

    /// Hosts lost so far.
    pub fn lost_hosts(&self) -> usize {
        self.lost.iter().filter(|&&l| l).count()
    }

    /// The hosts that could still run something, counted up to `at_most` (the count stops
    /// there: it is asked at every step of a stream): not lost, and up or (until
    /// `launch_over` says none will come up any more) still starting.
    pub fn hosts_left(&self, launch_over: bool, at_most: usize) -> usize {
        (0..self.len())
            .filter(|&h| !self.lost[h] && (self.up[h] || !launch_over))
            .take(at_most)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_up(slots: Vec<u32>) -> Slots {
        let mut s = Slots::new(slots);
        (0..s.len() as u32).for_each(|h| s.host_up(h));
        s
    }

    #[test]
    fn tasks_rotate_over_hosts_and_free_on_end() {
        let mut s = all_up(vec![1, 2]);
        assert_eq!(s.take_for_task(1, None), Some(0));
        assert_eq!(s.take_for_task(1, None), Some(1));
        assert_eq!(s.take_for_task(1, None), Some(1));
        assert_eq!(s.take_for_task(1, None), None);
        s.task_ended(0, 1);
        assert_eq!(s.take_for_task(1, None), Some(0));
        assert_eq!(s.held(), (0, 3));
    }

    #[test]
    fn a_spanning_task_takes_the_fewest_hosts_with_room_or_nothing() {
        let mut s = all_up(vec![4, 4, 8]);
        assert_eq!(s.take_for_task(3, None), Some(0));
        // 2-slot ranks: host 2 has room for 4, host 1 for 2, host 0 for none.
        assert_eq!(s.take_span(5, 2), Some(vec![(2, 4), (1, 1)]));
        assert_eq!(
            s.take_span(2, 2),
            None,
            "one rank's room is left, on host 1"
        );
        assert_eq!(s.held(), (0, 3 + 10));
        s.task_ended(2, 8);
        assert_eq!(s.take_span(4, 2), Some(vec![(2, 4)]));
        assert_eq!(s.rank_room(2), 8);
        s.hosts_lost(2..3);
        assert_eq!(s.rank_room(2), 4);
    }

    #[test]
    fn a_waiting_job_gets_the_slots_tasks_free_and_tasks_get_the_rest() {
        let mut s = all_up(vec![2, 2]);
        for _ in 0..4 {
            s.take_for_task(1, None).unwrap();
        }
        let need = [(0, 2)];
        assert!(!s.fits_now(&need));
        assert_eq!(s.for_jobs(0), 2, "a job may wait for the tasks' slots");
        s.wait(&need);
        assert_eq!(s.for_jobs(0), 0, "a second job waits behind it");
        s.task_ended(0, 1);
        s.task_ended(1, 1);
        // Host 0's slot is the job's, host 1's a task's.
        assert_eq!(s.take_for_task(1, None), Some(1));
        assert_eq!(s.take_for_task(1, None), None);
        s.task_ended(0, 1);
        assert!(s.fits_now(&need));
        s.stop_waiting(&need);
        s.hold(&need);
        assert_eq!(s.take_for_task(1, None), None, "the job holds host 0");
        s.release(&need, false);
        assert_eq!(s.take_for_task(1, None), Some(0));
        assert_eq!(s.take_for_task(1, None), Some(0));
        assert_eq!(s.take_for_task(1, None), None);
    }

    #[test]
    fn a_slot_a_job_took_is_not_given_to_a_task_and_the_queue_stays_bounded() {
        let mut s = all_up(vec![3]);
        for _ in 0..100 {
            s.hold(&[(0, 2)]);
            s.release(&[(0, 2)], false);
        }
        assert!(s.queue.len() <= 3, "{} queued", s.queue.len());
        s.hold(&[(0, 2)]);
        assert_eq!(s.take_for_task(1, None), Some(0));
        assert_eq!(s.take_for_task(1, None), None);
    }

    #[test]
    fn the_next_job_plans_on_an_ending_jobs_slots_and_waits_for_them() {
        let mut s = all_up(vec![2, 2]);
        let (first, second) = ([(0, 2), (1, 1)], [(0, 1)]);
        s.hold(&first);
        assert_eq!((s.for_jobs(0), s.for_jobs(1)), (0, 1));
        s.ending(&first);
        assert_eq!((s.for_jobs(0), s.for_jobs(1)), (2, 2));
        assert!(
            !s.fits_now(&second),
            "still held until the ending job is gone"
        );
        assert!(!s.tasks_on(&second));
        assert_eq!(
            s.take_for_task(1, None),
            Some(1),
            "the slot it never held is a task's"
        );
        s.wait(&second);
        assert_eq!(s.for_jobs(0), 1);
        s.release(&first, true);
        assert!(s.fits_now(&second));
        s.stop_waiting(&second);
        s.hold(&second);
        assert_eq!((s.for_jobs(0), s.for_jobs(1)), (1, 2));
        let mut took = [
            s.take_for_task(1, None),
            s.take_for_task(1, None),
            s.take_for_task(1, None),
        ];
        took.sort();
        assert_eq!(took, [None, Some(0), Some(1)], "one slot left on each host");
    }

    #[test]
    fn lost_hosts_give_nothing_and_strand_the_stream_when_all_are_gone() {
        let mut s = Slots::new(vec![1, 1]);
        s.host_up(0);
        assert_eq!(s.hosts_left(false, 9), 2);
        assert_eq!(s.hosts_left(false, 1), 1, "counted up to 1");
        assert_eq!(s.hosts_left(true, 9), 1, "host 1 will not come up any more");
        s.hosts_lost(0..1);
        assert_eq!(s.take_for_task(1, None), None);
        assert_eq!(s.hosts_left(false, 9), 1, "host 1 may still come up");
        assert_eq!(s.hosts_left(true, 9), 0);
        assert_eq!((s.total(), s.lost_hosts()), (1, 1));
    }
}
