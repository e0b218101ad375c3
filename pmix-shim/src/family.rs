//! The wire-up families a rank may speak, and how one job is kept to one of them.
//!
//! A node serves every family at once ([`crate::node`]) and each rank picks by speaking one.
//! Ranks of one job must agree: a PMI fence and a PMIx fence cannot meet. Within a node the
//! shared [`crate::departures::Departures`] catches a second family at its first word; across
//! nodes every fence's allgather carries its family ([`allgather`]), so the first collective of
//! a mixed job ends it with a message naming a rank of each family.

use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};

use crate::{AbortInfo, Error, JobSpec, overlay::Overlay};

/// A wire-up protocol family.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Family {
    /// PMI-1 and PMI-2 over the inherited `PMI_FD` (MPICH, Intel MPI, MVAPICH).
    Pmi,
    /// PMIx through libpmix (Open MPI, MPICH or Intel MPI built for PMIx).
    Pmix,
    /// Charm++'s netlrts launcher protocol (what charmrun serves).
    Charm,
}

impl Family {
    /// Every family; a rank that spoke none is handed to the first served, in this order.
    pub const ALL: [Family; 3] = [Family::Pmi, Family::Pmix, Family::Charm];

    /// The byte that marks a node's contribution to a collective of this family.
    fn tag(self) -> u8 {
        match self {
            Family::Pmi => b'I',
            Family::Pmix => b'X',
            Family::Charm => b'C',
        }
    }

    fn from_tag(tag: u8) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.tag() == tag)
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::Pmi => "PMI-1/PMI-2",
            Family::Pmix => "PMIx",
            Family::Charm => "Charm++ netlrts",
        })
    }
}

/// The message that ends a job whose ranks speak two families (`who`, `other`: "rank 3", or
/// with its host).
pub(crate) fn mixed(who: &str, family: Family, other: &str, other_family: Family) -> String {
    format!(
        "{who} speaks {family} while {other} speaks {other_family}: the ranks of one job must \
         use one MPI (or Charm++) library"
    )
}

/// An overlay allgather of one family's fence: every node's blob, by node index, once every
/// node's came from the same family; otherwise the job is aborted, naming the first rank of
/// node 0 and of the first node that differs from it (the same message on every node).
pub(crate) async fn allgather(
    overlay: &Overlay,
    family: Family,
    job: &JobSpec,
    blob: Bytes,
) -> Result<Vec<Bytes>, Error> {
    let mut tagged = BytesMut::with_capacity(blob.len() + 1);
    tagged.put_u8(family.tag());
    tagged.put_slice(&blob);
    let blobs = overlay.allgather(tagged.freeze()).await?;
    match untag(job, blobs) {
        Ok(blobs) => Ok(blobs),
        Err(info) => {
            overlay.abort(info.clone()).await;
            Err(Error::Aborted(info))
        }
    }
}

/// The blobs without their tags, or the abort for nodes that spoke different families.
fn untag(job: &JobSpec, blobs: Vec<Bytes>) -> Result<Vec<Bytes>, AbortInfo> {
    let tag_of = |blob: &Bytes| blob.first().copied().and_then(Family::from_tag);
    let who = |node: usize| {
        let host = job.hosts.get(node).map_or("?", String::as_str);
        match job.ranks.get(node).and_then(|r| r.first()) {
            Some(rank) => format!("rank {rank} on {host}"),
            None => format!("node {node} ({host})"),
        }
    };
    let first = blobs.first().and_then(tag_of);
    if let Some(node) = blobs
        .iter()
        .position(|b| tag_of(b).is_none() || tag_of(b) != first)
    {
        let reason = match (first, tag_of(&blobs[node])) {
            (Some(f0), Some(f)) => mixed(&who(0), f0, &who(node), f),
            _ => format!(
                "{} sent a fence this node cannot read",
                who(if first.is_none() { 0 } else { node })
            ),
        };
        return Err(AbortInfo::new(
            job.node_idx,
            job.ranks.get(node).and_then(|r| r.first()).copied(),
            1,
            reason,
        ));
    }
    Ok(blobs.into_iter().map(|mut b| b.split_off(1)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JobSecret;

    fn job() -> JobSpec {
        JobSpec {
            job_id: "7.0".into(),
            hosts: vec!["n1".into(), "n2".into(), "n3".into()],
            node_idx: 0,
            model: greedy_tree::LaunchModel::new(1.0, 1.0).unwrap(),
            ranks: vec![vec![0, 1], vec![2, 3], vec![4]],
            secret: JobSecret::from_bytes(&[1; 16]).unwrap(),
        }
    }

    fn tagged(family: Family, body: &[u8]) -> Bytes {
        let mut b = vec![family.tag()];
        b.extend_from_slice(body);
        Bytes::from(b)
    }

    #[test]
    fn one_family_strips_its_tags() {
        let blobs = vec![
            tagged(Family::Pmi, b"a"),
            tagged(Family::Pmi, b""),
            tagged(Family::Pmi, b"cc"),
        ];
        let got = untag(&job(), blobs).unwrap();
        assert_eq!(got, [&b"a"[..], b"", b"cc"]);
    }

    #[test]
    fn a_node_of_another_family_names_a_rank_of_each() {
        let blobs = vec![
            tagged(Family::Pmi, b"a"),
            tagged(Family::Pmi, b""),
            tagged(Family::Pmix, b"x"),
        ];
        let info = untag(&job(), blobs).unwrap_err();
        assert_eq!(info.rank, Some(4));
        assert!(
            info.reason
                .starts_with("rank 0 on n1 speaks PMI-1/PMI-2 while rank 4 on n3 speaks PMIx"),
            "{}",
            info.reason
        );
        let garbage = vec![tagged(Family::Pmi, b"a"), Bytes::new(), Bytes::new()];
        let info = untag(&job(), garbage).unwrap_err();
        assert!(
            info.reason.starts_with("rank 2 on n2 sent a fence"),
            "{}",
            info.reason
        );
    }
}
