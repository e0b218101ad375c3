//! The sans-I/O engine for one rank's PMI connection: bytes in, replies and node effects out.
//!
//! A connection starts in PMI-1 line mode; `cmd=init pmi_version=2` switches it to PMI-2
//! frames, as Slurm's and hydra's servers do. The engine keeps no sockets: the server
//! ([`crate::server`]) feeds it bytes, gives it the node's key/value view through [`Node`],
//! and carries out the [`Action`]s it returns (send bytes, enter a fence, wait for a node
//! attribute, ask the job's name service, start a spawned job, abort the job). Fence, wait,
//! name and spawn replies are produced later by [`Session::fence_done`],
//! [`Session::node_attr_ready`], [`Session::names_done`] and [`Session::spawn_done`].

use bytes::{Buf, BytesMut};

use crate::{names, pmi1, pmi2, spawn};

/// What a session needs from its node: the job's facts and the key/value stores.
pub trait Node {
    /// Job id: the PMI-1 kvsname and PMI-2 jobid.
    fn job_id(&self) -> &str;
    /// Number of ranks in the job.
    fn n_ranks(&self) -> u32;
    /// How many processes the job and those it spawns may have in all.
    fn universe_size(&self) -> u32 {
        self.n_ranks()
    }
    /// A key from the job-wide KVS (what the last fence delivered, plus this node's own puts).
    fn get(&self, key: &str) -> Option<String>;
    /// A PMI-2 job attribute (`PMI_process_mapping`, `universeSize`, …).
    fn job_attr(&self, key: &str) -> Option<String>;
    /// A node attribute (PMI-2 `info-putnodeattr`, shared by the ranks of this node only).
    fn node_attr(&self, key: &str) -> Option<String>;
    /// Records a put; it reaches other nodes at the next fence.
    fn put(&mut self, rank: u32, key: String, value: String);
    /// Stores a node attribute.
    fn put_node_attr(&mut self, key: String, value: String);
    /// A `PMI_PORT` client says it is `rank`: true if that is a local rank not yet connected.
    fn claim(&mut self, rank: u32) -> bool;
    /// The number of the program `rank` runs (`MPI_APPNUM`: a spawned job's command index).
    fn appnum(&self, _rank: u32) -> u32 {
        0
    }
    /// The job that spawned this one (PMI-2 `spawner-jobid`), `None` for a job the launcher
    /// started.
    fn spawner(&self) -> Option<String> {
        None
    }
}

/// What the server must do after feeding the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send these bytes to the rank.
    Send(Vec<u8>),
    /// The rank entered a fence (PMI-1 `barrier_in`, PMI-2 `kvs-fence`): reply with
    /// [`Session::fence_done`] once every rank of the job is in it.
    Fence,
    /// The rank waits for a node attribute: reply with [`Session::node_attr_ready`] once it is put.
    WaitNodeAttr(String),
    /// The rank asks the job's name service: reply with [`Session::names_done`] once it answered.
    Names(names::Request),
    /// The rank asks to start a job (`MPI_Comm_spawn`, the whole request): reply with
    /// [`Session::spawn_done`] once the children run or the request was refused.
    Spawn(spawn::Request),
    /// The rank finalized; a close after this is normal.
    Finalized,
    /// The rank asked to abort the job.
    Abort {
        /// Exit code it gave.
        code: i32,
        /// Its message, if any.
        msg: String,
    },
}

/// A protocol violation: the job must be aborted, naming the rank and this text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError {
    /// `pmi1` or `pmi2`.
    pub proto: &'static str,
    /// 1-based message number on this connection.
    pub line: u64,
    /// What is wrong, quoting (a prefix of) the offending text.
    pub reason: String,
}

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} line {}: {}", self.proto, self.line, self.reason)
    }
}

/// Quotes at most 80 characters of offending input for an error message.
fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(80)]);
    let more = if bytes.len() > 80 { "…" } else { "" };
    format!("{text:?}{more}")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proto {
    Pmi1,
    Pmi2,
}

/// Deferred reply for a rank blocked in a fence or a node-attribute wait.
#[derive(Debug, Clone)]
enum Pending {
    Pmi1Barrier,
    Pmi2Fence(pmi2::Command),
    NodeAttr(pmi2::Command),
    /// A name-service request; PMI-1 replies by the request's kind, PMI-2 echoes the command.
    Pmi1Names(names::Request),
    Pmi2Names(pmi2::Command),
    /// A spawn request of this many processes in all; PMI-2 echoes the command.
    Pmi1Spawn(u64),
    Pmi2Spawn(pmi2::Command, u64),
}

/// One rank's connection state.
#[derive(Debug)]
pub struct Session {
    rank: Option<u32>,
    proto: Proto,
    line: u64,
    pending: Option<Pending>,
    finalized: bool,
    /// PMI-2 only: `fullinit` seen.
    fullinit: bool,
    /// PMI-1 only: the multi-line spawn request being read.
    spawn: Option<spawn::Block>,
}

impl Session {
    /// A session for a rank known from its inherited `PMI_FD`, or `None` for a `PMI_PORT`
    /// client that will say who it is with `initack`.
    pub fn new(rank: Option<u32>) -> Self {
        Session {
            rank,
            proto: Proto::Pmi1,
            line: 0,
            pending: None,
            finalized: false,
            fullinit: false,
            spawn: None,
        }
    }

    /// The rank, once known.
    pub fn rank(&self) -> Option<u32> {
        self.rank
    }

    /// True after the rank sent `finalize`.
    pub fn finalized(&self) -> bool {
        self.finalized
    }

