//! greedyrun's side of staging tasks' inputs: each file a task names is read, named by its
//! content's SHA-256, and sent down the tree to every host once per content
//! ([`Cmd::Stage`]): one copy crosses each edge of the tree, however many tasks and hosts read
//! it, and a file that changed is sent again. The hosts keep them for the stream or the
//! session (`agent::staged`); commands down a tree path keep their order, so a file sent
//! before a task is on its host when the task starts.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use crate::{
    fanout::Fanout,
    proto::{Cmd, Staged},
    task_spec::TaskSpec,
};

/// Bytes per [`Cmd::Stage`] frame.
const CHUNK: usize = 1 << 20;

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
            let (hash, sent) = self.stage_file(&path, fanout).await?;
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

    /// `path` on every host: its content's hash, and its size if it was sent now.
    async fn stage_file(
        &mut self,
        path: &Path,
        fanout: &Fanout,
    ) -> Result<(String, Option<u64>), String> {
        let failed = |e: std::io::Error| format!("input {}: {e}", path.display());
        let seen = Seen::of(&tokio::fs::metadata(path).await.map_err(failed)?);
        let hash = match self.known.get(path) {
            Some((s, hash)) if *s == seen => hash.clone(),
            _ => read(path, |_| async {}).await.map_err(failed)?.0,
        };
        if self.sent.contains(&hash) {
            self.known.insert(path.to_path_buf(), (seen, hash.clone()));
            return Ok((hash, None));
        }
        let id = self.next;
        self.next += 1;
        // Named by what was sent, should the file have changed since it was hashed.
        let (hash, bytes) = read(path, |(offset, data)| {
            fanout.route(None, Cmd::Stage { id, offset, data })
        })
        .await
        .map_err(failed)?;
        let end = Cmd::StageEnd {
            id,
            hash: hash.clone(),
        };
        fanout.route(None, end).await;
        self.sent.insert(hash.clone());
        self.known.insert(path.to_path_buf(), (seen, hash.clone()));
        Ok((hash, Some(bytes)))
    }
}

/// Reads `path` in chunks, each handed to `each` with its offset: its SHA-256 (lowercase hex)
/// and size.
async fn read<F, Fut>(path: &Path, mut each: F) -> std::io::Result<(String, u64)>
where
    F: FnMut((u64, bytes::Bytes)) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut file = tokio::fs::File::open(path).await?;
    let mut sha = Sha256::new();
    let mut offset = 0u64;
    loop {
        let mut buf = vec![0u8; CHUNK];
        let n = read_full(&mut file, &mut buf).await?;
        if n == 0 {
            break;
        }
        buf.truncate(n);
        sha.update(&buf);
        each((offset, bytes::Bytes::from(buf))).await;
        offset += n as u64;
    }
    let hex = sha.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok((hex, offset))
}

/// Fills `buf` as far as the file goes: the bytes read (fewer only at its end).
async fn read_full(file: &mut tokio::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]).await? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_files_hash_and_size_come_from_the_chunks_read() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        let data: Vec<u8> = (0..CHUNK + 10).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let chunks = std::sync::Mutex::new(Vec::new());
        let (hash, len) = read(&path, |(offset, data)| {
            chunks.lock().unwrap().push((offset, data.len()));
            async {}
        })
        .await
        .unwrap();
        assert_eq!(len, data.len() as u64);
        assert_eq!(
            chunks.into_inner().unwrap(),
            [(0, CHUNK), (CHUNK as u64, 10)]
        );
        let expected: String = Sha256::digest(&data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(hash, expected);
    }
}
