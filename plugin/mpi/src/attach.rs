//! A PMIx spawn under srun: the children's step is served by the parent step's stepds.
//!
//! Open MPI's children reach their parents through `PMIx_Connect`, a fence over the parents'
//! and the children's namespaces, and read their parents' endpoints by direct modex: both
//! namespaces must be served by the same node services over one overlay. A nested step of its
//! own cannot give that (its stepds would run an overlay of their own), so the child step's
//! stepds serve nothing: the nested srun places every child rank on one of the parent step's
//! nodes ([`crate::nested`]), the parent step has already added the child namespace on every
//! node ([`greedy_pmix::node::NodeService::add_child_everywhere`]), and each child stepd hands
//! its tasks to the parent's stepd on its node:
//!
//! 1. the parent stepd listens on a Unix socket in a directory only root may enter
//!    ([`socket_path`]); only another root process (a slurmstepd) can connect, and the parent
//!    checks so (`SO_PEERCRED`), as the child checks that root listens;
//! 2. the child stepd says [`ToParent::Hello`]: its job (Slurm's record, which must be the
//!    parent's), the child namespace and its local ranks (Slurm's record);
//! 3. the parent admits the child stepd's descendants to its PMIx server as job processes
//!    ([`JobTrees`]) and answers each rank's variables (`PMIX_SERVER_URI*` of its own
//!    server, the child's namespace and rank);
//! 4. the child stepd reports each task's exit ([`ToParent::Exit`]), which counts as a child
//!    rank's exit (one before `PMIx_Finalize` aborts the family); its connection's end takes
//!    the admission back.
//!
//! A user may set [`crate::plan::VAR_ATTACH`] in any step of their job: it can only attach
//! that step's tasks to a child namespace another step of the same job serves, as that job's
//! user.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use greedy_pmix::node::NodeService;
use greedy_pmix::peer::JobTrees;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, warn};

use crate::Error;
use crate::agent::{RankSlot, TaskRecord, TaskTable};
use crate::plan::{Attach, StepPlan};

/// Where the parent steps' sockets are: a directory of root's that no one else may enter.
const SOCKET_DIR: &str = "/run/greedy-mpi";
/// Largest message either side accepts.
const MAX_MESSAGE: usize = 1 << 20;
/// How long a child stepd's hello and the parent's answer may take.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);

/// What a child stepd tells the parent stepd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToParent {
    /// The child step's job, its namespace and its ranks on this node.
    Hello {
        /// The child step's job id (Slurm's record).
        job_id: u32,
        /// The child step's id.
        step_id: u32,
        /// The child namespace its tasks are ranks of.
        nspace: String,
        /// Its ranks on this node (Slurm's record).
        ranks: Vec<u32>,
    },
    /// A local task ended with this code (128 + signal).
    Exit {
        /// The child rank.
        rank: u32,
        /// Its exit code.
        code: i32,
    },
}

/// The parent's answer to a hello: each rank's variables, or why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome(pub Result<Vec<RankVars>, String>);

/// One child rank's variables from the parent's PMIx server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankVars {
    /// The child rank.
    pub rank: u32,
    /// Its `PMIX_*` variables.
    pub env: Vec<(String, String)>,
}

/// The socket of step `job.step`'s stepd on node `node` (emulated nodes share one machine).
pub fn socket_path(node: &str, job: u32, step: u32) -> PathBuf {
    Path::new(SOCKET_DIR).join(format!("{node}-{job}.{step}"))
}

/// [`SOCKET_DIR`], made if missing; refused unless it is a directory of this process's user
/// (root) that no one else may write or enter.
fn socket_dir() -> std::io::Result<&'static Path> {
    let dir = Path::new(SOCKET_DIR);
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let meta = std::fs::symlink_metadata(dir)?;
    let mine = meta.uid() == rustix::process::geteuid().as_raw();
    if !meta.is_dir() || !mine || meta.mode() & 0o077 != 0 {
        return Err(std::io::Error::other(format!(
            "{SOCKET_DIR} is not a directory of this user's that only it may enter"
        )));
    }
    Ok(dir)
}

/// The parent stepd's side: the socket child stepds attach to, while the step runs.
#[derive(Debug)]
pub struct Attachments {
    path: PathBuf,
    stop: CancellationToken,
    /// Child stepds attached now.
    attached: tokio::sync::watch::Sender<usize>,
}

