//! The session's slots, the jobs that hold or wait for them, and where their frames go.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    ops::Range,
    sync::{Arc, Mutex},
};

use tokio::sync::Notify;

use super::{
    names::NameDesk,
    queue::{JobFrames, JobQueue, job_queue},
};
use crate::{
    proto::{Start, TaskJob, Up},
    slots::Slots,
};

/// A job the session runs: its hosts (session host of each job host), its client's queue,
/// and what `--status` says of it.
struct Entry {
    nodes: Vec<u32>,
    up: JobQueue,
    what: String,
    /// Its client left with the verdict ([`crate::proto::ToSession::Detach`]): its hosts are shutting down.
    ending: bool,
}

/// The slots a stream's task took for its job (each host and how many), and what it brings.
struct Claim {
    slots: Vec<(u32, u32)>,
    task: TaskJob,
}

/// What the session knows of its hosts' slots and the jobs on them.
struct Board {
    slots: Slots,
    next: u32,
    jobs: HashMap<u32, Entry>,
    /// Jobs waiting for slots that tasks hold, first come first served, with what they need.
    queue: VecDeque<(u32, Vec<(u32, u32)>)>,
    /// Jobs that got their slots and have not picked them up yet ([`JobBoard::admitted`]).
    admitted: HashSet<u32>,
    /// Jobs that will never get their slots, and why.
    refused: HashMap<u32, String>,
    /// Slots a stream's task took for a job of its own (a task of several ranks or of MPI),
    /// by claim: the job its client starts runs in them ([`JobBoard::reserve_claimed`]).
    claims: HashMap<u64, Claim>,
    next_claim: u64,
}

impl Board {
    /// Lets waiting jobs in, in order, while their slots are free; refuses those that need a
    /// lost host. Whether any changed.
    fn admit_waiting(&mut self, hosts: &[String]) -> bool {
        let mut changed = false;
        while let Some((job, need)) = self.queue.front() {
            let (job, need) = (*job, need.clone());
            if let Some(&(h, _)) = need.iter().find(|(h, _)| self.slots.is_lost(*h)) {
                let host = &hosts[h as usize];
                self.refused
                    .insert(job, format!("{host}, where it waited for slots, was lost"));
            } else if self.slots.fits_now(&need) {
                self.slots.hold(&need);
                self.admitted.insert(job);
            } else {
                break;
            }
            self.queue.pop_front();
            self.slots.stop_waiting(&need);
            changed = true;
        }
        changed
    }
}

/// A job the session took: its number, the session host of each job host, the slots it
/// needs there, and whether it waits for tasks to free them.
#[derive(Debug)]
pub(crate) struct Ticket {
    pub(super) job: u32,
    /// The job's namespace (its job id).
    nspace: String,
    pub(super) nodes: Vec<u32>,
    need: Vec<(u32, u32)>,
    pub(super) waits: bool,
    /// A stream task's job: what its task brings.
    pub(super) task: Option<TaskJob>,
}

/// The session's slots, the jobs that hold or wait for them, and where the jobs' frames go.
/// Shared by the session's loop (hosts up and lost, tasks, frames from the tree) and each
/// job's [`super::serve::serve_job`].
pub struct JobBoard {
    hosts: Vec<String>,
    inner: Mutex<Board>,
    /// Told when waiting jobs were let in or refused.
    changed: Notify,
    /// The name table every job on the session shares.
    names: Mutex<NameDesk>,
}

impl JobBoard {
    /// A board for the session's hosts with these slots, no host up yet.
    pub fn new(hosts: Vec<String>, slots: Vec<u32>) -> Arc<JobBoard> {
        Arc::new(JobBoard {
            hosts,
            inner: Mutex::new(Board {
                slots: Slots::new(slots),
                next: 1,
                jobs: HashMap::new(),
                queue: VecDeque::new(),
                admitted: HashSet::new(),
                refused: HashMap::new(),
                claims: HashMap::new(),
                next_claim: 1,
            }),
            changed: Notify::new(),
            names: Mutex::default(),
        })
    }

    /// The session's name table.
    pub(crate) fn names(&self) -> std::sync::MutexGuard<'_, NameDesk> {
        // Each request is one update of the table: a poisoned lock still holds a whole one.
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn board(&self) -> std::sync::MutexGuard<'_, Board> {
        // A panic elsewhere cannot leave the counts half-written: each update is one store.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the board, then lets waiting jobs in if their slots are now free.
    fn update<T>(&self, f: impl FnOnce(&mut Board) -> T) -> T {
        let (out, changed) = {
            let mut b = self.board();
            let out = f(&mut b);
            (out, b.admit_waiting(&self.hosts))
        };
        if changed {
            self.changed.notify_waiters();
        }
        out
    }