    /// Consumes one whole message from the front of `buf`, if there is one.
    ///
    /// `Ok(None)`: more bytes are needed. A message arriving while the rank is blocked in a
    /// fence is a protocol error (the clients are synchronous).
    pub fn poll(
        &mut self,
        buf: &mut BytesMut,
        node: &mut dyn Node,
    ) -> Result<Option<Vec<Action>>, ProtocolError> {
        match self.proto {
            Proto::Pmi1 => {
                let Some(end) = buf.iter().position(|&b| b == b'\n') else {
                    if buf.len() > pmi1::MAX_LINE {
                        self.line += 1;
                        return Err(self.error(
                            "pmi1",
                            format!(
                                "no newline within {} bytes: {}",
                                pmi1::MAX_LINE,
                                excerpt(buf)
                            ),
                        ));
                    }
                    return Ok(None);
                };
                let line = buf.split_to(end + 1);
                self.line += 1;
                if self.spawn.is_some() {
                    return self.pmi1_spawn_line(&line).map(Some);
                }
                let request = pmi1::parse(&line)
                    .map_err(|e| self.error("pmi1", format!("{e}: {}", excerpt(&line))))?;
                self.check_not_blocked("pmi1", &line)?;
                Ok(Some(self.pmi1(request, node, &line)?))
            }
            Proto::Pmi2 => {
                let decoded = pmi2::decode(buf);
                let (command, used) = match decoded {
                    Ok(Some(x)) => x,
                    Ok(None) => return Ok(None),
                    Err(e) => {
                        self.line += 1;
                        return Err(self.error("pmi2", format!("{e}: {}", excerpt(buf))));
                    }
                };
                let raw = buf[..used].to_vec();
                buf.advance(used);
                self.line += 1;
                self.check_not_blocked("pmi2", &raw)?;
                Ok(Some(self.pmi2(command, node, &raw)?))
            }
        }
    }

    fn error(&self, proto: &'static str, reason: String) -> ProtocolError {
        ProtocolError {
            proto,
            line: self.line,
            reason,
        }
    }

    fn check_not_blocked(&self, proto: &'static str, raw: &[u8]) -> Result<(), ProtocolError> {
        if self.pending.is_some() {
            return Err(self.error(
                proto,
                format!("message while blocked in a fence or wait: {}", excerpt(raw)),
            ));
        }
        Ok(())
    }

    fn require_rank(&self, proto: &'static str, raw: &[u8]) -> Result<u32, ProtocolError> {
        self.rank
            .ok_or_else(|| self.error(proto, format!("command before initack: {}", excerpt(raw))))
    }

    fn pmi1(
        &mut self,
        request: pmi1::Request,
        node: &mut dyn Node,
        raw: &[u8],
    ) -> Result<Vec<Action>, ProtocolError> {
        use pmi1::{Reply, Request};
        let send = |r: Reply| vec![Action::Send(r.encode().into_bytes())];
        if !matches!(request, Request::InitAck { .. }) {
            self.require_rank("pmi1", raw)?;
        }
        Ok(match request {
            Request::InitAck { pmiid } => self.pmi1_initack(pmiid, node, raw)?,
            Request::Init {
                version,
                subversion,
            } => send(self.pmi1_init(version, subversion)),
            Request::GetMaxes => send(Reply::Maxes),
            // Hydra answers 0 and MPICH only uses it for MPI_APPNUM; Slurm's -1 would be wrong for us.
            Request::GetAppnum => {
                let appnum = node.appnum(self.rank.unwrap_or_default());
                send(Reply::Appnum(i32::try_from(appnum).unwrap_or(i32::MAX)))
            }
            Request::GetUniverseSize => send(Reply::UniverseSize(node.universe_size())),
            Request::GetMyKvsname => send(Reply::MyKvsname(node.job_id().to_owned())),
            Request::Put {
                kvsname,
                key,
                value,
            } => {
                if kvsname != node.job_id() {
                    send(Reply::PutResult(Some("unknown_kvsname")))
                } else {
                    node.put(self.rank.unwrap_or_default(), key, value);
                    send(Reply::PutResult(None))
                }
            }
            Request::Get { kvsname, key } => {
                let value = if kvsname == node.job_id() {
                    node.get(&key)
                } else {
                    None
                };
                send(Reply::GetResult(value))
            }
            Request::BarrierIn => {
                self.pending = Some(Pending::Pmi1Barrier);
                vec![Action::Fence]
            }
            Request::Finalize => {
                self.finalized = true;
                // Finalized first: the rank may exit the moment it reads the ack.
                let mut out = vec![Action::Finalized];
                out.extend(send(Reply::FinalizeAck));
                out
            }
            Request::Abort { exitcode, message } => vec![Action::Abort {
                code: exitcode,
                msg: message.unwrap_or_else(|| "PMI_Abort".into()),
            }],
            Request::PublishName { service, port } => self.pmi1_names(names::Request::Publish {
                name: service,
                port,
            }),
            Request::UnpublishName { service } => {
                self.pmi1_names(names::Request::Unpublish { name: service })
            }
            Request::LookupName { service } => {
                self.pmi1_names(names::Request::Lookup { name: service })
            }
            Request::SpawnStart => {
                self.spawn = Some(spawn::Block::start());
                vec![]
            }
            Request::Unsupported { cmd } => send(Reply::Unsupported(cmd)),
        })
    }

