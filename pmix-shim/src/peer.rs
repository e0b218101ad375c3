//! Who is on the other end of a loopback connection: the check that keeps every process but
//! the job's own ranks out of a node's local endpoints (docs/security.md).
//!
//! PMI-1/PMI-2 need no such check (ranks get an inherited socketpair), but PMIx and Charm++
//! clients can only connect over TCP, and any local user can find a loopback port. The kernel
//! knows who created the client's socket: one exact `NETLINK_SOCK_DIAG` lookup of the client
//! end (source = the peer's address, destination = ours) gives its owner uid and inode, and
//! the connection is admitted only if that uid is the job's and that inode is open in a
//! process of the job: a descendant of the embedder, which forked the ranks (`/proc/<pid>/fd`,
//! walking `/proc/<pid>/task/<tid>/children`, or up the `PPid`s from the user's processes).
//! Everything fails closed: a socket that cannot be found (the client already closed, another
//! network namespace) is refused.
//! (research/endpoint-security.md §5; the same lookup `ss` and oidentd make.)

use std::{
    collections::HashSet,
    io,
    net::{IpAddr, SocketAddr},
};

use netlink_packet_core::{NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_sock_diag::{
    SockDiagMessage,
    constants::{AF_INET, AF_INET6, IPPROTO_TCP},
    inet::{ExtensionFlags, InetRequest, SocketId, StateFlags},
};
use netlink_sys::{Socket, protocols::NETLINK_SOCK_DIAG};

/// The owner of a connection's client socket, as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketOwner {
    /// The uid that created the client's socket.
    pub uid: u32,
    /// The client socket's inode (`socket:[inode]` in its holders' `/proc/<pid>/fd`).
    pub inode: u32,
}

/// Why a connection was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Refused {
    /// The kernel has no established socket for the connection's client end.
    #[error("peer {peer}: no established client socket (closed, or another network namespace)")]
    NoSocket {
        /// The peer's address.
        peer: SocketAddr,
    },
    /// The client socket is held by no process of the job.
    #[error("peer {peer}: socket of uid {} (inode {}) is not held by a rank of this job", owner.uid, owner.inode)]
    NotAJobProcess {
        /// The peer's address.
        peer: SocketAddr,
        /// Who created the socket.
        owner: SocketOwner,
    },
    /// The lookup itself failed.
    #[error("peer {peer}: socket lookup failed: {source}")]
    Lookup {
        /// The peer's address.
        peer: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
}

/// The processes a node's service admits: the embedder's descendants (greedyd's ranks, or
/// the tasks slurmstepd forked for its step) running as the job's user. Not the embedder
/// itself: it is never a client of its own endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobProcesses {
    /// The embedder's pid: every rank descends from it.
    root: u32,
    /// The job's user: a socket of any other uid is refused before `/proc` is read.
    uid: u32,
}

impl JobProcesses {
    /// The descendants of `root` whose sockets belong to `uid`.
    pub fn descendants_of(root: u32, uid: u32) -> JobProcesses {
        JobProcesses { root, uid }
    }

    /// The descendants of this process, of this process's user (an embedder that runs as the
    /// job's user, such as greedyd).
    pub fn of_this_process() -> io::Result<JobProcesses> {
        use std::os::unix::fs::MetadataExt;
        // /proc/self belongs to the process's effective uid.
        let uid = std::fs::metadata("/proc/self")?.uid();
        Ok(JobProcesses::descendants_of(std::process::id(), uid))
    }

    /// Admits the connection from `peer` to our `local` address if its client socket belongs
    /// to the job's user and is open in a descendant of the root (not the root itself).
    /// Blocking: one netlink round trip and a few `/proc` reads; [`JobProcesses::admit_async`]
    /// runs it off the async threads.
    pub fn admit(&self, peer: SocketAddr, local: SocketAddr) -> Result<SocketOwner, Refused> {
        admit_from(&[self.root], self.uid, peer, local)
    }

    /// The pid every admitted process descends from.
    pub fn root(&self) -> u32 {
        self.root
    }

    /// [`JobProcesses::admit`] on tokio's blocking pool.
    pub async fn admit_async(
        &self,
        peer: SocketAddr,
        local: SocketAddr,
    ) -> Result<SocketOwner, Refused> {
        let me = *self;
        tokio::task::spawn_blocking(move || me.admit(peer, local))
            .await
            .unwrap_or_else(|e| {
                Err(Refused::Lookup {
                    peer,
                    source: io::Error::other(e.to_string()),
                })
            })
    }
}

