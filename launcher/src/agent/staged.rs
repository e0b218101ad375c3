//! The files staged to this host ([`crate::proto::Cmd::Stage`]: task inputs, a job's
//! `--bcast` files): named by their content's SHA-256, checked as they arrive, in a private
//! directory of the agent's (node-local temporary storage), kept for as long as the agent runs
//! (a job, a stream, or a whole session) and removed when it ends, also after a failure. Each
//! task that names inputs gets a directory of its own (`GREEDY_STAGED`) linking them by the
//! names it gave, removed when it ends; a job's broadcast files one (`GREEDY_BCAST`).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::proto::{BcastFile, Staged, Start, TaskId};

/// This host's staged files and the tasks' directories of them.
#[derive(Default)]
pub(crate) struct StagedFiles {
    /// Made at the first staging: `None` until then.
    dir: Option<PathBuf>,
    /// Files being received, by staging number.
    parts: HashMap<u64, File>,
    /// Their SHA-256 so far and the offset it reached (`None` once a chunk came out of
    /// order, which no hash can match).
    sums: HashMap<u64, (Option<Sha256>, u64)>,
    /// The files complete, by staging number: their content's SHA-256.
    arrived: HashMap<u64, String>,
    /// Each running task's directory, by its process group.
    tasks: HashMap<u32, PathBuf>,
    /// Each running session job's directories (a job task's inputs, its cached broadcast
    /// files), by the session's job number.
    jobs: HashMap<u32, Vec<PathBuf>>,
}

impl StagedFiles {
    /// The cache directory, made on first use.
    fn dir(&mut self) -> std::io::Result<&Path> {
        if self.dir.is_none() {
            let made = greedy_pmix::pmix::private_dir(&std::env::temp_dir(), "greedy-staged.")?;
            self.dir = Some(made);
        }
        Ok(self.dir.as_deref().expect("made"))
    }

    /// Bytes `offset..` of the file being staged as `id`.
    pub(crate) fn chunk(&mut self, id: u64, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let (sum, next) = (self.sums.entry(id)).or_insert_with(|| (Some(Sha256::new()), 0));
        match sum {
            Some(sha) if offset == *next => {
                sha.update(data);
                *next += data.len() as u64;
            }
            _ => *sum = None,
        }
        let part = self.dir()?.join(format!("part-{id}"));
        crate::chunks::write_at(&mut self.parts, id, &part, offset, data)
    }

    /// The file staged as `id` is complete and should be content `hash`: whether it is (it
    /// is then the cache's copy of it; if not, what came is dropped and it can come again).
    pub(crate) fn end(&mut self, id: u64, hash: &str) -> std::io::Result<bool> {
        if !is_hash(hash) {
            return Err(std::io::Error::other(format!("{hash:?} is not a SHA-256")));
        }
        let dir = self.dir()?.to_path_buf();
        let part = dir.join(format!("part-{id}"));
        // An empty file has no chunk.
        match self.parts.remove(&id) {
            Some(f) => drop(f),
            None => drop(File::create(&part)?),
        }
        let got = match self.sums.remove(&id) {
            Some((Some(sha), _)) => crate::chunks::hex(sha),
            Some((None, _)) => String::new(),
            None => crate::chunks::hex(Sha256::new()),
        };
        if got != hash {
            std::fs::remove_file(part)?;
            return Ok(false);
        }
        std::fs::rename(part, dir.join(hash))?;
        self.arrived.insert(id, got);
        Ok(true)
    }