    /// A line of a PMI-1 spawn request: read on; once the request is whole the rank waits
    /// for it.
    fn pmi1_spawn_line(&mut self, line: &[u8]) -> Result<Vec<Action>, ProtocolError> {
        let bad = |s: &Self, why: String| s.error("pmi1", format!("{why}: {}", excerpt(line)));
        let Ok(text) = std::str::from_utf8(line) else {
            return Err(bad(self, "spawn line is not UTF-8".into()));
        };
        let Some(block) = self.spawn.as_mut() else {
            return Ok(vec![]);
        };
        match block.line(text) {
            Ok(None) => Ok(vec![]),
            Ok(Some(request)) => {
                self.spawn = None;
                self.pending = Some(Pending::Pmi1Spawn(request.total_procs()));
                Ok(vec![Action::Spawn(request)])
            }
            Err(e) => Err(bad(self, e.to_string())),
        }
    }

    /// A PMI-1 name-service request: the reply waits for the service's answer.
    fn pmi1_names(&mut self, request: names::Request) -> Vec<Action> {
        self.pending = Some(Pending::Pmi1Names(request.clone()));
        vec![Action::Names(request)]
    }

    /// A PMI-2 `name-*` command: the reply waits for the service's answer.
    fn pmi2_names(&mut self, c: pmi2::Command, raw: &[u8]) -> Result<Vec<Action>, ProtocolError> {
        let bad = |e: pmi2::ParseError| self.error("pmi2", format!("{e}: {}", excerpt(raw)));
        let name = c.require("name").map_err(bad)?.to_owned();
        let request = match c.cmd.as_str() {
            "name-publish" => names::Request::Publish {
                name,
                port: c.require("port").map_err(bad)?.to_owned(),
            },
            "name-unpublish" => names::Request::Unpublish { name },
            // The caller passes only the three name-* commands.
            _ => names::Request::Lookup { name },
        };
        self.pending = Some(Pending::Pmi2Names(c));
        Ok(vec![Action::Names(request)])
    }

    /// `cmd=initack`: a `PMI_PORT` client claims its rank; the reply carries size and rank.
    fn pmi1_initack(
        &mut self,
        pmiid: u32,
        node: &mut dyn Node,
        raw: &[u8],
    ) -> Result<Vec<Action>, ProtocolError> {
        use pmi1::Reply;
        if self.rank.is_some() || !node.claim(pmiid) {
            return Err(self.error(
                "pmi1",
                format!("pmiid {pmiid} is not a free local rank: {}", excerpt(raw)),
            ));
        }
        self.rank = Some(pmiid);
        let mut out = Reply::InitAck.encode();
        out += &Reply::Set {
            key: "size",
            value: i64::from(node.n_ranks()),
        }
        .encode();
        out += &Reply::Set {
            key: "rank",
            value: i64::from(pmiid),
        }
        .encode();
        out += &Reply::Set {
            key: "debug",
            value: 0,
        }
        .encode();
        Ok(vec![Action::Send(out.into_bytes())])
    }

    /// `cmd=init`: version 1 is served as is, 2 switches the connection to PMI-2 frames.
    fn pmi1_init(&mut self, version: u32, subversion: u32) -> pmi1::Reply {
        use pmi1::Reply;
        match version {
            1 => Reply::ResponseToInit {
                version: 1,
                subversion: 1,
                rc: 0,
            },
            2 => {
                self.proto = Proto::Pmi2;
                Reply::ResponseToInit {
                    version: 2,
                    subversion: 0,
                    rc: 0,
                }
            }
            _ => Reply::ResponseToInit {
                version,
                subversion,
                rc: -1,
            },
        }
    }

    fn pmi2(
        &mut self,
        c: pmi2::Command,
        node: &mut dyn Node,
        raw: &[u8],
    ) -> Result<Vec<Action>, ProtocolError> {
        use pmi2::Reply;
        let bad = |s: &Self, e: pmi2::ParseError| s.error("pmi2", format!("{e}: {}", excerpt(raw)));
        let send = |r: Reply| vec![Action::Send(r.encode())];
        Ok(match c.cmd.as_str() {
            "fullinit" => send(self.pmi2_fullinit(&c, node, raw)?),
            _ if !self.fullinit => {
                return Err(
                    self.error("pmi2", format!("command before fullinit: {}", excerpt(raw)))
                );
            }
            "job-getid" => {
                send(Reply::new("job-getid-response", 0, Some(&c)).field("jobid", node.job_id()))
            }
            "info-getjobattr" => {
                let key = c.require("key").map_err(|e| bad(self, e))?;
                send(found(node.job_attr(key), "info-getjobattr-response", &c))
            }
            "kvs-put" => {
                let key = c.require("key").map_err(|e| bad(self, e))?.to_owned();
                let value = c.require("value").map_err(|e| bad(self, e))?.to_owned();
                node.put(self.rank.unwrap_or_default(), key, value);
                send(Reply::new("kvs-put-response", 0, Some(&c)))
            }
            "kvs-get" => {
                let key = c.require("key").map_err(|e| bad(self, e))?;
                send(found(node.get(key), "kvs-get-response", &c))
            }
            "kvs-fence" => {
                self.pending = Some(Pending::Pmi2Fence(c));
                vec![Action::Fence]
            }
            "info-putnodeattr" => {
                let key = c.require("key").map_err(|e| bad(self, e))?.to_owned();
                let value = c.require("value").map_err(|e| bad(self, e))?.to_owned();
                node.put_node_attr(key, value);
                send(Reply::new("info-putnodeattr-response", 0, Some(&c)))
            }
            "info-getnodeattr" => self.pmi2_getnodeattr(c, node, raw)?,
            "name-publish" | "name-unpublish" | "name-lookup" => self.pmi2_names(c, raw)?,
            "spawn" => {
                let request = spawn::from_pmi2(&c)
                    .map_err(|e| self.error("pmi2", format!("{e}: {}", excerpt(raw))))?;
                self.pending = Some(Pending::Pmi2Spawn(c, request.total_procs()));
                vec![Action::Spawn(request)]
            }
            "finalize" => {
                self.finalized = true;
                vec![
                    Action::Finalized,
                    Action::Send(Reply::new("finalize-response", 0, Some(&c)).encode()),
                ]
            }
            "abort" => {
                let msg = c
                    .get("msg")
                    .unwrap_or("PMI2_Abort")
                    .chars()
                    .take(1024)
                    .collect();
                vec![Action::Abort { code: 1, msg }]
            }
            other => {
                let name = format!("{other}-response");
                send(Reply::new(&name, -1, Some(&c)).field("errmsg", "unsupported command"))
            }
        })
    }