    /// `node`'s agent said hello.
    pub fn host_up(&self, node: u32) {
        self.board().slots.host_up(node);
    }

    /// `k` slots of one host other than `avoid` for a task: its host, or `None`.
    pub fn take_task_slots(&self, k: u32, avoid: Option<u32>) -> Option<u32> {
        self.board().slots.take_for_task(k, avoid)
    }

    /// Whether a task could take a slot now on a host other than `avoid`.
    pub fn has_free_task_slot_beside(&self, avoid: Option<u32>) -> bool {
        self.board().slots.has_free_for_task_beside(avoid)
    }

    /// The host a task of `k` slots waits for ([`Slots::most_free`]).
    pub fn most_free_host(&self, k: u32) -> Option<u32> {
        self.board().slots.most_free(k)
    }

    /// A task of `k` slots on `node` ended: they go to a job waiting for them, else to the
    /// next task.
    pub fn task_ended(&self, node: u32, k: u32) {
        self.update(|b| b.slots.task_ended(node, k));
    }

    /// The slots a task took (each host and how many) are for a job its client starts, with
    /// what the task brings: the claim that job names.
    pub fn claim(&self, slots: Vec<(u32, u32)>, task: TaskJob) -> u64 {
        let mut b = self.board();
        let claim = b.next_claim;
        b.next_claim += 1;
        b.claims.insert(claim, Claim { slots, task });
        claim
    }

    /// `ranks` ranks of `per_rank` slots each for a task, spanning the fewest hosts with room
    /// ([`Slots::take_span`]).
    pub fn take_task_span(&self, ranks: u32, per_rank: u32) -> Option<Vec<(u32, u32)>> {
        self.board().slots.take_span(ranks, per_rank)
    }

    /// Ranks of `per_rank` slots the hosts not lost hold at most ([`Slots::rank_room`]).
    pub fn rank_room(&self, per_rank: u32) -> u64 {
        self.board().slots.rank_room(per_rank)
    }

    /// The task of `claim` ended: its job, if it never came, cannot take the slots any more.
    pub fn unclaim(&self, claim: u64) {
        self.board().claims.remove(&claim);
    }

    /// Whether `node` is up and not lost.
    pub fn usable(&self, node: u32) -> bool {
        self.board().slots.is_usable(node)
    }

    /// The most slots a host not lost has.
    pub fn largest_host(&self) -> u32 {
        self.board().slots.largest()
    }

    /// Slots of the hosts not lost; hosts lost.
    pub fn capacity(&self) -> (u32, usize) {
        let b = self.board();
        (b.slots.total(), b.slots.lost_hosts())
    }

    /// Hosts left that could run anything, up to `at_most` ([`Slots::hosts_left`]).
    pub fn hosts_left(&self, launch_over: bool, at_most: usize) -> usize {
        self.board().slots.hosts_left(launch_over, at_most)
    }

    /// The session lost `nodes` (a subtree): no job gets them again, and each job on them is
    /// told it lost those hosts (an `Up::Lost` in its own numbering, on its queue).
    pub async fn hosts_lost(&self, nodes: Range<u32>, what: &str) {
        let told: Vec<(JobQueue, Vec<u32>)> = self.update(|b| {
            b.slots.hosts_lost(nodes.clone());
            (b.jobs.values())
                .map(|e| {
                    let lost = (e.nodes.iter().enumerate())
                        .filter(|(_, n)| nodes.contains(n))
                        .map(|(i, _)| i as u32);
                    (e.up.clone(), lost.collect())
                })
                .collect()
        });
        for (queue, lost) in told {
            for node in lost {
                let what = format!("the session lost this host: {what}");
                queue.push(Up::Lost {
                    node,
                    by: None,
                    what,
                });
            }
        }
    }

    /// Where frames of `job` go, if it runs.
    pub fn queue_of(&self, job: u32) -> Option<JobQueue> {
        self.board().jobs.get(&job).map(|e| e.up.clone())
    }