/// Admits the connection from `peer` to `local` if its client socket belongs to `uid` and is
/// open in a descendant of one of `roots` (not a root itself). The children lists of every
/// root are looked at before the slow way round (every process of `uid`, walking up).
fn admit_from(
    roots: &[u32],
    uid: u32,
    peer: SocketAddr,
    local: SocketAddr,
) -> Result<SocketOwner, Refused> {
    let owner = socket_owner(peer, local)
        .map_err(|source| Refused::Lookup { peer, source })?
        .ok_or(Refused::NoSocket { peer })?;
    let target = format!("socket:[{}]", owner.inode);
    let held = |pid: u32| !roots.contains(&pid) && holds(pid, &target);
    // The children lists are fast but may skip a child while others are created or
    // reaped; before refusing one of the job user's sockets, look at every process of
    // that user and walk up from the holder instead.
    if owner.uid == uid
        && (roots.iter().any(|&r| process_tree(r).into_iter().any(held))
            || processes_of(uid)
                .into_iter()
                .any(|pid| held(pid) && roots.iter().any(|&r| descends_from(pid, r))))
    {
        Ok(owner)
    } else {
        Err(Refused::NotAJobProcess { peer, owner })
    }
}

/// The owner of the client end of the TCP connection `peer` → `local`, by an exact
/// `SOCK_DIAG_BY_FAMILY` lookup; `None` if no such established socket exists.
pub fn socket_owner(peer: SocketAddr, local: SocketAddr) -> io::Result<Option<SocketOwner>> {
    let family = match peer.ip() {
        IpAddr::V4(_) => AF_INET,
        IpAddr::V6(_) => AF_INET6,
    };
    let mut header = NetlinkHeader::default();
    // No NLM_F_DUMP: the kernel finds the one socket with this 4-tuple or answers ENOENT.
    header.flags = NLM_F_REQUEST;
    let mut request = NetlinkMessage::new(
        header,
        SockDiagMessage::InetRequest(InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::ESTABLISHED,
            socket_id: SocketId {
                source_port: peer.port(),
                destination_port: local.port(),
                source_address: peer.ip(),
                destination_address: local.ip(),
                interface_id: 0,
                // INET_DIAG_NOCOOKIE: match on the addresses alone.
                cookie: [0xff; 8],
            },
        })
        .into(),
    );
    request.finalize();
    let mut buf = vec![0; request.buffer_len()];
    request.serialize(&mut buf);

    let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
    socket.bind_auto()?;
    socket.connect(&netlink_sys::SocketAddr::new(0, 0))?;
    socket.send(&buf, 0)?;
    let mut reply = vec![0; 8192];
    let n = socket.recv(&mut &mut reply[..], 0)?;
    let message = NetlinkMessage::<SockDiagMessage>::deserialize(&reply[..n])
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    match message.payload {
        NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
            let h = &r.header;
            // A socket in TIME_WAIT or already gone reports inode 0 (and uid 0): not a holder.
            if h.inode == 0 {
                return Ok(None);
            }
            Ok(Some(SocketOwner {
                uid: h.uid,
                inode: h.inode,
            }))
        }
        NetlinkPayload::Error(e) if e.code.is_some() => {
            let err = e.to_io();
            if err.kind() == io::ErrorKind::NotFound {
                Ok(None)
            } else {
                Err(err)
            }
        }
        _ => Ok(None),
    }
}

/// `root` and every live descendant of it, from `/proc/<pid>/task/<tid>/children`.
fn process_tree(root: u32) -> Vec<u32> {
    let mut seen: HashSet<u32> = HashSet::new();
    let mut todo: Vec<u32> = vec![root];
    while let Some(pid) = todo.pop() {
        if !seen.insert(pid) {
            continue;
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            if let Ok(children) = std::fs::read_to_string(task.path().join("children")) {
                todo.extend(
                    children
                        .split_whitespace()
                        .filter_map(|c| c.parse::<u32>().ok()),
                );
            }
        }
    }
    seen.into_iter().collect()
}

/// Every process whose `/proc` entry belongs to `uid`.
fn processes_of(uid: u32) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .parse::<u32>()
                .ok()
                .map(|pid| (pid, e))
        })
        .filter(|(_, e)| e.metadata().is_ok_and(|m| m.uid() == uid))
        .map(|(pid, _)| pid)
        .collect()
}

/// Whether `root` is an ancestor of `pid` (following `PPid` in `/proc/<pid>/stat`).
fn descends_from(mut pid: u32, root: u32) -> bool {
    for _ in 0..256 {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        // "pid (comm) state ppid …": comm may hold anything, so split after its last ')'.
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            return false;
        };
        if ppid == root {
            return true;
        }
        if ppid <= 1 {
            return false;
        }
        pid = ppid;
    }
    false
}