    /// `fullinit`: the rank is the connection's own (`PMI_FD`) or a free local one (`PMI_PORT`).
    fn pmi2_fullinit(
        &mut self,
        c: &pmi2::Command,
        node: &mut dyn Node,
        raw: &[u8],
    ) -> Result<pmi2::Reply, ProtocolError> {
        let text = c
            .require("pmirank")
            .map_err(|e| self.error("pmi2", format!("{e}: {}", excerpt(raw))))?;
        let rank: u32 = text.parse().map_err(|_| {
            self.error(
                "pmi2",
                format!("pmirank={text:?} is not a rank: {}", excerpt(raw)),
            )
        })?;
        match self.rank {
            Some(known) if known != rank => {
                return Err(self.error(
                    "pmi2",
                    format!("pmirank={rank} but this connection is rank {known}"),
                ));
            }
            Some(_) => {}
            None if node.claim(rank) => self.rank = Some(rank),
            None => {
                return Err(self.error("pmi2", format!("pmirank={rank} is not a free local rank")));
            }
        }
        self.fullinit = true;
        let reply = pmi2::Reply::new("fullinit-response", 0, Some(c))
            .field("pmi-version", "2")
            .field("pmi-subversion", "0")
            .field("rank", &rank.to_string())
            .field("size", &node.n_ranks().to_string())
            .field("appnum", &node.appnum(rank).to_string())
            .field("debugged", "FALSE")
            .field("pmiverbose", "FALSE");
        // MPICH's PMI2_Init calls the job spawned when the field is there at all.
        Ok(match node.spawner() {
            Some(parent) => reply.field("spawner-jobid", &parent),
            None => reply,
        })
    }

    /// `info-getnodeattr`: answered now, or with `wait=TRUE` once another rank puts the key.
    fn pmi2_getnodeattr(
        &mut self,
        c: pmi2::Command,
        node: &mut dyn Node,
        raw: &[u8],
    ) -> Result<Vec<Action>, ProtocolError> {
        let key = c
            .require("key")
            .map_err(|e| self.error("pmi2", format!("{e}: {}", excerpt(raw))))?
            .to_owned();
        let value = node.node_attr(&key);
        Ok(if value.is_none() && c.get("wait") == Some("TRUE") {
            self.pending = Some(Pending::NodeAttr(c));
            vec![Action::WaitNodeAttr(key)]
        } else {
            vec![Action::Send(
                found(value, "info-getnodeattr-response", &c).encode(),
            )]
        })
    }

    /// The reply that releases a rank from its fence; empty if it was not in one.
    pub fn fence_done(&mut self) -> Vec<u8> {
        match self.pending.take() {
            Some(Pending::Pmi1Barrier) => pmi1::Reply::BarrierOut.encode().into_bytes(),
            Some(Pending::Pmi2Fence(c)) => {
                pmi2::Reply::new("kvs-fence-response", 0, Some(&c)).encode()
            }
            other => {
                self.pending = other;
                Vec::new()
            }
        }
    }

    /// The reply to a waiting name-service request once the service answered; empty if the
    /// rank was not waiting for one.
    pub fn names_done(&mut self, answer: &names::Response) -> Vec<u8> {
        use names::{Request, Response};
        let failure = answer.reason();
        match self.pending.take() {
            Some(Pending::Pmi1Names(request)) => {
                let reply = match (request, answer) {
                    (Request::Lookup { .. }, Response::Port(port)) => {
                        pmi1::Reply::LookupResult(Ok(port.clone()))
                    }
                    (Request::Lookup { .. }, _) => pmi1::Reply::LookupResult(Err(
                        failure.unwrap_or_else(|| "no port in the answer".into())
                    )),
                    (Request::Unpublish { .. }, _) => pmi1::Reply::UnpublishResult(failure),
                    // PMI-1 sends only the three requests above; the PMIx ones never get here.
                    (
                        Request::Publish { .. }
                        | Request::Put { .. }
                        | Request::Get { .. }
                        | Request::Withdraw { .. },
                        _,
                    ) => pmi1::Reply::PublishResult(failure),
                };
                reply.encode().into_bytes()
            }
            Some(Pending::Pmi2Names(c)) => {
                let name = format!("{}-response", c.cmd);
                match (c.cmd.as_str(), answer, failure) {
                    ("name-lookup", Response::Port(port), _) => {
                        pmi2::Reply::new(&name, 0, Some(&c)).field("port", port)
                    }
                    (_, _, Some(why)) => {
                        pmi2::Reply::new(&name, -1, Some(&c)).field("errmsg", &why)
                    }
                    ("name-lookup", _, None) => pmi2::Reply::new(&name, -1, Some(&c))
                        .field("errmsg", "no port in the answer"),
                    (_, _, None) => pmi2::Reply::new(&name, 0, Some(&c)),
                }
                .encode()
            }
            other => {
                self.pending = other;
                Vec::new()
            }
        }
    }

