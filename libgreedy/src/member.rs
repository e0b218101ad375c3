//! A session member: its rank and size, the collectives among members, and (on the master,
//! rank 0) the channel to the front end.
//!
//! Members reach each other only through their host's agent: each collective is puts into the
//! job's key-value space, one fence (an allgather over greedy's authenticated overlay, along
//! the greedy tree) and local gets. Nothing listens: the agent's PMI socket is a socketpair the
//! member inherited. Every member must call the same collectives in the same order (a sequence
//! number names each one's keys). A fence waits as long as the agent's fence timeout (300 s
//! under greedyrun) for the slowest member, then the job ends naming the missing hosts.

mod blob;

use std::io::{BufRead, Write};

use greedy_tree::{LaunchModel, Tree};

use crate::channel;
use crate::error::{Error, Result};
use crate::pmi::Pmi1;

pub(crate) use blob::{decode, encode};

/// One member of a session.
#[derive(Debug)]
pub struct Member {
    pmi: Pmi1,
    seq: u64,
}

impl Member {
    /// Joins the session this process was started in (its agent's `PMI_FD`).
    pub fn init() -> Result<Member> {
        Ok(Member {
            pmi: Pmi1::from_env()?,
            seq: 0,
        })
    }

    /// This member's rank, 0 for the master.
    pub fn rank(&self) -> u32 {
        self.pmi.rank
    }

    /// The number of members.
    pub fn size(&self) -> u32 {
        self.pmi.size
    }

    fn next(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Returns once every member called it.
    pub fn barrier(&mut self) -> Result<()> {
        self.next();
        self.pmi.barrier()
    }

    /// `root`'s `data` on every member (the others' `data` is ignored).
    pub fn broadcast(&mut self, root: u32, data: &[u8]) -> Result<Vec<u8>> {
        self.check_root("broadcast", root)?;
        let seq = self.next();
        if self.rank() == root {
            blob::put(&mut self.pmi, seq, root, 0, data)?;
        }
        self.pmi.barrier()?;
        if self.rank() == root {
            return Ok(data.to_vec());
        }
        blob::get(&mut self.pmi, "broadcast", seq, root, 0)
    }

    /// Part `r` of `root`'s `parts` on member `r`; `parts` must hold `size` parts on `root`
    /// and is ignored elsewhere.
    pub fn scatter(&mut self, root: u32, parts: &[Vec<u8>]) -> Result<Vec<u8>> {
        self.check_root("scatter", root)?;
        let (rank, size) = (self.rank(), self.size());
        if rank == root && parts.len() != size as usize {
            // Still take part in the fence, so the others are not left waiting.
            self.pmi.abort(
                1,
                "libgreedy scatter: the root gave the wrong number of parts",
            )?;
            return Err(Error::Usage {
                operation: "scatter",
                why: format!("{} parts for {size} members", parts.len()),
            });
        }
        let seq = self.next();
        if rank == root {
            for (to, part) in parts.iter().enumerate() {
                blob::put(&mut self.pmi, seq, root, to as u32, part)?;
            }
        }
        self.pmi.barrier()?;
        if rank == root {
            return Ok(parts[rank as usize].clone());
        }
        blob::get(&mut self.pmi, "scatter", seq, root, rank)
    }

    /// Every member's `data` in rank order on `root`; `None` on the others.
    pub fn gather(&mut self, root: u32, data: &[u8]) -> Result<Option<Vec<Vec<u8>>>> {
        self.check_root("gather", root)?;
        let seq = self.next();
        let rank = self.rank();
        if rank != root {
            blob::put(&mut self.pmi, seq, rank, 0, data)?;
        }
        self.pmi.barrier()?;
        if rank != root {
            return Ok(None);
        }
        self.collect("gather", seq, data).map(Some)
    }

    /// Every member's `data` in rank order, on every member.
    pub fn allgather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        let (seq, rank) = (self.next(), self.rank());
        blob::put(&mut self.pmi, seq, rank, 0, data)?;
        self.pmi.barrier()?;
        self.collect("allgather", seq, data)
    }