    /// The directory of a job's broadcast `files` (file `i` staged as `i`), once every one
    /// arrived; the executable ones may be run.
    pub(crate) fn bcast_dir(&mut self, files: &[BcastFile]) -> Option<Result<PathBuf, String>> {
        let staged = (files.iter().enumerate())
            .map(|(i, f)| {
                let hash = self.arrived.get(&(i as u64))?;
                Some(Staged {
                    name: f.name.clone(),
                    hash: hash.clone(),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(self.copies("bcast", files, &staged))
    }

    /// The directory of session job `job`'s broadcast `files`, which the session put in this
    /// cache before the job (each `cached` by its SHA-256), kept until
    /// [`StagedFiles::job_ended`]; the cache keeps them for later jobs.
    pub(crate) fn cached_copies(
        &mut self,
        job: u32,
        files: &[BcastFile],
    ) -> Result<PathBuf, String> {
        let staged: Vec<Staged> = (files.iter())
            .map(|f| Staged {
                name: f.name.clone(),
                hash: f.cached.clone().unwrap_or_default(),
            })
            .collect();
        let dir = self.copies(&format!("job-{job}-bcast"), files, &staged)?;
        self.jobs.entry(job).or_default().push(dir.clone());
        Ok(dir)
    }

    /// Directory `name` linking `files` by their names to the cached `staged` contents; the
    /// executable ones may be run.
    fn copies(
        &mut self,
        name: &str,
        files: &[BcastFile],
        staged: &[Staged],
    ) -> Result<PathBuf, String> {
        let dir = self.linked(name, staged)?;
        for f in files.iter().filter(|f| f.executable) {
            let copy = dir.join(&f.name);
            let mode = std::os::unix::fs::PermissionsExt::from_mode(0o700);
            std::fs::set_permissions(&copy, mode)
                .map_err(|e| format!("{}: {e}", copy.display()))?;
        }
        Ok(dir)
    }

    /// A directory for task `id` linking its `inputs` by their names, or why not (one is not
    /// on this host).
    pub(crate) fn task_dir(&mut self, id: TaskId, inputs: &[Staged]) -> Result<PathBuf, String> {
        self.linked(&format!("task-{}-{}", id.stream, id.line), inputs)
    }

    /// The same for the ranks here of session job `job` (a stream's task of several ranks),
    /// kept until [`StagedFiles::job_ended`].
    pub(crate) fn job_dir(&mut self, job: u32, inputs: &[Staged]) -> Result<PathBuf, String> {
        let dir = self.linked(&format!("job-{job}"), inputs)?;
        self.jobs.entry(job).or_default().push(dir.clone());
        Ok(dir)
    }

    /// Session job `job` ended here: its directories go (the cache stays).
    pub(crate) fn job_ended(&mut self, job: u32) {
        for dir in self.jobs.remove(&job).unwrap_or_default() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    /// Directory `name` of the cache, linking `inputs` by their names.
    fn linked(&mut self, name: &str, inputs: &[Staged]) -> Result<PathBuf, String> {
        let dir = self.dir().map_err(|e| format!("staged inputs: {e}"))?;
        let task = dir.join(name);
        let _ = std::fs::remove_dir_all(&task);
        std::fs::create_dir(&task).map_err(|e| format!("{}: {e}", task.display()))?;
        for input in inputs {
            let cached = dir.join(&input.hash);
            let mut parts = Path::new(&input.name).components();
            let plain = matches!(
                (parts.next(), parts.next()),
                (Some(std::path::Component::Normal(_)), None)
            );
            if !plain || !is_hash(&input.hash) || !cached.is_file() {
                let _ = std::fs::remove_dir_all(&task);
                return Err(format!(
                    "its input {:?} was not staged to this host",
                    input.name
                ));
            }
            let link = task.join(&input.name);
            std::os::unix::fs::symlink(&cached, &link)
                .map_err(|e| format!("{}: {e}", link.display()))?;
        }
        Ok(task)
    }

    /// The task in process group `pgid` runs with `dir`.
    pub(crate) fn task_started(&mut self, pgid: u32, dir: PathBuf) {
        self.tasks.insert(pgid, dir);
    }

    /// The task in process group `pgid` ended: its directory goes (the cache stays).
    pub(crate) fn task_ended(&mut self, pgid: u32) {
        if let Some(dir) = self.tasks.remove(&pgid) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Drop for StagedFiles {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// `start`'s ranks run the broadcast copies in `dir`: an app whose program was broadcast runs
/// its copy, and every rank finds the files in `GREEDY_BCAST`.
pub(crate) fn run_copies(start: &mut Start, dir: &Path) {
    for app in &mut start.apps {
        if let Some(f) = start.bcast.iter().find(|f| f.path == app.argv[0]) {
            app.argv[0] = dir.join(&f.name).display().to_string();
        }
    }
    let dir = dir.display().to_string();
    start.env.push(("GREEDY_BCAST".to_string(), dir));
}

/// Whether `s` is a SHA-256 in lowercase hex (so, as a file name, it cannot leave the cache).
fn is_hash(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(data: &[u8]) -> String {
        crate::chunks::hex(Sha256::new_with_prefix(data))
    }

    #[test]
    fn staged_chunks_become_the_cached_file_that_tasks_link_by_name() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = StagedFiles::default();
        s.dir = Some(tmp.path().to_path_buf());
        let hash = sha(b"hello world");
        s.chunk(1, 0, b"hello ").unwrap();
        s.chunk(1, 6, b"world").unwrap();
        assert!(s.end(1, &hash).unwrap());
        let id = TaskId { stream: 0, line: 3 };
        let input = |name: &str, hash: &str| Staged {
            name: name.into(),
            hash: hash.into(),
        };
        let dir = s.task_dir(id, &[input("in.txt", &hash)]).unwrap();
        assert_eq!(std::fs::read(dir.join("in.txt")).unwrap(), b"hello world");
        s.task_started(7, dir.clone());
        s.task_ended(7);
        assert!(!dir.exists());
        assert!(tmp.path().join(&hash).is_file(), "the cache stays");
        // Not staged, or not a hash (a path out of the cache): refused.
        let missing = s.task_dir(id, &[input("x", &"b".repeat(64))]);
        assert!(missing.unwrap_err().contains("\"x\" was not staged"));
        assert!(s.task_dir(id, &[input("x", "../../etc/passwd")]).is_err());
        assert!(s.task_dir(id, &[input("../x", &hash)]).is_err());
        assert!(s.end(2, "../x").is_err());
        // An empty file has no chunk.
        assert!(s.end(3, &sha(b"")).unwrap());
        assert_eq!(std::fs::read(tmp.path().join(sha(b""))).unwrap(), b"");
        drop(s);
        assert!(!tmp.path().exists(), "the agent's end removes the cache");
    }

    #[test]
    fn a_copy_that_differs_from_its_hash_is_dropped_and_can_come_again() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = StagedFiles::default();
        s.dir = Some(tmp.path().to_path_buf());
        let hash = sha(b"hello world");
        // A byte changed on the way.
        s.chunk(0, 0, b"hellO ").unwrap();
        s.chunk(0, 6, b"world").unwrap();
        assert!(!s.end(0, &hash).unwrap());
        assert!(!tmp.path().join(&hash).exists());
        // Chunks out of order (a gap) cannot match either.
        s.chunk(0, 6, b"world").unwrap();
        s.chunk(0, 0, b"hello ").unwrap();
        assert!(!s.end(0, &hash).unwrap());
        let files = [BcastFile {
            path: "/bin/prog".into(),
            name: "prog".into(),
            executable: true,
            cached: None,
        }];
        assert!(s.bcast_dir(&files).is_none(), "not arrived yet");
        // Sent again, whole.
        s.chunk(0, 0, b"hello world").unwrap();
        assert!(s.end(0, &hash).unwrap());
        let dir = s.bcast_dir(&files).unwrap().unwrap();
        let copy = dir.join("prog");
        assert_eq!(std::fs::read(&copy).unwrap(), b"hello world");
        let mode = std::fs::metadata(&copy).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o700
        );
    }

    #[test]
    fn a_session_jobs_cached_copies_go_with_the_job_and_the_cache_stays() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = StagedFiles::default();
        s.dir = Some(tmp.path().to_path_buf());
        let hash = sha(b"data");
        s.chunk(0, 0, b"data").unwrap();
        assert!(s.end(0, &hash).unwrap());
        let file = |cached: Option<String>| BcastFile {
            path: "/home/u/data".into(),
            name: "data".into(),
            executable: false,
            cached,
        };
        let dir = s.cached_copies(7, &[file(Some(hash.clone()))]).unwrap();
        assert_eq!(std::fs::read(dir.join("data")).unwrap(), b"data");
        // A content this host does not hold (or no hash at all) is refused, naming the file.
        let other = sha(b"other");
        assert!(
            s.cached_copies(8, &[file(Some(other))])
                .unwrap_err()
                .contains("\"data\"")
        );
        assert!(s.cached_copies(8, &[file(None)]).is_err());
        s.job_ended(7);
        assert!(!dir.exists());
        assert!(
            tmp.path().join(&hash).is_file(),
            "the cache keeps it for later jobs"
        );
    }
}