    /// The reply to a waiting spawn request once it was answered: the child job's id, or
    /// why nothing was started; empty if the rank was not waiting for one.
    pub fn spawn_done(&mut self, answer: &Result<String, String>) -> Vec<u8> {
        match (self.pending.take(), answer) {
            (Some(Pending::Pmi1Spawn(procs)), Ok(_)) => {
                pmi1::Reply::Spawned(spawn::codes(procs, 0))
                    .encode()
                    .into_bytes()
            }
            (Some(Pending::Pmi1Spawn(_)), Err(why)) => {
                pmi1::Reply::SpawnRefused(why.clone()).encode().into_bytes()
            }
            (Some(Pending::Pmi2Spawn(c, procs)), Ok(jobid)) => {
                let reply = pmi2::Reply::new("spawn-response", 0, Some(&c)).field("jobid", jobid);
                with_codes(reply, procs, 0).encode()
            }
            (Some(Pending::Pmi2Spawn(c, procs)), Err(why)) => {
                let reply = pmi2::Reply::new("spawn-response", -1, Some(&c)).field("errmsg", why);
                with_codes(reply, procs, -1).encode()
            }
            (other, _) => {
                self.pending = other;
                Vec::new()
            }
        }
    }

    /// True while the rank waits in a fence.
    pub fn in_fence(&self) -> bool {
        matches!(
            self.pending,
            Some(Pending::Pmi1Barrier | Pending::Pmi2Fence(_))
        )
    }

    /// The reply to a waiting `info-getnodeattr` once `key` was put; empty if not waiting for it.
    pub fn node_attr_ready(&mut self, key: &str, value: &str) -> Vec<u8> {
        match self.pending.take() {
            Some(Pending::NodeAttr(c)) if c.get("key") == Some(key) => {
                pmi2::Reply::new("info-getnodeattr-response", 0, Some(&c))
                    .field("found", "TRUE")
                    .field("value", value)
                    .encode()
            }
            other => {
                self.pending = other;
                Vec::new()
            }
        }
    }
}

/// A `spawn-response` with one error code per process, as Slurm's own server sends them for
/// clients that read `errcodes` rather than `rc` (past [`spawn::ERRCODES_MAX`], `rc` only).
/// (Slurm's `libpmi2.so` reads neither: Intel MPI through it takes any answer for success.)
fn with_codes(reply: pmi2::Reply, procs: u64, code: i32) -> pmi2::Reply {
    match spawn::codes(procs, code) {
        Some(codes) => reply.field("errcodes", &codes),
        None => reply,
    }
}

