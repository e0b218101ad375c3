//! A PMI-1 client over the socketpair the local agent gave this process (`PMI_FD`): the
//! members' only way to the overlay. PMI-1 because every greedy embedder serves it (greedyd,
//! `mpi_greedy.so` in slurmstepd), needs no listener, and costs the agent no libpmix start.
//!
//! The grammar is the server's (`greedy-pmix`'s `pmi1.rs`) read from the other side: one
//! request line, one reply line of space-separated `key=value` fields.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, Result};

/// Set once `PMI_FD` has been taken: a second owner of the descriptor would close it twice.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// The sizes the agent accepts (`get_maxes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Maxes {
    /// Longest key.
    pub(crate) keylen: usize,
    /// Longest value.
    pub(crate) vallen: usize,
}

/// One PMI-1 connection: rank, size, the job's KVS name and the line stream.
#[derive(Debug)]
pub(crate) struct Pmi1 {
    fd: i32,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// This process's rank.
    pub(crate) rank: u32,
    /// The number of processes.
    pub(crate) size: u32,
    kvsname: String,
    /// The agent's limits.
    pub(crate) maxes: Maxes,
}

/// A variable of the environment, required.
fn var(name: &'static str) -> Result<String> {
    std::env::var(name).map_err(|_| Error::NotAMember(name))
}

/// A variable holding a number.
fn number(name: &'static str) -> Result<u32> {
    let value = var(name)?;
    value.parse().map_err(|_| Error::BadVariable {
        name,
        value,
        why: "not a number",
    })
}

impl Pmi1 {
    /// Takes `PMI_FD` and says `init` on it (PMI 1.1), then asks the limits and the KVS name.
    pub(crate) fn from_env() -> Result<Self> {
        let (rank, size) = (number("PMI_RANK")?, number("PMI_SIZE")?);
        let fd = i32::try_from(number("PMI_FD")?).map_err(|_| Error::BadVariable {
            name: "PMI_FD",
            value: var("PMI_FD").unwrap_or_default(),
            why: "not a descriptor",
        })?;
        if rank >= size {
            return Err(Error::BadVariable {
                name: "PMI_RANK",
                value: rank.to_string(),
                why: "not below PMI_SIZE",
            });
        }
        let stream = take(fd)?;
        let writer = stream
            .try_clone()
            .map_err(|source| Error::Agent { fd, source })?;
        let mut pmi = Pmi1 {
            fd,
            reader: BufReader::new(stream),
            writer,
            rank,
            size,
            kvsname: String::new(),
            maxes: Maxes {
                keylen: 64,
                vallen: 1024,
            },
        };
        pmi.handshake()?;
        Ok(pmi)
    }

    fn handshake(&mut self) -> Result<()> {
        let reply = self.ask("init", "cmd=init pmi_version=1 pmi_subversion=1\n")?;
        expect("init", &reply, "response_to_init")?;
        let reply = self.ask("get_maxes", "cmd=get_maxes\n")?;
        expect("get_maxes", &reply, "maxes")?;
        self.maxes = Maxes {
            keylen: field(&reply, "keylen_max")
                .and_then(|v| v.parse().ok())
                .unwrap_or(64),
            vallen: field(&reply, "vallen_max")
                .and_then(|v| v.parse().ok())
                .unwrap_or(1024),
        };
        let reply = self.ask("get_my_kvsname", "cmd=get_my_kvsname\n")?;
        expect("get_my_kvsname", &reply, "my_kvsname")?;
        self.kvsname = field(&reply, "kvsname")
            .ok_or_else(|| protocol("get_my_kvsname", &reply))?
            .to_string();
        Ok(())
    }

    /// Puts `value` under `key` in the job's KVS (seen by the others after the next barrier).
    pub(crate) fn put(&mut self, key: &str, value: &str) -> Result<()> {
        let line = format!("cmd=put kvsname={} key={key} value={value}\n", self.kvsname);
        let reply = self.ask("put", &line)?;
        expect("put", &reply, "put_result")
    }

    /// The value of `key`, or `None` when nobody put it.
    pub(crate) fn get(&mut self, key: &str) -> Result<Option<String>> {
        let line = format!("cmd=get kvsname={} key={key}\n", self.kvsname);
        let reply = self.ask("get", &line)?;
        if field(&reply, "cmd") != Some("get_result") {
            return Err(protocol("get", &reply));
        }
        Ok(match field(&reply, "rc") {
            Some("0") => field(&reply, "value").map(str::to_string),
            _ => None,
        })
    }

