//! `--resume RESULTS`: a task stream run again after its client died (or was stopped) runs only
//! the tasks its results file has no end for.
//!
//! The file is the `--results` of the run before: one JSON line per task that ended, or whose
//! line could not run. A task is done when its line has a `task` number and is not `cancelled`
//! (a cancelled task ended because its stream did, and runs again). A last line without its
//! newline, what the run before was writing when it died, is dropped. The file is rewritten
//! with the done tasks' lines alone (a temporary file renamed over it, so a crash leaves the
//! old one or the new one), and this run appends its own: every task has one line over both
//! runs. The lines of done tasks reach the stream as empty lines, which run nothing and keep
//! every other line's number (`GREEDY_TASK`).

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::Error;
use crate::tasks::Lines;

/// The tasks a results file says are done, and the file, open to append this run's results.
#[derive(Debug)]
pub struct Resume {
    done: BTreeSet<u64>,
    failed: usize,
    results: File,
}

/// Bytes of the stream's lines copied at once into the blanking pipe.
const PIPE: usize = 64 << 10;

impl Resume {
    /// Reads the results at `path`, keeps the done tasks' lines, opens it to append.
    pub fn load(path: &Path) -> Result<Resume, Error> {
        let io = |source| Error::Io {
            what: format!("--resume {}", path.display()),
            source,
        };
        let text = std::fs::read(path).map_err(io)?;
        let complete = match text.iter().rposition(|&b| b == b'\n') {
            Some(end) => &text[..=end],
            None => &[][..],
        };
        let (mut done, mut failed, mut kept) = (BTreeSet::new(), 0, Vec::new());
        for (i, line) in complete.split(|&b| b == b'\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            let bad = |why: String| {
                Error::Plan(format!(
                    "--resume {}: line {}: not a line of greedyrun --results: {why}",
                    path.display(),
                    i + 1
                ))
            };
            let row: serde_json::Value =
                serde_json::from_slice(line).map_err(|e| bad(e.to_string()))?;
            let task = row["task"]
                .as_u64()
                .ok_or_else(|| bad("no task number".into()))?;
            if row["cancelled"] == true || !done.insert(task) {
                continue;
            }
            failed += usize::from(row["exit"] != 0);
            kept.extend_from_slice(line);
            kept.push(b'\n');
        }
        let tmp = path.with_extension("resume.tmp");
        let mut w = BufWriter::new(File::create(&tmp).map_err(io)?);
        w.write_all(&kept).and_then(|()| w.flush()).map_err(io)?;
        drop(w);
        std::fs::rename(&tmp, path).map_err(io)?;
        let results = File::options().append(true).open(path).map_err(io)?;
        Ok(Resume {
            done,
            failed,
            results,
        })
    }

    /// How many tasks the run before finished.
    pub fn done(&self) -> usize {
        self.done.len()
    }

    /// How many of them failed (or could not run): this run's exit code says so too.
    pub fn failed(&self) -> usize {
        self.failed
    }

    /// The results file, to append this run's lines to, and `lines` with every done task's
    /// line empty (the copying runs on a task of its own).
    pub fn into_parts(self, lines: Lines) -> (File, Lines) {
        let (mut tx, rx) = tokio::io::duplex(PIPE);
        let done = self.done;
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(lines);
            let mut line = Vec::new();
            let mut number = 0u64;
            loop {
                line.clear();
                match lines.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                number += 1;
                let out: &[u8] = match done.contains(&number) {
                    true => b"\n",
                    false => &line,
                };
                if tx.write_all(out).await.is_err() {
                    break;
                }
            }
            let _ = tx.shutdown().await;
        });
        (self.results, Box::new(rx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn done_tasks_are_kept_once_and_the_rest_dropped() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("results.json");
        let rows = [
            r#"{"task":1,"exit":0}"#,
            r#"{"task":2,"exit":3}"#,
            r#"{"task":3,"exit":143,"cancelled":true}"#,
            r#"{"task":4,"exit":null,"error":"bad line"}"#,
            r#"{"task":1,"exit":0}"#,
        ];
        // The run before died writing task 5's line.
        std::fs::write(&path, rows.join("\n") + "\n{\"task\":5,\"ex").unwrap();
        let r = Resume::load(&path).unwrap();
        assert_eq!(r.done, [1, 2, 4].into());
        assert_eq!((r.done(), r.failed()), (3, 2));
        let (mut f, _) = r.into_parts(Box::new(&b""[..]));
        f.write_all(b"{\"task\":3,\"exit\":0}\n").unwrap();
        let kept = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            kept,
            [rows[0], rows[1], rows[3], r#"{"task":3,"exit":0}"#].join("\n") + "\n"
        );
    }

    #[test]
    fn a_file_that_is_not_results_is_refused_naming_the_line() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("results.json");
        std::fs::write(&path, "{\"task\":1,\"exit\":0}\nhello\n").unwrap();
        let e = Resume::load(&path).unwrap_err().to_string();
        assert!(
            e.contains("line 2: not a line of greedyrun --results"),
            "{e}"
        );
        std::fs::write(&path, "{\"exit\":0}\n").unwrap();
        let e = Resume::load(&path).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("no task number"), "{e}");
        let e = Resume::load(&d.path().join("none"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--resume") && e.contains("No such file"), "{e}");
    }

    #[tokio::test]
    async fn done_lines_reach_the_stream_empty_and_the_rest_keep_their_numbers() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("results.json");
        std::fs::write(&path, "{\"task\":2,\"exit\":0}\n{\"task\":4,\"exit\":0}\n").unwrap();
        let r = Resume::load(&path).unwrap();
        let (_, mut lines) = r.into_parts(Box::new(&b"one\ntwo\nthree\nfour\nfive"[..]));
        let mut out = String::new();
        use tokio::io::AsyncReadExt;
        lines.read_to_string(&mut out).await.unwrap();
        assert_eq!(out, "one\n\nthree\n\nfive");
    }
}
