//! greedyrun's side of staging tasks' files. Inputs: each file a task names is read, named by
//! its content's SHA-256, and sent down the tree to every host once per content
//! ([`Stage`](crate::proto::Cmd::Stage)): one copy crosses each edge of the tree, however many tasks and hosts read
//! it, and a file that changed is sent again. The hosts keep them for the stream or the
//! session (`agent::staged`); commands down a tree path keep their order, so a file sent
//! before a task is on its host when the task starts. Outputs: what a task's host sends back
//! after it ended ([`crate::proto::Up::TaskFile`]) is written beside its path and renamed
//! over it once complete ([`Collector`]).

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::{
    chunks::read,
    fanout::Fanout,
    proto::{Staged, TaskId},
    task_spec::TaskSpec,
};

/// What the filesystem says of a file: when any of it changes, its content is read again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

impl Seen {
    fn of(m: &std::fs::Metadata) -> Seen {
        Seen {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        }
    }
}

/// The files staged so far, by path and by content.
#[derive(Default)]
pub(super) struct Stager {
    /// Each path read, as it was then, and its content's hash.
    known: HashMap<PathBuf, (Seen, String)>,
    /// Contents on every host.
    sent: HashSet<String>,
    /// What each staging sent.
    by_id: HashMap<u64, PathBuf>,
    /// The next staging's number.
    next: u64,
}

impl Stager {
    /// `spec`'s inputs (paths relative to its working directory), each on every host: their
    /// names and hashes for its task, and a line for each file sent now; or why not.
    pub(super) async fn stage(
        &mut self,
        spec: &TaskSpec,
        fanout: &Fanout,
    ) -> Result<(Vec<Staged>, Vec<String>), String> {
        let (mut staged, mut said) = (Vec::new(), Vec::new());
        for input in &spec.inputs {
            let path = match &spec.cwd {
                Some(dir) => Path::new(dir).join(input),
                None => PathBuf::from(input),
            };
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .ok_or_else(|| format!("input {input:?} names no file"))?;
            if staged.iter().any(|s: &Staged| s.name == name) {
                return Err(format!("two inputs are named {name:?}"));
            }
            let (hash, sent) = (self.stage_file(&path, fanout).await)
                .map_err(|e| format!("input {}: {e}", path.display()))?;
            if let Some(bytes) = sent {
                said.push(format!(
                    "staged {input} ({bytes} bytes, sha256 {}) to every host",
                    &hash[..12]
                ));
            }
            staged.push(Staged { name, hash });
        }
        Ok((staged, said))
    }

    /// `path` on every host, in its agent's cache for the session's life (a task's input, a
    /// session job's `--bcast` file): its content's hash, and its size if it was sent now.
    pub(super) async fn stage_file(
        &mut self,
        path: &Path,
        fanout: &Fanout,
    ) -> std::io::Result<(String, Option<u64>)> {
        let seen = Seen::of(&tokio::fs::metadata(path).await?);
        let hash = match self.known.get(path) {
            Some((s, hash)) if *s == seen => hash.clone(),
            _ => read(path, |_| async {}).await?.0,
        };
        if self.sent.contains(&hash) {
            self.known.insert(path.to_path_buf(), (seen, hash.clone()));
            return Ok((hash, None));
        }
        let id = self.next;
        self.next += 1;
        // Named by what was sent, should the file have changed since it was hashed.
        let (hash, bytes) = crate::chunks::send(path, id, |cmd| fanout.route(None, cmd)).await?;
        self.sent.insert(hash.clone());
        self.known.insert(path.to_path_buf(), (seen, hash.clone()));
        self.by_id.insert(id, path.to_path_buf());
        Ok((hash, Some(bytes)))
    }

    /// Host `node` got staging `id` damaged (its SHA-256 differs): sent to it again. What
    /// happened, for the log.
    pub(super) async fn again(&mut self, node: u32, id: u64, fanout: &Fanout) -> String {
        let Some(path) = self.by_id.get(&id) else {
            return format!("(staging {id}) arrived damaged");
        };
        let sent = crate::chunks::send(path, id, |cmd| fanout.route(Some(node), cmd)).await;
        match sent {
            Ok(_) => format!("{} arrived damaged: sent again", path.display()),
            Err(e) => format!(
                "{} arrived damaged, and cannot be read again: {e}",
                path.display()
            ),
        }
    }
}

/// Output files being collected from the hosts, and those collected for each task.
#[derive(Default)]
pub(super) struct Collector {
    /// Files being written, by task and path.
    open: HashMap<(TaskId, String), std::fs::File>,
    /// Each task's files collected so far.
    done: HashMap<TaskId, Vec<String>>,
}

impl Collector {
    /// Bytes `offset..` of task `id`'s output `path` (relative to greedyrun's working
    /// directory), `last` once it is complete: written beside it, renamed over it at the end.
    pub(super) fn chunk(
        &mut self,
        id: TaskId,
        path: String,
        offset: u64,
        data: &[u8],
        last: bool,
    ) -> std::io::Result<()> {
        let part = part_of(&path, id);
        let key = (id, path);
        let written = crate::chunks::write_at(&mut self.open, key.clone(), &part, offset, data);
        if written.is_err() || last {
            self.open.remove(&key);
        }
        written?;
        if last {
            std::fs::rename(&part, &key.1)?;
            self.done.entry(id).or_default().push(key.1);
        }
        Ok(())
    }

    /// Task `id`'s output stays on its host, as `host:path`.
    pub(super) fn left(&mut self, id: TaskId, at: String) {
        self.done.entry(id).or_default().push(at);
    }

    /// The output files collected for task `id` (its result names them); what was left
    /// half-written of them (a host lost mid-file) is removed.
    pub(super) fn take(&mut self, id: TaskId) -> Vec<String> {
        let half: Vec<(TaskId, String)> = (self.open.keys())
            .filter(|(t, _)| *t == id)
            .cloned()
            .collect();
        for (t, path) in half {
            self.open.remove(&(t, path.clone()));
            let _ = std::fs::remove_file(part_of(&path, t));
        }
        self.done.remove(&id).unwrap_or_default()
    }
}

/// Where task `id`'s output `path` is written until it is whole.
fn part_of(path: &str, id: TaskId) -> PathBuf {
    PathBuf::from(format!("{path}.greedy-part-{}-{}", id.stream, id.line))
}