    /// A fence: returns once every process entered it, with every earlier put visible.
    pub(crate) fn barrier(&mut self) -> Result<()> {
        let reply = self.ask("barrier_in", "cmd=barrier_in\n")?;
        expect("barrier_in", &reply, "barrier_out")
    }

    /// Says `finalize`: this process leaves the job without ending it.
    pub(crate) fn finalize(mut self) -> Result<()> {
        let reply = self.ask("finalize", "cmd=finalize\n")?;
        expect("finalize", &reply, "finalize_ack")
    }

    /// Ends the whole job with `code` and a reason the launcher reports.
    pub(crate) fn abort(&mut self, code: i32, why: &str) -> Result<()> {
        let why: String = why
            .chars()
            .map(|c| if c == '\n' { ' ' } else { c })
            .collect();
        let line = format!("cmd=abort exitcode={code} message={why}\n");
        self.writer
            .write_all(line.as_bytes())
            .map_err(|source| Error::Agent {
                fd: self.fd,
                source,
            })
    }

    /// One request line and its reply line.
    fn ask(&mut self, request: &'static str, line: &str) -> Result<String> {
        let fd = self.fd;
        self.writer
            .write_all(line.as_bytes())
            .map_err(|source| Error::Agent { fd, source })?;
        let mut reply = String::new();
        let n = self
            .reader
            .read_line(&mut reply)
            .map_err(|source| Error::Agent { fd, source })?;
        if n == 0 {
            return Err(Error::SessionEnded(format!(
                "the local agent closed the PMI socket during {request}"
            )));
        }
        Ok(reply.trim_end().to_string())
    }
}

/// Takes ownership of the inherited descriptor, once per process.
fn take(fd: i32) -> Result<UnixStream> {
    if fd < 3 || TAKEN.swap(true, Ordering::SeqCst) {
        return Err(Error::BadVariable {
            name: "PMI_FD",
            value: fd.to_string(),
            why: "already taken by this process, or a standard stream",
        });
    }
    // The descriptor must be an open socket: fstat it before owning it.
    let meta = std::fs::metadata(format!("/proc/self/fd/{fd}"))
        .map_err(|source| Error::Agent { fd, source })?;
    use std::os::unix::fs::FileTypeExt;
    if !meta.file_type().is_socket() {
        return Err(Error::BadVariable {
            name: "PMI_FD",
            value: fd.to_string(),
            why: "not a socket",
        });
    }
    // SAFETY: `fd` is open (checked above), is the socketpair end the agent gave this process
    // for PMI, and is owned by nobody else in it: `TAKEN` lets this happen once per process.
    #[allow(unsafe_code)]
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(UnixStream::from(owned))
}

/// The value of `key=` in a reply line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split(' ')
        .filter_map(|t| t.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

fn protocol(request: &'static str, answer: &str) -> Error {
    Error::Protocol {
        request,
        answer: answer.chars().take(200).collect(),
    }
}

/// The reply must be `cmd=<cmd>` with `rc` 0 (or no `rc`).
fn expect(request: &'static str, reply: &str, cmd: &str) -> Result<()> {
    if field(reply, "cmd") != Some(cmd) {
        return Err(protocol(request, reply));
    }
    match field(reply, "rc") {
        None | Some("0") => Ok(()),
        Some(_) => Err(Error::Refused {
            request,
            why: field(reply, "msg").unwrap_or("no reason given").to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_by_name() {
        let line = "cmd=get_result rc=0 msg=success value=a=b";
        assert_eq!(field(line, "value"), Some("a=b"));
        assert_eq!(field(line, "cmd"), Some("get_result"));
        assert_eq!(field(line, "nope"), None);
    }

    #[test]
    fn a_refusal_carries_the_agents_message() {
        let err = expect(
            "put",
            "cmd=put_result rc=-1 msg=duplicate_key",
            "put_result",
        );
        assert!(matches!(err, Err(Error::Refused { why, .. }) if why == "duplicate_key"));
        assert!(matches!(
            expect("put", "cmd=barrier_out", "put_result"),
            Err(Error::Protocol { .. })
        ));
    }
}
