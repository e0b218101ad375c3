//! Files read in frame-sized chunks, with their SHA-256, and written back from them: task
//! inputs staged down the tree, task outputs collected up it.

use std::collections::HashMap;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use crate::proto::Cmd;

/// Bytes per frame.
pub(crate) const CHUNK: usize = 1 << 20;

/// Reads `path` in chunks, each handed to `each` with its offset: its SHA-256 (lowercase hex)
/// and size.
pub(crate) async fn read<F, Fut>(path: &Path, mut each: F) -> std::io::Result<(String, u64)>
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
    Ok((hex(sha), offset))
}

/// A SHA-256 in lowercase hex.
pub(crate) fn hex(sha: Sha256) -> String {
    sha.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Sends `path` down the tree as staging `id` with `route`, a chunk per [`Cmd::Stage`] and
/// its end with the SHA-256 of what was sent: that hash and the size.
pub(crate) async fn send<F, Fut>(path: &Path, id: u64, route: F) -> std::io::Result<(String, u64)>
where
    F: Fn(Cmd) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (hash, bytes) = read(path, |(offset, data)| {
        route(Cmd::Stage { id, offset, data })
    })
    .await?;
    route(Cmd::StageEnd {
        id,
        hash: hash.clone(),
    })
    .await;
    Ok((hash, bytes))
}

/// Writes a chunk, `data` at `offset`, into the file of `key` among those being received
/// (`open`), creating it at `part` with its first chunk.
pub(crate) fn write_at<K: Eq + std::hash::Hash>(
    open: &mut HashMap<K, std::fs::File>,
    key: K,
    part: &Path,
    offset: u64,
    data: &[u8],
) -> std::io::Result<()> {
    let file = match open.entry(key) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => e.insert(std::fs::File::create(part)?),
    };
    file.seek(SeekFrom::Start(offset))?;
    file.write_all(data)
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
