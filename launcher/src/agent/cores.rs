//! Which of this host's cores (or packages, with `--bind-to socket`) a stream's tasks hold:
//! a task of k cores takes the k least used, lowest first, and is bound to their CPUs until
//! it ends; a job task's ranks here each take theirs, held by the job. Sans I/O.
//!
//! With no more slots than cores no two running tasks share a core; with more, the load
//! spreads evenly.

use std::collections::HashMap;

/// Who holds cores: a task (by its process group) or a session's job (a job task's ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Holder {
    /// A task, by its process group.
    Task(u32),
    /// A session's job, by its number.
    Job(u32),
}

/// The cores of this host and the tasks holding them.
#[derive(Debug)]
pub(crate) struct TaskCores {
    /// The CPUs of each core.
    cpus: Vec<Vec<u32>>,
    /// Running tasks on each core.
    users: Vec<u32>,
    /// The cores of each holder.
    held: HashMap<Holder, Vec<usize>>,
}

impl TaskCores {
    /// Cores with these CPUs, none held; no cores: tasks run unbound.
    pub(crate) fn new(cpus: Vec<Vec<u32>>) -> TaskCores {
        let users = vec![0; cpus.len()];
        TaskCores {
            cpus,
            users,
            held: HashMap::new(),
        }
    }

    /// The `k` least used cores (lowest first): their indices and their CPUs, in order;
    /// `None` when tasks run unbound.
    pub(crate) fn pick(&self, k: u32) -> Option<(Vec<usize>, Vec<u32>)> {
        if self.cpus.is_empty() {
            return None;
        }
        let mut order: Vec<usize> = (0..self.cpus.len()).collect();
        order.sort_by_key(|&c| (self.users[c], c));
        let mut cores: Vec<usize> = order.into_iter().take(k as usize).collect();
        cores.sort_unstable();
        let mut cpus: Vec<u32> = cores.iter().flat_map(|&c| self.cpus[c].clone()).collect();
        cpus.sort_unstable();
        cpus.dedup();
        Some((cores, cpus))
    }

    /// `who` runs on `cores` (from [`TaskCores::pick`]) too, until [`TaskCores::release`].
    pub(crate) fn hold(&mut self, who: Holder, cores: Vec<usize>) {
        for &c in &cores {
            self.users[c] += 1;
        }
        self.held.entry(who).or_default().extend(cores);
    }

    /// `who` ended: its cores are free of it.
    pub(crate) fn release(&mut self, who: Holder) {
        for c in self.held.remove(&who).unwrap_or_default() {
            self.users[c] = self.users[c].saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four cores of two hardware threads each.
    fn four() -> TaskCores {
        TaskCores::new((0..4).map(|c| vec![c, c + 4]).collect())
    }

    #[test]
    fn tasks_take_free_cores_first_and_give_them_back() {
        let mut t = four();
        let (a, cpus) = t.pick(2).unwrap();
        assert_eq!((a.clone(), cpus), (vec![0, 1], vec![0, 1, 4, 5]));
        t.hold(Holder::Task(100), a);
        let (b, _) = t.pick(1).unwrap();
        assert_eq!(b, [2]);
        t.hold(Holder::Job(100), b);
        assert_eq!(t.pick(1).unwrap().0, [3]);
        t.release(Holder::Task(100));
        assert_eq!(t.pick(2).unwrap().0, [0, 1]);
        t.release(Holder::Task(100)); // twice: nothing more
        assert_eq!(t.users, [0, 0, 1, 0]);
    }

    #[test]
    fn a_jobs_ranks_hold_cores_together_until_it_ends() {
        let mut t = four();
        for _ in 0..3 {
            let (cores, _) = t.pick(1).unwrap();
            t.hold(Holder::Job(7), cores);
        }
        assert_eq!(t.users, [1, 1, 1, 0]);
        assert_eq!(t.pick(1).unwrap().0, [3], "a task takes the free core");
        t.release(Holder::Job(7));
        assert_eq!(t.users, [0, 0, 0, 0]);
    }

    #[test]
    fn with_more_tasks_than_cores_the_load_spreads() {
        let mut t = four();
        for pgid in 0..6 {
            let (cores, _) = t.pick(1).unwrap();
            t.hold(Holder::Task(pgid), cores);
        }
        assert_eq!(t.users, [2, 2, 1, 1]);
        // A task wider than the host takes every core once.
        assert_eq!(t.pick(9).unwrap().0, [0, 1, 2, 3]);
        assert_eq!(TaskCores::new(Vec::new()).pick(1), None, "unbound");
    }
}