    /// The ending jobs on `ticket`'s hosts.
    pub(super) fn ending_on(&self, ticket: &Ticket) -> Vec<u32> {
        let b = self.board();
        let mut jobs: Vec<u32> = (b.jobs.iter())
            .filter(|(_, e)| e.ending && e.nodes.iter().any(|n| ticket.nodes.contains(n)))
            .map(|(&j, _)| j)
            .collect();
        jobs.sort();
        jobs
    }

    /// Whether tasks hold slots on `ticket`'s hosts.
    pub(super) fn tasks_hold(&self, ticket: &Ticket) -> bool {
        self.board().slots.tasks_on(&ticket.need)
    }

    /// Jobs running, the slots they hold, and jobs waiting for slots.
    pub fn running(&self) -> (usize, u32, usize) {
        let b = self.board();
        (b.jobs.len(), b.slots.held().0, b.queue.len())
    }

    /// One line per running job, in the order they started.
    pub fn describe(&self) -> Vec<String> {
        let b = self.board();
        let mut jobs: Vec<(&u32, &Entry)> = b.jobs.iter().collect();
        jobs.sort_by_key(|(job, _)| **job);
        (jobs.into_iter())
            .map(|(_, e)| match e.ending {
                true => format!("{} (ending)", e.what),
                false => e.what.clone(),
            })
            .collect()
    }

    /// The hosts that are up and not lost, with the slots no job holds or waits for (a job
    /// may have those, waiting for the tasks in them to end).
    pub(super) fn free(&self) -> Vec<(String, u32)> {
        let b = self.board();
        (0..self.hosts.len() as u32)
            .filter(|&i| b.slots.is_usable(i))
            .map(|i| (self.hosts[i as usize].clone(), b.slots.for_jobs(i)))
            .collect()
    }

    /// Takes the slots `start`'s ranks need on the session's hosts of those names, or queues
    /// the job for the slots that tasks hold; or says why it can never have them.
    pub(crate) fn reserve(&self, start: &Start) -> Result<Ticket, String> {
        let mut b = self.board();
        let mut nodes: Vec<u32> = Vec::with_capacity(start.hosts.len());
        for (host, ranks) in start.hosts.iter().zip(&start.ranks) {
            let need = ranks.len() as u32;
            let mut named = false;
            let found = (0..self.hosts.len()).find(|&i| {
                let ours = self.hosts[i] == *host && !nodes.contains(&(i as u32));
                named |= ours;
                ours && b.slots.for_jobs(i as u32) >= need
            });
            match found {
                Some(i) => nodes.push(i as u32),
                None if !named => {
                    return Err(format!(
                        "{host} is not one of the session's hosts (unset GREEDY_SESSION to launch there afresh)"
                    ));
                }
                None => {
                    return Err(format!(
                        "{host} has fewer than the {need} free slots the job needs there (jobs running on the session hold the others, or the host is lost)"
                    ));
                }
            }
        }
        let job = b.next;
        b.next += 1;
        let need: Vec<(u32, u32)> = (nodes.iter().zip(&start.ranks))
            .map(|(&n, ranks)| (n, ranks.len() as u32))
            .collect();
        let waits = !b.queue.is_empty() || !b.slots.fits_now(&need);
        if waits {
            b.slots.wait(&need);
            b.queue.push_back((job, need.clone()));
        } else {
            b.slots.hold(&need);
            b.admitted.insert(job);
        }
        Ok(Ticket {
            job,
            nspace: start.job_id.clone(),
            nodes,
            need,
            waits,
            task: None,
        })
    }

    /// Takes `start`'s job into the slots of task claim `claim` (once): each of its hosts one
    /// of the claim's, with no more ranks than the task took slots there. The slots stay the
    /// task's (it frees them when its client ends), so the ticket holds none.
    pub(crate) fn reserve_claimed(&self, start: &Start, claim: u64) -> Result<Ticket, String> {
        let mut b = self.board();
        let Some(Claim { slots: held, task }) = b.claims.remove(&claim) else {
            return Err(format!(
                "no task of the session holds slots under claim {claim}"
            ));
        };
        let mut nodes: Vec<u32> = Vec::with_capacity(held.len());
        for (host, ranks) in start.hosts.iter().zip(&start.ranks) {
            let fits = held.iter().find(|&&(n, k)| {
                self.hosts[n as usize] == *host && !nodes.contains(&n) && ranks.len() <= k as usize
            });
            let Some(&(n, _)) = fits else {
                return Err(format!(
                    "the job's {} ranks on {host} are not in the slots its task took",
                    ranks.len()
                ));
            };
            nodes.push(n);
        }
        let job = b.next;
        b.next += 1;
        b.admitted.insert(job);
        Ok(Ticket {
            job,
            nspace: start.job_id.clone(),
            nodes,
            need: Vec::new(),
            waits: false,
            task: Some(task),
        })
    }