impl Attachments {
    /// Listens for child stepds of `plan`'s job on this node (inside the agent's runtime);
    /// their tasks are admitted to `service`'s PMIx server through `trees`.
    pub fn start(
        plan: &StepPlan,
        service: NodeService,
        trees: JobTrees,
    ) -> Result<Attachments, Error> {
        let io = Error::io(plan.node());
        let path = socket_path(plan.node(), plan.job_id, plan.step_id);
        socket_dir().map_err(|e| io("the attach directory", e))?;
        // A socket left by a stepd of the same step id that died: no one else can make one here.
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(|e| io("the attach socket", e))?;
        let attachments = Attachments {
            path,
            stop: CancellationToken::new(),
            attached: tokio::sync::watch::Sender::new(0),
        };
        let parent = Parent {
            job_id: plan.job_id,
            service,
            trees,
            attached: attachments.attached.clone(),
        };
        let stop = attachments.stop.clone();
        tokio::spawn(
            async move {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = parent.serve(listener) => {}
                }
            }
            .in_current_span(),
        );
        Ok(attachments)
    }

    /// Waits at most `limit` for the attached child stepds to end (their ranks need this
    /// node's PMIx server until they do), then stops listening.
    pub async fn finish(&self, limit: Duration) {
        let mut attached = self.attached.subscribe();
        let idle = attached.wait_for(|n| *n == 0);
        if tokio::time::timeout(limit, idle).await.is_err() {
            warn!(
                "{} spawned step(s) still attached after {limit:?}: their ranks lose this node's PMIx server",
                *self.attached.borrow()
            );
        }
        self.stop.cancel();
    }
}

impl Drop for Attachments {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What serving the child stepds needs.
struct Parent {
    job_id: u32,
    service: NodeService,
    trees: JobTrees,
    attached: tokio::sync::watch::Sender<usize>,
}

impl Parent {
    async fn serve(self, listener: UnixListener) {
        let me = std::sync::Arc::new(self);
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let me = me.clone();
            tokio::spawn(
                async move {
                    if let Err(why) = me.attach(stream).await {
                        warn!("a spawned step could not attach: {why}");
                    }
                }
                .in_current_span(),
            );
        }
    }

    /// One child stepd, from its hello to its connection's end.
    async fn attach(&self, mut stream: UnixStream) -> Result<(), String> {
        let cred = stream.peer_cred().map_err(|e| e.to_string())?;
        let pid = cred.pid().and_then(|p| u32::try_from(p).ok());
        let Some(pid) = pid.filter(|_| cred.uid() == 0) else {
            return Err(format!("uid {} is not root", cred.uid()));
        };
        let hello = tokio::time::timeout(HELLO_TIMEOUT, read_async(&mut stream)).await;
        let (nspace, welcome) = match hello.map_err(|_| "no hello in time".to_string())?? {
            ToParent::Hello {
                job_id,
                step_id,
                nspace,
                ranks,
            } if job_id == self.job_id => {
                debug!(step_id, %nspace, ?ranks, pid, "spawned step attaches");
                let welcome = self.welcome(&nspace, &ranks).await;
                (nspace, welcome)
            }
            other => return Err(format!("not a hello of job {}: {other:?}", self.job_id)),
        };
        if welcome.is_err() {
            return write_async(&mut stream, &Welcome(welcome)).await;
        }
        self.trees.join(pid);
        self.attached.send_modify(|n| *n += 1);
        if write_async(&mut stream, &Welcome(welcome)).await.is_ok() {
            while let Ok(said) = read_async(&mut stream).await {
                match said {
                    ToParent::Exit { rank, code } => {
                        self.service.child_exited(&nspace, rank, code).await;
                    }
                    other => warn!("a spawned step said {other:?} after its hello"),
                }
            }
        }
        self.trees.leave(pid);
        self.attached.send_modify(|n| *n -= 1);
        Ok(())
    }

    /// Each of `ranks`' variables in child namespace `nspace`, or why not.
    async fn welcome(&self, nspace: &str, ranks: &[u32]) -> Result<Vec<RankVars>, String> {
        let mut slots = Vec::with_capacity(ranks.len());
        for &rank in ranks {
            let wireup = (self.service.child_pmix_env(nspace, rank).await)
                .map_err(|e| format!("rank {rank} of {nspace}: {e}"))?;
            slots.push(RankVars {
                rank,
                env: wireup.env,
            });
        }
        Ok(slots)
    }
}

/// One length-prefixed postcard message.
async fn read_async<T: for<'de> Deserialize<'de>>(stream: &mut UnixStream) -> Result<T, String> {
    let len = stream.read_u32_le().await.map_err(|e| e.to_string())? as usize;
    if len > MAX_MESSAGE {
        return Err(format!("a message of {len} bytes"));
    }
    let mut body = vec![0; len];
    stream
        .read_exact(&mut body)
        .await
        .map_err(|e| e.to_string())?;
    postcard::from_bytes(&body).map_err(|e| e.to_string())
}