    fn collect(&mut self, operation: &'static str, seq: u64, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let rank = self.rank();
        (0..self.size())
            .map(|r| match r == rank {
                true => Ok(mine.to_vec()),
                false => blob::get(&mut self.pmi, operation, seq, r, 0),
            })
            .collect()
    }

    /// Combines every member's `data` with `merge` up a tree of the members, each level merging
    /// its children's results into its own (so large inputs that merge small never travel
    /// whole); the result on rank 0, `None` elsewhere. Takes one fence per level of the tree.
    pub fn reduce(
        &mut self,
        data: Vec<u8>,
        mut merge: impl FnMut(Vec<u8>, Vec<u8>) -> Vec<u8>,
    ) -> Result<Option<Vec<u8>>> {
        let tree = reduction_tree(self.size() as usize);
        let depths = tree.depths();
        let deepest = depths.iter().copied().max().unwrap_or(0);
        let rank = self.rank() as usize;
        let mut acc = data;
        // Level `d` sends in round `deepest - d`; its parent merges after that round's fence.
        for level in (1..=deepest).rev() {
            let seq = self.next();
            if depths[rank] == level {
                blob::put(&mut self.pmi, seq, rank as u32, 0, &acc)?;
            }
            self.pmi.barrier()?;
            if depths[rank] + 1 == level {
                for child in tree.children(rank).collect::<Vec<_>>() {
                    let theirs = blob::get(&mut self.pmi, "reduce", seq, child as u32, 0)?;
                    acc = merge(acc, theirs);
                }
            }
        }
        Ok((rank == 0).then_some(acc))
    }

    fn check_root(&self, operation: &'static str, root: u32) -> Result<()> {
        if root < self.size() {
            return Ok(());
        }
        Err(Error::Usage {
            operation,
            why: format!("root {root} is not a rank of {} members", self.size()),
        })
    }

    /// Sends `data` to the front end (master only).
    pub fn send_to_front(&self, data: &[u8]) -> Result<()> {
        self.check_master()?;
        let mut out = std::io::stdout().lock();
        channel::write(&mut out, data)
            .and_then(|()| out.flush())
            .map_err(Error::Channel)
    }

    /// The next message the front end sent (master only); blocks until it comes.
    pub fn recv_from_front(&self) -> Result<Vec<u8>> {
        self.check_master()?;
        let mut line = String::new();
        let mut stdin = std::io::stdin().lock();
        let mut reader = channel::Reader::default();
        loop {
            line.clear();
            if stdin.read_line(&mut line).map_err(Error::Channel)? == 0 {
                return Err(Error::SessionEnded(
                    "the front end closed its channel".into(),
                ));
            }
            if let Some(Some(data)) = reader.line(&line) {
                return Ok(data);
            }
        }
    }

    fn check_master(&self) -> Result<()> {
        match self.rank() {
            0 => Ok(()),
            r => Err(Error::NotMaster(r)),
        }
    }

    /// Leaves the session: this member's exit then ends nothing.
    pub fn finalize(self) -> Result<()> {
        self.pmi.finalize()
    }

    /// Ends the whole session with `code`; the front end hears `why` and this member's host.
    pub fn abort(mut self, code: i32, why: &str) -> Result<()> {
        self.pmi.abort(code, why)
    }
}

/// The members' reduction tree: the greedy tree with SEQ = REM, in which a member merges as
/// soon as a child's result is in (a binomial-like tree of depth about log2 of the members).
fn reduction_tree(members: usize) -> Tree {
    let model = LaunchModel::new(1.0, 1.0).expect("SEQ = REM = 1 is a valid model");
    greedy_tree::greedy(members, &model)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reduction_tree_is_shallow() {
        for n in [1, 2, 3, 64, 256, 1000] {
            let tree = reduction_tree(n);
            let deepest = tree.depths().into_iter().max().unwrap();
            assert!(
                (deepest as f64) <= (n as f64).log2().ceil(),
                "{n} members: depth {deepest}"
            );
        }
    }
}