    /// Once `ticket`'s job has its slots: its queue of frames (it runs from now on), or why it
    /// will never have them.
    pub(crate) async fn admitted(
        &self,
        ticket: &Ticket,
        start: &Start,
    ) -> Result<JobFrames, String> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut b = self.board();
                if let Some(why) = b.refused.remove(&ticket.job) {
                    return Err(why);
                }
                if b.admitted.remove(&ticket.job) {
                    let (tx, rx) = job_queue();
                    let ranks: usize = start.ranks.iter().map(Vec::len).sum();
                    let what = format!(
                        "job {} ({}): {ranks} ranks on {}, {}",
                        ticket.job,
                        start.job_id,
                        greedy_tree::hostlist::compress(&start.hosts),
                        start.apps[0].argv.join(" ")
                    );
                    let nodes = ticket.nodes.clone();
                    b.jobs.insert(
                        ticket.job,
                        Entry {
                            nodes,
                            up: tx,
                            what,
                            ending: false,
                        },
                    );
                    return Ok(rx);
                }
            }
            changed.await;
        }
    }

    /// `ticket`'s job will not run (its client went away while it waited): what it held or
    /// waited for is free.
    pub(crate) fn give_up(&self, ticket: &Ticket) {
        self.update(|b| {
            if b.admitted.remove(&ticket.job) {
                b.slots.release(&ticket.need, false);
            } else if let Some(i) = b.queue.iter().position(|(j, _)| *j == ticket.job) {
                b.queue.remove(i);
                b.slots.stop_waiting(&ticket.need);
            }
            b.refused.remove(&ticket.job);
        });
    }

    /// `ticket`'s job is ending (every rank ended, its client left): the next job may plan on
    /// its slots, and waits for them.
    pub(crate) fn ending(&self, ticket: &Ticket) {
        self.update(|b| {
            if let Some(e) = b.jobs.get_mut(&ticket.job)
                && !e.ending
            {
                e.ending = true;
                b.slots.ending(&ticket.need);
            }
        });
    }

    /// Places spawned child `apps` of `ticket`'s job on the slots of its hosts that are free
    /// now ([`crate::children::place`]); they are the job's from now on, until it ends. The
    /// ranks on each of the job's hosts, or why not.
    pub(crate) fn place_child(
        &self,
        ticket: &mut Ticket,
        apps: &[greedy_pmix::child::SpawnApp],
        oversubscribe: bool,
    ) -> Result<Vec<Vec<u32>>, String> {
        let mut b = self.board();
        let names: Vec<String> = (ticket.nodes.iter())
            .map(|&n| self.hosts[n as usize].clone())
            .collect();
        let free: Vec<u32> = ticket.nodes.iter().map(|&n| b.slots.free_now(n)).collect();
        let ranks = crate::children::place(apps, &names, &free, oversubscribe)?;
        let need: Vec<(u32, u32)> = (ticket.nodes.iter().zip(&ranks))
            .filter(|(_, r)| !r.is_empty())
            .map(|(&n, r)| (n, r.len() as u32))
            .collect();
        b.slots.hold(&need);
        ticket.need.extend(need);
        Ok(ranks)
    }

    /// `ticket`'s job ended: its slots are free again, and the names it published gone.
    pub(crate) fn release(&self, ticket: &Ticket) {
        self.names().job_ended(&ticket.nspace);
        self.update(|b| {
            if let Some(e) = b.jobs.remove(&ticket.job) {
                b.slots.release(&ticket.need, e.ending);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{App, BindTo, PROTOCOL_VERSION, PmiMode};
    use std::time::Duration;

    /// A job of `ranks[i]` ranks on `hosts[i]`.
    fn job(hosts: &[&str], ranks: &[u32]) -> Start {
        let mut next = 0;
        let ranks = ranks
            .iter()
            .map(|&k| {
                next += k;
                (next - k..next).collect()
            })
            .collect();
        Start {
            version: PROTOCOL_VERSION,
            job_id: "j".into(),
            node_idx: 0,
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            ranks,
            launch_sizes: vec![1],
            apps: vec![App {
                first_rank: 0,
                argv: vec!["true".into()],
            }],
            env: vec![],
            cwd: "/".into(),
            rsh: vec![],
            agent: vec![],
            batch: 1,
            retries: 0,
            hello_timeout_s: 1.0,
            grace_s: 1.0,
            lost_after_s: 0.0,
            model: greedy_tree::LaunchModel::new(0.01, 0.1).unwrap(),
            pmi: PmiMode::Auto,
            secret: greedy_pmix::JobSecret::generate(),
            stdin_rank: None,
            bind: BindTo::None,
            log: String::new(),
            tasks: false,
            unbuffered: false,
            universe: 0,
            bcast: Vec::new(),
        }
    }

    /// The job's queue once the board let it in.
    fn queue(board: &JobBoard, t: &Ticket, start: &Start) -> JobFrames {
        futures_util::FutureExt::now_or_never(board.admitted(t, start))
            .expect("admitted at once")
            .unwrap()
    }

    #[test]
    fn a_jobs_children_take_free_slots_of_its_hosts_until_it_ends() {
        let board = JobBoard::new(vec!["a".into(), "b".into(), "c".into()], vec![2, 2, 2]);
        (0..3).for_each(|i| board.host_up(i));
        let start = job(&["c", "a"], &[1, 1]);
        let mut t = board.reserve(&start).unwrap();
        let _q = queue(&board, &t, &start);
        let app = |maxprocs| greedy_pmix::child::SpawnApp {
            program: "p".into(),
            args: vec![],
            maxprocs,
            env: vec![],
            cwd: None,
            hosts: vec![],
            path: None,
        };
        // In the job's host order (c, then a), never on b.
        assert_eq!(
            board.place_child(&mut t, &[app(2)], false),
            Ok(vec![vec![0], vec![1]])
        );
        assert_eq!(board.running(), (1, 4, 0));
        let e = board.place_child(&mut t, &[app(1)], false).unwrap_err();
        assert!(
            e.starts_with("no free slots: asked 1, free 0 (hosts c:0,a:0)"),
            "{e}"
        );
        assert_eq!(
            board.place_child(&mut t, &[app(1)], true),
            Ok(vec![vec![0], vec![]])
        );
        board.release(&t);
        assert_eq!(board.running(), (0, 0, 0));
    }

    #[test]
    fn jobs_hold_disjoint_slots_until_released() {
        let board = JobBoard::new(vec!["a".into(), "b".into(), "c".into()], vec![2, 2, 2]);
        assert!(board.free().is_empty(), "no host up yet");
        (0..3).for_each(|i| board.host_up(i));
        let first = job(&["a", "b"], &[2, 2]);
        let t1 = board.reserve(&first).unwrap();
        assert!(!t1.waits);
        assert_eq!(t1.nodes, [0, 1]);
        let _q1 = queue(&board, &t1, &first);
        assert_eq!(board.running(), (1, 4, 0));
        assert_eq!(
            board.free(),
            [("a".into(), 0), ("b".into(), 0), ("c".into(), 2)]
        );
        let e = board.reserve(&job(&["a"], &[1])).unwrap_err();
        assert!(e.contains("a has fewer than the 1 free slots"), "{e}");
        let e = board.reserve(&job(&["z"], &[1])).unwrap_err();
        assert!(e.contains("z is not one of the session's hosts"), "{e}");
        let second = job(&["c"], &[2]);
        let t2 = board.reserve(&second).unwrap();
        let _q2 = queue(&board, &t2, &second);
        assert_eq!(
            board.describe(),
            [
                format!("job {} (j): 4 ranks on a,b, true", t1.job),
                format!("job {} (j): 2 ranks on c, true", t2.job)
            ]
        );
        assert_eq!(t2.nodes, [2]);
        assert_ne!(t1.job, t2.job);
        board.release(&t1);
        assert_eq!(board.running(), (1, 2, 0));
        assert!(board.queue_of(t1.job).is_none());
    }

    #[tokio::test]
    async fn the_next_job_waits_quietly_for_an_ending_jobs_slots() {
        let board = JobBoard::new(vec!["a".into()], vec![2]);
        board.host_up(0);
        let first = job(&["a"], &[2]);
        let t1 = board.reserve(&first).unwrap();
        let _q1 = queue(&board, &t1, &first);
        board.ending(&t1);
        assert_eq!(board.free(), [("a".into(), 2)], "planned on as if free");
        assert_eq!(
            board.describe(),
            [format!("job {} (j): 2 ranks on a, true (ending)", t1.job)]
        );
        let t2 = board.reserve(&first).unwrap();
        assert!(t2.waits && !board.tasks_hold(&t2), "waits, for no task");
        assert_eq!(board.ending_on(&t2), [t1.job]);
        let waiter = {
            let (board, start) = (board.clone(), first.clone());
            tokio::spawn(async move { board.admitted(&t2, &start).await.is_ok() })
        };
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "the ending job still holds the slots"
        );
        board.release(&t1);
        assert!(waiter.await.unwrap());
        assert_eq!(board.running(), (1, 2, 0));
    }

    #[tokio::test]
    async fn a_job_waits_for_the_slots_of_tasks_which_take_none_of_them_meanwhile() {
        let board = JobBoard::new(vec!["a".into(), "b".into()], vec![2, 1]);
        (0..2).for_each(|i| board.host_up(i));
        let on: Vec<u32> = (0..3)
            .map(|_| board.take_task_slots(1, None).unwrap())
            .collect();
        assert_eq!(on, [0, 0, 1], "a task stream fills every slot");
        // A job asks for a's two slots: the tasks hold them, so it waits.
        assert_eq!(board.free(), [("a".into(), 2), ("b".into(), 1)]);
        let start = job(&["a"], &[2]);
        let t = board.reserve(&start).unwrap();
        assert!(t.waits);
        assert_eq!(board.running(), (0, 0, 1));
        let waiter = {
            let board = board.clone();
            let start = start.clone();
            tokio::spawn(async move {
                let t = t;
                board.admitted(&t, &start).await.map(|_| t)
            })
        };
        // Slots freed on a go to the job, not to the next task; b's to the next task.
        board.task_ended(0, 1);
        board.task_ended(1, 1);
        assert_eq!(board.take_task_slots(1, None), Some(1));
        assert_eq!(board.take_task_slots(1, None), None);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "one of a's slots is still a task's");
        board.task_ended(0, 1);
        let t = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("let in once both slots were free")
            .unwrap()
            .unwrap();
        assert_eq!(board.running(), (1, 2, 0));
        assert_eq!(board.take_task_slots(1, None), None, "the job holds a");
        board.release(&t);
        assert_eq!(board.take_task_slots(1, None), Some(0));
    }

    #[test]
    fn a_waiting_job_that_gives_up_or_loses_its_host_frees_what_it_waited_for() {
        let board = JobBoard::new(vec!["a".into(), "b".into()], vec![1, 1]);
        (0..2).for_each(|i| board.host_up(i));
        assert_eq!(board.take_task_slots(1, None), Some(0));
        let start = job(&["a"], &[1]);
        let t = board.reserve(&start).unwrap();
        assert!(t.waits);
        board.give_up(&t);
        board.task_ended(0, 1);
        assert_eq!(board.take_task_slots(1, None), Some(1));
        assert_eq!(
            board.take_task_slots(1, None),
            Some(0),
            "nobody waits for a any more"
        );
        let t = board.reserve(&start).unwrap();
        futures_util::FutureExt::now_or_never(board.hosts_lost(0..1, "shell ended"))
            .expect("no job to tell");
        let why = futures_util::FutureExt::now_or_never(board.admitted(&t, &start))
            .expect("answered at once")
            .unwrap_err();
        assert!(
            why.contains("a, where it waited for slots, was lost"),
            "{why}"
        );
        assert_eq!(board.running(), (0, 0, 0));
    }

    #[test]
    fn a_lost_host_is_lost_to_the_jobs_on_it_and_to_later_ones() {
        let board = JobBoard::new(vec!["a".into(), "b".into(), "c".into()], vec![1, 1, 1]);
        (0..3).for_each(|i| board.host_up(i));
        let start = job(&["b", "c"], &[1, 1]);
        let t = board.reserve(&start).unwrap();
        let mut q = queue(&board, &t, &start);
        futures_util::FutureExt::now_or_never(board.hosts_lost(2..3, "shell ended"))
            .expect("room on the job's queue");
        assert!(
            matches!(q.rx.try_recv(), Ok(Up::Lost { node: 1, by: None, what }) if what.contains("shell ended"))
        );
        assert!(
            q.rx.try_recv().is_err(),
            "the job is told once, of its one lost host"
        );
        assert_eq!(board.free(), [("a".into(), 1), ("b".into(), 0)]);
        assert!(board.reserve(&job(&["c"], &[1])).is_err());
    }
}