async fn write_async<T: Serialize>(stream: &mut UnixStream, msg: &T) -> Result<(), String> {
    let body = postcard::to_stdvec(msg).map_err(|e| e.to_string())?;
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend(body);
    stream.write_all(&frame).await.map_err(|e| e.to_string())
}

fn read_blocking<T: for<'de> Deserialize<'de>>(
    stream: &mut std::os::unix::net::UnixStream,
) -> std::io::Result<T> {
    let mut len = [0; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(std::io::Error::other(format!("a message of {len} bytes")));
    }
    let mut body = vec![0; len];
    stream.read_exact(&mut body)?;
    postcard::from_bytes(&body).map_err(std::io::Error::other)
}

fn write_blocking<T: Serialize>(
    stream: &mut std::os::unix::net::UnixStream,
    msg: &T,
) -> std::io::Result<()> {
    let body = postcard::to_stdvec(msg).map_err(std::io::Error::other)?;
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend(body);
    stream.write_all(&frame)
}

/// The child stepd's side: attached to the parent stepd until `fini`.
#[derive(Debug)]
pub struct Attached {
    stream: std::os::unix::net::UnixStream,
}

impl Attached {
    /// Hands this node's tasks of `plan` (a step with `attach`) to the parent step's stepd:
    /// the task table the task hooks read, each task's exit reported to the parent.
    pub fn start(plan: &StepPlan, attach: &Attach) -> Result<(Attached, TaskTable), Error> {
        let node = plan.node().to_string();
        let refused = |reason: String| Error::Attach {
            node: node.clone(),
            parent: format!("{}.{}", plan.job_id, attach.parent_step),
            reason,
        };
        let path = socket_path(&node, plan.job_id, attach.parent_step);
        let mut stream = std::os::unix::net::UnixStream::connect(&path)
            .map_err(|e| refused(format!("{}: {e}", path.display())))?;
        let server = rustix::net::sockopt::socket_peercred(&stream)
            .map_err(|e| refused(format!("who listens: {e}")))?;
        if server.uid.as_raw() != 0 {
            return Err(refused(format!(
                "uid {} listens there, not root",
                server.uid.as_raw()
            )));
        }
        let io = |e: std::io::Error| refused(e.to_string());
        stream.set_read_timeout(Some(HELLO_TIMEOUT)).map_err(io)?;
        let ranks = plan.ranks[plan.node_idx].clone();
        let hello = ToParent::Hello {
            job_id: plan.job_id,
            step_id: plan.step_id,
            nspace: attach.nspace.clone(),
            ranks: ranks.clone(),
        };
        write_blocking(&mut stream, &hello).map_err(io)?;
        let Welcome(welcome) = read_blocking(&mut stream).map_err(io)?;
        let slots: HashMap<u32, RankSlot> = (welcome.map_err(refused)?.into_iter())
            .map(|RankVars { rank, env }| {
                let slot = RankSlot {
                    fd: None,
                    env,
                    defaults: Vec::new(),
                };
                (rank, slot)
            })
            .collect();
        stream.set_read_timeout(None).map_err(io)?;
        let (tasks, records) = TaskTable::served_elsewhere(slots, plan.job_uid).map_err(io)?;
        let reporter = stream.try_clone().map_err(io)?;
        report_exits(records, reporter, ranks.len());
        Ok((Attached { stream }, tasks))
    }

    /// The step ends here: the parent takes the admission back.
    pub fn shutdown(self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// A thread passes each local task's exit on to the parent stepd, until `n_local` did.
fn report_exits(
    mut records: std::io::PipeReader,
    mut parent: std::os::unix::net::UnixStream,
    n_local: usize,
) {
    let spawned = std::thread::Builder::new()
        .name("greedy-mpi-attach".into())
        .spawn(move || {
            let mut ended = 0;
            while ended < n_local
                && let Ok(record) = TaskRecord::read_from(&mut records)
            {
                if let TaskRecord::Exited(rank, code) = record {
                    ended += 1;
                    if write_blocking(&mut parent, &ToParent::Exit { rank, code }).is_err() {
                        return;
                    }
                }
            }
        });
    if let Err(e) = spawned {
        // Without it an early exit is noticed only when the family's next fence times out.
        warn!("mpi/greedy: no exit reporter thread: {e}");
    }
}