/// A PMI-2 lookup's reply: `found=TRUE` with the value, or `found=FALSE`.
fn found(value: Option<String>, name: &str, c: &pmi2::Command) -> pmi2::Reply {
    let r = pmi2::Reply::new(name, 0, Some(c));
    match value {
        Some(v) => r.field("found", "TRUE").field("value", &v),
        None => r.field("found", "FALSE"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[derive(Default)]
    struct FakeNode {
        kvs: HashMap<String, String>,
        attrs: HashMap<String, String>,
        puts: Vec<(u32, String, String)>,
        claimed: Vec<u32>,
        spawner: Option<String>,
    }

    impl Node for FakeNode {
        fn job_id(&self) -> &str {
            "j7"
        }
        fn n_ranks(&self) -> u32 {
            8
        }
        fn get(&self, key: &str) -> Option<String> {
            self.kvs.get(key).cloned()
        }
        fn job_attr(&self, key: &str) -> Option<String> {
            (key == "PMI_process_mapping").then(|| "(vector,(0,2,4))".into())
        }
        fn node_attr(&self, key: &str) -> Option<String> {
            self.attrs.get(key).cloned()
        }
        fn put(&mut self, rank: u32, key: String, value: String) {
            self.puts.push((rank, key, value));
        }
        fn put_node_attr(&mut self, key: String, value: String) {
            self.attrs.insert(key, value);
        }
        fn claim(&mut self, rank: u32) -> bool {
            if rank < 4 && !self.claimed.contains(&rank) {
                self.claimed.push(rank);
                true
            } else {
                false
            }
        }
        fn appnum(&self, rank: u32) -> u32 {
            u32::from(self.spawner.is_some() && rank > 0)
        }
        fn spawner(&self) -> Option<String> {
            self.spawner.clone()
        }
    }

    /// Feeds `input` (PMI-2 bodies written as `>body` lines get framed) and renders every action.
    fn run(rank: Option<u32>, input: &[&str]) -> String {
        let mut node = FakeNode::default();
        node.kvs.insert("k1".into(), "v1".into());
        let mut s = Session::new(rank);
        let mut names = names::Table::default();
        let mut out = String::new();
        for msg in input {
            let mut buf = BytesMut::new();
            if let Some(body) = msg.strip_prefix('>') {
                buf.extend_from_slice(format!("{:<6}{body}", body.len()).as_bytes());
            } else {
                buf.extend_from_slice(msg.as_bytes());
            }
            loop {
                match s.poll(&mut buf, &mut node) {
                    Ok(None) => break,
                    Ok(Some(actions)) => {
                        for a in actions {
                            match a {
                                Action::Send(b) => out += &String::from_utf8_lossy(&b),
                                Action::Fence => {
                                    out += &format!(
                                        "<fence>{}",
                                        String::from_utf8_lossy(&s.fence_done())
                                    )
                                }
                                Action::Names(request) => {
                                    let answer = names.serve(request);
                                    out += &format!(
                                        "<names>{}",
                                        String::from_utf8_lossy(&s.names_done(&answer))
                                    )
                                }
                                Action::Spawn(request) => {
                                    let asked: Vec<String> = request
                                        .commands
                                        .iter()
                                        .map(|c| format!("{} x{}", c.program, c.maxprocs))
                                        .collect();
                                    let answer = match request.commands[0].program.as_str() {
                                        "refuse" => Err("no free slots".to_string()),
                                        _ => Ok("j7.1".to_string()),
                                    };
                                    out += &format!(
                                        "<spawn {}>{}",
                                        asked.join(","),
                                        String::from_utf8_lossy(&s.spawn_done(&answer))
                                    )
                                }
                                other => out += &format!("<{other:?}>"),
                            }
                        }
                    }
                    Err(e) => {
                        out += &format!("<error {e}>");
                        return out;
                    }
                }
            }
        }
        for (rank, k, v) in node.puts {
            out += &format!("<put {rank} {k}={v}>");
        }
        out
    }

    fn check(rank: Option<u32>, input: &[&str], expect: &str) {
        assert_eq!(run(rank, input), expect);
    }

    #[test]
    fn pmi1_startup_as_mpich_4_0_does_it() {
        check(
            Some(2),
            &[
                "cmd=init pmi_version=1 pmi_subversion=1\n",
                "cmd=get_maxes\ncmd=get_appnum\n",
                "cmd=get_my_kvsname\n",
                "cmd=get kvsname=j7 key=k1\n",
                "cmd=put kvsname=j7 key=a value=b\n",
                "cmd=barrier_in\n",
                "cmd=get kvsname=j7 key=missing\n",
                "cmd=finalize\n",
            ],
            "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n\
             cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=1024\n\
             cmd=appnum rc=0 appnum=0\n\
             cmd=my_kvsname rc=0 kvsname=j7\n\
             cmd=get_result rc=0 msg=success value=v1\n\
             cmd=put_result rc=0 msg=success\n\
             <fence>cmd=barrier_out rc=0\n\
             cmd=get_result rc=-1 msg=key_not_found\n\
             <Finalized>cmd=finalize_ack rc=0\n<put 2 a=b>",
        );
    }

    #[test]
    fn pmi1_port_mode_handshake() {
        check(
            None,
            &["cmd=initack pmiid=3\n", "cmd=get_universe_size\n"],
            "cmd=initack rc=0\ncmd=set size=8\ncmd=set rank=3\ncmd=set debug=0\ncmd=universe_size rc=0 size=8\n",
        );
        check(
            None,
            &["cmd=initack pmiid=9\n"],
            r#"<error pmi1 line 1: pmiid 9 is not a free local rank: "cmd=initack pmiid=9\n">"#,
        );
        check(
            None,
            &["cmd=get_maxes\n"],
            r#"<error pmi1 line 1: command before initack: "cmd=get_maxes\n">"#,
        );
    }

    /// MPICH 5's `MPI_Comm_spawn` over PMI-1 (one write of the whole block) and Intel MPI's
    /// (a block per write): the request once whole, one reply when answered (started: one
    /// error code per process; refused: why), and the connection goes on.
    #[test]
    fn pmi1_spawn_waits_for_its_answer_after_the_whole_request() {
        let block = "mcmd=spawn\nnprocs=2\nexecname=./spawn\ntotspawns=1\nspawnssofar=1\n\
                     argcnt=0\npreput_num=1\npreput_key_0=PARENT_ROOT_PORT_NAME\n\
                     preput_val_0=tag#0$connentry#0200$\ninfo_num=0\nendcmd\n";
        check(
            Some(0),
            &[block, "cmd=get_appnum\n"],
            "<spawn ./spawn x2>cmd=spawn_result rc=0 errcodes=0,0\ncmd=appnum rc=0 appnum=0\n",
        );
        let refused = block.replace("./spawn", "refuse");
        check(
            Some(0),
            &[&refused],
            "<spawn refuse x2>cmd=spawn_result rc=-1 msg=no_free_slots\n",
        );
        let two = "mcmd=spawn\nnprocs=1\nexecname=a\ntotspawns=2\nspawnssofar=1\nargcnt=0\n\
                   preput_num=0\ninfo_num=0\nendcmd\n";
        let second = "mcmd=spawn\nnprocs=3\nexecname=b\ntotspawns=2\nspawnssofar=2\n\
                      argcnt=1\narg1=x y\ninfo_num=0\nendcmd\n";
        check(Some(0), &[two], "");
        check(
            Some(0),
            &[two, second],
            "<spawn a x1,b x3>cmd=spawn_result rc=0 errcodes=0,0,0,0\n",
        );
        check(
            Some(0),
            &["mcmd=spawn\n", "nprocs=1\n", "endcmd\n"],
            r#"<error pmi1 line 3: spawn request lacks execname=: "endcmd\n">"#,
        );
        check(
            Some(0),
            &["mcmd=spawn\n", "cmd get\n"],
            r#"<error pmi1 line 2: spawn line "cmd get" has no '=': "cmd get\n">"#,
        );
    }

    #[test]
    fn pmi2_spawn_answers_with_the_child_jobid_or_error_codes() {
        let init = [
            "cmd=init pmi_version=2 pmi_subversion=0\n",
            ">cmd=fullinit;pmirank=0;",
        ];
        let frame = |body: &str| format!("{:<6}{body}", body.len());
        let spawn = ">cmd=spawn;ncmds=1;preputcount=1;ppkey0=PARENT_ROOT_PORT_NAME;ppval0=p;\
                     subcmd=./spawn;maxprocs=2;argc=0;infokeycount=0;";
        let got = run(Some(0), &[init[0], init[1], spawn]);
        let body = "cmd=spawn-response;rc=0;jobid=j7.1;errcodes=0,0;";
        assert!(
            got.ends_with(&format!("<spawn ./spawn x2>{}", frame(body))),
            "{got}"
        );
        let refused = spawn.replace("./spawn", "refuse");
        let got = run(Some(0), &[init[0], init[1], &refused]);
        let body = "cmd=spawn-response;rc=-1;errmsg=no free slots;errcodes=-1,-1;";
        assert!(got.ends_with(&frame(body)), "{got}");
        let got = run(Some(0), &[init[0], init[1], ">cmd=spawn;ncmds=x;"]);
        assert!(
            got.ends_with(r#"<error pmi2 line 3: spawn ncmds="x" is not a number: "18    cmd=spawn;ncmds=x;">"#),
            "{got}"
        );
    }

    /// A spawned rank learns its parent (PMI-2 `spawner-jobid`) and its program's number.
    #[test]
    fn a_spawned_rank_is_told_its_spawner_and_appnum() {
        let mut node = FakeNode {
            spawner: Some("j7".into()),
            ..FakeNode::default()
        };
        let mut s = Session::new(Some(1));
        let mut buf = BytesMut::from("cmd=init pmi_version=2 pmi_subversion=0\n");
        s.poll(&mut buf, &mut node).unwrap().unwrap();
        let body = "cmd=fullinit;pmirank=1;";
        buf.extend_from_slice(format!("{:<6}{body}", body.len()).as_bytes());
        let Some(actions) = s.poll(&mut buf, &mut node).unwrap() else {
            panic!("fullinit answered");
        };
        let Action::Send(reply) = &actions[0] else {
            panic!("{actions:?}");
        };
        let reply = String::from_utf8_lossy(reply);
        assert!(
            reply.contains(";appnum=1;") && reply.ends_with(";spawner-jobid=j7;"),
            "{reply}"
        );
    }

    #[test]
    fn pmi1_bad_input() {
        check(
            Some(0),
            &["cmd=init pmi_version=1 pmi_subversion=1\n", "garbage\n"],
            "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n<error pmi1 line 2: token \"garbage\" has no '=': \"garbage\\n\">",
        );
        check(
            Some(0),
            &["cmd=frobnicate\n"],
            "cmd=frobnicate_result rc=-1 msg=unsupported_command\n",
        );
        check(
            Some(0),
            &["cmd=put kvsname=other key=a value=b\n"],
            "cmd=put_result rc=-1 msg=unknown_kvsname\n",
        );
        let long = "x".repeat(2000);
        let got = run(Some(0), &[&long]);
        assert!(
            got.starts_with("<error pmi1 line 1: no newline within 1408 bytes: \"xxx"),
            "{got}"
        );
        check(
            Some(0),
            &["cmd=abort exitcode=4\n"],
            r#"<Abort { code: 4, msg: "PMI_Abort" }>"#,
        );
    }

    #[test]
    fn pmi2_session() {
        check(
            Some(1),
            &[
                "cmd=init pmi_version=2 pmi_subversion=0\n",
                ">cmd=fullinit;pmirank=1;threaded=FALSE;",
                ">cmd=job-getid;",
                ">cmd=info-getjobattr;key=PMI_process_mapping;",
                ">cmd=kvs-put;key=bc-1;value=x;;y;",
                ">cmd=kvs-fence;thrid=5;",
                ">cmd=kvs-get;jobid=j7;key=k1;",
                ">cmd=kvs-get;jobid=j7;key=nope;",
                ">cmd=info-putnodeattr;key=shm;value=seg1;",
                ">cmd=info-getnodeattr;key=shm;wait=FALSE;",
                ">cmd=job-connect;jobid=j1;",
                ">cmd=finalize;",
            ],
            "cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n\
             113   cmd=fullinit-response;rc=0;pmi-version=2;pmi-subversion=0;rank=1;size=8;appnum=0;debugged=FALSE;pmiverbose=FALSE;\
             37    cmd=job-getid-response;rc=0;jobid=j7;\
             68    cmd=info-getjobattr-response;rc=0;found=TRUE;value=(vector,(0,2,4));\
             26    cmd=kvs-put-response;rc=0;\
             <fence>36    cmd=kvs-fence-response;thrid=5;rc=0;\
             46    cmd=kvs-get-response;rc=0;found=TRUE;value=v1;\
             38    cmd=kvs-get-response;rc=0;found=FALSE;\
             35    cmd=info-putnodeattr-response;rc=0;\
             57    cmd=info-getnodeattr-response;rc=0;found=TRUE;value=seg1;\
             58    cmd=job-connect-response;rc=-1;errmsg=unsupported command;\
             <Finalized>27    cmd=finalize-response;rc=0;<put 1 bc-1=x;y>",
        );
    }

    #[test]
    fn pmi1_names_as_mpich_4_0_does_them() {
        check(
            Some(0),
            &[
                "cmd=init pmi_version=1 pmi_subversion=1\n",
                "cmd=lookup_name service=svc\n",
                "cmd=publish_name service=svc port=tag#0$p$\n",
                "cmd=publish_name service=svc port=other\n",
                "cmd=lookup_name service=svc\n",
                "cmd=unpublish_name service=svc\n",
                "cmd=unpublish_name service=svc\n",
                "cmd=lookup_name service=svc\n",
            ],
            "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n\
             <names>cmd=lookup_result rc=-1 msg=name_not_published\n\
             <names>cmd=publish_result rc=0 msg=success\n\
             <names>cmd=publish_result rc=-1 msg=name_already_published\n\
             <names>cmd=lookup_result rc=0 msg=success port=tag#0$p$\n\
             <names>cmd=unpublish_result rc=0 msg=success\n\
             <names>cmd=unpublish_result rc=-1 msg=name_not_published\n\
             <names>cmd=lookup_result rc=-1 msg=name_not_published\n",
        );
        check(
            Some(0),
            &["cmd=publish_name service=svc\n"],
            r#"<error pmi1 line 1: cmd "publish_name" lacks port=: "cmd=publish_name service=svc\n">"#,
        );
    }

    #[test]
    fn pmi2_names_as_mpich_4_0_does_them() {
        check(
            Some(1),
            &[
                "cmd=init pmi_version=2 pmi_subversion=0\n",
                ">cmd=fullinit;pmirank=1;",
                ">cmd=name-publish;thrid=4;name=svc;port=a;;b;infokeycount=0;",
                ">cmd=name-publish;name=svc;port=c;infokeycount=0;",
                ">cmd=name-lookup;name=svc;infokeycount=0;",
                ">cmd=name-unpublish;name=svc;infokeycount=0;",
                ">cmd=name-lookup;name=svc;infokeycount=0;",
                ">cmd=name-unpublish;name=svc;",
            ],
            "cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n\
             113   cmd=fullinit-response;rc=0;pmi-version=2;pmi-subversion=0;rank=1;size=8;appnum=0;debugged=FALSE;pmiverbose=FALSE;\
             <names>39    cmd=name-publish-response;thrid=4;rc=0;\
             <names>62    cmd=name-publish-response;rc=-1;errmsg=name already published;\
             <names>40    cmd=name-lookup-response;rc=0;port=a;;b;\
             <names>33    cmd=name-unpublish-response;rc=0;\
             <names>57    cmd=name-lookup-response;rc=-1;errmsg=name not published;\
             <names>60    cmd=name-unpublish-response;rc=-1;errmsg=name not published;",
        );
        check(
            Some(1),
            &[
                "cmd=init pmi_version=2 pmi_subversion=0\n",
                ">cmd=fullinit;pmirank=1;",
                ">cmd=name-publish;name=svc;",
            ],
            "cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n\
             113   cmd=fullinit-response;rc=0;pmi-version=2;pmi-subversion=0;rank=1;size=8;appnum=0;debugged=FALSE;pmiverbose=FALSE;\
             <error pmi2 line 3: cmd \"name-publish\" lacks port=: \"26    cmd=name-publish;name=svc;\">",
        );
    }

    /// A failed request (node 0 unreachable) is an error reply, not a hang or a protocol error.
    #[test]
    fn names_failure_is_a_reply() {
        let mut node = FakeNode::default();
        let mut s = Session::new(Some(0));
        let mut buf = BytesMut::from(&b"cmd=lookup_name service=x\n"[..]);
        assert_eq!(
            s.poll(&mut buf, &mut node).unwrap(),
            Some(vec![Action::Names(names::Request::Lookup {
                name: "x".into()
            })])
        );
        assert!(s.fence_done().is_empty());
        let reply = s.names_done(&names::Response::Failed("node 0: timeout".into()));
        assert_eq!(
            String::from_utf8(reply).unwrap(),
            "cmd=lookup_result rc=-1 msg=node_0:_timeout\n"
        );
        assert!(s.names_done(&names::Response::Done).is_empty());
    }

    #[test]
    fn pmi2_bad_input() {
        let init = "cmd=init pmi_version=2 pmi_subversion=0\n";
        let ok = "cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n";
        check(
            Some(1),
            &[init, ">cmd=kvs-get;key=a;"],
            &format!(
                "{ok}<error pmi2 line 2: command before fullinit: \"18    cmd=kvs-get;key=a;\">"
            )[..],
        );
        check(
            Some(1),
            &[init, ">cmd=fullinit;pmirank=2;"],
            &format!("{ok}<error pmi2 line 2: pmirank=2 but this connection is rank 1>"),
        );
        check(
            Some(1),
            &[init, "zzzzzzcmd"],
            &format!(
                "{ok}<error pmi2 line 2: frame header \"zzzzzz\" is not a length: \"zzzzzzcmd\">"
            ),
        );
        check(
            Some(1),
            &[init, ">cmd=fullinit;"],
            &format!(
                "{ok}<error pmi2 line 2: cmd \"fullinit\" lacks pmirank=: \"13    cmd=fullinit;\">"
            ),
        );
    }

    #[test]
    fn message_while_in_fence_is_an_error() {
        let mut node = FakeNode::default();
        let mut s = Session::new(Some(0));
        let mut buf = BytesMut::from(&b"cmd=barrier_in\ncmd=get_maxes\n"[..]);
        assert_eq!(
            s.poll(&mut buf, &mut node).unwrap(),
            Some(vec![Action::Fence])
        );
        assert!(s.in_fence());
        let err = s.poll(&mut buf, &mut node).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"pmi1 line 2: message while blocked in a fence or wait: "cmd=get_maxes\n""#
        );
    }

    #[test]
    fn waiting_getnodeattr() {
        let mut node = FakeNode::default();
        let mut s = Session::new(Some(0));
        let mut buf = BytesMut::from(&b"cmd=init pmi_version=2 pmi_subversion=0\n"[..]);
        s.poll(&mut buf, &mut node).unwrap();
        for body in [
            "cmd=fullinit;pmirank=0;",
            "cmd=info-getnodeattr;key=seg;wait=TRUE;",
        ] {
            buf.extend_from_slice(format!("{:<6}{body}", body.len()).as_bytes());
        }
        s.poll(&mut buf, &mut node).unwrap();
        assert_eq!(
            s.poll(&mut buf, &mut node).unwrap(),
            Some(vec![Action::WaitNodeAttr("seg".into())])
        );
        assert!(s.node_attr_ready("other", "x").is_empty());
        let reply = s.node_attr_ready("seg", "v");
        assert_eq!(
            String::from_utf8(reply).unwrap(),
            "54    cmd=info-getnodeattr-response;rc=0;found=TRUE;value=v;"
        );
    }
}