/// Whether process `pid` has a descriptor whose link is `target` (`socket:[inode]`).
fn holds(pid: u32, target: &str) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|l| l.as_os_str().as_encoded_bytes() == target.as_bytes())
    })
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};

    use super::*;

    #[test]
    fn the_kernel_names_the_owner_of_a_loopback_client() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_server, peer) = listener.accept().unwrap();
        let owner = socket_owner(peer, listener.local_addr().unwrap())
            .unwrap()
            .expect("an established socket");
        assert_eq!(owner.uid, nix_uid());
        assert!(holds(
            std::process::id(),
            &format!("socket:[{}]", owner.inode)
        ));
        drop(client);
    }

    #[test]
    fn only_descendants_of_the_root_are_admitted() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let local = listener.local_addr().unwrap();
        // A child process holds the client socket: admitted under this process, refused
        // under a root it does not descend from, or for another uid.
        let mut child = std::process::Command::new("python3")
            .args(["-c", "import socket,sys; s=socket.create_connection(('127.0.0.1', int(sys.argv[1]))); sys.stdin.read()"])
            .arg(local.port().to_string())
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let (_server, peer) = listener.accept().unwrap();
        let me = JobProcesses::of_this_process().unwrap();
        assert_eq!(me.admit(peer, local).unwrap().uid, me.uid);
        let elsewhere = JobProcesses::descendants_of(child.id() + 1_000_000, me.uid);
        assert!(matches!(
            elsewhere.admit(peer, local),
            Err(Refused::NotAJobProcess { .. })
        ));
        let other_user = JobProcesses::descendants_of(me.root, me.uid + 1);
        assert!(matches!(
            other_user.admit(peer, local),
            Err(Refused::NotAJobProcess { .. })
        ));
        drop(child.stdin.take());
        child.wait().unwrap();
    }

    #[test]
    fn the_root_itself_is_not_a_client() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let local = listener.local_addr().unwrap();
        let _client = TcpStream::connect(local).unwrap();
        let (_server, peer) = listener.accept().unwrap();
        let me = JobProcesses::of_this_process().unwrap();
        assert!(matches!(
            me.admit(peer, local),
            Err(Refused::NotAJobProcess { .. })
        ));
        // Under its parent, this process is a descendant like any rank.
        let parent = JobProcesses::descendants_of(std::os::unix::process::parent_id(), me.uid);
        assert!(parent.admit(peer, local).is_ok());
    }

    #[test]
    fn ancestry_follows_ppid() {
        let me = std::process::id();
        assert!(descends_from(me, std::os::unix::process::parent_id()));
        assert!(!descends_from(me, me));
        assert!(processes_of(JobProcesses::of_this_process().unwrap().uid).contains(&me));
    }

    #[test]
    fn a_connection_that_does_not_exist_is_refused() {
        let local: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert!(matches!(
            JobProcesses::of_this_process().unwrap().admit(peer, local),
            Err(Refused::NoSocket { .. })
        ));
    }

    fn nix_uid() -> u32 {
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|u| u.parse().ok())
            .unwrap()
    }
}

/// The job's processes when they descend from several roots: the embedder's, and roots that
/// join while the job runs (the slurmstepd of a step whose tasks are the job's spawned ranks).
#[derive(Debug, Clone)]
pub struct JobTrees {
    first: JobProcesses,
    /// The roots joined since, their processes the job's user's too.
    more: std::sync::Arc<std::sync::Mutex<Vec<u32>>>,
}

impl JobTrees {
    /// The processes of `first` alone, until others join.
    pub fn new(first: JobProcesses) -> JobTrees {
        JobTrees {
            first,
            more: Default::default(),
        }
    }

    /// Admits the descendants of `root` (of the job's user) as well.
    pub fn join(&self, root: u32) {
        self.lock().push(root);
    }

    /// No longer admits the descendants of `root` (unless it is the first's).
    pub fn leave(&self, root: u32) {
        self.lock().retain(|&r| r != root);
    }

    /// [`JobProcesses::admit`] for any of the trees (the job's user is the first's).
    pub fn admit(&self, peer: SocketAddr, local: SocketAddr) -> Result<SocketOwner, Refused> {
        let roots: Vec<u32> = std::iter::once(self.first.root)
            .chain(self.lock().iter().copied())
            .collect();
        admit_from(&roots, self.first.uid, peer, local)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u32>> {
        self.more.lock().unwrap_or_else(|p| p.into_inner())
    }
}
