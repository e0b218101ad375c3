//! A task's output files once it ended ([`crate::task_spec::Outputs`]): sent up in chunks
//! before its end is reported, or, if they stay on this host, named by their absolute path.

use std::path::{Path, PathBuf};

use tokio::sync::mpsc;

use crate::proto::{Stream, TaskId, Up};
use crate::task_spec::Outputs;

/// Task `id`'s output files on this host.
pub(crate) struct OutputFiles {
    pub(crate) id: TaskId,
    /// This host's index.
    pub(crate) node: u32,
    /// The stream's working directory here.
    pub(crate) stream_dir: PathBuf,
    /// The files, relative to `stream_dir` (the task's `cwd` joined with each name).
    pub(crate) files: Vec<PathBuf>,
    /// They stay here: only their paths go up.
    pub(crate) leave: bool,
}

impl OutputFiles {
    /// Task `id`'s `outputs`, written in `cwd` (relative to `stream_dir`).
    pub(crate) fn new(
        (id, node): (TaskId, u32),
        stream_dir: &Path,
        cwd: Option<&str>,
        outputs: &Outputs,
    ) -> OutputFiles {
        let dir = Path::new(cwd.unwrap_or(""));
        OutputFiles {
            id,
            node,
            stream_dir: stream_dir.to_path_buf(),
            files: outputs.files.iter().map(|o| dir.join(o)).collect(),
            leave: outputs.leave,
        }
    }

    /// Sends each file up (or its path); one that cannot be read is said on the task's
    /// stderr.
    pub(crate) async fn send(&self, up: &mpsc::Sender<Up>) {
        for file in &self.files {
            let frame = match self.leave {
                true => self.left(file),
                false => self.send_file(file, up).await,
            };
            let frame = frame.unwrap_or_else(|e| Up::TaskOutput {
                id: self.id,
                stream: Stream::Stderr,
                data: format!(
                    "greedyd: task {}: output {}: {e}\n",
                    self.id.line,
                    file.display()
                )
                .into(),
            });
            let _ = up.send(frame).await;
        }
    }

    /// The frame naming `file` where it stays, if it is a file.
    fn left(&self, file: &Path) -> std::io::Result<Up> {
        let path = std::fs::canonicalize(self.stream_dir.join(file))?;
        if !path.is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        Ok(Up::TaskFileLeft {
            node: self.node,
            id: self.id,
            path: path.display().to_string(),
        })
    }

    /// Sends `file` up in chunks; the frame that completes it.
    async fn send_file(&self, file: &Path, up: &mpsc::Sender<Up>) -> std::io::Result<Up> {
        let (id, name) = (self.id, file.display().to_string());
        let (_, len) = crate::chunks::read(&self.stream_dir.join(file), |(offset, data)| {
            let path = name.clone();
            let last = false;
            let frame = Up::TaskFile {
                id,
                path,
                offset,
                data,
                last,
            };
            async { drop(up.send(frame).await) }
        })
        .await?;
        Ok(Up::TaskFile {
            id,
            path: name,
            offset: len,
            data: bytes::Bytes::new(),
            last: true,
        })
    }
}
